#!/usr/bin/python3
"""Re-partitioning a GPT + Adam checkpoint: tenplex reshard against PyTorch's sharded
checkpointing (torch.distributed._shard.checkpoint, "DCP", torch 1.13), and the memcpy limit.

Same state, same bytes on both sides: the model JSON from `tenplex model gpt ... --optimizer
adam` (parameters plus exp_avg and exp_avg_sq, fp32). Both start from a checkpoint written on
the old world size and end with a checkpoint written for the new world size:

  ours : `tenplex reshard --in OLD --to tp=NEW --out NEW_DIR --no-verify` (OLD written by
         `tenplex ckpt init --config tp=OLD`).
  peer : NEW processes (gloo, one per rank) each build ShardedTensors chunked over NEW ranks,
         `load_state_dict` from the DCP directory saved by OLD ranks (DCP reshards on load),
         then `save_state_dict` into a new directory. Timed from process start of the load
         phase's first barrier to the end of the save (the OLD save is setup, not timed).
  limit: copying the same bytes once with memcpy (numpy copyto of a 256 MiB buffer, scaled),
         and writing the same bytes to one file in the same place with fsync; both measured
         in this run.

Runs in /dev/shm and on disk (a directory in the repository's parent file system).
Writes docs/benchmarks/dcp_peer.csv. The DCP import fix for Python 3.11 is in
python/tenplex/dcp_compat.py (see docs/benchmarks.md).
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time

import numpy as np
from bench_csv import write_rows


def _import_dcp():
    """The torch 1.13 / Python 3.11 DCP import fix, shared with the interop helper
    (python/tenplex/dcp_compat.py)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    from tenplex.dcp_compat import import_dcp
    return import_dcp()


def state_tensors(model):
    """(name, shape) of every parameter and Adam state, fp32."""
    out = []
    for t in model["tensors"]:
        out.append((t["path"], t["shape"]))
        for s in model["optimizer"]["states"]:
            out.append((t["path"] + "." + s, t["shape"]))
    return out


def _worker(rank, world, rdzv_file, model_path, load_dir, save_dir, result_path):
    import torch
    import torch.distributed as dist
    dcp, st, Chunk = _import_dcp()
    # a rendezvous file: no TCP port to collide with another program's
    dist.init_process_group("gloo", init_method="file://" + rdzv_file, rank=rank, world_size=world)
    torch.set_num_threads(1)
    model = json.load(open(model_path))
    spec = Chunk(dim=0, placements=[f"rank:{r}/cpu" for r in range(world)])
    sd = {}
    for name, shape in state_tensors(model):
        t = st.empty(spec, *shape, dtype=torch.float32)
        if load_dir is None:  # the old world's save: deterministic content
            for sh in t.local_shards():
                sh.tensor.copy_(torch.arange(sh.tensor.numel(), dtype=torch.float32)
                                .reshape(sh.tensor.shape) + rank)
        sd[name] = t
    dist.barrier()
    t0 = time.perf_counter()
    if load_dir is not None:
        dcp.load_state_dict(sd, dcp.FileSystemReader(load_dir))
    t1 = time.perf_counter()
    dcp.save_state_dict(sd, dcp.FileSystemWriter(save_dir))
    dist.barrier()
    t2 = time.perf_counter()
    if rank == 0:
        json.dump({"load_s": t1 - t0, "save_s": t2 - t1}, open(result_path, "w"))
    dist.destroy_process_group()


def run_world(world, model_path, load_dir, save_dir, tmp):
    import torch.multiprocessing as mp
    res = os.path.join(tmp, "dcp_result.json")
    rdzv_file = os.path.join(tmp, f"rendezvous-{world}-{time.monotonic_ns()}")
    mp.start_processes(_worker, args=(world, rdzv_file, model_path, load_dir, save_dir, res),
                       nprocs=world, join=True, start_method="spawn")
    return json.load(open(res))


def du_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


def memcpy_gbps():
    a = np.ones(256 << 20, dtype=np.uint8)
    b = np.empty_like(a)
    np.copyto(b, a)
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t)
    return a.nbytes / best / 1e9


def fresh_mmap_gbps(root):
    """memcpy into a freshly mapped file in root (every page touched for the first time):
    what writing a new checkpoint through mmap costs at best on this machine."""
    import mmap
    n = 256 << 20
    a = np.ones(n, dtype=np.uint8)
    path = os.path.join(root, "fresh_mmap.bin")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, n)
        m = mmap.mmap(fd, n)
        b = np.frombuffer(m, dtype=np.uint8)
        t = time.perf_counter()
        np.copyto(b, a)
        s = time.perf_counter() - t
        del b
        m.close()
    finally:
        os.close(fd)
        os.unlink(path)
    return n / s / 1e9


