#!/usr/bin/env python3
"""`tenplex export --to hf` / `tenplex import --from hf` judged by the real `transformers`.

  interop_transformers_test.py TENPLEX_BIN

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
"""

import glob
import json
import os
import sys
import tempfile
import time
from types import SimpleNamespace

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "examples", "gpt"))

import model as gpt  # noqa: E402  (examples/gpt/model.py)
import optimizer  # noqa: E402  (examples/gpt/optimizer.py)
import tenplex_cli  # noqa: E402  (tests/, this script's folder)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402

from tenplex import checkpoint  # noqa: E402
from tenplex import layout as L  # noqa: E402

TOL = 1e-5  # max |ours - theirs| / max |theirs|
BIN = None
TMP = None
IDS = None  # [2, 24] fixed token ids below every vocabulary used here
RESULTS = []


def run(*args, expect=0):
    return tenplex_cli.run(BIN, *args, expect=expect)


def model_json(name, *flags):
    path = os.path.join(TMP, name + ".json")
    run("model", "gpt", *map(str, flags), "-o", path)
    return path


def one_stage(model):
    """examples/gpt's Stage for tp=1, pp=1 (no process group is needed at tp=1)."""
    cfg = L.Config.parse("tp=1")
    groups = SimpleNamespace(
        cfg=cfg, tp_rank=0, dp_rank=0, pp_rank=0, first_stage=True, last_stage=True, tp=None, tp_ranks=[0]
    )
    return gpt.Stage(model, cfg, groups, seed=0), groups


@torch.no_grad()
def ours_logits(ckpt, ids):
    """Logits of examples/gpt on a tenplex checkpoint (any layout: resharded to tp=1 first)."""
    info = checkpoint.read_info(ckpt)
    cfg = L.Config.parse(info["config"])
    if (cfg.tp, cfg.pp, cfg.dp) != (1, 1, 1):
        one = ckpt + "-tp1"
        run("reshard", "--in", ckpt, "--to", "tp=1", "--out", one)
        ckpt = one
    stage, _ = one_stage(L.Model(info["model"]))
    tensors = checkpoint.read_rank(ckpt, 0)
    for p in stage.params:
        stage.view(stage.flat, p).copy_(tensors[p.name].float())
    w = stage.make_weights()
    x = stage.embed(ids)
    for i in range(stage.num_local_layers):
        x = stage.layer(i, x)
    # Stage.loss's head, without the cross entropy: final norm, logits, padding dropped
    x = stage._norm(x, "decoder.final_layernorm.weight", "decoder.final_layernorm.bias")
    W = w.get("output_layer.weight", w["embedding.word_embeddings.weight"])
    return F.linear(x, W)[..., : stage.hp.vocab]


@torch.no_grad()
def theirs_logits(hf_model, ids):
    hf_model.eval()
    return hf_model(input_ids=ids).logits.float()


def compare(what, ours, theirs):
    if ours.shape != theirs.shape:
        sys.exit(f"FAIL: {what}: logits shape {list(ours.shape)} (ours) vs {list(theirs.shape)} (transformers)")
    scale = theirs.abs().max().item()
    diff = (ours - theirs).abs().max().item()
    if scale < 0.5:
        sys.exit(f"FAIL: {what}: logit scale {scale:.3g} is too small for a meaningful comparison")
    if not diff <= TOL * scale:
        sys.exit(f"FAIL: {what}: max |ours - transformers| = {diff:.3g}, scale {scale:.3g} (tolerance {TOL})")
    if not torch.equal(ours.argmax(-1), theirs.argmax(-1)):
        sys.exit(f"FAIL: {what}: arg-max tokens differ")
    RESULTS.append((what, diff, scale))
    print(
        f"ok  {what}: {ours.numel()} logits, max abs diff {diff:.2e}, max |logit| {scale:.2f}, "
        f"relative {diff / scale:.2e}"
    )


