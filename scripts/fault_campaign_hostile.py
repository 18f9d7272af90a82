#!/usr/bin/env python3
"""Fault campaign, part 3: hostile peers (issue 35 item 5, docs/reliability.md).

    .venv/bin/python scripts/fault_campaign_hostile.py build/bin/tenplex [--trials 40]
        [--seed 1] [--kinds K,K] [--markdown FILE] [--json FILE] [--verbose]

The setup of scripts/fault_campaign.py (4 daemons with a persistent --shm-dir on
loopback holding the synthetic job j), with a daemon token (TENPLEX_TOKEN) and each
daemon's stderr kept. Each trial picks a victim daemon and one kind:

  - ucx flood: 3-6 hostile data-plane clients (build/bin/tenplex_hostile_client: greedy
    flow control, a valid probe capability) read overlapping short (4 KiB) and long
    (200 KiB) runs of the probe region, in-window requests (16 MiB) from many threads or
    one batch of 64, or 16,384 runs of 200 KiB per request (the shape that aborted the
    daemon in issue 35); at a random moment each is SIGKILLed, SIGSTOPped then killed,
    SIGSTOPped then continued, or left to finish. A finished client must have seen only
    OK and RESOURCE_EXHAUSTED (INVALID_ARGUMENT for the 3.2 GiB requests) and no wrong
    byte.
  - probe flood: clients without a capability or with a forged one (only
    PERMISSION_DENIED allowed) and clients asking N x 64 MiB per request (only
    INVALID_ARGUMENT); tenplex_fetch_bounded_total must count the oversize refusals.
  - connection flood: idle and partial HTTP connections that reconnect when dropped,
    60-90 from 127.0.0.1 (--own-address: at most 90; 30 partial) and 100-200 from as
    many 127.0.x.y addresses
    (tests/store_hardening_test.py's Hostile); tenplex_http_connections_refused_total
    must grow.
  - replay closed, replay recreated, replay scope: a captured (minted) capability
    replayed after its transform ended, after the job was created again, or for another
    job, window or host (scripts/fault_campaign_replay.py); each refused and counted.
  - special files: the victim is stopped (SIGTERM), a job whose CURRENT or whose
    version's MANIFEST.json is a FIFO and a job directory that is a symbolic link to j
    are planted in its --shm-dir, and it is restarted: it must serve within 30 s with
    the planted jobs quarantined, and a SIGTERM must end it within 5 s.

During every trial a monitor thread makes an authenticated GET /v1/health on the victim
every 50 ms (each must succeed within LATENCY_BOUND) and samples its RssAnon (anonymous
memory: the store's tensors are shared memory, counted by --memory-limit); in half of
the flood trials a `tenplex transform` of j runs during the flood, else after it, and
the state is then checked as in fault_campaign.py (`transform --recover`, `store save
--cluster`, `ckpt verify`). Outcomes: those of fault_campaign.py (crash: a daemon died,
its stderr's last lines given), plus locked out (an authenticated call failed or was
slower than LATENCY_BOUND), rss (RssAnon grew by more than RSS_BOUND over the trial's
start), refusal wrong (a hostile client saw a status it must not, or the refusals are
not counted in /metrics).
"""

import argparse
import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
import types
import urllib.request

import fault_campaign as fc
import fault_campaign_common as common
from fault_campaign_replay import REPLAY_KINDS, ReplayKinds, refused

from tenplex.testing import Daemon


def _hardening_test() -> types.ModuleType:
    """tests/store_hardening_test.py (its connection flood, Hostile), loaded by path: the
    campaign does not put tests/ on sys.path."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "store_hardening_test.py")
    spec = importlib.util.spec_from_file_location("store_hardening_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


Hostile = _hardening_test().Hostile

OUTCOMES = common.OUTCOMES + ["locked out", "rss", "refusal wrong"]
KINDS = ["ucx flood", "probe flood", "connection flood", "special files"] + REPLAY_KINDS
LATENCY_BOUND = 2.0  # seconds an authenticated call may take during a flood (2-core CI machine)
# RssAnon growth allowed over a trial: the server's staging bound (max_staged_bytes,
# 256 MiB) + its pool of free staging buffers (64 MiB) + 192 MiB for UCX's own buffers,
# threads and the HTTP server.
RSS_BOUND = 512 << 20
TERM_DEADLINE = 5.0  # seconds a SIGTERM may take to end a daemon


def proc_status(pid):
    """{field: bytes} of /proc/PID/status's memory lines (VmRSS, VmHWM, RssAnon, ...)."""
    out = {}
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                k, _, v = line.partition(":")
                if v.strip().endswith("kB"):
                    out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


