"""Megatron-Core distributed checkpoints (`dist_checkpointing`, `torch_dist` backend)
<-> tenplex checkpoints, read and written with torch's own DCP code
(torch.distributed.checkpoint, torch 2.x); Megatron-Core itself is not needed here.

A `torch_dist` directory is a DCP checkpoint (`.metadata`, `__<rank>_<n>.distcp`) plus
`metadata.json` ({"sharded_backend": "torch_dist", ...}) and `common.pt` (torch.save of
the state that is not sharded: `iteration`, `args`, optimizer param groups, ...).
Its keys are Megatron-Core's *sharded keys*, not per-layer names:

  decoder.layers.<rest>            one tensor [L, *shape] for all L layers (the leading
                                   dimension is the global layer index; PP shards it)
  embedding.word_embeddings.weight [Vp, h], rows >= V are vocabulary padding
  output_layer.weight              [Vp, h] (untied only; a tied output layer is saved
                                   as a replica of the embedding key)
  decoder.final_layernorm.*, embedding.position_embeddings.weight  as the global tensor
  optimizer.state.<s>.<key>        s = exp_avg, exp_avg_sq, fp32_param (or `param`, the
                                   fully_reshardable name of the fp32 main copy)
  <module>._extra_state/shard_i_L  ShardedObjects (bytes): skipped on import, `None` on
                                   export (`[None]`: MCore saves the list of a
                                   ShardedObject's local objects; None is what the
                                   local layer spec stores)

SwiGLU's fc1 weight is one key whose dim 1 is [gate (f rows); up (f rows)], exactly the
tenplex global tensor (MCore's ShardedTensorFactory saves each TP rank's gate and up
halves at offsets t*f/T and f + t*f/T); with `singleton_local_shards` the halves are
keys `<key>_w` and `<key>_v` of [L, f, h] each, also accepted.
"""

import json
import os
import shutil
import warnings
from typing import Any

import numpy as np

from .. import safetensors as st
from . import ptc
from .dcp import batches, read_metadata, to_numpy, to_torch
from .dcp import load as dcp_load
from .dcp import save as dcp_save
from .ptc import InteropError

_LAYER_PREFIX = "decoder.layers."
_OPT_STATES = {"exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq", "fp32_param": "fp32_param", "param": "fp32_param"}
_EXTRA_STATE_MODULES = ("self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1", "mlp.linear_fc2")
_VOCAB_KEYS = ("embedding.word_embeddings.weight", "output_layer.weight")


def split_layer(name):
    """'decoder.layers.3.mlp.x' -> ('decoder.layers.mlp.x', 3); other names -> (name, None)."""
    if name.startswith(_LAYER_PREFIX):
        idx, rest = name[len(_LAYER_PREFIX) :].split(".", 1)
        return _LAYER_PREFIX + rest, int(idx)
    return name, None


def mcore_key(global_name):
    """(MCore sharded key, layer or None) of a tenplex global tensor."""
    if global_name.startswith("optimizer."):
        _, state, param = global_name.split(".", 2)
        key, layer = split_layer(param)
        return f"optimizer.state.{state}.{key}", layer
    return split_layer(global_name)


def _info(model):
    i = model.get("info", {})
    if i.get("family") != "gpt":
        raise InteropError("Megatron-Core import/export needs a GPT-family model description (tenplex model gpt)")
    return i


def _torch_dcp():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch.distributed.checkpoint as dcp
    return dcp


def checkpoint_dir(src):
    """The torch_dist directory of src: src itself (metadata.json) or the iteration
    directory a Megatron-LM save directory's tracker file names. Returns (dir, iteration)."""
    if not os.path.isfile(os.path.join(src, "metadata.json")):
        tracker = os.path.join(src, "latest_checkpointed_iteration.txt")
        if not os.path.isfile(tracker):
            raise InteropError(
                f"{src}: no metadata.json (not a Megatron-Core distributed checkpoint) "
                "and no latest_checkpointed_iteration.txt"
            )
        text = open(tracker).read().strip()
        sub = "release" if text == "release" else f"iter_{int(text):07d}" if text.isdigit() else None
        if sub is None:
            raise InteropError(f"{tracker}: '{text}' is neither an iteration number nor 'release'")
        src = os.path.join(src, sub)
        if not os.path.isfile(os.path.join(src, "metadata.json")):
            raise InteropError(
                f"{src}: no metadata.json (a non-distributed Megatron-LM checkpoint? use --from megatron)"
            )
    try:
        meta = json.load(open(os.path.join(src, "metadata.json")))
    except (OSError, ValueError) as e:
        raise InteropError(f"{src}/metadata.json: cannot be read ({e})") from None
    if meta.get("sharded_backend") != "torch_dist":
        raise InteropError(
            f"{src}/metadata.json: sharded_backend is {meta.get('sharded_backend')!r}; only 'torch_dist' is supported"
        )
    return src, meta


