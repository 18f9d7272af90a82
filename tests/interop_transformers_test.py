"""`tenplex export --to hf` / `tenplex import --from hf` judged by the real `transformers`.

Under pytest (issue 32 §4), ctest interop_transformers, TENPLEX_BIN the CLI under test:

    python -m pytest tests/interop_transformers_test.py::test_transformers

Offline (HF_HUB_OFFLINE=1, every model from a local folder), fp32, fixed tokens. "Ours"
is the project's own Megatron-style GPT (examples/gpt/model.py: its Stage at tp=1,
pp=1, weights loaded from a tenplex checkpoint resharded to tp=1 by `tenplex reshard`);
"theirs" is transformers' AutoModelForCausalLM / LlamaForCausalLM / GPT2LMHeadModel /
MistralForCausalLM. Every comparison is over all logits: max |ours - theirs| must be
below TOL times the largest |logit| (logits are made O(1) by drawing weights larger
than the usual init), and the arg-max tokens must agree.

  export   Llama-like (GQA 8 heads / 2 groups, SwiGLU, RMSNorm, rope, untied, vocabulary
           250 padded by the layout) and GPT-2-like (LayerNorm, GELU, biases, learned
           positions, tied) tenplex checkpoints with every parameter random (norm
           weights and biases too), resharded to tp=2,pp=2, exported with a small
           --max-shard-size (sharded files + index) and loaded by
           AutoModelForCausalLM.from_pretrained(dtype=float32).
  import   LlamaForCausalLM (GQA), GPT2LMHeadModel and MistralForCausalLM
           (sliding_window=None) created by transformers with random weights, saved
           with save_pretrained(max_shard_size=...) as sharded safetensors with an
           index, imported into tp=2,pp=2; the Mistral checkpoint is exported again
           (as LlamaForCausalLM) and transformers' logits of that equal Mistral's.
  refused  Qwen2 (q/k/v biases only) and a Mistral whose sliding window is shorter than
           its positions: exit 2, the message names why, nothing written.

examples/gpt (not a package) comes from the examples_gpt fixture (tests/conftest.py):
the `hf` fixture imports its model and optimizer modules after it. The offline
settings are made before transformers is imported (it reads them then).
"""

from __future__ import annotations

import dataclasses
import glob
import importlib
import json
import logging
import os
import subprocess
import time
from collections.abc import Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"

import pytest  # noqa: E402
import tenplex_cli  # noqa: E402  (tests/, this file's folder)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402

from tenplex import checkpoint  # noqa: E402
from tenplex import layout as L  # noqa: E402

_log = logging.getLogger(__name__)

TOL = 1e-5  # max |ours - theirs| / max |theirs|


@dataclasses.dataclass
class HF:
    """The CLI under test, the test's directory, examples/gpt's model and optimizer
    modules, the fixed token ids ([2, 24], below every vocabulary used here) and the
    comparisons made so far (what, max abs diff, max |logit|)."""

    tenplex: str
    tmp: str
    gpt: ModuleType
    optimizer: ModuleType
    ids: torch.Tensor
    results: list[tuple[str, float, float]] = dataclasses.field(default_factory=list)

    def run(self, *args: object, expect: int = 0) -> subprocess.CompletedProcess[str]:
        return tenplex_cli.run(self.tenplex, *args, expect=expect)

    def model_json(self, name: str, *flags: object) -> str:
        path = os.path.join(self.tmp, name + ".json")
        self.run("model", "gpt", *map(str, flags), "-o", path)
        return path


@pytest.fixture
def hf(examples_gpt: str, tenplex: str, tmp: str) -> Iterator[HF]:
    """The test's HF; torch on 2 threads for the test."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _log.info("transformers %s, torch %s", transformers.__version__, torch.__version__)
        ids = torch.randint(0, 250, (2, 24), generator=torch.Generator().manual_seed(0))
        gpt, optimizer = importlib.import_module("model"), importlib.import_module("optimizer")
        yield HF(os.path.abspath(tenplex), tmp, gpt, optimizer, ids)
    finally:
        torch.set_num_threads(threads)


def one_stage(c: HF, model: Any) -> tuple[Any, SimpleNamespace]:
    """examples/gpt's Stage for tp=1, pp=1 (no process group is needed at tp=1)."""
    cfg = L.Config.parse("tp=1")
    groups = SimpleNamespace(
        cfg=cfg, tp_rank=0, dp_rank=0, pp_rank=0, first_stage=True, last_stage=True, tp=None, tp_ranks=[0]
    )
    return c.gpt.Stage(model, cfg, groups, seed=0), groups


