#!/usr/bin/env python3
"""Plot of predicted reconfiguration time against GPU count (issue 36): docs/scale-time.svg.

    .venv/bin/python scripts/sim_plot.py [--results bench/sim/scale.json] [--before bench/sim/scale-before.json]
        [-o docs/scale-time.svg]

Reads the results that `scripts/sim_scale.py scale --json F` wrote (one `tenplex simulate`
per model, size and change) and draws, for each model and change, the predicted total and
the critical host's own part (its start excluded), against the restart's checkpoint read at
the PFS bandwidth (every new rank reading its shards, and the state read once). With
--before (a results file of the same scenarios from an earlier build; "" for none), its
totals too, faded: the curve before issue 36's fixes of the coordinator and the per-host
planner. Log-log axes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

plt.rcParams["svg.fonttype"] = "none"  # text as text: a smaller file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
MARKERS = {"lose": "o", "scale": "s", "TP": "^"}


def kind(change: str) -> str:
    return change.split()[0].rstrip(":")


def by_series(rows: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Rows per (model, kind of change), by GPU count."""
    series: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        series[(r["model"], kind(r["change"]))].append(r)
    for pts in series.values():
        pts.sort(key=lambda r: r["gpus"])
    return series


def plot(rows: list[dict[str, Any]], before: list[dict[str, Any]], out: str) -> None:
    series = by_series(rows)
    earlier = by_series(before)
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.8), sharey=True, squeeze=False)
    for ax, model in zip(axes[0], models):
        for (m, k), pts in sorted(series.items()):
            if m != model:
                continue
            x = [r["gpus"] for r in pts]
            label = {"lose": "lose a host", "scale": "scale down 10 %", "TP": "TP 8 -> 4"}.get(k, k)
            line = ax.plot(
                x,
                [r["prediction"]["total_seconds"] for r in pts],
                marker=MARKERS.get(k, "x"),
                label="%s: total" % label,
            )[0]
            ax.plot(
                x,
                [r["critical"]["prepare"] for r in pts],
                marker=MARKERS.get(k, "x"),
                linestyle=":",
                color=line.get_color(),
                label="%s: critical host's prepare" % label,
            )
            old = earlier.get((m, k), [])
            if old:
                ax.plot(
                    [r["gpus"] for r in old],
                    [r["prediction"]["total_seconds"] for r in old],
                    marker=MARKERS.get(k, "x"),
                    linestyle="--",
                    alpha=0.35,
                    color=line.get_color(),
                    label="%s: total before the fixes" % label,
                )
        ck = sorted(
            (r["gpus"], r["checkpoint"]["read_seconds"])
            for r in rows
            if r["model"] == model and kind(r["change"]) == "scale"
        )
        if ck:
            ax.plot(
                [g for g, _ in ck],
                [s for _, s in ck],
                color="black",
                linestyle="--",
                marker="+",
                label="restart: every rank reads its shards at 2 TB/s",
            )
        once = sorted(
            (r["gpus"], r["checkpoint"]["state_read_seconds"])
            for r in rows
            if r["model"] == model and kind(r["change"]) == "scale"
        )
        if once:
            ax.plot(
                [g for g, _ in once],
                [s for _, s in once],
                color="gray",
                linestyle="-.",
                marker="+",
                label="restart: the state read once (no broadcast)",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(model)
        ax.set_xlabel("GPUs (8 per host)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("predicted seconds")
    axes[0][-1].legend(fontsize=6, loc="upper left")
    fig.suptitle(
        "tenplex simulate: reconfiguration time against GPU count (400 Gbit/s NICs, 20 GB/s memory)", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(out)


def load(path: str) -> list[dict[str, Any]]:
    """The rows of a `sim_scale.py scale --json` file, or exit naming what is wrong."""
    try:
        with open(path) as f:
            rows = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        sys.exit("cannot read %s (run scripts/sim_scale.py scale --json %s first): %s" % (path, path, e))
    if not isinstance(rows, list) or not rows or any(not isinstance(r, dict) or "gpus" not in r for r in rows):
        sys.exit("%s: not the output of `sim_scale.py scale`" % path)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", default=os.path.join(ROOT, "bench", "sim", "scale.json"))
    ap.add_argument("--before", default=os.path.join(ROOT, "bench", "sim", "scale-before.json"))
    ap.add_argument("-o", "--output", default=os.path.join(ROOT, "docs", "scale-time.svg"))
    args = ap.parse_args()
    rows = load(args.results)
    before = load(args.before) if args.before else []
    plot(rows, before, args.output)
    print("wrote", args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