def _common(src):
    """common.pt (plain data only, tenplex.interop.pickles), or {} when absent."""
    from . import pickles

    path = os.path.join(src, "common.pt")
    if not os.path.isfile(path):
        return {}
    common = pickles.load(path, "Megatron-Core common.pt")
    return common if isinstance(common, dict) else {}


def _expected(writer):
    """{(mcore key, which): [(global name, layer or None, row offset)]} and the model's
    global tensors. `which` is '' or '_w'/'_v' (singleton SwiGLU halves)."""
    out: dict[tuple[str, str], list[Any]] = {}
    for name in writer.globals:
        key, layer = mcore_key(name)
        out.setdefault(key, []).append((name, layer))
    return out


def _check_key(src, key, m, members, globals_, V):
    """Checks one stored key's dtype and shape; returns (dtype, rows of dim 0 or 1 used)."""
    dt = st.dtype_name(m.properties.dtype)
    name0, layer0 = members[0]
    gdt, gshape = globals_[name0]
    want = ([len(members)] if layer0 is not None else []) + list(gshape)
    got = list(m.size)
    if gdt != dt:
        raise InteropError(f"{src}: '{key}' is {dt}, the model says {gdt}")
    vocab = key.split("optimizer.state.", 1)[-1].split(".", 1)[-1] in _VOCAB_KEYS or key in _VOCAB_KEYS
    if vocab and len(got) == len(want) and got[1:] == want[1:] and got[0] >= V:
        return dt
    if got != want:
        raise InteropError(f"{src}: '{key}' is {dt}{got}, the model says {want}")
    return dt


