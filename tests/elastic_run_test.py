"""End to end: an elastic schedule (tensor and pipeline changes, a killed worker) gives the
same samples and losses, step by step, as a static run of the same steps.

usage: elastic_run_test.py TENPLEX_BIN REPO_ROOT [--cluster]

With --cluster the elastic run keeps its state in 2 store daemons (1 GPU per host), so
every reconfiguration is a distributed transform over UCX between them; the static
run uses the embedded store.
"""
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


def run(tenplex, repo, tmp, name, schedule, model, baseline=None, cluster=None):
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
    cmd += ["--", "/usr/bin/python3", os.path.join(repo, "examples/gpt/train.py"), "--model", model,
            "--global-batch-size", "8", "--micro-batch-size", "2", "--seq-length", "32"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    print(p.stdout)
    if p.returncode != 0:
        print(p.stderr)
        raise SystemExit(f"tenplex run {name} failed with {p.returncode}")
    return log, p.stdout


def main():
    tenplex, repo = sys.argv[1], sys.argv[2]
    use_cluster = len(sys.argv) > 3 and sys.argv[3] == "--cluster"
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
            log, out = run(tenplex, repo, tmp, "elastic", elastic, model, baseline=static_log, cluster=cluster)
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
        configs = {got[s]["config"] for s in got}
        check(configs == {"tp=2,pp=1,dp=1", "tp=1,pp=1,dp=2,zero=1"}, f"final configs per step: {sorted(configs)}")
        fails = [e for e in events if e["event"] == "failure"]
        check(len(fails) == 1 and fails[0]["killed_ranks"] == [1], f"one failure event for rank 1: {fails}")
        reconf = [e for e in events if e["event"] == "reconfigure"]
        check(len(reconf) == 2 and all(e["bytes_moved"] > 0 for e in reconf), f"two reconfigurations: {reconf}")
        check("largest loss deviation" in out, "summary table compares with the static run")
    print(f"{1 if not failures else 0} passed, {len(failures)} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
