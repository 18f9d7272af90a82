#!/usr/bin/env python3
"""Validates `tenplex config suggest` against published measurements (docs/policy.md).

1. Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
   Megatron-LM" (SC'21), Table 1: GPT 1.7B-1T on A100-80GB (8 per host), V 51200, s 2048,
   full recomputation. Published step = Eq. 3 FLOPs / (GPUs x TFLOP/s). Predicted with
   micro-batch 1 and no interleaving (as before; policy_validation.csv), with the
   interleaving of Megatron-LM's examples/sc21/run_table_1.sh (layers per virtual stage
   5/5/3/1 for 76B/145B/310B/530B) at b = 1, and at the script's micro-batch (MBS).
   Ranks of the published (t, p, d) under fixed knobs and under the full knob search.
   Also the Tenplex paper's configs (GPT-3 XL on 4/8/16 GPUs, 4 per host).
2. Korthikanti et al. 2022 (arXiv 2205.05198) Table 3 configs, Table 5 iteration times
   (full recompute vs selective + sequence parallel) and Table 4 per-layer times (22B).
3. Megatron-LM README (Megatron-Core r0.8.0) H100 weak-scaling table: published step =
   72·B·L·s·h²·(1 + s/6h + V/12hL) / (GPUs x TFLOP/s) (Megatron's
   num_floating_point_operations, model FLOPs without recomputation).
4. --fit: the efficiency that minimises the squared log error over Table 1 (as before), and
   the calibration study: a100 efficiency (+ layer_overhead_us) over Table 1 (interleaved)
   + Korthikanti Table 5, h100 efficiency + tp_overlap over the README table; every fitted
   profile is re-checked with the CLI through a profile JSON file.

Writes policy_validation.csv (1, meaning unchanged; new columns appended),
policy_validation_korthikanti.csv, policy_validation_korthikanti_layer.csv (Table 4),
policy_validation_h100.csv and with --fit policy_calibration.csv and
policy_calibration_points.csv. The CLI is copied first, so a rebuild during the run
(about 8 minutes on 2 cores) changes nothing.

usage: policy_validate.py [--bin build/bin/tenplex] [--out docs/benchmarks] [--fit]
                          [--markdown /tmp/validation.md] [-j JOBS] [-v]
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

log = logging.getLogger("policy_validate")
Row = dict[str, Any]

# (params B, heads, hidden, layers, t, p, GPUs, batch, TFLOP/s per GPU, layers per virtual
# stage (0: none), MBS of run_table_1.sh)
TABLE1 = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 0, 16),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 0, 16),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 0, 16),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 0, 8),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 0, 4),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 5, 2),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 5, 2),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 3, 1),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 1, 1),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 0, 1),
]
V, S = 51200, 2048

# Tenplex (SOSP'24) dynamic-resources experiment: GPT-3 XL, B=128, b=8, s=1024.
TENPLEX = [(4, (2, 2, 1)), (8, (2, 4, 1)), (16, (2, 4, 2))]

# Korthikanti et al.: (name, heads, hidden, layers, t, p, GPUs, B, b, v, full s, selective+SP s)
KORTHIKANTI = [
    ("22B", 64, 6144, 48, 8, 1, 8, 4, 4, 1, 1.42, 1.10),
    ("175B", 96, 12288, 96, 8, 8, 64, 64, 1, 3, 18.13, 13.75),
    ("530B", 128, 20480, 105, 8, 35, 280, 280, 1, 3, 49.05, 37.83),
    ("1T", 160, 25600, 128, 8, 64, 512, 512, 1, 1, 94.42, 71.49),
]
# Table 4 (22B): one layer's forward + backward, ms: (label, recompute, SP, published)
TABLE4 = [
    ("baseline", "none", False, 19.6),
    ("sequence parallel", "none", True, 19.0),
    ("full recompute", "full", False, 27.2),
    ("selective recompute", "selective", False, 20.9),
    ("selective + SP", "selective", True, 20.3),
]

# Megatron-LM README (H100, r0.8.0), V 131072, s 4096:
# (name, heads, hidden, layers, t, p, GPUs, B, published TFLOP/s per GPU)
README = [
    ("1.7B", 16, 2048, 24, 1, 1, 48, 192, 408.8),
    ("7.1B", 32, 4096, 30, 2, 1, 96, 192, 465.9),
    ("16B", 48, 6144, 32, 4, 1, 192, 192, 489.1),
    ("32B", 56, 7168, 48, 8, 1, 384, 192, 459.6),
    ("70B", 64, 8192, 84, 8, 2, 768, 384, 419.7),
    ("119B", 80, 10240, 92, 8, 4, 1536, 768, 420.5),
    ("177B", 96, 12288, 96, 8, 6, 2304, 1152, 432.8),
    ("314B", 128, 16384, 96, 8, 8, 3072, 1536, 474.4),
    ("462B", 144, 18432, 112, 8, 16, 6144, 3072, 459.9),
]
RV, RS = 131072, 4096
FULL_NOSP = ["--recompute", "full", "--no-sequence-parallel"]


@dataclass
class Spec:
    """One suggest call and the published (tp, pp, dp, zero) row to read from it."""

    model: str
    gpus: int
    batch: int
    seq: int
    flags: list[str]
    tp: int
    pp: int
    dp: int
    zero: int = 0


@dataclass
class Point:
    """A published step time and the spec that predicts it (for the calibration)."""

    table: str
    label: str
    published: float
    spec: Spec
    base: dict[str, Any] = field(default_factory=dict)  # the config at the base profile
    layers: int = 0  # the model's transformer layers


def eq3_flops(B: int, l: int, h: int) -> float:
    return 96 * B * S * l * h * h * (1 + S / (6 * h) + V / (16 * l * h))


def model_flops(B: int, l: int, h: int, s: int, v: int) -> float:
    return 72 * B * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))


def suggest(tenplex: str, model: str, gpus: int, batch: int, seq: int, extra: list[str]) -> dict[str, Any]:
    cmd = [
        tenplex,
        "config",
        "suggest",
        "--model",
        model,
        "--gpus",
        str(gpus),
        "--global-batch",
        str(batch),
        "--seq-length",
        str(seq),
        "--top",
        "0",
        "--all",
        "--json",
    ] + extra
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {p.stderr}")
    return json.loads(p.stdout)


def write_model(
    tenplex: str,
    path: str,
    layers: int,
    hidden: int,
    heads: int,
    vocab: int = V,
    positions: int = S,
    extra: list[str] | None = None,
) -> str:
    subprocess.run(
        [
            tenplex,
            "model",
            "gpt",
            "--num-layers",
            str(layers),
            "--hidden-size",
            str(hidden),
            "--num-attention-heads",
            str(heads),
            "--vocab-size",
            str(vocab),
            "--max-position-embeddings",
            str(positions),
            "--params-dtype",
            "bf16",
            "-o",
            path,
        ]
        + (extra or []),
        check=True,
    )
    return path


def rank_of(
    configs: list[dict[str, Any]], tp: int, pp: int, dp: int, zero_too: bool = True, zero: int = 0
) -> tuple[int | None, int, dict[str, Any] | None]:
    fit = [c for c in configs if c["fits"] and (zero_too or not c["zero"])]
    for i, c in enumerate(fit):
        if (c["tp"], c["pp"], c["dp"], c["zero"]) == (tp, pp, dp, zero) and not c["layers"]:
            return i + 1, len(fit), c
    for c in configs:
        if (c["tp"], c["pp"], c["dp"], c["zero"]) == (tp, pp, dp, zero) and not c["layers"]:
            return None, len(fit), c
    return None, len(fit), None


def run_spec(tenplex: str, sp: Spec, profile: str) -> dict[str, Any]:
    j = suggest(tenplex, sp.model, sp.gpus, sp.batch, sp.seq, sp.flags + ["--device-profile", profile])
    _, _, c = rank_of(j["configs"], sp.tp, sp.pp, sp.dp, zero=sp.zero)
    if c is None:
        raise SystemExit(f"no tp={sp.tp},pp={sp.pp},dp={sp.dp},zero={sp.zero} row for {sp.model} {sp.flags}")
    c["_profile"] = j["profile"]
    return c


def err(pred: float, pub: float) -> float:
    return round(100 * (pred - pub) / pub, 1)


def knobs(c: dict[str, Any]) -> str:
    return f"b={c['micro_batch']},{c['recompute']},sp={int(c['sequence_parallel'])},v={c['virtual_stages']}"


def search_rank(
    tenplex: str, model: str, n: int, B: int, s: int, prof: str, tp: int, pp: int, dp: int, zero: int = 0
) -> Row:
    """Rank of the published config among all configs, every knob searched."""
    j = suggest(tenplex, model, n, B, s, ["--device-profile", prof])
    rank, nfit, c = rank_of(j["configs"], tp, pp, dp, zero=zero)
    best = j["configs"][0]
    return {
        "rank_search": rank or "not fit",
        "fitting_search": nfit,
        "search_knobs": knobs(c) if c else "",
        "search_step_s": round(c["step_seconds"], 3) if c else "",
        "search_best": f"{best['config']} {knobs(best)}",
        "search_best_step_s": round(best["step_seconds"], 3),
    }


def sc21_row(tenplex: str, tmp: str, r: tuple) -> tuple[Row, list[Point]]:
    points: list[Point] = []
    (pb, heads, h, l, t, p, n, B, tflops, lpv, mbs) = r
    model = write_model(tenplex, os.path.join(tmp, f"gpt-{pb}b.json"), l, h, heads)
    dp = n // (t * p)
    v = (l // p) // lpv if lpv else 1
    fixed = ["--fixed-knobs", "--micro-batch", "1"] + FULL_NOSP + ["--device-profile", "a100"]
    j = suggest(tenplex, model, n, B, S, fixed)
    rank, nfit, c = rank_of(j["configs"], t, p, dp)
    rank_nz, _, _ = rank_of(j["configs"], t, p, dp, zero_too=False)  # SC'21 had no ZeRO
    pub = eq3_flops(B, l, h) / (n * tflops * 1e12)
    best = j["configs"][0]
    pinned = FULL_NOSP + ["--fixed-knobs", "--virtual-stages", str(v), "--no-distributed-optimizer"]
    sp1 = Spec(model, n, B, S, pinned + ["--micro-batch", "1"], t, p, dp)
    spm = Spec(model, n, B, S, pinned + ["--micro-batch", str(mbs)], t, p, dp)
    c1, cm = run_spec(tenplex, sp1, "a100"), run_spec(tenplex, spm, "a100")
    points.append(Point("sc21_b1", f"{pb}B", pub, sp1, c1, l))
    points.append(Point("sc21", f"{pb}B", pub, spm, cm, l))
    if c:
        c["_profile"] = j["profile"]
        points.append(Point("sc21_v1", f"{pb}B", pub, sp1, c, l))  # the original --fit's rows
    row = {
        "model": f"{pb}B",
        "gpus": n,
        "batch": B,
        "published": f"tp={t},pp={p},dp={dp}",
        "published_tflops": tflops,
        "published_step_s": round(pub, 3),
        "ours_step_s": round(c["step_seconds"], 3) if c else "",
        "error_pct": err(c["step_seconds"], pub) if c else "",
        "ours_tflops": round(eq3_flops(B, l, h) / (n * c["step_seconds"]) / 1e12, 1) if c else "",
        "rank": rank if rank else "not fit",
        "rank_without_zero": rank_nz if rank_nz else "not fit",
        "fitting_configs": nfit,
        "our_best": best["config"],
        "our_best_step_s": round(best["step_seconds"], 3),
        "published_fits": c["fits"] if c else False,
        "memory_gib": round(c["memory"]["total"] / 2**30, 1) if c else "",
        "virtual_stages": v,
        "interleaved_b1_step_s": round(c1["step_seconds"], 3),
        "interleaved_b1_error_pct": err(c1["step_seconds"], pub),
        "script_mbs": mbs,
        "interleaved_mbs_step_s": round(cm["step_seconds"], 3),
        "interleaved_mbs_error_pct": err(cm["step_seconds"], pub),
        "interleaved_mbs_fits": cm["fits"],
    }
    row.update(search_rank(tenplex, model, n, B, S, "a100", t, p, dp))
    return row, points


def tenplex_rows(tenplex: str, tmp: str) -> list[Row]:
    xl = write_model(tenplex, os.path.join(tmp, "gpt3-xl.json"), 24, 2064, 24, 50257, 1024)
    rows = []
    for n, (t, p, d) in TENPLEX:
        j = suggest(
            tenplex,
            xl,
            n,
            128,
            1024,
            ["--fixed-knobs", "--micro-batch", "8", "--device-profile", "a100", "--gpus-per-host", "4"],
        )
        rank, nfit, c = rank_of(j["configs"], t, p, d)
        rank_nz, _, _ = rank_of(j["configs"], t, p, d, zero_too=False)
        best = j["configs"][0]
        row = {
            "model": "GPT-3 XL (Tenplex)",
            "gpus": n,
            "batch": 128,
            "published": f"tp={t},pp={p},dp={d}",
            "ours_step_s": round(c["step_seconds"], 3) if c else "",
            "rank": rank if rank else "not fit",
            "rank_without_zero": rank_nz if rank_nz else "not fit",
            "fitting_configs": nfit,
            "our_best": best["config"],
            "our_best_step_s": round(best["step_seconds"], 3),
            "published_fits": c["fits"] if c else False,
            "memory_gib": round(c["memory"]["total"] / 2**30, 1) if c else "",
        }
        j = suggest(
            tenplex, xl, n, 128, 1024, ["--micro-batch", "8", "--device-profile", "a100", "--gpus-per-host", "4"]
        )
        rs, nf, cs = rank_of(j["configs"], t, p, d)
        row.update(
            {
                "rank_search": rs or "not fit",
                "fitting_search": nf,
                "search_knobs": knobs(cs) if cs else "",
                "search_best": f"{j['configs'][0]['config']} {knobs(j['configs'][0])}",
                "search_best_step_s": round(j["configs"][0]["step_seconds"], 3),
            }
        )
        rows.append(row)
    return rows


def korthikanti_row(tenplex: str, tmp: str, r: tuple) -> tuple[Row, list[Point]]:
    points: list[Point] = []
    name, heads, h, l, t, p, n, B, b, v, pub_full, pub_sel = r
    model = write_model(tenplex, os.path.join(tmp, f"k-{name}.json"), l, h, heads)
    dp = n // (t * p)
    base = ["--fixed-knobs", "--micro-batch", str(b), "--virtual-stages", str(v), "--no-distributed-optimizer"]
    sf = Spec(model, n, B, S, base + FULL_NOSP, t, p, dp)
    ss = Spec(model, n, B, S, base + ["--recompute", "selective", "--sequence-parallel"], t, p, dp)
    cf, cs = run_spec(tenplex, sf, "a100"), run_spec(tenplex, ss, "a100")
    points.append(Point("korthikanti_full", name, pub_full, sf, cf, l))
    points.append(Point("korthikanti_selective", name, pub_sel, ss, cs, l))
    row = {
        "model": name,
        "gpus": n,
        "batch": B,
        "micro_batch": b,
        "published": f"tp={t},pp={p},dp={dp}",
        "virtual_stages": v,
        "published_full_s": pub_full,
        "ours_full_s": round(cf["step_seconds"], 3),
        "full_error_pct": err(cf["step_seconds"], pub_full),
        "full_fits": cf["fits"],
        "published_selective_sp_s": pub_sel,
        "ours_selective_sp_s": round(cs["step_seconds"], 3),
        "selective_error_pct": err(cs["step_seconds"], pub_sel),
        "selective_fits": cs["fits"],
        "published_ratio": round(pub_full / pub_sel, 2),
        "ours_ratio": round(cf["step_seconds"] / cs["step_seconds"], 2),
        "full_memory_gib": round(cf["memory"]["total"] / 2**30, 1),
        "selective_memory_gib": round(cs["memory"]["total"] / 2**30, 1),
    }
    row.update(search_rank(tenplex, model, n, B, S, "a100", t, p, dp))
    return row, points


def table4_rows(tenplex: str, tmp: str) -> list[Row]:
    """One 22B layer's forward + backward (ms): the step difference of 48 and 24 layers / 24."""
    models = [write_model(tenplex, os.path.join(tmp, f"k22-{l}.json"), l, 6144, 64) for l in (48, 24)]
    rows = []
    for label, rc, sp, pub in TABLE4:
        flags = [
            "--fixed-knobs",
            "--micro-batch",
            "4",
            "--recompute",
            rc,
            "--sequence-parallel" if sp else "--no-sequence-parallel",
            "--no-distributed-optimizer",
        ]
        c48, c24 = (run_spec(tenplex, Spec(m, 8, 4, S, flags, 8, 1, 1), "a100") for m in models)
        per = (c48["step_seconds"] - c24["step_seconds"]) / 24 * 1e3
        comp = (c48["time"]["compute"] - c24["time"]["compute"]) / 24 * 1e3
        rows.append(
            {
                "setting": label,
                "published_ms": pub,
                "ours_ms": round(per, 2),
                "ours_compute_ms": round(comp, 2),
                "ours_tp_ms": round(per - comp, 2),
            }
        )
    for r in rows:
        r["published_vs_baseline"] = round(r["published_ms"] / rows[0]["published_ms"], 3)
        r["ours_vs_baseline"] = round(r["ours_ms"] / rows[0]["ours_ms"], 3)
    return rows