@torch.no_grad()
def ours_logits(c: HF, ckpt: str) -> torch.Tensor:
    """Logits of examples/gpt on a tenplex checkpoint (any layout: resharded to tp=1 first)."""
    info = checkpoint.read_info(ckpt)
    cfg = L.Config.parse(info["config"])
    if (cfg.tp, cfg.pp, cfg.dp) != (1, 1, 1):
        one = ckpt + "-tp1"
        c.run("reshard", "--in", ckpt, "--to", "tp=1", "--out", one)
        ckpt = one
    stage, _ = one_stage(c, L.Model(info["model"]))
    tensors = checkpoint.read_rank(ckpt, 0)
    for p in stage.params:
        stage.view(stage.flat, p).copy_(tensors[p.name].float())
    w = stage.make_weights()
    x = stage.embed(c.ids)
    for i in range(stage.num_local_layers):
        x = stage.layer(i, x)
    # Stage.loss's head, without the cross entropy: final norm, logits, padding dropped
    x = stage._norm(x, "decoder.final_layernorm.weight", "decoder.final_layernorm.bias")
    W = w.get("output_layer.weight", w["embedding.word_embeddings.weight"])
    return F.linear(x, W)[..., : stage.hp.vocab]


@torch.no_grad()
def theirs_logits(c: HF, hf_model: Any) -> torch.Tensor:
    hf_model.eval()
    return hf_model(input_ids=c.ids).logits.float()


def compare(c: HF, what: str, ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert ours.shape == theirs.shape, (
        f"{what}: logits shape {list(ours.shape)} (ours) vs {list(theirs.shape)} (transformers)"
    )
    scale = theirs.abs().max().item()
    diff = (ours - theirs).abs().max().item()
    assert not scale < 0.5, f"{what}: logit scale {scale:.3g} is too small for a meaningful comparison"
    assert diff <= TOL * scale, f"{what}: max |ours - transformers| = {diff:.3g}, scale {scale:.3g} (tolerance {TOL})"
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1)), f"{what}: arg-max tokens differ"
    c.results.append((what, diff, scale))
    _log.info(
        "ok  %s: %d logits, max abs diff %.2e, max |logit| %.2f, relative %.2e",
        what,
        ours.numel(),
        diff,
        scale,
        diff / scale,
    )


def check_sharded(hf_dir: str) -> int:
    files = glob.glob(os.path.join(hf_dir, "model-*-of-*.safetensors"))
    assert len(files) >= 2 and os.path.exists(os.path.join(hf_dir, "model.safetensors.index.json")), (
        f"{hf_dir}: expected sharded safetensors with an index, found {sorted(os.listdir(hf_dir))}"
    )
    return len(files)


# ----------------------------------------------------------------------------- export


def random_checkpoint(c: HF, mpath: str, out: str, seed: int) -> None:
    """A tp=1 tenplex checkpoint written through examples/gpt's Stage and Adam (spec
    names, padding zero), every parameter drawn at random (norm weights ~1, biases and
    matrices at scales that give O(1) logits)."""
    model = L.Model.load(mpath)
    stage, groups = one_stage(c, model)
    g = torch.Generator().manual_seed(seed)
    for p in stage.params:
        v = stage.view(stage.flat, p)
        r = torch.randn(v.shape, generator=g)
        if "norm" in p.path:
            v.copy_(1.0 + 0.2 * r) if p.path.endswith("weight") else v.copy_(0.1 * r)
        elif p.path.endswith("bias"):
            v.copy_(0.1 * r)
        elif "embeddings" in p.path:
            v.copy_(0.5 * r)
        else:
            v.copy_(r / v.shape[-1] ** 0.5)
    stage.flat.masked_fill_(stage.pad_mask, 0.0)
    opt = c.optimizer.Adam(stage, groups)
    tensors = [(p.name, stage.view(stage.flat, p).clone()) for p in stage.params] + opt.state_tensors()
    checkpoint.begin(out)
    checkpoint.write_rank(out, 0, tensors, {"config": "tp=1", "rank": "0"})
    checkpoint.commit(out, {"model": model.desc, "config": "tp=1", "step": 7, "samples_consumed": 56}, 1)


