#!/usr/bin/env python3
"""Failure recovery (paper Fig. 11): resuming after killed workers from the state in
the store, against restarting from the last on-disk checkpoint.

A GPT job (examples/gpt/train.py, CPU, gloo) runs on 4 workers (tp=2,dp=2); in the
middle of step F the benchmark kills 1 or 2 of them and the job goes on with the
workers that are left (3: dp=3; 2: tp=2). A third case keeps the state in 2 store
daemons (2 GPUs each; `tenplex run --cluster`) and loses host 1, its daemon with its
workers: the state comes back from the data-parallel replica on host 0.

  ours        `tenplex run --commit-every N`: the workers commit their state into the
              store every N steps while they train; after the kill the runner stops
              the survivors, transforms the last commit to the new config in the store
              and starts the new workers, which re-run the steps since that commit.
              Measured from the runner's log: stop, transform, restart (new workers to
              their first step) and `recovered` (kill until step F is done again).
  checkpoint  what a job without a state store does (Megatron-LM): its last on-disk
              checkpoint is L steps old; after the same stop it converts that
              checkpoint to the new config (`tenplex reshard`, already faster than a
              single-process converter), starts the new workers loading it, and re-runs
              the L lost steps until step F is done again. L = 0 is a checkpoint taken
              right before the failure; the paper's baseline loses 50 steps on average.
  ours --warm `tenplex run --warm --commit-every N`: the same, but the survivors stay
              alive: their collectives are aborted, they park, join the new world in the
              same process and map their new state from the store (no new process
              when the survivors fill the new config; docs/runtime.md).
  limit       the restart every design that restarts its workers pays: new worker
              processes, rendezvous, loading or mapping the state and one step: the
              fastest restart measured in the scenario by the cold methods (ours and
              checkpoint; Python and torch start-up on a busy 2-core machine varies by
              a second or more from run to run). `ours --warm` / limit is the gain of
              keeping the survivors (goal: <= 0.5).
  beyond      total minus the method's own restart: stop, convert and re-run, the part
              that depends on the design and not on process start-up noise.
Each measurement is run --reps times and the fastest run counts, for every method.

Also reported: the cost of one periodic commit into the store against one disk
checkpoint save, and the step time, from the same runs.

Usage: failure_recovery_bench.py [--tenplex build/bin/tenplex] [--out docs/benchmarks]
       [--quick] [--fail-step F] [--lost 0,5,10] [--commit-every 1] [--no-warm]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from bench_csv import write_rows

from tenplex.runlog import read_run_log
from tenplex.testing import Daemon, write_cluster

HERE = os.path.dirname(os.path.abspath(__file__))

REPO = os.path.abspath(os.path.join(HERE, ".."))
PY = sys.executable  # the project interpreter (.venv/bin/python) that runs this file
TRAIN = os.path.join(REPO, "examples", "gpt", "train.py")
LAUNCH = os.path.join(REPO, "examples", "gpt", "launch.py")
FROM = "tp=2,dp=2"
# (name, killed ranks, new config, lost host): "lose host 1 of 2" keeps the state in 2
# store daemons (2 GPUs each) and kills host 1's daemon with its workers: the state
# comes back from the data-parallel replica on host 0.
SCENARIOS = [
    ("kill 1 of 4", [3], "dp=3", False),
    ("kill 2 of 4", [2, 3], "tp=2", False),
    ("lose host 1 of 2", [2, 3], "tp=2", True),
]
ARGS = None


def log(*a):
    print(*a, flush=True)


def train_args(model):
    return ["--model", model, "--global-batch-size", "12", "--micro-batch-size", "3", "--seq-length", "32"]


def read_log(path):
    """(steps by number, events); nothing yet when the log does not exist (tenplex.runlog)."""
    return read_run_log(path, missing_ok=True)


def run(cmd, what):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{what} failed ({p.returncode}):\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    return p


def ours(tmp, model, killed, to, fail_step, lose_host, warm=False):
    """One elastic run with a kill in step fail_step; its timings from the log."""
    name = f"ours-{to}" + ("-host" if lose_host else "") + ("-warm" if warm else "")
    sched = os.path.join(tmp, name + ".json")
    kill = {"kill_hosts": [1]} if lose_host else {"kill_ranks": killed}
    with open(sched, "w") as f:
        json.dump(
            [
                {"step": 0, "config": FROM},
                {"step": fail_step + 1, "config": to, **kill},
                {"step": fail_step + 3, "stop": True},
            ],
            f,
        )
    logf = os.path.join(tmp, name + ".jsonl")
    if os.path.exists(logf):
        os.remove(logf)  # (tenplex run appends: each rep reads its own run)
    daemons, where = [], []
    if lose_host:
        daemons = [Daemon(ARGS.tenplex) for _ in range(2)]
        cluster = os.path.join(tmp, "cluster.json")
        write_cluster(cluster, daemons, 2)
        where = ["--cluster", cluster]
    try:
        run(
            [
                ARGS.tenplex,
                "run",
                "--quiet",
                "--schedule",
                sched,
                "--log",
                logf,
                "--work-dir",
                os.path.join(tmp, name),
                *where,
                "--commit-every",
                str(ARGS.commit_every),
                *(["--warm"] if warm else []),
                "--",
                PY,
                TRAIN,
                *train_args(model),
            ],
            "tenplex run " + name,
        )
    finally:
        for d in daemons:
            d.stop()
    steps, events = read_log(logf)
    fail = [e for e in events if e["event"] == "failure"]
    rec = [e for e in events if e["event"] == "reconfigure" and e["after_failure"]]
    back = [e for e in events if e["event"] == "recovered"]
    if len(fail) != 1 or len(rec) != 1 or len(back) != 1 or fail[0]["during_step"] != fail_step:
        sys.exit(f"{name}: expected one failure in step {fail_step}, its reconfiguration and recovery: {events}")
    r, b = rec[0], back[0]
    commits = [e["seconds"] for e in events if e["event"] == "commit" and e["step"] < fail_step]
    step_s = [s["seconds"] for k, s in steps.items() if 0 < k < fail_step]
    return {
        "lost_steps": b["lost_steps"],
        "stop_s": r["stop_seconds"],
        "convert_s": r["transform_seconds"],
        "restart_s": r["restart_seconds"],
        "rerun_s": max(0.0, b["seconds"] - r["seconds"]),  # (with --warm the transform overlaps the restart)
        "total_s": b["seconds"],
        "save_s": statistics.median(commits) if commits else 0.0,
        "step_s": statistics.median(step_s) if step_s else 0.0,
        "bytes_moved": r["bytes_moved"],
        "bytes_total": r["bytes_total"],
    }


def checkpoint_restart(tmp, model, to, fail_step, lost, stop_s):
    """Checkpoint at step fail_step - lost in the old config (not timed), then the timed
    recovery: reshard it on disk, start the new workers from it, re-run to fail_step."""
    ck = fail_step - lost
    base = os.path.join(ARGS.disk_dir, f"ckpt-{to}-{lost}")
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    old, new = os.path.join(base, "old"), os.path.join(base, "new")
    setup_log = os.path.join(base, "setup.jsonl")
    run(
        [PY, LAUNCH, "--config", FROM, *train_args(model), "--steps", str(ck), "--save-dir", old, "--log", setup_log],
        f"training {FROM} to the checkpoint at step {ck}",
    )
    _, events = read_log(setup_log)
    saves = [e["seconds"] for e in events if e["event"] == "checkpoint"]
    run(["sync"], "sync")
    logf = os.path.join(base, "resume.jsonl")
    t0 = time.perf_counter()
    run([ARGS.tenplex, "reshard", "--quiet", "--in", old, "--to", to, "--out", new], f"reshard to {to}")
    run(["sync"], "sync")
    t1 = time.perf_counter()
    p = subprocess.Popen(
        [PY, LAUNCH, "--config", to, *train_args(model), "--load-dir", new, "--steps", str(lost + 1), "--log", logf],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = done = None
    while done is None:
        steps, _ = read_log(logf)
        now = time.perf_counter()
        if first is None and ck in steps:
            first = now
        if fail_step in steps:
            done = now
            break
        if p.poll() is not None:
            break
        time.sleep(0.01)
    err = p.communicate()[1]
    if done is None or p.returncode != 0:
        sys.exit(f"restart from the checkpoint at step {ck} failed ({p.returncode}):\n{err[-3000:]}")
    shutil.rmtree(base, ignore_errors=True)
    return {
        "lost_steps": lost,
        "stop_s": stop_s,
        "convert_s": t1 - t0,
        "restart_s": first - t1,
        "rerun_s": done - first,
        "total_s": stop_s + (done - t0),
        "save_s": statistics.median(saves) if saves else 0.0,
    }


def best(measure):
    """The fastest of --reps runs (restarts of Python workers vary by a second or more)."""
    return min((measure() for _ in range(max(1, ARGS.reps))), key=lambda m: m["total_s"])


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tenplex", default="build/bin/tenplex")
    ap.add_argument("--out", default="docs/benchmarks")
    ap.add_argument("--quick", action="store_true", help="a smaller model, failure in step 4, L = 0,3")
    ap.add_argument("--fail-step", type=int, default=10)
    ap.add_argument("--lost", default="0,5,10", help="steps the on-disk checkpoint is behind")
    ap.add_argument("--commit-every", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3, help="runs per measurement; the fastest counts (for every method)")
    ap.add_argument("--no-warm", action="store_true", help="leave out `ours --warm` (survivors kept alive)")
    ap.add_argument("--disk-dir", default=None, help="checkpoints on disk (default ../.tenplex-bench-failure)")
    ARGS = ap.parse_args()
    ARGS.tenplex = os.path.abspath(ARGS.tenplex)
    ARGS.disk_dir = os.path.abspath(ARGS.disk_dir or os.path.join(REPO, "..", ".tenplex-bench-failure"))
    lost = [int(x) for x in ARGS.lost.split(",")]
    if ARGS.quick:
        ARGS.fail_step, lost = 4, [0, 3]
    if ARGS.fail_step < max(lost) or ARGS.fail_step < 2 or ARGS.commit_every < 1:
        sys.exit("need --fail-step >= 2 and >= every --lost value, and --commit-every >= 1")
    rows = []
    with tempfile.TemporaryDirectory(prefix="tenplex-failure-") as tmp:
        model = os.path.join(tmp, "model.json")
        hidden, layers, vocab = (64, 2, 256) if ARGS.quick else (128, 4, 1024)
        run(
            [
                ARGS.tenplex,
                "model",
                "gpt",
                "--num-layers",
                str(layers),
                "--hidden-size",
                str(hidden),
                "--num-attention-heads",
                "8",
                "--vocab-size",
                str(vocab),
                "--max-position-embeddings",
                "64",
                "-o",
                model,
            ],
            "tenplex model gpt",
        )
        log(
            f"[failure] GPT {layers} layers, hidden {hidden}, vocab {vocab}, Adam; {FROM} on 4 workers, "
            f"kill in step {ARGS.fail_step}; ours commits every {ARGS.commit_every} step(s)"
        )
        for scen, killed, to, lose_host in SCENARIOS:
            o = best(lambda: ours(tmp, model, killed, to, ARGS.fail_step, lose_host))
            entries = [("ours", o)]
            for L in lost:
                entries.append(
                    (
                        f"checkpoint L={L}",
                        best(lambda: checkpoint_restart(tmp, model, to, ARGS.fail_step, L, o["stop_s"])),
                    )
                )
            # The limit of a design that restarts its workers: the fastest restart of the
            # cold methods. `ours --warm` keeps the survivors alive and is measured against it.
            limit = min(m["restart_s"] for _, m in entries)
            if not ARGS.no_warm:
                entries.insert(
                    1, ("ours --warm", best(lambda: ours(tmp, model, killed, to, ARGS.fail_step, lose_host, warm=True)))
                )
            ours_beyond = o["total_s"] - o["restart_s"]
            for method, m in entries:
                beyond = m["total_s"] - m["restart_s"]
                row = {
                    "scenario": scen,
                    "from": FROM,
                    "to": to,
                    "killed_ranks": "+".join(map(str, killed)) + (" and host 1's daemon" if lose_host else ""),
                    "method": method,
                    "lost_steps": m["lost_steps"],
                    "stop_s": round(m["stop_s"], 3),
                    "convert_s": round(m["convert_s"], 3),
                    "restart_s": round(m["restart_s"], 3),
                    "rerun_s": round(m["rerun_s"], 3),
                    "total_s": round(m["total_s"], 3),
                    "limit_s": round(limit, 3),
                    "ratio_to_limit": round(m["total_s"] / limit, 2),
                    "vs_ours": round(m["total_s"] / o["total_s"], 2),
                    "beyond_restart_s": round(beyond, 3),
                    "beyond_vs_ours": round(beyond / max(ours_beyond, 1e-3), 1),
                    "save_s": round(m["save_s"], 4),
                    "step_s": round(o["step_s"], 3),
                    "state_bytes": o["bytes_total"],
                    "ours_bytes_copied": o["bytes_moved"],
                }
                rows.append(row)
                log(
                    f"[failure] {scen} {FROM} -> {to}  {method:<17} lost {m['lost_steps']:>2}  "
                    f"stop {m['stop_s']:.2f} + convert {m['convert_s']:.2f} + restart {m['restart_s']:.2f} + "
                    f"re-run {m['rerun_s']:.2f} = {m['total_s']:.2f} s   limit {limit:.2f} s  "
                    f"x{row['ratio_to_limit']:.2f} of limit  x{row['vs_ours']:.2f} of ours  "
                    f"beyond restart {beyond:.2f} s (x{row['beyond_vs_ours']:.1f} of ours)   "
                    f"{'commit' if method.startswith('ours') else 'save'} {m['save_s']:.3f} s "
                    f"(step {o['step_s']:.2f} s)"
                )
    write_rows(ARGS.out, "failure_recovery.csv", rows, "failure")
    return 0


if __name__ == "__main__":
    sys.exit(main())