class Monitor(threading.Thread):
    """Authenticated calls on a daemon (latency, failures) and its RssAnon, until stopped."""

    def __init__(self, daemon):
        super().__init__(daemon=True)
        self.d, self.stop_event = daemon, threading.Event()
        self.calls, self.failures, self.worst, self.rss_peak = 0, [], 0.0, 0

    def run(self):
        while not self.stop_event.is_set():
            self.rss_peak = max(self.rss_peak, proc_status(self.d.proc.pid).get("RssAnon", 0))
            t0 = time.time()
            try:
                self.d.call("GET", "/v1/health", timeout=10)
                self.calls += 1
            except OSError as e:
                self.failures.append(str(e)[:200])
            self.worst = max(self.worst, time.time() - t0)
            self.stop_event.wait(0.05)

    def stop(self):
        self.stop_event.set()
        self.join(30)


class HostileCampaign(ReplayKinds, fc.Campaign):
    def __init__(self, tenplex, tmp, seed, verbose, kinds, client, own_address=90):
        os.environ.setdefault("TENPLEX_TOKEN", secrets.token_hex(16))
        self.errs = [os.path.join(tmp, "daemon-%d.err" % i) for i in range(4)]
        super().__init__(tenplex, tmp, seed, verbose)
        self.kinds, self.client, self.planted = kinds, client, 0
        self.own_address = own_address  # most hostile connections from the monitor's own address
        self.results = []

    def start(self, i, attempts=50, args=()):
        """fault_campaign.py's start, with the daemon's stderr appended to self.errs[i]."""
        for _ in range(attempts):
            with open(self.errs[i], "a") as err:
                try:
                    return Daemon(
                        self.tenplex,
                        listen="%s:%d" % (self.LISTEN, self.ports[i]),
                        stderr=err,
                        args=("--shm-dir", self.shm[i], *args),
                    )
                except SystemExit:
                    time.sleep(0.2)
        raise SystemExit("FAIL: daemon %d does not restart" % i)

    def stderr_tail(self, i):
        with open(self.errs[i], errors="replace") as f:
            lines = f.read().splitlines()
        bad = [x for x in lines if any(w in x for w in ("ssert", "ucp_", "abort", "terminate", "Segmentation"))]
        return (bad or lines)[-6:]

    def metrics(self, i):
        """{name: value} of daemon i's unlabelled counters of interest."""
        names = (
            "tenplex_fetch_bounded_total",
            "tenplex_http_connections_refused_total",
            "tenplex_fetch_staged_bytes_peak",
        )
        out = {}
        req = urllib.request.Request(
            self.daemons[i].url + "/metrics", headers={"Authorization": "Bearer " + os.environ["TENPLEX_TOKEN"]}
        )
        with urllib.request.urlopen(req, timeout=20) as r:
            text = r.read().decode()
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] in names:
                out[parts[0]] = int(float(parts[1]))
        return out

    def address(self, i):
        return self.daemons[i].get("/v1/transform/address")["address"]

    # ---- one trial ---------------------------------------------------------------------

    def trial(self, n):
        rng = self.rng
        kind = rng.choice(self.kinds)
        victim = rng.randrange(4)
        t0 = time.time()
        old = self.state
        target = rng.choice([c for c in common.CONFIGS if common.canon(c) != common.canon(old)])
        during = kind != "special files" and rng.random() < 0.5
        m0 = self.metrics(victim)
        mon = Monitor(self.daemons[victim])
        base = proc_status(self.daemons[victim].proc.pid).get("RssAnon", 0)
        if kind != "special files":  # that kind restarts the victim: no calls, no RSS to compare
            mon.start()
        op = None
        if during:
            op = subprocess.Popen(
                self.op_command("transform", target),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        result = {"victim": victim, "op": "transform", "phase": "during" if during else "after"}
        body = {
            "ucx flood": self.ucx_flood,
            "probe flood": self.probe_flood,
            "connection flood": self.connection_flood,
            "special files": self.special_files,
            "replay closed": self.replay_closed,
            "replay recreated": self.replay_recreated,
            "replay scope": self.replay_scope,
        }[kind]
        detail = body(victim, result)
        if mon.is_alive():
            mon.stop()
        status = proc_status(self.daemons[victim].proc.pid)
        growth = mon.rss_peak - base if kind != "special files" else 0
        result.update(
            trial=n,
            kind=kind,
            calls=mon.calls,
            worst_ms=round(mon.worst * 1000),
            rss_base_mib=round(base / 2**20),
            rss_growth_mib=round(growth / 2**20),
            vmhwm_mib=round(status.get("VmHWM", 0) / 2**20),
        )
        if op is not None:
            out, err, hang = common.finish(op, common.OP_DEADLINE)
            rc = op.returncode
        else:
            hang = False
            try:
                p = subprocess.run(
                    self.op_command("transform", target), capture_output=True, text=True, timeout=common.OP_DEADLINE
                )
                out, rc = p.stdout, p.returncode
            except subprocess.TimeoutExpired:
                hang, out, rc = True, "", -9
        dead = [i for i, d in enumerate(self.daemons) if d.proc.poll() is not None]
        if dead:
            result.update(
                outcome="crash", detail={i: [self.daemons[i].proc.returncode, self.stderr_tail(i)] for i in dead}
            )
            for i in dead:
                self.daemons[i] = self.start(i)
        elif hang:
            result["outcome"] = "hang"
        elif detail:
            result.update(outcome=detail[0], detail=detail[1])
        elif mon.failures or mon.worst > LATENCY_BOUND:
            result.update(
                outcome="locked out",
                detail="%d failed, worst %.2f s: %s" % (len(mon.failures), mon.worst, mon.failures[:2]),
            )
        elif growth > RSS_BOUND:
            result.update(outcome="rss", detail="RssAnon grew by %d MiB" % (growth >> 20))
        if "outcome" not in result:
            if kind != "special files":  # (the restarted daemon's counters start at 0)
                m1 = self.metrics(victim)
                result["metrics"] = {k: m1.get(k, 0) - m0.get(k, 0) for k in m1}
            res = self.check("transform", old, target, rc, out)
            self.state = res.get("state") or self.state
            result.update(res)
        else:
            res = self.settle(old, [target])
            self.state = next((t for t in (old, target) if common.canon(t) == common.canon(res.get("saved", old))), old)
        result["seconds"] = round(time.time() - t0, 2)
        if self.verbose or result["outcome"] not in common.GOOD:
            print(json.dumps(result), flush=True)
        self.results.append(result)
        return result

    def stop(self):
        """Prints, by kind, the victims' RssAnon growth and the authenticated calls'
        worst latency; then stops the daemons."""
        for k in self.kinds:
            rs = [r for r in self.results if r["kind"] == k]
            if rs:
                print(
                    "%s: %d trials, RssAnon growth max %d MiB (base %d-%d MiB), VmHWM max %d MiB, "
                    "%d authenticated calls, worst %d ms"
                    % (
                        k,
                        len(rs),
                        max(r["rss_growth_mib"] for r in rs),
                        min(r["rss_base_mib"] for r in rs),
                        max(r["rss_base_mib"] for r in rs),
                        max(r["vmhwm_mib"] for r in rs),
                        sum(r["calls"] for r in rs),
                        max(r["worst_ms"] for r in rs),
                    ),
                    flush=True,
                )
        # Every daemon must end by its SIGTERM, cleanly (before issue 35's bounds, UCX
        # aborted some at shutdown after a flood): else the last trial counts a crash.
        for i, d in enumerate(self.daemons):
            if d.proc.poll() is None:
                os.kill(d.proc.pid, signal.SIGCONT)
                d.proc.terminate()
                try:
                    d.proc.wait(TERM_DEADLINE)
                except subprocess.TimeoutExpired:
                    pass
            rc = d.proc.poll()
            if rc != 0 and self.results:
                self.results[-1].update(
                    outcome="crash", detail="daemon %d at shutdown: exit %r, %s" % (i, rc, self.stderr_tail(i))
                )
                print(json.dumps(self.results[-1]), flush=True)
        super().stop()

    # ---- hostile data-plane clients ----------------------------------------------------

    def spawn_client(self, address, args, name):
        out = open(os.path.join(self.tmp, name + ".out"), "w+")
        cmd = [self.client, "--address", address, *[str(a) for a in args]]
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True), out

    @staticmethod
    def final(p, out):
        """The client's last JSON line when it ended by itself, else None."""
        out.seek(0)
        lines = [x for x in out.read().splitlines() if x.startswith("{")]
        out.close()
        if p.returncode != 0 or not lines:
            return None
        last = json.loads(lines[-1])
        return last if last.get("final") else None

    def run_clients(self, specs, fates, allowed, result):
        """Starts the clients (args lists), applies each fate (run, kill, stop+kill,
        stop+cont) at a random moment, waits for all; a client that ended by itself must
        have seen only the statuses its set in `allowed` names and no wrong byte. None, or
        ("refusal wrong", why); the statuses seen are added up in result["codes"]."""
        rng = self.rng
        address = self.address(result["victim"])
        procs = [self.spawn_client(address, s, "client%d" % k) for k, s in enumerate(specs)]
        hit_at = rng.uniform(0.5, 3.0)
        time.sleep(hit_at)
        for (p, _), fate in zip(procs, fates):
            if fate in ("kill",):
                os.killpg(p.pid, signal.SIGKILL)
            elif fate.startswith("stop"):
                os.killpg(p.pid, signal.SIGSTOP)
        time.sleep(rng.uniform(1.0, 3.0))
        for (p, _), fate in zip(procs, fates):
            if fate == "stop+kill":
                os.killpg(p.pid, signal.SIGKILL)
            elif fate == "stop+cont":
                os.killpg(p.pid, signal.SIGCONT)
        result.update(clients=len(specs), fates=fates, codes={})
        problem = None
        for (p, out), s, ok in zip(procs, specs, allowed):
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            fin = self.final(p, out)
            if fin is None:
                continue
            for c, v in fin["codes"].items():
                result["codes"][c] = result["codes"].get(c, 0) + v
            if (set(fin["codes"]) - ok or fin["wrong_bytes"]) and problem is None:
                problem = "refusal wrong", "client %s expected only %s, saw %s" % (s, sorted(ok), fin)
        return problem

    def ucx_flood(self, victim, result):
        rng = self.rng
        specs, allowed = [], []
        for _ in range(rng.randint(3, 6)):
            shape = rng.choice([(4096, 4096), (80, 200 << 10), (16384, 200 << 10)])
            mode = rng.choice(["flood", "flood", "batch"])
            threads = 64 if mode == "batch" else rng.choice([4, 8, 16])
            specs.append(
                [
                    "--mode",
                    mode,
                    "--threads",
                    threads,
                    "--runs",
                    shape[0],
                    "--run-bytes",
                    shape[1],
                    "--seconds",
                    rng.uniform(3, 6),
                    "--seed",
                    rng.randrange(10**6),
                ]
            )
            # 16,384 overlapping 200 KiB runs in one request (3.2 GiB: the finding's shape) are
            # over the request bound; the others are in bound, refused only beyond the window.
            allowed.append({"INVALID_ARGUMENT"} if shape[0] == 16384 else {"OK", "RESOURCE_EXHAUSTED"})
        fates = [rng.choice(["run", "kill", "stop+kill", "stop+cont"]) for _ in specs]
        return self.run_clients(specs, fates, allowed, result)

    def probe_flood(self, victim, result):
        rng = self.rng
        specs, allowed = [], []
        for _ in range(rng.randint(3, 6)):
            cap = rng.choice(["none", "forged", "probe"])
            if cap == "probe" or rng.random() < 0.3:  # the size bound is checked before the capability
                specs.append(
                    [
                        "--mode",
                        "oversize",
                        "--capability",
                        cap,
                        "--runs",
                        rng.choice([2, 1024, 16384]),
                        "--threads",
                        2,
                        "--seconds",
                        rng.uniform(2, 4),
                    ]
                )
                allowed.append({"INVALID_ARGUMENT"})
            else:
                specs.append(
                    [
                        "--mode",
                        "flood",
                        "--capability",
                        cap,
                        "--threads",
                        rng.choice([4, 16]),
                        "--seconds",
                        rng.uniform(2, 4),
                    ]
                )
                allowed.append({"PERMISSION_DENIED"})
        fates = [rng.choice(["run", "run", "kill", "stop+kill"]) for _ in specs]
        m0, r0 = self.metrics(victim), refused(self.daemons[victim])
        problem = self.run_clients(specs, fates, allowed, result)
        if problem:
            return problem
        oversize = result["codes"].get("INVALID_ARGUMENT", 0)
        bounded = self.metrics(victim)["tenplex_fetch_bounded_total"] - m0["tenplex_fetch_bounded_total"]
        if bounded < oversize:
            return "refusal wrong", "%d oversize requests refused, /metrics counted %d" % (oversize, bounded)
        # Probe reads refused for their capability count in tenplex_fetch_refused_total too.
        denied = result["codes"].get("PERMISSION_DENIED", 0)
        counted = sum(refused(self.daemons[victim]).values()) - sum(r0.values())
        result["refused"] = {"denied": denied, "counted": counted}
        if counted < denied:
            return "refusal wrong", "%d probe reads refused, tenplex_fetch_refused_total grew by %d" % (denied, counted)
        return None

    # ---- HTTP connection floods --------------------------------------------------------

    def connection_flood(self, victim, result):
        rng = self.rng
        port = self.ports[victim]
        m0 = self.metrics(victim)
        base = rng.randrange(2, 200)
        many = rng.randint(100, 200)
        floods = [
            Hostile(port, rng.randint(30, self.own_address - 30), ["127.0.0.1"], False),
            Hostile(port, 30, ["127.0.0.1"], True),
            Hostile(port, many, ["127.0.%d.%d" % (base, i) for i in range(1, many + 1)], rng.random() < 0.5),
        ]
        for f in floods:
            f.start()
        time.sleep(rng.uniform(3, 6))
        for f in floods:
            f.stop.set()
        for f in floods:
            f.join(15)
        refused = (
            self.metrics(victim)["tenplex_http_connections_refused_total"]
            - m0["tenplex_http_connections_refused_total"]
        )
        result["hostile_connections"] = sum(f.opened for f in floods)
        if refused <= 0:
            return "refusal wrong", "no hostile connection closed (tenplex_http_connections_refused_total)"
        return None

    # ---- special files in the store directory ------------------------------------------

    def special_files(self, victim, result):
        rng = self.rng
        d = self.daemons[victim]
        d.stop()
        jobs = os.path.join(self.shm[victim], "jobs")
        self.planted += 1
        names = []
        fifo_job = "fifo%d" % self.planted
        os.makedirs(os.path.join(jobs, fifo_job, "1"))
        if rng.random() < 0.5:
            os.mkfifo(os.path.join(jobs, fifo_job, "CURRENT"))
            result["planted"] = ["CURRENT fifo"]
        else:
            with open(os.path.join(jobs, fifo_job, "CURRENT"), "w") as f:
                f.write("1\n")
            os.mkfifo(os.path.join(jobs, fifo_job, "1", "MANIFEST.json"))
            result["planted"] = ["MANIFEST.json fifo"]
        names.append(fifo_job)
        if rng.random() < 0.7:
            link = "link%d" % self.planted
            os.symlink(os.path.join(jobs, "j"), os.path.join(jobs, link))
            names.append(link)
            result["planted"].append("job dir symlink")
        t0 = time.time()
        try:
            self.daemons[victim] = d = self.start(victim, attempts=1)  # announces within 30 s or fails
        except SystemExit:
            self.daemons[victim] = self.start(victim)  # (the test fails; later trials go on)
            return "hang", "the daemon did not serve within 30 s of its start: %s" % self.stderr_tail(victim)
        result["start_s"] = round(time.time() - t0, 2)
        t0 = time.time()
        d.proc.terminate()
        try:
            d.proc.wait(TERM_DEADLINE)
        except subprocess.TimeoutExpired:
            d.kill()
            return "hang", "SIGTERM did not end the daemon within %.0f s" % TERM_DEADLINE
        result["term_s"] = round(time.time() - t0, 2)
        self.daemons[victim] = self.start(victim)
        served = [x for x in names if os.path.lexists(os.path.join(jobs, x))]
        quarantine = os.path.join(self.shm[victim], "quarantine")
        for x in os.listdir(quarantine) if os.path.isdir(quarantine) else []:
            if x.split(".")[0] in names:
                p = os.path.join(quarantine, x)
                if os.path.isdir(p) and not os.path.islink(p):
                    shutil.rmtree(p)
                else:
                    os.unlink(p)
        if served:
            return "refusal wrong", "planted %r still in the jobs directory" % served
        return None


def main():
    ap = argparse.ArgumentParser()
    common.base_args(ap)
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated fault kinds to draw from")
    ap.add_argument("--client", help="the hostile client (default: tenplex_hostile_client next to tenplex)")
    ap.add_argument(
        "--own-address",
        type=int,
        default=90,
        help="at most this many hostile connections from 127.0.0.1 (30 partial, the rest idle; >= 60)",
    )
    a = ap.parse_args()
    kinds = a.kinds.split(",")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        ap.error("unknown kinds %s; known: %s" % (unknown, ", ".join(KINDS)))
    client = a.client or os.path.join(os.path.dirname(os.path.abspath(a.tenplex)), "tenplex_hostile_client")
    if not os.access(client, os.X_OK):
        ap.error("no hostile client at %s (build tenplex_hostile_client)" % client)
    socket.setdefaulttimeout(60)
    if a.own_address < 60:
        ap.error("--own-address must be at least 60")
    common.run_campaign(
        lambda tmp: HostileCampaign(a.tenplex, tmp, a.seed, a.verbose, kinds, client, a.own_address), a, OUTCOMES
    )


if __name__ == "__main__":
    main()
