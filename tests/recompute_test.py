"""Activation recomputation in the reference client (train.py --recompute-*, model.Recompute).

Under pytest (issue 32 §4), ctest gpt_recompute (every test of the file), TENPLEX_BIN the
CLI under test:

    python -m pytest tests/recompute_test.py

examples/gpt is importable through the `examples_gpt` fixture (tests/conftest.py), for this
process and, by PYTHONPATH, for the ranks it launches (this file run as a script, one rank).

test_sweep: in tp=1, tp=2 and pp=2, one launch (launch.py's, this file as each rank's
script) trains the same steps once without recomputation and once per recompute setting
(selective, full uniform N=1 and N=2, full block N=1 and N=3), each from fresh weights
through train.py's parse_args, Trainer and train_step. Against the run without:
  - every step's loss and gradient norm, and every final local tensor (parameters and
    Adam moments), bit for bit;
  - recomputation really ran: model.CALLS counts the forward runs of Stage.layer and
    Stage.attention_core (a recomputation runs them again in the backward) and the
    checkpointed regions, each against the count the setting implies; and the peak bytes
    autograd holds in saved tensors (saved_tensors_hooks) are lower.
test_cli: train.py's own main (argument checks, run_segment) through launch.py with
--recompute-activations in tp=2: the sweep's losses, and the attention core run twice.
test_bad_*: Megatron's rules (ValueError naming the argument); train.py exits 2 with it.
"""

import importlib
import json
import logging
import math
import os
import subprocess
import sys
from datetime import timedelta
from types import SimpleNamespace
from typing import Any, Optional

import pytest
import torch
import torch.distributed as dist
from small_models import SMALL_GPT, SMALL_LLAMA

from tenplex import layout as L

log = logging.getLogger("recompute_test")

WORKER_ENV = "TENPLEX_RECOMPUTE_TEST"  # "sweep:DIR" or "cli:DIR": this process is a rank
STEPS = 3
BATCH, MICRO = 4, 2
TRAIN = [
    "--global-batch-size",
    str(BATCH),
    "--micro-batch-size",
    str(MICRO),
    "--seq-length",
    "32",
    "--steps",
    str(STEPS),
    "--timeout",
    "120",
]
GPT2, LLAMA = SMALL_GPT, SMALL_LLAMA
# name -> (train.py flags, (granularity, method, N) as the test reads them)
MODES: dict[str, tuple[list[str], tuple[Optional[str], Optional[str], int]]] = {
    "none": ([], (None, None, 0)),
    "selective": (["--recompute-granularity", "selective"], ("selective", None, 0)),
    "full_uniform_1": (["--recompute-granularity", "full"], ("full", "uniform", 1)),
    "full_uniform_2": (
        ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "2"],
        ("full", "uniform", 2),
    ),
    "full_block_1": (
        ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "1"],
        ("full", "block", 1),
    ),
    "full_block_3": (
        ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "3"],
        ("full", "block", 3),
    ),
}
Result = dict[str, Any]


# ---- the ranks (this file run by launch.py) ---------------------------------------


class SavedBytes:
    """Bytes of the tensors autograd holds for the backward, now and at most."""

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0

    def pack(self, t: torch.Tensor) -> "_Held":
        return _Held(self, t)

    @staticmethod
    def unpack(held: "_Held") -> torch.Tensor:
        return held.tensor


class _Held:
    """A saved tensor; its bytes count until autograd drops it."""

    def __init__(self, meter: SavedBytes, t: torch.Tensor) -> None:
        self.meter, self.tensor, self.nbytes = meter, t, t.numel() * t.element_size()
        meter.live += self.nbytes
        meter.peak = max(meter.peak, meter.live)

    def __del__(self) -> None:
        self.meter.live -= self.nbytes


