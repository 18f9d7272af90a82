"""`tenplex import --from mcore` / `tenplex export --to mcore` judged by Megatron-Core.

Under pytest (issue 32 §4), ctest interop_mcore, TENPLEX_BIN the CLI under test:

    python -m pytest tests/interop_mcore_test.py::test_mcore

Megatron-Core itself writes and reads the `torch_dist` checkpoints here: a real MCore
GPTModel (megatron.core.models.gpt.GPTModel, local layer spec, GQA, SwiGLU, RMSNorm,
untied output layer, rope) built on the CPU in gloo processes with MCore's
parallel_state for the given TP x PP, its own model.sharded_state_dict() (layer-stacked
keys, the SwiGLU ShardedTensorFactory) and an MCore FP32Optimizer around torch Adam
whose sharded_state_dict gives `optimizer.state.exp_avg.*` / `exp_avg_sq.*`; then
megatron.core.dist_checkpointing.save / .load. Two CPU shims are needed because MCore's
torch_dist writer calls torch.cuda.synchronize() and makes a status tensor on
torch.cuda.current_device() even for CPU tensors (see mcore_cpu_shim), and
FP32Optimizer's constructor makes its loss scale on 'cuda' (see build()).

Every parameter and Adam moment is filled from independent references: one numpy
array per MCore key (seeded by the key), sliced by the ShardedTensor metadata MCore
reports for each rank (global offsets; factories built into their gate/up parts).

  1. MCore saves in TP=2 x PP=2 (4 processes), with iteration and consumed samples;
  2. `tenplex import --from mcore` into tp=1,pp=1: every element of every tensor of
     the rank file (read with safetensors here) equals the references, vocabulary
     padding rows zero; step and samples carried;
  3. `tenplex reshard` to tp=2,pp=2, `tenplex export --to mcore --config tp=4`;
  4. MCore loads that into a TP=4 x PP=1 model and optimizer (4 processes) with
     dist_checkpointing.load: every element equal to the references; the model's
     load_state_dict(strict) accepts the result; iteration carried;
  5. errors: a dp_reshardable-style key and an unknown key exit 2, nothing left.

The MCore processes run this file as a script (its only command line):

    interop_mcore_test.py --worker save|load RANK TP PP CKPT TMP

bench/mcore_peer_bench.py imports mcore_cpu_shim and build from here.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tenplex_cli  # tests/, this file's folder

_log = logging.getLogger(__name__)

# The model: a=8 heads in g=4 groups of d=8 (GQA), SwiGLU f=96, untied, rope.
L_, H, A, G, F, V, M = 4, 64, 8, 4, 96, 1000, 128
ITERATION, SAMPLES = 7, 1234
Path = tuple[Any, ...]  # a path of keys and indices into a state dict


def padded_vocab(tp: int) -> int:
    return -(-V // (M * tp)) * M * tp


def reference(key: str, shape: list[int]) -> np.ndarray:
    """The independent global value of an MCore key (vocabulary rows >= V are zero)."""
    rng = np.random.default_rng(zlib.crc32(key.encode()))
    a = rng.standard_normal(shape).astype(np.float32)
    base = key.split(".", 3)[3] if key.startswith("optimizer.state.") else key
    if base in ("embedding.word_embeddings.weight", "output_layer.weight"):
        a[V:] = 0
    return a


# ----------------------------------------------------------------------------- MCore side


def mcore_cpu_shim() -> None:
    """MCore 0.16.1's torch_dist writer calls torch.cuda.synchronize() after copying
    tensors to the host and broadcasts a failure flag made on torch.cuda.current_device();
    on a machine without a GPU both fail. Everything else runs unchanged on the CPU."""
    import torch

    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]


def build(
    tp: int,
    pp: int,
    L: int = L_,
    h: int = H,
    a: int = A,
    g: int = G,
    f: int = F,
    vocab: int | None = None,
    init: bool = True,
) -> tuple[Any, Any]:
    """MCore GPTModel (local spec) and FP32Optimizer(Adam) with states, on this rank."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.optimizer.optimizer import FP32Optimizer, MegatronOptimizer
    from megatron.core.transformer.transformer_config import TransformerConfig

    cfg = TransformerConfig(
        num_layers=L,
        hidden_size=h,
        num_attention_heads=a,
        num_query_groups=g,
        ffn_hidden_size=f,
        kv_channels=h // a,
        gated_linear_unit=True,
        add_bias_linear=False,
        normalization="RMSNorm",
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        pipeline_dtype=torch.float32,
        perform_initialization=init,
    )
    model = GPTModel(
        cfg,
        get_gpt_layer_local_spec(),
        vocab_size=vocab or padded_vocab(tp),
        max_sequence_length=128,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=False,
        position_embedding_type="rope",
    )
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    adam.step()  # creates exp_avg / exp_avg_sq (zero gradients: parameters unchanged)
    # FP32Optimizer.__init__ makes its loss scale with device='cuda'; the same object on
    # the CPU (MCore's sharded_state_dict / load methods run unchanged):
    opt = FP32Optimizer.__new__(FP32Optimizer)
    MegatronOptimizer.__init__(opt, adam, OptimizerConfig(optimizer="adam", lr=1e-3), lambda *a: None)
    opt._scale, opt.is_stub_optimizer = torch.tensor([1.0]), False
    return model, opt


