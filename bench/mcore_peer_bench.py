#!/usr/bin/env python3
"""Changing the TP/PP of a Megatron-Core GPT + Adam checkpoint: Megatron-Core's own
`dist_checkpointing` (load with another TP/PP, then save) against tenplex (import once,
`tenplex reshard`, export), in one run, against the write+fsync limit of the same run.

  mcore_peer_bench.py TENPLEX_BIN [--layers 8] [--hidden 1024] [--old tp=2,pp=2] [--new tp=4,pp=1]
                      [--root DIR] [--out docs/benchmarks]

The state: an MCore GPTModel (local layer spec, GQA 16 heads / 8 groups, SwiGLU, RMSNorm,
untied, vocabulary 32000) and the Adam moments of an MCore FP32Optimizer, fp32 (>= 1 GB
with the defaults), built on the CPU in gloo processes as in tests/interop_mcore_test.py
(same shims). Setup, not timed: the OLD ranks save it with dist_checkpointing.save.

  mcore   : NEW ranks (processes) build the model and optimizer for NEW, then, timed from a
            barrier to the end of the save: dist_checkpointing.load of the OLD checkpoint
            (MCore reshards while loading) and dist_checkpointing.save to a new directory.
            Fully parallel strategies (FullyParallelLoad/SaveStrategyWrapper) are tried
            first; where they fail on the CPU the default torch_dist strategies run and the
            row says so. `mcore_with_start_s` adds starting the processes, importing MCore
            and building the model (what a user's stop/resume pays).
  tenplex : `tenplex import --from mcore` (OLD) once, then `tenplex reshard --to NEW`, then
            `tenplex export --to mcore`; each timed as a whole command (Python start
            included for import/export). Peak memory: ru_maxrss of the command.
  limit   : writing the state's bytes to one new file with fsync, in this run.

Writes docs/benchmarks/mcore_peer.csv.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))

from bench_csv import write_rows  # noqa: E402
from dcp_peer_bench import du_bytes, write_limit_s  # noqa: E402

VOCAB, M = 32000, 128


def cfg(s):
    kv = dict(x.split("=") for x in s.split(","))
    return int(kv.get("tp", 1)), int(kv.get("pp", 1))


def dims(a):
    return dict(L=a.layers, h=a.hidden, a=16, g=8, f=a.ffn)


def padded(tp):
    return -(-VOCAB // (M * tp)) * M * tp


def vm_hwm_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def strategies(parallel, src):
    """(load strategy, save strategy) for dist_checkpointing: fully parallel wrappers or None."""
    if not parallel:
        return None, None
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.serialization import (
        get_default_load_sharded_strategy,
        get_default_save_sharded_strategy,
    )
    from megatron.core.dist_checkpointing.strategies.fully_parallel import (
        FullyParallelLoadStrategyWrapper,
        FullyParallelSaveStrategyWrapper,
    )

    group = ps.get_data_parallel_group(with_context_parallel=True)
    return (
        FullyParallelLoadStrategyWrapper(get_default_load_sharded_strategy(src), group),
        FullyParallelSaveStrategyWrapper(get_default_save_sharded_strategy(), group),
    )


def worker(rank, tp, pp, mode, src, dst, tmp, d, parallel):
    import interop_mcore_test as T
    import torch
    import torch.distributed as dist

    T.mcore_cpu_shim()
    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg-{mode}-{parallel}", rank=rank, world_size=tp * pp)
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps

    ps.initialize_model_parallel(tp, pp)
    model, opt = T.build(tp, pp, vocab=padded(tp), init=False, **d)
    msd = model.sharded_state_dict()
    if mode == "save":
        with torch.no_grad():
            g = torch.Generator().manual_seed(rank)
            for v in list(model.parameters()) + [s for st in opt.optimizer.state.values() for s in st.values()]:
                if v.dim() > 0:
                    v.copy_(torch.randn(v.shape, generator=g))
        dist_checkpointing.save({"model": msd, "optimizer": opt.sharded_state_dict(msd)}, src)
        return
    load_s, save_s = strategies(parallel, src)
    dist.barrier()
    t0 = time.perf_counter()
    state = dist_checkpointing.load(
        {"model": msd, "optimizer": opt.sharded_state_dict(msd, is_loading=True)}, src, sharded_strategy=load_s
    )
    t1 = time.perf_counter()
    model.load_state_dict(state["model"], strict=True)
    msd = model.sharded_state_dict()
    dist_checkpointing.save({"model": msd, "optimizer": opt.sharded_state_dict(msd)}, dst, sharded_strategy=save_s)
    dist.barrier()
    t2 = time.perf_counter()
    with open(f"{tmp}/rank-{rank}.json", "w") as f:
        json.dump({"load_s": t1 - t0, "total_s": t2 - t0, "hwm_mib": vm_hwm_mib()}, f)


def spawn(mode, tp, pp, src, dst, tmp, d, parallel=False, timeout=3600):
    """Runs tp*pp worker processes; returns (wall seconds, per-rank results or None, log tail)."""
    t0 = time.perf_counter()
    args = [json.dumps(d), str(int(parallel))]
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", mode, str(r), str(tp), str(pp), src, dst, tmp, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(tp * pp)
    ]
    logs = [tempfile.TemporaryFile(mode="w+") for _ in procs]
    pumps = [
        __import__("threading").Thread(target=lambda p=p, f=f: shutil.copyfileobj(p.stdout, f))
        for p, f in zip(procs, logs)
    ]
    for t in pumps:
        t.start()
    while any(p.poll() is None for p in procs):
        # one failed rank leaves the others waiting in a collective: stop them (and a hang)
        if any(p.returncode not in (None, 0) for p in procs) or time.perf_counter() - t0 > timeout:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.2)
    for t in pumps:
        t.join()
    outs = []
    for f in logs:
        f.seek(0)
        outs.append(f.read())
    wall = time.perf_counter() - t0
    if any(p.returncode != 0 for p in procs):
        failed = [o for p, o in zip(procs, outs) if p.returncode not in (0, -9)] or outs
        return wall, None, (failed[0] or f"killed after {timeout} s")[-3000:]
    if mode == "save":
        return wall, [], ""
    res = [json.load(open(f"{tmp}/rank-{r}.json")) for r in range(tp * pp)]
    return wall, res, ""


def timed(cmd):
    """(seconds, peak RSS MiB) of a command run to completion."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, ru = os.wait4(p.pid, 0)
    s = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"FAIL: {' '.join(cmd)}:\n{p.stderr.read()[-3000:]}")
    return s, ru.ru_maxrss / 1024