def run_mode(argv: list[str], flags: list[str], model: L.Model, cfg: L.Config) -> tuple[Result, dict]:
    """Trains --steps steps from fresh weights with `flags`; the result and the final state."""
    import model as gpt  # examples/gpt: on a rank's PYTHONPATH (run_ranks)
    import train

    args = train.parse_args(argv + flags)
    trainer = train.Trainer(args, model, cfg, args.world_rank)
    before = dict(gpt.CALLS)
    meter = SavedBytes()
    losses, norms = [], []
    with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
        for _ in range(args.steps):
            loss, norm, _ = trainer.train_step()
            losses.append(loss)
            norms.append(norm)
    calls = {k: gpt.CALLS[k] - before[k] for k in before}
    result = {
        "losses": losses,
        "grad_norms": norms,
        "calls": calls,
        "peak_saved_bytes": meter.peak,
        "local_layers": trainer.stage.num_local_layers,
    }
    return result, dict(trainer.state_tensors())


def sweep_worker(argv: list[str], out: str) -> None:
    """Every mode of MODES in one process group; writes OUT/sweep-RANK.json."""
    import train

    base = train.parse_args(argv)
    torch.set_num_threads(base.threads)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{base.master_addr}:{base.master_port}",
        rank=base.world_rank,
        world_size=base.world_size,
        timeout=timedelta(seconds=base.timeout),
    )
    model, cfg = L.Model.load(base.model), L.Config.parse(base.config)
    results: dict[str, Result] = {}
    baseline: dict[str, torch.Tensor] = {}
    for name, (flags, _) in MODES.items():
        result, state = run_mode(argv, flags, model, cfg)
        baseline = baseline or state
        assert sorted(state) == sorted(baseline)
        result["state_equal"] = all(torch.equal(state[k], baseline[k]) for k in state)
        result["state_max_diff"] = max((state[k] - baseline[k]).abs().max().item() for k in state)
        results[name] = result
    dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(out, f"sweep-{base.world_rank}.json"), "w") as f:
        json.dump(results, f)


def cli_worker(argv: list[str], out: str) -> None:
    """train.py's main; then writes model.CALLS to OUT/cli-RANK.json."""
    import model as gpt
    import train

    train.main(argv)
    rank = train.parse_args(argv).world_rank
    with open(os.path.join(out, f"cli-{rank}.json"), "w") as f:
        json.dump(gpt.CALLS, f)


# ---- the test ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ex(examples_gpt: str) -> SimpleNamespace:
    """examples/gpt's modules: ex.launch, ex.model, ex.train, ex.elastic_train; ex.dir."""
    names = ("launch", "model", "train", "elastic_train")
    return SimpleNamespace(dir=examples_gpt, **{n: importlib.import_module(n) for n in names})


def make_model(tenplex: str, directory: str, name: str, args: list[str]) -> str:
    path = os.path.join(directory, name + ".json")
    if not os.path.exists(path):
        subprocess.run([tenplex, "model", "gpt", "-o", path] + args, check=True)
    return path


def run_ranks(ex: SimpleNamespace, kind: str, config: str, args: list[str], out: str) -> None:
    """Runs every rank of `config` as this file in worker mode `kind`."""
    os.environ[WORKER_ENV] = f"{kind}:{out}"
    try:
        rc = ex.launch.launch(config, args, python=sys.executable, script=os.path.abspath(__file__), timeout=300)
    finally:
        del os.environ[WORKER_ENV]
    assert rc == 0, f"{kind} {config}: a rank exited with {rc}"


