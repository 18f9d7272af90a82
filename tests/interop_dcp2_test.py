"""`tenplex import --from dcp` / `export --to dcp` judged by torch 2.x DCP itself.

Under pytest (issue 32 §4), ctest interop_dcp2, TENPLEX_BIN the CLI under test:

    python -m pytest tests/interop_dcp2_test.py::test_dcp2

1. 4 gloo processes (CPU) build a 2-D DeviceMesh dp=2 x tp=2 (init_device_mesh), lay a
   small GPT out as a module tree whose parameter names are tenplex's global names,
   parallelize it over the tp dimension with torch.distributed.tensor.parallel
   (ColwiseParallel for QKV / fc1 / output layer, RowwiseParallel for proj / fc2 and the
   vocabulary-parallel embedding), lift every parameter onto the 2-D mesh (Replicate over
   dp), add Adam moments sharded over dp as well (ZeRO-like 2-D DTensors), fill them with
   values drawn here, and `dcp.save` them with step and samples_consumed.
2. `tenplex import --from dcp` into tp=2,pp=2; every element of every rank file is
   compared with the drawn tensors sliced by the independent reference layout
   (tests/reference/layout_ref.py, through interop_test.check_ckpt); step and samples
   carried.
3. `tenplex reshard` to another layout, `tenplex export --to dcp`, and 3 gloo processes
   `dcp.load` it into a 1-D mesh of 3 with other placements (uneven Shard(1) / Shard(0):
   torch reshards on load); every element of every loaded tensor (full_tensor()) is
   compared with the drawn tensors, the local shards add up to the model's size, and
   step and samples come back.
4. One process `dcp.save`s plain tensors (parameters only, no process group) with step and
   samples as 0-d integer tensors; import gives the parameters in every element, Adam
   moments zero, and the step and samples.

The gloo processes are torch.multiprocessing's (spawn): they import this module and run
_save_worker / _load_worker. interop_test's helpers (model_json, run, check_ckpt) read
its globals, which the `interop` fixture sets for the test (interop_test.configured).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
import warnings
import zlib
from collections.abc import Callable
from typing import Any

import interop_test as IT  # check_ckpt: the reference-layout slicing
import numpy as np
import torch

_log = logging.getLogger(__name__)

STEP, SAMPLES = 7, 448
COLWISE = ("linear_qkv", "linear_fc1", "output_layer")
ROWWISE = ("linear_proj", "linear_fc2")
GPT = (
    "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --vocab-size 60 --make-vocab-size-divisible-by 8 "
    "--max-position-embeddings 16 --optimizer adam"
).split()


def draw(name: str, shape: list[int]) -> np.ndarray:
    """The value of a global tensor, the same in every process."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return rng.standard_normal(shape).astype(np.float32)


def globals_of(model: dict[str, Any]) -> dict[str, list[int]]:
    """{global name: shape} of parameters and Adam moments (fp32 model: no master copies)."""
    out = {t["path"]: t["shape"] for t in model["tensors"]}
    for k in model["optimizer"]["states"]:
        for t in model["tensors"]:
            out[f"optimizer.{k}.{t['path']}"] = t["shape"]
    return out


def build_module(model: dict[str, Any]) -> tuple[torch.nn.Module, dict[str, Any]]:
    """A module tree whose parameter names are the model's global names; returns
    (root, tp plan {module path: style})."""
    from torch import nn
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    root, plan = nn.Module(), {}

    def parent(path: str) -> nn.Module:
        m = root
        for part in path.split("."):
            if not hasattr(m, part):
                m.add_module(part, nn.Module())
            m = getattr(m, part)
        return m

    shapes = {t["path"]: t["shape"] for t in model["tensors"]}
    for path, shape in shapes.items():
        mod, leaf = path.rsplit(".", 1)
        kind = mod.rsplit(".", 1)[-1]
        if leaf == "weight" and kind in COLWISE + ROWWISE:
            out_f, in_f = shape
            lin = nn.Linear(in_f, out_f, bias=(mod + ".bias") in shapes)
            p, n = mod.rsplit(".", 1) if "." in mod else ("", mod)
            (parent(p) if p else root).add_module(n, lin)
            plan[mod] = ColwiseParallel() if kind in COLWISE else RowwiseParallel()
        elif leaf == "weight" and kind == "word_embeddings":
            p, n = mod.rsplit(".", 1)
            parent(p).add_module(n, nn.Embedding(*shape))
            plan[mod] = RowwiseParallel()  # vocabulary-parallel: Shard(0)
    for path, shape in shapes.items():  # layer norms, position embeddings: replicated
        mod, leaf = path.rsplit(".", 1)
        try:
            root.get_parameter(path)
        except AttributeError:
            parent(mod).register_parameter(leaf, nn.Parameter(torch.zeros(shape)))
    return root, plan