def mcore_side(a, d, src, root, tmp, nbytes):
    """MCore's reshard: fully parallel strategies first, the default ones where they fail."""
    tp, pp = cfg(a.new)
    rows, note = [], ""
    for parallel in (True, False):
        dst = os.path.join(root, f"mcore-new-{int(parallel)}")
        os.makedirs(dst)
        wall, res, log = spawn("reshard", tp, pp, src, dst, tmp, d, parallel, timeout=90 if parallel else 3600)
        if res is None:
            last = [x for x in log.strip().splitlines() if "Error" in x or "error" in x]
            note = "fully parallel strategies fail on the CPU: " + (
                (last or [""])[-1].strip()[:160] or log.strip()[-160:]
            )
            print(f"[mcore_peer] {note}", flush=True)
            shutil.rmtree(dst, ignore_errors=True)
            continue
        s = max(r["total_s"] for r in res)
        rows.append(
            {
                "method": "mcore load+save" + (" (fully parallel)" if parallel else " (torch_dist default)"),
                "seconds": s,
                "with_start_s": wall,
                "load_s": max(r["load_s"] for r in res),
                "peak_mib": sum(r["hwm_mib"] for r in res),
                "disk_bytes": du_bytes(dst),
            }
        )
        shutil.rmtree(dst, ignore_errors=True)
        if parallel:
            break
    return rows, note


def tenplex_side(a, model_file, src, root):
    t_in, t_new, out = (os.path.join(root, x) for x in ("t-old", "t-new", "mcore-from-tenplex"))
    rows = []
    for name, cmd in (
        (
            "tenplex import --from mcore",
            [a.tenplex, "import", "--from", "mcore", src, "--model", model_file, "--config", a.old, "--out", t_in],
        ),
        ("tenplex reshard", [a.tenplex, "reshard", "--in", t_in, "--to", a.new, "--out", t_new]),
        ("tenplex export --to mcore", [a.tenplex, "export", "--to", "mcore", t_new, "--out", out, "--config", a.new]),
    ):
        s, rss = timed(cmd)
        rows.append(
            {
                "method": name,
                "seconds": s,
                "with_start_s": s,
                "load_s": "",
                "peak_mib": rss,
                "disk_bytes": du_bytes(cmd[cmd.index("--out") + 1]),
            }
        )
        print(f"[mcore_peer] {name}: {s:.2f} s", flush=True)
    return rows


