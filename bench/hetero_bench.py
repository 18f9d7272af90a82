#!/usr/bin/env python3
"""Heterogeneous devices: even split vs `tenplex run --rebalance` vs the FlexTP-style
per-step offload, against the ideal bound measured in the same run (issue 14).

  hetero_bench.py [--tenplex build/bin/tenplex] [--out docs/benchmarks] [--quick]
                  [--only tp=2:2] [--steps N] [--window W] [--repeat N] [--keep DIR [--reuse]]

For each case (tp=2, tp=4, dp=2, and pp=2: two pipeline stages of an 8-layer model, 4
micro-batches, stage 1 slowed, rebalanced with layers=) and slowdown factor F of rank 1
(1.5, 2, 3; emulated
with train.py --slowdown 1=F, examples/gpt/meter.py) it measures, with the reference
client on this machine (CPU, gloo, one torch thread per rank):

  even, rebalanced  ONE `tenplex run --rebalance` from the even config, so that both
              phases run within a minute of each other under the same machine load: the
              even phase is the first segment (steps 1 .. W-1; step 0 warms up), the
              policy rebalances at its commit at step W, and the rebalanced phase is
              every step after it (the first step of each new segment excluded); when the
              policy moves a second time (its speed model, fitted over both splits,
              corrects the first move), the steps of the final split when there are 3.
              Step times are medians over these windows.
  ideal       the bound of a phase from its own steps: work / sum of the measured
              speeds (rank r's pace: the median of rank_seconds_r / its share of the
              work; every device busy for the same time on a perfectly divisible job)
              plus the phase's median non-compute time (step seconds - the slowest
              rank's own compute). `ideal_s` is the even phase's (the issue's bound);
              the rebalanced phase's own bound gives `rebalanced_over_ideal`, which a
              change of machine load between the phases does not bias (both of its
              terms come from the same steps), and `even_over_rebalanced_normalized`
              = (even_s / ideal_s) / (rebalanced_s / rebalanced_ideal_s), the speedup
              at equal machine speed. `rebalanced_over_even_ideal` and
              `even_over_rebalanced` are the raw cross-phase ratios.
  fixed part  each rank's fixed + proportional parts (seconds = a + b·frac) fitted
              over the splits of the run, shown as a's fraction of the even split's
              time, and the bound of such a job (`affine_ideal_s`: every rank's predicted
              time equal, continuous shares, plus the median non-compute time), which
              no split beats when a part of the work does not divide.
  rebalance cost  the reconfigure event's seconds (stop + transform + restart of the
              workers, to the first step done) less one rebalanced step. The runs use
              `tenplex run --warm` (the workers park at the stop and re-join; --cold:
              they restart).
  flextp      (tp cases) launch.py --flextp-straggler 1 right after: the straggler keeps
              12.5% of its input columns, helpers compute the rest every step
              (flextp.py); median of its steps after the first.

Goals (issue 14): rebalanced <= 1.15 x ideal (rebalanced_over_ideal); even / rebalanced >= 1.4 at F = 2 for
tp=2 (at most 1.5 there, when all work divides). The decision uses --rebalance-cost 0
(the measured cost is reported; the decision rule with the measured cost is tested in
tests/hetero_train_test.py): the bench measures the split's speed, not the
cost-benefit choice on a short run.

The model is small (a step of the whole model ~0.6 s of one core, fastest seen) so that the full
table runs in ~21 minutes on the 2-core machine shared with other work, but wide
(32 query groups, 1024 MLP rows) so that tp_weights can follow the measured speeds
closely. Timings on a shared machine stay noisy: the slowdown is a sleep, so a slowed
rank holds no core, but the ranks compete with everything else running, so the measured
speeds move with the machine's load (and a rank's core may be busier than another's:
the measured imbalance of the even phase can exceed F). Hence the per-phase bounds, and
--repeat N (the median of N runs per row).
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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))
from bench_csv import write_rows  # noqa: E402

from tenplex import layout as L  # noqa: E402
from tenplex.runlog import read_run_log  # noqa: E402

PY = sys.executable  # the project interpreter (.venv/bin/python) that runs this file
GPT = os.path.join(ROOT, "examples", "gpt")
MODEL = [
    "--num-layers",
    "2",
    "--hidden-size",
    "128",
    "--num-attention-heads",
    "32",
    "--num-query-groups",
    "32",
    "--ffn-hidden-size",
    "1024",
    "--vocab-size",
    "512",
    "--max-position-embeddings",
    "64",
]
# One micro-batch per rank (dp_weights change a dp rank's sample count, not its batches).
GLOBAL_BATCH = 16
REUSE = False  # --reuse: read the logs a --keep directory holds instead of running
COLD = False  # --cold: rebalance without --warm
TRAIN = [
    "--global-batch-size",
    str(GLOBAL_BATCH),
    "--micro-batch-size",
    str(GLOBAL_BATCH),
    "--seq-length",
    "32",
    "--threads",
    "1",
]
# The pp case: 8 layers (so that layers= can follow the speeds: 4+4 even), 4 micro-batches
# of 4 samples (GPipe: the stages overlap on micro-batches; with one there is no pipeline).
PP_MODEL = ["--num-layers", "8"] + MODEL[2:]
PP_TRAIN = ["--global-batch-size", str(GLOBAL_BATCH), "--micro-batch-size", "4", "--seq-length", "32", "--threads", "1"]


def case_args(config):
    """(model name, train args) of a case: the pp case has its own model and micro-batches."""
    return ("pp_model.json", PP_TRAIN) if config.startswith("pp=") else ("model.json", TRAIN)


def log(*a):
    print("[hetero]", *a, flush=True)


def fractions(tenplex, model, config, cache={}):  # noqa: B006 - the default is the memo, shared by design
    """Each rank's share of the step's work under `config`: its tp share (the bytes of
    its layout, numel-weighted like the policy's shares; replicated norms count alike)
    times its dp rank's share of the global batch (spec §9 apportionment)."""
    if config not in cache:
        j = json.loads(
            subprocess.run(
                [tenplex, "layout", "--model", model, "--config", config, "--json"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        )
        c = L.Config.parse(config)
        n = L.apportion(GLOBAL_BATCH, c.dp_weights or [1] * c.dp)
        w = [r["bytes"] * n[r["dp"]] for r in j["ranks"]]
        cache[config] = [x / sum(w) for x in w]
    return cache[config]


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def launch(tmp, config, model, steps, tag, extra):
    path = os.path.join(tmp, tag + ".jsonl")
    cmd = (
        [
            PY,
            os.path.join(GPT, "launch.py"),
            "--config",
            config,
            "--model",
            model,
            "--steps",
            str(steps),
            "--log",
            path,
            "--timeout",
            "900",
        ]
        + case_args(config)[1]
        + list(extra)
    )
    if not (REUSE and os.path.exists(path)):
        fresh(path)
        subprocess.run(cmd, check=True, capture_output=True)
    return read_run_log(path)


def fresh(path):
    """Removes a log a --keep directory holds from an earlier run (logs are appended to)."""
    if os.path.exists(path):
        os.remove(path)


def rebalanced(tenplex, tmp, config, model, steps, window, factor, tag):
    sched = os.path.join(tmp, tag + ".json")
    with open(sched, "w") as f:
        json.dump([{"step": 0, "config": config, "slowdown": {"1": factor}}, {"step": steps, "stop": True}], f)
    path = os.path.join(tmp, tag + ".jsonl")
    cmd = [
        tenplex,
        "run",
        "--schedule",
        sched,
        "--log",
        path,
        "--work-dir",
        os.path.join(tmp, tag),
        "--quiet",
        "--rebalance",
        "--rebalance-window",
        str(window),
        "--rebalance-cost",
        "0",
        "--hang-seconds",
        "900",
    ]
    cmd += (
        ([] if COLD else ["--warm"])
        + ["--", PY, os.path.join(GPT, "train.py"), "--model", model]
        + case_args(config)[1]
    )
    if not (REUSE and os.path.exists(path)):
        fresh(path)
        shutil.rmtree(os.path.join(tmp, tag), ignore_errors=True)
        subprocess.run(cmd, check=True, capture_output=True)
    return read_run_log(path)


def phase(a, model, steps):
    """A phase's median step seconds and its ideal bound, work / sum of the measured
    speeds: rank r's pace (seconds per whole step's work) is the median over the phase
    of rank_seconds_r / frac_r (frac_r: its share of the work under the step's config);
    the bound is the median non-compute time (step seconds - the slowest rank's own
    compute) plus 1 / sum_r (1 / pace_r): every device busy for the same time on a
    perfectly divisible job. Speeds and step times come from the same steps."""
    world = len(steps[0]["rank_seconds"])
    pace = [
        med([x["rank_seconds"][r] / fractions(a.tenplex, model, x["config"])[r] for x in steps]) for r in range(world)
    ]
    other = med([x["seconds"] - max(x["rank_seconds"]) for x in steps])
    return med([x["seconds"] for x in steps]), other + 1.0 / sum(1.0 / p for p in pace)


def speed_model(a, model, steps):
    """Each rank's fixed and proportional part, seconds = fixed + per_work · frac, fitted
    by least squares over the splits the steps ran (their medians per config); None for a
    rank whose share did not move by 10%. Also the bound of such a job: the step time
    when every rank's predicted time is equal (continuous shares, Σ frac = 1), plus the
    steps' median non-compute time."""
    by = {}
    for x in steps:
        by.setdefault(x["config"], []).append(x)
    world = len(steps[0]["rank_seconds"])
    pts = [
        (fractions(a.tenplex, model, c), [med([x["rank_seconds"][r] for x in xs]) for r in range(world)])
        for c, xs in by.items()
    ]
    fit = []
    for r in range(world):
        fs, ts = [p[0][r] for p in pts], [p[1][r] for p in pts]
        mf, mt = statistics.mean(fs), statistics.mean(ts)
        sxx = sum((x - mf) ** 2 for x in fs)
        if len(pts) < 2 or sxx < (0.1 * mf) ** 2:
            return None, None
        b = sum((x - mf) * (y - mt) for x, y in zip(fs, ts)) / sxx
        fit.append((mt - b * mf, b))
    if any(b <= 0 for _, b in fit):
        return fit, None
    lo, hi = 0.0, max(f0 + b for f0, b in fit)
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if sum(max(0.0, (mid - f0) / b) for f0, b in fit) < 1 else (lo, mid)
    other = med([x["seconds"] - max(x["rank_seconds"]) for x in steps])
    return fit, other + hi


def measure(a, tmp, config, f, rep=0):
    """One row: FlexTP-style (tp cases), then the rebalance run (even, rebalanced)."""
    model = os.path.join(tmp, case_args(config)[0])
    tag = f"{config.replace(',', '_').replace('=', '')}-{f}" + (f"-r{rep}" if rep else "")
    row = {"case": config, "slowdown": f}
    flex_s = None
    if config.startswith("tp="):
        fs, _ = launch(
            tmp, config, model, a.flextp_steps, tag + "-flextp", ["--slowdown", f"1={f}", "--flextp-straggler", "1"]
        )
        flex_s = med([fs[s]["seconds"] for s in sorted(fs) if s >= 1])
    steps, events = rebalanced(a.tenplex, tmp, config, model, a.steps, a.window, f, tag + "-reb")
    reb = [e for e in events if e["event"] == "rebalance"]
    first = reb[0]["step"] if reb else a.steps
    even = [steps[s] for s in sorted(steps) if 1 <= s < first]
    world = len(even[0]["rank_seconds"])
    even_s, ideal_s = phase(a, model, even)
    even_x = even_s / ideal_s
    row.update(
        {
            "world": world,
            "even_steps": len(even),
            "even_s": round(even_s, 4),
            "ideal_s": round(ideal_s, 4),
            "even_over_ideal": round(even_x, 3),
            "even_rank_seconds": "/".join(f"{med([x['rank_seconds'][r] for x in even]):.3f}" for r in range(world)),
        }
    )
    keys = (
        "rebalances",
        "rebalanced_to",
        "rebalanced_steps",
        "rebalanced_s",
        "rebalanced_ideal_s",
        "rebalanced_over_ideal",
        "rebalanced_over_even_ideal",
        "even_over_rebalanced",
        "even_over_rebalanced_normalized",
        "rebalance_cost_s",
        "rebalance_transform_s",
        "rebalance_bytes",
    )
    row.update({k: "" for k in keys + ("fixed_fraction", "affine_ideal_s", "rebalanced_over_affine_ideal")})
    if reb:
        # After the first rebalance, each segment's first step (new workers) excluded; a
        # later rebalance on noise refines the split within this phase.
        starts = {e["step"] for e in reb}
        after = [steps[s] for s in sorted(steps) if s > first and s not in starts]
        # The final split's steps (after a correcting second move), when there are 3.
        final = [x for x in after if x["step"] > reb[-1]["step"]]
        reb_s, reb_ideal = phase(a, model, final if len(final) >= 3 else after)
        reb_x = reb_s / reb_ideal
        rec = [e for e in events if e["event"] == "reconfigure" and e["step"] == first]
        row.update(
            {
                "rebalances": len(reb),
                "rebalanced_to": " > ".join(e["to"].split(",")[-1] for e in reb),
                "rebalanced_steps": len(final if len(final) >= 3 else after),
                "rebalanced_s": round(reb_s, 4),
                "rebalanced_ideal_s": round(reb_ideal, 4),
                "rebalanced_over_ideal": round(reb_x, 3),
                "rebalanced_over_even_ideal": round(reb_s / ideal_s, 3),
                "even_over_rebalanced": round(even_s / reb_s, 3),
                "even_over_rebalanced_normalized": round(even_x / reb_x, 3),
                "rebalance_cost_s": round(rec[0]["seconds"] - reb_s, 3) if rec else "",
                "rebalance_transform_s": round(reb[0]["transform_seconds"], 4),
                "rebalance_bytes": reb[0]["bytes_moved"],
            }
        )
        # The fixed part: fitted over the even and the rebalanced splits of this run.
        fit, affine = speed_model(a, model, even + after)
        if fit:
            row["fixed_fraction"] = "/".join(
                f"{f0 / (f0 + b * fr):.2f}" for (f0, b), fr in zip(fit, fractions(a.tenplex, model, config))
            )
        if affine:
            row["affine_ideal_s"] = round(affine, 4)
            row["rebalanced_over_affine_ideal"] = round(reb_s / affine, 3)
    row.update(
        {
            "flextp_s": round(flex_s, 4) if flex_s else "",
            "even_over_flextp": round(even_s / flex_s, 3) if flex_s else "",
        }
    )
    return row


def combine(reps):
    """The median of each number over repeated runs of one row (strings: the last run's)."""
    row = dict(reps[-1])
    for k, _v in row.items():
        xs = [r[k] for r in reps if isinstance(r[k], (int, float)) and not isinstance(r[k], bool)]
        if k not in ("slowdown", "world") and xs and len(reps) > 1:
            row[k] = round(med(xs), 4)
    row["repeats"] = len(reps)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tenplex", default=os.path.join(ROOT, "build", "bin", "tenplex"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks"))
    ap.add_argument("--quick", action="store_true", help="tp=2 at 1.5x/2x/3x, tp=4 and dp=2 at 2x, fewer steps")
    ap.add_argument("--steps", type=int, default=0, help="steps of each rebalance run (default 16; quick 12)")
    ap.add_argument(
        "--window", type=int, default=0, help="--rebalance-window: the even phase is steps 1 .. W-1 (default 5)"
    )
    ap.add_argument("--only", help="one case and factor, e.g. tp=2:2")
    ap.add_argument(
        "--vocab-divisible-by",
        type=int,
        default=128,
        help="the models' vocabulary padding m "
        "(Megatron's --make-vocab-size-divisible-by): the vocabulary's unit of a tp split is m rows, "
        "so 512 rows at m=128 give 4 units, one per rank of tp=4, whatever the weights",
    )
    ap.add_argument("--repeat", type=int, default=1, help="runs per row; numbers are their medians")
    ap.add_argument("--keep", help="keep the runs' logs and state in this directory")
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="with --keep: read the logs kept there, run only what is missing (re-analysis of a run)",
    )
    ap.add_argument("--cold", action="store_true", help="rebalance without --warm (the workers restart)")
    a = ap.parse_args()
    global REUSE, COLD
    COLD = a.cold
    REUSE = a.reuse and bool(a.keep)
    factors = [1.5, 2.0, 3.0]
    if a.quick:
        cases = [("tp=2", factors), ("tp=4", [2.0]), ("dp=2", [2.0]), ("pp=2", [2.0])]
        a.steps, a.window = a.steps or 12, a.window or 5
    else:
        cases = [("tp=2", factors), ("tp=4", factors), ("dp=2", factors), ("pp=2", factors)]
        a.steps, a.window = a.steps or 16, a.window or 5
    a.flextp_steps = max(4, a.steps // 2)
    if a.only:
        c, _, f = a.only.rpartition(":")
        cases = [(c, [float(f)])]
    rows = []
    t_all = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        if a.keep:
            os.makedirs(a.keep, exist_ok=True)
            tmp = a.keep
        m = ["--make-vocab-size-divisible-by", str(a.vocab_divisible_by)]
        for name, args in (("model.json", MODEL), ("pp_model.json", PP_MODEL)):
            subprocess.run([a.tenplex, "model", "gpt", "-o", os.path.join(tmp, name)] + args + m, check=True)
        for config, fs in cases:
            for f in fs:
                t0 = time.time()
                reps = [measure(a, tmp, config, f, rep) for rep in range(a.repeat)]
                row = combine(reps)
                rows.append(row)
                log(json.dumps(row), f"({time.time() - t0:.0f} s)")
    write_rows(a.out, "hetero.csv", rows, "hetero")
    plot(rows, os.path.join(a.out, "hetero.png"))
    for r in rows:
        if r["rebalanced_s"] == "":
            log(f"{r['case']} x{r['slowdown']}: no rebalance")
            continue
        log(
            f"{r['case']} x{r['slowdown']}: rebalanced/ideal {r['rebalanced_over_ideal']} "
            f"({r['rebalanced_over_even_ideal']} against the even phase's bound) (goal <= 1.15), "
            f"even/rebalanced {r['even_over_rebalanced_normalized']} at equal load "
            f"({r['even_over_rebalanced']} raw)"
        )
    tp2 = [r for r in rows if r["case"] == "tp=2" and r["slowdown"] == 2.0 and r["rebalanced_s"] != ""]
    if tp2:
        log(
            f"tp=2 at 2x: even/rebalanced {tp2[0]['even_over_rebalanced_normalized']} at equal load, "
            f"{tp2[0]['even_over_rebalanced']} raw (goal >= 1.4)"
        )
    log(f"done in {time.time() - t_all:.0f} s")


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['case']}\nx{r['slowdown']}" for r in rows]
    xs = list(range(len(rows)))
    num = lambda r, k: r[k] if r[k] != "" else 0  # noqa: E731
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(max(10, 2.2 * len(rows)), 4))
    width = 0.2
    series = [
        ("even", "even_s"),
        ("rebalanced", "rebalanced_s"),
        ("FlexTP-style", "flextp_s"),
        ("ideal (even phase)", "ideal_s"),
    ]
    for i, (name, key) in enumerate(series):
        ax.bar([x + (i - 1.5) * width for x in xs], [num(r, key) for r in rows], width, label=name)
    ax.set_ylabel("seconds per step")
    ax.set_title("raw step times (each phase at its own machine load)")
    for i, (name, key) in enumerate([("even", "even_over_ideal"), ("rebalanced", "rebalanced_over_ideal")]):
        bx.bar([x + (i - 0.5) * 0.35 for x in xs], [num(r, key) for r in rows], 0.35, label=name)
    bx.axhline(1.15, color="k", linestyle="--", linewidth=1, label="goal 1.15")
    bx.set_ylabel("step / ideal bound of the same phase")
    bx.set_title("one rank slowed (emulated): step time over the ideal")
    for a in (ax, bx):
        a.set_xticks(xs)
        a.set_xticklabels(labels)
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"[hetero] wrote {path}")


if __name__ == "__main__":
    main()
