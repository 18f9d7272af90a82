"""Megatron-LM (Megatron-Core GPT) non-distributed checkpoints <-> tenplex checkpoints.

Folder structure (megatron/training/checkpointing.py):

  <dir>/latest_checkpointed_iteration.txt      "<iteration>" or "release"
  <dir>/iter_0000100/mp_rank_00/model_optim_rng.pt            (pp == 1)
  <dir>/iter_0000100/mp_rank_01_002/model_optim_rng.pt        (tp rank 1, pp rank 2; pp > 1)
  <dir>/release/...                                           (instead of iter_*)

Each file is a torch.save'd dict with `args` (the argparse Namespace of the run),
`checkpoint_version` (3.0), `iteration`, `model` (the rank's state dict), and, unless
saved without them, `optimizer`, `opt_param_scheduler`, `rng_state`; with the
distributed optimizer its state is in `distrib_optim.pt` beside the model file.

The `model` dict of (tp rank t, pp rank p) is exactly the parameter part of our rank
(t, dp 0, p) in the layout `tp=T,pp=P,dp=1` (spec §2-§4 follow Megatron-Core with the
Transformer Engine layer spec: fused `linear_qkv.layer_norm_weight`, QKV grouped per
query group, SwiGLU [gate; up] per TP rank, vocabulary padded to a multiple of
make_vocab_size_divisible_by·tp, layers renumbered from 0 on every stage, the tied
`output_layer.weight` copy on the last stage when pp > 1). `*._extra_state` entries
(Transformer Engine's FP8 metadata) are skipped on import and written as None on
export.

Supported: the model state in any TP/PP (virtual pipelines, experts and the local
(non-TE) layer names are not), `iteration` -> step and `args.consumed_train_samples`
-> samples_consumed and back. The optimizer state is not converted: Megatron indexes
it by parameter-group position (and by flat buffer ranges in distrib_optim.pt), which
depends on the run's weight-decay grouping. Import starts Adam's moments at zero (fp32
master copies equal the parameters); export writes files without `optimizer` and
`rng_state` (load them in Megatron with --no-load-optim --no-load-rng, as for
checkpoints converted by its own tools/checkpoint).
"""

import argparse
import os
import re
import shutil

import numpy as np

from . import pickles, ptc
from .dcp import to_numpy, to_torch
from .ptc import InteropError

TRACKER = "latest_checkpointed_iteration.txt"
MODEL_FILE = "model_optim_rng.pt"
_RANK_DIR = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?$")
_EXTRA_STATE_MODULES = ("self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1", "mlp.linear_fc2")


def iteration_dir(src):
    tracker = os.path.join(src, TRACKER)
    if not os.path.exists(tracker):
        raise InteropError(f"{src}: no {TRACKER} (not a Megatron-LM checkpoint directory)")
    text = open(tracker).read().strip()
    if text == "release":
        return os.path.join(src, "release"), None
    if not text.isdigit():
        raise InteropError(f"{tracker}: '{text}' is neither an iteration number nor 'release'")
    return os.path.join(src, f"iter_{int(text):07d}"), int(text)


def rank_files(it_dir, want=None):
    """{(tp, pp): path} and (T, P) of an iteration directory; every combination present
    (of want = (T, P) when the stored args give it)."""
    if not os.path.isdir(it_dir):
        raise InteropError(f"{it_dir} is missing")
    found, with_pp = {}, set()
    for name in os.listdir(it_dir):
        m = _RANK_DIR.match(name)
        if not m:
            continue
        with_pp.add(m.group(2) is not None)
        found[(int(m.group(1)), int(m.group(2) or 0))] = os.path.join(it_dir, name, MODEL_FILE)
    if not found:
        raise InteropError(f"{it_dir}: no mp_rank_* directories")
    if len(with_pp) > 1:
        raise InteropError(f"{it_dir}: mixes mp_rank_TT and mp_rank_TT_PPP directories")
    T = max(t for t, _ in found) + 1
    P = max(p for _, p in found) + 1
    if want:
        T, P = max(T, want[0]), max(P, want[1])
    for t in range(T):
        for p in range(P):
            path = found.get((t, p))
            if path is None or not os.path.isfile(path):
                raise InteropError(
                    f"{it_dir}: {_rank_dir(t, p, P)}/{MODEL_FILE} is missing "
                    f"(expected TP={T} x PP={P} files{' as the stored args say' if want else ''})"
                )
    return found, T, P


