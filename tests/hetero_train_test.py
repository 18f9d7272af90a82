#!/usr/bin/env python3
"""Integration tests of heterogeneous training (issue 14; docs/hetero.md).

  hetero_train_test.py TENPLEX_BIN uneven     examples/gpt trains with tp_weights and
                                              dp_weights (GQA, SwiGLU, untied, rope; tied
                                              embeddings with pp; zero=1): every step's
                                              samples equal, and its loss within 1e-6
                                              relative of, an even static run of the same
                                              global batch
  hetero_train_test.py TENPLEX_BIN slowdown   --slowdown 1=3 leaves the losses bit for bit
                                              and makes rank 1's rank_seconds about 3x rank
                                              0's; bad --slowdown values exit 2; the
                                              FlexTP-style offload (--flextp-straggler)
                                              gives the even run's losses
  hetero_train_test.py TENPLEX_BIN rebalance  `tenplex run --rebalance` with rank 1 slowed
                                              3x: a rebalance event (tp=2 -> uneven weights
                                              favouring rank 0) whose state move is byte-exact
                                              (losses and samples equal a static even run
                                              within 1e-3); with the measured cost and few
                                              steps left it keeps the split instead
  hetero_train_test.py TENPLEX_BIN rebalance_warm
                                              the same with --warm: the workers park at the
                                              stop and train on at the rebalanced split (no
                                              process started after the first segment's)
  hetero_train_test.py TENPLEX_BIN rebalance_cluster
                                              the same with --cluster (2 store daemons, one
                                              device each): the rebalance's transform moves
                                              exactly the cross-host lower bound of the plan,
                                              losses and samples equal the static run

The even reference is the client itself in tp=1 (gpt_train_test.py checks that against
an independent single-process reference).
"""

import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from daemons import Daemon, write_cluster  # noqa: E402

from tenplex.runlog import read_run_log  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
GPT = os.path.join(ROOT, "examples", "gpt")
PY = sys.executable  # the project interpreter (.venv/bin/python) that runs this file
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


class Checks:
    def __init__(self):
        self.failures = []

    def __call__(self, cond, what):
        print(("ok: " if cond else "FAIL: ") + what, flush=True)
        if not cond:
            self.failures.append(what)

    def finish(self):
        print(f"{len(self.failures)} failed")
        sys.exit(1 if self.failures else 0)


def make_model(bin_, tmp, name, args):
    path = os.path.join(tmp, name + ".json")
    subprocess.run([bin_, "model", "gpt", "-o", path] + args, check=True)
    return path


def train(tmp, config, model, steps, tag, extra=()):
    log = os.path.join(tmp, tag + ".jsonl")
    cmd = (
        [
            PY,
            os.path.join(GPT, "launch.py"),
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
        ]
        + TRAIN
        + list(extra)
    )
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{config} ({tag}) failed with {p.returncode}:\n{p.stderr[-3000:]}")
    return read_run_log(log)[0]


def compare(check, got, base, tol, what):
    check(sorted(got) == sorted(base), f"{what}: steps {sorted(got)}")
    worst = 0.0
    for s in sorted(base):
        if s not in got:
            continue
        check(got[s]["samples"] == base[s]["samples"], f"{what}: step {s} samples")
        worst = max(worst, abs(got[s]["loss"] - base[s]["loss"]) / abs(base[s]["loss"]))
    check(worst <= tol, f"{what}: losses within {tol:g} relative of the even run (worst {worst:.2e})")


def uneven(bin_):
    check = Checks()
    with tempfile.TemporaryDirectory() as tmp:
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
            model = make_model(bin_, tmp, name, args)
            base = train(tmp, "tp=1", model, 3, name + "-even")
            for cfg in configs:
                got = train(tmp, cfg, model, 3, name + "-" + cfg.replace(",", "_").replace("=", ""))
                compare(check, got, base, 1e-6, f"{name} {cfg}")
        # A dp rank without samples is an error naming it, before any process group.
        model = make_model(bin_, tmp, "small", TIED)
        p = subprocess.run(
            [
                PY,
                os.path.join(GPT, "train.py"),
                "--config",
                "dp=2,dp_weights=15+1",
                "--model",
                model,
                "--world-size",
                "2",
                "--global-batch-size",
                "8",
            ],
            capture_output=True,
            text=True,
        )
        check(
            p.returncode == 2 and "dp rank 1 gets no sample" in p.stderr, f"dp rank without samples: {p.stderr.strip()}"
        )
    check.finish()


