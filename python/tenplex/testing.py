"""Helpers for tests, benchmarks and scripts that start daemons, rendezvous servers and
process groups: a free TCP port (`free_port`), a `tenplex store serve` daemon (`Daemon`)
and the cluster file naming several (`write_cluster`), the CLI run for its output
(`run_tenplex`), the daemons' bandwidth limits (`probe_daemons`), and network namespaces
joined by a bridge (`NetnsBridge`). They live in the package (not in tests/) so that
benchmarks and scripts import them without putting tests/ on `sys.path`.

`free_port` is the one way the project's tests and scripts choose a TCP port. Asking the
kernel for port 0 and closing the socket returns a port from the ephemeral range
(`/proc/sys/net/ipv4/ip_local_port_range`); until the test binds it, any outgoing
connection on the machine (gloo's full mesh, a UCX wireup, HTTP clients of the tests
running beside it under `ctest -j`) may take it as its local port, and the daemon's
`listen` then fails with "port in use" (the deploy test failed so in a clean-clone CI).
This picks a random port below the ephemeral range instead, which connections never get
by chance, and checks that it is free on every address.
"""

from __future__ import annotations

import fcntl
import json
import logging
import multiprocessing as mp
import os
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from typing import IO, Any

logger = logging.getLogger(__name__)

_LOWEST = 20000  # above the well-known and registered ports most services use


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_port(tries: int = 200) -> int:
    """A TCP port nothing listens on or holds now, below the ephemeral range."""
    high = _ephemeral_start() - 1
    if high <= _LOWEST:  # an unusual range: fall back to the kernel's choice
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    rng = random.SystemRandom()
    for _ in range(tries):
        port = rng.randint(_LOWEST, high)
        if _bindable(port):
            return port
    raise OSError(f"no free TCP port in {_LOWEST}..{high} after {tries} tries")


