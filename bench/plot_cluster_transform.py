#!/usr/bin/env python3
"""Plots docs/benchmarks/cluster_transform.csv (bench/cluster_transform_bench.py):
cluster_transform_dims.png (per dimension: ours, central baseline, limits) and
cluster_transform_size.png (against the number of hosts).

Usage: plot_cluster_transform.py [--dir docs/benchmarks]
"""

import argparse
import csv
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def bars(ax, rows, labels, title):
    series = [
        ("ours", "ours_s", "#1f77b4"),
        ("central baseline", "central_s", "#d62728"),
        ("limit: link + memcpy per host", "limit_s", "#2ca02c"),
        ("limit: with new memory per host", "alloc_limit_s", "#bcbd22"),
        ("limit: this machine, all at once", "machine_limit_s", "#98df8a"),
    ]
    series = [x for x in series if x[1] in rows[0]]
    width = 0.8 / len(series)
    for k, (name, key, color) in enumerate(series):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(rows))]
        ys = [float(r[key]) for r in rows]
        ax.bar(xs, ys, width, label=name, color=color)
        if key == "ours_s":
            for x, y, r in zip(xs, ys, rows):
                ax.annotate(
                    "%.1fx\nfaster" % float(r["speedup_vs_central"]), (x, y), ha="center", va="bottom", fontsize=8
                )
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=9)
    ax.set_ylabel("seconds")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.set_ylim(0, max(float(r["central_s"]) for r in rows) * 1.25)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="docs/benchmarks")
    args = ap.parse_args()
    path = os.path.join(args.dir, "cluster_transform.csv")
    with open(path) as f:
        rows = list(csv.DictReader(f))
    dims = [r for r in rows if r["figure"] == "dims"]
    size = [r for r in rows if r["figure"] == "size"]
    if dims:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        bars(
            ax,
            dims,
            ["%s change\n%s -> %s" % (r["case"], r["from"], r["to"]) for r in dims],
            "Reconfiguration of %s with Adam (fp32), 4 store daemons x 2 GPUs" % dims[0].get("model", "a GPT"),
        )
        fig.tight_layout()
        fig.savefig(os.path.join(args.dir, "cluster_transform_dims.png"), dpi=110)
        print("wrote", os.path.join(args.dir, "cluster_transform_dims.png"))
    if size:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        bars(
            ax,
            size,
            ["%s hosts\n%s -> %s" % (r["hosts"], r["from"], r["to"]) for r in size],
            "TP change over all GPUs against cluster size (2 GPUs per host)",
        )
        fig.tight_layout()
        fig.savefig(os.path.join(args.dir, "cluster_transform_size.png"), dpi=110)
        print("wrote", os.path.join(args.dir, "cluster_transform_size.png"))


main()
