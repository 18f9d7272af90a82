"""The fault campaign's two slow kinds (scripts/fault_campaign.py's docstring): a
training run (`tenplex run --cluster --commit-every 1`) with a daemon killed or stopped
in it, and ENOSPC (`reshard --out` or `store save --cluster --out` into a small tmpfs).
A mixin of fault_campaign.Campaign: it uses the campaign's daemons, cluster file, model,
checkpoints and random generator, and its hit/revive/recover/behind/cli.
"""

import json
import os
import shutil
import subprocess
import sys
import time

from fault_campaign_common import CONFIGS, GOOD, OP_DEADLINE, REPO, RUN_DEADLINE, dir_bytes, finish, signal_record


class RunAndDiskTrials:
    def run_trial(self, n):
        """tenplex run --cluster --commit-every 1 with a daemon killed or stopped in it."""
        rng = self.rng
        job = "r%d" % n
        kind = rng.choice(["SIGKILL", "SIGSTOP"])
        victim = rng.randrange(4)
        typical = sorted(self.run_durations)[len(self.run_durations) // 2] if self.run_durations else 20.0
        delay = rng.uniform(0, 1.2 * typical)
        long_stop = rng.random() < 0.5
        work = os.path.join(self.tmp, "run-" + job)
        sched = os.path.join(self.tmp, job + ".json")
        with open(sched, "w") as f:
            json.dump([{"step": 0, "config": "tp=2"}, {"step": 3, "config": "dp=2"}, {"step": 6, "stop": True}], f)
        cmd = [
            self.tenplex,
            "run",
            "--schedule",
            sched,
            "--log",
            os.path.join(self.tmp, job + ".jsonl"),
            "--work-dir",
            work,
            "--cluster",
            self.cluster,
            "--job",
            job,
            "--commit-every",
            "1",
            "--hang-seconds",
            "60",
            "--quiet",
            "--",
            sys.executable,
            os.path.join(REPO, "examples/gpt/train.py"),
            "--model",
            self.model,
            "--global-batch-size",
            "4",
            "--micro-batch-size",
            "2",
            "--seq-length",
            "16",
        ]
        t0 = time.time()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        while time.time() - t0 < delay and proc.poll() is None:
            time.sleep(0.01)
        phase = "during" if proc.poll() is None else "after"
        self.hit(victim, kind, long_stop)
        out, err, hang = finish(proc, RUN_DEADLINE)
        seconds = time.time() - t0
        if phase == "after":
            self.run_durations.append(seconds)
        crashed = self.revive(victim, kind)
        result = signal_record(
            n, "run", "tp=2", "dp=2", kind, victim, phase, delay, seconds, proc.returncode, long_stop
        )
        if proc.returncode != 0:
            result["error"] = err.strip().splitlines()[-1][-300:] if err.strip() else ""
        if hang:
            result["outcome"] = "hang"
        elif crashed:
            result.update(outcome="crash", detail="daemons %r died" % crashed)
        else:
            result.update(self.check_run(job, proc.returncode))
        for d in self.daemons:  # free the daemons' memory for the next trials
            try:
                d.call("DELETE", "/v1/jobs/" + job, timeout=30)
            except OSError:
                pass
        shutil.rmtree(work, ignore_errors=True)
        if self.verbose or result["outcome"] not in GOOD:
            print(json.dumps(result), flush=True)
            if result["outcome"] not in GOOD:
                print("   run stderr: %s" % err.strip()[-600:], flush=True)
        return result

    def check_run(self, job, rc):
        jobs, left = self.recover(job)
        if left:
            return {"outcome": "orphans", "detail": repr(left)}
        newest = max([j["current"] or 0 for _, j in jobs])
        if newest == 0:  # killed before the first commit: nothing to check
            return {"outcome": "completed" if rc == 0 else "clean abort"}
        info = next(v["info"] for _, j in jobs for v in j["versions"] if v["version"] == newest)
        behind = self.behind(jobs, info, newest)
        if behind:
            return {"outcome": "split", "detail": "hosts %r not at version %d" % (behind, newest)}
        save = os.path.join(self.tmp, "run-save")
        again = os.path.join(self.tmp, "run-again")
        for x in (save, again):
            shutil.rmtree(x, ignore_errors=True)
        p = self.cli("store", "save", "--cluster", self.cluster, "--job", job, "--out", save, timeout=120)
        if p.returncode != 0:
            return {"outcome": "data lost", "detail": p.stderr.strip()[-400:]}
        with open(os.path.join(save, "tenplex.json")) as f:
            config = json.load(f)["config"]
        v = self.cli("reshard", "--in", save, "--to", config, "--out", again, "--quiet", timeout=120)
        for x in (save, again):
            shutil.rmtree(x, ignore_errors=True)
        if v.returncode != 0:
            return {"outcome": "data lost", "detail": "reshard of the saved state: " + v.stderr.strip()[-400:]}
        return {"outcome": "completed" if rc == 0 else "clean abort"}

    def enospc_trial(self, n, op, target):
        """reshard --out or store save --cluster --out into a tmpfs of a random size."""
        rng = self.rng
        src = rng.choice(CONFIGS)
        need = dir_bytes(self.ckpts[target if op == "reshard" else self.state])
        size = max(4096, int(rng.uniform(0.1, 1.3) * need))
        mnt = os.path.join(self.tmp, "enospc")
        os.makedirs(mnt, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%d" % size, "tmpfs", mnt], check=True)
        out = os.path.join(mnt, "out")
        if op == "reshard":
            cmd = [self.tenplex, "reshard", "--in", self.ckpts[src], "--to", target, "--out", out, "--quiet"]
        else:
            cmd = [self.tenplex, "store", "save", "--cluster", self.cluster, "--job", "j", "--out", out]
        t0 = time.time()
        result = {
            "trial": n,
            "op": op,
            "from": src if op == "reshard" else self.state,
            "to": target,
            "kind": "ENOSPC",
            "victim": "disk",
            "phase": "fits" if size >= need * 1.05 else "too small",
            "size": size,
            "need": need,
        }
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=OP_DEADLINE)
            result["rc"] = p.returncode
            if p.returncode < 0 or p.returncode >= 128:
                result.update(outcome="crash", detail=p.stderr.strip()[-300:])
            elif p.returncode == 0:
                v = self.cli("ckpt", "verify", "--in", out, timeout=120)
                result["outcome"] = "completed" if v.returncode == 0 else "data lost"
                if v.returncode != 0:
                    result["detail"] = v.stderr.strip()[-300:]
            elif os.listdir(mnt):
                result.update(outcome="orphans", detail="left %r" % os.listdir(mnt))
            elif "disk is full" not in p.stderr:
                result.update(outcome="unclear", detail=p.stderr.strip()[-300:])
            else:
                result["outcome"] = "clean abort"
                result["error"] = p.stderr.strip().splitlines()[-1][-300:]
        except subprocess.TimeoutExpired:
            result["outcome"] = "hang"
        result["seconds"] = round(time.time() - t0, 2)
        subprocess.run(["umount", mnt], check=True)
        crashed = [i for i, x in enumerate(self.daemons) if x.proc.poll() is not None]
        if crashed:
            result.update(outcome="crash", detail="daemons %r died" % crashed)
            for i in crashed:
                self.daemons[i] = self.start(i)
        if self.verbose or result["outcome"] not in ("completed", "clean abort"):
            print(json.dumps(result), flush=True)
        return result
