#!/usr/bin/env python3
"""Integration tests of the tensor store daemon (`tenplex store serve|load|save`).

Usage: store_test.py TENPLEX_BIN PART, PART one of
  api        every endpoint, every bad request of the issue, then the daemon still
             serves and no stored byte changed
  auth       tokens (missing/wrong/right) and the non-loopback rule
  shm        local zero-copy: alloc + mmap from another process that is then killed
             with SIGKILL; its tensors stay readable and committable
  restart    --shm-dir keeps committed state across a restart; a private directory
             is removed on SIGTERM; several daemons never collide
  checkpoint load/save round trips byte-identical (shared memory and HTTP), bad
             checksums are refused without leaving a version behind

References are independent of the C++ code: ranges are cut from the uploaded bytes
in Python, checksums come from a pure-Python XXH64, safetensors files are written
here by hand.
"""

import json
import mmap
import os
import random
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

TENPLEX = sys.argv[1]
PART = sys.argv[2]
ELEM = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


# ---------------------------------------------------------------- XXH64 reference
P1, P2, P3, P4, P5 = (
    11400714785074694791,
    14029467366897019727,
    1609587929392839161,
    9650029242287828579,
    2870177450012600261,
)
M64 = (1 << 64) - 1


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def _round(acc, lane):
    return (_rotl((acc + lane * P2) & M64, 31) * P1) & M64


def _merge(acc, val):
    return ((acc ^ _round(0, val)) * P1 + P4) & M64


def xxh64(data, seed=0):
    n = len(data)
    i = 0
    if n >= 32:
        v = [(seed + P1 + P2) & M64, (seed + P2) & M64, seed, (seed - P1) & M64]
        while i + 32 <= n:
            lanes = struct.unpack_from("<4Q", data, i)
            v = [_round(v[k], lanes[k]) for k in range(4)]
            i += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & M64
        for k in range(4):
            h = _merge(h, v[k])
    else:
        h = (seed + P5) & M64
    h = (h + n) & M64
    while i + 8 <= n:
        h ^= _round(0, struct.unpack_from("<Q", data, i)[0])
        h = (_rotl(h, 27) * P1 + P4) & M64
        i += 8
    if i + 4 <= n:
        h ^= (struct.unpack_from("<I", data, i)[0] * P1) & M64
        h = (_rotl(h, 23) * P2 + P3) & M64
        i += 4
    while i < n:
        h ^= (data[i] * P5) & M64
        h = (_rotl(h, 11) * P1) & M64
        i += 1
    h ^= h >> 33
    h = (h * P2) & M64
    h ^= h >> 29
    h = (h * P3) & M64
    h ^= h >> 32
    return "%016x" % h


