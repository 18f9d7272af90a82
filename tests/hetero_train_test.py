"""Integration tests of heterogeneous training (issue 14; docs/hetero.md).

Under pytest (issue 32 §4), ctests hetero_uneven, hetero_slowdown, hetero_rebalance,
hetero_rebalance_warm and hetero_rebalance_cluster, each one test function, TENPLEX_BIN
the CLI under test:

    python -m pytest tests/hetero_train_test.py::test_uneven

test_uneven             examples/gpt trains with tp_weights and dp_weights (GQA, SwiGLU,
                        untied, rope; tied embeddings with pp; zero=1): every step's
                        samples equal, and its loss within 1e-6 relative of, an even static
                        run of the same global batch
test_slowdown           --slowdown 1=3 leaves the losses bit for bit and makes rank 1's
                        rank_seconds about 3x rank 0's; bad --slowdown values exit 2; the
                        FlexTP-style offload (--flextp-straggler) gives the even run's losses
test_rebalance          `tenplex run --rebalance` with rank 1 slowed 3x: a rebalance event
                        (tp=2 -> uneven weights favouring rank 0) whose state move is
                        byte-exact (losses and samples equal a static even run within 1e-3);
                        with the measured cost and few steps left it keeps the split instead
test_rebalance_warm     the same with --warm: the workers park at the stop and train on at
                        the rebalanced split (no process started after the first segment's)
test_rebalance_cluster  the same with --cluster (2 store daemons, one device each): the
                        rebalance's transform moves exactly the cross-host lower bound of
                        the plan, losses and samples equal the static run

The even reference is the client itself in tp=1 (gpt_train_test.py checks that against
an independent single-process reference). The checkout is the repo fixture, the test's
directory the tmp fixture (tests/conftest.py); the soft checks are
elastic_run_testing.Checks (the test fails naming every failed check).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import pytest
from elastic_run_testing import Checks
from elastic_run_testing import run as run_schedule

from tenplex.runlog import read_run_log
from tenplex.testing import Daemon, write_cluster

_log = logging.getLogger(__name__)

Steps = dict[int, dict[str, Any]]
Events = list[dict[str, Any]]
TRAIN = ["--global-batch-size", "8", "--micro-batch-size", "2", "--seq-length", "32"]
LLAMA = [
    "--num-layers",
    "2",
    "--hidden-size",
    "64",
    "--num-attention-heads",
    "8",
    "--num-query-groups",
    "4",
    "--ffn-hidden-size",
    "96",
    "--vocab-size",
    "250",
    "--make-vocab-size-divisible-by",
    "16",
    "--position-embedding-type",
    "rope",
    "--swiglu",
    "--untie-embeddings-and-output-weights",
    "--normalization",
    "RMSNorm",
    "--disable-bias-linear",
]
TIED = [
    "--num-layers",
    "4",
    "--hidden-size",
    "32",
    "--num-attention-heads",
    "4",
    "--vocab-size",
    "200",
    "--make-vocab-size-divisible-by",
    "16",
    "--max-position-embeddings",
    "32",
]


@dataclasses.dataclass
class Hetero:
    """The CLI under test, the checkout and the test's directory: models, static
    launches of examples/gpt and `tenplex run`s."""

    tenplex: str
    repo: str
    tmp: str

    def gpt(self, script: str) -> str:
        return os.path.join(self.repo, "examples", "gpt", script)

    def model(self, name: str, args: list[str]) -> str:
        path = os.path.join(self.tmp, name + ".json")
        subprocess.run([self.tenplex, "model", "gpt", "-o", path] + args, check=True)
        return path

    def train(self, config: str, model: str, steps: int, tag: str, extra: Sequence[str] = ()) -> Steps:
        """launch.py's static run of `config`: its steps."""
        log = os.path.join(self.tmp, tag + ".jsonl")
        cmd = [
            sys.executable,
            self.gpt("launch.py"),
            "--config",
            config,
            "--timeout",
            "300",
            "--model",
            model,
            "--steps",
            str(steps),
            "--log",
            log,
            *TRAIN,
            *extra,
        ]
        p = subprocess.run(cmd, capture_output=True, text=True)
        assert p.returncode == 0, f"{config} ({tag}) failed with {p.returncode}:\n{p.stderr[-3000:]}"
        return read_run_log(log)[0]

    def run(
        self, name: str, schedule: list[dict[str, Any]], model: str, extra: Sequence[str] = ()
    ) -> tuple[Steps, Events]:
        """`tenplex run` of train.py on `schedule` (elastic_run_testing.run): its steps and
        events; a failed run fails the test with its output, after its worker logs."""
        try:
            log = run_schedule(self.tenplex, self.repo, self.tmp, name, schedule, model, extra=extra)[0]
        except AssertionError:
            log_worker_logs(os.path.join(self.tmp, name))
            raise
        return read_run_log(log)

    def train_py(self, *args: str) -> subprocess.CompletedProcess[str]:
        """examples/gpt/train.py run by itself (its argument checks)."""
        return subprocess.run([sys.executable, self.gpt("train.py"), *args], capture_output=True, text=True)

    def plan_stats(self, model: str, src: str, dst: str) -> dict[str, Any]:
        """`tenplex plan`'s stats of src -> dst, each device its own host ({} if it fails)."""
        p = subprocess.run(
            [self.tenplex, "plan", "--model", model, "--from", src, "--to", dst, "--gpus-per-host", "1", "--json"],
            capture_output=True,
            text=True,
        )
        stats: dict[str, Any] = json.loads(p.stdout)["stats"] if p.returncode == 0 else {}
        return stats


