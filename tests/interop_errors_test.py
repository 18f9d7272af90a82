#!/usr/bin/env python3
"""Bad input to `tenplex import` / `tenplex export` (split from interop_test.py, whose
fixtures it uses): unknown, missing and mis-shaped tensors, mismatched configs and
truncated files of every format (HF safetensors, torch DCP, Megatron-LM), a hostile
Megatron pickle (refused by the restricted unpickler, nothing runs), bad arguments.
Each must exit 2 with a message naming the problem and leave nothing at --out.

  interop_errors_test.py TENPLEX_BIN
"""

import os
import shutil
import sys
import tempfile

import interop_test as IT
import numpy as np
import torch
from interop_test import dcp_world, draw_globals, hf_reference, layout_of, model_json, run, write_hf, write_megatron

TMP = None


def expect_error(what, args, needle, out):
    p = run(*args, expect=2)
    if needle not in p.stderr:
        sys.exit(f"FAIL: {what}: stderr lacks {needle!r}:\n{p.stderr}")
    leftovers = [x for x in os.listdir(os.path.dirname(out)) if x.startswith(os.path.basename(out))]
    if leftovers:
        sys.exit(f"FAIL: {what}: left behind {leftovers}")
    print(f"errors: {what}: exit 2, '{p.stderr.strip().splitlines()[-1][:110]}'")