def readme_row(tenplex: str, tmp: str, r: tuple) -> tuple[Row, list[Point]]:
    points: list[Point] = []
    name, heads, h, l, t, p, n, B, tflops = r
    model = write_model(
        tenplex, os.path.join(tmp, f"r-{name}.json"), l, h, heads, RV, RS, ["--untie-embeddings-and-output-weights"]
    )
    dp = n // (t * p)
    pub = model_flops(B, l, h, RS, RV) / (n * tflops * 1e12)
    row: Row = {
        "model": name,
        "gpus": n,
        "batch": B,
        "published": f"tp={t},pp={p},dp={dp},zero=1",
        "published_tflops": tflops,
        "published_step_s": round(pub, 3),
    }
    for rc in ("none", "selective"):
        for vs in ("1", "best"):
            flags = [
                "--micro-batch",
                "1",
                "--recompute",
                rc,
                "--sequence-parallel" if t > 1 else "--no-sequence-parallel",
            ]
            flags += ["--fixed-knobs", "--virtual-stages", "1"] if vs == "1" else []
            sp = Spec(model, n, B, RS, flags, t, p, dp, zero=1 if dp > 1 else 0)
            c = run_spec(tenplex, sp, "h100")
            k = f"{rc}_v{vs}"
            row[f"{k}_step_s"] = round(c["step_seconds"], 3)
            row[f"{k}_error_pct"] = err(c["step_seconds"], pub)
            row[f"{k}_fits"] = c["fits"]
            if vs == "best":
                row[f"{k}_v"] = c["virtual_stages"]
            if rc == "selective":
                points.append(Point(f"readme_v{vs}", name, pub, sp, c, l))
            if (rc, vs) == ("selective", "1"):
                row["ours_tflops_selective_v1"] = round(
                    model_flops(B, l, h, RS, RV) / (n * c["step_seconds"]) / 1e12, 1
                )
    row.update(search_rank(tenplex, model, n, B, RS, "h100", t, p, dp, zero=1 if dp > 1 else 0))
    return row, points


