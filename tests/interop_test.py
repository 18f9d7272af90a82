#!/usr/bin/env python3
"""`tenplex import` / `tenplex export` (docs/interop.md) against independent references.

  interop_test.py TENPLEX_BIN hf|dcp|megatron

Every part draws the model's global tensors with numpy (seeded) and checks every
element, with slicing written here independently of the code under test:

  hf       Llama (GQA, SwiGLU, RMSNorm, untied, bf16) and GPT-2 (fp32): an HF directory
           cut from the global tensors by numpy (q/k/v rows per query group, gate/up,
           Conv1D transposes) is imported into tp=2,pp=2, checked against the Python
           layout (tenplex.layout), exported (single file and sharded with an index)
           and compared with the HF files tensor by tensor; the sharded export imports
           again (into tp=1,pp=2) to the same elements.
  dcp      4 processes save ShardedTensors in the layout tp=2,pp=2 with torch's DCP;
           import, `tenplex reshard` to tp=1,dp=2 (and zero=1), export, and 2 processes
           load with torch's DCP and compare every element; step and samples carried.
  megatron files written with torch.save in Megatron-LM's structure for TP=2 x PP=2
           (padded vocabulary, fused QKV, SwiGLU blocks, tied output copy on the last
           stage, _extra_state entries, args, iteration, consumed samples); import into
           tp=1,pp=2,dp=2, export to TP=4 x PP=1 and to TP=1 x PP=4, compared with
           the same independent slicing; a re-import equals the first.
(Bad input: tests/interop_errors_test.py, which shares this file's fixtures. The independent
references of the formats themselves are in tests/interop_testing.py.)
"""

import json
import os
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import torch  # noqa: E402

sys.path.insert(0, os.path.join(HERE, "reference"))
import layout_ref as L  # noqa: E402  (the independent pure-Python layout)
import tenplex_cli  # noqa: E402  (tests/, this script's folder)

# The independent references of the formats (interop_errors_test.py, interop_dcp2_test.py
# and interop_ds_test.py import some of them from here, with this file's fixtures).
from interop_testing import (  # noqa: E402
    _dcp_worker,
    bf16_bits,
    bits_to_f32,
    check_equal,
    check_megatron,
    hf_reference,
    read_hf,
    to_np,
    to_torch,
    write_hf,
    write_megatron,
)

from tenplex import safetensors as sf  # noqa: E402

BIN = None
TMP = None
NP = {"F32": np.float32, "BF16": np.uint16, "F16": np.float16}


def run(*args, expect=0):
    return tenplex_cli.run(BIN, *args, expect=expect)


def model_json(name, *flags):
    path = os.path.join(TMP, name + ".json")
    run("model", "gpt", *flags, "-o", path)
    with open(path) as f:
        return path, json.load(f)


def draw_globals(model, seed, with_optimizer=True):
    """{global name: raw numpy array} for parameters (and companions)."""
    rng = np.random.default_rng(seed)
    out = {}
    for t in model["tensors"]:
        v = rng.standard_normal(t["shape"]).astype(np.float32)
        out[t["path"]] = bf16_bits(v) if t["dtype"] == "BF16" else v.astype(NP[t["dtype"]])
    if with_optimizer and model["optimizer"]["states"]:
        for k in model["optimizer"]["states"] + ["fp32_param"]:
            for t in model["tensors"]:
                if k == "fp32_param" and t["dtype"] == "F32":
                    continue
                out[f"optimizer.{k}.{t['path']}"] = rng.standard_normal(t["shape"]).astype(np.float32)
    return out


