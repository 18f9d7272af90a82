#!/usr/bin/env python3
"""Fault campaign, part 2: coordinators, ports, host names, elastic jobs (issue 34 item 8,
docs/reliability.md).

    .venv/bin/python scripts/fault_campaign_jobs.py build/bin/tenplex [--trials 40]
        [--seed 1] [--kinds K,K] [--markdown FILE] [--json FILE] [--verbose]

The setup and checks of scripts/fault_campaign.py (4 daemons with a persistent
--shm-dir on fixed ports holding the synthetic job j; after a trial `transform
--recover`, every holder at one version, nothing open or prepared, `store save
--cluster` + `ckpt verify` exactly one expected state), with the daemons listening on
every address (0.0.0.0, with a bearer token) so that a host can be named by several
URLs. Kinds, drawn uniformly:

  - coordinators: two coordinators of job j race, `store load --cluster` and
    `transform --cluster` or two transforms, to two other configs, the second started
    at a random offset (0-1x the first's typical duration). A success must be the
    state left (both may succeed only one after the other: that of the newer version);
    a failure must be a clear error (exit 1-127, "error", no traceback); afterwards
    `transform --recover` must exit 0 and a transform to a third config succeed (else
    wedged).
  - port in use: a second `store serve` on a live daemon's port (as 127.0.0.1, 0.0.0.0
    or localhost; with that daemon's --shm-dir or a fresh one), idle or during a
    transform: it must exit non-zero within 10 s naming the port or the --shm-dir in
    use (else split: two daemons on one port; unclear); the first keeps its pid, store id and host id; the job's
    versions are untouched (idle) or settle as in fault_campaign.py.
  - host renamed: the cluster file names 1-4 daemons by another address (localhost,
    127.0.0.x, this machine's own address): a transform must succeed in one attempt
    with no lost host (else lost host); or one daemon is listed twice under two names
    instead of another host: the transform must refuse that (else lost host).
  - down at start, restart mid-job: elastic jobs (tenplex.elastic.Job), see
    fault_campaign_elastic.py.

Outcomes: those of fault_campaign.py, plus silent restart (an elastic job that started
from no version or from an older step than the last commit its workers were told of),
wedged (`--recover` or the next transform fails after the race) and lost host (a live
daemon named by another URL treated as lost, or one daemon accepted under two names).
"""

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import fault_campaign as fc  # noqa: E402
import fault_campaign_common as common  # noqa: E402
import fault_campaign_elastic as fe  # noqa: E402

OUTCOMES = common.OUTCOMES + ["silent restart", "wedged", "lost host"]
KINDS = ["coordinators", "port in use", "host renamed", "down at start", "restart mid-job"]
SERVE_DEADLINE = 10  # seconds a refused second `store serve` may take to exit


def clear_error(rc, err):
    """A failure a user can act on: an exit status of its own (no signal), an error line,
    no Python traceback."""
    return 0 < rc < 128 and "error" in err.lower() and "Traceback" not in err


def own_addresses():
    """This machine's non-loopback IPv4 addresses (a daemon on 0.0.0.0 answers on them)."""
    p = subprocess.run(["hostname", "-I"], capture_output=True, text=True)
    return [a for a in p.stdout.split() if "." in a and not a.startswith("127.")]