def slowdown(bin_):
    check = Checks()
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(bin_, tmp, "llama", LLAMA)
        base = train(tmp, "tp=2", model, 4, "even")
        slow = train(tmp, "tp=2", model, 4, "slow", ["--slowdown", "1=3"])
        compare(check, slow, base, 0.0, "tp=2 with rank 1 slowed")
        flex = train(tmp, "tp=2", model, 4, "flextp", ["--slowdown", "1=3", "--flextp-straggler", "1"])
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
            p = subprocess.run(
                [PY, os.path.join(GPT, "train.py"), "--config", "tp=2", "--model", model, "--world-size", "2"] + bad,
                capture_output=True,
                text=True,
            )
            check(p.returncode == 2 and "--slowdown" in p.stderr, f"{bad}: exit {p.returncode} {p.stderr.strip()}")
    check.finish()


def print_worker_logs(work_dir, lines=80):
    """Prints the end of each worker log of a run (a warm worker that did not park
    dumps its threads' stacks there, tenplex.warm.NOT_PARKED_DUMP_S after the abort)."""
    for f in sorted(os.listdir(work_dir)):
        if f.startswith("worker-"):
            with open(os.path.join(work_dir, f), errors="replace") as fh:
                print(f"--- {f} (last {lines} lines)\n" + "".join(fh.readlines()[-lines:]), flush=True)


def run(bin_, tmp, name, schedule, model, extra=()):
    sched = os.path.join(tmp, name + ".json")
    with open(sched, "w") as f:
        json.dump(schedule, f)
    log = os.path.join(tmp, name + ".jsonl")
    cmd = [
        bin_,
        "run",
        "--schedule",
        sched,
        "--log",
        log,
        "--work-dir",
        os.path.join(tmp, name),
        "--hang-seconds",
        "240",
    ] + list(extra)
    cmd += ["--", PY, os.path.join(GPT, "train.py"), "--model", model] + TRAIN
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    print(p.stdout)
    if p.returncode != 0:
        print_worker_logs(os.path.join(tmp, name))
        raise SystemExit(f"tenplex run {name} failed with {p.returncode}:\n{p.stderr[-3000:]}")
    steps, events = read_run_log(log)
    return steps, events, p.stderr


def rebalance(bin_):
    check = Checks()
    n = 8
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(bin_, tmp, "llama", LLAMA)
        base, _, _ = run(bin_, tmp, "static", [{"step": 0, "config": "tp=2"}, {"step": n, "stop": True}], model)
        slow = [{"step": 0, "config": "tp=2", "slowdown": {"1": 3.0}}, {"step": n, "stop": True}]
        # The machine this runs on is shared: a worker start costs tens of seconds there,
        # more than a small model's steps can win back. --rebalance-cost 0 checks the
        # mechanism; the run after it checks that the measured cost is respected.
        got, events, err = run(
            bin_, tmp, "rebalance", slow, model, ["--rebalance", "--rebalance-window", "2", "--rebalance-cost", "0"]
        )
        reb = [e for e in events if e["event"] == "rebalance"]
        check(len(reb) >= 1, f"a rebalance event: {reb}")
        if reb:
            e = reb[0]
            check(e["from"] == "tp=2,pp=1,dp=1" and "tp_weights=" in e["to"], f"tp=2 -> {e['to']}")
            w = [int(x) for x in e["to"].split("tp_weights=")[1].split(",")[0].split("+")]
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
            p = subprocess.run(
                [
                    bin_,
                    "plan",
                    "--model",
                    model,
                    "--from",
                    e["from"],
                    "--to",
                    e["to"],
                    "--gpus-per-host",
                    "1",
                    "--json",
                ],
                capture_output=True,
                text=True,
            )
            st = json.loads(p.stdout)["stats"] if p.returncode == 0 else {}
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
        _, events2, _ = run(bin_, tmp, "measured", short, model, ["--rebalance", "--rebalance-window", "2"])
        check(not [e for e in events2 if e["event"] == "rebalance"], "measured cost, 1 step left: no rebalance")
        skipped = [e for e in events2 if e["event"] == "rebalance_skipped"]
        check(
            len(skipped) == 1
            and "does not exceed the reconfiguration cost" in skipped[0]["reason"]
            and skipped[0]["cost_s"] > skipped[0]["predicted_gain_s"] > 0,
            f"the skipped rebalance names the cost: {skipped}",
        )
    check.finish()


