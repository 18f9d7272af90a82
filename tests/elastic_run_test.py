"""End to end: an elastic schedule (tensor and pipeline changes, a killed worker) gives the
same samples and losses, step by step, as a static run of the same steps.

usage: elastic_run_test.py TENPLEX_BIN REPO_ROOT [--cluster] [--commit-every N]

With --cluster the elastic run keeps its state in 2 store daemons (1 GPU per host), so
every reconfiguration is a distributed transform over UCX between them; the static
run uses the embedded store. With --commit-every N the workers also commit their state
every N steps while they train on, so the killed worker costs at most the steps since
the last commit, and the checks include the commits and the recovery.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemons import Daemon, write_cluster  # noqa: E402


def steps_of(log):
    last = {}
    events = []
    with open(log) as f:
        for line in f:
            j = json.loads(line)
            if "event" in j:
                events.append(j)
            else:
                last[j["step"]] = j
    return last, events


def run(tenplex, repo, tmp, name, schedule, model, baseline=None, cluster=None, commit_every=0):
    sched = os.path.join(tmp, name + ".json")
    with open(sched, "w") as f:
        json.dump(schedule, f)
    log = os.path.join(tmp, name + ".jsonl")
    cmd = [tenplex, "run", "--schedule", sched, "--log", log, "--work-dir", os.path.join(tmp, name),
           "--hang-seconds", "240"]
    if baseline:
        cmd += ["--baseline", baseline]
    if cluster:
        cmd += ["--cluster", cluster]
    if commit_every:
        cmd += ["--commit-every", str(commit_every)]
    cmd += ["--", "/usr/bin/python3", os.path.join(repo, "examples/gpt/train.py"), "--model", model,
            "--global-batch-size", "8", "--micro-batch-size", "2", "--seq-length", "32"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    print(p.stdout)
    if p.returncode != 0:
        print(p.stderr)
        raise SystemExit(f"tenplex run {name} failed with {p.returncode}")
    return log, p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tenplex")
    ap.add_argument("repo")
    ap.add_argument("--cluster", action="store_true")
    ap.add_argument("--commit-every", type=int, default=0)
    a = ap.parse_args()
    tenplex, repo, use_cluster, commit_every = a.tenplex, a.repo, a.cluster, a.commit_every
    failures = []
    daemons = []

    def check(cond, what):
        print(("ok: " if cond else "FAIL: ") + what)
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        cluster = None
        if use_cluster:
            daemons = [Daemon(tenplex) for _ in range(2)]
            cluster = os.path.join(tmp, "cluster.json")
            write_cluster(cluster, daemons, 1)
        model = os.path.join(tmp, "model.json")
        subprocess.run([tenplex, "model", "gpt", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
                        "--num-query-groups", "2", "--swiglu", "--vocab-size", "200", "--make-vocab-size-divisible-by", "16",
                        "--max-position-embeddings", "32", "-o", model], check=True)
        n = 6
        static_log, _ = run(tenplex, repo, tmp, "static", [{"step": 0, "config": "tp=1"}, {"step": n, "stop": True}], model)
        elastic = [{"step": 0, "config": "tp=2"},
                   {"step": 2, "config": "pp=2"},
                   {"step": 4, "config": "dp=2,zero=1", "kill_ranks": [1]},
                   {"step": n, "stop": True}]
        try:
            log, out = run(tenplex, repo, tmp, "elastic", elastic, model, baseline=static_log, cluster=cluster,
                           commit_every=commit_every)
        finally:
            for d in daemons:
                d.stop()
        base, _ = steps_of(static_log)
        got, events = steps_of(log)
        check(sorted(got) == list(range(n)), f"every step logged: {sorted(got)}")
        check(sorted(base) == list(range(n)), "static run logged every step")
        for s in range(n):
            if s not in got or s not in base:
                continue
            check(got[s]["samples"] == base[s]["samples"], f"step {s}: same samples")
            rel = abs(got[s]["loss"] - base[s]["loss"]) / abs(base[s]["loss"])
            check(rel <= 1e-3, f"step {s}: loss {got[s]['loss']:.6f} vs static {base[s]['loss']:.6f} (rel {rel:.2e})")
        fails = [e for e in events if e["event"] == "failure"]
        configs = {got[s]["config"] for s in got}
        want_cfgs = {"tp=2,pp=1,dp=1", "tp=1,pp=1,dp=2,zero=1"}
        if fails and fails[0]["rerun_from"] > 2:
            want_cfgs.add("tp=1,pp=2,dp=1")  # step 2 was committed before the kill: not re-run
        check(configs == want_cfgs, f"final configs per step: {sorted(configs)}")
        check(len(fails) == 1 and fails[0]["killed_ranks"] == [1], f"one failure event for rank 1: {fails}")
        reconf = [e for e in events if e["event"] == "reconfigure"]
        check(len(reconf) == 2 and all(e["bytes_moved"] > 0 for e in reconf), f"two reconfigurations: {reconf}")
        check("largest loss deviation" in out, "summary table compares with the static run")
        recovered = [e for e in events if e["event"] == "recovered"]
        check(len(recovered) == 1 and recovered[0]["step"] == 3 and recovered[0]["seconds"] > 0,
              f"one recovery, back at the killed step 3: {recovered}")
        commits = sorted(e["step"] for e in events if e["event"] == "commit")
        if commit_every:
            # Segments [0,2) [2,4) (killed in step 3) [3,4) again [4,6): the periodic
            # commits inside them, and each segment's end.
            f = fails[0] if fails else {}
            lost = f.get("during_step", 0) - f.get("rerun_from", 0)
            check(f.get("segment_start") == 2 and 0 <= lost <= commit_every,
                  f"the failure re-runs only the steps since the last periodic commit: {f}")
            after = [e for e in reconf if e["after_failure"]]
            check(len(after) == 1 and after[0]["lost_steps"] == lost and after[0]["step"] == f.get("rerun_from"),
                  f"the reconfiguration after the failure starts at the commit: {after}")
            want = {1, 2, 3, 4, 5, 6} if commit_every == 1 else {2, 4, 6}
            check(want <= set(commits), f"commit events at {sorted(want)}: {commits}")
            check(recovered and recovered[0]["lost_steps"] == lost, "recovery counts the same lost steps")
        else:
            check(fails and fails[0]["rerun_from"] == fails[0]["segment_start"] == 2,
                  f"without periodic commits the failed segment re-runs from its start: {fails}")
    print(f"{1 if not failures else 0} passed, {len(failures)} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
