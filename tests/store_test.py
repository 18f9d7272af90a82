#!/usr/bin/env python3
"""Integration tests of the tensor store daemon (`tenplex store serve|load|save`).

pytest; ctest runs one part, test_PART, with the binary in TENPLEX_BIN:
  TENPLEX_BIN=build/bin/tenplex python -m pytest tests/store_test.py::test_api
PART one of
  api        every endpoint, every bad request of the issue, then the daemon still
             serves and no stored byte changed
  auth       tokens (missing/wrong/right) and the non-loopback rule
  shm        local zero-copy: alloc + mmap from another process that is then killed
             with SIGKILL; its tensors stay readable and committable
  restart    --shm-dir keeps committed state across a restart; a private directory
             is removed on SIGTERM; several daemons never collide

The checkpoint round trips are in store_checkpoint_test.py; the shared helpers in
store_testing.py. References are independent of the C++ code: ranges are cut from the
uploaded bytes in Python, checksums come from a pure-Python XXH64.
"""

import json
import mmap
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile

import pytest
from store_testing import (
    Daemon,
    begin,
    check,
    commit,
    cut,
    expect_error,
    get,
    jget,
    put,
    rand_bytes,
    raw,
    request,
    xxh64,
)


# ---------------------------------------------------------------- parts
def test_api(tenplex):
    d = Daemon(tenplex, "--memory-limit", "64M", "--max-body", "1M")
    url, port = d.url, d.port
    try:
        h = jget(url, "/v1/health")
        check(h["ok"] and h["used_bytes"] == 0 and h["memory_limit"] == 64 << 20, h)
        check(h.get("pid") == d.proc.pid, f"health names the daemon's process: {h}")
        v = begin(url, "gpt", info={"note": "first"})
        check(v == 1, v)
        shape = [5, 6, 7]
        a = rand_bytes(5 * 6 * 7 * 4, 1)
        t = put(url, "jobs/gpt/1/rank-00000/w", "F32", shape, a)
        check(t["path"] == "jobs/gpt/1/rank-00000/w" and t["bytes"] == len(a) and t["shape"] == shape, t)
        # Headers instead of query parameters.
        s16 = rand_bytes(2 * 3 * 2, 2)
        status, _, body = request(
            url, "PUT", "/v1/tensors/jobs/gpt/1/rank-00001/h", s16, {"X-Tensor-Dtype": "BF16", "X-Tensor-Shape": "2,3"}
        )
        check(status == 201, (status, body))
        scalar = struct.pack("<q", 1234)
        put(url, "jobs/gpt/1/rank-00001/step", "I64", [], scalar)
        put(url, "jobs/gpt/1/rank-00001/empty", "F32", [0, 3], b"")
        put(url, "jobs/gpt/1/rank-00002/gone", "U8", [3], b"abc")

        hd, body = get(url, "jobs/gpt/1/rank-00000/w")
        check(body == a, "whole tensor differs")
        check(hd["X-Tensor-Dtype"] == "F32" and hd["X-Tensor-Shape"] == "5,6,7", hd)
        ranges = {
            "": [(0, 5), (0, 6), (0, 7)],
            "1:3": [(1, 3), (0, 6), (0, 7)],
            ":,2:5": [(0, 5), (2, 5), (0, 7)],
            "4,:,6": [(4, 5), (0, 6), (6, 7)],
            "2:,:3,1:6": [(2, 5), (0, 3), (1, 6)],
            "0:0": [(0, 0), (0, 6), (0, 7)],
            ":,:,:": [(0, 5), (0, 6), (0, 7)],
            "1:2,5,3:4": [(1, 2), (5, 6), (3, 4)],
        }
        for rng, box in ranges.items():
            hd, body = get(url, "jobs/gpt/1/rank-00000/w", rng if rng else None)
            check(body == cut(a, shape, 4, box), "range %r differs" % rng)
            check(hd["X-Tensor-Shape"] == ",".join(str(e - b) for b, e in box), (rng, hd))
        # Random ranges against the reference.
        r = random.Random(5)
        for _ in range(40):
            box = []
            for dim in shape[: r.randint(0, 3)]:
                b = r.randint(0, dim)
                box.append((b, r.randint(b, dim)))
            rng = ",".join("%d:%d" % be for be in box)
            full = box + [(0, dim) for dim in shape[len(box) :]]
            _, body = get(url, "jobs/gpt/1/rank-00000/w", rng if rng else None)
            check(body == cut(a, shape, 4, full), "range %r differs" % rng)
        _, body = get(url, "jobs/gpt/1/rank-00001/step")
        check(body == scalar, body)
        _, body = get(url, "jobs/gpt/1/rank-00001/h", "1")
        check(body == s16[6:12], body)

        meta = jget(url, "/v1/meta/jobs/gpt/1/rank-00000/w")
        check(
            meta
            == {
                "path": "jobs/gpt/1/rank-00000/w",
                "dtype": "F32",
                "shape": shape,
                "bytes": len(a),
                "committed": False,
                "xxh64": xxh64(a),
            },
            meta,
        )
        check(jget(url, "/v1/meta/jobs/gpt/1/rank-00001/step")["xxh64"] == xxh64(scalar), "scalar checksum")
        lst = jget(url, "/v1/list/jobs/gpt/1/")
        check(
            lst
            == [
                "jobs/gpt/1/rank-00000/w",
                "jobs/gpt/1/rank-00001/empty",
                "jobs/gpt/1/rank-00001/h",
                "jobs/gpt/1/rank-00001/step",
                "jobs/gpt/1/rank-00002/gone",
            ],
            lst,
        )
        detail = jget(url, "/v1/list/jobs/gpt/1/rank-00001/s?detail=1")
        check(
            len(detail) == 1
            and detail[0]["dtype"] == "I64"
            and detail[0]["shape"] == []
            and os.path.exists(detail[0]["file"]),
            detail,
        )
        check(jget(url, "/v1/list/") == jget(url, "/v1/list") and len(jget(url, "/v1/list")) == 5, "list all")

        status, _, _ = request(url, "DELETE", "/v1/tensors/jobs/gpt/1/rank-00002/gone")
        check(status == 204, status)
        expect_error(*request(url, "GET", "/v1/tensors/jobs/gpt/1/rank-00002/gone")[::2], 404, "deleted tensor")

        # Versions: nothing current before the commit.
        expect_error(*request(url, "GET", "/v1/tensors/jobs/gpt/current/rank-00000/w")[::2], 404, "no current")
        commit(url, "gpt", 1)
        _, body = get(url, "jobs/gpt/current/rank-00000/w", "1:2")
        check(body == cut(a, shape, 4, [(1, 2), (0, 6), (0, 7)]), "current range")
        job = jget(url, "/v1/jobs/gpt")
        check(
            job["current"] == 1
            and job["versions"][0]["info"] == {"note": "first"}
            and job["versions"][0]["state"] == "committed",
            job,
        )
        check(jget(url, "/v1/jobs") == {"jobs": [{"job": "gpt", "current": 1}]}, "jobs")
        check(jget(url, "/v1/jobs/gpt/versions/current")["version"] == 1, "version current")
        check(jget(url, "/v1/meta/jobs/gpt/current/rank-00000/w")["committed"] is True, "committed flag")
        # A second version beside the first: explicit number, info, abort of a third.
        check(begin(url, "gpt", version=5) == 5, "explicit version")
        status, _, _ = request(url, "PUT", "/v1/jobs/gpt/versions/5/info", b'{"step": 9}')
        check(status == 204, status)
        put(url, "jobs/gpt/5/rank-00000/w", "F32", [2], rand_bytes(8, 3))
        check(begin(url, "gpt") == 6, "next version")
        status, _, _ = request(url, "POST", "/v1/jobs/gpt/versions/6/abort")
        check(status == 204, status)
        expect_error(*request(url, "GET", "/v1/jobs/gpt/versions/6")[::2], 404, "aborted version")

        snapshot = {p: get(url, p)[1] for p in jget(url, "/v1/list/")}
        used = jget(url, "/v1/health")["used_bytes"]

        # ------------------------------------------------ every bad request
        W = "/v1/tensors/jobs/gpt/5/rank-00000/"
        bad = [
            ("GET", "/v1/nope", None, {}, 404, "unknown endpoint"),
            ("GET", "/v2/tensors/jobs/gpt/1/rank-00000/w", None, {}, 404, "unknown API version"),
            ("GET", "/v1/tensors/jobs/gpt/1/rank-00000/missing", None, {}, 404, "unknown tensor"),
            ("GET", "/v1/tensors/jobs/nojob/current/rank-00000/w", None, {}, 404, "unknown job"),
            ("GET", "/v1/tensors/jobs/gpt/9/rank-00000/w", None, {}, 404, "unknown version"),
            ("GET", "/v1/meta/jobs/gpt/1/rank-00007/w", None, {}, 404, "meta of unknown tensor"),
            ("GET", "/v1/tensors/jobs/gpt/1/rank-00000/w?range=a:b", None, {}, 400, "malformed range"),
            ("GET", "/v1/tensors/jobs/gpt/1/rank-00000/w?range=1:2:3", None, {}, 400, "malformed range 2"),
            ("GET", "/v1/tensors/jobs/gpt/1/rank-00000/w?range=-1:2", None, {}, 400, "negative range"),
            ("GET", "/v1/tensors/jobs/gpt/1/rank-00000/w?range=3:1", None, {}, 400, "begin after end"),
            ("GET", "/v1/tensors/jobs/gpt/1/rank-00000/w?range=0:6", None, {}, 416, "range out of bounds"),
            ("GET", "/v1/tensors/jobs/gpt/1/rank-00000/w?range=:,:,7:8", None, {}, 416, "range out of bounds 2"),
            ("GET", "/v1/tensors/jobs/gpt/1/rank-00000/w?range=99999999999999999999", None, {}, 400, "huge bound"),
            ("GET", "/v1/tensors/jobs/gpt/1/rank-00000/w?range=0:1,0:1,0:1,0:1", None, {}, 400, "wrong rank of range"),
            ("GET", "/v1/tensors/jobs/gpt/1/rank-00001/step?range=0", None, {}, 400, "range on a scalar"),
            ("GET", "/v1/tensors/jobs/gpt/1/rank-00000/w?range=1&range=2", None, {}, 400, "repeated parameter"),
            ("GET", "/v1/tensors/jobs/gpt/1/rank-00000/w?rnage=1", None, {}, 400, "unknown parameter"),
            ("GET", "/v1/tensors/jobs/gpt/1/rank-00000/w?range=%zz", None, {}, 400, "bad percent escape"),
            ("PUT", W + "x?dtype=F32&shape=2,3", b"\0" * 20, {}, 400, "body size mismatch"),
            ("PUT", W + "x?dtype=F32&shape=2,3", b"\0" * 28, {}, 400, "body too long"),
            ("PUT", W + "x?dtype=F31&shape=2,3", b"\0" * 24, {}, 400, "unknown dtype"),
            ("PUT", W + "x?dtype=f32&shape=2,3", b"\0" * 24, {}, 400, "lower-case dtype"),
            ("PUT", W + "x?shape=2,3", b"\0" * 24, {}, 400, "missing dtype"),
            ("PUT", W + "x?dtype=F32", b"\0" * 24, {}, 400, "missing shape"),
            ("PUT", W + "x?dtype=F32&shape=-2,3", b"", {}, 400, "negative shape"),
            ("PUT", W + "x?dtype=F32&shape=4294967296,4294967296", b"", {}, 400, "overflowing shape"),
            ("PUT", W + "x?dtype=F32&shape=99999999999999999999", b"", {}, 400, "overflowing dimension"),
            ("PUT", W + "x?dtype=F32&shape=2,,3", b"", {}, 400, "malformed shape"),
            ("PUT", W + "x?dtype=F32&shape=2,3", b"\0" * 24, {"X-Tensor-Dtype": "F64"}, 400, "header disagrees"),
            ("PUT", W + "..?dtype=U8&shape=1", b"x", {}, 400, "traversal '..'"),
            ("PUT", W + "..%2F..%2Fescape?dtype=U8&shape=1", b"x", {}, 400, "encoded traversal"),
            ("PUT", "/v1/tensors/jobs/gpt/5/../5/rank-00000/x?dtype=U8&shape=1", b"x", {}, 400, "traversal mid-path"),
            ("PUT", "/v1/tensors/jobs/%2e%2e/5/rank-00000/x?dtype=U8&shape=1", b"x", {}, 400, "encoded dots"),
            ("GET", "/v1/tensors/jobs/gpt/1/rank-00000/%2e%2e%2f%2e%2e%2fLOCK", None, {}, 400, "traversal read"),
            ("GET", "/v1/list/jobs/../", None, {}, 400, "traversal list"),
            ("PUT", W + "a%00b?dtype=U8&shape=1", b"x", {}, 400, "NUL in name"),
            ("PUT", "/v1/tensors/jobs/gpt/5/rank-0/x?dtype=U8&shape=1", b"x", {}, 400, "bad rank segment"),
            ("PUT", "/v1/tensors/jobs/gpt/5/x?dtype=U8&shape=1", b"x", {}, 400, "short path"),
            (
                "PUT",
                "/v1/tensors/jobs/gpt/1/rank-00000/w?dtype=F32&shape=5,6,7",
                b"\0" * len(a),
                {},
                409,
                "write into committed version",
            ),
            (
                "PUT",
                "/v1/tensors/jobs/gpt/current/rank-00000/w?dtype=F32&shape=5,6,7",
                b"\0" * len(a),
                {},
                409,
                "write into current",
            ),
            ("PUT", "/v1/tensors/jobs/gpt/1/rank-00000/new?dtype=U8&shape=1", b"x", {}, 409, "new tensor in committed"),
            ("DELETE", "/v1/tensors/jobs/gpt/1/rank-00000/w", None, {}, 409, "delete in committed version"),
            ("PUT", "/v1/jobs/gpt/versions/1/info", b"{}", {}, 409, "info of committed version"),
            ("POST", "/v1/jobs/gpt/versions/1/prepare", None, {}, 409, "prepare committed"),
            ("POST", "/v1/jobs/gpt/versions/1/abort", None, {}, 409, "abort committed"),
            ("DELETE", "/v1/jobs/gpt/versions/1", None, {}, 409, "drop current"),
            ("POST", "/v1/jobs/gpt/versions?version=1", None, {}, 409, "version not newer"),
            ("POST", "/v1/jobs/gpt/versions?version=5", None, {}, 409, "version exists"),
            ("POST", "/v1/jobs/gpt/versions?version=0", None, {}, 400, "version zero"),
            ("POST", "/v1/jobs/gpt/versions?version=x", None, {}, 400, "version not a number"),
            ("POST", "/v1/jobs/gpt/versions", b"[1,2]", {}, 400, "info not an object"),
            ("POST", "/v1/jobs/gpt/versions/77/commit", None, {}, 404, "commit unknown version"),
            ("POST", "/v1/jobs/b%20ad/versions", None, {}, 400, "bad job name"),
            ("PUT", "/v1/tensors/jobs/gpt/6/rank-00000/x?dtype=U8&shape=1", b"x", {}, 404, "write into aborted"),
            ("POST", "/v1/alloc", b"not json", {}, 400, "alloc malformed JSON"),
            (
                "POST",
                "/v1/alloc",
                b'{"tensors": [{"path": "jobs/gpt/5/rank-00000/big", "dtype": "F32", "shape": [1048576, 64]}]}',
                {},
                507,
                "memory limit",
            ),
            (
                "POST",
                "/v1/alloc",
                b'{"tensors": [{"path": "jobs/gpt/5/rank-00000/n", "dtype": "F32", "shape": [-1]}]}',
                {},
                400,
                "alloc negative shape",
            ),
            ("PATCH", "/v1/tensors/jobs/gpt/5/rank-00000/w", b"", {}, 405, "method not allowed"),
            ("DELETE", "/v1/list/", None, {}, 405, "method not allowed on list"),
        ]
        for method, path, body, headers, want, what in bad:
            status, _, rbody = request(url, method, path, body, headers)
            msg = expect_error(status, rbody, want, what)
            if what == "memory limit":
                check("memory limit" in msg, msg)
            if "traversal" in what:
                check("traversal" in msg or "may only contain" in msg, (what, msg))
        # Raw requests urllib would not send.
        st, body = raw(port, b"GET /v1/tensors/jobs/gpt/1/rank-00000/../../../LOCK HTTP/1.1\r\nHost: x\r\n\r\n")
        expect_error(st, body, 400, "raw traversal")
        st, body = raw(port, b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 10000 + b"\r\n\r\n")
        expect_error(st, body, 400, "oversized header line")
        many = b"".join(b"X-H%d: %s\r\n" % (i, b"b" * 1000) for i in range(20))
        st, body = raw(port, b"GET /v1/health HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")
        expect_error(st, body, 431, "oversized headers")
        st, body = raw(port, b"GET /v1/health" + b"/x" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        check(st in (400, 414), "oversized target: %s" % st)
        st, body = raw(
            port,
            b"PUT /v1/tensors/jobs/gpt/5/rank-00000/big?dtype=U8&shape=2000000 HTTP/1.1\r\n"
            b"Host: x\r\nContent-Length: 2000000\r\n\r\n" + b"z" * 2000000,
        )
        expect_error(st, body, 413, "oversized body")
        status, _, body = request(
            url, "PUT", "/v1/tensors/jobs/gpt/5/rank-00000/big?dtype=U8&shape=1048577", b"z" * 1048577
        )
        expect_error(status, body, 413, "oversized body (urllib)")
        st, body = raw(
            port,
            b"PUT /v1/tensors/jobs/gpt/5/rank-00000/cut?dtype=U8&shape=24 HTTP/1.1\r\n"
            b"Host: x\r\nContent-Length: 24\r\n\r\n" + b"q" * 10,
            half_close=True,
        )
        # The client went away mid-body: no reply is needed, nothing may be stored
        # (checked with the snapshot below).
        check(st in (None, 400), "body shorter than Content-Length: %s %r" % (st, body))
        st, body = raw(
            port,
            b"PUT /v1/tensors/jobs/gpt/5/rank-00000/w?dtype=F32&shape=2 HTTP/1.1\r\n"
            b"Host: x\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n8\r\nefghijkl\r\n0\r\n\r\n",
        )
        expect_error(st, body, 400, "chunked body longer than dtype x shape")
        st, body = raw(port, b"GARBAGE\r\n\r\n")
        check(st in (400, None), "garbage request: %s" % st)

        # Clients that go away in the middle of a large reply.
        status, _, body = request(
            url,
            "POST",
            "/v1/alloc",
            json.dumps(
                {"tensors": [{"path": "jobs/gpt/5/rank-00003/big", "dtype": "F32", "shape": [4 << 20]}]}
            ).encode(),
        )
        check(status == 201, (status, body))
        for _ in range(3):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"GET /v1/tensors/jobs/gpt/5/rank-00003/big HTTP/1.1\r\nHost: x\r\n\r\n")
            s.recv(1000)
            s.close()
        status, _, _ = request(url, "DELETE", "/v1/tensors/jobs/gpt/5/rank-00003/big")
        check(status == 204, status)

        # ------------------------------------------------ still serving, nothing changed
        check(jget(url, "/v1/health")["used_bytes"] == used, "used bytes changed")
        after = {p: get(url, p)[1] for p in jget(url, "/v1/list/")}
        check(after == snapshot, "stored bytes changed after bad requests")

        # Committing 5 releases 1; releasing/deleting jobs.
        commit(url, "gpt", 5)
        expect_error(*request(url, "GET", "/v1/tensors/jobs/gpt/1/rank-00000/w")[::2], 404, "released version")
        check(jget(url, "/v1/jobs/gpt/versions/current")["info"] == {"step": 9}, "info of 5")
        check(begin(url, "gpt") == 7, "numbering continues")
        status, _, _ = request(url, "DELETE", "/v1/jobs/gpt")
        check(status == 204, status)
        check(jget(url, "/v1/jobs") == {"jobs": []}, "job deleted")
        check(jget(url, "/v1/health")["used_bytes"] == 0, "memory returned")
    finally:
        rc, err = d.stop()
    check(rc == 0, "daemon exit code %s: %s" % (rc, err))