def part_export(c: HF, name: str, flags: list[object], seed: int) -> Any:
    mpath = c.model_json(name, *flags)
    ck1, ck = os.path.join(c.tmp, name + "-ck1"), os.path.join(c.tmp, name + "-ck")
    random_checkpoint(c, mpath, ck1, seed)
    c.run("reshard", "--in", ck1, "--to", "tp=2,pp=2", "--out", ck)
    out = os.path.join(c.tmp, name + "-hf")
    c.run("export", "--to", "hf", ck, "--out", out, "--max-shard-size", 40000)
    n = check_sharded(out)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, local_files_only=True)
    ours = ours_logits(c, ck)
    compare(c, f"export {name} tp=2,pp=2 -> {type(hf).__name__} ({n} shards)", ours, theirs_logits(c, hf))
    return hf


# ----------------------------------------------------------------------------- import


def randomize(hf_model: Any, seed: int) -> None:
    """Weights at scales that give O(1) logits (transformers' init gives ~0.02 ones)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in hf_model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * r if ("norm" in n or ".ln_" in n) and n.endswith("weight") else 0.1 * r)
            elif "embed" in n or ".wte." in n or ".wpe." in n:
                p.copy_(0.5 * r)
            else:  # GPT-2's Conv1D is [in, out]
                p.copy_(r / (p.shape[0] if ".h." in n else p.shape[-1]) ** 0.5)


def save_hf(c: HF, hf_model: Any, name: str) -> tuple[str, int, dict[str, Any]]:
    out = os.path.join(c.tmp, name)
    hf_model.save_pretrained(out, max_shard_size=40000)
    n = check_sharded(out)
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    return out, n, cfg


def part_import(c: HF, name: str, hf_model: Any, flags: list[object], seed: int) -> tuple[str, str, torch.Tensor]:
    randomize(hf_model, seed)
    src, n, _ = save_hf(c, hf_model, name + "-hf")
    mpath = c.model_json(name, *flags)
    ck = os.path.join(c.tmp, name + "-ck")
    p = c.run("import", "--from", "hf", src, "--model", mpath, "--config", "tp=2,pp=2", "--out", ck)
    assert "warning" not in p.stderr, f"import {name}: unexpected warning\n{p.stderr}"
    theirs = theirs_logits(c, hf_model)
    compare(c, f"import {type(hf_model).__name__} ({n} shards) -> tp=2,pp=2", ours_logits(c, ck), theirs)
    return ck, mpath, theirs


def refused(c: HF, name: str, hf_model: Any, flags: list[object], needle: str) -> None:
    src, _, _ = save_hf(c, hf_model, name + "-hf")
    mpath = c.model_json(name, *flags)
    ck = os.path.join(c.tmp, name + "-ck")
    p = c.run("import", "--from", "hf", src, "--model", mpath, "--config", "tp=2", "--out", ck, expect=2)
    assert needle in p.stderr and not os.path.exists(ck), (
        f"{name}: expected exit 2 naming {needle!r} and no output, got\n{p.stderr}"
    )
    _log.info("ok  %s: refused (exit 2): %s", name, p.stderr.strip().splitlines()[-1])


def gelu_new_warning(c: HF) -> None:
    """GPT-2's usual gelu_new (tanh approximation) imports with a warning; the logit
    comparison sees the approximation (so TOL is tight enough to tell the two GELUs apart)."""
    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=4, n_head=4, layer_norm_epsilon=1e-5)
    )
    randomize(hf, 24)
    src, _, _ = save_hf(c, hf, "gpt2-gelu-new-hf")
    ck = os.path.join(c.tmp, "gpt2-gn-ck")
    mpath = c.model_json("gpt2-gn", *GPT2_FLAGS, "--vocab-size", 256)
    p = c.run("import", "--from", "hf", src, "--model", mpath, "--config", "tp=2", "--out", ck)
    assert "warning" in p.stderr and "gelu_new" in p.stderr, (
        f"a gelu_new GPT-2 imported without the approximation warning:\n{p.stderr}"
    )
    theirs = theirs_logits(c, hf)
    rel = (ours_logits(c, ck) - theirs).abs().max().item() / theirs.abs().max().item()
    assert not rel <= TOL, f"exact GELU vs gelu_new differ by only {rel:.2e} of the logit scale: TOL {TOL} is too loose"
    _log.info(
        "ok  GPT-2 with gelu_new: imported with a warning; exact vs tanh GELU differ by %.2e of the "
        "logit scale (> tolerance %g, so the comparisons above can tell them apart)",
        rel,
        TOL,
    )


LLAMA_FLAGS: list[object] = [
    "--num-layers",
    4,
    "--hidden-size",
    64,
    "--ffn-hidden-size",
    96,
    "--num-attention-heads",
    8,
    "--num-query-groups",
    2,
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
    "fp32",
]
GPT2_FLAGS: list[object] = [
    "--num-layers",
    4,
    "--hidden-size",
    64,
    "--num-attention-heads",
    4,
    "--max-position-embeddings",
    64,
    "--params-dtype",
    "fp32",
]


def llama_config(**kw: Any) -> dict[str, Any]:
    return dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        **kw,
    )


def test_transformers(hf: HF) -> None:
    c = hf
    t0 = time.time()
    # export: tenplex -> transformers
    part_export(c, "llama", [*LLAMA_FLAGS, "--vocab-size", 250, "--make-vocab-size-divisible-by", 16], 11)
    part_export(c, "gpt2", [*GPT2_FLAGS, "--vocab-size", 250, "--make-vocab-size-divisible-by", 16], 12)
    # import: transformers -> tenplex
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(**llama_config()))
    part_import(c, "llama-in", llama, [*LLAMA_FLAGS, "--vocab-size", 256], 21)
    gcfg = transformers.GPT2Config(
        vocab_size=256,
        n_positions=64,
        n_embd=64,
        n_layer=4,
        n_head=4,
        activation_function="gelu",
        layer_norm_epsilon=1e-5,
    )
    part_import(c, "gpt2-in", transformers.GPT2LMHeadModel(gcfg), [*GPT2_FLAGS, "--vocab-size", 256], 22)
    mis = transformers.MistralForCausalLM(transformers.MistralConfig(**llama_config(sliding_window=None)))
    ck, _, mistral_logits = part_import(c, "mistral-in", mis, [*LLAMA_FLAGS, "--vocab-size", 256], 23)
    back = os.path.join(c.tmp, "mistral-back")
    c.run("export", "--to", "hf", ck, "--out", back)
    hf_back = transformers.AutoModelForCausalLM.from_pretrained(back, dtype=torch.float32, local_files_only=True)
    compare(
        c,
        f"Mistral import, export -> {type(hf_back).__name__} vs MistralForCausalLM",
        theirs_logits(c, hf_back),
        mistral_logits,
    )
    # what the model description cannot express
    qwen = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**llama_config()))
    refused(c, "qwen2", qwen, [*LLAMA_FLAGS, "--vocab-size", 256], "q/k/v biases")
    short = transformers.MistralForCausalLM(transformers.MistralConfig(**llama_config(sliding_window=16)))
    refused(c, "mistral-window16", short, [*LLAMA_FLAGS, "--vocab-size", 256], "sliding_window 16")
    gelu_new_warning(c)
    worst = max(d / s for _, d, s in c.results)
    _log.info(
        "PASS: %d logit comparisons against transformers, worst relative diff %.2e (tolerance %g), %.1f s",
        len(c.results),
        worst,
        TOL,
        time.time() - t0,
    )