def scan(src, md, writer, V):
    """Checks every stored key of the DCP metadata `md` against the model; returns
    ([(key, members, dtype, half)], with_optimizer)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    expected = _expected(writer)
    found: list[Any] = []
    halves: dict[Any, Any] = {}
    for key, m in md.state_dict_metadata.items():
        if not isinstance(m, TensorStorageMetadata):
            continue  # ShardedObjects: _extra_state, rng state, ...
        if key.startswith("optimizer.distributed."):
            raise InteropError(
                f"{src}: '{key}' is distributed-optimizer bucket state (dp_reshardable format): "
                "it depends on the run's DDP buckets and padding; save with "
                "dist_ckpt_optim_fully_reshardable / fully_sharded_model_space"
            )
        if key.startswith("optimizer.state."):
            _, _, state, rest = key.split(".", 3)
            if state not in _OPT_STATES:
                raise InteropError(f"{src}: unknown optimizer state '{key}'")
            if not any(n.startswith(f"optimizer.{_OPT_STATES[state]}.") for n in writer.globals):
                continue  # fp32 params (the fp32 main copy is the parameter) or a model without Adam state
            lookup = f"optimizer.state.{_OPT_STATES[state]}.{rest}"
        else:
            lookup = key
        half = ""
        if lookup not in expected and lookup[-2:] in ("_w", "_v") and lookup[:-2] in expected:
            lookup, half = lookup[:-2], lookup[-2:]
        if lookup not in expected:
            raise InteropError(f"{src}: unknown tensor '{key}' (not a tensor of the model)")
        members = sorted(expected[lookup], key=lambda x: -1 if x[1] is None else x[1])
        if half:
            dt = _check_half(src, key, m, members, writer.globals)
            halves.setdefault(lookup, set()).add(half)
        else:
            dt = _check_key(src, key, m, members, writer.globals, V)
        found.append((key, lookup, members, dt, half))
    for lookup, hs in halves.items():
        if hs != {"_w", "_v"}:
            raise InteropError(f"{src}: '{lookup}' has only its {''.join(hs)} half")
    have = {lk for _, lk, _, _, _ in found}
    for key in expected:
        if not key.startswith("optimizer.") and key not in have:
            raise InteropError(f"{src}: tensor '{key}' is missing")
    with_opt = any(k.startswith("optimizer.") for k in have)
    if with_opt:
        for key in expected:
            if key not in have:
                raise InteropError(
                    f"{src}: optimizer tensor '{key}' is missing (a checkpoint has all of its optimizer state or none)"
                )
    return found, with_opt


def _check_half(src, key, m, members, globals_):
    dt = st.dtype_name(m.properties.dtype)
    gdt, gshape = globals_[members[0][0]]
    want = [len(members), gshape[0] // 2] + list(gshape[1:])
    if dt != gdt or list(m.size) != want:
        raise InteropError(f"{src}: '{key}' is {dt}{list(m.size)}, expected {gdt}{want} (one SwiGLU half)")
    return dt


def _put(writer, members, half, arr, dt, with_opt):
    """Puts one loaded stored tensor (all layers) into the writer."""
    for name, layer in members:
        a = arr[layer] if layer is not None else arr
        shape = writer.globals[name][1]
        if half:
            f = shape[0] // 2
            b = 0 if half == "_w" else f
            box = [(b, b + f)] + [(0, n) for n in shape[1:]]
        else:
            a = a[: shape[0]]  # vocabulary padding rows
            box = [(0, n) for n in shape]
        writer.put_param(name, box, np.ascontiguousarray(a), dt, derive_fp32=not with_opt)


def _load_batch(reader, src, md, batch, writer, with_opt):
    import torch

    sd = {key: torch.empty(list(md[key].size), dtype=st.DTYPES[dt][0]) for key, _, _, dt, _ in batch}
    dcp_load(sd, reader, src, list(sd))
    for key, _, members, dt, half in batch:
        _put(writer, members, half, to_numpy(sd[key]), dt, with_opt)


def import_(src, writer, batch_bytes=1 << 29):
    """Fills writer from a torch_dist checkpoint; returns the prefixes allowed to stay zero."""
    i = _info(writer.model)
    src, _ = checkpoint_dir(src)
    meta = read_metadata(src)
    found, with_opt = scan(src, meta, writer, int(i["vocab_size"]))
    common = _common(src)
    reader = _torch_dcp().FileSystemReader(src)
    md = meta.state_dict_metadata

    def nbytes(item):
        return md[item[0]].properties.dtype.itemsize * int(np.prod(list(md[item[0]].size)))

    for batch in batches(found, nbytes, batch_bytes):
        _load_batch(reader, src, md, batch, writer, with_opt)
    if "iteration" in common:
        writer.extra["step"] = int(common["iteration"])
    args = common.get("args")
    if args is not None and getattr(args, "consumed_train_samples", None) is not None:
        writer.extra["samples_consumed"] = int(args.consumed_train_samples)
    return [] if with_opt else ["optimizer."]


# ----------------------------------------------------------------------------- export


def _padded_vocab(info, tp):
    V, m = int(info["vocab_size"]), int(info["make_vocab_size_divisible_by"])
    return -(-V // (m * tp)) * m * tp


def export_state(reader, tp):
    """({MCore key: (global shape, [(box, tensor)])}, {_extra_state key: [None]}, bytes) of
    a tenplex checkpoint: one chunk per distinct piece of the checkpoint's own layout
    (views of the mapped rank files), vocabulary padded for `tp` (zero rows)."""
    import torch

    model = reader.info["model"]
    info = _info(model)
    L = int(info["num_layers"])
    gl = ptc.global_tensors(model)
    keys: dict[str, Any] = {}
    total = 0
    for name, (dt, shape) in gl.items():
        key, layer = mcore_key(name)
        entry = keys.setdefault(
            key, {"dt": dt, "shape": ([L] if layer is not None else []) + list(shape), "chunks": []}
        )
        for g, view in reader.views(name):
            t = to_torch(view, dt)
            if layer is not None:
                t, g = t.unsqueeze(0), [(layer, layer + 1)] + g
            entry["chunks"].append(([b for b, _ in g], t))
            total += t.numel() * t.element_size()
    pieces = {}
    for key, e in keys.items():
        vocab = key.rsplit("optimizer.state.", 1)[-1].split(".", 1)[-1] if key.startswith("optimizer.") else key
        if vocab in _VOCAB_KEYS:
            V, Vp = e["shape"][0], _padded_vocab(info, tp)
            if Vp > V:
                e["chunks"].append(([V, 0], torch.zeros([Vp - V] + e["shape"][1:], dtype=st.DTYPES[e["dt"]][0])))
            e["shape"] = [Vp] + e["shape"][1:]
        pieces[key] = (e["shape"], [([(o, o + n) for o, n in zip(off, t.shape)], t) for off, t in e["chunks"]])
    # MCore stores a ShardedObject as torch.save of the list of its local objects
    objects = {
        f"decoder.layers.{mod}._extra_state/shard_{i}_{L}": [None] for mod in _EXTRA_STATE_MODULES for i in range(L)
    }
    return pieces, objects, total


def export(reader, out, config=""):
    """Writes reader's checkpoint as a torch_dist directory at out (MCore's
    dist_checkpointing.load reshards it into any TP/PP); config's tp sets the vocabulary
    padding (default: the checkpoint's own)."""
    import torch

    cfg = config or reader.info["config"]
    tp = int(dict(x.split("=", 1) for x in cfg.split(",") if "=" in x).get("tp", 1))
    ptc.check_target_dir(out)
    stage = out.rstrip("/") + ".partial"
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage)
    try:
        pieces, objects, total = export_state(reader, tp)
        dcp_save(objects, pieces, stage)
        common: dict[str, Any] = {"checkpoint_version": 3.0, "iteration": int(reader.info.get("step", 0))}
        if "samples_consumed" in reader.info:
            import argparse

            common["args"] = argparse.Namespace(consumed_train_samples=int(reader.info["samples_consumed"]))
        with open(os.path.join(stage, "common.pt"), "wb") as f:
            torch.save(common, f)
        with open(os.path.join(stage, "metadata.json"), "w") as f:
            json.dump(
                {
                    "sharded_backend": "torch_dist",
                    "sharded_backend_version": 1,
                    "common_backend": "torch",
                    "common_backend_version": 1,
                },
                f,
            )
        for name in os.listdir(stage):
            st.fsync_path(os.path.join(stage, name))
        ptc.move_into_place(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return total
