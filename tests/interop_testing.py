"""Independent references of the checkpoint formats of interop_test.py (and of the
interop tests that share its fixtures): exact comparison of numpy arrays and bf16 bits,
Hugging Face tensors cut from the global tensors (Llama and GPT-2 names), the
ShardedTensor pieces each rank owns and the worker that saves or loads them with torch's
DCP, and Megatron-LM's per-rank model state (written with torch.save and checked).

Nothing here runs `tenplex`: the code under test is driven from interop_test.py.
"""

import argparse
import json
import math
import os
import sys

import numpy as np
import torch

from tenplex import safetensors as sf


def bf16_bits(v):
    return (v.view(np.uint32) >> 16).astype(np.uint16)


def bits_to_f32(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def to_torch(a, dt):
    if dt == "BF16":
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def to_np(t):
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def check_equal(what, got, want):
    if list(got.shape) != list(want.shape):
        sys.exit(f"FAIL: {what}: shape {list(got.shape)}, expected {list(want.shape)}")
    if not np.array_equal(np.asarray(got).view(np.uint8), np.ascontiguousarray(want).view(np.uint8)):
        bad = int(np.sum(np.asarray(got) != want))
        sys.exit(f"FAIL: {what}: {bad} elements differ")


# ----------------------------------------------------------------------------- hf


def hf_reference(model, G):
    """{hf name: numpy} cut from the global tensors here, independently."""
    i = model["info"]
    a, g, d = int(i["num_attention_heads"]), int(i["num_query_groups"]), int(i["kv_channels"])
    f, nl = int(i["ffn_hidden_size"]), int(i["num_layers"])
    per = a // g
    out = {}

    def split_qkv(w):
        q, k, v = [], [], []
        for j in range(g):
            grp = w[j * (per + 2) * d : (j + 1) * (per + 2) * d]
            q.append(grp[: per * d])
            k.append(grp[per * d : (per + 1) * d])
            v.append(grp[(per + 1) * d :])
        return np.concatenate(q), np.concatenate(k), np.concatenate(v)

    if i["swiglu"] == "true":
        out["model.embed_tokens.weight"] = G["embedding.word_embeddings.weight"]
        for n in range(nl):
            p, h = f"decoder.layers.{n}.", f"model.layers.{n}."
            q, k, v = split_qkv(G[p + "self_attention.linear_qkv.weight"])
            fc1 = G[p + "mlp.linear_fc1.weight"]
            out.update(
                {
                    h + "input_layernorm.weight": G[p + "self_attention.linear_qkv.layer_norm_weight"],
                    h + "self_attn.q_proj.weight": q,
                    h + "self_attn.k_proj.weight": k,
                    h + "self_attn.v_proj.weight": v,
                    h + "self_attn.o_proj.weight": G[p + "self_attention.linear_proj.weight"],
                    h + "post_attention_layernorm.weight": G[p + "mlp.linear_fc1.layer_norm_weight"],
                    h + "mlp.gate_proj.weight": fc1[:f],
                    h + "mlp.up_proj.weight": fc1[f:],
                    h + "mlp.down_proj.weight": G[p + "mlp.linear_fc2.weight"],
                }
            )
        out["model.norm.weight"] = G["decoder.final_layernorm.weight"]
        out["lm_head.weight"] = G["output_layer.weight"]
    else:
        out["transformer.wte.weight"] = G["embedding.word_embeddings.weight"]
        out["transformer.wpe.weight"] = G["embedding.position_embeddings.weight"]
        for n in range(nl):
            p, h = f"decoder.layers.{n}.", f"transformer.h.{n}."
            q, k, v = split_qkv(G[p + "self_attention.linear_qkv.weight"])
            qb, kb, vb = split_qkv(G[p + "self_attention.linear_qkv.bias"])
            out.update(
                {
                    h + "ln_1.weight": G[p + "self_attention.linear_qkv.layer_norm_weight"],
                    h + "ln_1.bias": G[p + "self_attention.linear_qkv.layer_norm_bias"],
                    h + "attn.c_attn.weight": np.concatenate([q, k, v]).T,
                    h + "attn.c_attn.bias": np.concatenate([qb, kb, vb]),
                    h + "attn.c_proj.weight": G[p + "self_attention.linear_proj.weight"].T,
                    h + "attn.c_proj.bias": G[p + "self_attention.linear_proj.bias"],
                    h + "ln_2.weight": G[p + "mlp.linear_fc1.layer_norm_weight"],
                    h + "ln_2.bias": G[p + "mlp.linear_fc1.layer_norm_bias"],
                    h + "mlp.c_fc.weight": G[p + "mlp.linear_fc1.weight"].T,
                    h + "mlp.c_fc.bias": G[p + "mlp.linear_fc1.bias"],
                    h + "mlp.c_proj.weight": G[p + "mlp.linear_fc2.weight"].T,
                    h + "mlp.c_proj.bias": G[p + "mlp.linear_fc2.bias"],
                }
            )
        out["transformer.ln_f.weight"] = G["decoder.final_layernorm.weight"]
        out["transformer.ln_f.bias"] = G["decoder.final_layernorm.bias"]
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def write_hf(path, model, ref, config, dt):
    os.makedirs(path)
    sf.save(os.path.join(path, "model.safetensors"), {k: to_torch(v, dt) for k, v in ref.items()})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)