def _save_worker(rank: int, world: int, rdzv: str, model_path: str, out_dir: str) -> None:
    """One of the 4 saving processes (step 1); rank 0 writes what it saved to saved.json
    beside the rendezvous file."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import parallelize_module

    _quiet_torch()
    dist.init_process_group("gloo", init_method="file://" + rdzv, rank=rank, world_size=world)
    torch.set_num_threads(1)
    with open(model_path) as f:
        model = json.load(f)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    root, plan = build_module(model)
    with torch.no_grad():
        for name, p in root.named_parameters():
            p.copy_(torch.from_numpy(draw(name, list(p.shape))))
    parallelize_module(root, mesh["tp"], plan)
    sd: dict[str, Any] = {}
    placements = {}
    for name, p in root.named_parameters():
        if isinstance(p, DTensor):  # tp-sharded: lift to (dp, tp), replicated over dp
            tp_pl = p.placements[0]
            sd[name] = DTensor.from_local(
                p.to_local(), mesh, [Replicate(), tp_pl], run_check=False, shape=p.shape, stride=p.stride()
            )
        else:
            tp_pl = Replicate()
            sd[name] = distribute_tensor(p.detach(), mesh, [Replicate(), Replicate()])
        placements[name] = tp_pl
    for k in model["optimizer"]["states"]:  # moments: also sharded over dp (dim 0)
        for name, pl in placements.items():
            g = f"optimizer.{k}.{name}"
            full = torch.from_numpy(draw(g, list(sd[name].shape)))
            sd[g] = distribute_tensor(full, mesh, [Shard(0), pl])
    for name, t in sd.items():
        want = torch.from_numpy(draw(name, list(t.shape)))
        if not torch.equal(t.full_tensor(), want):
            raise SystemExit(f"rank {rank}: DTensor {name} does not hold the drawn values")
    sd["step"], sd["samples_consumed"] = STEP, SAMPLES
    dcp.save(sd, checkpoint_id=out_dir)
    if rank == 0:
        kinds = sorted({str(tuple(v.placements)) for v in sd.values() if isinstance(v, DTensor)})
        with open(os.path.join(os.path.dirname(rdzv), "saved.json"), "w") as f:
            json.dump({"tensors": len(sd) - 2, "placements": kinds}, f)
    dist.barrier()
    dist.destroy_process_group()


def _load_worker(rank: int, world: int, rdzv: str, model_path: str, src_dir: str, result_dir: str) -> None:
    """One of the 3 loading processes (step 3): its results in result_dir/rank<r>.json."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    _quiet_torch()
    dist.init_process_group("gloo", init_method="file://" + rdzv, rank=rank, world_size=world)
    torch.set_num_threads(1)
    with open(model_path) as f:
        model = json.load(f)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("x",))
    shapes = globals_of(model)
    sd: dict[str, Any] = {}
    for name, shape in shapes.items():  # other placements: columns of matrices, uneven over 3
        pl = [Shard(1)] if len(shape) == 2 else [Shard(0)]
        sd[name] = distribute_tensor(torch.full(shape, float("nan")), mesh, pl)
    sd["step"], sd["samples_consumed"] = 0, 0
    dcp.load(sd, checkpoint_id=src_dir)
    n_local, bad = 0, []
    for name, shape in shapes.items():
        n_local += sd[name].to_local().numel()
        if not torch.equal(sd[name].full_tensor(), torch.from_numpy(draw(name, shape))):
            bad.append(name)
    with open(os.path.join(result_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"local": n_local, "bad": bad, "step": sd["step"], "samples": sd["samples_consumed"]}, f)
    dist.barrier()
    dist.destroy_process_group()


def _quiet_torch() -> None:
    """DTensor logs a warning for every 2-D redistribution (full_tensor() here)."""
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)


