#!/usr/bin/env python3
"""Job completion time under changing GPUs: a trace-driven simulation at paper scale
(docs/policy.md). Step times come from `tenplex config suggest --json` (the policy's
model), reconfiguration bytes from `tenplex plan --json` (our planner), transform
bandwidths from the measured figures of docs/benchmarks.md §3.

Policies, at every change of the GPU count N:
  ours        the best config for N (`config suggest`, its knobs searched: micro-batch,
              recomputation, sequence parallelism, virtual stages, zero=1), state moved by
              the planner's plan;
  ours-fixed  the same with the policy before the knob search (`--fixed-knobs`: the
              scenario's micro-batch, selective recomputation, SP, no virtual stages);
  paper-table (tenplex-xl only) the same mechanics with the Tenplex paper's hand-filled
              table of configs instead of our policy;
  tenplex-dp  tp x pp fixed at the start, dp = floor(N / (tp pp)), extra GPUs idle, paused
              while N < tp pp; state moved by our planner (no lost work): the paper's
              "Tenplex-DP";
  dp-ckpt     the same configs, but every change restarts from the last disk checkpoint
              (TorchElastic / Horovod Elastic): the work since it is lost and re-done;
  static      the best config for the smallest N of the trace, never changed.
A change costs stop + transform + restart for ours and tenplex-dp; + checkpoint load and
the lost work for dp-ckpt. A failure (trace "fail") loses at most one step for ours and
tenplex-dp (the store commits every step, docs/runtime.md) and the work since the last
checkpoint for dp-ckpt.

Scenarios:
  tenplex-xl  the Tenplex paper's dynamic-resources experiment: GPT-3 XL (24 layers, hidden
              2064, 24 heads), B=128, b=8, s=1024, 4 hosts x 4 GPUs, GPUs 16 -> 8 -> 4 -> 8
              every 35 minutes, the job as long as ours takes 538 minutes; DP-only keeps
              (tp, pp) = (2, 4) as in the paper.
  {2.7b,6.7b}-elastic  8-64 GPUs (8 per host), a change every 30 min through a fixed
              sequence (scheduler grants and reclaims hosts), 24 h of ours.
  {2.7b,6.7b}-failures 64 GPUs; a host fails every 3 h (seeded exponential gaps) and is
              back 1 h later.
  {2.7b,6.7b}-spot     spot instances: 16-64 GPUs, a preemption or grant of 1-2 hosts every
              5-20 min (seeded), 12 h of ours.
The DP-only baselines start from ours' config for the first N (the paper's baselines
start from the config the job was launched with). Every policy but ours-fixed runs each
config with its best knobs (a per-config choice a user makes once).

usage: jct_sim.py [--bin build/bin/tenplex] [--out docs/benchmarks] [--quick]
Writes jct.csv (one row per scenario and policy), jct_timeline.csv (the tenplex-xl
timeline of ours) and jct.png.
"""

import argparse
import csv
import json
import os
import random
import subprocess
import sys
import tempfile

# Measured transform figures (docs/benchmarks.md §3, 2026-11-22): UCX fetch between two
# store daemons, and writing fresh shared memory per process.
FETCH_BPS = 4.41e9
FRESH_WRITE_BPS = 0.26e9
STOP_S = 5.0  # workers stop at a step boundary and commit (docs/runtime.md: 0.1 s on the demo)
RESTART_S = 60.0  # process start, CUDA/NCCL init, first step: the same for every policy
CKPT_EVERY_S = 1800.0  # DP-only with checkpoints: a disk checkpoint every 30 minutes,
CKPT_FIRST_S = 1020.0  # the first after 17 (not in step with the traces' changes)
DISK_BPS = 2e9  # loading that checkpoint, per host

