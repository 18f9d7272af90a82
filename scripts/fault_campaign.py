#!/usr/bin/python3
"""Randomized fault-injection campaign (issue 19 §3, docs/reliability.md).

    /usr/bin/python3 scripts/fault_campaign.py build/bin/tenplex [--trials 100]
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
  2. `store save --cluster` and `ckpt verify` (element by element, the synthetic
     oracle) must give exactly the old or the new state (else: data lost / mixed);
  3. after the next operation (`transform --recover`) every daemon of the state's
     placement must be at the same current version and no daemon may hold an open or
     prepared version of the job (else: split / orphans);
  4. no daemon may have died on its own (else: crash).

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
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from daemons import Daemon  # noqa: E402

CONFIGS = ["tp=2,pp=2,dp=2", "tp=2,pp=4", "tp=1,pp=2,dp=4", "tp=4,pp=2", "tp=2,dp=4",
           "tp=1,pp=4,dp=2", "tp=2,pp=2,dp=2,zero=1", "tp=2,dp=3", "tp=1,pp=2,dp=3", "tp=2,pp=2"]
OP_DEADLINE = 90  # seconds: transform ~ silent timeout + a round; load ~ 2 x its 30 s request timeout
TRANSFORM_FLAGS = ["--silent-timeout", "3", "--control-timeout", "5"]


def canon(config):
    c = {"tp": "1", "pp": "1", "dp": "1", "zero": "0"}
    for kv in config.split(","):
        k, v = kv.split("=")
        c[k] = v
    return tuple(sorted(c.items()))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Campaign:
    def __init__(self, tenplex, tmp, seed, verbose):
        self.tenplex, self.tmp, self.rng, self.verbose = tenplex, tmp, random.Random(seed), verbose
        self.ports = [free_port() for _ in range(4)]
        self.shm = ["/dev/shm/tenplex-campaign-%d-%d" % (os.getpid(), i) for i in range(4)]
        self.daemons = [self.start(i) for i in range(4)]
        self.cluster = os.path.join(tmp, "cluster.json")
        with open(self.cluster, "w") as f:
            json.dump({"hosts": [d.url for d in self.daemons], "gpus_per_host": 2}, f)
        model = os.path.join(tmp, "m.json")
        self.cli("model", "gpt", "--num-layers", "8", "--hidden-size", "64", "--num-attention-heads", "4",
                 "--num-query-groups", "4", "--ffn-hidden-size", "96", "--vocab-size", "301",
                 "--make-vocab-size-divisible-by", "8", "--max-position-embeddings", "16", "--swiglu",
                 "-o", model, check=True)
        self.ckpts = {}
        for c in CONFIGS:
            d = os.path.join(tmp, "ckpt-" + c.replace(",", "_").replace("=", ""))
            self.cli("ckpt", "init", "--model", model, "--config", c, "--out", d, "--seed", "5", check=True)
            self.ckpts[c] = d
        self.state = CONFIGS[0]
        self.cli("store", "load", "--cluster", self.cluster, "--job", "j", "--dir", self.ckpts[self.state],
                 check=True)
        self.durations = {"transform": [], "load": []}

    def start(self, i, attempts=50):
        for _ in range(attempts):  # the port may still be held a moment after a SIGKILL
            try:
                return Daemon(self.tenplex, listen="127.0.0.1:%d" % self.ports[i],
                              args=("--shm-dir", self.shm[i]))
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
            return [self.tenplex, "transform", "--cluster", self.cluster, "--job", "j", "--to", target,
                    "--json", "--quiet", *TRANSFORM_FLAGS]
        return [self.tenplex, "store", "load", "--cluster", self.cluster, "--job", "j", "--dir",
                self.ckpts[target]]

    def typical(self, op):
        d = self.durations[op]
        return sorted(d)[len(d) // 2] if d else 1.0

    def trial(self, n):
        rng = self.rng
        op = rng.choice(["transform", "load"])
        target = rng.choice([c for c in CONFIGS if canon(c) != canon(self.state)])
        kind = rng.choice(["SIGKILL", "SIGSTOP"])
        victim = rng.randrange(4)
        delay = rng.uniform(0, 1.2 * self.typical(op))
        long_stop = rng.random() < 0.5
        old = self.state
        t0 = time.time()
        proc = subprocess.Popen(self.op_command(op, target), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        while time.time() - t0 < delay and proc.poll() is None:
            time.sleep(0.01)
        phase = "during" if proc.poll() is None else "after"
        d = self.daemons[victim]
        os.kill(d.proc.pid, signal.SIGKILL if kind == "SIGKILL" else signal.SIGSTOP)
        if kind == "SIGSTOP" and not long_stop:
            time.sleep(rng.uniform(0.5, 5))
            os.kill(d.proc.pid, signal.SIGCONT)
        try:
            out, err = proc.communicate(timeout=OP_DEADLINE)
            hang = False
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            hang = True
        seconds = time.time() - t0
        if phase == "during" and not hang:
            pass
        elif phase == "after":
            self.durations[op].append(seconds)
        # Bring the victim back: continue it, or restart it on its --shm-dir.
        crashed = [i for i, x in enumerate(self.daemons) if i != victim and x.proc.poll() is not None]
        if kind == "SIGSTOP":
            os.kill(d.proc.pid, signal.SIGCONT)
        else:
            d.proc.wait(20)
            self.daemons[victim] = self.start(victim)
        for i in crashed:
            self.daemons[i] = self.start(i)
        result = {"trial": n, "op": op, "from": old, "to": target, "kind": kind, "victim": victim,
                  "phase": phase, "delay": round(delay, 3), "seconds": round(seconds, 2), "rc": proc.returncode,
                  "long_stop": long_stop}
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
            if result["outcome"] not in ("completed", "recovered", "clean abort"):
                print("   op stderr: %s" % err.strip()[-600:], flush=True)
        return result

    def check(self, op, old, target, rc, out):
        res = {}
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
        if canon(saved) not in (canon(old), canon(target)):
            return {"outcome": "data lost", "detail": "saved %s, neither %s nor %s" % (saved, old, target)}
        res["state"] = target if canon(saved) == canon(target) else old
        # The next operation resolves what is left; then nothing open or prepared may
        # remain (a continued daemon may still finish a stale prepare: ask again).
        for attempt in range(10):
            self.cli("transform", "--cluster", self.cluster, "--job", "j", "--recover", timeout=120)
            jobs = []
            for d in self.daemons:
                try:
                    jobs.append(d.get("/v1/jobs/j"))
                except OSError:
                    jobs.append({"current": None, "versions": []})
            left = [(i, v["version"], v["state"]) for i, j in enumerate(jobs) for v in j["versions"]
                    if v["state"] != "committed"]
            if not left:
                break
            time.sleep(1)
        if left:
            return {"outcome": "orphans", "detail": repr(left), "state": res["state"]}
        newest = max((j["current"] or 0) for j in jobs)
        info = next(v["info"] for j in jobs for v in j["versions"] if v["version"] == newest)
        holders = info.get("cluster", {}).get("hosts", [])
        behind = [d.url for d, j in zip(self.daemons, jobs) if d.url in holders and j["current"] != newest]
        if behind:
            return {"outcome": "split", "detail": "hosts %r not at version %d" % (behind, newest),
                    "state": res["state"]}
        if rc == 0:
            res["outcome"] = "completed" if res["state"] == target else "data lost"
            if op == "transform" and res["outcome"] == "completed":
                s = json.loads(out)
                if s["attempts"] > 1 or s.get("unconfirmed_hosts"):
                    res["outcome"] = "recovered"
        else:
            res["outcome"] = "clean abort" if res["state"] == old else "recovered"
        return res

    def stop(self):
        for d in self.daemons:
            if d.proc.poll() is None:
                os.kill(d.proc.pid, signal.SIGCONT)
            d.stop()
        for s in self.shm:
            shutil.rmtree(s, ignore_errors=True)


def table(results):
    kinds = sorted({(r["kind"], r["op"], r["phase"]) for r in results})
    outcomes = ["completed", "recovered", "clean abort", "data lost", "split", "orphans", "hang", "crash"]
    lines = ["| fault | operation | phase | trials | " + " | ".join(outcomes) + " |",
             "|---|---|---|---|" + "---|" * len(outcomes)]
    for k in kinds:
        rs = [r for r in results if (r["kind"], r["op"], r["phase"]) == k]
        lines.append("| %s | %s | %s | %d | " % (k[0], k[1], k[2], len(rs)) +
                     " | ".join(str(sum(r["outcome"] == o for r in rs)) for o in outcomes) + " |")
    lines.append("| all | | | %d | " % len(results) +
                 " | ".join("**%d**" % sum(r["outcome"] == o for r in results) for o in outcomes) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tenplex")
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--markdown", help="write the table (and the seed) to this file")
    ap.add_argument("--json", help="write every trial's record to this file")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="tenplex-campaign-")
    c = None
    results = []
    t0 = time.time()
    try:
        c = Campaign(a.tenplex, tmp, a.seed, a.verbose)
        for n in range(a.trials):
            results.append(c.trial(n))
    finally:
        if c:
            c.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    t = table(results)
    print(t)
    print("%d trials, seed %d, %.0f s" % (len(results), a.seed, time.time() - t0))
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write("%d trials, seed %d, %.0f s\n\n%s\n" % (len(results), a.seed, time.time() - t0, t))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    bad = [r for r in results if r["outcome"] not in ("completed", "recovered", "clean abort")]
    if bad:
        print("FAIL: %d trial(s) with data loss, split versions, orphans, hangs or crashes" % len(bad))
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