@pytest.fixture
def hetero(tenplex: str, repo: str, tmp: str) -> Hetero:
    return Hetero(tenplex, repo, tmp)


def tp_weights(config: str) -> list[int]:
    """The tp_weights of a config string."""
    return [int(x) for x in config.split("tp_weights=")[1].split(",")[0].split("+")]


def compare(check: Checks, got: Steps, base: Steps, tol: float, what: str) -> None:
    check(sorted(got) == sorted(base), f"{what}: steps {sorted(got)}")
    worst = 0.0
    for s in sorted(base):
        if s not in got:
            continue
        check(got[s]["samples"] == base[s]["samples"], f"{what}: step {s} samples")
        worst = max(worst, abs(got[s]["loss"] - base[s]["loss"]) / abs(base[s]["loss"]))
    check(worst <= tol, f"{what}: losses within {tol:g} relative of the even run (worst {worst:.2e})")


def log_worker_logs(work_dir: str, lines: int = 80) -> None:
    """Logs the end of each worker log of a run (a warm worker that did not park dumps
    its threads' stacks there, tenplex.warm.NOT_PARKED_DUMP_S after the abort)."""
    for f in sorted(os.listdir(work_dir)):
        if f.startswith("worker-"):
            with open(os.path.join(work_dir, f), errors="replace") as fh:
                _log.info("--- %s (last %d lines)\n%s", f, lines, "".join(fh.readlines()[-lines:]))


def test_uneven(hetero: Hetero) -> None:
    check = Checks()
    cases = [
        (
            "llama",
            LLAMA,
            ["tp=2,tp_weights=3+1", "tp=3,tp_weights=1+1+1", "tp=2,dp=2,tp_weights=1+2,dp_weights=3+1,zero=1"],
        ),
        (
            "tied",
            TIED,
            ["tp=2,pp=2,tp_weights=2+1", "pp=2,dp=2,dp_weights=1+3,zero=1,layers=3+1", "dp=3,dp_weights=2+1+1"],
        ),
    ]
    for name, args, configs in cases:
        model = hetero.model(name, args)
        base = hetero.train("tp=1", model, 3, name + "-even")
        for cfg in configs:
            got = hetero.train(cfg, model, 3, name + "-" + cfg.replace(",", "_").replace("=", ""))
            compare(check, got, base, 1e-6, f"{name} {cfg}")
    # A dp rank without samples is an error naming it, before any process group.
    model = hetero.model("small", TIED)
    p = hetero.train_py(
        "--config", "dp=2,dp_weights=15+1", "--model", model, "--world-size", "2", "--global-batch-size", "8"
    )
    check(p.returncode == 2 and "dp rank 1 gets no sample" in p.stderr, f"dp rank without samples: {p.stderr.strip()}")
    check.finish()


def test_slowdown(hetero: Hetero) -> None:
    check = Checks()
    model = hetero.model("llama", LLAMA)
    base = hetero.train("tp=2", model, 4, "even")
    slow = hetero.train("tp=2", model, 4, "slow", ["--slowdown", "1=3"])
    compare(check, slow, base, 0.0, "tp=2 with rank 1 slowed")
    flex = hetero.train("tp=2", model, 4, "flextp", ["--slowdown", "1=3", "--flextp-straggler", "1"])
    compare(check, flex, base, 1e-6, "tp=2 with the FlexTP-style offload of rank 1")
    for s in sorted(slow):
        rs = slow[s]["rank_seconds"]
        check(len(rs) == 2 and all(x > 0 for x in rs), f"step {s}: rank_seconds {rs}")
    ratios = sorted(slow[s]["rank_seconds"][1] / slow[s]["rank_seconds"][0] for s in sorted(slow)[1:])
    # 3x by construction of the sleep; the measured own compute of the two ranks differs
    # by noise on a loaded machine (a CI run saw ratios 3.5, 7.2, 7.3: the slowed rank's
    # compute and its late wake-ups stretch under load), hence the least ratio of the
    # steps and a wide band; a factor applied twice (9x) would still fail it.
    least = ratios[0]
    check(
        1.5 <= least <= 6.0,
        f"rank 1 / rank 0 compute, least of {[round(r, 2) for r in ratios]}: {least:.2f} (3x emulated)",
    )
    for bad in (["--slowdown", "1"], ["--slowdown", "1=0.5"], ["--slowdown", "5=2"], ["--slowdown", "x=2"]):
        p = hetero.train_py("--config", "tp=2", "--model", model, "--world-size", "2", *bad)
        check(p.returncode == 2 and "--slowdown" in p.stderr, f"{bad}: exit {p.returncode} {p.stderr.strip()}")
    check.finish()