def _rank_dir(t, p, P):
    return f"mp_rank_{t:02d}" if P == 1 else f"mp_rank_{t:02d}_{p:03d}"


def _load(path):
    return pickles.load(path, "Megatron-LM checkpoint file")


def _hyper(model):
    i = model.get("info", {})
    if i.get("family") != "gpt":
        raise InteropError("Megatron-LM import/export needs a GPT-family model description (tenplex model gpt)")
    return i


def check_args(args, model, T, P, path):
    """The stored args against the description and the folder's TP/PP."""
    i = _hyper(model)
    want = {
        "num_layers": int(i["num_layers"]),
        "hidden_size": int(i["hidden_size"]),
        "ffn_hidden_size": int(i["ffn_hidden_size"]),
        "num_attention_heads": int(i["num_attention_heads"]),
        "kv_channels": int(i["kv_channels"]),
        "max_position_embeddings": int(i["max_position_embeddings"]),
        "swiglu": i["swiglu"] == "true",
        "add_bias_linear": i["bias"] == "true",
        "untie_embeddings_and_output_weights": i["tied"] == "false",
        "normalization": i["normalization"],
        "position_embedding_type": i["position_embedding_type"],
        "tensor_model_parallel_size": T,
        "pipeline_model_parallel_size": P,
    }
    for k, v in want.items():
        if not hasattr(args, k):
            continue  # older runs lack some arguments; shapes are checked tensor by tensor
        got = getattr(args, k)
        if got != v:
            raise InteropError(f"{path}: args.{k} is {got!r}, expected {v!r} (model description / folder names)")
    g = int(i["num_query_groups"])
    if getattr(args, "group_query_attention", False) and getattr(args, "num_query_groups", g) != g:
        raise InteropError(f"{path}: args.num_query_groups is {args.num_query_groups}, the model has {g}")
    if getattr(args, "virtual_pipeline_model_parallel_size", None):
        raise InteropError(f"{path}: virtual pipeline stages are not supported")


def import_(tenplex_bin, model_path, src, writer, log):
    it_dir, iteration = iteration_dir(src)
    files, T, P = rank_files(it_dir)
    first = _load(files[min(files)])
    args = first.get("args") if isinstance(first, dict) else None
    del first
    if args is not None:  # the run's TP x PP: every one of its files must be there
        files, T, P = rank_files(
            it_dir, (getattr(args, "tensor_model_parallel_size", T), getattr(args, "pipeline_model_parallel_size", P))
        )
    lay = ptc.layout(tenplex_bin, model_path, f"tp={T},pp={P},dp=1")
    model = writer.model
    step = samples = None
    for r in lay["ranks"]:
        t, p = r["tp"], r["pp"]
        path = files[(t, p)]
        sd = _load(path)
        if not isinstance(sd, dict) or "model" not in sd:
            keys = list(sd)[:8] if isinstance(sd, dict) else type(sd).__name__
            raise InteropError(
                f"{path}: no 'model' entry (has {keys}); virtual pipelines (model0, ...) are not supported"
            )
        if "args" in sd:
            check_args(sd["args"], model, T, P, path)
            samples = getattr(sd["args"], "consumed_train_samples", samples)
        step = sd.get("iteration", iteration) if step is None else step
        if "optimizer" in sd and t == 0 and p == 0:
            log("megatron: the optimizer state is not imported (Adam moments start at zero)")
        state = sd["model"]
        expect = {x["name"]: x for x in r["tensors"] if not x["name"].startswith("optimizer.")}
        for key in state:
            if key.endswith("._extra_state") or key.endswith("_extra_state"):
                continue
            if key not in expect:
                raise InteropError(
                    f"{path}: unknown tensor '{key}' in 'model' (not a parameter of "
                    f"{_rank_dir(t, p, P)} in layout tp={T},pp={P})"
                )
        for name, x in expect.items():
            if name not in state:
                raise InteropError(f"{path}: tensor '{name}' is missing from 'model'")
            arr = state[name]
            dt = ptc.st_dtype_name(arr.dtype)
            if dt != x["dtype"] or list(arr.shape) != x["shape"]:
                raise InteropError(
                    f"{path}: tensor '{name}' is {dt}{list(arr.shape)}, expected {x['dtype']}{x['shape']}"
                )
            a = to_numpy(arr.contiguous())
            for piece in x["pieces"]:
                g, view = ptc.piece_view(a, piece)
                writer.put_param(piece["tensor"], g, view, dt, derive_fp32=True)
        del sd, state
    if step is not None:
        writer.extra["step"] = int(step)
    if samples is not None:
        writer.extra["samples_consumed"] = int(samples)
    return ["optimizer."]


