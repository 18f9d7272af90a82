"""tenplex.elastic's commit and restore against real store daemons, without torchrun.

usage: elastic_commit_test.py TENPLEX_BIN

The Job of every rank runs in a thread of this process over a fake process group
(ThreadGroup: the collectives of torch.distributed that elastic.py uses, by barrier);
each of 3 "hosts" is a `tenplex store serve --shm-dir` daemon behind a fault proxy
(fault_proxy.py), so a fault hits exactly one request of the commit.

- issue 34 finding 6 (the torchrun path's commit): for dp=3 and pp=3, a host killed
  before its commit request (then restarted on its shm dir), the first host killed
  before its commit, a commit's reply lost, a host stopped (SIGSTOP) before its commit
  (the coordinator gives up after its request timeout, 3 s here, not 600 s), a host
  killed before its prepare: after the
  fault the job restarts (new Jobs, restore) and every daemon ends on one version, that
  version holds one step's state (every rank's tensors are the values written at that
  step), the step the workers were told was committed is not lost, and a version is
  restored only when it is committed everywhere; the next commit succeeds.
- issue 34 finding 1: a job whose daemon is down at start waits for it (the daemon comes
  back on its shm dir 2 s later) and resumes at step 8, never step 0; with a short
  connect_timeout it fails naming the daemon instead of starting a new job.
- a commit after another coordinator committed a newer version is refused, naming both.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
from daemons import Daemon  # noqa: E402
from fault_proxy import FaultProxy  # noqa: E402

import torch  # noqa: E402

from tenplex import elastic  # noqa: E402

TENPLEX = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(HERE), "build", "bin", "tenplex")
JOB = "j"
failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        failures.append(what)


class ThreadGroup:
    """A process group of threads: rank = the thread's; every collective is an exchange
    of one object per rank through a barrier."""

    ReduceOp = types.SimpleNamespace(MIN="min", MAX="max")

    def __init__(self, n):
        self.n, self.slots, self.local = n, [None] * n, threading.local()
        self.barrier = threading.Barrier(n, timeout=120)

    def _exchange(self, obj):
        self.slots[self.local.rank] = obj
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out

    def is_initialized(self):
        return True

    def all_gather_object(self, out, obj):
        out[:] = self._exchange(obj)

    def broadcast_object_list(self, lst, src=0):
        lst[:] = self._exchange(list(lst))[src]

    def all_reduce(self, t, op):
        vals = torch.stack(self._exchange(t.clone()))
        t.copy_(vals.min(0).values if op == "min" else vals.max(0).values)

    def barrier_(self):
        self._exchange(None)

    def run(self, jobs, fn):
        """fn(job) on every rank's thread; [(result, exception)] by rank."""
        out = [(None, None)] * self.n

        def body(r):
            self.local.rank = r
            try:
                out[r] = (fn(jobs[r]), None)
            except BaseException as e:  # noqa: B036 (SystemExit too: reported, not raised)
                out[r] = (None, e)
                self.barrier.abort()

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.barrier.reset()
        return out


class Hosts:
    """n daemons, each with its own shm dir, each behind a fault proxy (its stable URL)."""

    def __init__(self, n):
        self.shm = [tempfile.mkdtemp(prefix="tenplex-ecommit-", dir="/dev/shm") for _ in range(n)]
        self.daemons = [Daemon(TENPLEX, args=("--shm-dir", d)) for d in self.shm]
        self.proxies = [FaultProxy() for _ in range(n)]
        for p, d in zip(self.proxies, self.daemons):
            p.point_at(d)
        self.urls = [p.url for p in self.proxies]

    def restart(self, i):
        self.daemons[i].kill()
        self.daemons[i] = Daemon(TENPLEX, args=("--shm-dir", self.shm[i]))
        self.proxies[i].point_at(self.daemons[i])

    def revive(self):
        """Restarts every daemon that died (on its shm dir)."""
        for i, d in enumerate(self.daemons):
            if d.proc.poll() is not None:
                self.restart(i)

    def current(self, i):
        j = self.daemons[i].get("/v1/jobs/" + JOB)
        return j["current"]

    def close(self):
        for d in self.daemons:
            d.kill()
        for p in self.proxies:
            p.close()
        for s in self.shm:
            shutil.rmtree(s, ignore_errors=True)


def make_jobs(urls, config, **kw):
    """One Job per host (1 rank per host) as torchrun's environment would make them."""
    n = len(urls)
    jobs = []
    for r in range(n):
        os.environ.update(WORLD_SIZE=str(n), RANK=str(r), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                          GROUP_RANK=str(r), TORCHELASTIC_RUN_ID="ecommit-test")
        jobs.append(elastic.Job(JOB, {str(n): config}, store_url=urls[r], token="", exit_on_fatal=False, **kw))
    return jobs


def state(step, rank):
    return {"w": torch.full((64,), float(step * 10 + rank)), "b": torch.arange(8, dtype=torch.float32) + step}


def commit_step(group, jobs, model, step):
    """Every rank commits step's state; [(version, exception)] by rank."""
    return group.run(jobs, lambda j: j.commit({"model": model, "config": j.config, "step": step},
                                              state(step, j.rank)))


def restore(group, jobs):
    return group.run(jobs, lambda j: j.restore())