# ---------------------------------------------------------------- daemon helpers
class Daemon:
    def __init__(self, *args, expect_fail=False):
        self.proc = subprocess.Popen(
            [TENPLEX, "store", "serve", "--listen", "127.0.0.1:0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        if expect_fail:
            return
        line = self._readline(20)
        m = re.search(r"http://127\.0\.0\.1:(\d+) \(shm (\S+),", line)
        check(m, "daemon did not announce its address: %r %r" % (line, self.stderr_now()))
        self.port = int(m.group(1))
        self.url = "http://127.0.0.1:%d" % self.port
        self.shm_dir = m.group(2)

    def _readline(self, timeout):
        deadline = time.time() + timeout
        buf = b""
        while time.time() < deadline:
            r, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if r:
                c = os.read(self.proc.stdout.fileno(), 1)
                if not c:
                    break
                if c == b"\n":
                    return buf.decode()
                buf += c
            elif self.proc.poll() is not None:
                break
        return buf.decode()

    def stderr_now(self):
        if self.proc.poll() is None:
            return ""
        return self.proc.stderr.read().decode(errors="replace")

    def stop(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)
        rc = self.proc.wait(timeout=20)
        err = self.proc.stderr.read().decode(errors="replace")
        self.proc.stdout.close()
        self.proc.stderr.close()
        return rc, err


def request(url, method, path, body=None, headers=None, token=None):
    h = dict(headers or {})
    if token is not None:
        h["Authorization"] = "Bearer " + token
    if body is None and method in ("POST", "PUT"):
        body = b""
    req = urllib.request.Request(url + path, data=body, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def raw(port, data, read_timeout=10, half_close=False):
    """Sends raw bytes (then closes our sending side when asked) and returns (status, body)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=read_timeout)
    try:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
    except (BrokenPipeError, ConnectionResetError):
        pass
    out = b""
    try:
        while True:
            c = s.recv(65536)
            if not c:
                break
            out += c
            head, sep, rest = out.partition(b"\r\n\r\n")
            if sep:
                m = re.search(rb"Content-Length: (\d+)", head)
                if m and len(rest) >= int(m.group(1)):
                    break
    except (ConnectionResetError, socket.timeout):
        pass
    s.close()
    head, _, body = out.partition(b"\r\n\r\n")
    m = re.match(rb"HTTP/1\.1 (\d+)", head)
    return (int(m.group(1)) if m else None), body


def expect_error(status, body, want, what):
    check(status == want, "%s: status %s, want %s (%r)" % (what, status, want, body[:300]))
    try:
        j = json.loads(body)
    except ValueError:
        raise AssertionError("%s: error body is not JSON: %r" % (what, body[:300])) from None
    check(isinstance(j.get("error"), str) and j["error"], "%s: no error message in %r" % (what, j))
    return j["error"]


def jget(url, path, **kw):
    status, _, body = request(url, "GET", path, **kw)
    check(status == 200, "GET %s: %s %r" % (path, status, body[:300]))
    return json.loads(body)


def begin(url, job, version=None, info=None, **kw):
    q = "" if version is None else "?version=%d" % version
    status, _, body = request(
        url, "POST", "/v1/jobs/%s/versions%s" % (job, q), json.dumps(info).encode() if info is not None else b"", **kw
    )
    check(status == 201, "begin %s: %s %r" % (job, status, body))
    return json.loads(body)["version"]


def put(url, path, dtype, shape, data, **kw):
    status, _, body = request(
        url, "PUT", "/v1/tensors/%s?dtype=%s&shape=%s" % (path, dtype, ",".join(map(str, shape))), data, **kw
    )
    check(status == 201, "PUT %s: %s %r" % (path, status, body))
    return json.loads(body)


def commit(url, job, version, **kw):
    status, _, body = request(url, "POST", "/v1/jobs/%s/versions/%d/commit" % (job, version), **kw)
    check(status == 200, "commit %s/%d: %s %r" % (job, version, status, body))


def get(url, path, rng=None, **kw):
    q = "" if rng is None else "?range=" + rng
    status, headers, body = request(url, "GET", "/v1/tensors/" + path + q, **kw)
    check(status == 200, "GET %s%s: %s %r" % (path, q, status, body[:300]))
    return headers, body


def cut(data, shape, elem, box):
    """The bytes of box (list of (b, e)) of a row-major tensor: the reference slicer."""
    strides = [elem] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        strides[k] = strides[k + 1] * shape[k + 1]
    out = bytearray()

    def rec(k, off):
        if k == len(shape):
            out.extend(data[off : off + elem])
            return
        for i in range(box[k][0], box[k][1]):
            rec(k + 1, off + i * strides[k])

    if all(e > b for b, e in box) or not shape:
        rec(0, 0)
    return bytes(out)


def rand_bytes(n, seed):
    r = random.Random(seed)
    return bytes(r.getrandbits(8) for _ in range(n))


# ---------------------------------------------------------------- parts
def test_api():
    d = Daemon("--memory-limit", "64M", "--max-body", "1M")
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


def test_auth():
    tmp = tempfile.mkdtemp(prefix="tenplex-auth-")
    token_file = os.path.join(tmp, "token")
    with open(os.open(token_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write("s3cret\n")
    d = Daemon("--token-file", token_file)
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
    p = subprocess.run([TENPLEX, "store", "serve", "--listen", "0.0.0.0:0"], capture_output=True, text=True, timeout=20)
    check(p.returncode != 0 and "--token-file" in p.stderr, (p.returncode, p.stderr))
    shutil.rmtree(tmp)
    p = subprocess.run([TENPLEX, "store", "serve", "--listen", "127.0.0.1"], capture_output=True, text=True, timeout=20)
    check(p.returncode != 0 and "host:port" in p.stderr, (p.returncode, p.stderr))
    p = subprocess.run(
        [TENPLEX, "store", "serve", "--memory-limit", "lots"], capture_output=True, text=True, timeout=20
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


def test_shm():
    d = Daemon()
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


def test_restart():
    tmp = tempfile.mkdtemp(prefix="tenplex-store-restart-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    shm = os.path.join(tmp, "store")
    try:
        a = Daemon("--shm-dir", shm)
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
        b = Daemon("--shm-dir", shm, expect_fail=True)
        rc = b.proc.wait(timeout=20)
        err = b.proc.stderr.read().decode()
        b.proc.stdout.close()
        b.proc.stderr.close()
        check(rc != 0 and "in use by another tenplex store" in err, (rc, err))
        rc, err = a.stop()
        check(rc == 0, err)
        check(os.path.isdir(shm), "persistent shm dir removed")

        a2 = Daemon("--shm-dir", shm)
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
        a3 = Daemon("--shm-dir", shm)
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
    ds = [Daemon() for _ in range(4)]
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


# ---------------------------------------------------------------- checkpoints
def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, dtype, shape, bytes) in data order."""
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    off = 0
    for name, dtype, shape, data in tensors:
        header[name] = {"data_offsets": [off, off + len(data)], "dtype": dtype, "shape": shape}
        off += len(data)
    text = json.dumps(header, sort_keys=True, separators=(",", ":"))
    text += " " * ((8 - (len(text) + 8) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text.encode())
        for _, _, _, data in tensors:
            f.write(data)


def make_checkpoint(ckpt, config, reorder=False):
    model_path = os.path.join(os.path.dirname(ckpt), "model.json")
    subprocess.run(
        [
            TENPLEX,
            "model",
            "gpt",
            "--num-layers",
            "2",
            "--hidden-size",
            "16",
            "--num-attention-heads",
            "4",
            "--vocab-size",
            "100",
            "--max-position-embeddings",
            "32",
            "-o",
            model_path,
        ],
        check=True,
    )
    layout = json.loads(
        subprocess.run(
            [TENPLEX, "layout", "--model", model_path, "--config", config, "--json"], check=True, capture_output=True
        ).stdout
    )
    os.makedirs(ckpt)
    sums = {}
    for rank in layout["ranks"]:
        tensors = []
        for i, t in enumerate(rank["tensors"]):
            n = ELEM[t["dtype"]]
            for d in t["shape"]:
                n *= d
            tensors.append((t["name"], t["dtype"], t["shape"], rand_bytes(n, rank["rank"] * 1000 + i)))
        tensors.append(("__step__", "I64", [], struct.pack("<q", 42)))  # extra tensor outside the layout
        if reorder:
            tensors.reverse()
        name = "rank-%05d.safetensors" % rank["rank"]
        write_safetensors(os.path.join(ckpt, name), tensors, {"format": "pt"} if reorder else None)
        with open(os.path.join(ckpt, name), "rb") as f:
            sums[name] = xxh64(f.read())
    with open(model_path) as f:
        model = json.load(f)
    with open(os.path.join(ckpt, "tenplex.json"), "w") as f:
        json.dump({"model": model, "config": config, "step": 42, "checksums": sums}, f)
    return layout


def run(*args, ok=True):
    p = subprocess.run([TENPLEX, *args], capture_output=True, text=True, timeout=120)
    if ok:
        check(p.returncode == 0, "%s failed: %s %s" % (args, p.stdout, p.stderr))
    return p


def same_checkpoint(a, b):
    names = sorted(os.listdir(a))
    check(names == sorted(os.listdir(b)), (names, sorted(os.listdir(b))))
    for n in names:
        with open(os.path.join(a, n), "rb") as f:
            x = f.read()
        with open(os.path.join(b, n), "rb") as f:
            y = f.read()
        if n == "tenplex.json":
            check(json.loads(x) == json.loads(y), "tenplex.json differs")
        else:
            check(x == y, "%s differs after the round trip" % n)


def read_safetensors(path):
    """[(name, dtype, shape, bytes)] in data order."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    out = []
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, end = e["data_offsets"]
        out.append((name, e["dtype"], e["shape"], raw[8 + n + b : 8 + n + end]))
    return out


def check_info_fields(d, tmp):
    """Every field of a version's info survives `store save` and `store load` (issue 16 bug 1).

    A version as `tenplex run` commits it (step, samples_consumed and other training
    fields at the top of its info) is saved: tenplex.json must carry every field; loaded
    back, the new version's info must carry them again, where the runner reads them."""
    src = os.path.join(tmp, "fields-src")
    layout = make_checkpoint(src, "tp=2,pp=1,dp=1")
    with open(os.path.join(src, "tenplex.json")) as f:
        meta = json.load(f)
    fields = {"step": 24, "samples_consumed": 192, "seed": 5, "global_batch_size": 8, "note": {"a": [1, 2]}}
    info = {"model": meta["model"], "config": "tp=2,pp=1,dp=1", **fields}
    v = begin(d.url, "run", info=info)
    for rank in layout["ranks"]:
        name = "rank-%05d.safetensors" % rank["rank"]
        for t, dtype, shape, data in read_safetensors(os.path.join(src, name)):
            put(d.url, "jobs/run/%d/rank-%05d/%s" % (v, rank["rank"], t), dtype, shape, data)
    commit(d.url, "run", v)
    out = os.path.join(tmp, "fields-out")
    run("store", "save", "--url", d.url, "--job", "run", "--out", out)
    with open(os.path.join(out, "tenplex.json")) as f:
        saved = json.load(f)
    for k, want in fields.items():
        check(saved.get(k) == want, "store save lost info field %s: %r in tenplex.json" % (k, saved.get(k)))
    check(saved["config"] == "tp=2,pp=1,dp=1" and saved["model"] == meta["model"], "model/config changed")
    run("store", "load", "--url", d.url, "--job", "run2", "--dir", out)
    back = jget(d.url, "/v1/jobs/run2/versions/current")["info"]
    for k, want in fields.items():
        check(back.get(k) == want, "store load lost tenplex.json field %s: %r in the info" % (k, back.get(k)))
    # A tenplex.json field named like the store's bookkeeping ("cluster", "source") survives too.
    with open(os.path.join(src, "tenplex.json")) as f:
        meta = json.load(f)
    meta["cluster"] = "not ours"
    meta["source"] = [1, 2]
    with open(os.path.join(src, "tenplex.json"), "w") as f:
        json.dump(meta, f)
    run("store", "load", "--url", d.url, "--job", "run3", "--dir", src)
    out2 = os.path.join(tmp, "fields-out2")
    run("store", "save", "--url", d.url, "--job", "run3", "--out", out2)
    with open(os.path.join(out2, "tenplex.json")) as f:
        saved = json.load(f)
    for k in ("cluster", "source", "step"):
        check(saved.get(k) == meta[k], "field %s: %r after a round trip, %r before" % (k, saved.get(k), meta[k]))


def test_checkpoint():
    tmp = tempfile.mkdtemp(prefix="tenplex-store-ckpt-")
    d = Daemon()
    try:
        for config, reorder in [("tp=2,pp=2,dp=1", False), ("tp=1,pp=2,dp=2,zero=1", True)]:
            ck = os.path.join(tmp, "ck-" + config.replace(",", "_"))
            os.makedirs(ck)
            src = os.path.join(ck, "src")
            make_checkpoint(src, config, reorder)
            job = "j" + str(len(config))
            p = run("store", "load", "--url", d.url, "--job", job, "--dir", src)
            check("shared memory" in p.stdout and "checksums verified" in p.stdout, p.stdout)
            out = os.path.join(ck, "out-shm")
            p = run("store", "save", "--url", d.url, "--job", job, "--out", out)
            check("shared memory" in p.stdout, p.stdout)
            same_checkpoint(src, out)
            # The same through HTTP bodies, into a second job.
            p = run("store", "load", "--url", d.url, "--job", job + "h", "--dir", src, "--http")
            check("via HTTP" in p.stdout, p.stdout)
            out2 = os.path.join(ck, "out-http")
            p = run("store", "save", "--url", d.url, "--job", job + "h", "--out", out2, "--http")
            check("via HTTP" in p.stdout, p.stdout)
            same_checkpoint(src, out2)
            # Saving onto an existing checkpoint is refused.
            p = run("store", "save", "--url", d.url, "--job", job, "--out", out, ok=False)
            check(p.returncode != 0 and "already exists" in p.stderr, p.stderr)
        check_info_fields(d, tmp)
        # A corrupted rank file: the recorded checksum does not match, the load fails
        # and leaves no version behind.
        bad = os.path.join(tmp, "bad")
        make_checkpoint(bad, "tp=2,pp=1,dp=1")
        fn = os.path.join(bad, "rank-00001.safetensors")
        with open(fn, "r+b") as f:
            f.seek(-5, 2)
            c = f.read(1)
            f.seek(-5, 2)
            f.write(bytes([c[0] ^ 0xFF]))
        p = run("store", "load", "--url", d.url, "--job", "bad", "--dir", bad, ok=False)
        check(p.returncode != 0 and "does not match" in p.stderr, p.stderr)
        status, _, body = request(d.url, "GET", "/v1/jobs/bad")
        check(status == 404 or json.loads(body)["versions"] == [], (status, body))
        p = run("store", "load", "--url", d.url, "--job", "bad", "--dir", os.path.join(tmp, "nope"), ok=False)
        check(p.returncode != 0 and "tenplex.json" in p.stderr, p.stderr)
        p = run("store", "save", "--url", d.url, "--job", "nojob", "--out", os.path.join(tmp, "o"), ok=False)
        check(p.returncode != 0 and "nojob" in p.stderr, p.stderr)
        p = run("store", "load", "--url", "http://127.0.0.1:1", "--job", "x", "--dir", bad, ok=False)
        check(p.returncode != 0 and "cannot reach" in p.stderr, p.stderr)
    finally:
        rc, err = d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    check(rc == 0, err)


if __name__ == "__main__":
    {"api": test_api, "auth": test_auth, "shm": test_shm, "restart": test_restart, "checkpoint": test_checkpoint}[
        PART
    ]()
    print("store_test %s: ok" % PART)
