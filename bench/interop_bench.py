#!/usr/bin/env python3
"""Checkpoint import/export throughput (docs/interop.md) against the write limit.

A GPT model (fp32 parameters, no optimizer state, so every format carries the same
bytes) is written by `tenplex ckpt init --config tp=2,pp=2`; then, timed:

  export hf        `tenplex export --to hf`        (one safetensors file + config.json)
  import hf        `tenplex import --from hf`      (into tp=2,pp=2)
  export dcp       `tenplex export --to dcp`       (torch's DCP writer, one process)
  import dcp       `tenplex import --from dcp`     (torch's DCP reader)
  export megatron  `tenplex export --to megatron`  (torch.save per TP x PP rank)
  import megatron  `tenplex import --from megatron`

GB/s is the model's bytes over the command's wall time (process start, Python and torch
imports, checks before and after included). The limit is writing the same bytes to one
file in the same directory with fsync, measured in this run; `ratio` = limit time /
command time (1.0 = as fast as the write alone). `startup_s` is the fixed cost of every
command measured in the same run (`python -c "import torch, numpy"`, the
helper's interpreter start), and `gb_per_s_after_startup` the rate without it.

  interop_bench.py --tenplex build/bin/tenplex [--out docs/benchmarks] [--quick] [--dir D]
Writes OUT/interop.csv.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from bench_csv import write_rows  # noqa: E402
from dcp_peer_bench import du_bytes, write_limit_s  # noqa: E402


def timed(cmd):
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    s = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"interop_bench: {' '.join(cmd)} failed:\n{p.stderr}")
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tenplex", required=True)
    ap.add_argument("--out", default="docs/benchmarks")
    ap.add_argument("--dir", default="", help="where to write (default: a folder beside the repository)")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    h, layers = (512, 4) if a.quick else (1024, 8)
    root = tempfile.mkdtemp(
        prefix="tenplex-interop-bench-",
        dir=a.dir or os.path.dirname(os.path.abspath(os.path.join(__file__, "..", ".."))),
    )
    rows = []
    try:
        model = os.path.join(root, "model.json")
        subprocess.run(
            [
                a.tenplex,
                "model",
                "gpt",
                "--num-layers",
                str(layers),
                "--hidden-size",
                str(h),
                "--num-attention-heads",
                "16",
                "--vocab-size",
                "32000",
                "--max-position-embeddings",
                "1024",
                "--optimizer",
                "none",
                "-o",
                model,
            ],
            check=True,
        )
        ck = os.path.join(root, "ck")
        subprocess.run(
            [a.tenplex, "ckpt", "init", "--model", model, "--config", "tp=2,pp=2", "--out", ck],
            check=True,
            capture_output=True,
        )
        nbytes = du_bytes(ck)
        startup = min(timed([sys.executable, "-c", "import torch, numpy"]) for _ in range(3))
        for fmt in ("hf", "dcp", "megatron"):
            out = os.path.join(root, fmt)
            back = os.path.join(root, fmt + "-back")
            steps = [
                ("export", [a.tenplex, "export", "--to", fmt, ck, "--out", out]),
                (
                    "import",
                    [a.tenplex, "import", "--from", fmt, out, "--model", model, "--config", "tp=2,pp=2", "--out", back],
                ),
            ]
            for what, cmd in steps:
                best = None
                for _rep in range(1 if a.quick else 2):
                    for d in (out, back) if what == "export" else (back,):
                        shutil.rmtree(d, ignore_errors=True)
                    if what == "import" and not os.path.exists(out):
                        timed(steps[0][1])
                    s = timed(cmd)
                    best = s if best is None else min(best, s)
                limit = write_limit_s(root, nbytes)
                rows.append(
                    {
                        "step": f"{what} {fmt}",
                        "bytes": nbytes,
                        "seconds": round(best, 4),
                        "gb_per_s": round(nbytes / best / 1e9, 3),
                        "startup_s": round(startup, 3),
                        "gb_per_s_after_startup": round(nbytes / max(best - startup, 1e-9) / 1e9, 3),
                        "write_limit_gb_per_s": round(nbytes / limit / 1e9, 3),
                        "ratio_to_limit": round(limit / best, 3),
                    }
                )
                print(
                    f"{what:6s} {fmt:8s} {nbytes / 1e9:6.3f} GB  {best:7.3f} s  {nbytes / best / 1e9:6.3f} GB/s  "
                    f"(startup {startup:.2f} s: {nbytes / max(best - startup, 1e-9) / 1e9:6.3f} GB/s)  "
                    f"write limit {nbytes / limit / 1e9:6.3f} GB/s  ratio {limit / best:5.2f}",
                    flush=True,
                )
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(back, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    write_rows(a.out, "interop.csv", rows, "interop")


if __name__ == "__main__":
    main()
