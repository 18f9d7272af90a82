"""Shared fixtures of the `tenplex run` end-to-end tests (elastic_run_test.py, and through
it policy_*, slurm, membership and torchrun_* tests): a check list that reports every
result, the steps of a run log, the step-by-step comparison with a static run, a
`tenplex run` of examples/gpt/train.py on a schedule, and the small test model.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from tenplex.runlog import read_run_log

_log = logging.getLogger(__name__)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Checks:
    """check(cond, what) logs each result and goes on; finish() raises AssertionError
    naming every failed check, if any (a script then exits 1; under pytest the test fails)."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def __call__(self, cond: object, what: str) -> None:
        if cond:
            _log.info("ok: %s", what)
        else:
            _log.error("FAIL: %s", what)
            self.failures.append(what)

    def finish(self) -> None:
        _log.info("%d failed", len(self.failures))
        if self.failures:
            raise AssertionError(f"{len(self.failures)} check(s) failed:\n" + "\n".join(self.failures))


def steps_of(log_path: str) -> tuple[dict[int, dict[str, Any]], list[dict[str, Any]]]:
    """(steps by number, events) of a run log (tenplex.runlog)."""
    return read_run_log(log_path)


def check_steps(check: Checks, got: dict[int, dict[str, Any]], base: dict[int, dict[str, Any]], n: int) -> None:
    """Every step 0..n-1 of `got` has the static run's samples and its loss within 1e-3."""
    for s in range(n):
        if s in got and s in base:
            rel = abs(got[s]["loss"] - base[s]["loss"]) / abs(base[s]["loss"])
            check(
                got[s]["samples"] == base[s]["samples"] and rel <= 1e-3,
                f"step {s} ({got[s]['config']}, world {got[s].get('world_size', '-')}): same samples, "
                f"loss {got[s]['loss']:.6f} vs static {base[s]['loss']:.6f} (rel {rel:.1e})",
            )


def train_command(model: str, repo: str = REPO) -> list[str]:
    """The worker command of the run tests: examples/gpt/train.py on `model`."""
    return [
        sys.executable,
        os.path.join(repo, "examples/gpt/train.py"),
        "--model",
        model,
        "--global-batch-size",
        "8",
        "--micro-batch-size",
        "2",
        "--seq-length",
        "32",
    ]


def run(
    tenplex: str,
    repo: str,
    tmp: str,
    name: str,
    schedule: list[dict[str, Any]],
    model: str,
    baseline: str | None = None,
    cluster: str | None = None,
    commit_every: int = 0,
    extra: Sequence[str] = (),
    log: str | None = None,
    warm: bool = False,
) -> tuple[str, ...]:
    """`tenplex run` of train.py on `schedule`: (log, stdout), with `extra` arguments
    (log, stdout, stderr). A failed run raises AssertionError with its output."""
    sched = os.path.join(tmp, name + ".json")
    with open(sched, "w") as f:
        json.dump(schedule, f)
    log = log or os.path.join(tmp, name + ".jsonl")
    cmd = [
        tenplex,
        "run",
        "--schedule",
        sched,
        "--log",
        log,
        "--work-dir",
        os.path.join(tmp, name),
        "--hang-seconds",
        "240",
    ]
    if baseline:
        cmd += ["--baseline", baseline]
    if cluster:
        cmd += ["--cluster", cluster]
    if commit_every:
        cmd += ["--commit-every", str(commit_every)]
    cmd += list(extra) + (["--warm"] if warm else [])
    cmd += ["--", *train_command(model, repo)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    _log.info("tenplex run %s:\n%s", name, p.stdout)
    if p.returncode != 0:
        raise AssertionError(f"tenplex run {name} failed with {p.returncode}:\n{p.stdout}\n{p.stderr}")
    if extra:
        return log, p.stdout, p.stderr
    return log, p.stdout


def small_model(
    tenplex: str,
    tmp: str,
    name: str = "model.json",
    *,
    layers: int = 2,
    hidden: int = 32,
    heads: int = 4,
    vocab: int = 128,
    seq: int = 32,
    extra: Sequence[str] = (),
) -> str:
    """`tenplex model gpt` of the tests' small GPT into tmp/name: 2 layers, hidden size 32,
    4 heads, vocabulary 128, 32 positions unless overridden; `extra`: more flags (e.g.
    --num-query-groups 2 --swiglu, --make-vocab-size-divisible-by 16). Its path."""
    model = os.path.join(tmp, name)
    subprocess.run(
        [
            tenplex,
            "model",
            "gpt",
            "--num-layers",
            str(layers),
            "--hidden-size",
            str(hidden),
            "--num-attention-heads",
            str(heads),
            "--vocab-size",
            str(vocab),
            "--max-position-embeddings",
            str(seq),
            *extra,
            "-o",
            model,
        ],
        check=True,
    )
    return model