def test_rebalance(hetero: Hetero) -> None:
    check = Checks()
    n = 8
    model = hetero.model("llama", LLAMA)
    base, _ = hetero.run("static", [{"step": 0, "config": "tp=2"}, {"step": n, "stop": True}], model)
    slow = [{"step": 0, "config": "tp=2", "slowdown": {"1": 3.0}}, {"step": n, "stop": True}]
    # The machine this runs on is shared: a worker start costs tens of seconds there,
    # more than a small model's steps can win back. --rebalance-cost 0 checks the
    # mechanism; the run after it checks that the measured cost is respected.
    got, events = hetero.run(
        "rebalance", slow, model, ["--rebalance", "--rebalance-window", "2", "--rebalance-cost", "0"]
    )
    reb = [e for e in events if e["event"] == "rebalance"]
    check(len(reb) >= 1, f"a rebalance event: {reb}")
    if reb:
        e = reb[0]
        check(e["from"] == "tp=2,pp=1,dp=1" and "tp_weights=" in e["to"], f"tp=2 -> {e['to']}")
        w = tp_weights(e["to"])
        check(len(w) == 2 and w[0] > w[1], f"the slow rank 1 gets less: {w}")
        for k in ("predicted_gain_s", "cost_s", "rank_seconds", "step"):
            check(k in e, f"rebalance event has {k}")
        check(
            len(e["rank_seconds"]) == 2 and e["rank_seconds"][1] > 1.5 * e["rank_seconds"][0],
            f"rank_seconds show rank 1 slow: {e['rank_seconds']}",
        )
        check(e["bytes_moved"] > 0, f"the state moved: {e['bytes_moved']} bytes")
        # The move's plan, each device its own host: it ships exactly the slices whose
        # owner changes (the cross-host lower bound).
        st = hetero.plan_stats(model, e["from"], e["to"])
        check(
            st.get("bytes_cross_host", -1) == st.get("cross_host_lower_bound", -2) > 0,
            f"plan {e['from']} -> {e['to']}: cross-host bytes {st.get('bytes_cross_host')} = lower bound "
            f"{st.get('cross_host_lower_bound')}",
        )
        # Steady speeds: one move, or a second one when the speed model fitted over both
        # splits (fixed + proportional part) corrects the first; never back to a split left.
        seen = [reb[0]["from"]] + [x["to"] for x in reb]
        check(
            len(reb) <= 2 and len(set(seen)) == len(seen),
            f"steady speeds: at most a correction, no oscillation ({' -> '.join(seen)})",
        )
    compare(check, got, base, 1e-3, "rebalanced run")
    configs = [got[s]["config"] for s in sorted(got)]
    check(configs[0] == "tp=2,pp=1,dp=1" and "tp_weights" in configs[-1], f"configs per step: {configs}")
    # Measured cost, and 1 step to go at the first check with a full window: the split
    # stays, and the log says why.
    short = [{"step": 0, "config": "tp=2", "slowdown": {"1": 3.0}}, {"step": 5, "stop": True}]
    _, events2 = hetero.run("measured", short, model, ["--rebalance", "--rebalance-window", "2"])
    check(not [e for e in events2 if e["event"] == "rebalance"], "measured cost, 1 step left: no rebalance")
    skipped = [e for e in events2 if e["event"] == "rebalance_skipped"]
    check(
        len(skipped) == 1
        and "does not exceed the reconfiguration cost" in skipped[0]["reason"]
        and skipped[0]["cost_s"] > skipped[0]["predicted_gain_s"] > 0,
        f"the skipped rebalance names the cost: {skipped}",
    )
    check.finish()


