"""Shared fixtures of the `tenplex run` end-to-end tests (elastic_run_test.py, and through
it policy_*, slurm, membership and torchrun_* tests): a check list that reports every
result, the steps of a run log, the step-by-step comparison with a static run, a
`tenplex run` of examples/gpt/train.py on a schedule, and the small test model.
"""

import json
import os
import subprocess
import sys

from tenplex.runlog import read_run_log


class Checks:
    """check(cond, what) prints each result and goes on; finish() exits 1 if any failed."""

    def __init__(self):
        self.failures = []

    def __call__(self, cond, what):
        print(("ok: " if cond else "FAIL: ") + what)
        if not cond:
            self.failures.append(what)

    def finish(self):
        print(f"{1 if not self.failures else 0} passed, {len(self.failures)} failed")
        sys.exit(1 if self.failures else 0)


def steps_of(log):
    """(steps by number, events) of a run log (tenplex.runlog)."""
    return read_run_log(log)


def check_steps(check, got, base, n):
    """Every step 0..n-1 of `got` has the static run's samples and its loss within 1e-3."""
    for s in range(n):
        if s in got and s in base:
            rel = abs(got[s]["loss"] - base[s]["loss"]) / abs(base[s]["loss"])
            check(
                got[s]["samples"] == base[s]["samples"] and rel <= 1e-3,
                f"step {s} ({got[s]['config']}, world {got[s].get('world_size', '-')}): same samples, "
                f"loss {got[s]['loss']:.6f} vs static {base[s]['loss']:.6f} (rel {rel:.1e})",
            )


def run(
    tenplex,
    repo,
    tmp,
    name,
    schedule,
    model,
    baseline=None,
    cluster=None,
    commit_every=0,
    extra=(),
    log=None,
    warm=False,
):
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
    cmd += [
        "--",
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
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    print(p.stdout)
    if p.returncode != 0:
        print(p.stderr)
        raise SystemExit(f"tenplex run {name} failed with {p.returncode}")
    if extra:
        return log, p.stdout, p.stderr
    return log, p.stdout


def small_model(tenplex, tmp):
    model = os.path.join(tmp, "model.json")
    subprocess.run(
        [
            tenplex,
            "model",
            "gpt",
            "--num-layers",
            "2",
            "--hidden-size",
            "32",
            "--num-attention-heads",
            "4",
            "--vocab-size",
            "128",
            "--max-position-embeddings",
            "32",
            "-o",
            model,
        ],
        check=True,
    )
    return model
