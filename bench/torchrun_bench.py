#!/usr/bin/env python3
"""A reconfiguration under torchrun, split into its parts, against a DP-only restart from
a disk checkpoint (what torchrun users do today).

usage: torchrun_bench.py [--bin build/bin/tenplex] [--hidden 32] [--layers 2] [--out DIR]

Both runs are the same elastic job under torchrun (`python -m torch.distributed.run`) on 3 loopback
"hosts" (nproc 2 each, c10d rendezvous on host 0, monitor interval 0.5 s): 2 hosts
train, at step 3 host 2 joins (its agent already started, so its join is immediate),
the agents stop their workers (SIGTERM), the workers commit at the step boundary and the
new world of 6 starts. Parts, from the log events' wall-clock times:

- detection: the join until the workers' commit begins (the agents' monitor tick, the
  step in progress, the all-reduced stop flag);
- stop: commit and exit (tenplex: 2PC into the per-host daemons; baseline: rank 0
  writes a checkpoint directory);
- restart: worker exit to the new workers' restore (rendezvous, interpreters, imports,
  process group); `process` of it is inside the new worker processes;
- transform: tenplex: the distributed transform tp=2,pp=2 -> tp=2,dp=3 (coordinator
  included); baseline: none (data parallelism only, dp=4 -> dp=6);
- load: tenplex: mapping the rank's tensors from its daemon; baseline: every rank reads
  the checkpoint file;
- first step: the first training step of the new world.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))
from torchrun_elastic_test import Host, free_port, read_log, wait_for  # noqa: E402

PARTS = ["detection", "stop", "restart", "process", "transform", "load", "first_step", "total"]


def run(mode, tenplex, tmp, model, policy_map, extra):
    work = os.path.join(tmp, mode)
    os.makedirs(work)
    policy = os.path.join(work, "policy.json")
    with open(policy, "w") as f:
        json.dump(policy_map, f)
    log, go, rdzv = os.path.join(work, "log.jsonl"), os.path.join(work, "go"), free_port()
    extra = ["--steps", "400", *extra]
    hosts = []
    try:
        hosts = [Host(i, tenplex, REPO, work, rdzv, model, policy, log, extra=extra) for i in range(2)]
        hosts.append(Host(2, tenplex, REPO, work, rdzv, model, policy, log, go_file=go, extra=extra))
        procs = [(f"agent {h.index}", h.agent) for h in hosts]
        if not wait_for("step 3", lambda: any(s["step"] >= 3 for s in read_log(log)[0]), 300, procs):
            raise SystemExit(f"{mode}: the job did not reach step 3")
        t_go = time.time()
        open(go, "w").close()

        def first_step_on_6():
            steps, events = read_log(log)
            return any(s.get("world_size") == 6 for s in steps)

        if not wait_for("a step on 6 ranks", first_step_on_6, 300, procs):
            raise SystemExit(f"{mode}: no step on 6 ranks")
    finally:
        for h in hosts:
            h.stop()
    steps, events = read_log(log)
    stop = next((e for e in events if e["event"] == "elastic_stop"), None)
    if stop is None:
        raise SystemExit(
            f"{mode}: the workers did not stop at a step boundary (a step longer than the agent's "
            "30 s SIGTERM grace?): use a smaller model"
        )
    commit = [e for e in events if e["event"] == "commit" and e["time"] <= stop["time"]][-1]
    exit_ = next(e for e in events if e["event"] == "elastic_exit")
    start = next(e for e in events if e["event"] == "elastic_start" and e["world_size"] == 6)
    first = next(s for s in steps if s.get("world_size") == 6)
    restore_begin = start["time"] - start["gather_seconds"] - start["transform_seconds"] - start["load_seconds"]
    parts = {
        "detection": stop["time"] - commit["seconds"] - t_go,
        "stop": exit_["time"] - (stop["time"] - commit["seconds"]),
        "restart": restore_begin - exit_["time"],
        "process": start["process_seconds"],
        "transform": start["gather_seconds"] + start["transform_seconds"],
        "load": start["load_seconds"],
        "first_step": first["seconds"],
    }
    parts["total"] = (
        parts["detection"] + parts["stop"] + parts["restart"] + parts["transform"] + parts["load"] + parts["first_step"]
    )
    return {k: round(v, 3) for k, v in parts.items()}, start


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(REPO, "build/bin/tenplex"))
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--out", help="write torchrun_bench.json there")
    a = ap.parse_args()
    tenplex = os.path.abspath(a.bin)
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model.json")
        subprocess.run(
            [
                tenplex,
                "model",
                "gpt",
                "--num-layers",
                str(a.layers),
                "--hidden-size",
                str(a.hidden),
                "--num-attention-heads",
                "4",
                "--vocab-size",
                "128",
                "--max-position-embeddings",
                "32",
                "-o",
                model,
            ],
            check=True,
        )
        ckpt = os.path.join(tmp, "ckpt")
        os.makedirs(ckpt)
        results = {}
        results["tenplex"], s1 = run(
            "tenplex", tenplex, tmp, model, {"4": "tp=2,pp=2", "6": "tp=2,dp=3"}, ["--commit-every", "1000"]
        )
        results["disk_dp"], s2 = run(
            "disk",
            tenplex,
            tmp,
            model,
            {"4": "dp=4", "6": "dp=6"},
            ["--commit-every", "1000", "--disk-checkpoint", ckpt],
        )
    print(
        f"model: {a.layers} layers, hidden {a.hidden}; tenplex moved {s1.get('bytes_moved')} bytes "
        f"({s1.get('from')} -> {s1.get('config')})"
    )
    print("| part (s) | tenplex (tp=2,pp=2 -> tp=2,dp=3) | disk checkpoint (dp=4 -> dp=6) |")
    print("|---|---|---|")
    for p in PARTS:
        print(f"| {p} | {results['tenplex'][p]:.3f} | {results['disk_dp'][p]:.3f} |")
    ratio = results["disk_dp"]["total"] / results["tenplex"]["total"]
    print(f"total: disk / tenplex = {ratio:.2f} (same run, same machine)")
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "torchrun_bench.json"), "w") as f:
            json.dump({"hidden": a.hidden, "layers": a.layers, "results": results, "ratio": ratio}, f, indent=1)


if __name__ == "__main__":
    main()
