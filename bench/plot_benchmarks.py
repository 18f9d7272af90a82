#!/usr/bin/env python3
"""Plots every docs/benchmarks/*.csv this script knows about into PNGs beside them:
dcp_peer.csv (bench/dcp_peer_bench.py), plan_scaling.csv (bench/plan_scaling.py),
failure_recovery.csv (bench/failure_recovery_bench.py), and
cluster_transform.csv through bench/plot_cluster_transform.py when that script exists.
Unknown CSVs are listed and skipped. Usage: plot_benchmarks.py [--dir docs/benchmarks]
"""

import argparse
import csv
import glob
import os
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def plot_dcp(path, out_dir):
    rows = read(path)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    series = [
        ("ours_s", "tenplex reshard (ours)", "tab:blue"),
        ("peer_s", "torch DCP load+save (peer)", "tab:orange"),
        ("fresh_mmap_memcpy_s", "memcpy into fresh mmap pages", "tab:green"),
        ("write_limit_s", "limit: write+fsync", "tab:gray"),
        ("limit_s", "limit: memcpy", "black"),
    ]
    series = [x for x in series if x[0] in rows[0]]
    width = 0.8 / len(series)
    for i, (key, label, color) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(rows))]
        ys = [float(r[key]) for r in rows]
        bars = ax.bar(xs, ys, width, label=label, color=color)
        for b, y in zip(bars, ys):
            ax.annotate(f"{y:.2f}", (b.get_x() + b.get_width() / 2, y), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(
        [
            f"{r['place']}\n{r['state_MB']} MB, {r['old_world']}->{r['new_world']} "
            f"ranks\nspeed-up {r['speedup_vs_peer']}x"
            for r in rows
        ]
    )
    ax.set_ylabel("seconds (lower is better)")
    ax.set_title("Re-partitioning a GPT + Adam checkpoint")
    top = max(float(r[k]) for r in rows for k, _, _ in series)
    ax.set_ylim(0, 1.35 * top)
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    ax.set_xlim(-0.6, len(rows) - 0.4)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "dcp_peer.png"), dpi=120)
    plt.close(fig)


def plot_plan(path, out_dir):
    rows = read(path)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    for ax, sweep, xkey, xlabel in [
        (axes[0], "layers", "layers", "model layers (ranks fixed)"),
        (axes[1], "world", "ranks_both", "old + new ranks (96 layers)"),
    ]:
        sel = [r for r in rows if r["sweep"] == sweep]
        xs = [int(r[xkey]) for r in sel]
        ax.plot(xs, [float(r["plan_ms"]) for r in sel], "o-", label="plan time (ours)")
        ax.axhline(1000.0, color="red", ls="--", label="goal: 1 s")
        for r, x in zip(sel, xs):
            ax.annotate(
                f"{float(r['plan_ms']):.0f}",
                (x, float(r["plan_ms"])),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                fontsize=8,
            )
        ax.set_xlabel(xlabel)
        ax.set_ylabel("ms")
        ax.set_ylim(0, max(1100, 1.15 * max([float(r["plan_ms"]) for r in sel] + [0])))
        ax.legend(fontsize=8, loc="upper left")
        ax.grid(alpha=0.3)
    fig.suptitle("Planner scaling, gpt3-175b shape, one core")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "plan_scaling.png"), dpi=120)
    plt.close(fig)


def plot_failure(path, out_dir):
    """Stacked seconds from the kill until the failed step is done again, per scenario
    and method, with the restart limit as a line over each group."""
    rows = read(path)
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    parts = [
        ("stop_s", "stop survivors", "tab:gray"),
        ("convert_s", "transform / reshard", "tab:purple"),
        ("restart_s", "restart to first step", "tab:blue"),
        ("rerun_s", "re-run lost steps", "tab:red"),
    ]
    fig, ax = plt.subplots(figsize=(8, 4.4))
    width = 0.8 / len(methods)
    labelled = set()
    for g, scen in enumerate(scenarios):
        group = [r for r in rows if r["scenario"] == scen]
        for i, m in enumerate(methods):
            r = next((x for x in group if x["method"] == m), None)
            if r is None:
                continue
            x = g + (i - (len(methods) - 1) / 2) * width
            bottom = 0.0
            for key, label, color in parts:
                v = float(r[key])
                ax.bar(x, v, width * 0.9, bottom=bottom, color=color, label=None if label in labelled else label)
                labelled.add(label)
                bottom += v
            ax.annotate(
                f"{m.replace('checkpoint ', 'ckpt ')}\n{bottom:.1f}s", (x, bottom), ha="center", va="bottom", fontsize=7
            )
        lim = float(group[0]["limit_s"])
        ax.hlines(
            lim,
            g - 0.45,
            g + 0.45,
            colors="black",
            linestyles="dashed",
            label=None if "limit" in labelled else "limit: fastest cold restart measured in the scenario",
        )
        labelled.add("limit")
    ax.set_xticks(range(len(scenarios)))
    ax.set_xticklabels(
        [
            f"{s}\n{next(r for r in rows if r['scenario'] == s)['from']} -> "
            f"{next(r for r in rows if r['scenario'] == s)['to']}"
            for s in scenarios
        ]
    )
    ax.set_ylabel("seconds from the kill until the failed step is done again")
    ax.set_title("Failure recovery: ours (store commits) vs restart from an L-step-old disk checkpoint", fontsize=9)
    ax.set_ylim(0, 1.5 * max(sum(float(r[k]) for k, _, _ in parts) for r in rows))
    ax.legend(fontsize=7, loc="upper center", ncol=3)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "failure_recovery.png"), dpi=130)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="docs/benchmarks")
    a = ap.parse_args()
    known = {"dcp_peer.csv": plot_dcp, "plan_scaling.csv": plot_plan, "failure_recovery.csv": plot_failure}
    here = os.path.dirname(os.path.abspath(__file__))
    for path in sorted(glob.glob(os.path.join(a.dir, "*.csv"))):
        name = os.path.basename(path)
        if name in known:
            known[name](path, a.dir)
            print(f"[plot] {name} -> {name[:-4]}.png")
        elif name == "cluster_transform.csv" and os.path.exists(os.path.join(here, "plot_cluster_transform.py")):
            subprocess.run(
                [sys.executable, os.path.join(here, "plot_cluster_transform.py"), "--dir", a.dir], check=True
            )
        else:
            print(f"[plot] {name}: no plot known, skipped")


if __name__ == "__main__":
    sys.exit(main())