def test_rebalance_warm(hetero: Hetero) -> None:
    """--rebalance --warm: the rebalance stops the workers without ending them."""
    check = Checks()
    n = 8
    model = hetero.model("llama", LLAMA)
    base = hetero.train("tp=2", model, n, "static")
    slow = [{"step": 0, "config": "tp=2", "slowdown": {"1": 3.0}}, {"step": n, "stop": True}]
    got, events = hetero.run(
        "warm", slow, model, ["--warm", "--rebalance", "--rebalance-window", "2", "--rebalance-cost", "0"]
    )
    reb = [e for e in events if e["event"] == "rebalance"]
    check(len(reb) >= 1, f"a rebalance event: {reb}")
    for e in reb:
        w = tp_weights(e["to"])
        check(len(w) == 2 and w[0] > w[1], f"{e['from']} -> {e['to']}: the slow rank 1 gets less")
        check(
            e["bytes_moved"] > 0 and e["transform_seconds"] > 0,
            f"the state moved: {e['bytes_moved']} bytes in {e['transform_seconds']} s",
        )
    compare(check, got, base, 1e-3, "rebalanced --warm run")
    configs = [got[s]["config"] for s in sorted(got)]
    check(configs[0] == "tp=2,pp=1,dp=1" and "tp_weights" in configs[-1], f"configs per step: {configs}")
    # Every segment after the first ran in the first one's two processes: no worker
    # was started again (each start writes worker-seg<k>-rank<r>.log).
    work = os.path.join(hetero.tmp, "warm")
    logs = sorted(f for f in os.listdir(work) if f.startswith("worker-seg"))
    warm_only = len(logs) == 2 and all(f.startswith("worker-seg0") for f in logs)
    check(warm_only, f"worker starts: {logs}")
    if not warm_only:  # where the workers were when they did not park
        log_worker_logs(work)
    # Each rebalance is a planned stop: every rank stops at the same step boundary
    # (warm.stop_agreed) and none breaks off a collective (the failure abort's way);
    # a stop asked for during a segment's last step ends it normally instead.
    said, aborted = [], 0
    for f in logs:
        with open(os.path.join(work, f), errors="replace") as fh:
            text = fh.read()
        said.append(sorted(set(re.findall(r"segment stopped by the runner \(at step (\d+)\)", text))))
        aborted += text.count("aborted by the runner")
    check(
        all(s == said[0] for s in said) and 1 <= len(said[0]) <= len(reb) and aborted == 0,
        f"every rank stopped at the same steps, none aborted: {said}",
    )
    joins = [e for e in events if e["event"] == "warm_join"]
    check(
        len(joins) == 1 + len(reb) and all(j["step"] == e["step"] for j, e in zip(joins[1:], reb)),
        f"the workers re-joined at each rebalance: {[j['step'] for j in joins]}",
    )
    recs = [e for e in events if e["event"] == "reconfigure"]
    check(len(recs) == len(reb), f"one reconfiguration per rebalance: {recs}")
    check.finish()


def test_rebalance_cluster(hetero: Hetero) -> None:
    """--rebalance with the state in 2 store daemons (hosts of one device each)."""
    check = Checks()
    n = 6
    model = hetero.model("llama", LLAMA)
    base = hetero.train("tp=2", model, n, "static")
    daemons: list[Daemon] = []
    try:
        daemons = [Daemon(hetero.tenplex) for _ in range(2)]
        cluster = os.path.join(hetero.tmp, "cluster.json")
        write_cluster(cluster, daemons, 1)
        slow = [{"step": 0, "config": "tp=2", "slowdown": {"1": 3.0}}, {"step": n, "stop": True}]
        got, events = hetero.run(
            "rebalanced",
            slow,
            model,
            ["--cluster", cluster, "--rebalance", "--rebalance-window", "2", "--rebalance-cost", "0"],
        )
    finally:
        for d in daemons:
            d.stop()
    reb = [e for e in events if e["event"] == "rebalance"]
    check(len(reb) >= 1, f"a rebalance event: {reb}")
    for e in reb:
        w = tp_weights(e["to"])
        check(e["from"].startswith("tp=2") and len(w) == 2 and w[0] > w[1], f"{e['from']} -> {e['to']}")
        # Each device its own host: the transform ships exactly the slices whose owner
        # changes, the plan's cross-host lower bound (computed by `tenplex plan`).
        st = hetero.plan_stats(model, e["from"], e["to"])
        bound = st.get("cross_host_lower_bound", -1)
        check(
            bound > 0 and st.get("bytes_cross_host") == bound and e.get("cross_host_lower_bound") == bound,
            f"step {e['step']}: plan's cross-host bytes {st.get('bytes_cross_host')} = lower bound {bound} "
            f"(the run's plan: {e.get('cross_host_lower_bound')})",
        )
        check(
            e.get("bytes_cross_host") == bound,
            f"step {e['step']}: bytes fetched across hosts by the transform {e.get('bytes_cross_host')} = "
            f"lower bound {bound} (of {e['bytes_moved']} bytes written)",
        )
    compare(check, got, base, 1e-3, "rebalanced --cluster run")
    configs = [got[s]["config"] for s in sorted(got)]
    check(configs[0] == "tp=2,pp=1,dp=1" and "tp_weights" in configs[-1], f"configs per step: {configs}")
    check.finish()