def check_sharded(hf_dir):
    files = glob.glob(os.path.join(hf_dir, "model-*-of-*.safetensors"))
    if len(files) < 2 or not os.path.exists(os.path.join(hf_dir, "model.safetensors.index.json")):
        sys.exit(f"FAIL: {hf_dir}: expected sharded safetensors with an index, found {sorted(os.listdir(hf_dir))}")
    return len(files)


# ----------------------------------------------------------------------------- export


def random_checkpoint(mpath, out, seed):
    """A tp=1 tenplex checkpoint written through examples/gpt's Stage and Adam (spec
    names, padding zero), every parameter drawn at random (norm weights ~1, biases and
    matrices at scales that give O(1) logits)."""
    model = L.Model.load(mpath)
    stage, groups = one_stage(model)
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
    opt = optimizer.Adam(stage, groups)
    tensors = [(p.name, stage.view(stage.flat, p).clone()) for p in stage.params] + opt.state_tensors()
    checkpoint.begin(out)
    checkpoint.write_rank(out, 0, tensors, {"config": "tp=1", "rank": "0"})
    checkpoint.commit(out, {"model": model.desc, "config": "tp=1", "step": 7, "samples_consumed": 56}, 1)


def part_export(name, flags, seed):
    mpath = model_json(name, *flags)
    ck1, ck = os.path.join(TMP, name + "-ck1"), os.path.join(TMP, name + "-ck")
    random_checkpoint(mpath, ck1, seed)
    run("reshard", "--in", ck1, "--to", "tp=2,pp=2", "--out", ck)
    out = os.path.join(TMP, name + "-hf")
    run("export", "--to", "hf", ck, "--out", out, "--max-shard-size", 40000)
    n = check_sharded(out)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, local_files_only=True)
    ours = ours_logits(ck, IDS)
    compare(f"export {name} tp=2,pp=2 -> {type(hf).__name__} ({n} shards)", ours, theirs_logits(hf, IDS))
    return hf


# ----------------------------------------------------------------------------- import


def randomize(hf_model, seed):
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


def save_hf(hf_model, name):
    out = os.path.join(TMP, name)
    hf_model.save_pretrained(out, max_shard_size=40000)
    n = check_sharded(out)
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    return out, n, cfg


def part_import(name, hf_model, flags, seed):
    randomize(hf_model, seed)
    src, n, _ = save_hf(hf_model, name + "-hf")
    mpath = model_json(name, *flags)
    ck = os.path.join(TMP, name + "-ck")
    p = run("import", "--from", "hf", src, "--model", mpath, "--config", "tp=2,pp=2", "--out", ck)
    if "warning" in p.stderr:
        sys.exit(f"FAIL: import {name}: unexpected warning\n{p.stderr}")
    theirs = theirs_logits(hf_model, IDS)
    compare(f"import {type(hf_model).__name__} ({n} shards) -> tp=2,pp=2", ours_logits(ck, IDS), theirs)
    return ck, mpath, theirs


def refused(name, hf_model, flags, needle):
    src, _, _ = save_hf(hf_model, name + "-hf")
    mpath = model_json(name, *flags)
    ck = os.path.join(TMP, name + "-ck")
    p = run("import", "--from", "hf", src, "--model", mpath, "--config", "tp=2", "--out", ck, expect=2)
    if needle not in p.stderr or os.path.exists(ck):
        sys.exit(f"FAIL: {name}: expected exit 2 naming {needle!r} and no output, got\n{p.stderr}")
    print(f"ok  {name}: refused (exit 2): {p.stderr.strip().splitlines()[-1]}")