def read_hf(path):
    idx = os.path.join(path, "model.safetensors.index.json")
    out = {}
    if os.path.exists(idx):
        with open(idx) as f:
            index = json.load(f)
        files = sorted(set(index["weight_map"].values()))
        for fn in files:
            out.update({k: to_np(v) for k, v in sf.load(os.path.join(path, fn)).items()})
        if set(out) != set(index["weight_map"]):
            sys.exit("FAIL: index weight_map does not list exactly the tensors of the shards")
        size = sum(v.nbytes for v in out.values())
        if index["metadata"]["total_size"] != size:
            sys.exit(f"FAIL: index total_size {index['metadata']['total_size']} != {size}")
        return out, len(files)
    return {k: to_np(v) for k, v in sf.load(os.path.join(path, "model.safetensors")).items()}, 1


# ----------------------------------------------------------------------------- dcp


def owned_pieces(lay, rank):
    """[(tensor, global box, local name)] of pieces this rank owns: the first rank
    listing a (tensor, box) owns it (ShardedTensor shards must not overlap)."""
    seen, out = set(), []
    for r in lay["ranks"]:
        for t in r["tensors"]:
            for p in t["pieces"]:
                key = (p["tensor"], tuple(map(tuple, p["global"])))
                if key in seen:
                    continue
                seen.add(key)
                if r["rank"] == rank:
                    out.append((p["tensor"], [tuple(x) for x in p["global"]]))
    return out


def _dcp_worker(rank, world, rdzv_file, mode, lay_path, dcp_dir, globals_path, result_dir):
    import warnings

    warnings.filterwarnings("ignore", message=".*deprecating ShardedTensor.*")  # ShardedTensor: any chunk boxes
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor

    # A rendezvous file, not a TCP port: a port chosen here can be taken by
    # another test of the parallel suite before rank 0 binds it.
    dist.init_process_group("gloo", init_method="file://" + rdzv_file, rank=rank, world_size=world)
    torch.set_num_threads(1)
    with open(lay_path) as f:
        lay = json.load(f)
    G = dict(np.load(globals_path))
    mine = owned_pieces(lay, rank)
    sd = {}
    for name in sorted(G):
        arr = G[name]
        shards = []
        for tensor, box in mine:
            if tensor != name:
                continue
            sl = tuple(slice(b, e) for b, e in box)
            data = (
                torch.from_numpy(np.ascontiguousarray(arr[sl]))
                if mode == "save"
                else torch.zeros([e - b for b, e in box], dtype=torch.float32)
            )
            shards.append(
                Shard(
                    tensor=data,
                    metadata=ShardMetadata(
                        shard_offsets=[b for b, _ in box],
                        shard_sizes=[e - b for b, e in box],
                        placement=f"rank:{rank}/cpu",
                    ),
                )
            )
        sd[name] = ShardedTensor._init_from_local_shards(shards, *arr.shape)
    if mode == "save":
        sd["step"] = 7
        sd["samples_consumed"] = 448
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(dcp_dir))
    else:
        sd["step"] = 0
        sd["samples_consumed"] = 0
        dcp.load(sd, storage_reader=dcp.FileSystemReader(dcp_dir))
        n = 0
        for name in sorted(G):
            for sh in sd[name].local_shards():
                box = [(o, o + s) for o, s in zip(sh.metadata.shard_offsets, sh.metadata.shard_sizes)]
                want = G[name][tuple(slice(b, e) for b, e in box)]
                if not np.array_equal(sh.tensor.numpy(), want):
                    raise SystemExit(f"rank {rank}: {name} {box}: {int(np.sum(sh.tensor.numpy() != want))} differ")
                n += want.size
        with open(os.path.join(result_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"elements": n, "step": sd["step"], "samples": sd["samples_consumed"]}, f)
    dist.barrier()
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- megatron


