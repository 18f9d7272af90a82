"""Hugging Face safetensors models (Llama family, Mistral on import, and GPT-2) <-> tenplex checkpoints.

An HF model is one consolidated set of tensors: `model.safetensors`, or above
`--max-shard-size` bytes `model-00001-of-0000N.safetensors` ... with
`model.safetensors.index.json` ({"metadata": {"total_size"}, "weight_map"}), plus
`config.json`. Every HF tensor is a *part* of one of our global tensors: a list of row
ranges of it (dim 0), concatenated, optionally transposed (GPT-2's Conv1D weights are
stored [in, out]). The recipes are the name-mapping tables of docs/interop.md:

  fused QKV [(a+2g)·d, h], grouped per query group j (spec §2): rows
    [j·G, j·G + (a/g)·d) are the group's query heads, then d key rows, then d value
    rows, G = (a/g + 2)·d. Llama's q_proj is the query rows of every group in group
    order, k_proj the key rows, v_proj the value rows; GPT-2's c_attn is [q; k; v]
    transposed.
  SwiGLU fc1 [2f, h]: rows [0, f) are gate_proj, [f, 2f) up_proj.

Export assembles one global tensor at a time from the checkpoint's pieces (memory: the
largest tensor) and writes the parts straight into the memory-mapped output files.
Import maps the HF files read-only and puts every part into the new checkpoint's
pieces; optimizer moments start at zero and fp32 master copies equal the parameters
(an HF model carries no optimizer state).
"""

import json
import math
import os
import shutil
from typing import Any

import numpy as np

from .. import safetensors as st
from . import ptc
from .ptc import InteropError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
HF_DTYPE = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
# What the tenplex GPT (examples/gpt, Megatron-Core defaults) computes with; the model
# description does not record them.
NORM_EPS, ROPE_THETA = 1e-5, 10000.0


class Part:
    def __init__(self, hf, src, rows=None, transpose=False):
        self.hf, self.src, self.rows, self.transpose = hf, src, rows, transpose

    def shape(self, src_shape):
        rows = sum(e - b for b, e in self.rows) if self.rows else src_shape[0]
        s = [rows] + list(src_shape[1:])
        return s[::-1] if self.transpose else s


def _info(model):
    i = model.get("info", {})
    if i.get("family") != "gpt":
        raise InteropError("HF export/import needs a GPT-family model description (tenplex model gpt)")
    n = {
        k: int(i[k])
        for k in (
            "num_layers",
            "hidden_size",
            "ffn_hidden_size",
            "num_attention_heads",
            "num_query_groups",
            "kv_channels",
            "vocab_size",
            "max_position_embeddings",
        )
    }
    n.update({k: i[k] for k in ("position_embedding_type", "normalization", "params_dtype")})
    n.update({k: i[k] == "true" for k in ("swiglu", "bias", "tied")})
    return n


def family_of(model):
    """'llama' or 'gpt2' from the description; a model that fits neither is an error."""
    m = _info(model)
    if m["swiglu"] and m["normalization"] == "RMSNorm" and not m["bias"] and m["position_embedding_type"] == "rope":
        return "llama"
    if (
        not m["swiglu"]
        and m["normalization"] == "LayerNorm"
        and m["bias"]
        and m["position_embedding_type"] == "learned_absolute"
        and m["tied"]
        and m["num_query_groups"] == m["num_attention_heads"]
        and m["kv_channels"] * m["num_attention_heads"] == m["hidden_size"]
    ):
        return "gpt2"
    raise InteropError(
        "the model is neither Llama-like (RMSNorm, SwiGLU, rope, no biases) nor GPT-2-like "
        "(LayerNorm, GELU MLP, biases, learned positions, tied embeddings, a = g, "
        "h = a·d): no Hugging Face mapping"
    )