MODELS = {
    "gpt3-xl": [
        "--num-layers",
        "24",
        "--hidden-size",
        "2064",
        "--num-attention-heads",
        "24",
        "--vocab-size",
        "50257",
        "--max-position-embeddings",
        "1024",
    ],
    "gpt3-2.7b": [
        "--num-layers",
        "32",
        "--hidden-size",
        "2560",
        "--num-attention-heads",
        "32",
        "--vocab-size",
        "50257",
        "--max-position-embeddings",
        "2048",
    ],
    "gpt3-6.7b": [
        "--num-layers",
        "32",
        "--hidden-size",
        "4096",
        "--num-attention-heads",
        "32",
        "--vocab-size",
        "50257",
        "--max-position-embeddings",
        "2048",
    ],
}


class Tenplex:
    def __init__(self, binary, tmp):
        self.bin, self.tmp = binary, tmp
        self.models, self.suggest_cache, self.plan_cache = {}, {}, {}

    def model(self, name):
        if name not in self.models:
            path = os.path.join(self.tmp, name + ".json")
            subprocess.run([self.bin, "model", "gpt", *MODELS[name], "--params-dtype", "bf16", "-o", path], check=True)
            self.models[name] = path
        return self.models[name]

    def suggest(self, sc, gpus, knobs="wide"):
        """knobs: "wide" searches them all, "fixed" is the policy before the knob search."""
        key = (sc["model"], gpus, sc["batch"], sc["micro"], sc["seq"], sc["per_host"], knobs)
        if key not in self.suggest_cache:
            cmd = [
                self.bin,
                "config",
                "suggest",
                "--model",
                self.model(sc["model"]),
                "--gpus",
                str(gpus),
                "--gpus-per-host",
                str(sc["per_host"]),
                "--global-batch",
                str(sc["batch"]),
                "--seq-length",
                str(sc["seq"]),
                "--top",
                "0",
                "--all",
                "--json",
            ]
            if knobs == "fixed":
                cmd += ["--fixed-knobs", "--micro-batch", str(sc["micro"])]
            p = subprocess.run(cmd, capture_output=True, text=True)
            self.suggest_cache[key] = json.loads(p.stdout) if p.returncode == 0 else None
        return self.suggest_cache[key]

    def best(self, sc, gpus, knobs="wide"):
        j = self.suggest(sc, gpus, knobs)
        if not j or not j["configs"] or not j["configs"][0]["fits"]:
            return None
        return j["configs"][0]

    def config_time(self, sc, config, knobs="wide"):
        """Predicted step time of one config (its own world size)."""
        c = parse(config)
        j = self.suggest(sc, c["tp"] * c["pp"] * c["dp"], knobs)
        for e in (j or {}).get("configs", []):
            if e["config"] == config:
                return e["step_seconds"] if e["fits"] else None
        return None

    def plan(self, sc, src, dst):
        key = (sc["model"], src, dst, sc["per_host"])
        if key not in self.plan_cache:
            out = os.path.join(self.tmp, "plan.json")
            subprocess.run(
                [
                    self.bin,
                    "plan",
                    "--model",
                    self.model(sc["model"]),
                    "--from",
                    src,
                    "--to",
                    dst,
                    "--gpus-per-host",
                    str(sc["per_host"]),
                    "--json",
                    "-o",
                    out,
                ],
                check=True,
            )
            self.plan_cache[key] = plan_stats(out)
        return self.plan_cache[key]

    def transform_seconds(self, sc, src, dst):
        """Per host: bytes fetched from other hosts over the link, and every byte of the new
        version not kept in place written into fresh memory; the slowest host counts."""
        s = self.plan(sc, src, dst)
        hosts = max(1, s["num_hosts"])
        written = (s["bytes_total"] - s["bytes_in_place"]) / hosts
        return s["max_host_recv_bytes"] / FETCH_BPS + written / FRESH_WRITE_BPS, s

    def load_seconds(self, sc, config):
        """Loading a checkpoint of `config`: per host, its share from disk, written into
        fresh memory at the same measured rate as a transform's new bytes."""
        hosts = max(1, (world(config) + sc["per_host"] - 1) // sc["per_host"])
        per_host = self.plan(sc, config, config)["bytes_total"] / hosts
        return per_host / DISK_BPS + per_host / FRESH_WRITE_BPS


def plan_stats(path):
    """The "stats" object of a plan JSON (docs/planner.md: it comes last, after the ops,
    which can be hundreds of MB): read from the file's end."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - (1 << 20)))
        tail = f.read().decode(errors="replace")
    i = tail.rfind('"stats":')
    if i < 0:
        with open(path) as f:
            return json.load(f)["stats"]
    return json.JSONDecoder().raw_decode(tail[i + len('"stats":') :])[0]


def parse(config):
    d = dict(kv.split("=") for kv in config.split(","))
    return {"tp": int(d.get("tp", 1)), "pp": int(d.get("pp", 1)), "dp": int(d.get("dp", 1))}


def segments(trace, cyclic):
    """(start_s, end_s, gpus, event) forever: a cyclic trace repeats, another keeps its
    last allocation."""
    period = trace[-1][0] + (trace[-1][0] - trace[-2][0])
    k = 0
    while True:
        for i, (s, g, e) in enumerate(trace):
            end = trace[i + 1][0] if i + 1 < len(trace) else (period if cyclic else float("inf"))
            yield s + k * period, end + k * period, g, e
        if not cyclic:
            return
        k += 1


def world(config):
    c = parse(config)
    return c["tp"] * c["pp"] * c["dp"]


def knobs_of(policy):
    return "fixed" if policy == "ours-fixed" else "wide"


def choose(tx, sc, policy, gpus, fixed):
    if policy == "paper-table":  # fixed: {gpus: config}, the Tenplex paper's hand-filled table
        return fixed.get(gpus)
    if policy in ("ours", "ours-fixed"):
        b = tx.best(sc, gpus, knobs_of(policy))
        return b["config"] if b else None
    if policy == "static":
        return fixed if gpus >= world(fixed) else None
    f = parse(fixed)  # tenplex-dp, dp-ckpt: (tp, pp) fixed, the largest dp that fits N and B
    dp = gpus // (f["tp"] * f["pp"])
    while dp > 0 and sc["batch"] % (dp * sc["micro"]):
        dp -= 1
    new = f"tp={f['tp']},pp={f['pp']},dp={dp}" if dp > 0 else None
    return new if new and tx.config_time(sc, new) is not None else None


def simulate(tx, sc, trace, cyclic, policy, work_steps, horizon_s=None, fixed=None):
    """Runs the trace until `work_steps` steps are done (or horizon_s passes).
    Returns (seconds, steps, breakdown, timeline)."""
    t, steps, config = 0.0, 0.0, None
    ckpt_steps, next_ckpt = 0.0, CKPT_FIRST_S  # dp-ckpt: steps at the last disk checkpoint
    br = {"train": 0.0, "reconfigure": 0.0, "lost": 0.0, "paused": 0.0, "idle_gpu_s": 0.0, "changes": 0}
    timeline = []
    for seg_start, seg_end, gpus, event in segments(trace, cyclic):
        t = max(t, seg_start)
        new = choose(tx, sc, policy, gpus, fixed)
        cost = 0.0
        if config is not None and (new != config or event == "fail"):
            if policy == "dp-ckpt":  # every change restarts from the last checkpoint
                br["lost"] += (steps - ckpt_steps) * tx.config_time(sc, config, knobs_of(policy))
                steps = ckpt_steps
            elif event == "fail":  # the store holds the commit of the last step
                steps = max(0.0, steps - 1)
            if new is not None:
                br["changes"] += 1
                if policy == "dp-ckpt":
                    cost = STOP_S + RESTART_S + tx.load_seconds(sc, new)
                else:
                    cost = STOP_S + tx.transform_seconds(sc, config, new)[0] + RESTART_S
        elif config is None and new is not None and steps > 0:
            cost = RESTART_S  # resuming after a pause
            if policy == "dp-ckpt":
                cost += tx.load_seconds(sc, new)
        config = new
        br["reconfigure"] += cost
        t += cost
        if config is None:
            br["paused"] += max(0.0, seg_end - t)
            timeline.append((seg_start / 60, gpus, "paused", 0))
            t = max(t, seg_end)
        else:
            st = tx.config_time(sc, config, knobs_of(policy))
            avail = max(0.0, seg_end - t)
            if horizon_s is not None:
                avail = min(avail, max(0.0, horizon_s - t))
            run = min(avail, (work_steps - steps) * st) if work_steps else avail
            if policy == "dp-ckpt":
                while next_ckpt <= t + run:
                    if next_ckpt >= t:
                        ckpt_steps = steps + (next_ckpt - t) / st
                    next_ckpt += CKPT_EVERY_S
            steps += run / st
            br["train"] += run
            br["idle_gpu_s"] += run * (gpus - world(config))
            timeline.append((seg_start / 60, gpus, config, st))
            t += run
            if work_steps and steps >= work_steps - 1e-6:
                return t, steps, br, timeline
        if horizon_s is not None and t >= horizon_s - 1e-9:
            return t, steps, br, timeline
        if len(timeline) > 200000:
            raise SystemExit("simulation does not finish")
    return t, steps, br, timeline


def traces(quick):
    out = {}
    m = 60
    out["tenplex-xl"] = [(0, 16, ""), (35 * m, 8, ""), (70 * m, 4, ""), (105 * m, 8, "")]
    seq = [64, 32, 48, 16, 8, 40, 24, 56, 64, 16]
    out["elastic"] = [(k * 30 * m, n, "") for k, n in enumerate(seq)]
    rng = random.Random(7)
    fail, t, n = [], 0.0, 64
    while t < 48 * 3600:
        gap = rng.expovariate(1 / (3 * 3600))
        t += gap
        fail.append((t, 56, "fail"))
        fail.append((t + 3600, 64, ""))
        t += 3600
    out["failures"] = [(0, 64, "")] + [(int(a), b, e) for a, b, e in fail]
    rng = random.Random(11)
    spot, t, n = [(0, 64, "")], 0.0, 64
    while t < 48 * 3600:
        t += rng.uniform(5, 20) * m
        old, n = n, min(64, max(16, n + rng.choice([-16, -8, -8, 8, 8, 16])))
        if n != old:
            spot.append((int(t), n, "fail" if n < old else ""))
    out["spot"] = spot
    return out


def run_scenario(tx, name, sc, trace, cyclic, ours_minutes, fixed_dp=None, table=None):
    # The job's work: what ours completes in ours_minutes of this trace.
    _, work, _, timeline = simulate(tx, sc, trace, cyclic, "ours", 0, horizon_s=ours_minutes * 60)
    first = tx.best(sc, trace[0][1])["config"]
    fixed = fixed_dp or first
    smallest = min(g for _, g, _ in trace)
    sb = tx.best(sc, smallest)
    rows = []
    runs = [("ours", None), ("ours-fixed", None)] + ([("paper-table", table)] if table else [])
    runs += [("tenplex-dp", fixed), ("dp-ckpt", fixed), ("static", sb["config"] if sb else None)]
    for policy, cfg in runs:
        if policy == "static" and cfg is None:
            continue
        secs, steps, br, tl = simulate(tx, sc, trace, cyclic, policy, work, fixed=cfg)
        rows.append(
            {
                "scenario": name,
                "model": sc["model"],
                "policy": policy,
                "fixed_config": (cfg if isinstance(cfg, str) else "; ".join(f"{k}: {v}" for k, v in cfg.items()))
                if cfg
                else "",
                "jct_min": round(secs / 60, 1),
                "steps": round(steps),
                "train_min": round(br["train"] / 60, 1),
                "reconfigure_min": round(br["reconfigure"] / 60, 2),
                "lost_min": round(br["lost"] / 60, 1),
                "paused_min": round(br["paused"] / 60, 1),
                "idle_gpu_hours": round(br["idle_gpu_s"] / 3600, 1),
                "changes": br["changes"],
            }
        )
    ours = rows[0]["jct_min"]
    for r in rows:
        r["vs_ours_pct"] = round(100 * (r["jct_min"] - ours) / ours, 1)
    return rows, timeline


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.environ.get("TENPLEX_BIN", "build/bin/tenplex"))
    ap.add_argument("--out", default="docs/benchmarks")
    ap.add_argument("--quick", action="store_true", help="only the Tenplex experiment")
    a = ap.parse_args()
    tr = traces(a.quick)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tx = Tenplex(a.bin, tmp)
        xl = {"model": "gpt3-xl", "batch": 128, "micro": 8, "seq": 1024, "per_host": 4}
        print("Tenplex experiment: our configs per GPU count (knobs searched, then fixed)")
        for n in (4, 8, 16):
            for knobs in ("wide", "fixed"):
                j = tx.suggest(xl, n, knobs)
                top = [c for c in j["configs"] if c["fits"]][:3]
                paper = {4: "tp=2,pp=2,dp=1", 8: "tp=2,pp=4,dp=1", 16: "tp=2,pp=4,dp=2"}[n]
                pt = tx.config_time(xl, paper, knobs)
                print(
                    f"  {n:2d} GPUs, {knobs}: "
                    + "; ".join(
                        f"{c['config']} b={c['micro_batch']} {c['recompute']} v={c['virtual_stages']} "
                        f"{c['step_seconds']:.3f} s"
                        for c in top
                    )
                    + (f"   (paper's {paper}: {pt:.3f} s)" if pt else "")
                )
        paper = {4: "tp=2,pp=2,dp=1", 8: "tp=2,pp=4,dp=1", 16: "tp=2,pp=4,dp=2"}
        r, timeline = run_scenario(
            tx, "tenplex-xl", xl, tr["tenplex-xl"], True, 538, fixed_dp="tp=2,pp=4,dp=2", table=paper
        )
        rows += r
        if not a.quick:
            for model in ("gpt3-2.7b", "gpt3-6.7b"):
                sc = {"model": model, "batch": 512, "micro": 1, "seq": 2048, "per_host": 8}
                for name, minutes in (("elastic", 24 * 60), ("failures", 24 * 60), ("spot", 12 * 60)):
                    r, _ = run_scenario(tx, f"{model.split('-')[1]}-{name}", sc, tr[name], name == "elastic", minutes)
                    rows += r
    os.makedirs(a.out, exist_ok=True)
    keys = list(rows[0].keys())
    with open(os.path.join(a.out, "jct.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(a.out, "jct_timeline.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["minute", "gpus", "config", "step_seconds"])
        seen = set()
        for row in timeline:
            if row[0] < 140 and row[0] not in seen:
                seen.add(row[0])
                w.writerow([round(row[0]), row[1], row[2], round(row[3], 3)])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")
    plot(rows, os.path.join(a.out, "jct.png"))


def plot(rows, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    scen = list(dict.fromkeys(r["scenario"] for r in rows))
    pols = ["ours", "paper-table", "tenplex-dp", "dp-ckpt", "static"]
    colors = {
        "ours": "tab:blue",
        "paper-table": "tab:cyan",
        "tenplex-dp": "tab:orange",
        "dp-ckpt": "tab:red",
        "static": "tab:gray",
    }
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(scen)), 4.2))
    width = 0.16
    for k, p in enumerate(pols):
        xs, ys = [], []
        for i, s in enumerate(scen):
            r = [x for x in rows if x["scenario"] == s and x["policy"] == p]
            if r:
                xs.append(i + (k - 2) * width)
                ys.append(
                    r[0]["jct_min"] / [x for x in rows if x["scenario"] == s and x["policy"] == "ours"][0]["jct_min"]
                )
        ax.bar(xs, ys, width, label=p, color=colors[p])
    ax.set_xticks(range(len(scen)))
    ax.set_xticklabels(scen, rotation=20, ha="right")
    ax.set_ylabel("job completion time / ours")
    ax.axhline(1, color="black", lw=0.5)
    ax.set_title("Simulated JCT under changing GPUs (docs/policy.md)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print("wrote", path)


if __name__ == "__main__":
    sys.exit(main())