def gelu_new_warning():
    """GPT-2's usual gelu_new (tanh approximation) imports with a warning; the logit
    comparison sees the approximation (so TOL is tight enough to tell the two GELUs apart)."""
    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=4, n_head=4, layer_norm_epsilon=1e-5)
    )
    randomize(hf, 24)
    src, _, _ = save_hf(hf, "gpt2-gelu-new-hf")
    ck = os.path.join(TMP, "gpt2-gn-ck")
    p = run(
        "import",
        "--from",
        "hf",
        src,
        "--model",
        model_json("gpt2-gn", *GPT2_FLAGS, "--vocab-size", 256),
        "--config",
        "tp=2",
        "--out",
        ck,
    )
    if "warning" not in p.stderr or "gelu_new" not in p.stderr:
        sys.exit(f"FAIL: a gelu_new GPT-2 imported without the approximation warning:\n{p.stderr}")
    theirs = theirs_logits(hf, IDS)
    rel = (ours_logits(ck, IDS) - theirs).abs().max().item() / theirs.abs().max().item()
    if rel <= TOL:
        sys.exit(f"FAIL: exact GELU vs gelu_new differ by only {rel:.2e} of the logit scale: TOL {TOL} is too loose")
    print(
        f"ok  GPT-2 with gelu_new: imported with a warning; exact vs tanh GELU differ by {rel:.2e} of the "
        f"logit scale (> tolerance {TOL}, so the comparisons above can tell them apart)"
    )


LLAMA_FLAGS = [
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
GPT2_FLAGS = [
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


def llama_config(**kw):
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


def main():
    global BIN, TMP, IDS
    BIN = os.path.abspath(sys.argv[1])
    torch.set_num_threads(2)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    IDS = torch.randint(0, 250, (2, 24), generator=torch.Generator().manual_seed(0))
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="tenplex-hf-") as tmp:
        TMP = tmp
        # export: tenplex -> transformers
        part_export("llama", LLAMA_FLAGS + ["--vocab-size", 250, "--make-vocab-size-divisible-by", 16], 11)
        part_export("gpt2", GPT2_FLAGS + ["--vocab-size", 250, "--make-vocab-size-divisible-by", 16], 12)
        # import: transformers -> tenplex
        torch.manual_seed(0)
        part_import(
            "llama-in",
            transformers.LlamaForCausalLM(transformers.LlamaConfig(**llama_config())),
            LLAMA_FLAGS + ["--vocab-size", 256],
            21,
        )
        gcfg = transformers.GPT2Config(
            vocab_size=256,
            n_positions=64,
            n_embd=64,
            n_layer=4,
            n_head=4,
            activation_function="gelu",
            layer_norm_epsilon=1e-5,
        )
        part_import("gpt2-in", transformers.GPT2LMHeadModel(gcfg), GPT2_FLAGS + ["--vocab-size", 256], 22)
        mis = transformers.MistralForCausalLM(transformers.MistralConfig(**llama_config(sliding_window=None)))
        ck, _, mistral_logits = part_import("mistral-in", mis, LLAMA_FLAGS + ["--vocab-size", 256], 23)
        back = os.path.join(TMP, "mistral-back")
        run("export", "--to", "hf", ck, "--out", back)
        hf = transformers.AutoModelForCausalLM.from_pretrained(back, dtype=torch.float32, local_files_only=True)
        compare(
            f"Mistral import, export -> {type(hf).__name__} vs MistralForCausalLM",
            theirs_logits(hf, IDS),
            mistral_logits,
        )
        # what the model description cannot express
        qwen = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**llama_config()))
        refused("qwen2", qwen, LLAMA_FLAGS + ["--vocab-size", 256], "q/k/v biases")
        short = transformers.MistralForCausalLM(transformers.MistralConfig(**llama_config(sliding_window=16)))
        refused("mistral-window16", short, LLAMA_FLAGS + ["--vocab-size", 256], "sliding_window 16")
        gelu_new_warning()
    worst = max(d / s for _, d, s in RESULTS)
    print(
        f"PASS: {len(RESULTS)} logit comparisons against transformers, worst relative diff {worst:.2e} "
        f"(tolerance {TOL}), {time.time() - t0:.1f} s"
    )


if __name__ == "__main__":
    main()
