"""Bad input to `tenplex import` / `tenplex export` (split from interop_test.py, whose
fixtures it uses): unknown, missing and mis-shaped tensors, mismatched configs and
truncated files of every format (HF safetensors, torch DCP, Megatron-LM), a hostile
Megatron pickle (refused by the restricted unpickler, nothing runs), bad arguments.
Each must exit 2 with a message naming the problem and leave nothing at --out.

Under pytest (issue 32 §4), ctest interop_errors, TENPLEX_BIN the CLI under test:

    python -m pytest tests/interop_errors_test.py::test_interop_errors

interop_test.py's helpers (run, model_json, dcp_world, ...) read its module globals BIN
and TMP: the `interop` fixture sets them to the tenplex fixture's CLI and the test's own
directory (tests/conftest.py) and restores them afterwards.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from interop_test import dcp_world, draw_globals, hf_reference, layout_of, model_json, run, write_hf, write_megatron

_log = logging.getLogger(__name__)

# `tenplex model gpt` flags: the size of every model here; GPT2 adds the GPT-2 models' padding and positions
SIZE = ["--hidden-size", "48", "--num-attention-heads", "4", "--vocab-size", "100"]
GPT2 = [*SIZE, "--make-vocab-size-divisible-by", "8", "--max-position-embeddings", "32"]
HF_CONFIG: dict[str, Any] = dict(model_type="gpt2", n_embd=48, n_layer=2, n_head=4, n_positions=32, vocab_size=100)
Mutate = Callable[[dict[str, np.ndarray]], object]  # edits an HF variant's tensors in place


def expect_error(what: str, args: list[str], needle: str, out: str) -> None:
    """`tenplex args` exits 2, its stderr names `needle`, nothing starting with `out` is left."""
    p = run(*args, expect=2)
    assert needle in p.stderr, f"{what}: stderr lacks {needle!r}:\n{p.stderr}"
    leftovers = [x for x in os.listdir(os.path.dirname(out)) if x.startswith(os.path.basename(out))]
    assert not leftovers, f"{what}: left behind {leftovers}"
    _log.info("errors: %s: exit 2, '%s'", what, p.stderr.strip().splitlines()[-1][:110])


class Hostile:
    """Unpickling this runs `touch path` (what a hostile checkpoint would do)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Callable[[str], int], tuple[str]]:
        return (os.system, (f"touch {self.path}",))


def importing(fmt: str, src: str, mpath: str, config: str, out: str) -> list[str]:
    return ["import", "--from", fmt, src, "--model", mpath, "--config", config, "--out", out]


def hf_errors(tmp: str, mpath: str, model: dict[str, Any], G: dict[str, np.ndarray], out: str) -> None:
    """Unknown, missing, mis-shaped tensors, a config of another model, a truncated file."""
    ref = hf_reference(model, G)

    def variant(name: str, mutate: Mutate, config: dict[str, Any]) -> str:
        d = os.path.join(tmp, "err-" + name)
        r = dict(ref)
        mutate(r)
        write_hf(d, model, r, config, "F32")
        return d

    def hf(name: str, mutate: Mutate, config: dict[str, Any] = HF_CONFIG) -> list[str]:
        return importing("hf", variant(name, mutate, config), mpath, "tp=2", out)

    extra = {"transformer.h.0.attn.extra": np.zeros(3, np.float32)}
    expect_error(
        "unknown HF key", hf("unknown", lambda r: r.update(extra)), "unknown tensor 'transformer.h.0.attn.extra'", out
    )
    expect_error(
        "missing HF key",
        hf("missing", lambda r: r.pop("transformer.ln_f.bias")),
        "'transformer.ln_f.bias' is missing",
        out,
    )
    wpe = {"transformer.wpe.weight": np.zeros((31, 48), np.float32)}
    expect_error("HF shape mismatch", hf("shape", lambda r: r.update(wpe)), "transformer.wpe.weight", out)
    expect_error("HF config mismatch", hf("config", lambda r: None, dict(HF_CONFIG, n_layer=3)), "n_layer is 3", out)
    trunc = variant("trunc", lambda r: None, HF_CONFIG)
    fpath = os.path.join(trunc, "model.safetensors")
    with open(fpath, "r+b") as f:
        f.truncate(os.path.getsize(fpath) - 100)
    expect_error("truncated safetensors", importing("hf", trunc, mpath, "tp=2", out), "model.safetensors", out)


