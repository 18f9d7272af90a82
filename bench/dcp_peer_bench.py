#!/usr/bin/env python3
"""Re-partitioning a GPT + Adam checkpoint: tenplex reshard against PyTorch 2.x distributed
checkpointing (torch.distributed.checkpoint, "DCP") loading with resharding, with time and
peak memory, against the write+fsync and memcpy limits measured in the same run.

Same state, same bytes on both sides: the model JSON from `tenplex model gpt --preset
gpt3-125m --optimizer adam --num-layers L` (parameters plus exp_avg and exp_avg_sq, fp32;
>= 1 GB with the default L = 8). Both go from layout OLD (default tp=4,pp=1) to NEW
(default tp=2,pp=2), a TP and PP change:

  ours : `tenplex reshard --in OLD_DIR --to NEW --out NEW_DIR --no-verify` (OLD_DIR written
         by `tenplex ckpt init --config OLD`). Peak memory: the process's RSS high-water
         (ru_maxrss from wait4).
  peer : the job torch 2.x users run. One process per rank of a (pp, tp) DeviceMesh
         (init_device_mesh("cpu"), gloo); every rank holds the tensors of its pipeline
         stage as DTensors on its tp sub-mesh with Megatron's tensor-parallel placements
         (QKV, fc1, embedding, output layer Shard(0); proj, fc2 Shard(1); norms and the
         rest Replicate) and Adam moments placed like their parameters. Setup (not timed):
         the OLD ranks `dcp.save`. Timed: the NEW ranks `dcp.load` from that directory
         (torch reshards while loading; its reader reads every saved chunk whole, pytorch
         issue 76331) and `dcp.save` into a new directory, from a barrier to the end of the
         save (`peer_s`); `peer_with_spawn_s` includes starting the processes. Peak memory:
         VmHWM of every rank (summed: they run at the same time), and the sum of their VmRSS
         right after `import torch` and the process group (the floor of a Python + torch
         process).
  limit: writing the same bytes to one new file in the same place with fsync, and memcpy
         of the same bytes (numpy copyto of a 256 MiB buffer, scaled); both in this run.

Runs in /dev/shm and on disk (a directory in the repository's parent file system). Writes
docs/benchmarks/dcp_peer.csv (bench/plot_benchmarks.py draws dcp_peer.png from it).
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from bench_csv import write_rows

COLWISE = ("linear_qkv", "linear_fc1", "word_embeddings", "output_layer")
ROWWISE = ("linear_proj", "linear_fc2")


def parse_config(cfg):
    kv = dict(x.split("=") for x in cfg.split(","))
    return int(kv.get("tp", 1)), int(kv.get("pp", 1))


def state_tensors(model):
    """(name, shape) of every parameter and Adam state, fp32."""
    out = []
    for t in model["tensors"]:
        out.append((t["path"], t["shape"]))
        for s in model["optimizer"]["states"]:
            out.append((f"optimizer.{s}.{t['path']}", t["shape"]))
    return out


def stage_of(name, layers, pp):
    """The pipeline stages holding a tensor (layers split evenly, embeddings first, the
    final norm and the output layer last)."""
    base = name.split("optimizer.", 1)[-1].split(".", 1)[-1] if name.startswith("optimizer.") else name
    if ".layers." in "." + base:
        i = int(base.split("layers.", 1)[1].split(".", 1)[0])
        return i * pp // layers
    if base.startswith("embedding."):
        return 0
    return pp - 1


def placement(name, shape):
    from torch.distributed.tensor import Replicate, Shard

    mod = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else name
    leaf = name.rsplit(".", 1)[-1]
    if mod in COLWISE and leaf in ("weight", "bias"):
        return Shard(0)
    if mod in ROWWISE and leaf == "weight" and len(shape) == 2:
        return Shard(1)
    return Replicate()


def vm_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _peer_state(model, cfg):
    """This rank's DTensors (uninitialised) of layout cfg on a (pp, tp) mesh."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import empty as dt_empty

    tp, pp = parse_config(cfg)
    mesh = init_device_mesh("cpu", (pp, tp), mesh_dim_names=("pp", "tp"))
    stage = mesh.get_coordinate()[0]
    layers = int(model["info"]["num_layers"])
    sd = {}
    for name, shape in state_tensors(model):
        if stage_of(name, layers, pp) == stage:
            sd[name] = dt_empty(shape, dtype=torch.float32, device_mesh=mesh["tp"], placements=[placement(name, shape)])
    return sd


