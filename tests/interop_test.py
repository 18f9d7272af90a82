"""`tenplex import` / `tenplex export` (docs/interop.md) against independent references.

Under pytest (issue 32 §4), ctests interop_hf, interop_dcp and interop_megatron, one test
function each, TENPLEX_BIN the CLI under test:

    python -m pytest tests/interop_test.py::test_hf

Every part draws the model's global tensors with numpy (seeded) and checks every
element, with slicing written here independently of the code under test:

  test_hf        Llama (GQA, SwiGLU, RMSNorm, untied, bf16) and GPT-2 (fp32): an HF directory
                 cut from the global tensors by numpy (q/k/v rows per query group, gate/up,
                 Conv1D transposes) is imported into tp=2,pp=2, checked against the Python
                 layout (tenplex.layout), exported (single file and sharded with an index)
                 and compared with the HF files tensor by tensor; the sharded export imports
                 again (into tp=1,pp=2) to the same elements.
  test_dcp       4 processes save ShardedTensors in the layout tp=2,pp=2 with torch's DCP;
                 import, `tenplex reshard` to tp=1,dp=2 (and zero=1), export, and 2 processes
                 load with torch's DCP and compare every element; step and samples carried.
  test_megatron  files written with torch.save in Megatron-LM's structure for TP=2 x PP=2
                 (padded vocabulary, fused QKV, SwiGLU blocks, tied output copy on the last
                 stage, _extra_state entries, args, iteration, consumed samples); import into
                 tp=1,pp=2,dp=2, export to TP=4 x PP=1 and to TP=1 x PP=4, compared with
                 the same independent slicing; a re-import equals the first.

The helpers here (run, model_json, draw_globals, check_ckpt, dcp_world, layout_of) read
the module globals BIN, TMP and L: the CLI under test, the test's own directory and
tests/reference's layout_ref (the independent pure-Python layout). `configured` sets them
for one test from the tenplex, tmp and references fixtures (tests/conftest.py) and
restores them; the `interop` fixture (tests/conftest.py) calls it for every interop test.
(Bad input: tests/interop_errors_test.py. The independent references of the formats
themselves are in tests/interop_testing.py.)
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import tenplex_cli  # tests/, this file's folder
import torch

# The independent references of the formats (interop_errors_test.py, interop_dcp2_test.py
# and interop_ds_test.py import some of them from here, with this file's fixtures).
from interop_testing import (
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

from tenplex import safetensors as sf

_log = logging.getLogger(__name__)

BIN = ""  # the CLI under test
TMP = ""  # the test's directory
L: Any = None  # tests/reference/layout_ref: the independent pure-Python layout
NP = {"F32": np.float32, "BF16": np.uint16, "F16": np.float16}
Globals = dict[str, np.ndarray]


@contextlib.contextmanager
def configured(tenplex: str, tmp: str, layout_ref: ModuleType) -> Iterator[str]:
    """BIN, TMP and L for one test (restored after it); yields the directory."""
    with pytest.MonkeyPatch.context() as mp:
        me = sys.modules[__name__]
        mp.setattr(me, "BIN", os.path.abspath(tenplex))
        mp.setattr(me, "TMP", tmp)
        mp.setattr(me, "L", layout_ref)
        yield tmp


def run(*args: object, expect: int = 0) -> subprocess.CompletedProcess[str]:
    return tenplex_cli.run(BIN, *args, expect=expect)


def model_json(name: str, *flags: str) -> tuple[str, dict[str, Any]]:
    path = os.path.join(TMP, name + ".json")
    run("model", "gpt", *flags, "-o", path)
    with open(path) as f:
        return path, json.load(f)


def draw_globals(model: dict[str, Any], seed: int, with_optimizer: bool = True) -> Globals:
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


def check_ckpt(ckpt: str, model: dict[str, Any], G: Globals, optimizer: str = "given") -> tuple[dict[str, Any], int]:
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
        assert set(got) == set(want), f"{ckpt} rank {r}: tensors {sorted(set(got) ^ set(want))} differ in presence"
        for name, w in want.items():
            check_equal(f"{ckpt} rank {r} {name}", to_np(got[name]), w)
            n += w.size
    return info, n


# ----------------------------------------------------------------------------- hf

LLAMA = (
    "--num-layers 2 --hidden-size 64 --ffn-hidden-size 96 --num-attention-heads 8 --num-query-groups 2 "
    "--vocab-size 200 --make-vocab-size-divisible-by 16 --max-position-embeddings 64 "
    "--position-embedding-type rope --swiglu --disable-bias-linear --untie-embeddings-and-output-weights "
    "--normalization RMSNorm --params-dtype bf16"
).split()
LLAMA_HF: dict[str, Any] = {
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
}
GPT2 = (
    "--num-layers 2 --hidden-size 48 --num-attention-heads 4 --vocab-size 100 "
    "--make-vocab-size-divisible-by 8 --max-position-embeddings 32"
).split()
GPT2_HF: dict[str, Any] = {
    "model_type": "gpt2",
    "n_embd": 48,
    "n_layer": 2,
    "n_head": 4,
    "n_positions": 32,
    "vocab_size": 100,
    "n_inner": None,
}


def test_hf(interop: str) -> None:
    for fam, flags, dt, config in (("llama", LLAMA, "BF16", LLAMA_HF), ("gpt2", GPT2, "F32", GPT2_HF)):
        mpath, model = model_json(fam, *flags)
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
            assert not (want_files and files != want_files or (shard and files < 3)), (
                f"{out}: {files} safetensors files"
            )
            assert set(got) == set(ref), f"{out}: tensors {sorted(set(got) ^ set(ref))} differ in presence"
            for k, v in ref.items():
                check_equal(f"{out} {k}", got[k], v)
            with open(os.path.join(out, "config.json")) as f:
                cfg = json.load(f)
            for k, v in config.items():
                assert v is None or cfg.get(k) == v, f"{out}/config.json: {k} = {cfg.get(k)!r}, expected {v!r}"
        if fam == "llama":  # into a ZeRO-1 layout (flat fp32 master copies), checked after a reshard
            z, r = os.path.join(TMP, "llama-zero"), os.path.join(TMP, "llama-zero-r")
            run("import", "--from", "hf", src, "--model", mpath, "--config", "tp=2,dp=2,zero=1", "--out", z)
            run("reshard", "--in", z, "--to", "tp=2,pp=2", "--out", r)
            check_ckpt(r, model, G, optimizer="fresh")
            _log.info("hf llama: import into tp=2,dp=2,zero=1, resharded to tp=2,pp=2: every element equal")
        back = os.path.join(TMP, fam + "-back")  # the sharded export (index JSON) imports again
        run("import", "--from", "hf", out, "--model", mpath, "--config", "tp=1,pp=2", "--out", back)
        check_ckpt(back, model, G, optimizer="fresh")
        _log.info(
            "hf %s: import tp=2,pp=2 (%d elements), export 1 file and %d shards, re-import of the "
            "shards into tp=1,pp=2: every element equal",
            fam,
            n,
            files,
        )


# ----------------------------------------------------------------------------- dcp


def dcp_world(world: int, mode: str, lay: dict[str, Any], dcp_dir: str, globals_path: str) -> list[dict[str, Any]]:
    """`world` processes save (mode "save") or load and check ("load") ShardedTensors of
    the layout `lay` with torch's DCP (interop_testing._dcp_worker); the loaders' results."""
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
    if mode != "load":
        return []
    results = []
    for r in range(world):
        with open(os.path.join(res, f"rank{r}.json")) as f:
            results.append(json.load(f))
    return results


def layout_of(mpath: str, config: str) -> dict[str, Any]:
    return json.loads(run("layout", "--model", mpath, "--config", config, "--json").stdout)


DCP = (
    "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --num-query-groups 2 --vocab-size 100 "
    "--make-vocab-size-divisible-by 8 --max-position-embeddings 16 --swiglu"
).split()


def test_dcp(interop: str) -> None:
    mpath, model = model_json("dcp", *DCP)
    G = draw_globals(model, seed=3)
    gpath = os.path.join(TMP, "dcp-globals.npz")
    np.savez(gpath, **G)  # type: ignore[arg-type]
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
        assert total == want and all(r["step"] == 7 and r["samples"] == 448 for r in res), (
            f"dcp load on 2 ranks ({cfg}): {res}, expected {want} elements, step 7, samples 448"
        )
        _log.info(
            "dcp: 4 ranks (tp=2,pp=2) -> import -> reshard %s -> export -> 2 ranks loaded "
            "%d elements, all equal; step and samples carried",
            cfg,
            total,
        )
    # a DCP checkpoint of parameters only: Adam starts fresh
    P = {k: v for k, v in G.items() if not k.startswith("optimizer.")}
    ppath = os.path.join(TMP, "dcp-params.npz")
    np.savez(ppath, **P)  # type: ignore[arg-type]
    d3 = os.path.join(TMP, "dcp-params")
    dcp_world(2, "save", layout_of(mpath, "tp=2,pp=1"), d3, ppath)
    c3 = os.path.join(TMP, "dcp-ck3")
    run("import", "--from", "dcp", d3, "--model", mpath, "--config", "tp=1,pp=2", "--out", c3)
    check_ckpt(c3, model, G, optimizer="fresh")
    _log.info("dcp: parameters-only checkpoint imported with fresh Adam state")


# ----------------------------------------------------------------------------- megatron

MEGATRON = (
    "--num-layers 4 --hidden-size 32 --num-attention-heads 4 --vocab-size 90 "
    "--make-vocab-size-divisible-by 8 --max-position-embeddings 16"
).split()


def test_megatron(interop: str) -> None:
    mpath, model = model_json("meg", *MEGATRON)
    G = draw_globals(model, seed=4, with_optimizer=False)
    src = os.path.join(TMP, "meg-src")
    write_megatron(src, model, G, 2, 2, 100, 3200)
    ck = os.path.join(TMP, "meg-ck")
    p = run("import", "--from", "megatron", src, "--model", mpath, "--config", "tp=1,pp=2,dp=2", "--out", ck)
    assert "optimizer state is not imported" in p.stderr, (
        f"megatron import does not say the optimizer is not imported: {p.stderr}"
    )
    info, n = check_ckpt(ck, model, G, optimizer="fresh")
    assert info["step"] == 100 and info["samples_consumed"] == 3200, info
    for T, P in ((4, 1), (1, 4), (2, 2)):
        out = os.path.join(TMP, f"meg-out-{T}-{P}")
        run("export", "--to", "megatron", ck, "--out", out, "--config", f"tp={T},pp={P}")
        m = check_megatron(out, model, G, T, P, 100, 3200)
        _log.info("megatron: TP=2 x PP=2 -> tp=1,pp=2,dp=2 -> TP=%d x PP=%d: %d elements equal", T, P, m)
    back = os.path.join(TMP, "meg-back")
    first = os.path.join(TMP, "meg-out-4-1")
    run("import", "--from", "megatron", first, "--model", mpath, "--config", "tp=1,pp=2,dp=2", "--out", back)
    for r in range(4):
        a = sf.load(os.path.join(ck, f"rank-{r:05d}.safetensors"))
        b = sf.load(os.path.join(back, f"rank-{r:05d}.safetensors"))
        for k in a:
            check_equal(f"re-import rank {r} {k}", b[k].numpy(), a[k].numpy())
    _log.info("megatron: import checked (%d elements), re-import of the TP=4 export equals the first import", n)