def expected_calls(spec: tuple[Optional[str], Optional[str], int], layers: int) -> dict[str, int]:
    """model.CALLS of one rank over STEPS steps of `layers` local layers."""
    granularity, method, n = spec
    micro = STEPS * (BATCH // MICRO)  # forwards of the stage (dp = 1)
    recomputed, regions, cores = 0, 0, 0
    if granularity == "selective":
        regions = cores = layers
    elif method == "uniform":
        recomputed, regions = layers, math.ceil(layers / n)
    elif method == "block":
        recomputed = regions = min(n, layers)
    return {
        "layer": micro * (layers + recomputed),
        "attention_core": micro * (layers + recomputed + cores),
        "checkpoint": micro * regions,
    }


def check_rank(config: str, rank: int, results: dict[str, Result], pp: int) -> None:
    base = results["none"]
    for name, (_, spec) in MODES.items():
        r = results[name]
        what = f"{config} rank {rank} {name}"
        assert r["local_layers"] == 4 // pp
        assert r["losses"] == base["losses"], f"{what}: losses {r['losses']} != {base['losses']}"
        assert r["grad_norms"] == base["grad_norms"], f"{what}: gradient norms {r['grad_norms']}"
        assert r["state_equal"], f"{what}: final state differs by up to {r['state_max_diff']:.3e}"
        assert r["calls"] == expected_calls(spec, 4 // pp), f"{what}: calls {r['calls']}"
        if name != "none":
            assert r["peak_saved_bytes"] < base["peak_saved_bytes"], (
                f"{what}: {r['peak_saved_bytes']} saved bytes at peak, {base['peak_saved_bytes']} without"
            )
    peaks = {name: r["peak_saved_bytes"] for name, r in results.items()}
    log.info("%s rank %d: peak saved bytes %s", config, rank, peaks)


SWEEPS = {"tp=1": "llama", "tp=2": "llama", "pp=2": "gpt2"}  # config -> model
_swept: dict[str, list[dict[str, Result]]] = {}


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("recompute"))


def sweep(ex: SimpleNamespace, tenplex: str, tmp: str, config: str) -> list[dict[str, Result]]:
    """Every rank's results of the sweep in `config` (run once)."""
    if config not in _swept:
        name = SWEEPS[config]
        model = make_model(tenplex, tmp, name, LLAMA if name == "llama" else GPT2)
        out = os.path.join(tmp, f"sweep-{config}")
        os.makedirs(out)
        run_ranks(ex, "sweep", config, ["--model", model] + TRAIN, out)
        _swept[config] = []
        for rank in range(L.Config.parse(config).world_size):
            with open(os.path.join(out, f"sweep-{rank}.json")) as f:
                _swept[config].append(json.load(f))
    return _swept[config]


@pytest.mark.parametrize("config", list(SWEEPS))
def test_sweep(ex: SimpleNamespace, tenplex: str, tmp: str, config: str) -> None:
    results = sweep(ex, tenplex, tmp, config)
    for rank, res in enumerate(results):
        check_rank(config, rank, res, L.Config.parse(config).pp)
    log.info(
        "%s (%s): %d settings, losses, gradient norms and final state bit for bit equal; losses %s",
        config,
        SWEEPS[config],
        len(MODES),
        results[0]["none"]["losses"],
    )


def test_cli(ex: SimpleNamespace, tenplex: str, tmp: str) -> None:
    """train.py's main with --recompute-activations in tp=2: the losses without recomputation,
    and every attention core run twice."""
    base = sweep(ex, tenplex, tmp, "tp=2")[0]["none"]
    out = os.path.join(tmp, "cli")
    os.makedirs(out)
    step_log = os.path.join(out, "steps.jsonl")
    model = make_model(tenplex, tmp, "llama", LLAMA)
    run_ranks(ex, "cli", "tp=2", ["--model", model, "--log", step_log, "--recompute-activations"] + TRAIN, out)
    with open(step_log) as f:
        losses = [json.loads(line)["loss"] for line in f]
    assert losses == base["losses"], f"train.py --recompute-activations: losses {losses} != {base['losses']}"
    for rank in range(2):
        with open(os.path.join(out, f"cli-{rank}.json")) as f:
            calls = json.load(f)
        assert calls == expected_calls(MODES["selective"][1], 4), f"rank {rank}: calls {calls}"


BAD = [  # (train.py flags, the argument the message must name)
    (["--recompute-method", "block"], "--recompute-method"),
    (["--recompute-granularity", "selective", "--recompute-method", "uniform"], "--recompute-method"),
    (["--recompute-activations", "--recompute-num-layers", "2"], "--recompute-num-layers"),
    (["--recompute-granularity", "full", "--recompute-num-layers", "0"], "--recompute-num-layers"),
    (
        ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "-1"],
        "--recompute-num-layers",
    ),
    (["--recompute-activations", "--recompute-granularity", "full"], "--recompute-activations"),
]


