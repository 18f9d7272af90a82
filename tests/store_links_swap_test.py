#!/usr/bin/env python3
"""Links swapped into a serving daemon's store directory (issue 35, docs/reliability.md).

A daemon serves jobs a and b (restarted once, so that it reads tensor files by path).
While a client reads both every 10 ms, job a's directory is replaced by a symbolic link
to a copy outside the store whose tensor is a link to a secret file, and then b's tensor
file by a link to the secret: the daemon must never answer the secret's bytes, refuse
every request for a (and b's linked tensor) with an error that names the link, keep
serving b's other requests and its health, write nothing outside, delete a (the link
only) on request, and exit 0 on SIGTERM. Before the fix it followed the links.

usage: TENPLEX_BIN=path/to/tenplex python -m pytest tests/store_links_swap_test.py (pytest)
"""

import os
import shutil
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest
from daemons import Daemon
from store_testing import check

SECRET = b"S" * 64
TENSOR = "1/rank-00000/x"


def http(d: Daemon, method: str, path: str, data: bytes = None, headers: dict = None):
    """(status, body bytes) of one request."""
    req = urllib.request.Request(d.url + path, method=method, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def make_job(d: Daemon, job: str, fill: int) -> None:
    json_type = {"Content-Type": "application/json"}
    check(http(d, "POST", "/v1/jobs/%s/versions?version=1" % job, b"{}", json_type)[0] == 201, "begin " + job)
    status, body = http(d, "PUT", "/v1/tensors/jobs/%s/%s?dtype=U8&shape=64" % (job, TENSOR), bytes([fill]) * 64)
    check(status in (200, 201, 204), "put %s: %d %r" % (job, status, body))
    check(http(d, "POST", "/v1/jobs/%s/versions/1/commit" % job)[0] == 200, "commit " + job)


def tree(root: str) -> list:
    """Every path below root, links not followed."""
    out = []
    for d, dirs, files in os.walk(root):
        out += [os.path.relpath(os.path.join(d, x), root) for x in dirs + files]
    return sorted(out)


def test_links_swap(tenplex: str) -> None:
    tmp = tempfile.mkdtemp(prefix="tenplex-links-swap-", dir="/dev/shm")  # the store needs tmpfs
    shm, outside = os.path.join(tmp, "shm"), os.path.join(tmp, "outside")
    args = ("--transport", "none", "--shm-dir", shm)
    d = Daemon(tenplex, args=args)
    try:
        make_job(d, "a", 1)
        make_job(d, "b", 2)
        d.stop()
        d = Daemon(tenplex, args=args)  # tensors are now read through their files
        check(http(d, "GET", "/v1/tensors/jobs/a/" + TENSOR) == (200, bytes([1]) * 64), "a before the swap")

        seen, stop = {"a": set(), "b": set(), "secret": 0}, threading.Event()

        def reader() -> None:
            while not stop.is_set():
                for job in ("a", "b"):
                    status, body = http(d, "GET", "/v1/tensors/jobs/%s/%s" % (job, TENSOR))
                    seen[job].add(status)
                    seen["secret"] += body == SECRET
                time.sleep(0.01)

        t = threading.Thread(target=reader)
        t.start()
        time.sleep(0.3)
        os.makedirs(os.path.join(outside, "a", "1", "rank-00000"))
        secret = os.path.join(outside, "shadow")
        with open(secret, "wb") as f:
            f.write(SECRET)
        os.symlink(secret, os.path.join(outside, "a", TENSOR))
        planted = tree(outside)
        os.rename(os.path.join(shm, "jobs", "a"), os.path.join(shm, "a-moved"))
        os.symlink(os.path.join(outside, "a"), os.path.join(shm, "jobs", "a"))
        time.sleep(0.5)
        b_file = os.path.join(shm, "jobs", "b", TENSOR)
        os.unlink(b_file)
        os.symlink(secret, b_file)
        time.sleep(0.5)
        stop.set()
        t.join(30)

        check(seen["secret"] == 0, "the daemon answered the secret's bytes %d times" % seen["secret"])
        check(200 in seen["a"] and 200 in seen["b"], "served before the swap: %s" % seen)
        for path in ("/v1/tensors/jobs/a/" + TENSOR, "/v1/jobs/a", "/v1/meta/jobs/a/" + TENSOR):
            status, body = http(d, "GET", path)
            check(status >= 400 and b"symbolic link" in body, "GET %s after the swap: %d %r" % (path, status, body))
        status, body = http(d, "GET", "/v1/tensors/jobs/b/" + TENSOR)
        check(status >= 400 and b"symbolic link" in body, "b's linked tensor: %d %r" % (status, body))
        status, body = http(d, "POST", "/v1/jobs/a/versions?version=2", b"{}", {"Content-Type": "application/json"})
        check(status >= 400, "a new version of the swapped job: %d %r" % (status, body))
        check(http(d, "GET", "/v1/jobs/b")[0] == 200, "job b is still served")
        check(http(d, "GET", "/v1/health")[0] == 200, "health")
        check(tree(outside) == planted, "written outside the store: %s" % tree(outside))
        with open(secret, "rb") as f:
            check(f.read() == SECRET, "the secret changed")
        check(http(d, "DELETE", "/v1/jobs/a")[0] == 204, "delete the swapped job")
        check(not os.path.lexists(os.path.join(shm, "jobs", "a")), "the link is gone")
        check(tree(outside) == planted, "the link's target was removed: %s" % tree(outside))
        d.proc.terminate()
        check(d.proc.wait(10) == 0, "SIGTERM exit status %r" % d.proc.returncode)
        print(
            "PASS store_links_swap: 0 secret bytes served, %s"
            % {k: sorted(v) for k, v in seen.items() if k != "secret"}
        )
    finally:
        d.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(pytest.main([os.path.abspath(__file__), "-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
