"""The elastic-job kinds of scripts/fault_campaign_jobs.py (issue 34 item 8).

  - down at start: an elastic job (tenplex.elastic.Job: 2 workers, one per host, config
    dp=2, a real gloo group, a commit every step) runs 2-5 steps and ends; one or both
    of its daemons are SIGKILLed, the job is started again for 3 more steps
    (connect_timeout 3 s) and each daemon is restarted on its --shm-dir 0-10 s later
    (the workers take 2-4 s to start). The job must resume at its last step; a start
    that gave up waiting must fail naming the daemons (the launcher then restarts the
    workers, as torchrun would). Phase: how many were down, and whether they were back
    in time (the restore waited) or after a failed start.
  - restart mid-job: a job of 10 steps with a commit every 1 or 2 steps; one of its
    daemons is SIGKILLed or SIGTERMed at a random moment (0-1.2x the job's typical
    duration) and restarted on its --shm-dir 0-6 s later. The job must go on from its
    last commit or end with a clear error. Phase: the signal, during or after the job.

The jobs run under a small launcher that does for them what torchrun's agent does: one
process per rank with torchrun's environment (WORLD_SIZE, RANK, LOCAL_RANK, GROUP_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR/PORT, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_RUN_ID),
every worker restarted when one fails (the others SIGKILLed 2 s later; up to 4
restarts), none after exit status 76 (tenplex.elastic's fatal error). A worker's state
at step s is a function of s and the element index, for every tensor of its rank
(tenplex.layout.rank_tensors of a 2-layer GPT, optimizer state included); a restore
checks it (else exit 75). Each trial then checks, from the job's own log (Job(log=)):
every start after a commit restored a version at least as new as the last commit the
workers were told of (else silent restart); after `transform --recover` nothing is open
or prepared, both holders are at the newest version, whose step is at least that commit's
and whose tensors (read from each host's daemon) are its step's (else orphans, split,
data lost); a job that did not finish ended with a clear error (else unclear).
"""

import json
import math
import os
import signal
import subprocess
import sys
import time

import fault_campaign as fc
import fault_campaign_common as common

MAX_RESTARTS = 4
JOB_DEADLINE = 240  # seconds for every round of a job together
EXIT_BAD_STATE = 75  # a worker restored tensors that are not its step's
FATAL = 76  # tenplex.elastic.FATAL_EXIT_STATUS
POLICY = {"2": "dp=2"}
STEP_SECONDS = 0.2
CONNECT_TIMEOUT = 3  # seconds a restore waits for a daemon that does not answer


def rank_state(model, config, rank, step):
    """{name: tensor} of rank at step: (element index % 997) / 997 + step, every tensor F32."""
    import torch

    from tenplex import layout

    out = {}
    for name, dtype, shape in layout.rank_tensors(model, layout.Config.parse(config), rank):
        assert dtype == "F32", (name, dtype)
        n = math.prod(shape)
        out[name] = ((torch.arange(n, dtype=torch.float32) % 997) / 997 + step).reshape(shape)
    return out


def wrong_tensors(model, config, rank, step, tensors):
    import torch

    want = rank_state(model, config, rank, step)
    return sorted(n for n, t in want.items() if n not in tensors or not torch.equal(tensors[n].cpu(), t))


def worker(spec_path):
    """One rank of an elastic job (the launcher's child), as train.py --elastic drives it."""
    with open(spec_path) as f:
        spec = json.load(f)
    from tenplex import elastic, layout

    model = layout.Model.load(spec["model"])
    try:
        job = elastic.Job(
            spec["job"],
            spec["policy"],
            commit_every=spec["commit_every"],
            log=spec["log"],
            connect_timeout=spec["connect_timeout"],
            request_timeout=spec["request_timeout"],
            term_wait=1,
        )
        job.init_process_group(timeout=60)
        r = job.restore()
        start = 0 if r is None else int(r.step)
        if r is not None:
            bad = wrong_tensors(model, job.config, job.rank, start, r.tensors)
            if bad:
                print(
                    "campaign: rank %d restored version %d (step %d) with wrong tensors %s"
                    % (job.rank, r.version, start, bad[:3]),
                    file=sys.stderr,
                    flush=True,
                )
                sys.exit(EXIT_BAD_STATE)
        for step in range(start + 1, spec["steps"] + 1):
            time.sleep(spec["step_seconds"])
            info = {"model": model.desc, "config": job.config, "step": step}
            if job.step_done(
                step, lambda: info, lambda: rank_state(model, job.config, job.rank, step), last=step == spec["steps"]
            ):
                job.finish()
        job.close()
    except elastic.ElasticError as e:
        print("tenplex.elastic error: %s" % e, file=sys.stderr, flush=True)
        sys.exit(1)