@pytest.mark.parametrize("flags,argument", BAD)
def test_bad_combination_checked(ex: SimpleNamespace, flags: list[str], argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        ex.model.Recompute.from_args(ex.train.parse_args(["--config", "tp=1"] + flags))


def test_bad_choice(ex: SimpleNamespace, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        ex.train.parse_args(["--config", "tp=1", "--recompute-granularity", "partial"])
    assert e.value.code == 2 and "--recompute-granularity" in capsys.readouterr().err


def test_bad_combinations_exit(ex: SimpleNamespace, tenplex: str, tmp: str) -> None:
    """train.py exits 2 with one line naming the argument, before joining a process group
    (the last run under --elastic, whose checks are its own)."""
    model = make_model(tenplex, tmp, "gpt2", GPT2)
    runs = [
        (["--config", "tp=1", "--model", model] + BAD[0][0], BAD[0][1]),
        (["--config", "tp=1", "--model", model] + BAD[3][0], BAD[3][1]),
        (["--elastic", '{"1": "tp=1"}', "--model", model] + BAD[5][0], BAD[5][1]),
    ]
    procs = [
        subprocess.Popen(
            [sys.executable, os.path.join(ex.dir, "train.py")] + args,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args, _ in runs
    ]
    for p, (args, argument) in zip(procs, runs):
        _, err = p.communicate(timeout=120)
        assert p.returncode == 2, f"train.py {' '.join(args)}: exit {p.returncode}\n{err}"
        assert argument in err and "error" in err, f"train.py {' '.join(args)}: {err}"
        assert "Traceback" not in err, err
        log.info("train.py %s: %s", " ".join(args[-4:]), err.strip().splitlines()[-1])


def test_torchrun_policy_knobs(ex: SimpleNamespace) -> None:
    """Under torchrun a suggest: policy is asked with this example's limits fixed, and its
    chosen recomputation reaches the trainer's arguments unless the command set one."""
    elastic_train, gpt, train = ex.elastic_train, ex.model, ex.train
    args = train.parse_args(["--elastic", "suggest:--model m.json --device-profile cpu", "--micro-batch-size", "2"])
    policy = elastic_train.example_policy(args)
    assert policy.split()[-9:] == [
        "--global-batch",
        "8",
        "--micro-batch",
        "2",
        "--seq-length",
        "64",
        "--virtual-stages",
        "1",
        "--no-sequence-parallel",
    ], policy
    pinned = train.parse_args(["--elastic", "suggest:--model m.json --micro-batch 4 --sequence-parallel"])
    assert elastic_train.example_policy(pinned).count("--micro-batch") == 1
    assert "--no-sequence-parallel" not in elastic_train.example_policy(pinned)
    knobs = [
        "--micro-batch-size",
        "2",
        "--recompute-granularity",
        "full",
        "--recompute-method",
        "block",
        "--recompute-num-layers",
        "3",
    ]
    elastic_train.apply_knobs(args, knobs)
    assert gpt.Recompute.from_args(args).describe() == "full:3"
    own = train.parse_args(["--elastic", "x", "--recompute-activations"])
    elastic_train.apply_knobs(own, knobs)
    assert gpt.Recompute.from_args(own).describe() == "selective"


if __name__ == "__main__":
    # One rank of run_ranks' launch (its argv train.py's, examples/gpt on its PYTHONPATH).
    worker = os.environ.get(WORKER_ENV)
    if not worker:
        sys.exit("recompute_test.py is a pytest module: python -m pytest tests/recompute_test.py")
    kind, directory = worker.split(":", 1)
    (sweep_worker if kind == "sweep" else cli_worker)(sys.argv[1:], directory)
