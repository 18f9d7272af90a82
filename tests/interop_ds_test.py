"""`tenplex import --from ds-universal` against DeepSpeed itself (docs/interop.md).

Under pytest (issue 32 §4), ctest interop_ds, TENPLEX_BIN the CLI under test:

    python -m pytest tests/interop_ds_test.py::test_ds

For each case DeepSpeed (CPU accelerator, gloo, 2 data-parallel processes) trains a
tiny model whose parameter names are the tenplex global names of a `tenplex model gpt`
description for 3 steps with ZeRO and torch's Adam, then:

  1. every rank asks DeepSpeed's own API for the whole tensors it holds:
     the module parameter (training dtype), safe_get_full_fp32_param and
     safe_get_full_optimizer_state(exp_avg / exp_avg_sq) (gathers over the ZeRO
     partitions); rank 0 saves them as the reference;
  2. DeepSpeed saves its checkpoint (engine.save_checkpoint) and DeepSpeed's converter
     `python -m deepspeed.checkpoint.ds_to_universal` writes the universal folder;
  3. `tenplex import --from ds-universal` writes tenplex checkpoints in two other
     configurations; every rank file is compared, element by element (bit for bit),
     with the reference sliced by the independent pure-Python layout
     (tests/reference/layout_ref.py via interop_test.check_ckpt); step and samples too.

Cases: bf16 parameters with ZeRO-2 (fp32 master copies carried) and fp32 parameters with
ZeRO-1. Errors: export --to ds-universal, an unknown parameter folder, a missing moment
file and a folder that is no universal checkpoint exit 2 with nothing at --out.

The DeepSpeed processes run this file as a script (its only command line, also used by
bench/ds_peer_bench.py):

    interop_ds_test.py --train RANK MODEL_JSON STAGE bf16|fp32 ROOT PORT [STEPS ref|noref]
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from typing import Any

import interop_test as IT
import numpy as np

_log = logging.getLogger(__name__)

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS, WORLD = 3, 2
GPT = (
    "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --num-query-groups 2 --vocab-size 100 "
    "--make-vocab-size-divisible-by 8 --max-position-embeddings 16 --swiglu"
).split()


# ----------------------------------------------------------------------------- DeepSpeed side


def build_module(model: dict[str, Any]) -> Any:
    """A torch module whose named_parameters() are the model's global tensors."""
    import torch

    root = torch.nn.Module()
    for t in model["tensors"]:
        *path, leaf = t["path"].split(".")
        m = root
        for part in path:
            if not hasattr(m, part):
                m.add_module(part, torch.nn.Module())
            m = getattr(m, part)
        m.register_parameter(leaf, torch.nn.Parameter(torch.randn(t["shape"]) * 0.02))
    return root


def train(
    rank: int, model_path: str, stage: int, dtype: str, root: str, port: int, steps: int = STEPS, reference: bool = True
) -> None:
    """One DeepSpeed data-parallel process (run as a subprocess of this script; also by
    bench/ds_peer_bench.py, with reference=False)."""
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(WORLD),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    import deepspeed
    import torch
    from deepspeed.checkpoint.constants import (
        UNIVERSAL_CHECKPOINT_INFO,
        UNIVERSAL_CHECKPOINT_VERSION_KEY,
        UNIVERSAL_CHECKPOINT_VERSION_VALUE,
    )
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    with open(model_path) as f:
        model = json.load(f)
    torch.manual_seed(0)
    net = build_module(model)
    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
        "bf16": {"enabled": dtype == "bf16"},
        "steps_per_print": 1000,
    }
    deepspeed.init_distributed(dist_backend="gloo")
    eng, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=cfg)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        loss = sum(
            torch.tanh(p.float() * torch.randn(p.shape, generator=gen) * 10).sum() / p.numel()
            for p in eng.module.parameters()
        )
        eng.backward(loss)
        eng.step()
    ref = {}
    for name, p in eng.module.named_parameters() if reference else []:  # collectives: every rank calls
        ref[name] = p.detach().clone()
        ref["optimizer.fp32_param." + name] = safe_get_full_fp32_param(p).clone()
        for k in ("exp_avg", "exp_avg_sq"):
            ref[f"optimizer.{k}.{name}"] = safe_get_full_optimizer_state(p, k).clone()
    eng.save_checkpoint(
        root,
        tag=f"global_step{steps}",
        client_state={
            "iteration": steps,
            UNIVERSAL_CHECKPOINT_INFO: {UNIVERSAL_CHECKPOINT_VERSION_KEY: UNIVERSAL_CHECKPOINT_VERSION_VALUE},
        },
    )
    if rank == 0 and reference:
        torch.save(
            {"tensors": ref, "global_samples": eng.global_samples, "global_steps": eng.global_steps},
            os.path.join(root, "reference.pt"),
        )
    torch.distributed.barrier()


# ----------------------------------------------------------------------------- test side


def ds_env() -> dict[str, str]:
    return dict(os.environ, DS_ACCELERATOR="cpu", PYTHONPATH=os.path.join(HERE, "..", "python"))


def run_training(model_path: str, stage: int, dtype: str, root: str, port: int) -> None:
    args = [model_path, str(stage), dtype, root, str(port)]
    procs = [
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--train", str(r), *args],
            env=ds_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(WORLD)
    ]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"DeepSpeed rank {r} exited {p.returncode}:\n{out[-4000:]}"


def convert(root: str) -> str:
    src = os.path.join(root, f"global_step{STEPS}")
    dst = src + "_universal"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "deepspeed.checkpoint.ds_to_universal",
            "--input_folder",
            src,
            "--output_folder",
            dst,
            "--num_extract_workers",
            "1",
            "--num_merge_workers",
            "1",
        ],
        env=ds_env(),
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, f"ds_to_universal exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return dst