def _peer_worker(rank, world, rdzv_file, model_path, cfg, load_dir, save_dir, result_dir):
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    # a rendezvous file: no TCP port to collide with another program's
    dist.init_process_group("gloo", init_method="file://" + rdzv_file, rank=rank, world_size=world)
    torch.set_num_threads(1)
    floor = vm_kb("VmRSS")
    with open(model_path) as f:
        model = json.load(f)
    sd = _peer_state(model, cfg)
    if load_dir is None:  # the old layout's save: deterministic content
        for v in sd.values():
            v.to_local().fill_(float(rank))
    dist.barrier()
    t0 = time.perf_counter()
    if load_dir is not None:
        dcp.load(sd, checkpoint_id=load_dir)
    t1 = time.perf_counter()
    dcp.save(sd, checkpoint_id=save_dir)
    dist.barrier()
    t2 = time.perf_counter()
    with open(os.path.join(result_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"load_s": t1 - t0, "save_s": t2 - t1, "floor_kb": floor, "hwm_kb": vm_kb("VmHWM")}, f)
    dist.destroy_process_group()


def run_peer(cfg, model_path, load_dir, save_dir, tmp):
    """Starts the ranks of cfg (torch.multiprocessing, spawn); rank 0's times, summed memory."""
    import torch.multiprocessing as mp

    tp, pp = parse_config(cfg)
    world = tp * pp
    res = tempfile.mkdtemp(dir=tmp)
    rdzv_file = os.path.join(res, "rendezvous")
    mp.start_processes(
        _peer_worker,
        args=(world, rdzv_file, model_path, cfg, load_dir, save_dir, res),
        nprocs=world,
        join=True,
        start_method="spawn",
    )
    rs = [json.load(open(os.path.join(res, f"rank{r}.json"))) for r in range(world)]
    shutil.rmtree(res)
    return {
        "s": rs[0]["load_s"] + rs[0]["save_s"],
        "load_s": rs[0]["load_s"],
        "hwm_mb": sum(r["hwm_kb"] for r in rs) / 1024,
        "hwm_max_mb": max(r["hwm_kb"] for r in rs) / 1024,
        "floor_mb": sum(r["floor_kb"] for r in rs) / 1024,
    }


# Runs argv[1:] in a forked child of a bare Python (no torch, about 10 MB) and prints the
# child's ru_maxrss. Measuring from this process instead would count the bench's own RSS:
# Linux carries the RSS high-water of the process that forks into the child's ru_maxrss
# across exec.
_LAUNCHER = (
    "import os, sys\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.execv(sys.argv[1], sys.argv[1:])\n"
    "_, st, ru = os.wait4(pid, 0)\n"
    "print(ru.ru_maxrss, flush=True)\n"
    "sys.exit(os.waitstatus_to_exitcode(st))\n"
)


def run_ours(cmd):
    """(seconds, peak RSS MB) of one command (the launcher's start is in the seconds:
    about 20 ms)."""
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", _LAUNCHER] + cmd, stdout=subprocess.PIPE, text=True)
    s = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {p.returncode}")
    return s, int(p.stdout.split()[-1]) / 1024


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
        left -= os.write(fd, memoryview(buf)[: min(left, buf.nbytes)])
    os.fsync(fd)
    os.close(fd)
    s = time.perf_counter() - t
    os.unlink(path)
    return s