def sharded_tensors(sd: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """(path, ShardedTensor) of every tensor of a sharded state dict, factories built."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    items = sd.items() if isinstance(sd, dict) else enumerate(sd) if isinstance(sd, list) else []
    for k, v in items:
        if isinstance(v, ShardedTensorFactory):
            built = v.build()
            for i, t in enumerate(built if isinstance(built, list) else [built]):
                yield path + (k, i), t
        elif isinstance(v, ShardedTensor):
            yield path + (k,), v
        elif isinstance(v, (dict, list)):
            yield from sharded_tensors(v, path + (k,))


def fill(sd: dict[str, Any]) -> None:
    """Writes every rank's part of the references into the live tensors (in place)."""
    import torch

    for _, t in sharded_tensors(sd):
        ref = reference(t.key, t.global_shape)
        with torch.no_grad():
            t.data.copy_(torch.from_numpy(ref[t.global_slice()].reshape(t.local_shape)))


def leaves(x: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    if isinstance(x, dict):
        for k, v in x.items():
            yield from leaves(v, path + (k,))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from leaves(v, path + (i,))
    else:
        yield path, x


def worker(rank: int, world: int, tp: int, pp: int, mode: str, ckpt: str, tmp: str) -> None:
    """One MCore process: saves the references (mode "save") or loads `ckpt` and writes
    what differs to tmp/result-<rank>.json ("load")."""
    import torch
    import torch.distributed as dist

    mcore_cpu_shim()
    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg-{mode}", rank=rank, world_size=world)
    from megatron.core import dist_checkpointing
    from megatron.core import parallel_state as ps

    ps.initialize_model_parallel(tp, pp)
    model, opt = build(tp, pp)
    msd = model.sharded_state_dict()
    state = {"model": msd, "optimizer": opt.sharded_state_dict(msd)}
    fill(state)
    if mode == "save":
        state["iteration"] = ITERATION
        state["args"] = argparse.Namespace(consumed_train_samples=SAMPLES)
        dist_checkpointing.save(state, ckpt)
        return
    expect = {p: v.detach().clone() for p, v in leaves(model.state_dict()) if torch.is_tensor(v)}
    expect.update(
        {
            ("optimizer",) + p: v.clone()
            for p, v in leaves(opt.optimizer.state_dict()["state"])
            if torch.is_tensor(v) and v.dim() > 0
        }
    )
    with torch.no_grad():
        for v in list(model.parameters()) + [s for st in opt.optimizer.state.values() for s in st.values()]:
            v.zero_()
    msd = model.sharded_state_dict()
    loaded = dist_checkpointing.load({"model": msd, "optimizer": opt.sharded_state_dict(msd, is_loading=True)}, ckpt)
    model.load_state_dict(loaded["model"], strict=True)
    got = {p: v for p, v in leaves(model.state_dict()) if torch.is_tensor(v)}
    for pid, st in loaded["optimizer"]["state"].items():
        if isinstance(st, dict):
            got.update({("optimizer", pid, s): v for s, v in st.items() if torch.is_tensor(v) and v.dim() > 0})
    checked, bad = 0, []
    for p, v in expect.items():
        if p not in got:
            bad.append("missing " + ".".join(map(str, p)))
        elif not torch.equal(got[p], v):
            i = (got[p] != v).nonzero()[0].tolist()
            bad.append(f"{'.'.join(map(str, p))}{i}: {got[p][tuple(i)].item()} != {v[tuple(i)].item()}")
        checked += v.numel()
    with open(f"{tmp}/result-{rank}.json", "w") as f:
        json.dump({"checked": checked, "bad": bad, "iteration": loaded.get("iteration"), "keys": len(expect)}, f)


def run_mcore(mode: str, tp: int, pp: int, ckpt: str, tmp: str) -> float:
    """tp*pp MCore processes; returns seconds."""
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", mode, str(r), str(tp), str(pp), ckpt, tmp],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(tp * pp)
    ]
    outs = [p.communicate()[0] for p in procs]
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"MCore {mode} rank {r} (TP={tp}, PP={pp}) exit {p.returncode}:\n{out[-4000:]}"
    return time.perf_counter() - t0


# ----------------------------------------------------------------------------- tenplex side


def mcore_name(name: str) -> tuple[str, int | None]:
    """(MCore key, layer) of a tenplex global name, written here from the MCore keys."""
    prefix = ""
    if name.startswith("optimizer."):
        _, s, name = name.split(".", 2)
        prefix = f"optimizer.state.{s}."
    if name.startswith("decoder.layers."):
        i, rest = name[len("decoder.layers.") :].split(".", 1)
        return prefix + "decoder.layers." + rest, int(i)
    return prefix + name, None


def check_import(ckpt: str, model: dict[str, Any]) -> None:
    """Every tensor of a tp=1,pp=1 tenplex checkpoint (one rank file, global names)
    against the references."""
    from safetensors.numpy import load_file

    with open(os.path.join(ckpt, "tenplex.json")) as f:
        info = json.load(f)
    assert info.get("step") == ITERATION and info.get("samples_consumed") == SAMPLES, (
        f"step/samples {info.get('step')}/{info.get('samples_consumed')}, expected {ITERATION}/{SAMPLES}"
    )
    tensors = load_file(os.path.join(ckpt, "rank-00000.safetensors"))
    names = [t["path"] for t in model["tensors"]]
    names += [f"optimizer.{s}.{n}" for s in ("exp_avg", "exp_avg_sq") for n in names]
    assert sorted(tensors) == sorted(names), (
        f"rank file tensors {sorted(set(tensors) ^ set(names))} differ from the model's"
    )
    n = 0
    for name in names:
        key, layer = mcore_name(name)
        got = tensors[name]
        shape = ([L_] if layer is not None else []) + list(got.shape)
        vocab = padded_vocab(2) if key.endswith(("word_embeddings.weight", "output_layer.weight")) else None
        if vocab:
            shape[0] = vocab
        ref = reference(key, shape)
        ref = ref[layer] if layer is not None else ref
        if vocab:
            ref = np.concatenate([ref[:V], np.zeros((got.shape[0] - V, H), np.float32)])
        if not np.array_equal(got, ref):
            bad = np.argwhere(got != ref)[0]
            pytest.fail(f"import: {name}{list(bad)} is {got[tuple(bad)]}, MCore saved {ref[tuple(bad)]}")
        n += got.size
    _log.info(
        "ok: import --from mcore (TP=2 x PP=2 -> tp=1,pp=1): %d tensors, %d elements equal to what MCore saved; "
        "step and samples carried",
        len(names),
        n,
    )


def check_errors(exe: str, src: str, model_file: str, tmp: str) -> None:
    """Bad input: a dp_reshardable bucket key and an unknown key -> exit 2, no output."""
    import torch
    import torch.distributed.checkpoint as dcp

    for key, words in (
        (
            "optimizer.distributed.dp_group_idx_0.gbuf_idx_0.dtype_(torch.float32, "
            "torch.float32).bucket_idx_0.exp_avg_sq",
            "dp_reshardable",
        ),
        ("decoder.layers.mlp.linear_fc3.weight", "unknown tensor"),
    ):
        bad = os.path.join(tmp, "bad")
        shutil.rmtree(bad, ignore_errors=True)
        dcp.save({key: torch.zeros(4)}, storage_writer=dcp.FileSystemWriter(bad), no_dist=True)
        shutil.copy(os.path.join(src, "metadata.json"), bad)
        out = os.path.join(tmp, "bad-out")
        args = ["import", "--from", "mcore", bad, "--model", model_file, "--config", "tp=1", "--out", out]
        p = tenplex_cli.run(exe, *args, expect=2)
        assert words in p.stderr and not os.path.exists(out) and not os.path.exists(out + ".partial"), (
            f"bad key {key}: stderr {p.stderr!r}, output left: {os.path.exists(out)}"
        )
    # A data file cut short: torch's reader fails inside dcp.load (a CheckpointException,
    # a BaseException): exit 2 naming the checkpoint, no traceback, nothing left.
    bad = os.path.join(tmp, "bad-trunc")
    shutil.rmtree(bad, ignore_errors=True)
    shutil.copytree(src, bad)
    data = os.path.join(bad, sorted(x for x in os.listdir(bad) if x.endswith(".distcp"))[0])
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) // 2)
    out = os.path.join(tmp, "bad-out")
    args = ["import", "--from", "mcore", bad, "--model", model_file, "--config", "tp=1", "--out", out]
    p = tenplex_cli.run(exe, *args, expect=2)
    assert (
        "truncated or damaged" in p.stderr
        and "Traceback" not in p.stderr
        and not os.path.exists(out)
        and not os.path.exists(out + ".partial")
    ), f"truncated data file: stderr {p.stderr[-600:]!r}, output left: {os.path.exists(out)}"
    _log.info("ok: errors: dp_reshardable bucket state, unknown keys and a truncated data file exit 2, nothing left")


