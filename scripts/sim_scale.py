#!/usr/bin/env python3
"""Predictions of `tenplex simulate` at the Tenplex paper's scale and at 1k-100k GPUs (issue 36, item 3).

    .venv/bin/python scripts/sim_scale.py paper [--json F]   the paper's Fig. 14 changes on 16 GPUs
    .venv/bin/python scripts/sim_scale.py scale [--sizes 1024,16384,100352] [--models gpt3-175b,llama3-405b]
        [--repeats 2] [--mode auto|full|sample] [--json F]  lose a host, -10 %, TP change at each size

Each scenario is written to a temporary file and run through `tenplex simulate --json`; the
script prints a markdown table and writes every result (scenario, prediction, critical host,
checkpoint comparison) to --json, which scripts/sim_plot.py reads.

`paper`: GPT-3 2.7B and 6.7B (the presets with 16-bit parameters and fp32 Adam, Megatron-LM's
mixed precision) from (tp, pp, dp) = (4, 2, 1) on 8 GPUs to (8, 2, 1), (4, 4, 1)
and (4, 2, 2) on 16 GPUs, 4 GPUs per host, as in the artifact of the paper's Fig. 14
(kungfu-team/tenplex, benchmark/reconfiguration_parallelization). The paper's NIC rate was
not found, so each row is predicted at 10, 25 and 100 Gbit/s.

`scale`: GPT-3 175B (the preset: fp32 with Adam) and a Llama-3-405B-style model
(LLAMA3_405B below: 126 layers, hidden 16384, FFN 53248 SwiGLU, 128 heads with 8
key/value groups, vocab 128256, RMSNorm, RoPE, untied output, bf16 parameters with fp32
Adam) at tp=8, pp=16 and dp = GPUs / 128, 8 GPUs per host. Llama's 126 layers go 7 + 8·14 + 7
over 16 stages (one layer fewer on the first and last, as Llama 3 did), and 3 + 4·30 + 3 over
32. Changes: host 5 lost (dp - 1, its replica re-planned from the others), scaling down by
10 % of dp, and tp=8,pp=16 -> tp=4,pp=32 on the same GPUs. Hardware as in docs/scale.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")

# The assumed hardware of docs/scale.md's "First predictions"; PFS: Llama 3's Tectonic, 2 TB/s.
SCALE_HW = {
    "nic_gbit_s": 400,
    "latency_us": 5,
    "rpc_us": 50,
    "copy_gbyte_s": 20,
    "memory_gbyte_s": 20,
    "map_gbyte_s": 50,
    "pfs_gbyte_s": 2000,
    # The coordinator plans on 64 threads (a GPU host has 2 x 56 cores, e.g. a DGX H100):
    # the simulator fits one thread's time and this machine's to that (simulate.h).
    "coordinator_threads": 64,
}
# `tenplex model gpt` arguments of each model, and its layers.
LLAMA3_405B = [
    "--num-layers",
    "126",
    "--hidden-size",
    "16384",
    "--ffn-hidden-size",
    "53248",
    "--num-attention-heads",
    "128",
    "--num-query-groups",
    "8",
    "--vocab-size",
    "128256",
    "--position-embedding-type",
    "rope",
    "--swiglu",
    "--disable-bias-linear",
    "--untie-embeddings-and-output-weights",
    "--normalization",
    "RMSNorm",
    "--params-dtype",
    "bf16",
    "--max-position-embeddings",
    "8192",
]
MODELS = {
    "gpt3-175b": (["--preset", "gpt3-175b"], 96),
    "llama3-405b": (LLAMA3_405B, 126),
    "gpt3-2.7b-fp16": (["--preset", "gpt3-2.7b", "--params-dtype", "fp16"], 32),
    "gpt3-6.7b-fp16": (["--preset", "gpt3-6.7b", "--params-dtype", "fp16"], 32),
}

# The paper's Fig. 14 (reconfiguration seconds, Tenplex / Tenplex-Central), from the
# artifact's plot script (benchmark/reconfiguration_parallelization/plot.py).
PAPER = {
    ("2.7b", "dp"): (11.5, 39.0),
    ("2.7b", "tp"): (10.5, 28.5),
    ("2.7b", "pp"): (5.9, 18.2),
    ("6.7b", "dp"): (24.2, 96.1),
    ("6.7b", "tp"): (20.2, 74.0),
    ("6.7b", "pp"): (10.8, 38.0),
}
PAPER_TO = {"tp": "tp=8,pp=2,dp=1", "pp": "tp=4,pp=4,dp=1", "dp": "tp=4,pp=2,dp=2"}
PAPER_NICS = [10, 25, 100]


def layers(n_layers: int, pp: int) -> str:
    """',layers=...' for an uneven split: the remainder taken from the first and last stages."""
    if n_layers % pp == 0:
        return ""
    per = -(-n_layers // pp)  # ceil
    short = per * pp - n_layers
    if short > 2:
        sys.exit("no split of %d layers over %d stages with at most 2 short ones" % (n_layers, pp))
    split = [per] * pp
    split[0] -= 1
    if short == 2:
        split[-1] -= 1
    return ",layers=" + "+".join(map(str, split))


def model_file(args: argparse.Namespace, name: str) -> str:
    """The model's JSON (`tenplex model gpt`), made once in the run's temporary directory."""
    path = os.path.join(args.tmp, name + ".json")
    if not os.path.exists(path):
        subprocess.run([args.tenplex, "model", "gpt", *MODELS[name][0], "-o", path], check=True)
    return path


def simulate(tenplex: str, scen: dict[str, Any], repeats: int = 1) -> dict[str, Any]:
    """The run with the fastest total of `repeats` (the measured costs vary ±30 % on a loaded machine)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(scen, f)
    try:
        runs = []
        for _ in range(repeats):
            t0 = time.time()
            p = subprocess.run([tenplex, "simulate", f.name, "--json"], capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit("tenplex simulate failed on %s:\n%s" % (json.dumps(scen), p.stderr))
            out = json.loads(p.stdout)
            out["sim_wall_seconds"] = time.time() - t0
            runs.append(out)
        return min(runs, key=lambda r: r["prediction"]["total_seconds"])
    finally:
        os.unlink(f.name)


def summary(label: dict[str, Any], scen: dict[str, Any], sim: dict[str, Any]) -> dict[str, Any]:
    """What the tables and the plot use of one simulation."""
    pred = sim["prediction"]
    crit = next(h for h in sim["hosts"] if h["host"] == pred["critical_host"])
    ck = sim.get("checkpoint_restart", {})
    return {
        **label,
        "scenario": scen,
        "mode": sim["mode"],
        "from_ranks": sim["from_ranks"],
        "to_ranks": sim["to_ranks"],
        "cross_host_bytes": sim["plan"]["bytes_cross_host"],
        "state_bytes": ck.get("state_bytes", 0),
        "max_in": max(h["bytes_in"] for h in sim["hosts"]),
        "max_out": max(h["bytes_out"] for h in sim["hosts"]),
        "prediction": pred,
        "critical": crit["seconds"],
        "checkpoint": ck,
        "measured": sim["measured"],
        "sim_wall_seconds": sim["sim_wall_seconds"],
    }


def run_paper(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for size in ("2.7b", "6.7b"):
        for change in ("tp", "pp", "dp"):
            for nic in PAPER_NICS:
                scen = {
                    "model": model_file(args, "gpt3-%s-fp16" % size),
                    "from": {"config": "tp=4,pp=2,dp=1", "gpus_per_host": 4},
                    "to": {"config": PAPER_TO[change], "gpus_per_host": 4, "hosts": 4},
                    "cluster": dict(SCALE_HW, nic_gbit_s=nic),
                    "sim": {"mode": "full"},
                }
                label = {"model": "gpt3-" + size, "change": change, "nic_gbit_s": nic, "paper": PAPER[(size, change)]}
                rows.append(summary(label, scen, simulate(args.tenplex, scen)))
    print(
        "| model | change | cross-host GB | busiest host in / out GB | predicted s at 10 / 25 / 100 Gbit/s "
        "(fetch s at 10) | paper: Tenplex / central s |"
    )
    print("|---|---|---|---|---|---|")
    for i in range(0, len(rows), len(PAPER_NICS)):
        g = rows[i : i + len(PAPER_NICS)]
        r = g[0]
        print(
            "| %s | %s: tp=4,pp=2,dp=1 -> %s | %.1f | %.1f / %.1f | %s (%.1f) | %.1f / %.1f |"
            % (
                r["model"],
                r["change"].upper(),
                PAPER_TO[r["change"]],
                r["cross_host_bytes"] / 1e9,
                r["max_in"] / 1e9,
                r["max_out"] / 1e9,
                " / ".join("%.1f" % x["prediction"]["total_seconds"] for x in g),
                r["critical"]["fetch"],
                *r["paper"],
            )
        )
    return rows


def scale_changes(n_layers: int, dp: int) -> list[tuple[str, str, str, list[int]]]:
    """(label, from, to, lost hosts) at tp=8, pp=16, dp."""
    frm = "tp=8,pp=16,dp=%d%s" % (dp, layers(n_layers, 16))
    down = round(dp * 0.9)
    return [
        ("lose host 5 (dp %d -> %d)" % (dp, dp - 1), frm, "tp=8,pp=16,dp=%d%s" % (dp - 1, layers(n_layers, 16)), [5]),
        (
            "scale down: dp %d -> %d (%+.1f %%)" % (dp, down, 100.0 * (down - dp) / dp),
            frm,
            "tp=8,pp=16,dp=%d%s" % (down, layers(n_layers, 16)),
            [],
        ),
        ("TP change: tp=4,pp=32,dp=%d" % dp, frm, "tp=4,pp=32,dp=%d%s" % (dp, layers(n_layers, 32)), []),
    ]


def plan_cell(r: dict[str, Any]) -> str:
    """Coordinator (on its threads) / each agent / the whole plan on one thread: sampled
    runs have no whole plan (its cells are the slowest kind's per-host plan, bracketed)."""
    m, p = r["measured"], r["prediction"]
    if r["mode"] == "sample":
        return "(%.2f) / %.2f / -" % (p["coordinator_plan_seconds"], m["critical_host_plan_seconds"])
    return "%.2f / %.2f / %.2f" % (
        p["coordinator_plan_seconds"],
        m["critical_host_plan_seconds"],
        m.get("plan_seconds_one_thread") or m.get("plan_seconds_here") or m["plan_seconds"],
    )


def heap_cell(r: dict[str, Any]) -> str:
    m = r["measured"]
    own = m["critical_host_plan_heap_bytes"] / 2**20
    if r["mode"] == "sample":
        return "%.1f / -" % own
    return "%.1f / %.0f" % (own, m["plan_heap_bytes"] / 2**20)


def run_scale(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for name in args.models.split(","):
        model, n_layers = model_file(args, name), MODELS[name][1]
        for gpus in (int(x) for x in args.sizes.split(",")):
            if gpus % 128:
                sys.exit("--sizes: %d is not a multiple of tp·pp = 128" % gpus)
            for change, frm, to, lost in scale_changes(n_layers, gpus // 128):
                scen = {
                    "model": model,
                    "from": {"config": frm, "gpus_per_host": 8},
                    "to": {"config": to, "gpus_per_host": 8},
                    "cluster": dict(SCALE_HW, lost_hosts=lost),
                    "sim": {"mode": args.mode},
                }
                reps = args.repeats if gpus <= 40000 else 1  # a sampled 100k run takes minutes
                r = summary({"model": name, "gpus": gpus, "change": change}, scen, simulate(args.tenplex, scen, reps))
                print(
                    "  %s %d %s: %.1f s predicted (%s mode, simulated in %.0f s)"
                    % (name, gpus, change, r["prediction"]["total_seconds"], r["mode"], r["sim_wall_seconds"]),
                    file=sys.stderr,
                    flush=True,
                )
                rows.append(r)
    print_scale_table(rows)
    return rows


def print_scale_table(rows: list[dict[str, Any]]) -> None:
    """The markdown table of docs/scale.md from run_scale's rows (or its --json file)."""
    print(
        "| model | GPUs | change | cross-host TiB | busiest host in / out GiB | control s | last request out s "
        "| plan s: coordinator (plan + digests) / each agent's own part / the whole plan (agents before) "
        "| agent's plan heap MiB: own part / whole "
        "| critical host's prepare s (alloc + fetch + seal) | total s "
        "| restart read at 2 TB/s: every rank / once s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        p, c, ck = r["prediction"], r["critical"], r["checkpoint"]
        print(
            (
                "| %s | %d -> %d | %s | %.1f | %.0f / %.0f | %.1f | %.1f | %s | %s "
                "| %.1f (%.1f + %.1f + %.1f) | %.1f | %.1f / %.1f |"
            )
            % (
                r["model"],
                r["from_ranks"],
                r["to_ranks"],
                r["change"],
                r["cross_host_bytes"] / 2**40,
                r["max_in"] / 2**30,
                r["max_out"] / 2**30,
                p["control_seconds"],
                c["start"],
                plan_cell(r),
                heap_cell(r),
                c["prepare"],
                c["alloc"],
                c["fetch"],
                c["seal"],
                p["total_seconds"],
                ck["read_seconds"],
                ck["state_read_seconds"],
            )
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["paper", "scale"])
    ap.add_argument("--tenplex", default=os.path.join(ROOT, "build", "bin", "tenplex"))
    ap.add_argument("--sizes", default="1024,16384,100352")
    ap.add_argument("--models", default="gpt3-175b,llama3-405b")
    ap.add_argument("--repeats", type=int, default=2, help="runs per scenario up to 40k GPUs: the fastest counts")
    ap.add_argument(
        "--mode",
        choices=["auto", "full", "sample"],
        default="auto",
        help="`scale`: the simulator's sim.mode (auto samples hosts above 40k ranks, which leaves out "
        "the coordinator's whole plan; full runs it: about 2 min and 6 GB at 100k GPUs)",
    )
    ap.add_argument("--json")
    args = ap.parse_args()
    scale_models = [m for m in MODELS if not m.endswith("fp16")]  # the fp16 ones are the paper's
    for m in args.models.split(","):
        if m not in scale_models:
            sys.exit("--models: unknown %r (known: %s)" % (m, ", ".join(scale_models)))
    if not all(x.isdigit() and int(x) > 0 for x in args.sizes.split(",")):
        sys.exit("--sizes: a comma-separated list of GPU counts, got %r" % args.sizes)
    with tempfile.TemporaryDirectory(prefix="sim-scale-") as args.tmp:
        rows = run_paper(args) if args.what == "paper" else run_scale(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