def write_limit_s(root, nbytes):
    """Seconds to write nbytes to one new file in root and fsync it (the device's limit)."""
    buf = np.ones(min(nbytes, 64 << 20), dtype=np.uint8)
    path = os.path.join(root, "write_limit.bin")
    t = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    left = nbytes
    while left > 0:
        left -= os.write(fd, memoryview(buf)[:min(left, buf.nbytes)])
    os.fsync(fd)
    os.close(fd)
    s = time.perf_counter() - t
    os.unlink(path)
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tenplex", default="build/bin/tenplex")
    ap.add_argument("--layers", type=int, default=4, help="gpt3-125m with this many layers")
    ap.add_argument("--old", type=int, default=4, help="old world size (tp)")
    ap.add_argument("--new", type=int, default=2, help="new world size (tp)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="2 layers, hidden 256, 1 rep")
    ap.add_argument("--disk-dir", default=None, help="directory on disk (default ../.tenplex-bench)")
    ap.add_argument("--out", default="docs/benchmarks")
    ap.add_argument("--no-peer", action="store_true",
                    help="only ours (both output paths) and the write limit; print, write no CSV")
    a = ap.parse_args()
    tp = os.path.abspath(a.tenplex)
    disk = a.disk_dir or os.path.abspath(os.path.join(os.getcwd(), "..", ".tenplex-bench-dcp"))
    places = [("shm", f"/dev/shm/tenplex-bench-dcp-{os.getpid()}"), ("disk", disk)]
    reps = 1 if a.quick else a.reps
    gen = [tp, "model", "gpt", "--preset", "gpt3-125m", "--optimizer", "adam",
           "--num-layers", str(2 if a.quick else a.layers)]
    if a.quick:
        gen += ["--hidden-size", "256", "--num-attention-heads", "8"]
    os.makedirs(a.out, exist_ok=True)
    rows = []
    lim = memcpy_gbps()
    for place, root in places:
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        try:
            mpath = os.path.join(root, "model.json")
            subprocess.run(gen + ["-o", mpath], check=True)
            model = json.load(open(mpath))
            nbytes = sum(4 * math.prod(s) for _, s in state_tensors(model))
            old = os.path.join(root, "old")
            subprocess.run([tp, "ckpt", "init", "--model", mpath, "--config", f"tp={a.old}",
                            "--out", old], check=True)
            wl = min(write_limit_s(root, nbytes) for _ in range(reps))
            fresh = max(fresh_mmap_gbps(root) for _ in range(reps))
            ours, ours_mmap = [], []
            for r in range(reps):
                # The output path of today and the earlier one (--mmap-output: mapped
                # output files), alternately, so that both see the same machine load.
                for extra, times in (([], ours), (["--mmap-output"], ours_mmap)):
                    out = os.path.join(root, f"new{r}")
                    t = time.perf_counter()
                    subprocess.run([tp, "reshard", "-q", "--no-verify", "--in", old, "--to",
                                    f"tp={a.new}", "--out", out] + extra, check=True)
                    subprocess.run(["sync"]) if place == "disk" else None
                    times.append(time.perf_counter() - t)
                    ours_bytes = du_bytes(out)
                    shutil.rmtree(out)
            wl = min([wl] + [write_limit_s(root, nbytes) for _ in range(reps)])
            shutil.rmtree(old)
            if a.no_peer:
                rows.append({"place": place, "state_MB": round(nbytes / 1e6, 1), "ours_s": round(min(ours), 3),
                             "ours_mmap_output_s": round(min(ours_mmap), 3), "write_limit_s": round(wl, 3),
                             "ours_over_write_limit": round(min(ours) / wl, 2),
                             "mmap_output_over_write_limit": round(min(ours_mmap) / wl, 2),
                             "all_ours_s": [round(x, 3) for x in ours],
                             "all_mmap_s": [round(x, 3) for x in ours_mmap]})
                print(f"[dcp_peer] {place}: {rows[-1]}", flush=True)
                continue
            dold = os.path.join(root, "dcp_old")
            run_world(a.old, mpath, None, dold, root)
            peer = []
            for r in range(reps):
                dnew = os.path.join(root, f"dcp_new{r}")
                t = time.perf_counter()
                res = run_world(a.new, mpath, dold, dnew, root)
                subprocess.run(["sync"]) if place == "disk" else None
                wall = time.perf_counter() - t
                peer.append((res["load_s"] + res["save_s"], wall))
                peer_bytes = du_bytes(dnew)
                shutil.rmtree(dnew)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        o = min(ours)
        p = min(x[0] for x in peer)
        pw = min(x[1] for x in peer)
        limit_s = nbytes / (lim * 1e9)
        om = min(ours_mmap)
        row = {"place": place, "state_MB": round(nbytes / 1e6, 1), "old_world": a.old,
               "new_world": a.new, "ours_s": round(o, 3), "ours_mmap_output_s": round(om, 3),
               "mmap_output_over_write_limit": round(om / wl, 2), "peer_s": round(p, 3),
               "peer_with_spawn_s": round(pw, 3), "limit_s": round(limit_s, 3),
               "write_limit_s": round(wl, 3), "fresh_mmap_memcpy_s": round(nbytes / fresh / 1e9, 3), "ours_over_write_limit": round(o / wl, 2),
               "speedup_vs_peer": round(p / o, 2), "ours_over_limit": round(o / limit_s, 2),
               "ours_GBps": round(nbytes / o / 1e9, 2), "peer_GBps": round(nbytes / p / 1e9, 2),
               "limit_GBps": round(lim, 2), "ours_out_MB": round(ours_bytes / 1e6, 1),
               "peer_out_MB": round(peer_bytes / 1e6, 1)}
        rows.append(row)
        print(f"[dcp_peer] {place}: {row['state_MB']} MB tp={a.old}->{a.new}: ours {o:.3f} s, "
              f"torch DCP {p:.3f} s (with process start {pw:.3f} s), memcpy limit "
              f"{limit_s:.3f} s, write+fsync limit {wl:.3f} s, memcpy into fresh mmap pages "
              f"{nbytes / fresh / 1e9:.3f} s; speed-up {p / o:.2f}x, ours/memcpy {o / limit_s:.1f}, ours/write {o / wl:.2f} "
              f"(earlier mmap output path {om:.3f} s, {om / wl:.2f}x the write limit)",
              flush=True)
    if a.no_peer:
        return 0
    write_rows(a.out, "dcp_peer.csv", rows, "dcp_peer")


if __name__ == "__main__":
    sys.exit(main())
