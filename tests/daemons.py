"""Store daemons for integration tests and benchmarks: start `tenplex store serve` on a
free loopback port, read the URL it announces, stop it; and the tests' CLI runner."""

import fcntl
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request


def check(cond, msg):
    if not cond:
        print("FAIL:", msg)
        sys.exit(1)


def run_cli(tenplex, *args, expect_ok=True):
    """Runs `tenplex ARGS`; expect_ok=False requires a failure with a clear error."""
    p = subprocess.run([tenplex, *args], capture_output=True, text=True, timeout=300)
    if expect_ok:
        check(p.returncode == 0, "%s failed: %s%s" % (" ".join(args), p.stdout, p.stderr))
    else:
        check(p.returncode != 0, "%s should have failed: %s" % (" ".join(args), p.stdout))
        check("error" in p.stderr and "Traceback" not in p.stderr, "unclear error: %r" % p.stderr)
    return p


class Daemon:
    def __init__(self, tenplex, env=None, stderr=subprocess.DEVNULL, listen="127.0.0.1:0", prefix=(), args=()):
        """prefix: a command the daemon runs under (e.g. ip netns exec NS); args: more
        arguments of `store serve` (e.g. --shm-dir DIR, kept across a restart)."""
        self.proc = subprocess.Popen(
            [*prefix, tenplex, "store", "serve", "--listen", listen, *args],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=dict(os.environ, **(env or {})),
        )
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

    def call(self, method, path, body=None, timeout=600):
        headers = {"Content-Type": "application/json"}
        if os.environ.get("TENPLEX_TOKEN"):
            headers["Authorization"] = "Bearer " + os.environ["TENPLEX_TOKEN"]
        req = urllib.request.Request(
            self.url + path, method=method, data=None if body is None else json.dumps(body).encode(), headers=headers
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read() or b"null")

    def get(self, path):
        return self.call("GET", path, timeout=20)

    def metric(self, name):
        """The value of an unlabelled metric of GET /metrics (an int)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=20) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return int(float(line.split()[1]))
        raise SystemExit("FAIL: no metric %s at %s" % (name, self.url))

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(20)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


def write_cluster(path, daemons, gpus_per_host):
    with open(path, "w") as f:
        json.dump({"hosts": [d.url for d in daemons], "gpus_per_host": gpus_per_host}, f)


class NetnsBridge:
    """`count` network namespaces joined by veth pairs on a bridge (as root): namespace
    i has address `addr(i)` on its veth `ifname(i)` and its loopback up. SystemExit(77)
    (ctest: skipped) where they cannot be made; `close()` removes everything.

    Tests that run at once get different subnets and names: under a lock file
    (LOCK_FILE), the first free subnet 10.213.N.0/24 (N in SUBNETS) is taken, one that
    no interface has an address in and none of whose names (`name_prefix` + "br" / "ns" /
    "v" + N as three digits) is an existing link or namespace; its bridge with its
    address is made before the lock is released, so that the next test sees it in use.
    `name_prefix` (default "tp", at most 4 characters: link names have at most 15) tells
    a test's links apart from another's in `ip link`."""

    LOCK_FILE = os.path.join("/run" if os.path.isdir("/run") else tempfile.gettempdir(), "tenplex-netns.lock")
    SUBNETS = range(20, 220)

    def __init__(self, count, name_prefix="tp"):
        if os.geteuid() != 0 or shutil.which("ip") is None:
            print("SKIP: needs root and iproute2 for network namespaces")
            sys.exit(77)
        if not re.fullmatch(r"[a-z][a-z0-9]{0,3}", name_prefix) or not 1 <= count <= 99:
            raise ValueError(
                "NetnsBridge: name_prefix %r (1-4 of a-z0-9, a letter first) or count %d (1-99)" % (name_prefix, count)
            )
        self.name_prefix, self.count = name_prefix, count
        self.tag, self.bridge, self.spaces, self.subnet, self.made = "", "", [], "", []
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
            print("SKIP: network namespaces are not available here (%s)" % e)
            sys.exit(77)

    def _claim(self):
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

    def ifname(self, i):
        """Namespace i's end of its veth pair (inside the namespace)."""
        return "%sv%s%dp" % (self.name_prefix, self.tag, i)

    def bridge_end(self, i):
        """The other end of namespace i's veth pair, on the bridge (outside)."""
        return "%sv%s%d" % (self.name_prefix, self.tag, i)

    def addr(self, i):
        return "%s.%d" % (self.subnet, 10 + i)

    def prefix(self, i):
        return ("ip", "netns", "exec", self.spaces[i])

    @staticmethod
    def ip(*args, check_rc=True):
        p = subprocess.run(["ip", *args], capture_output=True, text=True)
        if check_rc and p.returncode != 0:
            raise RuntimeError("ip %s: %s" % (" ".join(args), p.stderr.strip()))
        return p.stdout

    def close(self):
        """Removes the namespaces (their veth pairs with them) and the bridge it made."""
        for ns in self.made:
            self.ip("netns", "del", ns, check_rc=False)
        self.made = []
        if self.bridge:
            self.ip("link", "del", self.bridge, check_rc=False)
            self.bridge = ""