class JobsCampaign(fe.ElasticTrials, fc.Campaign):
    LISTEN = "0.0.0.0"

    def __init__(self, tenplex, tmp, seed, verbose, kinds):
        os.environ.setdefault("TENPLEX_TOKEN", secrets.token_hex(16))  # required off loopback
        super().__init__(tenplex, tmp, seed, verbose)
        self.kinds = kinds
        self.addresses = [a for a in own_addresses() if self.answers("http://%s:%d" % (a, self.ports[0]))]
        self.init_elastic()

    @staticmethod
    def answers(url):
        req = urllib.request.Request(
            url + "/v1/health", headers={"Authorization": "Bearer " + os.environ["TENPLEX_TOKEN"]}
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    def trial(self, n):
        kind = self.rng.choice(self.kinds)
        t0 = time.time()
        result = {
            "coordinators": self.coordinators_trial,
            "port in use": self.port_trial,
            "host renamed": self.rename_trial,
            "down at start": self.down_at_start_trial,
            "restart mid-job": self.restart_mid_job_trial,
        }[kind](n)
        result.update(trial=n, kind=kind, seconds=round(time.time() - t0, 2))
        if self.verbose or result["outcome"] not in common.GOOD:
            print(json.dumps(result), flush=True)
        if result["outcome"] not in common.GOOD and kind in KINDS[:3]:
            self.reset_job()
        return result

    def reset_job(self):
        """After a failed trial on job j: j loaded afresh (its versions deleted on every
        daemon), so that one failure is counted once, not again by every later trial."""
        left = [
            (i, j["current"], [(v["version"], v["state"]) for v in j["versions"]]) for i, j in self.job_versions("j")
        ]
        print("   reset job j; (daemon, current, versions) were %s" % left, flush=True)
        for d in self.daemons:
            try:
                d.call("DELETE", "/v1/jobs/j", timeout=30)
            except OSError:
                pass
        self.cli("store", "load", "--cluster", self.cluster, "--job", "j", "--dir", self.ckpts[self.state], check=True)

    # ---- helpers -----------------------------------------------------------------------

    def spawn(self, cmd, name):
        """A background command with its output in files (no pipe to fill); (proc, files)."""
        out = open(os.path.join(self.tmp, name + ".out"), "w+")
        err = open(os.path.join(self.tmp, name + ".err"), "w+")
        return subprocess.Popen(cmd, stdout=out, stderr=err, text=True, start_new_session=True), (out, err)

    @staticmethod
    def collect(files):
        texts = []
        for f in files:
            f.seek(0)
            texts.append(f.read())
            f.close()
        return texts

    def crashed(self):
        """Restarts every daemon that died by itself; their indexes."""
        return self.revive(-1, "none")

    def other_configs(self, k, *but):
        return self.rng.sample([c for c in common.CONFIGS if common.canon(c) not in [common.canon(b) for b in but]], k)

    # ---- concurrent coordinators -------------------------------------------------------

    def coordinators_trial(self, n):
        rng = self.rng
        ops = rng.choice([("load", "transform"), ("transform", "load"), ("transform", "transform")])
        old = self.state
        targets = self.other_configs(2, old)
        offset = rng.uniform(0, self.typical(ops[0]))
        t0 = time.time()
        procs, files, ends = [], [], [None, None]
        p, f = self.spawn(self.race_command(ops[0], targets[0]), "coord0")
        procs.append(p)
        files.append(f)
        while time.time() - t0 < offset:
            if p.poll() is not None and ends[0] is None:
                ends[0] = time.time()
            time.sleep(0.01)
        overlap = p.poll() is None
        p, f = self.spawn(self.race_command(ops[1], targets[1]), "coord1")
        procs.append(p)
        files.append(f)
        hang = False
        while any(e is None for e in ends):
            for i, q in enumerate(procs):
                if ends[i] is None and q.poll() is not None:
                    ends[i] = time.time()
            if time.time() - t0 > common.OP_DEADLINE + offset:
                hang = True
                for q in procs:
                    if q.poll() is None:
                        os.killpg(q.pid, signal.SIGKILL)
                        q.wait()
                break
            time.sleep(0.01)
        texts = [self.collect(f) for f in files]
        rcs = [q.returncode for q in procs]
        if not overlap:
            self.durations[ops[0]].append(ends[0] - t0)
        result = {
            "op": "+".join(ops),
            "phase": "overlap" if overlap else "one after the other",
            "from": old,
            "to": targets,
            "offset": round(offset, 3),
            "rc": rcs,
        }
        errors = [t[1].strip().splitlines()[-1][-300:] for t, rc in zip(texts, rcs) if rc != 0 and t[1].strip()]
        if errors:
            result["error"] = errors
        result["stderr"] = [t[1].strip()[-1500:] for t in texts]  # printed with a failure only
        crashed = self.crashed()
        if hang:
            return dict(result, outcome="hang")
        if crashed:
            return dict(result, outcome="crash", detail="daemons %r died" % crashed)
        result.update(self.judge_race(old, targets, rcs, texts))
        if result["outcome"] in common.GOOD:
            del result["stderr"]
        return result

    def race_command(self, op, target):
        return self.op_command(op, target) + (["--json"] if op == "load" else [])

    def judge_race(self, old, targets, rcs, texts):
        res = self.settle(old, targets)
        if "outcome" in res:
            if res["outcome"] == "orphans" and self.recover_rc != 0:
                self.unwedge()
                return dict(res, outcome="wedged")
            return res
        saved = res["saved"]
        got = next((t for t in targets if common.canon(t) == common.canon(saved)), old)
        self.state = got
        winners = [i for i in (0, 1) if rcs[i] == 0]
        unclear = [i for i in (0, 1) if rcs[i] != 0 and not clear_error(rcs[i], texts[i][1])]
        if winners:  # the newest version committed by a winner (load: "version", transform: "to_version")
            made = {i: max(json.loads(texts[i][0]).get(k, 0) for k in ("version", "to_version")) for i in winners}
            last = max(winners, key=lambda i: made[i])
            if got != targets[last]:
                return {
                    "outcome": "data lost",
                    "detail": "operation %d committed version %d last, but the state is %s" % (last, made[last], got),
                    "state": got,
                    "versions": made,
                }
        if unclear:
            return {"outcome": "unclear", "detail": texts[unclear[0]][1].strip()[-400:], "state": got}
        # Never wedged: recovery, the next transform and a save work.
        third = self.other_configs(1, got)[0]
        t0 = time.time()
        p = subprocess.run(
            self.op_command("transform", third), capture_output=True, text=True, timeout=common.OP_DEADLINE
        )
        if self.recover_rc != 0 or p.returncode != 0:
            self.unwedge()
            return {
                "outcome": "wedged",
                "detail": "recover exit %d; next transform: %s" % (self.recover_rc, p.stderr.strip()[-300:]),
                "state": got,
            }
        self.durations["transform"].append(time.time() - t0)
        res = self.settle(third, [])
        if "outcome" in res:
            return res
        self.state = third
        if winners:
            return {"outcome": "completed", "state": got, "versions": made}
        return {"outcome": "clean abort" if got == old else "recovered", "state": got}

    def unwedge(self):
        """Removes what a wedged job left (every version that is not committed) by hand,
        so that later trials start from a clean job."""
        for i, j in self.job_versions("j"):
            for v in j["versions"]:
                if v["state"] != "committed":
                    try:
                        self.daemons[i].call("DELETE", "/v1/jobs/j/versions/%d" % v["version"], timeout=30)
                    except OSError:
                        pass

    # ---- two daemons on one port -------------------------------------------------------

    def port_trial(self, n):
        rng = self.rng
        victim = rng.randrange(4)
        host = rng.choice(["127.0.0.1", "0.0.0.0", "localhost"])
        same_dir = rng.random() < 0.5
        during = rng.random() < 0.5
        old = self.state
        target = self.other_configs(1, old)[0]
        before = self.job_versions("j")
        health = self.daemons[victim].get("/v1/health")
        result = {
            "op": "serve" + (" during transform" if during else ""),
            "phase": "same shm dir" if same_dir else "fresh shm dir",
            "victim": victim,
            "listen": host,
            "from": old,
        }
        op = None
        if during:
            op, op_files = self.spawn(self.op_command("transform", target), "port-op")
            time.sleep(rng.uniform(0, self.typical("transform")))
        shm = self.shm[victim] if same_dir else self.shm[victim] + "-second"
        cmd = [self.tenplex, "store", "serve", "--listen", "%s:%d" % (host, self.ports[victim]), "--shm-dir", shm]
        second, files = self.spawn(cmd, "second")
        try:
            second.wait(SERVE_DEADLINE)
        except subprocess.TimeoutExpired:
            os.killpg(second.pid, signal.SIGKILL)
            second.wait()
        out, err = self.collect(files)
        if not same_dir:
            shutil.rmtree(shm, ignore_errors=True)
        result["rc"] = second.returncode
        result["error"] = err.strip()[-300:]
        op_rc, op_out, hang = None, "", False
        if op is not None:
            try:
                op.wait(common.OP_DEADLINE)
            except subprocess.TimeoutExpired:
                os.killpg(op.pid, signal.SIGKILL)
                op.wait()
                hang = True
            op_rc, (op_out, _) = op.returncode, self.collect(op_files)
            result["to"] = target
        crashed = self.crashed()
        after = self.daemons[victim].get("/v1/health")
        if hang:
            return dict(result, outcome="hang")
        if crashed:
            return dict(result, outcome="crash", detail="daemons %r died" % crashed)
        if second.returncode in (0, -signal.SIGKILL) or "serving" in out:
            return dict(result, outcome="split", detail="a second daemon served port %d" % self.ports[victim])
        # Refused for the port, or (same --shm-dir) for the directory's lock, before either is used.
        if not clear_error(second.returncode, err) or (str(self.ports[victim]) not in err and shm not in err):
            return dict(result, outcome="unclear")
        same = [health.get(k) == after.get(k) for k in ("pid", "store_id", "host_id")]
        if not all(same):
            return dict(result, outcome="split", detail="the first daemon changed: %r -> %r" % (health, after))
        if op is not None:
            res = self.check("transform", old, target, op_rc, op_out)
            self.state = res.get("state") or self.state
            return dict(result, **res)
        if self.job_versions("j") != before:
            return dict(result, outcome="data lost", detail="the job's versions changed")
        res = self.settle(old, [])
        return dict(result, **(res if "outcome" in res else {"outcome": "clean abort"}))

    # ---- a host renamed ----------------------------------------------------------------

    def aliases(self, i):
        """Other URLs of daemon i (it listens on 0.0.0.0)."""
        port = self.ports[i]
        names = ["localhost", "127.0.0.%d" % self.rng.randint(2, 254), *self.addresses]
        return ["http://%s:%d" % (h, port) for h in names]

    def rename_trial(self, n):
        rng = self.rng
        old = self.state
        target = self.other_configs(1, old)[0]
        urls = [d.url for d in self.daemons]
        duplicate = rng.random() < 0.2
        if duplicate:
            i, j = rng.sample(range(4), 2)
            urls[j] = rng.choice(self.aliases(i))
            phase = "one daemon twice"
        else:
            renamed = rng.sample(range(4), rng.randint(1, 4))
            for i in renamed:
                urls[i] = rng.choice(self.aliases(i))
            phase = "%d renamed" % len(renamed)
        path = os.path.join(self.tmp, "renamed.json")
        with open(path, "w") as f:
            json.dump({"hosts": urls, "gpus_per_host": 2}, f)
        cmd = self.op_command("transform", target)
        cmd[cmd.index(self.cluster)] = path
        result = {"op": "transform", "phase": phase, "from": old, "to": target, "hosts": urls}
        t0 = time.time()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=common.OP_DEADLINE)
        except subprocess.TimeoutExpired:
            return dict(result, outcome="hang")
        result["rc"] = p.returncode
        if p.returncode != 0:
            result["error"] = p.stderr.strip()[-300:]
        crashed = self.crashed()
        if crashed:
            return dict(result, outcome="crash", detail="daemons %r died" % crashed)
        if duplicate:
            res = self.settle(old, [target])
            if "outcome" in res:
                return dict(result, **res)
            if p.returncode == 0:
                self.state = target if common.canon(res["saved"]) == common.canon(target) else old
                return dict(result, outcome="lost host", detail="one daemon accepted under two URLs")
            clear = clear_error(p.returncode, p.stderr)
            return dict(result, outcome="clean abort" if clear else "unclear")
        res = self.check("transform", old, target, p.returncode, p.stdout)
        self.state = res.get("state") or self.state
        if p.returncode == 0:
            self.durations["transform"].append(time.time() - t0)
            stats = json.loads(p.stdout)
            if stats.get("lost_hosts") or stats["attempts"] > 1:
                res = dict(
                    res,
                    outcome="lost host",
                    detail="lost %r in %d attempts" % (stats.get("lost_hosts"), stats["attempts"]),
                )
        elif res["outcome"] in common.GOOD:
            res = dict(res, outcome="lost host", detail="the transform failed")
        return dict(result, **res)

    def stop(self):
        super().stop()
        for s in self.shm:
            shutil.rmtree(s + "-second", ignore_errors=True)


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        return fe.worker(sys.argv[2])
    ap = argparse.ArgumentParser()
    common.base_args(ap)
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated fault kinds to draw from")
    a = ap.parse_args()
    kinds = a.kinds.split(",")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        ap.error("unknown kinds %s; known: %s" % (unknown, ", ".join(KINDS)))
    socket.setdefaulttimeout(60)
    common.run_campaign(lambda tmp: JobsCampaign(a.tenplex, tmp, a.seed, a.verbose, kinds), a, OUTCOMES)


if __name__ == "__main__":
    main()
