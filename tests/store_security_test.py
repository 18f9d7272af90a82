#!/usr/bin/env python3
"""Daemon-side security and integrity of the store (issue 19, docs/reliability.md).

pytest; ctest runs one part, test_PART, with the binary in TENPLEX_BIN:
  TENPLEX_BIN=build/bin/tenplex python -m pytest tests/store_security_test.py::test_token
PART one of
  token       the token never on the command line: --token refused (exit 2, naming
              --token-file and TENPLEX_TOKEN), --token-file with bad permissions / a
              missing file / a directory / an empty file refused; a daemon served with
              --token-file or TENPLEX_TOKEN shows no token in its argv (/proc, ps) and
              enforces it; clients take it from the file or the environment
  ucx         with --listen 127.0.0.1 every listening socket of the daemon (HTTP and
              the UCX data plane, from /proc/PID/fd + /proc/net/tcp{,6}) is on
              loopback; --data-listen all opens the data plane on the other interfaces
  quarantine  a corrupt manifest of one job does not stop a restart: that job is
              quarantined (in /v1/health, a 500 JSON error naming it), the others are
              served byte for byte; store rm forgets it and the name is usable again
  checksum    committed tensors carry their xxh64 (manifest, /v1/list?detail) equal to
              a pure-Python XXH64; a flipped byte in a committed tensor's shared-memory
              file makes `store save` (shared memory and --http) and /v1/meta fail
              naming the tensor
"""

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

import pytest
from daemons import Daemon
from store_testing import check, xxh64

TOKEN = "tok-3f9c1d27a8e44b6d"


def run(tenplex, *args, env=None, timeout=300):
    """`tenplex ARGS`; a command still running after `timeout` s (a daemon that should
    have refused to start) is killed and reported as exit -9 with stderr "timeout"."""
    try:
        return subprocess.run(
            [tenplex, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(os.environ, **(env or {})) if env is not None else None,
        )
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, -9, "", "timeout")


def request(url, method, path, body=None, token=None):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = "Bearer " + token
    req = urllib.request.Request(
        url + path,
        method=method,
        headers=headers,
        data=None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode()),
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def write_token(path, text, mode=0o600):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def refused(p, *words):
    check(p.returncode == 2, "exit %d, want 2: %s" % (p.returncode, p.stderr))
    for w in words:
        check(w in p.stderr, "error lacks %r: %r" % (w, p.stderr))
    check("Traceback" not in p.stderr and "terminate" not in p.stderr, p.stderr)


def test_token(tenplex):
    tmp = tempfile.mkdtemp(prefix="tenplex-token-")
    try:
        tf = os.path.join(tmp, "token")
        write_token(tf, TOKEN + "\n")
        # --token on the command line: refused by every command that takes a token.
        for cmd in (
            ["store", "serve"],
            ["store", "ls"],
            ["store", "rm", "j"],
            ["store", "save", "--url", "http://127.0.0.1:1", "--job", "j", "--out", tmp + "/o"],
            ["store", "load", "--url", "http://127.0.0.1:1", "--job", "j", "--dir", tmp],
            ["transform", "--cluster", tmp + "/c.json", "--job", "j", "--to", "tp=1"],
        ):
            refused(run(tenplex, *cmd, "--token", TOKEN, timeout=20), "--token-file", "TENPLEX_TOKEN")
        # Bad token files.
        loose = os.path.join(tmp, "loose")
        write_token(loose, TOKEN, 0o644)
        refused(
            run(tenplex, "store", "serve", "--listen", "127.0.0.1:0", "--token-file", loose, timeout=20),
            loose,
            "chmod 600",
        )
        write_token(loose, TOKEN, 0o620)
        refused(run(tenplex, "store", "ls", "--token-file", loose), "group or others")
        refused(
            run(tenplex, "store", "serve", "--listen", "127.0.0.1:0", "--token-file", tmp + "/missing", timeout=20),
            "no such file",
        )
        refused(
            run(tenplex, "store", "serve", "--listen", "127.0.0.1:0", "--token-file", tmp, timeout=20),
            "not a regular file",
        )
        empty = os.path.join(tmp, "empty")
        write_token(empty, "\n")
        refused(
            run(tenplex, "store", "serve", "--listen", "127.0.0.1:0", "--token-file", empty, timeout=20), "empty token"
        )
        spaced = os.path.join(tmp, "spaced")
        write_token(spaced, "two words")
        refused(
            run(tenplex, "store", "serve", "--listen", "127.0.0.1:0", "--token-file", spaced, timeout=20),
            "visible ASCII",
        )

        # A daemon with --token-file: no token in argv, and it is enforced.
        for how in ("file", "env"):
            env = {"TENPLEX_TOKEN": TOKEN} if how == "env" else {}
            args = ("--token-file", tf) if how == "file" else ()
            d = Daemon(tenplex, env=env, args=args)
            try:
                with open("/proc/%d/cmdline" % d.proc.pid, "rb") as f:
                    argv = f.read().split(b"\0")
                check(b"serve" in argv, argv)
                check(all(TOKEN.encode() not in a for a in argv), "token in argv: %r" % argv)
                ps = subprocess.run(
                    ["ps", "-ww", "-o", "args=", "-p", str(d.proc.pid)], capture_output=True, text=True
                ).stdout
                check("store serve" in ps and TOKEN not in ps, "ps shows %r" % ps)
                status, body = request(d.url, "GET", "/v1/jobs")
                check(status == 401, (how, status, body))
                status, body = request(d.url, "GET", "/v1/jobs", token=TOKEN)
                check(status == 200 and json.loads(body) == {"jobs": []}, (how, status, body))
                # Clients: the file, or the environment; without either, 401.
                p = run(tenplex, "store", "ls", "--url", d.url, "--token-file", tf, "--json", env={})
                check(p.returncode == 0, p.stderr)
                p = run(tenplex, "store", "ls", "--url", d.url, "--json", env={"TENPLEX_TOKEN": TOKEN})
                check(p.returncode == 0, p.stderr)
                env_without = dict(os.environ)
                env_without.pop("TENPLEX_TOKEN", None)
                p = subprocess.run(
                    [tenplex, "store", "ls", "--url", d.url],
                    capture_output=True,
                    text=True,
                    timeout=60,
                    env=env_without,
                )
                check(p.returncode != 0 and ("401" in p.stderr or "token" in p.stderr), (p.returncode, p.stderr))
            finally:
                d.stop()
        # Non-loopback without a token: refused, naming the alternatives.
        env_without = dict(os.environ)
        env_without.pop("TENPLEX_TOKEN", None)
        p = subprocess.run(
            [tenplex, "store", "serve", "--listen", "0.0.0.0:0"],
            capture_output=True,
            text=True,
            timeout=30,
            env=env_without,
        )
        check(p.returncode != 0 and "--token-file" in p.stderr, p.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _addr(hexaddr):
    host, port = hexaddr.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip = ipaddress.IPv4Address(raw[::-1])
    else:  # four 32-bit words, each little-endian
        ip = ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
    return ip, int(port, 16)


def listening(pid):
    """(address, port) of every TCP socket of process pid in the LISTEN state."""
    inodes = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = []
    for table in ("tcp", "tcp6"):
        with open("/proc/%d/net/%s" % (pid, table)) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:
                    out.append(_addr(fields[1]))
    return out


def other_addresses():
    """IPv4 addresses of this machine that are not loopback."""
    p = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True)
    out = []
    for line in p.stdout.splitlines():
        f = line.split()
        ip = ipaddress.ip_interface(f[3]).ip
        if not ip.is_loopback:
            out.append(ip)
    return out