def check_restored(hosts, got, told, what):
    """got: restore's [(Restored, exc)]: one step's state on every rank, not older than
    told (the last step the workers were told was committed), and the version current
    with that step on every daemon."""
    errs = [e for _, e in got if e is not None]
    check(not errs, f"{what}: restore succeeds ({errs[:1]})")
    if errs:
        return None
    steps = {r.step for r, _ in got}
    versions = {r.version for r, _ in got}
    check(len(steps) == 1 and len(versions) == 1, f"{what}: every rank restored one version/step ({versions}, {steps})")
    step, version = steps.pop(), versions.pop()
    check(step >= told, f"{what}: restored step {step} >= {told}, the last step the workers were told committed")
    ok = all(torch.equal(r.tensors["w"], state(step, rank)["w"]) and torch.equal(r.tensors["b"], state(step, rank)["b"])
             for rank, (r, _) in enumerate(got))
    check(ok, f"{what}: every rank's tensors are step {step}'s")
    cur = [hosts.current(i) for i in range(len(hosts.daemons))]
    check(cur == [version] * len(cur), f"{what}: every daemon's current version is {version} ({cur})")
    infos = [hosts.daemons[i].get(f"/v1/jobs/{JOB}/versions/{version}")["info"]["step"] for i in range(len(cur))]
    check(infos == [step] * len(cur), f"{what}: version {version} holds step {step} on every daemon ({infos})")
    return version


def commit_fault(model, config, host, rule, action):
    """issue 34 finding 6: a fault on one host's request of the commit of step 3 (a
    stopped daemon is killed and restarted after the commit gave up on it)."""
    what = f"{config}, {action} of {rule} on host {host}"
    hosts = Hosts(3)
    try:
        group = ThreadGroup(3)
        elastic.dist = group
        jobs = make_jobs(hosts.urls, config, connect_timeout=30, request_timeout=3)
        restore(group, jobs)
        told = 0
        for step in (1, 2):
            res = commit_step(group, jobs, model, step)
            if all(e is None for _, e in res):
                told = step
        check(told == 2, f"{what}: steps 1 and 2 committed")
        hosts.proxies[host].arm("POST", rule, action)
        res = commit_step(group, jobs, model, 3)
        if all(e is None for _, e in res):
            told = 3
        check(bool(hosts.proxies[host].hits), f"{what}: the fault fired ({hosts.proxies[host].hits})")
        if action == "stop-before":
            hosts.restart(host)
        hosts.revive()
        group = ThreadGroup(3)
        elastic.dist = group
        jobs = make_jobs(hosts.urls, config, connect_timeout=30)
        v = check_restored(hosts, restore(group, jobs), told, what + ": restart")
        if v is not None:
            res = commit_step(group, jobs, model, 4)
            check(all(e is None for _, e in res), f"{what}: the next commit succeeds ({[e for _, e in res if e]})")
            check([hosts.current(i) for i in range(3)] == [res[0][0]] * 3, f"{what}: every daemon on its version")
    finally:
        hosts.close()


def down_at_start(model):
    """issue 34 finding 1: the daemon is down when the job restarts; it comes back on the
    same shm dir 2 s later: the job resumes at step 8. With a short connect_timeout the
    job fails naming the daemon."""
    hosts = Hosts(1)
    try:
        group = ThreadGroup(1)
        elastic.dist = group
        jobs = make_jobs(hosts.urls, "tp=1", connect_timeout=30)
        restore(group, jobs)
        for step in range(1, 9):
            commit_step(group, jobs, model, step)
        hosts.daemons[0].kill()
        jobs = make_jobs(hosts.urls, "tp=1", connect_timeout=0.5)
        got = restore(group, jobs)
        e = got[0][1]
        check(isinstance(e, elastic.ElasticError) and hosts.urls[0] in str(e) and "do not answer" in str(e),
              f"daemon down, connect_timeout 0.5 s: an error naming it, not a new job ({e!r})")
        jobs = make_jobs(hosts.urls, "tp=1", connect_timeout=30)
        threading.Timer(2.0, hosts.restart, args=(0,)).start()
        t0 = time.time()
        got = restore(group, jobs)
        r, e = got[0]
        check(e is None and r is not None and r.step == 8 and time.time() - t0 >= 1.5,
              f"daemon back 2 s later: the job resumes at step 8 ({getattr(r, 'step', None)}, {e!r})")
        if r is not None:
            check(torch.equal(r.tensors["w"], state(8, 0)["w"]), "the restored tensors are step 8's")
            # another coordinator moves the job on: this job's commit is refused
            other = elastic._ec.connect(hosts.daemons[0].url, "")
            nv = other.begin_version(JOB, None, json.dumps({"model": model, "config": "tp=1,pp=1,dp=1", "step": 100}))
            other.commit(JOB, nv, False)
            res = commit_step(group, jobs, model, 9)
            e = res[0][1]
            check(isinstance(e, elastic.ElasticError) and f"version {nv} is current" in str(e)
                  and f"version {r.version}" in str(e), f"a commit over a newer version is refused ({e})")
    finally:
        hosts.close()


def main():
    with tempfile.TemporaryDirectory() as tmp:
        mpath = os.path.join(tmp, "m.json")
        subprocess.run([TENPLEX, "model", "gpt", "--num-layers", "3", "--hidden-size", "32",
                        "--num-attention-heads", "4", "--vocab-size", "64", "-o", mpath], check=True)
        with open(mpath) as f:
            model = json.load(f)
    os.environ.pop("TENPLEX_FATAL_FILE", None)
    t0 = time.time()
    down_at_start(model)
    commit = r"/versions/\d+/commit"
    prepare = r"/versions/\d+/prepare"
    for config in ("dp=3", "pp=3"):
        commit_fault(model, config, 1, commit, "kill-before")
    commit_fault(model, "pp=3", 0, commit, "kill-before")
    commit_fault(model, "dp=3", 1, commit, "drop-reply")
    commit_fault(model, "dp=3", 2, commit, "stop-before")
    commit_fault(model, "pp=3", 2, prepare, "kill-before")
    print(f"{'FAILED' if failures else 'passed'}: {len(failures)} failures, {time.time() - t0:.1f} s")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
