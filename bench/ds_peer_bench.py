#!/usr/bin/env python3
"""Changing the parallelism of a DeepSpeed ZeRO checkpoint: DeepSpeed's universal
checkpoint converter (ds_to_universal) against tenplex, time and disk used, with the
write+fsync limit of the same bytes measured in the same run.

State: `tenplex model gpt --preset gpt3-125m --optimizer adam --params-dtype bf16
--num-layers L` (bf16 parameters, fp32 master copies, Adam exp_avg and exp_avg_sq;
L = 6: 1.16 GB). Setup (not timed): DeepSpeed (CPU accelerator, gloo, 2 data-parallel
processes, ZeRO-2, torch Adam; the trainer of tests/interop_ds_test.py, whose parameter
names are the tenplex global names) takes one step and saves its ZeRO checkpoint
(`ds_ckpt_MB`).

  peer   : `python -m deepspeed.checkpoint.ds_to_universal --input_folder ...
           --output_folder ...` (default workers: 4 extract, 2 merge). It writes one
           temporary file per (parameter, state, ZeRO rank) under <out>/tmp, merges them
           into one file per (parameter, state), then deletes tmp. Timed with process
           start (`peer_s`; `peer_start_s`: starting Python and importing the converter
           alone); `peer_peak_disk_MB` is the largest size of the output folder
           seen by a sampler walking it every 0.1 s (a lower bound of the true peak),
           `peer_files_peak` the most files seen; `peer_out_MB` what stays. A DeepSpeed
           job then loads the universal folder in its new configuration (not measured).
  import : `tenplex import --from ds-universal` of that universal folder into NEW
           (the way into tenplex from a DeepSpeed job; with process start).
  reshard: `tenplex reshard` of the same state, OLD -> NEW, tenplex layouts (OLD_DIR
           written by `tenplex ckpt init --config OLD`, not timed; --no-verify):
           what tenplex does instead of a universal conversion + reload.
  limit  : writing the state's bytes to one new file with fsync (before and after; best).

Runs on disk (a directory in the repository's parent file system). Writes
docs/benchmarks/ds_peer.csv.
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time

from bench_csv import write_rows

HERE = os.path.dirname(os.path.abspath(__file__))
TEST = os.path.join(HERE, "..", "tests", "interop_ds_test.py")


def walk_size(path):
    """(bytes, files) under path; files vanishing while walking are skipped."""
    total = n = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
                n += 1
            except OSError:
                pass
    return total, n


class DiskSampler(threading.Thread):
    """Largest size and file count of a folder while a command runs."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.path, self.peak, self.files, self.stop = path, 0, 0, threading.Event()

    def run(self):
        while not self.stop.is_set():
            b, n = walk_size(self.path)
            self.peak, self.files = max(self.peak, b), max(self.files, n)
            self.stop.wait(0.1)


def write_limit_s(root, nbytes):
    buf = b"\1" * (64 << 20)
    path = os.path.join(root, "write_limit.bin")
    t = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    left = nbytes
    while left > 0:
        left -= os.write(fd, memoryview(buf)[: min(left, len(buf))])
    os.fsync(fd)
    os.close(fd)
    s = time.perf_counter() - t
    os.unlink(path)
    return s


def timed(cmd, env=None):
    t = time.perf_counter()
    p = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    s = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-3000:]}")
    return s


def ds_env():
    return dict(os.environ, DS_ACCELERATOR="cpu", PYTHONPATH=os.path.join(HERE, "..", "python"))