def make_args(model, T, P, iteration, samples, dtype):
    import torch

    i = _hyper(model)
    V, m = int(i["vocab_size"]), int(i["make_vocab_size_divisible_by"])
    padded = -(-V // (m * T)) * m * T
    a, g = int(i["num_attention_heads"]), int(i["num_query_groups"])
    return argparse.Namespace(
        num_layers=int(i["num_layers"]),
        hidden_size=int(i["hidden_size"]),
        ffn_hidden_size=int(i["ffn_hidden_size"]),
        num_attention_heads=a,
        num_query_groups=g,
        group_query_attention=g != a,
        kv_channels=int(i["kv_channels"]),
        max_position_embeddings=int(i["max_position_embeddings"]),
        seq_length=int(i["max_position_embeddings"]),
        position_embedding_type=i["position_embedding_type"],
        add_position_embedding=i["position_embedding_type"] == "learned_absolute",
        use_rotary_position_embeddings=i["position_embedding_type"] == "rope",
        add_bias_linear=i["bias"] == "true",
        add_qkv_bias=i["bias"] == "true",
        swiglu=i["swiglu"] == "true",
        untie_embeddings_and_output_weights=i["tied"] == "false",
        normalization=i["normalization"],
        vocab_size=V,
        make_vocab_size_divisible_by=m,
        padded_vocab_size=padded,
        tensor_model_parallel_size=T,
        pipeline_model_parallel_size=P,
        virtual_pipeline_model_parallel_size=None,
        data_parallel_size=1,
        world_size=T * P,
        params_dtype={"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}[dtype],
        bf16=dtype == "BF16",
        fp16=dtype == "F16",
        use_mcore_models=True,
        transformer_impl="transformer_engine",
        use_distributed_optimizer=False,
        iteration=iteration,
        consumed_train_samples=samples,
        consumed_valid_samples=0,
    )


def export(tenplex_bin, model_path, reader, out, config):
    import torch

    model = reader.info["model"]
    cfg = config or reader.info["config"]
    parts = {k: v for k, v in (x.split("=", 1) for x in cfg.split(","))}
    T, P = int(parts.get("tp", 1)), int(parts.get("pp", 1))
    target = f"tp={T},pp={P},dp=1" + (f",layers={parts['layers']}" if "layers" in parts else "")
    lay = ptc.layout(tenplex_bin, model_path, target)
    iteration = reader.info.get("step")
    samples = int(reader.info.get("samples_consumed", 0))
    ptc.check_target_dir(out)
    stage = out.rstrip("/") + ".partial"
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage)
    dtype = model["tensors"][0]["dtype"]
    it_name = "release" if iteration is None else f"iter_{int(iteration):07d}"
    total = 0
    try:
        for r in lay["ranks"]:
            state = {}
            for x in r["tensors"]:
                if x["name"].startswith("optimizer."):
                    continue
                a = np.zeros(x["shape"], ptc.NP_DTYPES[x["dtype"]])
                for piece in x["pieces"]:
                    g, view = ptc.piece_view(a, piece)
                    reader.read_into(piece["tensor"], g, view)
                state[x["name"]] = to_torch(a, x["dtype"]).clone()
                total += a.nbytes
            for name in list(state):
                for mod in _EXTRA_STATE_MODULES:
                    if name.endswith(mod + ".weight"):
                        state[name[: -len("weight")] + "_extra_state"] = None
            sd = {
                "args": make_args(model, T, P, iteration or 0, samples, dtype),
                "checkpoint_version": 3.0,
                "iteration": int(iteration or 0),
                "model": state,
                "num_floating_point_operations_so_far": 0,
            }
            d = os.path.join(stage, it_name, _rank_dir(r["tp"], r["pp"], P))
            os.makedirs(d)
            with open(os.path.join(d, MODEL_FILE), "wb") as f:
                torch.save(sd, f)
                f.flush()
                os.fsync(f.fileno())
        with open(os.path.join(stage, TRACKER), "w") as f:
            f.write("release" if iteration is None else str(int(iteration)))
        ptc.move_into_place(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return total