MODEL = [
    "--num-layers",
    L_,
    "--hidden-size",
    H,
    "--ffn-hidden-size",
    F,
    "--num-attention-heads",
    A,
    "--num-query-groups",
    G,
    "--vocab-size",
    V,
    "--make-vocab-size-divisible-by",
    M,
    "--max-position-embeddings",
    128,
    "--position-embedding-type",
    "rope",
    "--swiglu",
    "--disable-bias-linear",
    "--untie-embeddings-and-output-weights",
    "--normalization",
    "RMSNorm",
]


def test_mcore(tenplex: str, tmp: str) -> None:
    t_start = time.perf_counter()
    exe = os.path.abspath(tenplex)
    model_file = os.path.join(tmp, "gpt.json")
    tenplex_cli.run(exe, "model", "gpt", *MODEL, "-o", model_file)
    with open(model_file) as f:
        model = json.load(f)
    src = os.path.join(tmp, "mcore-tp2-pp2")
    os.makedirs(src)
    s = run_mcore("save", 2, 2, src, tmp)
    _log.info("ok: MCore GPTModel + FP32Optimizer saved with dist_checkpointing.save in TP=2 x PP=2 (%.1f s)", s)
    t1 = os.path.join(tmp, "t1")
    tenplex_cli.run(exe, "import", "--from", "mcore", src, "--model", model_file, "--config", "tp=1,pp=1", "--out", t1)
    check_import(t1, model)
    t2 = os.path.join(tmp, "t2")
    tenplex_cli.run(exe, "reshard", "--in", t1, "--to", "tp=2,pp=2", "--out", t2)
    out = os.path.join(tmp, "mcore-export")
    tenplex_cli.run(exe, "export", "--to", "mcore", t2, "--out", out, "--config", "tp=4")
    s = run_mcore("load", 4, 1, out, tmp)
    checked = 0
    for r in range(4):
        with open(os.path.join(tmp, f"result-{r}.json")) as f:
            res = json.load(f)
        assert not res["bad"] and res["iteration"] == ITERATION, (
            f"MCore load rank {r}: differing {res['bad'][:5]}, iteration {res['iteration']}"
        )
        checked += res["checked"]
    _log.info(
        "ok: export --to mcore (tp=2,pp=2) loaded by MCore dist_checkpointing.load into TP=4 x PP=1: "
        "%d local elements (params + Adam moments) equal, load_state_dict(strict) ok, iteration carried (%.1f s)",
        checked,
        s,
    )
    check_errors(exe, src, model_file, tmp)
    _log.info("PASS interop_mcore (%.1f s)", time.perf_counter() - t_start)


if __name__ == "__main__":  # an MCore process of run_mcore; the test runs under pytest
    if sys.argv[1:2] != ["--worker"]:
        sys.exit(f"usage: {sys.argv[0]} --worker save|load RANK TP PP CKPT TMP")
    mode, rank, tp, pp, ckpt, tmpdir = sys.argv[2:8]
    worker(int(rank), int(tp) * int(pp), int(tp), int(pp), mode, ckpt, tmpdir)
