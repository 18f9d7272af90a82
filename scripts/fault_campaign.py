#!/usr/bin/env python3
"""Randomized fault-injection campaign (issue 19 §3, docs/reliability.md).

    .venv/bin/python scripts/fault_campaign.py build/bin/tenplex [--trials 100]
        [--seed 1] [--markdown FILE] [--verbose]

4 store daemons on loopback (2 GPUs each, persistent --shm-dir on fixed ports, so a
killed daemon restarts with its state at the same URL) hold a job. Each trial runs one
operation in the background, `tenplex transform` to another config or `tenplex store
load --cluster` of a checkpoint of another config, and at a random moment (uniform
over the operation's typical duration, sometimes after it) sends SIGKILL or SIGSTOP
to a random daemon. A stopped daemon stays stopped until the operation ends (or, in
half the trials, is continued after a random pause); a killed one is restarted on
its --shm-dir after the operation ends. Then:

  1. the operation must have ended within its deadline (else: hang);
  2. after the next operation (`transform --recover`) every daemon of the state's
     placement must be at the same current version and no daemon may hold an open or
     prepared version of the job (else: split / orphans);
  3. `store save --cluster` and `ckpt verify` (element by element, the synthetic
     oracle) must give exactly the old or the new state (else: data lost / mixed);
  4. no daemon may have died on its own (else: crash).

More fault kinds, each drawn in about 1 of 7 trials:

  - coordinator: the `tenplex transform` / `store load --cluster` process itself is
    SIGKILLed at a random moment (its half-done work is what --recover and every later
    operation finish); checked as above.
  - memory limit: one daemon is restarted with `--memory-limit` at its current use
    plus a random 0-1.5x of its share of the new state, then the operation runs; it
    must succeed or abort cleanly (the daemon is restarted without a limit after).
  - run: `tenplex run --cluster --commit-every 1` trains a small GPT (examples/gpt,
    torch on CPU, 2 workers, tp=2 then dp=2 after step 3, 6 steps) with its state in
    the daemons (job rN), and a random daemon is SIGKILLed or SIGSTOPped at a random
    moment of it. The run must end within its deadline; afterwards (`--recover`) its
    job must hold no open or prepared version, every holder of the newest version must
    be at it, and that version must save (`store save --cluster`) to a checkpoint that
    `reshard` reads (layout and checksums: the content is training state, which
    tests/elastic_run_test.py compares step by step). Only with --run-trials (each
    takes 20-60 s on a loaded 2-core machine; the CI run leaves them out).
  - ENOSPC: `tenplex reshard --out` or `store save --cluster --out` into a fresh tmpfs
    of a random 10-130% of the checkpoint's size (the campaign re-runs itself in a
    private mount namespace for this; without root the kind is left out): it must
    succeed with a checkpoint that `ckpt verify` accepts, or fail by itself (no
    signal) saying the disk is full and leave the tmpfs empty.

Outcomes: completed (the operation succeeded), recovered (it succeeded after a
re-plan or with an unconfirmed host, or failed but the new state was rolled forward),
clean abort (it failed and the old state is intact), and the failures above. Prints a
table by fault kind and phase and exits 1 if any trial failed.
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

from fault_campaign_common import (
    CONFIGS,
    GOOD,
    OP_DEADLINE,
    TRANSFORM_FLAGS,
    base_args,
    canon,
    dir_bytes,
    finish,
    holders_of,
    run_campaign,
    signal_record,
)
from fault_campaign_trials import RunAndDiskTrials

from tenplex.testing import Daemon, free_port


class Campaign(RunAndDiskTrials):
    LISTEN = "127.0.0.1"  # the daemons' --listen host (fault_campaign_jobs.py: 0.0.0.0, with a token)

    def __init__(self, tenplex, tmp, seed, verbose, can_mount=False, run_trials=False):
        self.tenplex, self.tmp, self.rng, self.verbose = tenplex, tmp, random.Random(seed), verbose
        self.ports = [free_port() for _ in range(4)]
        self.shm = ["/dev/shm/tenplex-campaign-%d-%d" % (os.getpid(), i) for i in range(4)]
        self.daemons = [self.start(i) for i in range(4)]
        self.cluster = os.path.join(tmp, "cluster.json")
        with open(self.cluster, "w") as f:
            json.dump({"hosts": [d.url for d in self.daemons], "gpus_per_host": 2}, f)
        model = os.path.join(tmp, "m.json")
        self.run_model = os.path.join(tmp, "run-model.json")
        self.cli(
            "model",
            "gpt",
            "--num-layers",
            "2",
            "--hidden-size",
            "32",
            "--num-attention-heads",
            "4",
            "--vocab-size",
            "128",
            "--max-position-embeddings",
            "32",
            "-o",
            self.run_model,
            check=True,
        )
        self.cli(
            "model",
            "gpt",
            "--num-layers",
            "8",
            "--hidden-size",
            "64",
            "--num-attention-heads",
            "4",
            "--num-query-groups",
            "4",
            "--ffn-hidden-size",
            "96",
            "--vocab-size",
            "301",
            "--make-vocab-size-divisible-by",
            "8",
            "--max-position-embeddings",
            "16",
            "--swiglu",
            "-o",
            model,
            check=True,
        )
        self.ckpts = {}
        for c in CONFIGS:
            d = os.path.join(tmp, "ckpt-" + c.replace(",", "_").replace("=", ""))
            self.cli("ckpt", "init", "--model", model, "--config", c, "--out", d, "--seed", "5", check=True)
            self.ckpts[c] = d
        self.state = CONFIGS[0]
        self.cli("store", "load", "--cluster", self.cluster, "--job", "j", "--dir", self.ckpts[self.state], check=True)
        self.durations = {"transform": [], "load": []}
        self.limited = None  # the daemon restarted with --memory-limit, if any
        self.can_mount = can_mount
        self.run_trials = run_trials
        self.model = self.run_model
        self.run_durations = []
        self.host_ids = {}

    def used_bytes(self, i):
        """tenplex_store_used_bytes of daemon i (GET /metrics)."""
        req = urllib.request.Request(self.daemons[i].url + "/metrics")
        with urllib.request.urlopen(req, timeout=20) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("tenplex_store_used_bytes "):
                    return int(float(line.split()[1]))
        raise SystemExit("FAIL: no tenplex_store_used_bytes in /metrics")

    def restart(self, i, args=()):
        self.daemons[i].stop()
        self.daemons[i] = self.start(i, args=args)

    def start(self, i, attempts=50, args=()):
        for _ in range(attempts):  # the port may still be held a moment after a SIGKILL
            try:
                d = Daemon(
                    self.tenplex, listen="%s:%d" % (self.LISTEN, self.ports[i]), args=("--shm-dir", self.shm[i], *args)
                )
                d.url = d.url.replace("//0.0.0.0:", "//127.0.0.1:")  # every address: reached by loopback
                return d
            except SystemExit:
                time.sleep(0.2)
        raise SystemExit("FAIL: daemon %d does not restart" % i)

    def cli(self, *args, check=False, timeout=300):
        p = subprocess.run([self.tenplex, *args], capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise SystemExit("FAIL: %s: %s%s" % (" ".join(args), p.stdout, p.stderr))
        return p

    def op_command(self, op, target):
        if op == "transform":
            return [
                self.tenplex,
                "transform",
                "--cluster",
                self.cluster,
                "--job",
                "j",
                "--to",
                target,
                "--json",
                "--quiet",
                *TRANSFORM_FLAGS,
            ]
        return [self.tenplex, "store", "load", "--cluster", self.cluster, "--job", "j", "--dir", self.ckpts[target]]

    def typical(self, op):
        d = self.durations[op]
        return sorted(d)[len(d) // 2] if d else 1.0

    def trial(self, n):
        rng = self.rng
        op = rng.choice(["transform", "load"])
        target = rng.choice([c for c in CONFIGS if canon(c) != canon(self.state)])
        kinds = ["SIGKILL", "SIGSTOP", "SIGKILL", "SIGSTOP", "coordinator", "memory limit"]
        kind = rng.choice(kinds + (["ENOSPC"] if self.can_mount else []) + (["run"] if self.run_trials else []))
        if kind == "ENOSPC":
            return self.enospc_trial(n, rng.choice(["reshard", "save"]), target)
        if kind == "run":
            return self.run_trial(n)
        victim = rng.randrange(4)
        delay = rng.uniform(0, 1.2 * self.typical(op))
        long_stop = rng.random() < 0.5
        old = self.state
        if kind == "memory limit":
            # Its share of the new state is about a quarter of the target checkpoint.
            share = dir_bytes(self.ckpts[target]) // 4
            limit = self.used_bytes(victim) + int(rng.uniform(0, 1.5) * share)
            self.restart(victim, args=("--memory-limit", str(limit)))
            self.limited = victim
        t0 = time.time()
        proc = subprocess.Popen(
            self.op_command(op, target),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        if kind == "memory limit":
            delay = 0
        while time.time() - t0 < delay and proc.poll() is None:
            time.sleep(0.01)
        phase = "during" if proc.poll() is None else "after"
        if kind == "memory limit":
            phase = "limit"
        if kind == "coordinator":
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        elif kind in ("SIGKILL", "SIGSTOP"):
            self.hit(victim, kind, long_stop)
        out, err, hang = finish(proc, OP_DEADLINE)
        seconds = time.time() - t0
        if phase == "during" and not hang:
            pass
        elif phase == "after":
            self.durations[op].append(seconds)
        # Bring the victim back: continue it, or restart it on its --shm-dir.
        crashed = self.revive(victim, kind)
        if kind == "memory limit" and victim not in crashed:
            self.restart(victim)  # without the limit again
            self.limited = None
        if kind == "coordinator":
            victim = "coordinator"
        result = signal_record(n, op, old, target, kind, victim, phase, delay, seconds, proc.returncode, long_stop)
        if hang:
            result["outcome"] = "hang"
        elif crashed:
            result["outcome"] = "crash"
            result["detail"] = "daemons %r died" % crashed
        else:
            result.update(self.check(op, old, target, proc.returncode, out))
        if proc.returncode != 0:
            result["error"] = err.strip().splitlines()[-1][-300:] if err.strip() else ""
        if result.get("state"):
            self.state = result["state"]
        if self.verbose or result["outcome"] in ("hang", "crash", "data lost", "split", "orphans"):
            print(json.dumps(result), flush=True)
            if result["outcome"] not in GOOD:
                print("   op stderr: %s" % err.strip()[-600:], flush=True)
        return result

    def hit(self, victim, kind, long_stop):
        """SIGKILL or SIGSTOP daemon `victim`; a short stop is continued after 0.5-5 s."""
        d = self.daemons[victim]
        os.kill(d.proc.pid, signal.SIGKILL if kind == "SIGKILL" else signal.SIGSTOP)
        if kind == "SIGSTOP" and not long_stop:
            time.sleep(self.rng.uniform(0.5, 5))
            os.kill(d.proc.pid, signal.SIGCONT)

    def revive(self, victim, kind):
        """Continues or restarts the victim (on its --shm-dir) and restarts any other daemon
        that died by itself; returns those (crashes)."""
        killed = victim if kind == "SIGKILL" else -1
        crashed = [i for i, x in enumerate(self.daemons) if i != killed and x.proc.poll() is not None]
        if kind == "SIGSTOP":
            os.kill(self.daemons[victim].proc.pid, signal.SIGCONT)
        elif kind == "SIGKILL":
            self.daemons[victim].proc.wait(20)
            self.daemons[victim] = self.start(victim)
        for i in crashed:
            self.daemons[i] = self.start(i)
        return crashed

    def job_versions(self, job):
        """[(daemon index, {"current", "versions"})] of a job; a daemon without it: empty."""
        out = []
        for i, d in enumerate(self.daemons):
            try:
                out.append((i, d.get("/v1/jobs/" + job)))
            except OSError:
                out.append((i, {"current": None, "versions": []}))
        return out

    def recover(self, job, cluster=None):
        """`transform --recover` of a job until no daemon holds an open or prepared version
        of it (a continued daemon may still finish a stale prepare: ask again, 10 times);
        (job_versions, [(daemon, version, state) left]); self.recover_rc: its last exit status."""
        for _attempt in range(10):
            p = self.cli("transform", "--cluster", cluster or self.cluster, "--job", job, "--recover", timeout=120)
            self.recover_rc = p.returncode
            jobs = self.job_versions(job)
            left = [(i, v["version"], v["state"]) for i, j in jobs for v in j["versions"] if v["state"] != "committed"]
            if not left:
                break
            time.sleep(1)
        return jobs, left

    def host_id(self, i):
        """Daemon i's stable host id ("" from a daemon without one); kept across restarts."""
        if i not in self.host_ids:
            self.host_ids[i] = self.daemons[i].get("/v1/health").get("host_id", "")
        return self.host_ids[i]

    def behind(self, jobs, info, newest):
        """URLs of the daemons that hold ranks of version `newest` (by host id where its info
        records them, else by URL) and are not at it."""
        urls, ids = holders_of(info)
        return [
            self.daemons[i].url
            for i, j in jobs
            if j["current"] != newest and (self.daemons[i].url in urls or (self.host_id(i) and self.host_id(i) in ids))
        ]

    def check(self, op, old, target, rc, out):
        res = self.settle(old, [target])
        if "outcome" in res:
            return res
        saved = res["saved"]
        res = {"state": target if canon(saved) == canon(target) else old}
        if rc == 0:
            res["outcome"] = "completed" if res["state"] == target else "data lost"
            if op == "transform" and res["outcome"] == "completed":
                s = json.loads(out)
                if s["attempts"] > 1 or s.get("unconfirmed_hosts"):
                    res["outcome"] = "recovered"
        else:
            res["outcome"] = "clean abort" if res["state"] == old else "recovered"
        return res

    def settle(self, old, targets):
        """Job j after an operation that may have moved it from `old` to one of `targets`:
        {"saved": config} when every holder is at one version, nothing is left open or
        prepared and the state saves to exactly one of those configs (`ckpt verify`, the
        synthetic oracle), else {"outcome": ..., "detail": ...} (with "state" where known).
        self.recover_rc: the exit status of the last `transform --recover`."""
        # The next operation resolves what is left (a coordinator killed after every
        # participant prepared is rolled forward here: the state is judged after it);
        # then nothing open or prepared may remain (a continued daemon may still finish
        # a stale prepare: ask again).
        jobs, left = self.recover("j")
        newest = max((j["current"] or 0) for _, j in jobs)
        info = next(v["info"] for _, j in jobs for v in j["versions"] if v["version"] == newest)
        state = next((t for t in targets if canon(info["config"]) == canon(t)), old)
        if left:
            return {"outcome": "orphans", "detail": repr(left), "state": state}
        behind = self.behind(jobs, info, newest)
        if behind:
            return {"outcome": "split", "detail": "hosts %r not at version %d" % (behind, newest), "state": state}
        # Exactly the old or the new state, element by element.
        save = os.path.join(self.tmp, "save")
        shutil.rmtree(save, ignore_errors=True)
        p = self.cli("store", "save", "--cluster", self.cluster, "--job", "j", "--out", save, timeout=120)
        if p.returncode != 0:
            return {"outcome": "data lost", "detail": p.stderr.strip()[-400:]}
        with open(os.path.join(save, "tenplex.json")) as f:
            saved = json.load(f)["config"]
        v = self.cli("ckpt", "verify", "--in", save, timeout=120)
        if v.returncode != 0:
            return {"outcome": "data lost", "detail": "ckpt verify: " + v.stderr.strip()[-400:]}
        if canon(saved) not in [canon(c) for c in [old, *targets]]:
            return {"outcome": "data lost", "detail": "saved %s, none of %s" % (saved, [old, *targets])}
        return {"saved": saved}

    def stop(self):
        for d in self.daemons:
            if d.proc.poll() is None:
                os.kill(d.proc.pid, signal.SIGCONT)
            d.stop()
        for s in self.shm:
            shutil.rmtree(s, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    base_args(ap)
    ap.add_argument("--no-mount", action="store_true", help="leave out the ENOSPC trials")
    ap.add_argument(
        "--run-trials", action="store_true", help="also draw `tenplex run --cluster` trials (training workers; slow)"
    )
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    # ENOSPC trials mount tmpfs file systems: in a private mount namespace of our own.
    if not a.inner and not a.no_mount:
        probe = subprocess.run(["unshare", "-m", "true"], capture_output=True) if os.geteuid() == 0 else None
        if probe is not None and probe.returncode == 0:
            os.execvp("unshare", ["unshare", "-m", sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--inner"])
        print("no private mount namespace (not root?): the ENOSPC trials are left out", flush=True)
    run_campaign(
        lambda tmp: Campaign(
            a.tenplex, tmp, a.seed, a.verbose, can_mount=a.inner and not a.no_mount, run_trials=a.run_trials
        ),
        a,
    )


if __name__ == "__main__":
    main()
