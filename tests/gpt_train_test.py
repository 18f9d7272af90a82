"""Integration tests of the reference GPT client (examples/gpt).

Under pytest (issue 32 §4), ctests gpt_train_equivalence, gpt_train_resume and
gpt_train_errors, each one test function, TENPLEX_BIN the CLI under test:

    python -m pytest tests/gpt_train_test.py::test_equivalence

test_equivalence  same steps in many parallel configs give the losses and samples of an
                  independent single-process reference; every saved checkpoint matches
                  `tenplex layout --json` (names, dtypes, shapes), padding is zero and
                  replicas agree
test_resume       save in config A at step k, convert (with `tenplex reshard` when it
                  exists, and always with the re-slicer below), load in config B,
                  continue: the losses of an uninterrupted run
test_errors       bad input is a clear error, never a hang

The reference (`reference_losses`) is written independently of the client: global
tensors, plain torch ops, F.cross_entropy, torch.optim.AdamW and clip_grad_norm_. It
shares only the inputs with the client: the initial values (model.init_global) and the
data (data.step_samples, data.Corpus). The re-slicer works from the C++ layout's pieces.
Both, and the checkpoint and hand-off checks, are in tests/gpt_train_testing.py, which
imports examples/gpt: the `client` fixture imports it once the `examples_gpt` fixture
(tests/conftest.py) has put examples/gpt on the path, and sets its BIN to the CLI under
test; tests/reference's data_ref comes from the `references` fixture.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch
from small_models import SMALL_GPT, SMALL_LLAMA

from tenplex import checkpoint, safetensors

_log = logging.getLogger(__name__)

Step = dict[str, Any]
STEPS = 4
CONFIG_TOL = 1e-5  # relative, between parallel configs (measured: ~1e-7)
REFERENCE_TOL = 1e-4  # relative, client vs single-process reference (measured: ~1e-6)

SMALL, LLAMA = SMALL_GPT, SMALL_LLAMA
BF16 = [
    "--num-layers",
    "2",
    "--hidden-size",
    "64",
    "--num-attention-heads",
    "4",
    "--vocab-size",
    "250",
    "--max-position-embeddings",
    "64",
    "--params-dtype",
    "bf16",
]
TRAIN = ["--global-batch-size", "8", "--micro-batch-size", "2", "--seq-length", "48"]


@dataclasses.dataclass
class Client:
    """The CLI under test, the test's directory, examples/gpt (`dir`, its `data` module)
    and the references (`testing`: gpt_train_testing, `data_ref`)."""

    tenplex: str
    tmp: str
    dir: str
    data: ModuleType
    testing: ModuleType
    data_ref: ModuleType

    def model(self, name: str, args: list[str]) -> str:
        path = os.path.join(self.tmp, name + ".json")
        subprocess.run([self.tenplex, "model", "gpt", "-o", path] + args, check=True)
        return path

    def train(self, config: str, model: str | None, steps: int, tag: str, extra: Sequence[str] = ()) -> list[Step]:
        """Runs the client through launch.py; returns the log records."""
        log = os.path.join(self.tmp, f"{tag}.jsonl")
        if os.path.exists(log):
            os.unlink(log)
        args = [
            sys.executable,
            os.path.join(self.dir, "launch.py"),
            "--config",
            config,
            "--timeout",
            "400",
            "--steps",
            str(steps),
            "--log",
            log,
            *TRAIN,
            *extra,
        ]
        if model:
            args += ["--model", model]
        r = subprocess.run(args, capture_output=True, text=True)
        assert r.returncode == 0, f"{tag}: train failed ({r.returncode}):\n{r.stderr[-3000:]}"
        for line in r.stderr.splitlines():
            if "s/step" in line:
                _log.info("  %s: %s", tag, line.split(": ", 1)[1])
        with open(log) as f:
            return [j for j in map(json.loads, f) if "event" not in j]  # steps, not checkpoint events

    def has_command(self, name: str) -> bool:
        r = subprocess.run([self.tenplex, "--help"], capture_output=True, text=True)
        return any(line.split()[:1] == [name] for line in r.stdout.splitlines())


@pytest.fixture
def client(examples_gpt: str, tenplex: str, tmp: str, references: SimpleNamespace) -> Iterator[Client]:
    """The test's Client; torch on one thread (the reference's) for the test."""
    testing = importlib.import_module("gpt_train_testing")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(testing, "BIN", os.path.abspath(tenplex))
            yield Client(tenplex, tmp, examples_gpt, importlib.import_module("data"), testing, references.data_ref)
    finally:
        torch.set_num_threads(threads)


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def compare(tag: str, got: list[Step], want: list[Step], tol: float) -> float:
    assert len(got) == len(want), f"{tag}: {len(got)} steps logged, expected {len(want)}"
    worst = 0.0
    for g, w in zip(got, want):
        assert g["step"] == w["step"], f"{tag}: step {g['step']} where {w['step']} was expected"
        assert g["samples"] == w["samples"], f"{tag}: step {g['step']} samples {g['samples']} != {w['samples']}"
        worst = max(worst, rel(g["loss"], w["loss"]))
        assert rel(g["loss"], w["loss"]) <= tol, (
            f"{tag}: step {g['step']} loss {g['loss']!r} vs {w['loss']!r} (relative {rel(g['loss'], w['loss']):.2e})"
        )
    _log.info("  %s: %d steps, largest relative loss difference %.2e", tag, len(got), worst)
    return worst


def check_handoff(c: Client, full: list[Step]) -> None:
    """The `tenplex run` protocol: --state-out into store files, --state-in from them
    (`full`: an uninterrupted run of the llama model in tp=2,dp=2,zero=1)."""
    model = c.model("llama", LLAMA)
    cfg, k = "tp=2,dp=2,zero=1", 2
    out = c.testing.make_handoff(model, cfg, os.path.join(c.tmp, "shm-0"), 0, 0)
    first = c.train(cfg, None, k, "handoff_first", ["--state-out", out, "--model", "no-such-file", "--start-step", "0"])
    compare("hand-off: first steps", first, full[:k], 0.0)
    with open(out + ".result") as f:
        res = json.load(f)
    assert res == {"step": k, "samples_consumed": k * 8}, f"{out}.result is {res}"
    with open(out) as f:  # the runner commits the version with the result's position
        h = json.load(f)
    h.update(res)
    with open(out, "w") as f:
        json.dump(h, f)
    ck = os.path.join(c.tmp, "handoff_ck")
    c.testing.handoff_to_checkpoint(out, ck)
    c.testing.gather_globals(ck, model)  # layout, padding and replicas of what the workers wrote
    rest = c.train(cfg, model, STEPS - k, "handoff_rest", ["--state-in", out, "--start-step", str(k)])
    compare(f"hand-off {cfg}: --state-out at step {k}, --state-in", rest, full[k:], 0.0)


def check_order_against_cli(c: Client) -> None:
    """The client's sample order (data.step_samples) equals `tenplex data batches`."""
    if not c.has_command("data"):
        _log.info("  sample order: `tenplex data` not in this binary, not compared")
        return
    corpus = os.path.join(c.dir, "data", "corpus.jsonl")
    index = os.path.join(c.tmp, "corpus-index")
    subprocess.run(
        [c.tenplex, "data", "index", "--input", corpus, "--format", "jsonl", "-o", index],
        check=True,
        capture_output=True,
    )
    n = len(c.data.Corpus(corpus, 256, 8))
    for seed, batch, dp, start, steps in [(1234, 8, 1, 0, 60), (1234, 8, 3, 392, 4), (7, 24, 5, 360, 3)]:
        for rank in range(dp):
            out = subprocess.run(
                [
                    c.tenplex,
                    "data",
                    "batches",
                    "--index",
                    index,
                    "--seed",
                    str(seed),
                    "--global-batch",
                    str(batch),
                    "--dp",
                    str(dp),
                    "--rank",
                    str(rank),
                    "--start-sample",
                    str(start),
                    "--steps",
                    str(steps),
                    "--json",
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            got = [st["samples"] for st in json.loads(out.stdout)["steps"]]
            want = [c.data.step_samples(n, seed, batch, start + i * batch, dp, rank)[1] for i in range(steps)]
            assert got == want, (
                f"sample order differs from `tenplex data batches` (seed {seed}, B {batch}, "
                f"dp {dp}, rank {rank}, start {start}): {got[:2]} vs {want[:2]}"
            )
            # The independent pure-Python order (tests/reference) agrees with both.
            ref = [c.data_ref.step_samples(n, seed, batch, start + i * batch, dp, rank)[1] for i in range(steps)]
            assert ref == want, (
                f"sample order differs from the reference (seed {seed}, B {batch}, dp {dp}, "
                f"rank {rank}, start {start}): {ref[:2]} vs {want[:2]}"
            )
    _log.info(
        "  sample order: equal to `tenplex data batches` and to the pure-Python reference "
        "(3 cases, across epochs, uneven dp)"
    )


# ---- tests ---------------------------------------------------------------------


def test_equivalence(client: Client) -> None:
    c = client
    check_order_against_cli(c)
    cases = [
        (
            c.model("small", SMALL),
            ["tp=1", "tp=2", "pp=2", "dp=3", "tp=2,pp=2", "dp=2,zero=1", "tp=2,pp=2,dp=2,zero=1"],
        ),
        (c.model("llama", LLAMA), ["tp=1", "tp=2,pp=2", "tp=2,dp=2,zero=1", "pp=3,layers=1+2+1"]),
        (c.model("bf16", BF16), ["tp=1", "tp=2,dp=2,zero=1"]),
    ]
    for model, configs in cases:
        name = os.path.basename(model)[:-5]
        # The reference computes in fp32; bf16 weights are compared between configs only.
        ref = c.testing.reference_losses(model, STEPS, seq=48) if name != "bf16" else None
        base = None
        for cfg in configs:
            tag = f"{name} {cfg}"
            ck = os.path.join(c.tmp, f"ck-{name}-{cfg.replace(',', '_').replace('=', '')}")
            got = c.train(cfg, model, STEPS, tag.replace(" ", "_"), ["--save-dir", ck])
            if ref:
                compare(f"{tag} vs reference", got, ref, REFERENCE_TOL)
            if base is None:
                base = got
            else:
                compare(f"{tag} vs {configs[0]}", got, base, CONFIG_TOL)
            info, _ = c.testing.gather_globals(ck, model)
            assert info["step"] == STEPS and info["samples_consumed"] == STEPS * 8, (
                f"{ck}: step {info['step']} samples_consumed {info['samples_consumed']}"
            )
            _log.info("  %s: checkpoint matches `tenplex layout`, padding zero, replicas equal", tag)


def test_resume(client: Client) -> None:
    c = client
    reshard = c.has_command("reshard")
    _log.info(
        "  converter: %s", "tenplex reshard + Python re-slicer" if reshard else "Python re-slicer (no tenplex reshard)"
    )
    k = 2
    fulls = {}
    for name, args, a, b in [
        ("small", SMALL, "tp=2,pp=2", "dp=2,zero=1"),
        ("small", SMALL, "dp=2,zero=1", "tp=2,pp=2"),
        ("llama", LLAMA, "tp=2,dp=2,zero=1", "pp=2"),
        ("bf16", BF16, "dp=2,zero=1", "tp=2"),
    ]:
        model = c.model(name, args)
        tag = f"{name}_{a}_to_{b}".replace(",", "_").replace("=", "")
        ck_a = os.path.join(c.tmp, tag + "_A")
        full = c.train(a, model, STEPS, tag + "_full", ["--save-dir", ck_a, "--save-at", str(k)])
        ck_b = os.path.join(c.tmp, tag + "_B")
        c.testing.reslice(ck_a, model, b, ck_b)
        load = ck_b
        if reshard:
            ck_c = os.path.join(c.tmp, tag + "_C")
            subprocess.run([c.tenplex, "reshard", "--in", ck_a, "--to", b, "--out", ck_c, "-q"], check=True)
            _, mine = c.testing.gather_globals(ck_b, model)
            _, theirs = c.testing.gather_globals(ck_c, model)
            assert mine.keys() == theirs.keys() and all(torch.equal(mine[n], theirs[n]) for n in mine), (
                f"tenplex reshard and the Python re-slicer disagree on {ck_a} -> {b}"
            )
            info_c = checkpoint.read_info(ck_c)
            assert info_c.get("step") == k and info_c.get("samples_consumed") == k * 8, (
                f"tenplex reshard dropped step/samples_consumed: {info_c.get('step')}, {info_c.get('samples_consumed')}"
            )
            load = ck_c
        rest = c.train(b, None, STEPS - k, tag + "_rest", ["--load-dir", load])
        compare(f"{name} {a} -> {b} at step {k}", rest, full[k:], CONFIG_TOL)
        fulls[(name, a)] = full
    check_handoff(c, fulls[("llama", "tp=2,dp=2,zero=1")])


def expect_fail(args: list[str], want: str, tag: str) -> None:
    r = subprocess.run([sys.executable] + args, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0, f"{tag}: succeeded, expected an error"
    assert want in r.stderr, f"{tag}: error does not mention {want!r}:\n{r.stderr[-2000:]}"
    assert "Traceback" not in r.stderr, f"{tag}: crashed with a traceback:\n{r.stderr[-2000:]}"
    _log.info("  %s: clear error", tag)


def check_safetensors(tmp: str) -> None:
    """Round trip of every dtype, and malformed files rejected with a clear error."""
    path = os.path.join(tmp, "t.safetensors")
    g = torch.Generator().manual_seed(1)
    tensors = [
        ("f32", torch.randn(3, 5, generator=g)),
        ("bf16", torch.randn(7, generator=g).bfloat16()),
        ("f16", torch.randn(2, 2, generator=g).half()),
        ("i64", torch.arange(6).reshape(2, 3)),
        ("u8", torch.arange(5, dtype=torch.uint8)),
        ("b", torch.tensor([True, False])),
        ("empty", torch.zeros(0, 4)),
    ]
    safetensors.save(path, tensors, {"k": "v"})
    back, meta = safetensors.load(path, with_metadata=True)
    assert list(back) == [n for n, _ in tensors] and meta == {"k": "v"}, "safetensors: names or metadata lost"
    for n, t in tensors:
        assert back[n].dtype == t.dtype and torch.equal(back[n], t), f"safetensors: {n} changed in a round trip"
    with open(path, "rb") as f:
        raw = f.read()
    header_len = int.from_bytes(raw[:8], "little")
    assert (8 + header_len) % 8 == 0, "safetensors: header not padded to 8 bytes"
    bad = {
        "truncated": raw[:-3],
        "short": raw[:5],
        "huge header": (1 << 40).to_bytes(8, "little") + raw[8:],
        "not json": raw[:8] + b"x" * header_len + raw[8 + header_len :],
        "overlap": _st(
            b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
            b'"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}',
            8,
        ),
        "bad dtype": _st(b'{"a":{"dtype":"F99","shape":[1],"data_offsets":[0,4]}}', 4),
        "wrong size": _st(b'{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', 8),
    }
    for what, blob in bad.items():
        with open(path, "wb") as f:
            f.write(blob)
        try:
            safetensors.load(path)
        except safetensors.SafetensorsError as e:
            assert path in str(e), f"safetensors {what}: error does not name the file: {e}"
        else:
            raise AssertionError(f"safetensors: {what} file accepted")
    _log.info("  safetensors: round trip of all dtypes, malformed files rejected")


def _st(header: bytes, data_bytes: int) -> bytes:
    return len(header).to_bytes(8, "little") + header + b"\0" * data_bytes


def test_errors(client: Client) -> None:
    c = client
    check_safetensors(c.tmp)
    model = c.model("small", SMALL)
    launch = os.path.join(c.dir, "launch.py")
    trainpy = os.path.join(c.dir, "train.py")
    expect_fail([launch, "--config", "tp=3", "--model", model], "tp=3 does not divide", "tp does not divide heads")
    expect_fail([launch, "--config", "pp=3", "--model", model], "L % pp", "pp does not divide layers")
    expect_fail([launch, "--config", "tp=2,tq=1", "--model", model], "unknown key", "unknown config key")
    expect_fail(
        [trainpy, "--config", "tp=2", "--model", model, "--world-size", "3"], "world size 2", "wrong world size"
    )
    expect_fail(
        [trainpy, "--config", "tp=1", "--model", model, "--seq-length", "100"],
        "max_position_embeddings",
        "sequence longer than positions",
    )
    ck = os.path.join(c.tmp, "err_ck")
    c.train("tp=2", model, 1, "err_save", ["--save-dir", ck])
    expect_fail(
        [launch, "--config", "tp=1", "--load-dir", ck, "--steps", "1"], "tenplex reshard", "load in another config"
    )
    expect_fail(
        [launch, "--config", "tp=2", "--model", model, "--save-dir", ck], "not overwritten", "save over a checkpoint"
    )
    # State without a step is refused, not trained from step 0 (issue 16 bug 1).
    nostep = os.path.join(c.tmp, "err_nostep")
    shutil.copytree(ck, nostep)
    with open(os.path.join(nostep, "tenplex.json")) as f:
        info = json.load(f)
    del info["step"]
    with open(os.path.join(nostep, "tenplex.json"), "w") as f:
        json.dump(info, f)
    expect_fail(
        [launch, "--config", "tp=2", "--load-dir", nostep, "--steps", "1"],
        "no training position",
        "checkpoint without a step",
    )
    broken = os.path.join(c.tmp, "err_broken")
    os.makedirs(broken)
    with open(model) as f:
        model_desc = json.load(f)
    with open(os.path.join(broken, "tenplex.json"), "w") as f:
        f.write(json.dumps({"model": model_desc, "config": "tp=1,pp=1,dp=1", "step": 1}))
    with open(os.path.join(broken, checkpoint.rank_file(0)), "wb") as f:
        f.write(b'\x10\x00\x00\x00\x00\x00\x00\x00{"a": 1}')
    expect_fail(
        [launch, "--config", "tp=1", "--load-dir", broken, "--steps", "1"], "header length", "truncated rank file"
    )
