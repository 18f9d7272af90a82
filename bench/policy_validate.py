#!/usr/bin/env python3
"""Validates `tenplex config suggest` against published measurements (docs/policy.md).

Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM" (SC'21), Table 1: GPT models of 1.7B-1T parameters on A100-80GB (DGX A100,
8 GPUs per host), vocabulary 51200, sequence 2048, mixed precision, full activation
recomputation, (t, p) per row and the achieved TFLOP/s per GPU. The published step time
is their Eq. 3 FLOPs over (GPUs x TFLOP/s). Micro-batch 1 is assumed (the table does not
give it). For each row: the rank of the published (t, p, d) among our ranked configs,
our predicted step time for it and the error, and the config we rank first.

Also the Tenplex paper's configs (GPT-3 XL on 4/8/16 GPUs, 4 per host; jct_sim.py).

usage: policy_validate.py [--bin build/bin/tenplex] [--out docs/benchmarks] [--fit]
--fit prints the compute efficiency that minimises the mean squared log error over
Table 1 (the value in the "a100" profile comes from it).
"""
import argparse
import csv
import json
import math
import os
import subprocess
import sys
import tempfile

# (params B, heads, hidden, layers, t, p, GPUs, batch, TFLOP/s per GPU)
TABLE1 = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
]
V, S = 51200, 2048

# Tenplex (SOSP'24) dynamic-resources experiment: GPT-3 XL, B=128, b=8, s=1024.
TENPLEX = [(4, (2, 2, 1)), (8, (2, 4, 1)), (16, (2, 4, 2))]


def eq3_flops(B, l, h):
    return 96 * B * S * l * h * h * (1 + S / (6 * h) + V / (16 * l * h))


def suggest(tenplex, model, gpus, batch, micro, seq, extra):
    cmd = [tenplex, "config", "suggest", "--model", model, "--gpus", str(gpus), "--global-batch", str(batch),
           "--micro-batch", str(micro), "--seq-length", str(seq), "--top", "0", "--all", "--json"] + extra
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {p.stderr}")
    return json.loads(p.stdout)


def write_model(tenplex, path, layers, hidden, heads, vocab=V, positions=S):
    subprocess.run([tenplex, "model", "gpt", "--num-layers", str(layers), "--hidden-size", str(hidden),
                    "--num-attention-heads", str(heads), "--vocab-size", str(vocab), "--max-position-embeddings",
                    str(positions), "--params-dtype", "bf16", "-o", path], check=True)


def rank_of(configs, tp, pp, dp, zero_too=True):
    fit = [c for c in configs if c["fits"] and (zero_too or not c["zero"])]
    for i, c in enumerate(fit):
        if (c["tp"], c["pp"], c["dp"], c["zero"]) == (tp, pp, dp, 0) and not c["layers"]:
            return i + 1, len(fit), c
    for c in configs:
        if (c["tp"], c["pp"], c["dp"], c["zero"]) == (tp, pp, dp, 0):
            return None, len(fit), c
    return None, len(fit), None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.environ.get("TENPLEX_BIN", "build/bin/tenplex"))
    ap.add_argument("--out", default="docs/benchmarks")
    ap.add_argument("--fit", action="store_true")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for (pb, heads, h, l, t, p, n, B, tflops) in TABLE1:
            model = os.path.join(tmp, f"gpt-{pb}b.json")
            # Table 1's 529.6B has 105 layers on 35 stages: 3 per stage.
            write_model(a.bin, model, l, h, heads)
            extra = ["--device-profile", "a100", "--recompute", "full", "--no-sequence-parallel"]
            j = suggest(a.bin, model, n, B, 1, S, extra)
            dp = n // (t * p)
            rank, nfit, c = rank_of(j["configs"], t, p, dp)
            rank_nz, _, _ = rank_of(j["configs"], t, p, dp, zero_too=False)  # SC'21 had no ZeRO
            pub = eq3_flops(B, l, h) / (n * tflops * 1e12)
            best = j["configs"][0]
            rows.append({
                "model": f"{pb}B", "gpus": n, "batch": B, "published": f"tp={t},pp={p},dp={dp}",
                "published_tflops": tflops, "published_step_s": round(pub, 3),
                "ours_step_s": round(c["step_seconds"], 3) if c else "",
                "error_pct": round(100 * (c["step_seconds"] - pub) / pub, 1) if c else "",
                "ours_tflops": round(eq3_flops(B, l, h) / (n * c["step_seconds"]) / 1e12, 1) if c else "",
                "rank": rank if rank else "not fit", "rank_without_zero": rank_nz if rank_nz else "not fit",
                "fitting_configs": nfit,
                "our_best": best["config"], "our_best_step_s": round(best["step_seconds"], 3),
                "published_fits": c["fits"] if c else False,
                "memory_gib": round(c["memory"]["total"] / 2**30, 1) if c else "",
                "_parts": c["time"] if c else None, "_m": c["micro_batches"] if c else 0, "_pp": p,
            })
        # Tenplex paper configs.
        xl = os.path.join(tmp, "gpt3-xl.json")
        write_model(a.bin, xl, 24, 2064, 24, 50257, 1024)
        for n, (t, p, d) in TENPLEX:
            j = suggest(a.bin, xl, n, 128, 8, 1024, ["--device-profile", "a100", "--gpus-per-host", "4"])
            rank, nfit, c = rank_of(j["configs"], t, p, d)
            rank_nz, _, _ = rank_of(j["configs"], t, p, d, zero_too=False)
            best = j["configs"][0]
            rows.append({
                "model": "GPT-3 XL (Tenplex)", "gpus": n, "batch": 128, "published": f"tp={t},pp={p},dp={d}",
                "published_tflops": "", "published_step_s": "", "ours_step_s": round(c["step_seconds"], 3) if c else "",
                "error_pct": "", "ours_tflops": "", "rank": rank if rank else "not fit",
                "rank_without_zero": rank_nz if rank_nz else "not fit", "fitting_configs": nfit,
                "our_best": best["config"], "our_best_step_s": round(best["step_seconds"], 3),
                "published_fits": c["fits"] if c else False,
                "memory_gib": round(c["memory"]["total"] / 2**30, 1) if c else "", "_parts": None, "_m": 0, "_pp": 1,
            })
    os.makedirs(a.out, exist_ok=True)
    keys = [k for k in rows[0] if not k.startswith("_")]
    with open(os.path.join(a.out, "policy_validation.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")
    errs = [abs(r["error_pct"]) for r in rows if r["error_pct"] != ""]
    print(f"mean |error| {sum(errs) / len(errs):.1f} %, max {max(errs):.1f} %")
    if a.fit:
        # t(e) = (m + pp - 1)/m * (C e0/e + TP + P2P) + DP: refit the efficiency e.
        prof = suggest(a.bin, "gpt3-125m", 8, 8, 1, 128, ["--device-profile", "a100"])["profile"]
        e0 = prof["efficiency"]
        best = None
        for k in range(20, 96):
            e = k / 100
            err = 0
            for r, (pb, heads, h, l, t, p, n, B, tflops) in zip(rows, TABLE1):
                q = r["_parts"]
                m, pp = r["_m"], r["_pp"]
                busy = q["compute"] * e0 / e + q["tp"] + q["p2p"]
                pred = busy * (m + pp - 1) / m + q["dp"]
                err += math.log(pred / r["published_step_s"]) ** 2
            if best is None or err < best[1]:
                best = (e, err)
        print(f"fitted efficiency {best[0]:.2f} (rms log error {math.sqrt(best[1] / len(TABLE1)):.3f}); profile has {e0}")


if __name__ == "__main__":
    sys.exit(main())