def deepspeed_checkpoint(mpath, root):
    """DeepSpeed saves a ZeRO-2 checkpoint after one step (2 processes); its folder."""
    port = 29500 + os.getpid() % 1000
    procs = [
        subprocess.Popen(
            [sys.executable, TEST, "--train", str(r), mpath, "2", "bf16", root, str(port), "1", "noref"],
            env=ds_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    for r, p in enumerate(procs):
        out = p.communicate()[0]
        if p.returncode != 0:
            raise SystemExit(f"DeepSpeed rank {r} exited {p.returncode}:\n{out[-3000:]}")
    return os.path.join(root, "global_step1")


def run_peer(src, dst):
    sampler = DiskSampler(dst)
    sampler.start()
    try:
        s = timed(
            [
                sys.executable,
                "-m",
                "deepspeed.checkpoint.ds_to_universal",
                "--input_folder",
                src,
                "--output_folder",
                dst,
            ],
            env=ds_env(),
        )
    finally:
        sampler.stop.set()
        sampler.join()
    subprocess.run(["sync"])
    return s, sampler.peak, sampler.files


def measure(a, root, tp):
    mpath = os.path.join(root, "model.json")
    subprocess.run(
        [
            tp,
            "model",
            "gpt",
            "--preset",
            "gpt3-125m",
            "--optimizer",
            "adam",
            "--params-dtype",
            "bf16",
            "--num-layers",
            str(a.layers),
            "-o",
            mpath,
        ],
        check=True,
    )
    with open(mpath) as f:
        model = json.load(f)
    nbytes = sum((2 + 4 + 4 + 4) * math.prod(t["shape"]) for t in model["tensors"])
    wl = [write_limit_s(root, nbytes)]
    src = deepspeed_checkpoint(mpath, os.path.join(root, "ds"))
    row = {
        "state_MB": round(nbytes / 1e6, 1),
        "params_M": round(nbytes / 14 / 1e6, 1),
        "ds_ckpt_MB": round(walk_size(src)[0] / 1e6, 1),
        "new_world": a.new,
    }
    peer, imp, ours = [], [], []
    old = os.path.join(root, "old")
    subprocess.run(
        [tp, "ckpt", "init", "--model", mpath, "--config", a.old, "--out", old], check=True, stdout=subprocess.DEVNULL
    )
    for r in range(a.reps):
        uni = os.path.join(root, "ds", f"uni{r}")
        peer.append(run_peer(src, uni))
        peer_out = walk_size(uni)
        out = os.path.join(root, f"imp{r}")
        imp.append(
            timed([tp, "import", "--from", "ds-universal", uni, "--model", mpath, "--config", a.new, "--out", out])
        )
        subprocess.run(["sync"])
        imp_out = walk_size(out)[0]
        shutil.rmtree(out)
        shutil.rmtree(uni)
        out = os.path.join(root, f"new{r}")
        ours.append(timed([tp, "reshard", "-q", "--no-verify", "--in", old, "--to", a.new, "--out", out]))
        subprocess.run(["sync"])
        ours_out = walk_size(out)[0]
        shutil.rmtree(out)
    wl.append(write_limit_s(root, nbytes))
    start = min(
        timed([sys.executable, "-c", "import deepspeed.checkpoint.ds_to_universal"], env=ds_env()) for _ in range(2)
    )
    p = min(peer)
    w = min(wl)
    row.update(
        {
            "old_world": a.old,
            "peer_s": round(p[0], 3),
            "peer_peak_disk_MB": round(max(x[1] for x in peer) / 1e6, 1),
            "peer_start_s": round(start, 3),
            "peer_files_peak": max(x[2] for x in peer),
            "peer_out_MB": round(peer_out[0] / 1e6, 1),
            "peer_out_files": peer_out[1],
            "import_s": round(min(imp), 3),
            "import_out_MB": round(imp_out / 1e6, 1),
            "reshard_s": round(min(ours), 3),
            "reshard_out_MB": round(ours_out / 1e6, 1),
            "write_limit_s": round(w, 3),
            "peer_over_write_limit": round(p[0] / w, 2),
            "import_over_write_limit": round(min(imp) / w, 2),
            "reshard_over_write_limit": round(min(ours) / w, 2),
            "peer_over_reshard": round(p[0] / min(ours), 2),
            "reps": a.reps,
        }
    )
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tenplex", default="build/bin/tenplex")
    ap.add_argument("--layers", type=int, default=6, help="gpt3-125m with this many layers (6: 1.16 GB)")
    ap.add_argument("--old", default="dp=2,zero=1", help="tenplex layout of the reshard source (the DeepSpeed run's)")
    ap.add_argument("--new", default="tp=2,pp=2")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--disk-dir", default=None, help="directory on disk (default ../.tenplex-bench-ds)")
    ap.add_argument("--out", default="docs/benchmarks")
    a = ap.parse_args()
    tp = os.path.abspath(a.tenplex)
    root = a.disk_dir or os.path.abspath(os.path.join(os.getcwd(), "..", ".tenplex-bench-ds"))
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    try:
        row = measure(a, root, tp)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"[ds_peer] {row}", flush=True)
    write_rows(a.out, "ds_peer.csv", [row], "ds_peer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
