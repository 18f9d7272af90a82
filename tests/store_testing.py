"""Shared helpers of the tensor store daemon's integration tests (store_test.py,
store_checkpoint_test.py, store_security_test.py): an independent pure-Python XXH64, a
daemon started on a free port, HTTP requests (and raw bytes) to it, and the reference
slicer of a row-major tensor.

The tests take the `tenplex` binary from the `tenplex` fixture (tests/conftest.py) and
pass it to `Daemon`.
"""

import json
import os
import random
import re
import select
import signal
import socket
import struct
import subprocess
import time
import urllib.error
import urllib.request

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
    def __init__(self, tenplex, *args, expect_fail=False):
        self.proc = subprocess.Popen(
            [tenplex, "store", "serve", "--listen", "127.0.0.1:0", *args],
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
