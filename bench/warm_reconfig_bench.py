#!/usr/bin/env python3
"""Reconfiguration end to end, cold workers against warm ones (`tenplex run --warm`).

Runs the demo (scripts/demo.sh: GPT 4 layers, hidden 64, examples/schedules/demo.json:
tp=2 -> tp=2,pp=2 -> dp=3,zero=1 -> kill rank 2, pp=2 -> tp=2,dp=2) twice per rep,
without and with --warm, and takes from the runner's log each reconfiguration's seconds
end to end, from the last step in the old config to the first step done in the new one
(the runner's "seconds": stop, transform, restart; with --warm the transform runs while
the workers re-join, overlapped). A change that adds no worker is what --warm makes fast
(the workers stay, only their process groups and state are new): goal <= 1.0 s. Changes
that add workers start those ahead, as spares while the old config trains. Also
reported: the new config's first step itself (its compute, part of the restart), and
the warm re-join's phases that rank 0 logs ("warm_join": park, wait for the message,
init_process_group, the model stage with its process groups, waiting for the
transformed state, mapping it). Both runs must give the same losses and samples as each
other (the runner's --baseline against the cold run).

Each measurement: the fastest and the median of --reps runs (phases: of the fastest).
Writes warm_reconfig.csv.
Usage: warm_reconfig_bench.py [--tenplex build/bin/tenplex] [--out docs/benchmarks] [--reps 2]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
from bench_csv import write_rows  # noqa: E402

REPO = os.path.abspath(os.path.join(HERE, ".."))
GOAL_S = 1.0
# The "warm_join" event's phases (python/tenplex/warm.py join_event).
JOIN_PHASES = ("park_s", "wait_s", "args_s", "init_pg_s", "trainer_s", "wait_in_s", "load_s")


def run(tenplex, tmp, model, name, warm, baseline=None):
    log = os.path.join(tmp, name + ".jsonl")
    cmd = [
        tenplex,
        "run",
        "--quiet",
        "--schedule",
        os.path.join(REPO, "examples/schedules/demo.json"),
        "--log",
        log,
        "--work-dir",
        os.path.join(tmp, name),
    ]
    cmd += ["--warm"] if warm else []
    cmd += ["--baseline", baseline] if baseline else []
    cmd += ["--json", "--", sys.executable, os.path.join(REPO, "examples/gpt/train.py"), "--model", model]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"tenplex run {name} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    summary = json.loads(p.stdout)
    with open(log) as f:
        lines = [json.loads(x) for x in f]
    recs = []
    for i, e in enumerate(lines):
        if e.get("event") != "reconfigure":
            continue
        # The first step done in the new config: the last step line before the event;
        # rank 0's warm re-join phases: its last "warm_join" before that.
        first = next(x for x in reversed(lines[:i]) if "event" not in x)
        join = next((x for x in reversed(lines[:i]) if x.get("event") == "warm_join"), None)
        if join is not None and join["step"] != e["step"]:
            join = None
        recs.append(dict(e, first_step_seconds=first["seconds"], join=join or {}))
    return recs, summary


def world(cfg):
    n = 1
    for kv in cfg.split(","):
        k, v = kv.split("=")
        if k in ("tp", "pp", "dp"):
            n *= int(v)
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tenplex", default="build/bin/tenplex")
    ap.add_argument("--out", default="docs/benchmarks")
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    tenplex = os.path.abspath(a.tenplex)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tenplex-warm-") as tmp:
        model = os.path.join(tmp, "model.json")
        subprocess.run(
            [
                tenplex,
                "model",
                "gpt",
                "--num-layers",
                "4",
                "--hidden-size",
                "64",
                "--num-attention-heads",
                "4",
                "--vocab-size",
                "256",
                "--max-position-embeddings",
                "64",
                "-o",
                model,
            ],
            check=True,
        )
        best, every = {}, {}
        baseline = None
        for rep in range(a.reps):
            for warm in (False, True):
                name = f"{'warm' if warm else 'cold'}-{rep}"
                recs, summary = run(tenplex, tmp, model, name, warm, baseline)
                if baseline is None:
                    baseline = os.path.join(tmp, name + ".jsonl")
                elif summary["sample_mismatches"] != 0 or summary["max_loss_deviation"] > 1e-5:
                    sys.exit(f"{name}: losses or samples differ from the cold run: {summary}")
                for i, r in enumerate(recs):
                    key = (i, warm)
                    every.setdefault(key, []).append(r["seconds"])
                    if key not in best or r["seconds"] < best[key]["seconds"]:
                        best[key] = r
        n = len([k for k in best if not k[1]])
        for i in range(n):
            cold, warm = best[(i, False)], best[(i, True)]
            added = max(0, world(cold["to"]) - world(cold["from"]) + len(cold.get("killed_ranks", [])))
            row = {
                "step": cold["step"],
                "from": cold["from"],
                "to": cold["to"],
                "after_failure": cold["after_failure"],
                "workers_added": added,
            }
            for tag, r in (("cold", cold), ("warm", warm)):
                for k in ("seconds", "stop_seconds", "transform_seconds", "restart_seconds"):
                    row[f"{tag}_{k.replace('_seconds', '')}_s"] = round(r[k], 3)
            row["cold_median_s"] = round(statistics.median(every[(i, False)]), 3)
            row["warm_median_s"] = round(statistics.median(every[(i, True)]), 3)
            # What is left beyond the new config's first step itself (its compute).
            row["warm_first_step_s"] = round(warm["first_step_seconds"], 3)
            row["warm_beyond_step_s"] = round(warm["seconds"] - warm["first_step_seconds"], 3)
            for k in JOIN_PHASES:
                row[f"warm_{k}"] = warm["join"].get(k, "")
            row["warm_vs_cold"] = round(warm["seconds"] / cold["seconds"], 2)
            row["warm_vs_cold_median"] = round(row["warm_median_s"] / row["cold_median_s"], 2)
            row["goal_s"] = GOAL_S if added == 0 else ""
            row["warm_vs_goal"] = round(warm["seconds"] / GOAL_S, 2) if added == 0 else ""
            rows.append(row)
            phases = " ".join(f"{k[:-2]} {warm['join'][k]:.3f}" for k in JOIN_PHASES if k in warm["join"])
            print(
                f"[warm] step {row['step']:>2} {row['from']:<22} -> {row['to']:<22} added {added}  "
                f"cold {cold['seconds']:.2f} s (stop {cold['stop_seconds']:.2f} + transform "
                f"{cold['transform_seconds']:.2f} + restart {cold['restart_seconds']:.2f})  "
                f"warm {warm['seconds']:.2f} s (stop {warm['stop_seconds']:.2f} + transform "
                f"{warm['transform_seconds']:.2f} + restart {warm['restart_seconds']:.2f})  "
                f"(first step {warm['first_step_seconds']:.2f}, the rest {row['warm_beyond_step_s']:.2f})  "
                f"x{row['warm_vs_cold']:.2f} of cold; medians cold {row['cold_median_s']:.2f} warm "
                f"{row['warm_median_s']:.2f}; re-join: {phases}"
                + (f"  x{row['warm_vs_goal']:.2f} of the {GOAL_S:.1f} s goal" if added == 0 else ""),
                flush=True,
            )
    write_rows(a.out, "warm_reconfig.csv", rows, "warm")
    return 0


if __name__ == "__main__":
    sys.exit(main())