def check_ckpt(ckpt, model, G, optimizer="given"):
    """Every rank file of a tenplex checkpoint against G sliced by the reference layout (tests/reference).
    optimizer: "given" (companions from G), "fresh" (moments zero, fp32 = params)."""
    with open(os.path.join(ckpt, "tenplex.json")) as f:
        info = json.load(f)
    m = L.Model(info["model"])
    cfg = L.Config.parse(info["config"])
    assert not cfg.zero, "check_ckpt slices non-ZeRO layouts"
    n = 0
    for r in range(cfg.world_size):
        got = sf.load(os.path.join(ckpt, f"rank-{r:05d}.safetensors"))
        params = L.local_params(m, cfg, cfg.pp_rank(r), cfg.tp_rank(r))
        want = {}
        for p in params:
            want[p.name] = np.asarray(to_np(p.slice(to_torch(G[p.path], p.dtype))))
            for k in L.companion_kinds(m, p.dtype):
                gname = f"optimizer.{k}.{p.path}"
                if optimizer == "given":
                    src = G[gname]
                elif k == "fp32_param":
                    src = bits_to_f32(G[p.path]) if p.dtype == "BF16" else G[p.path].astype(np.float32)
                else:
                    src = np.zeros(p.global_shape, np.float32)
                want[f"optimizer.{k}.{p.name}"] = p.slice(torch.from_numpy(np.ascontiguousarray(src))).numpy()
        if set(got) != set(want):
            sys.exit(f"FAIL: {ckpt} rank {r}: tensors {sorted(set(got) ^ set(want))} differ in presence")
        for name, w in want.items():
            check_equal(f"{ckpt} rank {r} {name}", to_np(got[name]), w)
            n += w.size
    return info, n


# ----------------------------------------------------------------------------- hf


