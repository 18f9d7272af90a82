#!/usr/bin/env python3
"""Hostile clients against `tenplex store serve` (issue 19 section 2, docs/reliability.md).

Each check failed before its fix: deeply nested JSON crashed the daemon, a JSON body
over --max-body was stored as {}, non-UTF-8 targets were 500, duplicate Content-Length
and Content-Length with chunked were accepted, idle and slow-loris connections blocked
every client. Also scrapes and parses GET /metrics and checks the access log.

usage: TENPLEX_BIN=path/to/tenplex python -m pytest tests/store_hardening_test.py (pytest;
scripts/fault_campaign_hostile.py loads this file by path for its Hostile)
"""

import json
import os
import re
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import pytest


def start(binary, max_body="1024", token=None):
    log = tempfile.NamedTemporaryFile(prefix="tenplex-access-", suffix=".log", delete=False).name
    p = subprocess.Popen(
        [
            binary,
            "store",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--transport",
            "none",
            "--max-body",
            max_body,
            "--access-log",
            log,
        ],
        env=dict(os.environ, TENPLEX_TOKEN=token) if token else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = p.stdout.readline()
    m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
    assert m, "no serving line: " + line + p.stderr.read()
    return p, int(m.group(1)), log


def raw(port, data, timeout=10.0):
    """Sends raw bytes; returns (status, body) of the reply."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(data)
    out = b""
    try:
        while True:
            c = s.recv(65536)
            if not c:
                break
            out += c
            head, _, body = out.partition(b"\r\n\r\n")
            m = re.search(rb"Content-Length: (\d+)", head, re.I)
            if m and len(body) >= int(m.group(1)):
                break
    except socket.timeout:
        pass
    s.close()
    head, _, body = out.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1]) if head.startswith(b"HTTP/1.1") else 0
    return status, body


def get(port, path, timeout=5.0):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        return r.status, r.read()


def post(port, path, body):
    return raw(port, (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)


class Hostile(threading.Thread):
    """Holds `count` connections to port from `sources` (local addresses, round robin)
    that never send a whole request (idle, or headers that never end), and opens a new
    one for every one the daemon closes."""

    def __init__(self, port, count, sources, partial):
        super().__init__(daemon=True)
        self.port, self.count, self.sources, self.partial = port, count, sources, partial
        self.stop, self.opened = threading.Event(), 0

    def open_one(self):
        s = socket.create_connection(
            ("127.0.0.1", self.port), timeout=5, source_address=(self.sources[self.opened % len(self.sources)], 0)
        )
        self.opened += 1
        if self.partial:
            s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")
        return s

    def run(self):
        held = [self.open_one() for _ in range(self.count)]
        while not self.stop.is_set():
            ready, _, _ = select.select(held, [], [], 0.05)
            for s in ready:
                try:
                    gone = s.recv(4096) == b""
                except OSError:
                    gone = True
                if gone:
                    held.remove(s)
                    s.close()
                    try:
                        held.append(self.open_one())
                    except OSError:
                        pass
        for s in held:
            s.close()


def lockout(binary):
    """Issue 35 finding 3: 30 idle and 30 partial connections from the client's own
    address that reconnect when dropped, and partial connections from 200 other
    addresses, never keep a client with the token out (every call 503 for as long as
    the flood lasted before: the old per-address cap of 24 counted them all)."""
    token = "hardening-token"
    p, port, log = start(binary, token=token)
    floods = [
        Hostile(port, 30, ["127.0.0.1"], False),
        Hostile(port, 30, ["127.0.0.1"], True),
        Hostile(port, 200, [f"127.0.1.{i}" for i in range(1, 201)], True),
    ]
    try:
        for f in floods:
            f.start()
        time.sleep(0.5)
        worst, deadline = 0.0, time.time() + 5.0  # two pending deadlines: the floods reconnect
        calls = 0
        while time.time() < deadline:
            t0 = time.time()
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/health", headers={"Authorization": f"Bearer {token}"}
            )
            with urllib.request.urlopen(req, timeout=5) as r:
                assert r.status == 200, r.status
            worst = max(worst, time.time() - t0)
            calls += 1
            time.sleep(0.05)
        assert worst < 1.0, f"an authenticated call took {worst:.2f} s during the flood"
        reopened = sum(f.opened for f in floods) - 260
        assert reopened >= 200, f"the daemon closed only {reopened} hostile connections"
        print(
            f"lock-out: {calls} authenticated calls served during the flood (worst {worst * 1000:.0f} ms); "
            f"{reopened} hostile connections closed and re-opened"
        )
    finally:
        for f in floods:
            f.stop.set()
        for f in floods:
            f.join(10)
        p.terminate()
        p.wait(10)
        os.unlink(log)


def test_hardening(tenplex):
    binary = tenplex
    p, port, log = start(binary)
    try:
        # Nesting: 400 and the daemon lives (SIGSEGV before the fix).
        nested = b'{"a": ' + b"[" * 100000 + b"]" * 100000 + b"}"
        p2, port2, _ = start(binary, "1M")
        st, body = post(port2, "/v1/jobs/x/versions", nested)
        assert st == 400 and b"nests" in body, (st, body[:200])
        assert get(port2, "/v1/health")[0] == 200
        p2.terminate()
        p2.wait(10)

        # A JSON body over --max-body: 413, nothing stored (201 and {} before).
        big = json.dumps({"k": "x" * 4000}).encode()
        st, body = post(port, "/v1/jobs/big/versions", big)
        assert st == 413, (st, body)
        st, body = get(port, "/v1/jobs")
        assert json.loads(body)["jobs"] == [], body

        # Non-UTF-8 bytes in the path or the query: 400 with a JSON body (500 before).
        for target in (b"/v1/jobs/\xff\xfe", b"/v1/list/jobs?detail=\xc3\x28", b"/v1/jobs/%ff"):
            st, body = raw(port, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n")
            assert st == 400, (target, st, body)
            json.loads(body)

        # Ambiguous framing: 400.
        st, _ = raw(
            port, b"POST /v1/jobs/a/versions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}"
        )
        assert st == 400, st
        st, _ = raw(
            port,
            b"POST /v1/jobs/a/versions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        )
        assert st == 400, st
        assert json.loads(get(port, "/v1/jobs")[1])["jobs"] == []

        # Slow loris: 8 idle and 8 partial connections; a client is served at once.
        held = []
        for i in range(16):
            s = socket.create_connection(("127.0.0.1", port))
            if i % 2:
                s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")  # headers never end
            held.append(s)
        time.sleep(0.3)
        t0 = time.time()
        assert get(port, "/v1/health", timeout=3)[0] == 200
        assert time.time() - t0 < 1.0, time.time() - t0
        # More idle connections than the old per-client limit (24): none is refused
        # (503 before), a client is still served at once, and every connection that sent
        # no whole request is closed at the pending deadline (2 s).
        for _ in range(10):
            held.append(socket.create_connection(("127.0.0.1", port)))
        time.sleep(0.3)
        assert get(port, "/v1/health", timeout=3)[0] == 200
        t0 = time.time()
        for s in held:
            s.settimeout(5)
            assert s.recv(100) == b"", "a connection without a whole request got an answer"
        assert time.time() - t0 < 4.0, time.time() - t0
        for s in held:
            s.close()
        lockout(binary)

        # Metrics: parse every sample line.
        st, text = get(port, "/metrics")
        assert st == 200
        samples = {}
        for line in text.decode().splitlines():
            if not line or line.startswith("#"):
                continue
            m = re.fullmatch(r'([a-z_]+)(\{[a-z_]+="[^"]*"\})? ([0-9.e+-]+)', line)
            assert m, line
            samples[m.group(1) + (m.group(2) or "")] = float(m.group(3))
        assert samples['tenplex_http_requests_total{code="413"}'] >= 1, samples
        assert samples['tenplex_http_requests_total{code="400"}'] >= 5, samples
        assert samples["tenplex_http_connections_refused_total"] >= 1, samples
        assert samples["tenplex_store_used_bytes"] == 0
        assert samples['tenplex_store_versions{state="open"}'] == 0
        # A version with a tensor shows up in the store gauges.
        assert post(port, "/v1/jobs/m/versions", b"")[0] == 201
        st, _ = raw(
            port,
            b"PUT /v1/tensors/jobs/m/1/rank-00000/w?dtype=F32&shape=4 HTTP/1.1\r\nHost: x\r\n"
            b"Content-Length: 16\r\n\r\n" + bytes(16),
        )
        assert st == 201, st
        text = get(port, "/metrics")[1].decode()
        assert "tenplex_store_used_bytes 16\n" in text, text
        assert 'tenplex_store_versions{state="open"} 1\n' in text, text

        # Access log: one line per request with method, target, status, bytes, seconds.
        lines = open(log).read().splitlines()
        put = [line for line in lines if " PUT /v1/tensors/jobs/m/1/rank-00000/w" in line]
        assert len(put) == 1, lines[-5:]
        f = put[0].split(" ")
        assert f[1] == "127.0.0.1" and f[4] == "201" and int(f[5]) > 16 and float(f[7]) >= 0, put
        assert any(" GET /metrics 200 " in line for line in lines)
        assert get(port, "/v1/health")[0] == 200
        print("store hardening: all checks passed")
    finally:
        p.terminate()
        p.wait(10)
        os.unlink(log)


if __name__ == "__main__":
    sys.exit(pytest.main([os.path.abspath(__file__), "-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