def run_tenplex(tenplex: str, *args: str) -> str:
    """`tenplex ARGS`' standard output; SystemExit with its output when it fails."""
    p = subprocess.run([tenplex, *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("tenplex %s failed:\n%s%s" % (" ".join(args), p.stdout, p.stderr))
    return p.stdout


class Daemon:
    """`tenplex store serve` on a port it chooses; `url` is the address it announces."""

    def __init__(
        self,
        tenplex: str,
        env: dict[str, str] | None = None,
        stderr: int | IO[Any] | None = subprocess.DEVNULL,
        listen: str = "127.0.0.1:0",
        prefix: Sequence[str] = (),
        args: Sequence[str] = (),
    ) -> None:
        """prefix: a command the daemon runs under (e.g. ip netns exec NS); args: more
        arguments of `store serve` (e.g. --shm-dir DIR, kept across a restart)."""
        self.proc = subprocess.Popen(
            [*prefix, tenplex, "store", "serve", "--listen", listen, *args],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=dict(os.environ, **(env or {})),
        )
        assert self.proc.stdout is not None
        line, deadline = b"", time.time() + 30
        while time.time() < deadline and not line.endswith(b"\n"):
            r, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if r:
                c = os.read(self.proc.stdout.fileno(), 1)
                if not c:
                    break
                line += c
        m = re.search(r"(http://[0-9.]+:\d+)", line.decode())
        if not m:
            self.kill()
            raise SystemExit("FAIL: store daemon did not announce its address: %r" % line)
        self.url = m.group(1)

    def call(self, method: str, path: str, body: Any = None, timeout: float = 600) -> Any:
        """One JSON request (with TENPLEX_TOKEN as its bearer token when set); the reply's JSON."""
        headers = {"Content-Type": "application/json"}
        if os.environ.get("TENPLEX_TOKEN"):
            headers["Authorization"] = "Bearer " + os.environ["TENPLEX_TOKEN"]
        req = urllib.request.Request(
            self.url + path, method=method, data=None if body is None else json.dumps(body).encode(), headers=headers
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read() or b"null")

    def get(self, path: str) -> Any:
        return self.call("GET", path, timeout=20)

    def metric(self, name: str) -> int:
        """The value of an unlabelled metric of GET /metrics (an int)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=20) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return int(float(line.split()[1]))
        raise SystemExit("FAIL: no metric %s at %s" % (name, self.url))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(20)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


def write_cluster(path: str, daemons: Sequence[Daemon], gpus_per_host: int) -> None:
    """The cluster file (`--cluster`) naming the daemons' URLs, one host each."""
    with open(path, "w") as f:
        json.dump({"hosts": [d.url for d in daemons], "gpus_per_host": gpus_per_host}, f)


def probe_daemons(daemons: Sequence[Daemon]) -> dict[str, Any]:
    """Two-daemon limits, then the same probe on every daemon at once (daemon i fetching
    from daemon i+1): the aggregate this machine sustains when all hosts work together."""
    addrs = [d.call("GET", "/v1/transform/address")["address"] for d in daemons]
    results: list[Any] = [None] * len(daemons)

    def one(i: int) -> None:
        results[i] = daemons[i].call(
            "POST", "/v1/transform/probe", {"address": addrs[(i + 1) % len(daemons)], "bytes": 128 << 20}
        )

    # All at once first (every daemon also makes its scratch region then), then a pair.
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(daemons))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if any(r is None for r in results):
        raise SystemExit("a probe failed (see above)")
    pair: dict[str, Any] = daemons[0].call("POST", "/v1/transform/probe", {"address": addrs[1], "bytes": 256 << 20})
    pair["all_fetch_gbps"] = sum(r["fetch_large_gbps"] for r in results)
    # The probes' fresh writes are short and do not all overlap, so their sum overstates
    # the machine (by ~1.6x here); the write term uses all daemons' directories written
    # at the same instant instead.
    pair["all_write_sum_gbps"] = sum(r["fresh_write_gbps"] for r in results)
    pair["all_write_gbps"] = fresh_all_at_once([d.get("/v1/health")["shm_dir"] for d in daemons])
    pair["all_memcpy_gbps"] = sum(r["memcpy_gbps"] for r in results)
    return pair


def _fresh_writer(shm_dir: str, nbytes: int, barrier: Any, out: Any) -> None:
    """One daemon's share of fresh_all_at_once: what a transform does for a new tensor
    (posix_fallocate, mmap MAP_SHARED|MAP_POPULATE, copy from a warm buffer)."""
    import mmap

    warm = bytearray(b"\x5a") * nbytes
    path = os.path.join(shm_dir, "tmp", "bench-fresh-%d" % os.getpid())
    barrier.wait()
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(fd, 0, nbytes)
        m = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        m[:] = warm
        out.put(time.perf_counter() - t0)
        m.close()
    finally:
        os.close(fd)
        os.unlink(path)


def fresh_all_at_once(shm_dirs: Sequence[str], nbytes: int = 256 << 20, rounds: int = 2) -> float:
    """GB/s of new shared memory written by one process per daemon directory, all
    started together (best of `rounds`): the machine's fresh-page limit."""
    best = 0.0
    for _ in range(rounds):
        secs = all_at_once(_fresh_writer, shm_dirs, nbytes)
        best = max(best, len(shm_dirs) * nbytes / max(secs) / 1e9)
    return best


def all_at_once(target: Callable[[str, int, Any, Any], None], shm_dirs: Sequence[str], nbytes: int) -> list[Any]:
    """Runs `target(shm_dir, nbytes, barrier, out)` in one forked process per directory,
    started together (they wait on `barrier`); what each put on the queue `out`."""
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(len(shm_dirs)), ctx.Queue()
    procs = [ctx.Process(target=target, args=(d, nbytes, barrier, out)) for d in shm_dirs]
    for p in procs:
        p.start()
    results = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join()
    return results


class Unavailable(SystemExit):
    """SystemExit(77), ctest's "skipped" (SKIP_RETURN_CODE) for a script, where this machine
    lacks what a test needs (namespaces, root, a program); `why` says what, for a pytest
    caller's skip."""

    def __init__(self, why: str) -> None:
        super().__init__(77)
        self.why = why


def _skip(why: str) -> Unavailable:
    """Unavailable(why), after saying why on stderr."""
    logger.warning("SKIP: %s", why)
    return Unavailable(why)


class NetnsBridge:
    """`count` network namespaces joined by veth pairs on a bridge (as root): namespace
    i has address `addr(i)` on its veth `ifname(i)` and its loopback up. Unavailable
    (SystemExit(77), ctest: skipped) where they cannot be made; `close()` removes everything.

    Tests that run at once get different subnets and names: under a lock file
    (LOCK_FILE), the first free subnet 10.213.N.0/24 (N in SUBNETS) is taken, one that
    no interface has an address in and none of whose names (`name_prefix` + "br" / "ns" /
    "v" + N as three digits) is an existing link or namespace; its bridge with its
    address is made before the lock is released, so that the next test sees it in use.
    `name_prefix` (default "tp", at most 4 characters: link names have at most 15) tells
    a test's links apart from another's in `ip link`."""

    LOCK_FILE = os.path.join("/run" if os.path.isdir("/run") else tempfile.gettempdir(), "tenplex-netns.lock")
    SUBNETS = range(20, 220)

    def __init__(self, count: int, name_prefix: str = "tp") -> None:
        if os.geteuid() != 0 or shutil.which("ip") is None:
            raise _skip("needs root and iproute2 for network namespaces")
        if not re.fullmatch(r"[a-z][a-z0-9]{0,3}", name_prefix) or not 1 <= count <= 99:
            raise ValueError(
                "NetnsBridge: name_prefix %r (1-4 of a-z0-9, a letter first) or count %d (1-99)" % (name_prefix, count)
            )
        self.name_prefix, self.count = name_prefix, count
        self.tag, self.bridge, self.subnet = "", "", ""
        self.spaces: list[str] = []
        self.made: list[str] = []
        try:
            with open(self.LOCK_FILE, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                self._claim()
            for i, ns in enumerate(self.spaces):
                self.ip("netns", "add", ns)
                self.made.append(ns)
                self.ip("link", "add", self.bridge_end(i), "type", "veth", "peer", "name", self.ifname(i))
                self.ip("link", "set", self.ifname(i), "netns", ns)
                self.ip("link", "set", self.bridge_end(i), "master", self.bridge)
                self.ip("link", "set", self.bridge_end(i), "up")
                self.ip("netns", "exec", ns, "ip", "addr", "add", self.addr(i) + "/24", "dev", self.ifname(i))
                self.ip("netns", "exec", ns, "ip", "link", "set", self.ifname(i), "up")
                self.ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        except (RuntimeError, OSError) as e:
            self.close()
            raise _skip("network namespaces are not available here (%s)" % e) from e

    def _claim(self) -> None:
        """Picks the first free subnet and names and makes the bridge (under the lock)."""
        links = set(re.findall(r"^\d+: ([^:@]+)", self.ip("-o", "link", "show"), re.M))
        spaces = {line.split()[0] for line in self.ip("netns", "list").splitlines() if line.strip()}
        used = set(int(n) for n in re.findall(r"\binet 10\.213\.(\d+)\.", self.ip("-o", "addr", "show")))
        for n in self.SUBNETS:
            tag = "%03d" % n
            names = {self.name_prefix + "br" + tag} | {
                self.name_prefix + "v" + tag + "%d" % i + end for i in range(self.count) for end in ("", "p")
            }
            nss = [self.name_prefix + "ns%s-%d" % (tag, i) for i in range(self.count)]
            if n in used or names & links or set(nss) & spaces:
                continue
            self.tag, self.subnet, self.spaces = tag, "10.213.%d" % n, nss
            self.ip("link", "add", self.name_prefix + "br" + tag, "type", "bridge")
            self.bridge = self.name_prefix + "br" + tag  # made: close() removes it
            self.ip("addr", "add", self.subnet + ".1/24", "dev", self.bridge)
            self.ip("link", "set", self.bridge, "up")
            return
        raise RuntimeError(
            "no free subnet 10.213.N.0/24 for N in %d..%d (ip -o addr: all in use)"
            % (self.SUBNETS[0], self.SUBNETS[-1])
        )

    def ifname(self, i: int) -> str:
        """Namespace i's end of its veth pair (inside the namespace)."""
        return "%sv%s%dp" % (self.name_prefix, self.tag, i)

    def bridge_end(self, i: int) -> str:
        """The other end of namespace i's veth pair, on the bridge (outside)."""
        return "%sv%s%d" % (self.name_prefix, self.tag, i)

    def addr(self, i: int) -> str:
        return "%s.%d" % (self.subnet, 10 + i)

    def prefix(self, i: int) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.spaces[i])

    @staticmethod
    def ip(*args: str, check_rc: bool = True) -> str:
        p = subprocess.run(["ip", *args], capture_output=True, text=True)
        if check_rc and p.returncode != 0:
            raise RuntimeError("ip %s: %s" % (" ".join(args), p.stderr.strip()))
        return p.stdout

    def close(self) -> None:
        """Removes the namespaces (their veth pairs with them) and the bridge it made."""
        for ns in self.made:
            self.ip("netns", "del", ns, check_rc=False)
        self.made = []
        if self.bridge:
            self.ip("link", "del", self.bridge, check_rc=False)
            self.bridge = ""
