"""A `tenplex run` schedule that gives GPU counts instead of configs: the config policy
picks each segment's config (the "cpu" device profile with a small fake memory, so that
it must shard), and the run gives the same samples and losses as a static run.

Under pytest (issue 32 §4), ctest policy_run, TENPLEX_BIN the CLI under test:

    python -m pytest tests/policy_run_test.py::test_policy_run

The expected configs come from `tenplex config suggest --json` with the same shape
(global batch 8, micro-batch 2, sequence 32: the worker arguments), the same memory and
the knobs the example implements (recomputation searched; no sequence parallelism or
virtual stages); the workers must run with the recomputation the policy chose (their
step log says which).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from typing import Any

from elastic_run_testing import REPO, Checks, run, small_model, steps_of

_log = logging.getLogger(__name__)

MEMORY = "600KiB"
# what examples/gpt implements of the knobs: recomputation; not SP or virtual stages
EXAMPLE_KNOBS = ["--no-sequence-parallel", "--virtual-stages", "1"]


def suggest(tenplex: str, model: str, gpus: int, memory: str) -> subprocess.CompletedProcess[str]:
    """`tenplex config suggest --json` for `gpus` GPUs of `memory` each, in the workers' shape."""
    return subprocess.run(
        [
            tenplex,
            "config",
            "suggest",
            "--model",
            model,
            "--gpus",
            str(gpus),
            "--device-profile",
            "cpu",
            "--gpu-memory",
            memory,
            "--global-batch",
            "8",
            "--micro-batch",
            "2",
            "--seq-length",
            "32",
            *EXAMPLE_KNOBS,
            "--json",
        ],
        capture_output=True,
        text=True,
    )


def test_policy_run(tenplex: str, tmp: str) -> None:
    repo = REPO
    check = Checks()
    model = small_model(
        tenplex, tmp, vocab=200, extra=("--num-query-groups", "2", "--make-vocab-size-divisible-by", "16")
    )
    want: dict[int, Any] = {}
    want_rc: dict[int, Any] = {}
    for gpus in (2, 4):
        p = suggest(tenplex, model, gpus, MEMORY)
        check(p.returncode == 0, f"config suggest for {gpus} GPUs: {p.stderr.strip()}")
        first = json.loads(p.stdout)["configs"][0] if p.returncode == 0 else {}
        want[gpus] = first.get("config")
        want_rc[gpus] = first.get("recompute")
    _log.info("policy picks: %s %s", want, want_rc)
    check(want_rc[2] != "none", f"with {MEMORY} per GPU the policy recomputes on 2 GPUs: {want[2]} {want_rc[2]}")
    n = 6
    static_log, _ = run(tenplex, repo, tmp, "static", [{"step": 0, "config": "tp=1"}, {"step": n, "stop": True}], model)
    sched = [
        {"step": 0, "gpus": 2, "gpu_memory": MEMORY},
        {"step": 2, "gpus": 4, "gpu_memory": MEMORY},
        {"step": 4, "gpus": 1, "gpu_memory": "1MiB"},
        {"step": n, "stop": True},
    ]
    # 1 GPU with 1 MiB: the whole model fits, the policy must choose tp=1.
    p = suggest(tenplex, model, 1, "1MiB")
    want[1] = json.loads(p.stdout)["configs"][0]["config"]
    want_rc[1] = json.loads(p.stdout)["configs"][0]["recompute"]
    log, out = run(tenplex, repo, tmp, "gpus", sched, model, baseline=static_log)
    base, _ = steps_of(static_log)
    got, events = steps_of(log)
    check(sorted(got) == list(range(n)), f"every step logged: {sorted(got)}")
    for s in range(n):
        if s in got and s in base:
            rel = abs(got[s]["loss"] - base[s]["loss"]) / abs(base[s]["loss"])
            check(
                got[s]["samples"] == base[s]["samples"] and rel <= 1e-3,
                f"step {s}: same samples, loss {got[s]['loss']:.6f} vs static {base[s]['loss']:.6f}",
            )
    for s, gpus in ((0, 2), (1, 2), (2, 4), (3, 4), (4, 1), (5, 1)):
        check(
            s in got and got[s]["config"] == want[gpus],
            f"step {s} ran the policy's config for {gpus} GPUs: {got.get(s, {}).get('config')} == {want[gpus]}",
        )
        check(
            s in got and got[s].get("recompute") == want_rc[gpus] and got[s].get("micro_batch") == 2,
            f"step {s}: the workers recompute as the policy chose: {got.get(s, {}).get('recompute')} == "
            f"{want_rc[gpus]}, micro-batch 2",
        )
    reconf = [e for e in events if e["event"] == "reconfigure"]
    check(len(reconf) == 2, f"two reconfigurations: {[(e['from'], e['to']) for e in reconf]}")
    # A GPU count nothing fits on is refused before anything runs.
    bad = os.path.join(tmp, "bad.json")
    with open(bad, "w") as f:
        json.dump([{"step": 0, "gpus": 1, "gpu_memory": "1KiB"}, {"step": 2, "stop": True}], f)
    p = subprocess.run(
        [
            tenplex,
            "run",
            "--schedule",
            bad,
            "--log",
            os.path.join(tmp, "bad.jsonl"),
            "--work-dir",
            os.path.join(tmp, "bad"),
            "--",
            sys.executable,
            "train.py",
            "--model",
            model,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    check(
        p.returncode != 0 and "entry 0 (1 GPUs)" in p.stderr and "fits in 1.00 KiB" in p.stderr,
        f"nothing fits: exit {p.returncode}: {p.stderr.strip()[-300:]}",
    )
    check.finish()