class Hostile:
    """Unpickling this runs `touch path` (what a hostile checkpoint would do)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def part_errors():
    mpath, model = model_json(
        "err",
        "--num-layers",
        "2",
        "--hidden-size",
        "48",
        "--num-attention-heads",
        "4",
        "--vocab-size",
        "100",
        "--make-vocab-size-divisible-by",
        "8",
        "--max-position-embeddings",
        "32",
    )
    G = draw_globals(model, seed=5, with_optimizer=False)
    ref = hf_reference(model, G)
    cfg = {"model_type": "gpt2", "n_embd": 48, "n_layer": 2, "n_head": 4, "n_positions": 32, "vocab_size": 100}
    out = os.path.join(TMP, "err-out")

    def hf_variant(name, mutate, config=cfg):
        d = os.path.join(TMP, "err-" + name)
        r = dict(ref)
        mutate(r)
        write_hf(d, model, r, config, "F32")
        return d

    imp = ["import", "--from", "hf", None, "--model", mpath, "--config", "tp=2", "--out", out]

    def with_src(d):
        a = list(imp)
        a[3] = d
        return a

    expect_error(
        "unknown HF key",
        with_src(hf_variant("unknown", lambda r: r.update({"transformer.h.0.attn.extra": np.zeros(3, np.float32)}))),
        "unknown tensor 'transformer.h.0.attn.extra'",
        out,
    )
    expect_error(
        "missing HF key",
        with_src(hf_variant("missing", lambda r: r.pop("transformer.ln_f.bias"))),
        "'transformer.ln_f.bias' is missing",
        out,
    )
    expect_error(
        "HF shape mismatch",
        with_src(hf_variant("shape", lambda r: r.update({"transformer.wpe.weight": np.zeros((31, 48), np.float32)}))),
        "transformer.wpe.weight",
        out,
    )
    expect_error(
        "HF config mismatch", with_src(hf_variant("config", lambda r: None, dict(cfg, n_layer=3))), "n_layer is 3", out
    )
    trunc = hf_variant("trunc", lambda r: None)
    fpath = os.path.join(trunc, "model.safetensors")
    with open(fpath, "r+b") as f:
        f.truncate(os.path.getsize(fpath) - 100)
    expect_error("truncated safetensors", with_src(trunc), "model.safetensors", out)
    # DCP: a data file cut short, a key the model does not have
    gpath = os.path.join(TMP, "err-globals.npz")
    np.savez(gpath, **G)
    d = os.path.join(TMP, "err-dcp")
    dcp_world(2, "save", layout_of(mpath, "tp=2"), d, gpath)
    bad = os.path.join(TMP, "err-dcp-trunc")
    shutil.copytree(d, bad)
    data = sorted(x for x in os.listdir(bad) if x.endswith(".distcp"))[0]
    with open(os.path.join(bad, data), "r+b") as f:
        f.truncate(os.path.getsize(os.path.join(bad, data)) // 2)
    expect_error(
        "truncated DCP data file",
        ["import", "--from", "dcp", bad, "--model", mpath, "--config", "tp=1", "--out", out],
        "torch's DCP failed to read",
        out,
    )
    small_path, _ = model_json(
        "err-small",
        "--num-layers",
        "1",
        "--hidden-size",
        "48",
        "--num-attention-heads",
        "4",
        "--vocab-size",
        "100",
        "--make-vocab-size-divisible-by",
        "8",
        "--max-position-embeddings",
        "32",
    )
    expect_error(
        "DCP key not in the model",
        ["import", "--from", "dcp", d, "--model", small_path, "--config", "tp=1", "--out", out],
        "unknown tensor 'decoder.layers.1.",
        out,
    )
    # Megatron: a missing rank file, a truncated file, args that disagree
    m = os.path.join(TMP, "err-meg")
    write_megatron(m, model, G, 2, 1, 10, 80)
    shutil.rmtree(os.path.join(m, "iter_0000010", "mp_rank_01"))
    expect_error(
        "missing Megatron rank",
        ["import", "--from", "megatron", m, "--model", mpath, "--config", "tp=1", "--out", out],
        "mp_rank_01/model_optim_rng.pt is missing",
        out,
    )
    m2 = os.path.join(TMP, "err-meg2")
    write_megatron(m2, model, G, 2, 1, 10, 80)
    f2 = os.path.join(m2, "iter_0000010", "mp_rank_01", "model_optim_rng.pt")
    with open(f2, "r+b") as f:
        f.truncate(os.path.getsize(f2) // 2)
    expect_error(
        "truncated Megatron file",
        ["import", "--from", "megatron", m2, "--model", mpath, "--config", "tp=1", "--out", out],
        "torch.load failed",
        out,
    )
    m4 = os.path.join(TMP, "err-meg4")
    write_megatron(m4, model, G, 2, 1, 10, 80)
    f4 = os.path.join(m4, "iter_0000010", "mp_rank_01", "model_optim_rng.pt")
    sd = torch.load(f4, weights_only=False)  # the test's own file
    sd["model"]["decoder.layers.0.mlp.router.weight"] = torch.zeros(4, 48)
    torch.save(sd, f4)
    expect_error(
        "unknown Megatron key",
        ["import", "--from", "megatron", m4, "--model", mpath, "--config", "tp=1", "--out", out],
        "unknown tensor 'decoder.layers.0.mlp.router.weight'",
        out,
    )
    # A hostile pickle: refused by the restricted unpickler, naming the class; nothing runs.
    marker = os.path.join(TMP, "pickle-ran")
    sd["args"].evil = Hostile(marker)
    torch.save(sd, f4)
    expect_error(
        "hostile Megatron pickle",
        ["import", "--from", "megatron", m4, "--model", mpath, "--config", "tp=1", "--out", out],
        "TENPLEX_TRUST_PICKLES=1",
        out,
    )
    if os.path.exists(marker):
        sys.exit("FAIL: the hostile pickle ran code")
    expect_error(
        "missing source directory",
        [
            "import",
            "--from",
            "megatron",
            os.path.join(TMP, "meg-src-err"),
            "--model",
            mpath,
            "--config",
            "tp=1",
            "--out",
            out,
        ],
        "does not exist",
        out,
    )
    m3 = os.path.join(TMP, "err-meg3")
    write_megatron(m3, model, G, 2, 1, 10, 80)
    expect_error(
        "Megatron model of another size",
        ["import", "--from", "megatron", m3, "--model", small_path, "--config", "tp=1", "--out", out],
        "args.num_layers is 2",
        out,
    )
    # arguments
    expect_error(
        "unknown format",
        ["import", "--from", "onnx", m3, "--model", mpath, "--config", "tp=1", "--out", out],
        "unknown format 'onnx'",
        out,
    )
    expect_error(
        "impossible config",
        ["import", "--from", "megatron", m3, "--model", mpath, "--config", "tp=3", "--out", out],
        "tp=3",
        out,
    )
    ck = os.path.join(TMP, "err-ck")
    run("import", "--from", "megatron", m3, "--model", mpath, "--config", "tp=1", "--out", ck)
    expect_error(
        "export onto a non-empty directory", ["export", "--to", "hf", ck, "--out", m3], "not an empty", m3 + "x"
    )
    expect_error(
        "dcp export to another layout",
        ["export", "--to", "dcp", ck, "--out", out, "--config", "tp=2"],
        "reshard it to tp=2",
        out,
    )
    llama_path, _ = model_json(
        "err-llama-ish",
        "--num-layers",
        "1",
        "--hidden-size",
        "48",
        "--num-attention-heads",
        "4",
        "--vocab-size",
        "100",
        "--swiglu",
    )
    ck2 = os.path.join(TMP, "err-ck2")
    run("ckpt", "init", "--model", llama_path, "--config", "tp=1", "--out", ck2)
    expect_error(
        "no HF mapping for the model", ["export", "--to", "hf", ck2, "--out", out], "no Hugging Face mapping", out
    )


def main():
    global TMP
    IT.BIN = os.path.abspath(sys.argv[1])
    TMP = IT.TMP = tempfile.mkdtemp(prefix="tenplex-interop-errors-")
    try:
        part_errors()
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    print("interop errors: OK")


if __name__ == "__main__":
    main()