def linear_pred(pt: Point, e: np.ndarray, o_us: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The CLI's step time (estimate.cc) re-evaluated at efficiency e, layer overhead o and
    tp_overlap x from the parts at the base profile: the slowest stage's compute scales
    with 1/e plus o per layer and micro-batch, its TP time with 1 - x, the pipeline
    multiplies the stage time by (m + (pp - 1)/v), the exposed DP time stays."""
    c, prof = pt.base, pt.base["_profile"]
    q, m, pp, v = c["time"], c["micro_batches"], c["pp"], c["virtual_stages"]
    layers_stage = pt.layers / pp
    o0 = prof["layer_overhead_us"] * 1e-6
    flops_part = q["compute"] - m * layers_stage * o0
    comp = flops_part * prof["efficiency"] / e + m * layers_stage * o_us * 1e-6
    tp = q["tp"] * (1 - x) / (1 - prof["tp_overlap"])
    return (comp + tp + q["p2p"]) * (1 + (pp - 1) / (v * m)) + q["dp"]


def grid_fit(points: list[Point], free: str) -> dict[str, float]:
    """Least squares of log step time over a grid of (efficiency, free) then a finer one."""
    pub = np.array([p.published for p in points])[:, None, None]
    lo_e, hi_e = 0.2, 1.0
    lo_f, hi_f = (0.0, 0.0) if free == "none" else (0.0, 4000.0) if free == "overhead" else (0.0, 1.0)
    best: tuple[float, float, float] = (math.inf, 0.0, 0.0)
    for _ in range(3):
        es = np.linspace(lo_e, hi_e, 161)[None, :, None]
        fs = np.linspace(lo_f, hi_f, 161 if hi_f > lo_f else 1)[None, None, :]
        preds = []
        for p in points:
            o = fs if free == "overhead" else np.zeros_like(fs)
            x = fs if free == "tp_overlap" else np.full_like(fs, p.base["_profile"]["tp_overlap"])
            preds.append(linear_pred(p, es[0], o[0], x[0]))
        sq = ((np.log(np.stack(preds) / pub)) ** 2).sum(axis=0)
        i, k = np.unravel_index(np.argmin(sq), sq.shape)
        best = (float(sq[i, k]), float(es[0, i, 0]), float(fs[0, 0, k]))
        de, df = (hi_e - lo_e) / 16, (hi_f - lo_f) / 16
        lo_e, hi_e = max(0.01, best[1] - de), min(1.0, best[1] + de)
        lo_f, hi_f = max(0.0, best[2] - df), best[2] + df if free != "tp_overlap" else min(1.0, best[2] + df)
    out = {"efficiency": round(best[1], 3), "rms_log_error": round(math.sqrt(best[0] / len(points)), 4)}
    if free == "overhead":
        out["layer_overhead_us"] = round(best[2], 1)
    if free == "tp_overlap":
        out["tp_overlap"] = round(best[2], 3)
    return out


def verify(
    tenplex: str, tmp: str, points: list[Point], base: str, fit: dict[str, float], tag: str, pool: ThreadPoolExecutor
) -> list[float]:
    """Predicted step times of the fitted profile, from the CLI with a profile JSON file."""
    path = os.path.join(tmp, f"profile-{tag}.json")
    with open(path, "w") as f:
        json.dump({"base": base, **{k: v for k, v in fit.items() if k != "rms_log_error"}}, f)
    return [c["step_seconds"] for c in pool.map(lambda p: run_spec(tenplex, p.spec, path), points)]


def calibrate(tenplex: str, tmp: str, points: list[Point], pool: ThreadPoolExecutor) -> tuple[list[Row], list[Row]]:
    """Fits, per study, the profile fields and returns (fit summaries, per-point rows)."""
    studies: list[tuple[str, str, list[str], list[str]]] = [
        ("a100", "a100", ["sc21", "korthikanti_full", "korthikanti_selective"], ["none", "overhead"]),
        (
            "a100 (Table 1 at b=1)",
            "a100",
            ["sc21_b1", "korthikanti_full", "korthikanti_selective"],
            ["none", "overhead"],
        ),
        ("h100 (selective, best v)", "h100", ["readme_vbest"], ["none", "tp_overlap"]),
        ("h100 (selective, v=1)", "h100", ["readme_v1"], ["none", "tp_overlap"]),
    ]
    fits: list[Row] = []
    detail: list[Row] = []
    for name, base, tables, frees in studies:
        pts = [p for p in points if p.table in tables]
        cols: dict[str, list[float]] = {"base": [p.base["step_seconds"] for p in pts]}
        for free in frees:
            f = grid_fit(pts, free)
            tag = f"{base}-{free}-{len(fits)}"
            cols[free] = verify(tenplex, tmp, pts, base, f, tag, pool)
            lin = [
                float(
                    linear_pred(
                        p,
                        np.array(f["efficiency"]),
                        np.array(f.get("layer_overhead_us", 0.0)),
                        np.array(f.get("tp_overlap", p.base["_profile"]["tp_overlap"])),
                    )
                )
                for p in pts
            ]
            drift = max(abs(a - b) / b for a, b in zip(lin, cols[free]))
            if drift > 1e-3:
                log.warning("%s %s: linear model off the CLI by %.2g", name, free, drift)
            fits.append({"study": name, "fitted": free, **f, **summary(pts, cols[free])})
        fits.append({"study": name, "fitted": "base profile", **summary(pts, cols["base"])})
        for i, p in enumerate(pts):
            d = {"study": name, "table": p.table, "model": p.label, "published_s": round(p.published, 3)}
            for k, vals in cols.items():
                d[f"{k}_s"], d[f"{k}_error_pct"] = round(vals[i], 3), err(vals[i], p.published)
            detail.append(d)
    return fits, detail


def summary(pts: list[Point], preds: list[float]) -> Row:
    out: Row = {}
    for t in sorted({p.table for p in pts}):
        e = [abs(100 * (y - p.published) / p.published) for p, y in zip(pts, preds) if p.table == t]
        out[f"{t}_mean_abs_pct"], out[f"{t}_max_abs_pct"] = round(sum(e) / len(e), 1), round(max(e), 1)
    return out


def old_fit(points: list[Point]) -> str:
    """The efficiency fitted on Table 1 at b=1 without interleaving (the original --fit)."""
    pts = [p for p in points if p.table == "sc21_v1"]
    f = grid_fit(pts, "none")
    return (
        f"fitted efficiency {f['efficiency']:.3f} (rms log error {f['rms_log_error']:.3f}) on Table 1 "
        f"(b=1, no interleaving); profile has {pts[0].base['_profile']['efficiency']}"
    )


def write_csv(path: str, rows: list[Row]) -> None:
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if not k.startswith("_") and k not in keys]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    log.info("wrote %s", path)


def md_table(rows: list[Row], keys: list[str]) -> str:
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def stats(rows: list[Row], key: str) -> str:
    e = [abs(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return f"mean |error| {sum(e) / len(e):.1f} %, max {max(e):.1f} %" if e else "no errors"


def collect(tenplex: str, tmp: str, pool: ThreadPoolExecutor) -> tuple[dict[str, list[Row]], list[Point]]:
    points: list[Point] = []
    out: dict[str, list[Row]] = {}
    jobs: list[tuple[str, Callable[..., tuple[Row, list[Point]]], list[tuple]]] = [
        ("sc21", sc21_row, TABLE1),
        ("korthikanti", korthikanti_row, KORTHIKANTI),
        ("readme", readme_row, README),
    ]
    futures = {key: [pool.submit(fn, tenplex, tmp, r) for r in rows] for key, fn, rows in jobs}
    tenplex_f, table4_f = pool.submit(tenplex_rows, tenplex, tmp), pool.submit(table4_rows, tenplex, tmp)
    for key, fs in futures.items():
        out[key] = []
        for f in fs:
            row, pts = f.result()
            log.info("%s %s done", key, row["model"])
            out[key].append(row)
            points += pts
    out["tenplex"], out["table4"] = tenplex_f.result(), table4_f.result()
    return out, points


SECTIONS: list[tuple[str, str, list[list[str]]]] = [
    (
        "sc21",
        "Narayanan et al. SC'21 Table 1 (a100 profile, full recompute, no SP, no distributed optimizer)",
        [
            [
                "model",
                "published",
                "published_step_s",
                "ours_step_s",
                "error_pct",
                "virtual_stages",
                "interleaved_b1_step_s",
                "interleaved_b1_error_pct",
                "script_mbs",
                "interleaved_mbs_step_s",
                "interleaved_mbs_error_pct",
                "interleaved_mbs_fits",
            ],
            [
                "model",
                "published",
                "rank",
                "rank_without_zero",
                "fitting_configs",
                "our_best",
                "rank_search",
                "fitting_search",
                "search_knobs",
                "search_step_s",
                "search_best",
                "search_best_step_s",
            ],
        ],
    ),
    (
        "tenplex",
        "Tenplex paper configs (GPT-3 XL, b=8, 4 GPUs per host)",
        [
            [
                "gpus",
                "published",
                "ours_step_s",
                "rank",
                "rank_without_zero",
                "fitting_configs",
                "our_best",
                "our_best_step_s",
                "rank_search",
                "search_best",
                "search_best_step_s",
            ]
        ],
    ),
    (
        "korthikanti",
        "Korthikanti et al. 2022 Table 5 (a100 profile, no distributed optimizer)",
        [
            [
                "model",
                "published",
                "micro_batch",
                "virtual_stages",
                "published_full_s",
                "ours_full_s",
                "full_error_pct",
                "published_selective_sp_s",
                "ours_selective_sp_s",
                "selective_error_pct",
                "published_ratio",
                "ours_ratio",
            ],
            [
                "model",
                "full_memory_gib",
                "selective_memory_gib",
                "rank_search",
                "fitting_search",
                "search_knobs",
                "search_best",
                "search_best_step_s",
            ],
        ],
    ),
    (
        "table4",
        "Korthikanti et al. 2022 Table 4: one 22B layer, forward + backward (tp 8, b 4)",
        [
            [
                "setting",
                "published_ms",
                "ours_ms",
                "ours_compute_ms",
                "ours_tp_ms",
                "published_vs_baseline",
                "ours_vs_baseline",
            ]
        ],
    ),
    (
        "readme",
        "Megatron-LM README H100 table (h100 profile, b=1, SP, distributed optimizer)",
        [
            [
                "model",
                "published",
                "published_tflops",
                "published_step_s",
                "none_v1_step_s",
                "none_v1_error_pct",
                "none_v1_fits",
                "selective_v1_step_s",
                "selective_v1_error_pct",
                "ours_tflops_selective_v1",
                "none_vbest_v",
                "none_vbest_error_pct",
                "none_vbest_fits",
                "selective_vbest_v",
                "selective_vbest_error_pct",
            ],
            [
                "model",
                "published",
                "rank_search",
                "fitting_search",
                "search_knobs",
                "search_step_s",
                "search_best",
                "search_best_step_s",
            ],
        ],
    ),
]
ERROR_KEYS = {
    "sc21": ["error_pct", "interleaved_b1_error_pct", "interleaved_mbs_error_pct"],
    "korthikanti": ["full_error_pct", "selective_error_pct"],
    "readme": ["none_v1_error_pct", "selective_v1_error_pct", "none_vbest_error_pct", "selective_vbest_error_pct"],
}


def markdown(out: dict[str, list[Row]], cal: tuple[list[Row], list[Row]] | None) -> str:
    text = (
        "# `tenplex config suggest` against published measurements\n\n"
        "Generated by bench/policy_validate.py (errors: (ours - published) / published).\n\n"
    )
    for key, title, tables in SECTIONS:
        text += f"## {title}\n\n"
        for keys in tables:
            text += md_table(out[key], keys) + "\n"
        for k in ERROR_KEYS.get(key, []):
            text += f"- {k}: {stats(out[key], k)}\n"
        text += "\n"
    if cal:
        fits, detail = cal
        keys: list[str] = []
        for r in fits:
            keys += [k for k in r if k not in keys]
        text += "## Calibration (least squares of log step time; values re-checked with the CLI)\n\n"
        text += md_table(fits, keys) + "\n"
        dkeys: list[str] = []
        for r in detail:
            dkeys += [k for k in r if k not in dkeys]
        text += md_table(detail, dkeys) + "\n"
    return text


def snapshot(binary: str, tmp: str) -> str:
    """A private copy of the CLI, so that a rebuild during the run changes no result."""
    path = os.path.join(tmp, "tenplex")
    for _attempt in range(30):
        try:
            shutil.copy2(binary, path)
            subprocess.run([path, "--help"], capture_output=True, check=True)
            return path
        except (OSError, subprocess.CalledProcessError) as e:
            log.warning("%s not usable yet (%s); retrying", binary, e)
            time.sleep(10)
    raise SystemExit(f"{binary} is not runnable")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.environ.get("TENPLEX_BIN", "build/bin/tenplex"))
    ap.add_argument("--out", default="docs/benchmarks")
    ap.add_argument("--fit", action="store_true", help="fit the profiles (calibration study)")
    ap.add_argument("--markdown", default="", help="also write the tables as markdown to this file")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="CLI calls at once")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING, format="%(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        tenplex = snapshot(a.bin, tmp)
        with ThreadPoolExecutor(max_workers=a.jobs) as pool:
            out, points = collect(tenplex, tmp, pool)
            cal = calibrate(tenplex, tmp, points, pool) if a.fit else None
    os.makedirs(a.out, exist_ok=True)
    write_csv(os.path.join(a.out, "policy_validation.csv"), out["sc21"] + out["tenplex"])
    write_csv(os.path.join(a.out, "policy_validation_korthikanti.csv"), out["korthikanti"])
    write_csv(os.path.join(a.out, "policy_validation_korthikanti_layer.csv"), out["table4"])
    write_csv(os.path.join(a.out, "policy_validation_h100.csv"), out["readme"])
    for key, keys in ERROR_KEYS.items():
        for k in keys:
            print(f"{key} {k}: {stats(out[key], k)}")
    if cal:
        print(old_fit(points))
        write_csv(os.path.join(a.out, "policy_calibration.csv"), cal[0])
        write_csv(os.path.join(a.out, "policy_calibration_points.csv"), cal[1])
        for r in cal[0]:
            print(", ".join(f"{k}={v}" for k, v in r.items()))
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(markdown(out, cal))
    return 0


if __name__ == "__main__":
    sys.exit(main())