def test_ucx(tenplex):
    env = {"UCX_TLS": "tcp"}
    d = Daemon(tenplex, env=env)
    try:
        socks = listening(d.proc.pid)
        http_port = int(d.url.rsplit(":", 1)[1])
        check(any(p == http_port for _, p in socks), "HTTP listener not found: %r" % socks)
        data = [(ip, p) for ip, p in socks if p != http_port]
        check(data, "no data-plane listening socket: %r" % socks)
        check(all(ip.is_loopback for ip, _ in socks), "listening beyond loopback: %r" % socks)
    finally:
        d.stop()
    others = other_addresses()
    if not others:
        print("note: no non-loopback interface here; --data-listen all not checked")
        return
    # Told otherwise: the data plane listens on the other interfaces too.
    d = Daemon(tenplex, env=env, args=("--data-listen", "all"))
    try:
        socks = listening(d.proc.pid)
        check(any(not ip.is_loopback for ip, _ in socks), "--data-listen all: %r" % socks)
    finally:
        d.stop()


def make_checkpoint(tenplex, tmp, seed):
    model = os.path.join(tmp, "m.json")
    if not os.path.exists(model):
        p = run(
            tenplex,
            "model",
            "gpt",
            "--num-layers",
            "2",
            "--hidden-size",
            "16",
            "--num-attention-heads",
            "4",
            "--ffn-hidden-size",
            "24",
            "--vocab-size",
            "64",
            "--max-position-embeddings",
            "8",
            "-o",
            model,
        )
        check(p.returncode == 0, p.stderr)
    out = os.path.join(tmp, "ckpt-%d" % seed)
    p = run(tenplex, "ckpt", "init", "--model", model, "--config", "tp=2", "--out", out, "--seed", str(seed))
    check(p.returncode == 0, p.stderr)
    return out


def rank_files(d):
    out = {}
    for name in sorted(os.listdir(d)):
        if name.endswith(".safetensors"):
            with open(os.path.join(d, name), "rb") as f:
                out[name] = f.read()
    return out