def part_hf():
    cases = [
        (
            "llama",
            [
                "--num-layers",
                2,
                "--hidden-size",
                64,
                "--ffn-hidden-size",
                96,
                "--num-attention-heads",
                8,
                "--num-query-groups",
                2,
                "--vocab-size",
                200,
                "--make-vocab-size-divisible-by",
                16,
                "--max-position-embeddings",
                64,
                "--position-embedding-type",
                "rope",
                "--swiglu",
                "--disable-bias-linear",
                "--untie-embeddings-and-output-weights",
                "--normalization",
                "RMSNorm",
                "--params-dtype",
                "bf16",
            ],
            "BF16",
            {
                "model_type": "llama",
                "architectures": ["LlamaForCausalLM"],
                "hidden_size": 64,
                "intermediate_size": 96,
                "num_hidden_layers": 2,
                "num_attention_heads": 8,
                "num_key_value_heads": 2,
                "vocab_size": 200,
                "max_position_embeddings": 64,
                "tie_word_embeddings": False,
            },
        ),
        (
            "gpt2",
            [
                "--num-layers",
                2,
                "--hidden-size",
                48,
                "--num-attention-heads",
                4,
                "--vocab-size",
                100,
                "--make-vocab-size-divisible-by",
                8,
                "--max-position-embeddings",
                32,
            ],
            "F32",
            {
                "model_type": "gpt2",
                "n_embd": 48,
                "n_layer": 2,
                "n_head": 4,
                "n_positions": 32,
                "vocab_size": 100,
                "n_inner": None,
            },
        ),
    ]
    for fam, flags, dt, config in cases:
        mpath, model = model_json(fam, *[str(x) for x in flags])
        G = draw_globals(model, seed=1 if fam == "llama" else 2, with_optimizer=False)
        ref = hf_reference(model, G)
        src = os.path.join(TMP, fam + "-hf")
        write_hf(src, model, ref, config, dt)
        ck = os.path.join(TMP, fam + "-ck")
        run("import", "--from", "hf", src, "--model", mpath, "--config", "tp=2,pp=2", "--out", ck, "--step", 5)
        info, n = check_ckpt(ck, model, G, optimizer="fresh")
        assert info["step"] == 5, info
        for shard, want_files in ((None, 1), (sum(v.nbytes for v in ref.values()) // 3, None)):
            out = os.path.join(TMP, f"{fam}-export-{shard}")
            extra = ["--max-shard-size", shard] if shard else []
            run("export", "--to", "hf", ck, "--out", out, *extra)
            got, files = read_hf(out)
            if want_files and files != want_files or (shard and files < 3):
                sys.exit(f"FAIL: {out}: {files} safetensors files")
            if set(got) != set(ref):
                sys.exit(f"FAIL: {out}: tensors {sorted(set(got) ^ set(ref))} differ in presence")
            for k, v in ref.items():
                check_equal(f"{out} {k}", got[k], v)
            with open(os.path.join(out, "config.json")) as f:
                cfg = json.load(f)
            for k, v in config.items():
                if v is not None and cfg.get(k) != v:
                    sys.exit(f"FAIL: {out}/config.json: {k} = {cfg.get(k)!r}, expected {v!r}")
        if fam == "llama":  # into a ZeRO-1 layout (flat fp32 master copies), checked after a reshard
            z, r = os.path.join(TMP, "llama-zero"), os.path.join(TMP, "llama-zero-r")
            run("import", "--from", "hf", src, "--model", mpath, "--config", "tp=2,dp=2,zero=1", "--out", z)
            run("reshard", "--in", z, "--to", "tp=2,pp=2", "--out", r)
            check_ckpt(r, model, G, optimizer="fresh")
            print("hf llama: import into tp=2,dp=2,zero=1, resharded to tp=2,pp=2: every element equal")
        back = os.path.join(TMP, fam + "-back")  # the sharded export (index JSON) imports again
        run("import", "--from", "hf", out, "--model", mpath, "--config", "tp=1,pp=2", "--out", back)
        check_ckpt(back, model, G, optimizer="fresh")
        print(
            f"hf {fam}: import tp=2,pp=2 ({n} elements), export 1 file and {files} shards, re-import of the "
            "shards into tp=1,pp=2: every element equal"
        )


# ----------------------------------------------------------------------------- dcp


def dcp_world(world, mode, lay, dcp_dir, globals_path):
    import torch.multiprocessing as mp

    lay_path = os.path.join(TMP, f"layout-{mode}-{world}.json")
    with open(lay_path, "w") as f:
        json.dump(lay, f)
    res = tempfile.mkdtemp(dir=TMP)
    rdzv_file = os.path.join(res, "rendezvous")
    mp.start_processes(
        _dcp_worker,
        args=(world, rdzv_file, mode, lay_path, dcp_dir, globals_path, res),
        nprocs=world,
        join=True,
        start_method="spawn",
    )
    return [json.load(open(os.path.join(res, f"rank{r}.json"))) for r in range(world)] if mode == "load" else []


def layout_of(mpath, config):
    return json.loads(run("layout", "--model", mpath, "--config", config, "--json").stdout)


def part_dcp():
    mpath, model = model_json(
        "dcp",
        "--num-layers",
        "2",
        "--hidden-size",
        "32",
        "--num-attention-heads",
        "4",
        "--num-query-groups",
        "2",
        "--vocab-size",
        "100",
        "--make-vocab-size-divisible-by",
        "8",
        "--max-position-embeddings",
        "16",
        "--swiglu",
    )
    G = draw_globals(model, seed=3)
    gpath = os.path.join(TMP, "dcp-globals.npz")
    np.savez(gpath, **G)
    d1 = os.path.join(TMP, "dcp-n4")
    dcp_world(4, "save", layout_of(mpath, "tp=2,pp=2"), d1, gpath)
    c1 = os.path.join(TMP, "dcp-ck1")
    run("import", "--from", "dcp", d1, "--model", mpath, "--config", "tp=2,pp=2", "--out", c1)
    info, n = check_ckpt(c1, model, G)
    assert info["step"] == 7 and info["samples_consumed"] == 448, info
    for cfg in ("tp=1,pp=1,dp=2", "tp=2,pp=1,dp=1,zero=1"):
        c2 = os.path.join(TMP, "dcp-ck2-" + cfg)
        run("reshard", "--in", c1, "--to", cfg, "--out", c2)
        d2 = os.path.join(TMP, "dcp-m2-" + cfg)
        run("export", "--to", "dcp", c2, "--out", d2)
        res = dcp_world(2, "load", layout_of(mpath, cfg), d2, gpath)
        total = sum(r["elements"] for r in res)
        want = sum(v.size for v in G.values())
        if total != want or any(r["step"] != 7 or r["samples"] != 448 for r in res):
            sys.exit(f"FAIL: dcp load on 2 ranks ({cfg}): {res}, expected {want} elements, step 7, samples 448")
        print(
            f"dcp: 4 ranks (tp=2,pp=2) -> import -> reshard {cfg} -> export -> 2 ranks loaded "
            f"{total} elements, all equal; step and samples carried"
        )
    # a DCP checkpoint of parameters only: Adam starts fresh
    P = {k: v for k, v in G.items() if not k.startswith("optimizer.")}
    ppath = os.path.join(TMP, "dcp-params.npz")
    np.savez(ppath, **P)
    d3 = os.path.join(TMP, "dcp-params")
    dcp_world(2, "save", layout_of(mpath, "tp=2,pp=1"), d3, ppath)
    c3 = os.path.join(TMP, "dcp-ck3")
    run("import", "--from", "dcp", d3, "--model", mpath, "--config", "tp=1,pp=2", "--out", c3)
    check_ckpt(c3, model, G, optimizer="fresh")
    print("dcp: parameters-only checkpoint imported with fresh Adam state")


# ----------------------------------------------------------------------------- megatron


def part_megatron():
    mpath, model = model_json(
        "meg",
        "--num-layers",
        "4",
        "--hidden-size",
        "32",
        "--num-attention-heads",
        "4",
        "--vocab-size",
        "90",
        "--make-vocab-size-divisible-by",
        "8",
        "--max-position-embeddings",
        "16",
    )
    G = draw_globals(model, seed=4, with_optimizer=False)
    src = os.path.join(TMP, "meg-src")
    write_megatron(src, model, G, 2, 2, 100, 3200)
    ck = os.path.join(TMP, "meg-ck")
    p = run("import", "--from", "megatron", src, "--model", mpath, "--config", "tp=1,pp=2,dp=2", "--out", ck)
    if "optimizer state is not imported" not in p.stderr:
        sys.exit(f"FAIL: megatron import does not say the optimizer is not imported: {p.stderr}")
    info, n = check_ckpt(ck, model, G, optimizer="fresh")
    assert info["step"] == 100 and info["samples_consumed"] == 3200, info
    for T, P in ((4, 1), (1, 4), (2, 2)):
        out = os.path.join(TMP, f"meg-out-{T}-{P}")
        run("export", "--to", "megatron", ck, "--out", out, "--config", f"tp={T},pp={P}")
        m = check_megatron(out, model, G, T, P, 100, 3200)
        print(f"megatron: TP=2 x PP=2 -> tp=1,pp=2,dp=2 -> TP={T} x PP={P}: {m} elements equal")
    back = os.path.join(TMP, "meg-back")
    run(
        "import",
        "--from",
        "megatron",
        os.path.join(TMP, "meg-out-4-1"),
        "--model",
        mpath,
        "--config",
        "tp=1,pp=2,dp=2",
        "--out",
        back,
    )
    for r in range(4):
        a = sf.load(os.path.join(ck, f"rank-{r:05d}.safetensors"))
        b = sf.load(os.path.join(back, f"rank-{r:05d}.safetensors"))
        for k in a:
            check_equal(f"re-import rank {r} {k}", b[k].numpy(), a[k].numpy())
    print(f"megatron: import checked ({n} elements), re-import of the TP=4 export equals the first import")


def main():
    global BIN, TMP
    BIN = os.path.abspath(sys.argv[1])
    part = sys.argv[2]
    TMP = tempfile.mkdtemp(prefix=f"tenplex-interop-{part}-")
    try:
        {"hf": part_hf, "dcp": part_dcp, "megatron": part_megatron}[part]()
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    print(f"interop {part}: OK")


if __name__ == "__main__":
    main()