def plain_params_only(model: dict[str, Any], out_dir: str) -> None:
    """One process, no process group: dcp.save of plain tensors (parameters only) with
    step and samples as 0-d integer tensors."""
    import torch.distributed.checkpoint as dcp

    sd: dict[str, Any] = {t["path"]: torch.from_numpy(draw(t["path"], t["shape"])) for t in model["tensors"]}
    sd["step"], sd["samples_consumed"] = torch.tensor(STEP), torch.tensor(SAMPLES, dtype=torch.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, checkpoint_id=out_dir, no_dist=True)


def spawn(fn: Callable[..., None], world: int, *args: str) -> str:
    """`world` processes run fn(rank, world, rendezvous file, *args); the directory of the
    rendezvous file."""
    import torch.multiprocessing as mp

    d = tempfile.mkdtemp(dir=IT.TMP)
    mp.start_processes(
        fn, args=(world, os.path.join(d, "rendezvous"), *args), nprocs=world, join=True, start_method="spawn"
    )
    return d


def test_dcp2(interop: str) -> None:
    t0 = time.monotonic()
    mpath, model = IT.model_json("gpt", *GPT)
    shapes = globals_of(model)
    G = {name: draw(name, shape) for name, shape in shapes.items()}
    total = sum(v.size for v in G.values())
    d1 = os.path.join(IT.TMP, "dcp-2d")
    with open(os.path.join(spawn(_save_worker, 4, mpath, d1), "saved.json")) as f:
        saved = json.load(f)
    _log.info("  saved %d DTensors on mesh dp=2 x tp=2, placements %s", saved["tensors"], saved["placements"])
    c1 = os.path.join(IT.TMP, "ck-tp2pp2")
    IT.run("import", "--from", "dcp", d1, "--model", mpath, "--config", "tp=2,pp=2", "--out", c1)
    info, n = IT.check_ckpt(c1, model, G, optimizer="given")
    assert info.get("step") == STEP and info.get("samples_consumed") == SAMPLES, (
        f"imported step/samples {info.get('step')}/{info.get('samples_consumed')}, expected {STEP}/{SAMPLES}"
    )
    _log.info(
        "import: DCP of 2-D DTensors (dp=2 x tp=2) -> tenplex tp=2,pp=2: %d elements in 4 rank files "
        "equal the drawn tensors; step %d, samples %d",
        n,
        STEP,
        SAMPLES,
    )
    for cfg in ("tp=4,pp=1", "tp=1,pp=2,dp=2,zero=1"):
        c2 = os.path.join(IT.TMP, "ck-" + cfg)
        IT.run("reshard", "--in", c1, "--to", cfg, "--out", c2)
        d2 = os.path.join(IT.TMP, "dcp-out-" + cfg)
        IT.run("export", "--to", "dcp", c2, "--out", d2)
        res = os.path.join(IT.TMP, "res-" + cfg)
        os.makedirs(res)
        spawn(_load_worker, 3, mpath, d2, res)
        rs = []
        for r in range(3):
            with open(os.path.join(res, f"rank{r}.json")) as f:
                rs.append(json.load(f))
        local = sum(r["local"] for r in rs)
        assert (
            not any(r["bad"] for r in rs)
            and local == total
            and all(r["step"] == STEP and r["samples"] == SAMPLES for r in rs)
        ), (
            f"dcp.load of the export from {cfg} into 3 processes: {rs}; expected {total} "
            f"elements, step {STEP}, samples {SAMPLES}"
        )
        _log.info(
            "export: tenplex %s -> DCP -> dcp.load on a mesh of 3 (Shard(1) / Shard(0), uneven): "
            "%d tensors, %d elements equal; step and samples loaded",
            cfg,
            len(shapes),
            total,
        )
    d3 = os.path.join(IT.TMP, "dcp-plain")
    plain_params_only(model, d3)
    c3 = os.path.join(IT.TMP, "ck-plain")
    IT.run("import", "--from", "dcp", d3, "--model", mpath, "--config", "tp=1,pp=2", "--out", c3)
    info, n = IT.check_ckpt(c3, model, G, optimizer="fresh")
    assert info.get("step") == STEP and info.get("samples_consumed") == SAMPLES, (
        f"step/samples from 0-d tensors: {info.get('step')}/{info.get('samples_consumed')}"
    )
    _log.info(
        "import: no_dist dcp.save of plain tensors (parameters only, step/samples as 0-d tensors) -> "
        "tp=1,pp=2: %d elements equal, Adam fresh (moments zero); step and samples carried",
        n,
    )
    _log.info("interop_dcp2: OK (%.1f s)", time.monotonic() - t0)
