"""Shared references of gpt_train_test.py (the reference GPT client's tests):

- `reference_losses`: an independent single-process reference, written apart from the
  client: global tensors, plain torch ops, F.cross_entropy, torch.optim.AdamW and
  clip_grad_norm_. It shares only the inputs with the client: the initial values
  (model.init_global) and the data (data.step_samples, data.Corpus).
- checkpoints against the C++ layout (`tenplex layout --json`): every global tensor
  gathered from a checkpoint's pieces (names, dtypes, shapes, zero padding, replicas
  agree), the reference re-slicer into another config, and the `tenplex run` hand-off
  files (store files plus hand-off JSON) made and read back as a checkpoint.

BIN (the `tenplex` binary) is set by the test script before `layout` is called.
"""

import json
import math
import os
import subprocess

# examples/gpt (data, model) is on sys.path: gpt_train_test.py, the one importer, puts
# it there before it imports this module.
import data
import model as gpt
import torch
import torch.nn.functional as F

from tenplex import checkpoint, safetensors

BIN = None


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def layout(model, config):
    out = subprocess.run(
        [BIN, "layout", "--model", model, "--config", config, "--json"], capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out)


# ---- independent single-process reference ---------------------------------------


def reference_losses(model_path, steps, seed=1234, lr=1e-3, wd=0.01, clip=1.0, batch=8, seq=48):
    with open(model_path) as f:
        desc = json.load(f)
    info = desc["info"]
    L, h = int(info["num_layers"]), int(info["hidden_size"])
    a, g, d = int(info["num_attention_heads"]), int(info["num_query_groups"]), int(info["kv_channels"])
    V = int(info["vocab_size"])
    rope = info["position_embedding_type"] == "rope"
    swiglu, bias, tied = info["swiglu"] == "true", info["bias"] == "true", info["tied"] == "true"
    layernorm = info["normalization"] == "LayerNorm"
    P = {t["path"]: torch.nn.Parameter(gpt.init_global(seed, t["path"], t["shape"], L)) for t in desc["tensors"]}

    def norm(x, prefix):
        if layernorm:
            return F.layer_norm(x, (h,), P[prefix + "weight"], P[prefix + "bias"], 1e-5)
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5) * P[prefix + "weight"]

    def rotate(x):  # x [b, s, n, d]; pairs (j, j + d/2) rotate by pos * 10000^(-2j/d)
        s, half = x.shape[1], d // 2
        theta = (
            torch.arange(s, dtype=torch.float32)[:, None]
            * torch.pow(10000.0, -torch.arange(half, dtype=torch.float32) * 2 / d)[None, :]
        )
        c, sn = theta.cos()[None, :, None, :], theta.sin()[None, :, None, :]
        lo, hi = x[..., :half], x[..., half:]
        return torch.cat([lo * c - hi * sn, hi * c + lo * sn], dim=-1)

    def lin(x, name, with_bias):
        y = x @ P[name + "weight"].t()
        return y + P[name + "bias"] if with_bias else y

    def loss_fn(ids, labels, mask, total):
        b, s = ids.shape
        x = P["embedding.word_embeddings.weight"][ids]
        if not rope:
            x = x + P["embedding.position_embeddings.weight"][:s]
        for i in range(L):
            p = f"decoder.layers.{i}."
            qkv = lin(norm(x, p + "self_attention.linear_qkv.layer_norm_"), p + "self_attention.linear_qkv.", bias)
            heads_q, heads_k, heads_v = [], [], []
            per = (a // g + 2) * d
            for j in range(g):
                grp = qkv[..., j * per : (j + 1) * per]
                for qh in range(a // g):
                    heads_q.append((grp[..., qh * d : (qh + 1) * d], j))
                heads_k.append(grp[..., (a // g) * d : (a // g + 1) * d])
                heads_v.append(grp[..., (a // g + 1) * d :])
            k_all = torch.stack(heads_k, dim=2)
            q_all = torch.stack([q for q, _ in heads_q], dim=2)
            if rope:
                k_all, q_all = rotate(k_all), rotate(q_all)
            outs = []
            causal = torch.tril(torch.ones(s, s, dtype=torch.bool))
            for n, (_, j) in enumerate(heads_q):
                att = torch.einsum("bqd,bkd->bqk", q_all[:, :, n], k_all[:, :, j]) / math.sqrt(d)
                att = torch.where(causal, att, torch.tensor(float("-inf"))).softmax(-1)
                outs.append(torch.einsum("bqk,bkd->bqd", att, heads_v[j]))
            x = x + lin(torch.cat(outs, dim=-1), p + "self_attention.linear_proj.", bias)
            y = lin(norm(x, p + "mlp.linear_fc1.layer_norm_"), p + "mlp.linear_fc1.", bias)
            if swiglu:
                f = y.shape[-1] // 2
                y = y[..., :f] * torch.sigmoid(y[..., :f]) * y[..., f:]
            else:
                y = F.gelu(y)
            x = x + lin(y, p + "mlp.linear_fc2.", bias)
        x = norm(x, "decoder.final_layernorm.")
        out_w = P["embedding.word_embeddings.weight"] if tied else P["output_layer.weight"]
        logits = x @ out_w.t()
        ce = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), reduction="none")
        return (ce * mask.reshape(-1)).sum() / total

    params = list(P.values())
    opt = torch.optim.AdamW(
        [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": wd},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=lr,
        betas=(0.9, 0.999),
        eps=1e-8,
    )
    corpus = data.Corpus(data.__file__.replace("data.py", "data/corpus.jsonl"), V, seq)
    out = []
    for step in range(steps):
        ids, _ = data.step_samples(len(corpus), seed, batch, step * batch, 1, 0)
        inputs, labels, mask = corpus.batch(ids)
        opt.zero_grad()
        loss = loss_fn(inputs, labels, mask, corpus.valid_tokens(ids))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        out.append({"step": step, "loss": loss.item(), "samples": ids})
    return out


# ---- checkpoints against the C++ layout -------------------------------------------


def gather_globals(ckpt, model_path):
    """Assembles every global tensor from a checkpoint through the C++ layout's pieces;
    checks local names/dtypes/shapes, zero padding, and that all replicas agree."""
    info = checkpoint.read_info(ckpt)
    lay = layout(model_path, info["config"])
    globals_, seen = {}, {}
    for r in lay["ranks"]:
        tensors = checkpoint.read_rank(ckpt, r["rank"])
        want = {t["name"]: (t["dtype"], tuple(t["shape"])) for t in r["tensors"]}
        got = {n: (safetensors.dtype_name(t.dtype), tuple(t.shape)) for n, t in tensors.items()}
        check(
            got == want,
            f"{ckpt} rank {r['rank']}: tensors differ from `tenplex layout`: "
            f"{sorted(set(got.items()) ^ set(want.items()))[:6]}",
        )
        for t in r["tensors"]:
            local = tensors[t["name"]]
            covered = torch.zeros(local.shape, dtype=torch.bool)
            for pc in t["pieces"]:
                gbox = tuple(slice(b, e) for b, e in pc["global"])
                ext = [e - b for b, e in pc["global"]]
                if local.dim() != len(ext):  # a flat (ZeRO-1) local tensor: a range
                    ((b, e),) = pc["local"]
                    vals = local.reshape(-1)[b:e].reshape(ext)
                    covered.view(-1)[b:e] = True
                else:
                    lbox = tuple(slice(b, e) for b, e in pc["local"])
                    vals = local[lbox]
                    covered[lbox] = True
                gshape = lay_shape(info["model"], pc["tensor"])
                if pc["tensor"] not in globals_:
                    globals_[pc["tensor"]] = torch.zeros(gshape, dtype=vals.dtype)
                    seen[pc["tensor"]] = torch.zeros(gshape, dtype=torch.bool)
                dst, s = globals_[pc["tensor"]][gbox], seen[pc["tensor"]][gbox]
                check(
                    torch.equal(dst[s], vals[s]),
                    f"{ckpt} rank {r['rank']} {t['name']}: replicas of {pc['tensor']} differ",
                )
                dst.copy_(vals)
                s.fill_(True)
            check(bool((local[~covered] == 0).all()), f"{ckpt} rank {r['rank']} {t['name']}: padding not zero")
    for name, s in seen.items():
        check(bool(s.all()), f"{ckpt}: global tensor {name} not fully covered")
    return info, globals_


def lay_shape(model_desc, name):
    for prefix in ("optimizer.exp_avg.", "optimizer.exp_avg_sq.", "optimizer.fp32_param."):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    for t in model_desc["tensors"]:
        if t["path"] == name:
            return t["shape"]
    raise KeyError(name)


def reslice(src, model_path, config, dst):
    """Reference converter: global tensors from src's pieces, written for config's pieces."""
    info, globals_ = gather_globals(src, model_path)
    lay = layout(model_path, config)
    checkpoint.begin(dst)
    for r in lay["ranks"]:
        out = []
        for t in r["tensors"]:
            dt = safetensors.DTYPES[t["dtype"]][0]
            local = torch.zeros(t["shape"], dtype=dt)
            for pc in t["pieces"]:
                vals = globals_[pc["tensor"]][tuple(slice(b, e) for b, e in pc["global"])]
                if local.dim() != len(pc["global"]):
                    ((b, e),) = pc["local"]
                    local[b:e] = vals.reshape(-1)
                else:
                    local[tuple(slice(b, e) for b, e in pc["local"])] = vals
            out.append((t["name"], local))
        checkpoint.write_rank(dst, r["rank"], out)
    new_info = dict(info)
    new_info["config"] = lay["config"]
    checkpoint.commit(dst, new_info, lay["world_size"])


def make_handoff(model_path, config, directory, step, samples):
    """What `tenplex run` gives a worker: zero-filled files per local tensor + hand-off JSON."""
    lay = layout(model_path, config)
    with open(model_path) as f:
        desc = json.load(f)
    ranks = []
    os.makedirs(directory)
    for r in lay["ranks"]:
        ts = []
        for t in r["tensors"]:
            path = os.path.join(directory, f"r{r['rank']}-{t['name']}")
            with open(path, "wb") as f:
                f.truncate(math.prod(t["shape"]) * safetensors.DTYPES[t["dtype"]][1])
            ts.append({"name": t["name"], "dtype": t["dtype"], "shape": t["shape"], "file": path})
        ranks.append({"rank": r["rank"], "tensors": ts})
    h = {"model": desc, "config": lay["config"], "step": step, "samples_consumed": samples, "ranks": ranks}
    path = os.path.join(directory, "handoff.json")
    with open(path, "w") as f:
        json.dump(h, f)
    return path


def handoff_to_checkpoint(handoff_path, directory):
    """The state in the store files as a checkpoint directory (to check it like one)."""
    with open(handoff_path) as f:
        h = json.load(f)
    checkpoint.begin(directory)
    for r in h["ranks"]:
        tensors = []
        for t in r["tensors"]:
            dt = safetensors.DTYPES[t["dtype"]][0]
            raw = torch.from_file(
                t["file"], size=math.prod(t["shape"]) * safetensors.DTYPES[t["dtype"]][1], dtype=torch.uint8
            )
            tensors.append((t["name"], raw.view(dt).reshape(t["shape"]).clone()))
        checkpoint.write_rank(directory, r["rank"], tensors)
    checkpoint.commit(directory, {k: h[k] for k in ("model", "config", "step", "samples_consumed")}, len(h["ranks"]))