def test_quarantine(tenplex):
    tmp = tempfile.mkdtemp(prefix="tenplex-quarantine-")
    shm = os.path.join(tmp, "shm")  # beside the checkpoints, on disk: --allow-disk
    try:
        ck = {j: make_checkpoint(tenplex, tmp, s) for j, s in (("good", 1), ("bad", 2), ("other", 3))}
        d = Daemon(tenplex, args=("--shm-dir", shm, "--allow-disk"))
        try:
            for job, dirname in ck.items():
                p = run(tenplex, "store", "load", "--url", d.url, "--job", job, "--dir", dirname)
                check(p.returncode == 0, p.stderr)
        finally:
            d.stop()
        manifest = os.path.join(shm, "jobs", "bad", "1", "MANIFEST.json")
        with open(manifest, "r+b") as f:
            f.truncate(os.path.getsize(manifest) // 2)  # truncated mid-JSON
        d = Daemon(tenplex, args=("--shm-dir", shm, "--allow-disk"))
        try:
            health = d.get("/v1/health")
            q = health.get("quarantined")
            check(isinstance(q, list) and [e["job"] for e in q] == ["bad"], health)
            check("not a tenplex.store.version.v1 manifest" in q[0]["reason"], q)
            check(os.path.isdir(q[0]["path"]) and not os.path.exists(os.path.join(shm, "jobs", "bad")), q)
            for path in ("/v1/jobs/bad", "/v1/jobs/bad/versions/current", "/v1/list/jobs/bad/"):
                status, body = request(d.url, "GET", path)
                err = json.loads(body)
                check(status == 500 and "quarantined" in err["error"] and "bad" in err["error"], (path, status, body))
            status, body = request(d.url, "POST", "/v1/jobs/bad/versions")
            check(status == 500 and "quarantined" in json.loads(body)["error"], (status, body))
            check(
                sorted(j["job"] if isinstance(j, dict) else j for j in d.get("/v1/jobs")["jobs"]) == ["good", "other"],
                d.get("/v1/jobs"),
            )
            # The other jobs are served byte for byte.
            for job in ("good", "other"):
                out = os.path.join(tmp, "out-" + job)
                p = run(tenplex, "store", "save", "--url", d.url, "--job", job, "--out", out)
                check(p.returncode == 0, p.stderr)
                check(rank_files(out) == rank_files(ck[job]), "%s changed" % job)
        finally:
            d.stop()
        # Still quarantined after another restart; rm forgets it; the name is usable again.
        d = Daemon(tenplex, args=("--shm-dir", shm, "--allow-disk"))
        try:
            check([e["job"] for e in d.get("/v1/health")["quarantined"]] == ["bad"], "forgotten on restart")
            p = run(tenplex, "store", "rm", "bad", "--url", d.url)
            check(p.returncode == 0, p.stderr)
            check(d.get("/v1/health")["quarantined"] == [], "rm did not forget it")
            check(os.listdir(os.path.join(shm, "quarantine")) == [], os.listdir(os.path.join(shm, "quarantine")))
            p = run(tenplex, "store", "load", "--url", d.url, "--job", "bad", "--dir", ck["bad"])
            check(p.returncode == 0, p.stderr)
        finally:
            d.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_checksum(tenplex):
    tmp = tempfile.mkdtemp(prefix="tenplex-checksum-")
    shm = os.path.join(tmp, "shm")
    try:
        ck = make_checkpoint(tenplex, tmp, 5)
        d = Daemon(tenplex, args=("--shm-dir", shm, "--allow-disk"))
        try:
            p = run(tenplex, "store", "load", "--url", d.url, "--job", "j", "--dir", ck)
            check(p.returncode == 0, p.stderr)
            listed = d.get("/v1/list/jobs/j/current/?detail=1")
            with open(os.path.join(shm, "jobs", "j", "1", "MANIFEST.json")) as f:
                manifest = {t["key"]: t for t in json.load(f)["tensors"]}
            check(len(listed) == len(manifest) > 0, (len(listed), len(manifest)))
            for t in listed:
                with open(t["file"], "rb") as f:
                    want = xxh64(f.read())
                key = t["path"].split("/", 3)[3]
                check(t["xxh64"] == want == manifest[key]["xxh64"], (t, want, manifest[key]))
            p = run(tenplex, "store", "save", "--url", d.url, "--job", "j", "--out", os.path.join(tmp, "ok"))
            check(p.returncode == 0, "save before the flip: " + p.stderr)
            # Flip one byte of the largest committed tensor behind the store's back.
            victim = max(listed, key=lambda t: t["bytes"])
            with open(victim["file"], "r+b") as f:
                f.seek(victim["bytes"] // 2)
                b = f.read(1)
                f.seek(victim["bytes"] // 2)
                f.write(bytes([b[0] ^ 0x10]))
            for extra in ([], ["--http"]):
                out = os.path.join(tmp, "flipped" + "".join(extra))
                p = run(tenplex, "store", "save", "--url", d.url, "--job", "j", "--out", out, *extra)
                check(p.returncode != 0, "save of a flipped tensor succeeded %s" % extra)
                check(victim["path"] in p.stderr and "corrupt" in p.stderr, p.stderr)
                check(not os.path.exists(os.path.join(out, "tenplex.json")), "a checkpoint was written")
            status, body = request(d.url, "GET", "/v1/meta/" + victim["path"])
            check(status == 500 and "corrupt" in json.loads(body)["error"], (status, body))
            other = min(listed, key=lambda t: t["bytes"])
            meta = d.get("/v1/meta/" + other["path"])
            check(meta["xxh64"] == other["xxh64"], meta)
        finally:
            d.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(pytest.main([os.path.abspath(__file__), "-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