def main():
    p = argparse.ArgumentParser()
    p.add_argument("tenplex")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--ffn", type=int, default=2816)
    p.add_argument("--old", default="tp=2,pp=2")
    p.add_argument("--new", default="tp=4,pp=1")
    p.add_argument("--root", default=os.path.dirname(REPO))
    p.add_argument("--out", default=os.path.join(REPO, "docs", "benchmarks"))
    a = p.parse_args()
    a.tenplex = os.path.abspath(a.tenplex)
    d = dims(a)
    root = tempfile.mkdtemp(prefix="tenplex-mcore-bench-", dir=a.root)
    tmp = os.path.join(root, "tmp")
    os.makedirs(tmp)
    try:
        model_file = os.path.join(root, "gpt.json")
        subprocess.run(
            [
                a.tenplex,
                "model",
                "gpt",
                "--num-layers",
                str(a.layers),
                "--hidden-size",
                str(a.hidden),
                "--ffn-hidden-size",
                str(a.ffn),
                "--num-attention-heads",
                "16",
                "--num-query-groups",
                "8",
                "--vocab-size",
                str(VOCAB),
                "--make-vocab-size-divisible-by",
                str(M),
                "--max-position-embeddings",
                "128",
                "--position-embedding-type",
                "rope",
                "--swiglu",
                "--disable-bias-linear",
                "--untie-embeddings-and-output-weights",
                "--normalization",
                "RMSNorm",
                "--optimizer",
                "adam",
                "-o",
                model_file,
            ],
            check=True,
        )
        model = json.load(open(model_file))
        nbytes = 3 * 4 * sum(int(__import__("math").prod(t["shape"])) for t in model["tensors"])
        src = os.path.join(root, "mcore-old")
        os.makedirs(src)
        otp, opp = cfg(a.old)
        wall, res, log = spawn("save", otp, opp, src, "-", tmp, d)
        if res is None:
            sys.exit(f"FAIL: MCore save:\n{log}")
        print(
            f"[mcore_peer] state {nbytes / 1e9:.3f} GB (params + Adam moments, fp32); MCore saved it in "
            f"{a.old} ({wall:.1f} s, setup)",
            flush=True,
        )
        limit0 = write_limit_s(root, nbytes)
        mrows, note = mcore_side(a, d, src, root, tmp, nbytes)
        trows = tenplex_side(a, model_file, src, root)
        limit1 = write_limit_s(root, nbytes)
        report(a, mrows + trows, nbytes, (limit0 + limit1) / 2, (limit0, limit1), note)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def report(a, rows, nbytes, limit, limits, note):
    mcore = rows[0]["seconds"]
    mcore_start = rows[0]["with_start_s"]
    imp, resh, exp = rows[-3]["seconds"], rows[-2]["seconds"], rows[-1]["seconds"]
    rows.append(
        {
            "method": "tenplex import+reshard+export",
            "seconds": imp + resh + exp,
            "with_start_s": imp + resh + exp,
            "load_s": "",
            "peak_mib": max(r["peak_mib"] for r in rows[-3:]),
            "disk_bytes": "",
        }
    )
    out = []
    print(
        f"\n{a.old} -> {a.new}, {nbytes / 1e9:.3f} GB; write+fsync limit {nbytes / limit / 1e9:.3f} GB/s "
        f"(before {nbytes / limits[0] / 1e9:.3f}, after {nbytes / limits[1] / 1e9:.3f})"
    )
    print(
        f"{'method':42s} {'seconds':>8s} {'GB/s':>7s} {'limit/s':>8s} {'mcore/this':>10s} {'with start':>10s} "
        f"{'peak MiB':>9s}"
    )
    for r in rows:
        s = r["seconds"]
        row = {
            "method": r["method"],
            "old": a.old,
            "new": a.new,
            "state_bytes": nbytes,
            "seconds": round(s, 3),
            "gb_per_s": round(nbytes / s / 1e9, 3),
            "seconds_with_start": round(r["with_start_s"], 3),
            "mcore_load_s": round(r["load_s"], 3) if r["load_s"] != "" else "",
            "write_limit_gb_per_s": round(nbytes / limit / 1e9, 3),
            "ratio_to_limit": round(limit / s, 3),
            "mcore_over_this": round(mcore / s, 2),
            "mcore_with_start_over_this": round(mcore_start / s, 2),
            "peak_rss_mib": round(r["peak_mib"], 1),
            "output_disk_bytes": r["disk_bytes"],
            "note": note,
        }
        out.append(row)
        print(
            f"{r['method']:42s} {s:8.2f} {row['gb_per_s']:7.3f} {row['ratio_to_limit']:8.3f} "
            f"{row['mcore_over_this']:10.2f} {row['seconds_with_start']:10.2f} {row['peak_rss_mib']:9.0f}"
        )
    write_rows(a.out, "mcore_peer.csv", out, "mcore_peer")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        mode, rank, tp, pp, src, dst, tmp, d, par = sys.argv[2:11]
        worker(int(rank), int(tp), int(pp), mode, src, dst, tmp, json.loads(d), par == "1")
    else:
        main()