def test_auth(tenplex):
    tmp = tempfile.mkdtemp(prefix="tenplex-auth-")
    token_file = os.path.join(tmp, "token")
    with open(os.open(token_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write("s3cret\n")
    d = Daemon(tenplex, "--token-file", token_file)
    try:
        for hdrs, what in [
            ({}, "missing token"),
            ({"Authorization": "Bearer wrong"}, "wrong token"),
            ({"Authorization": "Basic czNjcmV0"}, "wrong scheme"),
            ({"Authorization": "Bearer s3cret2"}, "token with a suffix"),
            ({"Authorization": "Bearer"}, "empty token"),
        ]:
            status, headers, body = request(d.url, "GET", "/v1/health", headers=hdrs)
            expect_error(status, body, 401, what)
            status, _, body = request(d.url, "POST", "/v1/jobs/j/versions", headers=hdrs)
            expect_error(status, body, 401, what + " (write)")
        check(jget(d.url, "/v1/jobs", token="s3cret") == {"jobs": []}, "no write happened without a token")
        check(jget(d.url, "/v1/health", token="s3cret")["ok"], "right token")
        v = begin(d.url, "j", token="s3cret")
        put(d.url, "jobs/j/%d/rank-00000/x" % v, "U8", [2], b"ok", token="s3cret")
        _, body = get(d.url, "jobs/j/%d/rank-00000/x" % v, token="s3cret")
        check(body == b"ok", body)
    finally:
        rc, err = d.stop(signal.SIGINT)
    check(rc == 0, "SIGINT exit %s %s" % (rc, err))
    # Non-loopback without a token is refused before anything listens.
    p = subprocess.run([tenplex, "store", "serve", "--listen", "0.0.0.0:0"], capture_output=True, text=True, timeout=20)
    check(p.returncode != 0 and "--token-file" in p.stderr, (p.returncode, p.stderr))
    shutil.rmtree(tmp)
    p = subprocess.run([tenplex, "store", "serve", "--listen", "127.0.0.1"], capture_output=True, text=True, timeout=20)
    check(p.returncode != 0 and "host:port" in p.stderr, (p.returncode, p.stderr))
    p = subprocess.run(
        [tenplex, "store", "serve", "--memory-limit", "lots"], capture_output=True, text=True, timeout=20
    )
    check(p.returncode != 0 and "byte count" in p.stderr, (p.returncode, p.stderr))


CHILD = r"""
import json, mmap, os, random, sys, time, urllib.request
url, version = sys.argv[1], int(sys.argv[2])
specs = json.loads(sys.argv[3])
body = json.dumps({"tensors": [{"path": p, "dtype": "U8", "shape": [n]} for p, n, _ in specs]}).encode()
req = urllib.request.Request(url + "/v1/alloc", data=body, method="POST")
reply = json.loads(urllib.request.urlopen(req).read())
maps = []
for (path, n, seed), t in zip(specs, reply["tensors"]):
    assert t["path"] == path and t["bytes"] == n and t["writable"], t
    f = open(t["file"], "r+b")
    m = mmap.mmap(f.fileno(), n)
    r = random.Random(seed)
    m[:] = bytes(r.getrandbits(8) for _ in range(n))
    maps.append((f, m))   # keep everything mapped: the process dies holding them
print("written", flush=True)
time.sleep(600)
"""


def test_shm(tenplex):
    d = Daemon(tenplex)
    try:
        v = begin(d.url, "train")
        specs = [("jobs/train/%d/rank-%05d/state" % (v, r), 4096 * 3 + r, 100 + r) for r in range(3)]
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, d.url, str(v), json.dumps(specs)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        line = child.stdout.readline()
        check(line.strip() == b"written", (line, child.stderr.read() if child.poll() is not None else b""))
        child.kill()  # SIGKILL: the training process crashes
        child.wait()
        for path, n, seed in specs:
            _, body = get(d.url, path)
            check(body == rand_bytes(n, seed), "tensor of the killed process differs: " + path)
        commit(d.url, "train", v)
        for path, n, seed in specs:
            cur = path.replace("/%d/" % v, "/current/")
            _, body = get(d.url, cur)
            check(body == rand_bytes(n, seed), "committed tensor differs: " + cur)
            info = jget(d.url, "/v1/shm/" + cur)
            check(info["writable"] is False and info["offset"] == 0 and info["bytes"] == n, info)
            with open(info["file"], "rb") as f:
                m = mmap.mmap(f.fileno(), n, prot=mmap.PROT_READ)
                check(m[:] == rand_bytes(n, seed), "zero-copy read differs")
                m.close()
        # /v1/alloc into a committed version is refused and creates nothing.
        status, _, body = request(
            d.url,
            "POST",
            "/v1/alloc",
            json.dumps({"tensors": [{"path": specs[0][0], "dtype": "U8", "shape": [1]}]}).encode(),
        )
        expect_error(status, body, 409, "alloc in committed version")
    finally:
        rc, err = d.stop()
    check(rc == 0, err)


def test_restart(tenplex):
    tmp = tempfile.mkdtemp(prefix="tenplex-store-restart-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    shm = os.path.join(tmp, "store")
    try:
        a = Daemon(tenplex, "--shm-dir", shm)
        data = {
            ("jobs/j/1/rank-%05d/p%d" % (r, i)): rand_bytes(1000 + 17 * i + r, r * 10 + i)
            for r in range(2)
            for i in range(3)
        }
        check(begin(a.url, "j", info={"config": "tp=2"}) == 1, "v1")
        for p, b in data.items():
            put(a.url, p, "U8", [len(b)], b)
        commit(a.url, "j", 1)
        check(begin(a.url, "j") == 2, "v2")
        put(a.url, "jobs/j/2/rank-00000/p0", "U8", [3], b"new")  # open at shutdown: dropped
        # A second daemon on the same directory is refused with a clear message.
        b = Daemon(tenplex, "--shm-dir", shm, expect_fail=True)
        rc = b.proc.wait(timeout=20)
        err = b.proc.stderr.read().decode()
        b.proc.stdout.close()
        b.proc.stderr.close()
        check(rc != 0 and "in use by another tenplex store" in err, (rc, err))
        rc, err = a.stop()
        check(rc == 0, err)
        check(os.path.isdir(shm), "persistent shm dir removed")

        a2 = Daemon(tenplex, "--shm-dir", shm)
        try:
            for p, b in data.items():
                _, body = get(a2.url, p.replace("/1/", "/current/"))
                check(body == b, "restarted daemon lost " + p)
                check(jget(a2.url, "/v1/meta/" + p)["xxh64"] == xxh64(b), "checksum after restart")
            job = jget(a2.url, "/v1/jobs/j")
            check(
                job["current"] == 1 and len(job["versions"]) == 1 and job["versions"][0]["info"] == {"config": "tp=2"},
                job,
            )
            check(jget(a2.url, "/v1/health")["used_bytes"] == sum(len(b) for b in data.values()), "accounting")
            status, _, body = request(a2.url, "PUT", "/v1/tensors/jobs/j/1/rank-00000/p0?dtype=U8&shape=3", b"bad")
            expect_error(status, body, 409, "committed stays immutable after restart")
            check(begin(a2.url, "j") == 2, "numbering after restart")
        finally:
            rc, err = a2.stop(signal.SIGKILL)  # a crash: committed state must survive this too
        a3 = Daemon(tenplex, "--shm-dir", shm)
        try:
            for p, b in data.items():
                check(get(a3.url, p)[1] == b, "state lost after SIGKILL of the daemon")
        finally:
            rc, err = a3.stop()
        check(rc == 0, err)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    # Four daemons (four "hosts") at once: private directories, independent state,
    # each removed on SIGTERM.
    ds = [Daemon(tenplex) for _ in range(4)]
    try:
        check(len({d.shm_dir for d in ds}) == 4, "shared shm dirs")
        for i, d in enumerate(ds):
            begin(d.url, "j")
            put(d.url, "jobs/j/1/rank-00000/x", "U8", [1], bytes([i]))
        for i, d in enumerate(ds):
            check(get(d.url, "jobs/j/1/rank-00000/x")[1] == bytes([i]), "daemons share state")
    finally:
        for d in ds:
            rc, err = d.stop()
            check(rc == 0, err)
            check(not os.path.exists(d.shm_dir), "private shm dir left behind: " + d.shm_dir)


if __name__ == "__main__":
    sys.exit(pytest.main([os.path.abspath(__file__), "-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