def measure_place(a, place, root, tp):
    """One row: ours, the peer and the limits in one place."""
    gen = [tp, "model", "gpt", "--preset", "gpt3-125m", "--optimizer", "adam", "--num-layers", str(a.layers)]
    if a.quick:
        gen += ["--hidden-size", "256", "--num-attention-heads", "8"]
    mpath = os.path.join(root, "model.json")
    subprocess.run(gen + ["-o", mpath], check=True, stdout=subprocess.DEVNULL)
    with open(mpath) as f:
        model = json.load(f)
    nbytes = sum(4 * math.prod(s) for _, s in state_tensors(model))
    old = os.path.join(root, "old")
    subprocess.run(
        [tp, "ckpt", "init", "--model", mpath, "--config", a.old, "--out", old], check=True, stdout=subprocess.DEVNULL
    )
    sync = (lambda: subprocess.run(["sync"])) if place == "disk" else (lambda: None)
    wl = [write_limit_s(root, nbytes)]
    fresh = fresh_mmap_gbps(root)
    ours, ours_mmap = [], []
    for r in range(a.reps):
        # today's streamed output path and the earlier one (--mmap-output), alternately
        for extra, times in (([], ours), (["--mmap-output"], ours_mmap)):
            out = os.path.join(root, f"new{r}")
            s, rss = run_ours([tp, "reshard", "-q", "--no-verify", "--in", old, "--to", a.new, "--out", out] + extra)
            sync()
            times.append((s, rss))
            ours_bytes = du_bytes(out)
            shutil.rmtree(out)
    wl.append(write_limit_s(root, nbytes))
    shutil.rmtree(old)
    row = {
        "place": place,
        "state_MB": round(nbytes / 1e6, 1),
        "old_world": math.prod(parse_config(a.old)),
        "new_world": math.prod(parse_config(a.new)),
        "old_layout": a.old,
        "new_layout": a.new,
    }
    o, o_rss = min(ours)
    om = min(x[0] for x in ours_mmap)
    w = min(wl)
    row.update(
        {
            "ours_s": round(o, 3),
            "ours_peak_rss_MB": round(max(x[1] for x in ours), 1),
            "ours_mmap_output_s": round(om, 3),
            "write_limit_s": round(w, 3),
            "ours_over_write_limit": round(o / w, 2),
            "mmap_output_over_write_limit": round(om / w, 2),
        }
    )
    if a.no_peer:
        return row
    dold = os.path.join(root, "dcp_old")
    run_peer(a.old, mpath, None, dold, root)
    peer = []
    for r in range(a.reps):
        dnew = os.path.join(root, f"dcp_new{r}")
        t = time.perf_counter()
        res = run_peer(a.new, mpath, dold, dnew, root)
        sync()
        res["wall"] = time.perf_counter() - t
        peer.append(res)
        peer_bytes = du_bytes(dnew)
        shutil.rmtree(dnew)
    lim = memcpy_gbps()
    limit_s = nbytes / (lim * 1e9)
    best = min(peer, key=lambda x: x["s"])
    p = best["s"]
    row.update(
        {
            "peer_s": round(p, 3),
            "peer_load_s": round(best["load_s"], 3),
            "peer_with_spawn_s": round(min(x["wall"] for x in peer), 3),
            "peer_peak_rss_MB": round(max(x["hwm_mb"] for x in peer), 1),
            "peer_peak_rss_max_rank_MB": round(max(x["hwm_max_mb"] for x in peer), 1),
            "peer_rss_floor_MB": round(best["floor_mb"], 1),
            "limit_s": round(limit_s, 3),
            "fresh_mmap_memcpy_s": round(nbytes / fresh / 1e9, 3),
            "speedup_vs_peer": round(p / o, 2),
            "peer_over_write_limit": round(p / w, 2),
            "ours_over_limit": round(o / limit_s, 2),
            "peer_over_limit": round(p / limit_s, 2),
            "peer_rss_over_ours": round(max(x["hwm_mb"] for x in peer) / max(x[1] for x in ours), 2),
            "ours_GBps": round(nbytes / o / 1e9, 2),
            "peer_GBps": round(nbytes / p / 1e9, 2),
            "limit_GBps": round(lim, 2),
            "ours_out_MB": round(ours_bytes / 1e6, 1),
            "peer_out_MB": round(peer_bytes / 1e6, 1),
        }
    )
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tenplex", default="build/bin/tenplex")
    ap.add_argument("--layers", type=int, default=8, help="gpt3-125m with this many layers (8: 1.16 GB)")
    ap.add_argument("--old", default="tp=4,pp=1", help="old layout (tp=T,pp=P)")
    ap.add_argument("--new", default="tp=2,pp=2", help="new layout (tp=T,pp=P)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="2 layers, hidden 256, 1 rep")
    ap.add_argument("--disk-dir", default=None, help="directory on disk (default ../.tenplex-bench-dcp)")
    ap.add_argument("--out", default="docs/benchmarks")
    ap.add_argument(
        "--no-peer", action="store_true", help="only ours (both output paths) and the write limit; print, write no CSV"
    )
    a = ap.parse_args()
    if a.quick:
        a.layers, a.reps = 2, 1
    tp = os.path.abspath(a.tenplex)
    disk = a.disk_dir or os.path.abspath(os.path.join(os.getcwd(), "..", ".tenplex-bench-dcp"))
    rows = []
    for place, root in (("shm", f"/dev/shm/tenplex-bench-dcp-{os.getpid()}"), ("disk", disk)):
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        try:
            row = measure_place(a, place, root, tp)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        rows.append(row)
        if a.no_peer:
            print(f"[dcp_peer] {place}: {row}", flush=True)
            continue
        print(
            f"[dcp_peer] {place}: {row['state_MB']} MB {a.old} -> {a.new}: ours {row['ours_s']:.3f} s "
            f"(peak RSS {row['ours_peak_rss_MB']:.0f} MB), torch {torch_version()} DCP {row['peer_s']:.3f} s "
            f"(with process start {row['peer_with_spawn_s']:.3f} s; peak RSS of all ranks "
            f"{row['peer_peak_rss_MB']:.0f} MB, floor {row['peer_rss_floor_MB']:.0f} MB); write+fsync limit "
            f"{row['write_limit_s']:.3f} s, memcpy limit {row['limit_s']:.3f} s; speed-up "
            f"{row['speedup_vs_peer']:.2f}x, ours/write {row['ours_over_write_limit']:.2f}, peer/write "
            f"{row['peer_over_write_limit']:.2f}, ours/memcpy {row['ours_over_limit']:.1f}, peer/memcpy "
            f"{row['peer_over_limit']:.1f}, peer RSS / ours {row['peer_rss_over_ours']:.1f}",
            flush=True,
        )
    if a.no_peer:
        return 0
    write_rows(a.out, "dcp_peer.csv", rows, "dcp_peer")
    return 0


def torch_version():
    import torch

    return torch.__version__.split("+")[0]


if __name__ == "__main__":
    sys.exit(main())