def reference_globals(root: str, model: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """{global name: raw numpy} from DeepSpeed's own objects (step 1 of the docstring)."""
    import torch

    ref = torch.load(os.path.join(root, "reference.pt"), weights_only=False)
    kinds = model["optimizer"]["states"]
    G = {}
    for t in model["tensors"]:
        G[t["path"]] = IT.to_np(ref["tensors"][t["path"]])
        if t["dtype"] != "F32":
            G["optimizer.fp32_param." + t["path"]] = IT.to_np(ref["tensors"]["optimizer.fp32_param." + t["path"]])
        else:
            assert torch.equal(ref["tensors"][t["path"]], ref["tensors"]["optimizer.fp32_param." + t["path"]]), (
                f"DeepSpeed's fp32 parameter {t['path']} differs from its fp32 master copy"
            )
        for k in kinds:
            G[f"optimizer.{k}.{t['path']}"] = IT.to_np(ref["tensors"][f"optimizer.{k}.{t['path']}"])
    return G, ref


def case(name: str, flags: list[str], stage: int, dtype: str, configs: list[str], port: int) -> tuple[str, str]:
    mpath, model = IT.model_json(name, *flags)
    assert model["optimizer"]["states"] == ["exp_avg", "exp_avg_sq"], (
        f"expected Adam states in the model description, got {model['optimizer']['states']}"
    )
    root = os.path.join(IT.TMP, name + "-ds")
    run_training(mpath, stage, dtype, root, port)
    uni = convert(root)
    G, ref = reference_globals(root, model)
    nonzero = sum(int((v != 0).any()) for k, v in G.items() if k.startswith("optimizer.exp_avg_sq."))
    assert nonzero == len(model["tensors"]), (
        f"{name}: only {nonzero} of {len(model['tensors'])} second moments are non-zero"
    )
    for i, cfg in enumerate(configs):
        ck = os.path.join(IT.TMP, f"{name}-ck{i}")
        src = root if i == 0 else uni  # the root (via latest_universal) and the folder itself
        IT.run("import", "--from", "ds-universal", src, "--model", mpath, "--config", cfg, "--out", ck)
        info, n = IT.check_ckpt(ck, model, G, optimizer="given")
        assert info.get("step") == STEPS and info.get("samples_consumed") == ref["global_samples"], (
            f"{ck}: step {info.get('step')} samples {info.get('samples_consumed')}, expected "
            f"{STEPS} and {ref['global_samples']}"
        )
        _log.info(
            "ok: %s (ZeRO-%d, %s, %d DeepSpeed ranks) -> %s: %d elements equal DeepSpeed's params, fp32 masters "
            "and Adam moments; step %d, samples %s",
            name,
            stage,
            dtype,
            WORLD,
            cfg,
            n,
            STEPS,
            ref["global_samples"],
        )
    return mpath, uni


def expect_error(what: str, args: list[str], needle: str) -> None:
    out = args[args.index("--out") + 1]
    p = IT.run(*args, expect=2)
    assert needle in p.stderr and not os.path.exists(out) and not os.path.exists(out + ".partial"), (
        f"{what}: stderr {p.stderr!r} (expected '{needle}'), output left: {os.path.exists(out)}"
    )
    _log.info("ok: %s: exit 2, '%s'", what, needle)


def errors(mpath: str, uni: str) -> None:
    ck = os.path.join(IT.TMP, "err-out")

    def importing(src: str) -> list[str]:
        return ["import", "--from", "ds-universal", src, "--model", mpath, "--config", "tp=1", "--out", ck]

    bf16_ck = os.path.join(IT.TMP, "bf16-ck0")
    expect_error("export --to ds-universal", ["export", "--to", "ds-universal", bf16_ck, "--out", ck], "not supported")
    bad = os.path.join(IT.TMP, "bad-uni")
    shutil.copytree(uni, bad)
    os.rename(
        os.path.join(bad, "zero", "decoder.final_layernorm.weight"),
        os.path.join(bad, "zero", "decoder.final_norm.weight"),
    )
    expect_error("unknown parameter", importing(bad), "unknown parameter")
    shutil.rmtree(bad)
    shutil.copytree(uni, bad)
    os.remove(os.path.join(bad, "zero", "embedding.word_embeddings.weight", "exp_avg_sq.pt"))
    expect_error("missing moment", importing(bad), "exp_avg_sq.pt is missing")
    plain = os.path.join(os.path.dirname(uni), f"global_step{STEPS}")
    expect_error("not a universal checkpoint", importing(plain), "not a DeepSpeed universal checkpoint")


def test_ds(interop: str) -> None:
    port = 29500 + os.getpid() % 1000
    mpath, uni = case("bf16", [*GPT, "--params-dtype", "bf16"], 2, "bf16", ["tp=2,pp=2", "tp=1,dp=2"], port)
    case("fp32", GPT, 1, "fp32", ["tp=2,dp=2"], port + 1)
    errors(mpath, uni)


if __name__ == "__main__":  # a DeepSpeed process (run_training, bench/ds_peer_bench.py); the test: pytest
    if sys.argv[1:2] != ["--train"]:
        sys.exit(f"usage: {sys.argv[0]} --train RANK MODEL_JSON STAGE DTYPE ROOT PORT [STEPS ref|noref]")
    r, mp, stage, dtype, root, port = sys.argv[2:8]
    steps, ref = (int(sys.argv[8]), sys.argv[9] == "ref") if len(sys.argv) > 9 else (STEPS, True)
    train(int(r), mp, int(stage), dtype, root, int(port), steps, ref)