def megatron_slices(model, G, T, P):
    """{(t, p): {local name: numpy}}: Megatron's per-rank model state, cut here."""
    i = model["info"]
    V, m = int(i["vocab_size"]), int(i["make_vocab_size_divisible_by"])
    nl, f = int(i["num_layers"]), int(i["ffn_hidden_size"])
    swiglu, tied = i["swiglu"] == "true", i["tied"] == "true"
    per_stage = nl // P
    Vp = math.ceil(V / (m * T)) * m * T
    out = {}
    for t in range(T):
        for p in range(P):
            sd = {}

            def vocab(w):
                padded = np.zeros((Vp,) + w.shape[1:], w.dtype)
                padded[:V] = w
                return padded[t * Vp // T : (t + 1) * Vp // T]

            def rows(w):
                n = w.shape[0] // T
                return w[t * n : (t + 1) * n]

            def cols(w):
                n = w.shape[1] // T
                return w[:, t * n : (t + 1) * n]

            def fc1(w):
                if not swiglu:
                    return rows(w)
                return np.concatenate([rows(w[:f]), rows(w[f:])])

            if p == 0:
                sd["embedding.word_embeddings.weight"] = vocab(G["embedding.word_embeddings.weight"])
                if "embedding.position_embeddings.weight" in G:
                    sd["embedding.position_embeddings.weight"] = G["embedding.position_embeddings.weight"]
            for li in range(per_stage):
                gp, lp = f"decoder.layers.{p * per_stage + li}.", f"decoder.layers.{li}."
                for name, arr in G.items():
                    if not name.startswith(gp):
                        continue
                    tail = name[len(gp) :]
                    if tail.endswith(("layer_norm_weight", "layer_norm_bias")) or tail in (
                        "self_attention.linear_proj.bias",
                        "mlp.linear_fc2.bias",
                    ):
                        v = arr
                    elif tail.startswith("self_attention.linear_qkv."):
                        v = rows(arr)
                    elif tail == "self_attention.linear_proj.weight" or tail == "mlp.linear_fc2.weight":
                        v = cols(arr)
                    elif tail.startswith("mlp.linear_fc1."):
                        v = fc1(arr)
                    else:
                        raise AssertionError(tail)
                    sd[lp + tail] = v
                for mod in (
                    "self_attention.linear_qkv",
                    "self_attention.linear_proj",
                    "mlp.linear_fc1",
                    "mlp.linear_fc2",
                ):
                    sd[lp + mod + "._extra_state"] = None
            if p == P - 1:
                for k in ("decoder.final_layernorm.weight", "decoder.final_layernorm.bias"):
                    if k in G:
                        sd[k] = G[k]
                if not tied:
                    sd["output_layer.weight"] = vocab(G["output_layer.weight"])
                elif P > 1:
                    sd["output_layer.weight"] = vocab(G["embedding.word_embeddings.weight"])
            out[(t, p)] = {k: (np.ascontiguousarray(v) if v is not None else None) for k, v in sd.items()}
    return out


def write_megatron(path, model, G, T, P, iteration, samples):
    os.makedirs(path)
    it = os.path.join(path, f"iter_{iteration:07d}")
    i = model["info"]
    for (t, p), sd in megatron_slices(model, G, T, P).items():
        d = os.path.join(it, f"mp_rank_{t:02d}" if P == 1 else f"mp_rank_{t:02d}_{p:03d}")
        os.makedirs(d)
        args = argparse.Namespace(
            num_layers=int(i["num_layers"]),
            hidden_size=int(i["hidden_size"]),
            ffn_hidden_size=int(i["ffn_hidden_size"]),
            num_attention_heads=int(i["num_attention_heads"]),
            num_query_groups=int(i["num_query_groups"]),
            group_query_attention=True,
            kv_channels=int(i["kv_channels"]),
            swiglu=i["swiglu"] == "true",
            tensor_model_parallel_size=T,
            pipeline_model_parallel_size=P,
            consumed_train_samples=samples,
            consumed_valid_samples=0,
            params_dtype=torch.float32,
            iteration=iteration,
        )
        state = {k: (torch.from_numpy(v) if v is not None else None) for k, v in sd.items()}
        torch.save(
            {
                "args": args,
                "checkpoint_version": 3.0,
                "iteration": iteration,
                "model": state,
                "optimizer": {"optimizer": {"state": {}, "param_groups": []}},
                "opt_param_scheduler": {"num_steps": iteration * 8},
                "rng_state": [{"random_rng_state": None}],
                "num_floating_point_operations_so_far": 0,
            },
            os.path.join(d, "model_optim_rng.pt"),
        )
    with open(os.path.join(path, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(iteration))


def check_megatron(path, model, G, T, P, iteration, samples):
    want = megatron_slices(model, G, T, P)
    with open(os.path.join(path, "latest_checkpointed_iteration.txt")) as f:
        assert f.read().strip() == str(iteration)
    n = 0
    for (t, p), sd in want.items():
        d = os.path.join(path, f"iter_{iteration:07d}", f"mp_rank_{t:02d}" if P == 1 else f"mp_rank_{t:02d}_{p:03d}")
        got = torch.load(os.path.join(d, "model_optim_rng.pt"), weights_only=False)  # our export, trusted here
        a = got["args"]
        if (
            got["iteration"] != iteration
            or a.tensor_model_parallel_size != T
            or a.pipeline_model_parallel_size != P
            or a.consumed_train_samples != samples
            or got["checkpoint_version"] != 3.0
        ):
            sys.exit(f"FAIL: {d}: iteration/args wrong: {got['iteration']}, {a}")
        if set(got["model"]) != set(sd):
            sys.exit(f"FAIL: {d}: keys {sorted(set(got['model']) ^ set(sd))} differ in presence")
        for k, v in sd.items():
            if v is None:
                continue
            check_equal(f"{d} {k}", got["model"][k].numpy(), v)
            n += v.size
    return n