def rebalance_warm(bin_):
    """--rebalance --warm: the rebalance stops the workers without ending them."""
    check = Checks()
    n = 8
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(bin_, tmp, "llama", LLAMA)
        base = train(tmp, "tp=2", model, n, "static")
        slow = [{"step": 0, "config": "tp=2", "slowdown": {"1": 3.0}}, {"step": n, "stop": True}]
        got, events, _ = run(
            bin_,
            tmp,
            "warm",
            slow,
            model,
            ["--warm", "--rebalance", "--rebalance-window", "2", "--rebalance-cost", "0"],
        )
        reb = [e for e in events if e["event"] == "rebalance"]
        check(len(reb) >= 1, f"a rebalance event: {reb}")
        for e in reb:
            w = [int(x) for x in e["to"].split("tp_weights=")[1].split(",")[0].split("+")]
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
        logs = sorted(f for f in os.listdir(os.path.join(tmp, "warm")) if f.startswith("worker-seg"))
        warm_only = len(logs) == 2 and all(f.startswith("worker-seg0") for f in logs)
        check(warm_only, f"worker starts: {logs}")
        if not warm_only:  # where the workers were when they did not park
            print_worker_logs(os.path.join(tmp, "warm"))
        # Each rebalance is a planned stop: every rank stops at the same step boundary
        # (warm.stop_agreed) and none breaks off a collective (the failure abort's way);
        # a stop asked for during a segment's last step ends it normally instead.
        said, aborted = [], 0
        for f in logs:
            with open(os.path.join(tmp, "warm", f), errors="replace") as fh:
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


def rebalance_cluster(bin_):
    """--rebalance with the state in 2 store daemons (hosts of one device each)."""
    check = Checks()
    n = 6
    daemons = []
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(bin_, tmp, "llama", LLAMA)
        base = train(tmp, "tp=2", model, n, "static")
        try:
            daemons = [Daemon(bin_) for _ in range(2)]
            cluster = os.path.join(tmp, "cluster.json")
            write_cluster(cluster, daemons, 1)
            slow = [{"step": 0, "config": "tp=2", "slowdown": {"1": 3.0}}, {"step": n, "stop": True}]
            got, events, _ = run(
                bin_,
                tmp,
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
            w = [int(x) for x in e["to"].split("tp_weights=")[1].split(",")[0].split("+")]
            check(e["from"].startswith("tp=2") and len(w) == 2 and w[0] > w[1], f"{e['from']} -> {e['to']}")
            # Each device its own host: the transform ships exactly the slices whose owner
            # changes, the plan's cross-host lower bound (computed by `tenplex plan`).
            p = subprocess.run(
                [
                    bin_,
                    "plan",
                    "--model",
                    model,
                    "--from",
                    e["from"],
                    "--to",
                    e["to"],
                    "--gpus-per-host",
                    "1",
                    "--json",
                ],
                capture_output=True,
                text=True,
            )
            st = json.loads(p.stdout)["stats"] if p.returncode == 0 else {}
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


def main():
    parts = {
        "uneven": uneven,
        "slowdown": slowdown,
        "rebalance": rebalance,
        "rebalance_warm": rebalance_warm,
        "rebalance_cluster": rebalance_cluster,
    }
    if len(sys.argv) != 3 or sys.argv[2] not in parts:
        raise SystemExit(__doc__)
    parts[sys.argv[2]](sys.argv[1])


if __name__ == "__main__":
    main()