def dcp_errors(tmp: str, mpath: str, small_path: str, G: dict[str, np.ndarray], out: str) -> None:
    """A data file cut short, a key the model does not have."""
    gpath = os.path.join(tmp, "err-globals.npz")
    np.savez(gpath, **G)
    d = os.path.join(tmp, "err-dcp")
    dcp_world(2, "save", layout_of(mpath, "tp=2"), d, gpath)
    bad = os.path.join(tmp, "err-dcp-trunc")
    shutil.copytree(d, bad)
    data = os.path.join(bad, sorted(x for x in os.listdir(bad) if x.endswith(".distcp"))[0])
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) // 2)
    expect_error(
        "truncated DCP data file", importing("dcp", bad, mpath, "tp=1", out), "torch's DCP failed to read", out
    )
    expect_error(
        "DCP key not in the model",
        importing("dcp", d, small_path, "tp=1", out),
        "unknown tensor 'decoder.layers.1.",
        out,
    )


def megatron_errors(
    tmp: str, mpath: str, small_path: str, model: dict[str, Any], G: dict[str, np.ndarray], out: str
) -> str:
    """A missing rank file, a truncated file, an unknown key, a hostile pickle, a missing
    source, args that disagree; the intact checkpoint written last (its directory)."""

    def megatron(name: str) -> tuple[str, str]:
        m = os.path.join(tmp, name)
        write_megatron(m, model, G, 2, 1, 10, 80)
        return m, os.path.join(m, "iter_0000010", "mp_rank_01", "model_optim_rng.pt")

    m, _ = megatron("err-meg")
    shutil.rmtree(os.path.join(m, "iter_0000010", "mp_rank_01"))
    expect_error(
        "missing Megatron rank",
        importing("megatron", m, mpath, "tp=1", out),
        "mp_rank_01/model_optim_rng.pt is missing",
        out,
    )
    m2, f2 = megatron("err-meg2")
    with open(f2, "r+b") as f:
        f.truncate(os.path.getsize(f2) // 2)
    expect_error("truncated Megatron file", importing("megatron", m2, mpath, "tp=1", out), "torch.load failed", out)
    m4, f4 = megatron("err-meg4")
    sd = torch.load(f4, weights_only=False)  # the test's own file
    sd["model"]["decoder.layers.0.mlp.router.weight"] = torch.zeros(4, 48)
    torch.save(sd, f4)
    expect_error(
        "unknown Megatron key",
        importing("megatron", m4, mpath, "tp=1", out),
        "unknown tensor 'decoder.layers.0.mlp.router.weight'",
        out,
    )
    # A hostile pickle: refused by the restricted unpickler, naming the class; nothing runs.
    marker = os.path.join(tmp, "pickle-ran")
    sd["args"].evil = Hostile(marker)
    torch.save(sd, f4)
    expect_error(
        "hostile Megatron pickle", importing("megatron", m4, mpath, "tp=1", out), "TENPLEX_TRUST_PICKLES=1", out
    )
    assert not os.path.exists(marker), "the hostile pickle ran code"
    missing = os.path.join(tmp, "meg-src-err")
    expect_error("missing source directory", importing("megatron", missing, mpath, "tp=1", out), "does not exist", out)
    m3, _ = megatron("err-meg3")
    expect_error(
        "Megatron model of another size",
        importing("megatron", m3, small_path, "tp=1", out),
        "args.num_layers is 2",
        out,
    )
    return m3


def argument_errors(tmp: str, mpath: str, m3: str, out: str) -> None:
    """An unknown format, an impossible config, a non-empty --out, DCP export to another
    layout, HF export of a model without an HF mapping."""
    expect_error("unknown format", importing("onnx", m3, mpath, "tp=1", out), "unknown format 'onnx'", out)
    expect_error("impossible config", importing("megatron", m3, mpath, "tp=3", out), "tp=3", out)
    ck = os.path.join(tmp, "err-ck")
    run(*importing("megatron", m3, mpath, "tp=1", ck))
    expect_error(
        "export onto a non-empty directory", ["export", "--to", "hf", ck, "--out", m3], "not an empty", m3 + "x"
    )
    expect_error(
        "dcp export to another layout",
        ["export", "--to", "dcp", ck, "--out", out, "--config", "tp=2"],
        "reshard it to tp=2",
        out,
    )
    llama_path, _ = model_json("err-llama-ish", "--num-layers", "1", *SIZE, "--swiglu")
    ck2 = os.path.join(tmp, "err-ck2")
    run("ckpt", "init", "--model", llama_path, "--config", "tp=1", "--out", ck2)
    expect_error(
        "no HF mapping for the model", ["export", "--to", "hf", ck2, "--out", out], "no Hugging Face mapping", out
    )


def test_interop_errors(interop: str) -> None:
    tmp = interop
    mpath, model = model_json("err", "--num-layers", "2", *GPT2)
    small_path, _ = model_json("err-small", "--num-layers", "1", *GPT2)
    G = draw_globals(model, seed=5, with_optimizer=False)
    out = os.path.join(tmp, "err-out")
    hf_errors(tmp, mpath, model, G, out)
    dcp_errors(tmp, mpath, small_path, G, out)
    m3 = megatron_errors(tmp, mpath, small_path, model, G, out)
    argument_errors(tmp, mpath, m3, out)
    _log.info("interop errors: OK")