def qkv_rows(m):
    """(q, k, v) row ranges of the fused QKV, each in group order."""
    a, g, d = m["num_attention_heads"], m["num_query_groups"], m["kv_channels"]
    G = (a // g + 2) * d
    q = [(j * G, j * G + a // g * d) for j in range(g)]
    k = [(j * G + a // g * d, j * G + (a // g + 1) * d) for j in range(g)]
    v = [(j * G + (a // g + 1) * d, (j + 1) * G) for j in range(g)]
    return q, k, v


def recipe(model):
    """[Part] of every HF tensor, in HF order."""
    m = _info(model)
    fam = family_of(model)
    q, k, v = qkv_rows(m)
    f = m["ffn_hidden_size"]
    parts = []
    if fam == "llama":
        parts.append(Part("model.embed_tokens.weight", "embedding.word_embeddings.weight"))
        for i in range(m["num_layers"]):
            p, h = f"decoder.layers.{i}.", f"model.layers.{i}."
            qkv = p + "self_attention.linear_qkv.weight"
            parts += [
                Part(h + "input_layernorm.weight", p + "self_attention.linear_qkv.layer_norm_weight"),
                Part(h + "self_attn.q_proj.weight", qkv, q),
                Part(h + "self_attn.k_proj.weight", qkv, k),
                Part(h + "self_attn.v_proj.weight", qkv, v),
                Part(h + "self_attn.o_proj.weight", p + "self_attention.linear_proj.weight"),
                Part(h + "post_attention_layernorm.weight", p + "mlp.linear_fc1.layer_norm_weight"),
                Part(h + "mlp.gate_proj.weight", p + "mlp.linear_fc1.weight", [(0, f)]),
                Part(h + "mlp.up_proj.weight", p + "mlp.linear_fc1.weight", [(f, 2 * f)]),
                Part(h + "mlp.down_proj.weight", p + "mlp.linear_fc2.weight"),
            ]
        parts.append(Part("model.norm.weight", "decoder.final_layernorm.weight"))
        if not m["tied"]:
            parts.append(Part("lm_head.weight", "output_layer.weight"))
        return parts
    parts += [
        Part("transformer.wte.weight", "embedding.word_embeddings.weight"),
        Part("transformer.wpe.weight", "embedding.position_embeddings.weight"),
    ]
    for i in range(m["num_layers"]):
        p, h = f"decoder.layers.{i}.", f"transformer.h.{i}."
        for x in ("weight", "bias"):
            T = x == "weight"
            parts += [
                Part(h + "ln_1." + x, p + "self_attention.linear_qkv.layer_norm_" + x),
                Part(h + "attn.c_attn." + x, p + "self_attention.linear_qkv." + x, q + k + v, T),
                Part(h + "attn.c_proj." + x, p + "self_attention.linear_proj." + x, None, T),
                Part(h + "ln_2." + x, p + "mlp.linear_fc1.layer_norm_" + x),
                Part(h + "mlp.c_fc." + x, p + "mlp.linear_fc1." + x, None, T),
                Part(h + "mlp.c_proj." + x, p + "mlp.linear_fc2." + x, None, T),
            ]
    parts += [
        Part("transformer.ln_f.weight", "decoder.final_layernorm.weight"),
        Part("transformer.ln_f.bias", "decoder.final_layernorm.bias"),
    ]
    return parts


def config_json(model):
    """config.json of the export. Values the description does not record are those the
    tenplex GPT (examples/gpt, Megatron-Core's defaults) computes with: norm epsilon 1e-5,
    rotary base 10000, exact (erf) GELU. Both spellings of the dtype (`dtype`, read by
    transformers 5; `torch_dtype`, by 4.x) and of the rotary base (`rope_parameters`,
    transformers 5; `rope_theta`, 4.x) are written."""
    m = _info(model)
    dt = HF_DTYPE[{"fp32": "F32", "bf16": "BF16", "fp16": "F16"}[m["params_dtype"]]]
    if family_of(model) == "llama":
        c = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": m["hidden_size"],
            "intermediate_size": m["ffn_hidden_size"],
            "num_hidden_layers": m["num_layers"],
            "num_attention_heads": m["num_attention_heads"],
            "num_key_value_heads": m["num_query_groups"],
            "head_dim": m["kv_channels"],
            "vocab_size": m["vocab_size"],
            "max_position_embeddings": m["max_position_embeddings"],
            "hidden_act": "silu",
            "rms_norm_eps": NORM_EPS,
            "rope_theta": ROPE_THETA,
            "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": m["tied"],
        }
    else:
        c = {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "n_embd": m["hidden_size"],
            "n_inner": m["ffn_hidden_size"],
            "n_layer": m["num_layers"],
            "n_head": m["num_attention_heads"],
            "n_positions": m["max_position_embeddings"],
            "n_ctx": m["max_position_embeddings"],
            "vocab_size": m["vocab_size"],
            "activation_function": "gelu",
            "layer_norm_epsilon": NORM_EPS,
            "tie_word_embeddings": True,
        }
    c["dtype"] = c["torch_dtype"] = dt
    c["tenplex_model"] = model.get("name", "gpt")
    return c


_NOT_CHECKED = (
    "torch_dtype",
    "dtype",
    "tenplex_model",
    "architectures",
    "rope_theta",
    "rope_parameters",
    "rms_norm_eps",
    "layer_norm_epsilon",
    "n_ctx",
    "hidden_act",
    "activation_function",
)
# model_type of files whose tensors are a Llama's: Mistral is Llama plus a sliding window
_LLAMA_TYPES = ("llama", "mistral")


def _hf_defaults(cfg, model_type):
    """Values HF assumes for keys a config.json may leave out."""
    if model_type == "llama":
        return {
            "num_key_value_heads": cfg.get("num_attention_heads"),
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
            "head_dim": cfg.get("hidden_size", 0) // max(cfg.get("num_attention_heads") or 1, 1),
        }
    return {"n_inner": 4 * cfg.get("n_embd", 0), "tie_word_embeddings": True}


def _check_config(model, cfg, path):
    """config.json against the description: every size it states must agree; what the
    tenplex model cannot compute is an error, what it computes with other constants a
    warning (returned)."""
    want = config_json(model)
    mt = cfg.get("model_type")
    if mt == "qwen2":
        raise InteropError(
            f"{path}: model_type {mt!r} has q/k/v biases without o_proj and MLP biases; the "
            "model description has one bias flag for every linear layer "
            "(--disable-bias-linear or all biases), so it cannot express this model"
        )
    if want["model_type"] == "llama" and mt in _LLAMA_TYPES:
        mt = "llama"
    if mt != want["model_type"]:
        raise InteropError(
            f"{path}: model_type is {cfg.get('model_type')!r}, the model description is {want['model_type']}-like"
        )
    defaults = _hf_defaults(cfg, want["model_type"])
    for k, v in want.items():
        if k in _NOT_CHECKED or k == "model_type":
            continue
        got = cfg.get(k)
        if got is None:
            got = defaults.get(k)
        if got != v:
            raise InteropError(f"{path}: {k} is {got!r}, the model description says {v!r}")
    return (_check_llama_compute if mt == "llama" else _check_gpt2_compute)(cfg, path)


def _check_llama_compute(cfg, path):
    warn = []
    if cfg.get("hidden_act", "silu") != "silu":
        raise InteropError(f"{path}: hidden_act is {cfg['hidden_act']!r}; the description's SwiGLU is silu")
    sw = cfg.get("sliding_window")
    if sw is not None and (cfg.get("use_sliding_window", True) and sw < cfg["max_position_embeddings"]):
        raise InteropError(
            f"{path}: sliding_window {sw} < max_position_embeddings "
            f"{cfg['max_position_embeddings']}: the tenplex model attends to every earlier token"
        )
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    theta = rope.get("rope_theta", cfg.get("rope_theta", ROPE_THETA))
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        warn.append(
            f"rope_type {rope.get('rope_type', rope.get('type'))!r}: the model description does not "
            "record rotary scaling; the training run must apply it (Megatron: --use-rope-scaling)"
        )
    if float(theta) != ROPE_THETA:
        warn.append(
            f"rope_theta {theta}: the model description does not record the rotary base "
            f"(Megatron: --rotary-base {theta:g})"
        )
    return [f"{path}: {w}" for w in warn + _eps_warning(cfg, "rms_norm_eps", 1e-6)]


def _check_gpt2_compute(cfg, path):
    warn = []
    act = cfg.get("activation_function", "gelu_new")
    if act in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        warn.append(
            f"activation_function {act!r} is GELU's tanh approximation; the tenplex GPT computes "
            "the exact GELU (Megatron: --openai-gelu for the approximation)"
        )
    elif act != "gelu":
        raise InteropError(f"{path}: activation_function is {act!r}; the description's MLP is GELU")
    if not cfg.get("scale_attn_weights", True) or cfg.get("scale_attn_by_inverse_layer_idx", False):
        raise InteropError(
            f"{path}: attention scores scaled other than by 1/sqrt(head size) "
            "(scale_attn_weights / scale_attn_by_inverse_layer_idx)"
        )
    return [f"{path}: {w}" for w in warn + _eps_warning(cfg, "layer_norm_epsilon", 1e-5)]


def _eps_warning(cfg, key, default):
    """[warning] when the file's norm epsilon (`key`, HF's `default`) is not NORM_EPS."""
    eps = cfg.get(key, default)
    if float(eps) == NORM_EPS:
        return []
    return [f"{key} {eps}: the model description does not record the norm epsilon (Megatron: --norm-epsilon {eps:g})"]


# ----------------------------------------------------------------------------- export


def export(reader, out, max_shard_size):
    model = reader.info["model"]
    parts = recipe(model)
    globals_ = ptc.global_tensors(model)
    entries = []
    for p in parts:
        dt, shape = globals_[p.src]
        entries.append((p.hf, dt, p.shape(shape)))
    # shards: consecutive tensors up to max_shard_size bytes each (a larger tensor alone)
    shards: list[Any] = []
    cur: list[Any] = []
    size = 0
    for e in entries:
        n = math.prod(e[2]) * ptc.DTYPE_SIZE[e[1]]
        if cur and size + n > max_shard_size:
            shards.append(cur)
            cur, size = [], 0
        cur.append(e)
        size += n
    if cur:
        shards.append(cur)
    names = (
        [SINGLE_FILE]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    ptc.check_target_dir(out)
    stage = out.rstrip("/") + ".partial"
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage)
    try:
        views, maps, weight_map, total = {}, [], {}, 0
        for name, shard in zip(names, shards):
            path = os.path.join(stage, name)
            offset, ranges = ptc.create_safetensors(path, shard, {"format": "pt"})
            mm, v = ptc.map_tensors(path, shard, offset, ranges)
            maps.append(mm)
            views.update(v)
            for e in shard:
                weight_map[e[0]] = name
                total += math.prod(e[2]) * ptc.DTYPE_SIZE[e[1]]
        by_src: dict[str, Any] = {}
        for p in parts:
            by_src.setdefault(p.src, []).append(p)
        for src, ps in by_src.items():
            dt, shape = globals_[src]
            full = reader.tensor(src, dt, shape)
            for p in ps:
                rows = np.concatenate([full[b:e] for b, e in p.rows]) if p.rows else full
                views[p.hf][...] = rows.T if p.transpose else rows
            del full
        for mm in maps:
            mm.flush()
        views.clear()
        maps.clear()
        for name in names:
            st.fsync_path(os.path.join(stage, name))
        if len(names) > 1:
            _write_json(os.path.join(stage, INDEX_FILE), {"metadata": {"total_size": total}, "weight_map": weight_map})
        _write_json(os.path.join(stage, "config.json"), config_json(model))
        ptc.move_into_place(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return total


def _write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


# ----------------------------------------------------------------------------- import

# Buffers some GPT-2 files carry that are no parameters (causal masks); skipped.
_GPT2_BUFFERS = (".attn.bias", ".attn.masked_bias")


def open_model(src):
    """{hf name: (dtype, shape, read-only array)} of every tensor of an HF directory."""
    idx = os.path.join(src, INDEX_FILE)
    if os.path.exists(idx):
        try:
            with open(idx) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        except (ValueError, KeyError, TypeError) as e:
            raise InteropError(f"{idx}: not an index JSON with a weight_map ({e})") from None
    elif os.path.exists(os.path.join(src, SINGLE_FILE)):
        files = [SINGLE_FILE]
    else:
        raise InteropError(f"{src}: neither {SINGLE_FILE} nor {INDEX_FILE} is there")
    out = {}
    for fname in files:
        path = os.path.join(src, fname)
        if not os.path.exists(path):
            raise InteropError(f"{path}: listed in the index but missing")
        try:
            entries, _, offset, _ = st.read_header(path)
        except st.SafetensorsError as e:
            raise InteropError(str(e)) from None
        _, arrays = ptc.map_tensors(
            path,
            [(n, dt, shape) for n, dt, shape, _, _ in entries],
            offset,
            {n: (b, e) for n, _, _, b, e in entries},
            mode="r",
        )
        for name, dt, shape, _, _ in entries:
            if name in out:
                raise InteropError(f"{path}: tensor '{name}' is also in another file")
            out[name] = (dt, list(shape), arrays[name], path)
    return out


def import_(src, writer, log):
    model = writer.model
    cfg_path = os.path.join(src, "config.json")
    if not os.path.exists(cfg_path):
        raise InteropError(f"{cfg_path} is missing")
    try:
        with open(cfg_path) as f:
            cfg = json.load(f)
    except ValueError as e:
        raise InteropError(f"{cfg_path} is not JSON ({e})") from None
    for w in _check_config(model, cfg, cfg_path):
        log(f"warning: {w}")
    tensors = open_model(src)
    fam = family_of(model)
    if fam == "gpt2":  # files saved from GPT2Model have no "transformer." prefix
        tensors = {
            (n if n.startswith("transformer.") or n == "lm_head.weight" else "transformer." + n): t
            for n, t in tensors.items()
        }
    parts = {p.hf: p for p in recipe(model)}
    for name, (_dt, _shape, _arr, path) in tensors.items():
        if name in parts:
            continue
        if fam == "gpt2" and (name.endswith(_GPT2_BUFFERS) or name == "lm_head.weight"):
            continue  # causal-mask buffers; the tied head (a copy of wte)
        if fam == "llama" and (
            name.endswith(".rotary_emb.inv_freq") or name == "lm_head.weight" and _info(model)["tied"]
        ):
            continue  # rotary frequency buffers of older files; the tied head
        raise InteropError(f"{path}: unknown tensor '{name}' (not part of a {fam} model of this description)")
    globals_ = writer.globals
    for hf_name, p in parts.items():
        if hf_name not in tensors:
            raise InteropError(f"{src}: tensor '{hf_name}' is missing")
        dt, shape, arr, path = tensors[hf_name]
        gdt, gshape = globals_[p.src]
        if dt != gdt or shape != p.shape(gshape):
            raise InteropError(f"{path}: tensor '{hf_name}' is {dt}{shape}, the model needs {gdt}{p.shape(gshape)}")
        a = arr.T if p.transpose else arr
        rows = p.rows or [(0, gshape[0])]
        off = 0
        for b, end in rows:
            box = [(b, end)] + [(0, n) for n in gshape[1:]]
            writer.put_param(p.src, box, a[off : off + end - b], dt, derive_fp32=True)
            off += end - b