def read_events(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def silent_starts(events):
    """[(restored step, last commit told)] of every start from no version or an older
    step than the last commit the workers were told of."""
    out, told = [], 0
    for e in events:
        if e["event"] == "commit":
            told = max(told, e["step"])
        elif e["event"] == "elastic_start":
            step = e.get("step") if e.get("version") is not None else None
            if told > 0 and (step is None or step < told):
                out.append((step, told))
    return out


class ElasticTrials:
    """A mixin of fault_campaign_jobs.JobsCampaign (a fault_campaign.Campaign)."""

    def init_elastic(self):
        from tenplex import layout

        self.job_model = layout.Model.load(self.run_model)
        self.job_durations = []

    # ---- the launcher ------------------------------------------------------------------

    def job_spec(self, job, steps, commit_every):
        spec = {
            "job": job,
            "policy": POLICY,
            "model": self.run_model,
            "steps": steps,
            "commit_every": commit_every,
            "connect_timeout": CONNECT_TIMEOUT,
            "request_timeout": 10,
            "step_seconds": STEP_SECONDS,
            "log": os.path.join(self.tmp, job + ".jsonl"),
        }
        path = os.path.join(self.tmp, "%s-%d.spec.json" % (job, steps))
        with open(path, "w") as f:
            json.dump(spec, f)
        return path

    def start_workers(self, spec, job, hosts, restarts):
        port = fc.free_port()
        procs = []
        for r, h in enumerate(hosts):
            env = dict(
                os.environ,
                PYTHONPATH=os.path.join(common.REPO, "python"),
                TENPLEX_BIN=self.tenplex,
                OMP_NUM_THREADS="1",
                GLOO_SOCKET_IFNAME="lo",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                WORLD_SIZE=str(len(hosts)),
                LOCAL_WORLD_SIZE="1",
                RANK=str(r),
                LOCAL_RANK="0",
                GROUP_RANK=str(r),
                TORCHELASTIC_RESTART_COUNT=str(restarts),
                TORCHELASTIC_RUN_ID=job,
                TENPLEX_FATAL_FILE=os.path.join(self.tmp, job + ".fatal"),
                TENPLEX_STORE_URL=self.daemons[h].url,
            )
            out = open(os.path.join(self.tmp, "%s-r%d-%d.log" % (job, r, restarts)), "w+")
            cmd = [sys.executable, os.path.join(common.REPO, "scripts", "fault_campaign_jobs.py"), "--worker", spec]
            procs.append(
                (subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True), out)
            )
        return procs

    def launch(self, spec, job, hosts, actions=()):
        """Runs the job's workers until all exit 0 (finished), one exits 76 (fatal),
        restarts run out (failed) or JOB_DEADLINE passes (hang); actions: [(seconds after
        the start, fn)], run when due, the rest at the end. {"status", "restarts",
        "errors": (round, line) of the workers' errors, "last_errors": the last round's,
        "bad_state", "seconds"}."""
        actions = sorted(actions, key=lambda a: a[0])
        t0, restarts, errors, every_error, status, bad = time.time(), 0, [], [], None, False
        while status is None:
            procs, failed_at = self.start_workers(spec, job, hosts, restarts), None
            while True:
                while actions and actions[0][0] <= time.time() - t0:
                    actions.pop(0)[1]()
                rcs = [p.poll() for p, _ in procs]
                if all(rc is not None for rc in rcs):
                    break
                if time.time() - t0 > JOB_DEADLINE:
                    status = "hang"
                elif any(rc not in (None, 0) for rc in rcs) and failed_at is None:
                    failed_at = time.time()
                if status == "hang" or (failed_at and time.time() - failed_at > 2):
                    for p, _ in procs:  # as torchrun's agent stops the rest of a failed group
                        if p.poll() is None:
                            os.killpg(p.pid, signal.SIGKILL)
                            p.wait()
                time.sleep(0.05)
            errors = []  # this round's: the error lines of tenplex.elastic (and of the state check)
            for p, out in procs:
                out.seek(0)
                errors += [ln for ln in out.read().splitlines() if ln.startswith(("tenplex.elastic", "campaign:"))]
                out.close()
                bad = bad or p.returncode == EXIT_BAD_STATE
            every_error += [(restarts, e[-300:]) for e in errors]
            rcs = [p.returncode for p, _ in procs]
            if status is None:
                if FATAL in rcs:
                    status = "fatal"
                elif all(rc == 0 for rc in rcs):
                    status = "finished"
                elif restarts >= MAX_RESTARTS:
                    status = "failed"
                else:
                    restarts += 1
        for _, fn in actions:
            fn()
        return {
            "status": status,
            "restarts": restarts,
            "errors": every_error[-4:],
            "last_errors": errors,
            "bad_state": bad,
            "seconds": round(time.time() - t0, 2),
        }

    # ---- the trials --------------------------------------------------------------------

    def kill_daemon(self, i, how="SIGKILL"):
        if how == "SIGKILL":
            self.daemons[i].kill()
        else:
            self.daemons[i].stop()

    def revive_daemon(self, i):
        if self.daemons[i].proc.poll() is not None:
            self.daemons[i] = self.start(i)

    def down_at_start_trial(self, n):
        rng = self.rng
        job, hosts, steps = "d%d" % n, rng.sample(range(4), 2), rng.randint(2, 5)
        victims = rng.sample(hosts, rng.choice([1, 2]))
        delays = [rng.uniform(0, 10) for _ in victims]
        result = {"op": "elastic job", "victims": victims, "delays": [round(d, 2) for d in delays], "steps": steps}
        first = self.launch(self.job_spec(job, steps, 1), job, hosts)
        if first["status"] != "finished":
            return dict(result, phase="first run", **self.judge_job(job, hosts, first, steps))
        for v in victims:
            self.kill_daemon(v)
        run = self.launch(
            self.job_spec(job, steps + 3, 1),
            job,
            hosts,
            [(d, lambda v=v: self.revive_daemon(v)) for v, d in zip(victims, delays)],
        )
        # back while the restore waited, or after it gave up (and the launcher restarted it)
        phase = "%d of 2 down, %s" % (len(victims), "back in time" if run["restarts"] == 0 else "failed start")
        return dict(result, phase=phase, **self.judge_job(job, hosts, run, steps + 3))

    def restart_mid_job_trial(self, n):
        rng = self.rng
        job, hosts, every = "m%d" % n, rng.sample(range(4), 2), rng.choice([1, 2])
        victim, how = rng.choice(hosts), rng.choice(["SIGKILL", "SIGTERM"])
        typical = sorted(self.job_durations)[len(self.job_durations) // 2] if self.job_durations else 8.0
        at, down = rng.uniform(0, 1.2 * typical), rng.uniform(0, 6)
        result = {
            "op": "elastic job",
            "victim": victim,
            "at": round(at, 2),
            "down": round(down, 2),
            "commit_every": every,
        }
        actions = [(at, lambda: self.kill_daemon(victim, how)), (at + down, lambda: self.revive_daemon(victim))]
        run = self.launch(self.job_spec(job, 10, every), job, hosts, actions)
        if run["status"] == "finished" and run["restarts"] == 0:
            self.job_durations.append(run["seconds"])
        phase = "%s %s" % (how, "during" if at < run["seconds"] else "after")
        return dict(result, phase=phase, **self.judge_job(job, hosts, run, 10))

    def judge_job(self, job, hosts, run, steps):
        """The outcome of a job's runs (its log holds every round's events)."""
        try:
            return self.judge_job_state(job, hosts, run, steps)
        finally:
            for d in self.daemons:  # free the daemons' memory for the next trials
                try:
                    d.call("DELETE", "/v1/jobs/" + job, timeout=30)
                except OSError:
                    pass

    def judge_job_state(self, job, hosts, run, steps):
        events = read_events(os.path.join(self.tmp, job + ".jsonl"))
        res = {
            "status": run["status"],
            "restarts": run["restarts"],
            "errors": run["errors"],
            "starts": [(e.get("version"), e.get("step")) for e in events if e["event"] == "elastic_start"],
        }
        silent = silent_starts(events)
        told = max([0] + [e["step"] for e in events if e["event"] == "commit"])
        crashed = self.crashed()
        if run["status"] == "hang":
            return dict(res, outcome="hang")
        if crashed:
            return dict(res, outcome="crash", detail="daemons %r died" % crashed)
        if silent:
            return dict(res, outcome="silent restart", detail="started at %r after a commit of step %d" % silent[0])
        if run["bad_state"]:
            return dict(res, outcome="data lost", detail="a worker restored wrong tensors")
        cluster = os.path.join(self.tmp, job + ".cluster.json")
        with open(cluster, "w") as f:
            json.dump({"hosts": [self.daemons[h].url for h in hosts], "gpus_per_host": 1}, f)
        jobs, left = self.recover(job, cluster)
        if left:
            return dict(res, outcome="orphans", detail=repr(left))
        newest = max([j["current"] or 0 for _, j in jobs])
        if newest == 0:
            if told > 0:
                return dict(res, outcome="data lost", detail="no version left after step %d was committed" % told)
            return dict(res, outcome="clean abort" if run["last_errors"] else "unclear")
        info = next(v["info"] for _, j in jobs for v in j["versions"] if v["version"] == newest)
        behind = self.behind(jobs, info, newest)
        if behind:
            return dict(res, outcome="split", detail="hosts %r not at version %d" % (behind, newest))
        if info["step"] < told:
            return dict(
                res,
                outcome="data lost",
                detail="version %d holds step %d, step %d was committed" % (newest, info["step"], told),
            )
        from tenplex import store

        for r, h in enumerate(hosts):
            tensors = store.attach(self.daemons[h].url).load_state(job, r, newest)
            bad = wrong_tensors(self.job_model, info["config"], r, info["step"], tensors)
            if bad:
                return dict(res, outcome="data lost", detail="rank %d of version %d: wrong %s" % (r, newest, bad[:3]))
        if run["status"] == "finished":
            if info["step"] != steps:
                return dict(res, outcome="data lost", detail="finished, but the newest step is %d" % info["step"])
            return dict(res, outcome="completed" if run["restarts"] == 0 else "recovered", step=info["step"])
        return dict(res, outcome="clean abort" if run["last_errors"] else "unclear", step=info["step"])
