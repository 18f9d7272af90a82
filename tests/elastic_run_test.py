"""End to end: an elastic schedule (tensor and pipeline changes, a killed worker) gives the
same samples and losses, step by step, as a static run of the same steps.

Under pytest (issue 32 §4), one ctest per test, TENPLEX_BIN the CLI under test:

    TENPLEX_BIN=build/bin/tenplex python -m pytest tests/elastic_run_test.py::test_NAME

  test_elastic        (ctest elastic_run) the schedule in the embedded store
  test_cluster        (elastic_run_cluster) the elastic run keeps its state in 2 store
                      daemons (1 GPU per host), so every reconfiguration is a distributed
                      transform over UCX between them, committing every step; the static
                      run uses the embedded store
  test_commits        (elastic_run_commits) the workers also commit their state every step
                      while they train on, so the killed worker costs at most the steps since
                      the last commit, and the checks include the commits and the recovery
  test_lose_host      (elastic_run_lose_host) the job runs as tp=2,dp=2 on 2 daemons x 2
                      GPUs, committing every step, host 1 (its daemon and its workers) is
                      killed in step 3, and the job goes on as tp=2 on host 0 from the
                      data-parallel replica there: same samples and losses as the static
                      run, the daemon gone; tp=4 (no replica) then fails with a clear error
  test_resume         (elastic_run_resume) a run stops at step 3 with its state in a
                      --shm-dir, and a second `tenplex run` with the same --shm-dir and
                      --job continues from that commit in another config: steps 3-5 have
                      the static run's samples and losses, the log keeps the first run's lines
  test_resume_cluster (elastic_run_resume_cluster) the same with the state in 2 store daemons
  test_presize        (run_presize; 2 daemons, 1 GPU each, committing every step) the run
                      makes the next config's new tensors ahead in the daemons' page pools
                      while the old config trains (StateBackend::PresizeAhead): the joining
                      host's transform takes exactly its pooled-size tensors from the pool
                      without zeroing them (its tenplex_store_pool_clean_reused_bytes), same
                      losses; with --no-presize nothing is pre-sized
  test_warm           (elastic_run_warm) the elastic run keeps its workers alive across the
                      changes and the kill (`tenplex run --warm`): the same checks, and only
                      the killed rank's replacement starts a new process (ahead, as a spare)
  test_warm_commits   (elastic_run_warm_commits) --warm, committing every step
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

import pytest

# The fixtures (the other run tests import them from here too).
from elastic_run_testing import REPO, Checks, check_steps, run, small_model, steps_of, train_command

from tenplex.testing import Daemon, write_cluster

__all__ = ["Checks", "check_steps", "run", "small_model", "steps_of"]

_log = logging.getLogger(__name__)


@pytest.fixture
def shm() -> Iterator[str]:
    """A --shm-dir under /dev/shm for the resume tests, removed afterwards."""
    d = tempfile.mkdtemp(prefix="tenplex-resume-test-", dir="/dev/shm")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_elastic(tenplex: str, tmp: str) -> None:
    elastic(tenplex, tmp, use_cluster=False, commit_every=0, warm=False)


def test_cluster(tenplex: str, tmp: str) -> None:
    elastic(tenplex, tmp, use_cluster=True, commit_every=1, warm=False)


def test_commits(tenplex: str, tmp: str) -> None:
    elastic(tenplex, tmp, use_cluster=False, commit_every=1, warm=False)


def test_warm(tenplex: str, tmp: str) -> None:
    elastic(tenplex, tmp, use_cluster=False, commit_every=0, warm=True)


def test_warm_commits(tenplex: str, tmp: str) -> None:
    elastic(tenplex, tmp, use_cluster=False, commit_every=1, warm=True)


def test_lose_host(tenplex: str, tmp: str) -> None:
    lose_host(tenplex, tmp, commit_every=1)


def test_resume(tenplex: str, tmp: str, shm: str) -> None:
    resume(tenplex, tmp, shm, use_cluster=False)


def test_resume_cluster(tenplex: str, tmp: str, shm: str) -> None:
    resume(tenplex, tmp, shm, use_cluster=True)


def test_presize(tenplex: str, tmp: str) -> None:
    presize(tenplex, tmp)


def elastic(tenplex: str, tmp: str, use_cluster: bool, commit_every: int, warm: bool) -> None:
    """tp=2 -> pp=2 -> dp=2,zero=1 with rank 1 killed in step 3, against a static tp=1 run."""
    repo = REPO
    check = Checks()
    daemons: list[Daemon] = []
    cluster = None
    if use_cluster:
        daemons = [Daemon(tenplex) for _ in range(2)]
        cluster = os.path.join(tmp, "cluster.json")
        write_cluster(cluster, daemons, 1)
    model = small_model(
        tenplex,
        tmp,
        vocab=200,
        extra=("--num-query-groups", "2", "--swiglu", "--make-vocab-size-divisible-by", "16"),
    )
    n = 6
    static_log, _ = run(tenplex, repo, tmp, "static", [{"step": 0, "config": "tp=1"}, {"step": n, "stop": True}], model)
    elastic = [
        {"step": 0, "config": "tp=2"},
        {"step": 2, "config": "pp=2"},
        {"step": 4, "config": "dp=2,zero=1", "kill_ranks": [1]},
        {"step": n, "stop": True},
    ]
    try:
        log, out = run(
            tenplex,
            repo,
            tmp,
            "elastic",
            elastic,
            model,
            baseline=static_log,
            cluster=cluster,
            commit_every=commit_every,
            warm=warm,
        )
    finally:
        for d in daemons:
            d.stop()
    base, _ = steps_of(static_log)
    got, events = steps_of(log)
    check(sorted(got) == list(range(n)), f"every step logged: {sorted(got)}")
    check(sorted(base) == list(range(n)), "static run logged every step")
    for s in range(n):
        if s not in got or s not in base:
            continue
        check(got[s]["samples"] == base[s]["samples"], f"step {s}: same samples")
        rel = abs(got[s]["loss"] - base[s]["loss"]) / abs(base[s]["loss"])
        check(rel <= 1e-3, f"step {s}: loss {got[s]['loss']:.6f} vs static {base[s]['loss']:.6f} (rel {rel:.2e})")
    fails = [e for e in events if e["event"] == "failure"]
    configs = {got[s]["config"] for s in got}
    want_cfgs = {"tp=2,pp=1,dp=1", "tp=1,pp=1,dp=2,zero=1"}
    if fails and fails[0]["rerun_from"] > 2:
        want_cfgs.add("tp=1,pp=2,dp=1")  # step 2 was committed before the kill: not re-run
    check(configs == want_cfgs, f"final configs per step: {sorted(configs)}")
    check(len(fails) == 1 and fails[0]["killed_ranks"] == [1], f"one failure event for rank 1: {fails}")
    reconf = [e for e in events if e["event"] == "reconfigure"]
    check(len(reconf) == 2 and all(e["bytes_moved"] > 0 for e in reconf), f"two reconfigurations: {reconf}")
    check("largest loss deviation" in out, "summary table compares with the static run")
    recovered = [e for e in events if e["event"] == "recovered"]
    check(
        len(recovered) == 1 and recovered[0]["step"] == 3 and recovered[0]["seconds"] > 0,
        f"one recovery, back at the killed step 3: {recovered}",
    )
    commits = sorted(e["step"] for e in events if e["event"] == "commit")
    if commit_every:
        # Segments [0,2) [2,4) (killed in step 3) [3,4) again [4,6): the periodic
        # commits inside them, and each segment's end.
        f = fails[0] if fails else {}
        lost = f.get("during_step", 0) - f.get("rerun_from", 0)
        check(
            f.get("segment_start") == 2 and 0 <= lost <= commit_every,
            f"the failure re-runs only the steps since the last periodic commit: {f}",
        )
        after = [e for e in reconf if e["after_failure"]]
        check(
            len(after) == 1 and after[0]["lost_steps"] == lost and after[0]["step"] == f.get("rerun_from"),
            f"the reconfiguration after the failure starts at the commit: {after}",
        )
        want = {1, 2, 3, 4, 5, 6} if commit_every == 1 else {2, 4, 6}
        check(want <= set(commits), f"commit events at {sorted(want)}: {commits}")
        check(recovered and recovered[0]["lost_steps"] == lost, "recovery counts the same lost steps")
    else:
        check(
            fails and fails[0]["rerun_from"] == fails[0]["segment_start"] == 2,
            f"without periodic commits the failed segment re-runs from its start: {fails}",
        )
    if warm:
        # Processes started: the 2 of tp=2, which go on as pp=2; rank 1 is killed, rank 0
        # lives on as rank 0 of dp=2, and its rank 1 is a spare started ahead while pp=2
        # trained (worker id 2).
        logs = sorted(f for f in os.listdir(os.path.join(tmp, "elastic")) if f.startswith("worker-"))
        check(
            logs == ["worker-seg0-rank0.log", "worker-seg0-rank1.log", "worker-spare2.log"],
            f"--warm: only the killed rank's replacement started a new process, ahead: {logs}",
        )
        with open(os.path.join(tmp, "elastic", "worker-seg0-rank0.log")) as f:
            text = f.read()
        check(
            all(f'"config": "{c}"' in text for c in ("tp=2,pp=1,dp=1", "tp=1,pp=2,dp=1", "tp=1,pp=1,dp=2,zero=1")),
            "--warm: rank 0's one process trained in all three configs",
        )
    check.finish()


def lose_host(tenplex: str, tmp: str, commit_every: int) -> None:
    repo = REPO
    check = Checks()
    daemons = [Daemon(tenplex) for _ in range(2)]
    try:
        cluster = os.path.join(tmp, "cluster.json")
        write_cluster(cluster, daemons, 2)
        model = small_model(tenplex, tmp)
        n = 5
        static_log, _ = run(
            tenplex, repo, tmp, "static", [{"step": 0, "config": "tp=1"}, {"step": n, "stop": True}], model
        )
        sched = [
            {"step": 0, "config": "tp=2,dp=2"},
            {"step": 4, "config": "tp=2", "kill_hosts": [1]},
            {"step": n, "stop": True},
        ]
        log, out = run(
            tenplex,
            repo,
            tmp,
            "lose-host",
            sched,
            model,
            baseline=static_log,
            cluster=cluster,
            commit_every=commit_every,
        )
        check(daemons[1].proc.poll() is not None, "the daemon of host 1 was killed")
        check(daemons[0].proc.poll() is None, "the daemon of host 0 still runs")
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
        fails = [e for e in events if e["event"] == "failure"]
        check(
            len(fails) == 1 and fails[0]["lost_hosts"] == [daemons[1].url] and fails[0]["killed_ranks"] == [2, 3],
            f"one failure: host 1 and its ranks 2, 3: {fails}",
        )
        reconf = [e for e in events if e["event"] == "reconfigure"]
        check(
            len(reconf) == 1 and reconf[0]["after_failure"] and reconf[0]["to"] == "tp=2,pp=1,dp=1",
            f"recovered as tp=2 from the replica on host 0: {reconf}",
        )
        check(any(e["event"] == "recovered" and e["step"] == 3 for e in events), "recovered event at step 3")
        if commit_every:
            check(fails and fails[0]["rerun_from"] >= 3 - commit_every, f"re-runs at most {commit_every} step(s)")
        # The final state lives on host 0 only.
        j = daemons[0].get("/v1/jobs/train")
        check((j.get("current") or 0) > 0, f"host 0 holds the committed state (version {j.get('current')})")
    finally:
        for d in daemons:
            d.stop()
    # tp=4 over both hosts has no replica: losing host 1 loses half of every shard,
    # and the run must stop with an error that says so, not train on zeros.
    daemons = [Daemon(tenplex) for _ in range(2)]
    try:
        write_cluster(cluster, daemons, 2)
        unrecoverable = os.path.join(tmp, "unrecoverable.json")
        with open(unrecoverable, "w") as f:
            json.dump(
                [
                    {"step": 0, "config": "tp=4"},
                    {"step": 3, "config": "tp=2", "kill_hosts": [1]},
                    {"step": 4, "stop": True},
                ],
                f,
            )
        p = subprocess.run(
            [
                tenplex,
                "run",
                "--schedule",
                unrecoverable,
                "--log",
                os.path.join(tmp, "u.jsonl"),
                "--work-dir",
                os.path.join(tmp, "u"),
                "--cluster",
                cluster,
                "--commit-every",
                "1",
                "--hang-seconds",
                "240",
                "--",
                *train_command(model, repo),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        _log.info("%s", p.stderr[-600:])
        check(
            p.returncode != 0 and "lost" in p.stderr,
            f"losing the only copy of state fails with an error naming it (exit {p.returncode})",
        )
    finally:
        for d in daemons:
            d.stop()
    check.finish()


def resume(tenplex: str, tmp: str, shm: str, use_cluster: bool) -> None:
    repo = REPO
    check = Checks()
    daemons: list[Daemon] = []
    h = subprocess.run([tenplex, "run", "--help"], capture_output=True, text=True).stdout
    check("since the last commit" in h, "run --help: the --commit-every text is complete")
    where = ["--shm-dir", shm, "--job", "j"]
    if use_cluster:  # the state in 2 store daemons (1 GPU each) instead
        daemons = [Daemon(tenplex) for _ in range(2)]
        write_cluster(os.path.join(tmp, "cluster.json"), daemons, 1)
        where = ["--cluster", os.path.join(tmp, "cluster.json"), "--job", "j"]
    try:
        model = small_model(tenplex, tmp)
        n = 6
        static_log, out, _ = run(
            tenplex,
            repo,
            tmp,
            "static",
            [{"step": 0, "config": "tp=1"}, {"step": n, "stop": True}],
            model,
            extra=["--json"],
        )
        # --json: the summary as one object; its steps are the workers' log lines.
        summary = json.loads(out)
        logged, _ = steps_of(static_log)
        check(
            [(x["step"], x["loss"], x["config"], x["samples"]) for x in summary["steps"]]
            == [(s, logged[s]["loss"], logged[s]["config"], logged[s]["samples"]) for s in range(n)],
            f"run --json steps are the logged steps: {summary['steps']}",
        )
        check(
            summary["reconfigurations"] == [] and summary["resumed_version"] is None and summary["seconds"] > 0,
            f"run --json: no reconfiguration, no resume: {summary}",
        )
        log = os.path.join(tmp, "job.jsonl")
        _, _, err1 = run(
            tenplex,
            repo,
            tmp,
            "first",
            [{"step": 0, "config": "tp=2"}, {"step": 3, "stop": True}],
            model,
            extra=where,
            log=log,
        )
        check("continuing" not in err1, "the first run starts the job")
        sched = [{"step": 0, "config": "tp=2"}, {"step": 2, "config": "pp=2"}, {"step": n, "stop": True}]
        _, out, err = run(tenplex, repo, tmp, "second", sched, model, baseline=static_log, extra=where, log=log)
        _log.info("%s", err)
        check(
            "continuing job 'j' from its committed version" in err and "step 3, 24 samples consumed" in err,
            "the second run says it continues from the committed step 3",
        )
        check("continued from version" in out, "the summary table says so too")
        with open(log) as f:
            lines = [json.loads(x) for x in f]
        first = [x["step"] for x in lines[:3]]
        check(
            first == [0, 1, 2] and all(x.get("config") == "tp=2,pp=1,dp=1" for x in lines[:3]),
            f"the log keeps the first run's steps: {first}",
        )
        base, _ = steps_of(static_log)
        got, events = steps_of(log)
        check(sorted(got) == list(range(n)), f"every step logged once or more: {sorted(got)}")
        check(
            [s for s in range(n) if sum(1 for x in lines if x.get("step") == s and "event" not in x) != 1] == [],
            "no step ran twice",
        )
        check_steps(check, got, base, n)
        check(
            all(got[s]["config"] == "tp=1,pp=2,dp=1" for s in range(3, n) if s in got),
            "steps 3-5 ran in the schedule's config for step 3 (pp=2)",
        )
        check(any(e["event"] == "resume" and e["step"] == 3 for e in events), "a resume event at step 3")
        _, _, err3 = run(tenplex, repo, tmp, "third", sched, model, extra=where, log=log)
        check("nothing to run" in err3, f"a finished job has nothing to run: {err3.strip()}")
    finally:
        shutil.rmtree(shm, ignore_errors=True)
        for d in daemons:
            d.stop()
    check.finish()


POOL_MIN_BYTES = 256 << 10  # store.h kPoolMinBytes: smaller tensors are never pooled
DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "U8": 1, "I8": 1}


def poolable_bytes(daemon: Daemon, job: str) -> int:
    """Bytes of the tensors of job's committed version on daemon that are large enough to
    pool (the layout oracle of what a pre-sized transform takes from the pool)."""
    v = daemon.get("/v1/jobs/" + job)["current"]
    total = 0
    for t in daemon.get("/v1/list/jobs/%s/%d/?detail=1" % (job, v)):
        n = DTYPE_BYTES[t["dtype"].upper()]
        for d in t["shape"]:
            n *= d
        total += n if n >= POOL_MIN_BYTES else 0
    return total


def presize(tenplex: str, tmp: str) -> None:
    repo = REPO
    check = Checks()
    daemons = [Daemon(tenplex) for _ in range(2)]
    cluster = os.path.join(tmp, "cluster.json")
    write_cluster(cluster, daemons, 1)
    try:
        # Embeddings of 2048 x 128 fp32 (512 KiB per tp=2 slice, with Adam's states):
        # large enough to pool; the layers' tensors are not.
        model = small_model(tenplex, tmp, hidden=128, vocab=2048)
        n = 4
        static_log, _ = run(
            tenplex, repo, tmp, "static", [{"step": 0, "config": "tp=1"}, {"step": n, "stop": True}], model
        )
        sched = [{"step": 0, "config": "tp=1"}, {"step": 2, "config": "tp=2"}, {"step": n, "stop": True}]
        clean = [d.metric("tenplex_store_pool_clean_reused_bytes") for d in daemons]
        log, out, err = run(
            tenplex,
            repo,
            tmp,
            "presized",
            sched,
            model,
            baseline=static_log,
            cluster=cluster,
            commit_every=1,
            extra=["--json", "--job", "p"],
        )
        r = json.loads(out)["reconfigurations"]
        check(
            len(r) == 1
            and r[0]["presize_poolable_bytes"] > 0
            and r[0]["presize_pooled_bytes"] == r[0]["presize_poolable_bytes"]
            and r[0]["presize_seconds"] > 0,
            f"the reconfiguration was pre-sized ahead, every poolable byte pooled: {r}",
        )
        got, _ = steps_of(log)
        base, _ = steps_of(static_log)
        check(sorted(got) == list(range(n)), f"every step logged: {sorted(got)}")
        check_steps(check, got, base, n)
        after = [d.metric("tenplex_store_pool_clean_reused_bytes") for d in daemons]
        # Host 1 held nothing of the job: every one of its new tensors large enough
        # to pool came out of the pre-sized pool, unzeroed.
        want = poolable_bytes(daemons[1], "p")
        check(
            want > 0 and after[1] - clean[1] == want,
            f"host 1 took its {want} poolable bytes clean from the pool: {after[1] - clean[1]}",
        )
        check(after[0] - clean[0] > 0, f"host 0 took pre-sized files too: {after[0] - clean[0]}")
        check("pre-sizing" not in err, "no pre-sizing failure reported")

        log2, out2, _ = run(
            tenplex,
            repo,
            tmp,
            "plain",
            sched,
            model,
            baseline=static_log,
            cluster=cluster,
            commit_every=1,
            extra=["--json", "--job", "q", "--no-presize"],
        )
        r2 = json.loads(out2)["reconfigurations"]
        check(
            len(r2) == 1 and r2[0]["presize_poolable_bytes"] == 0 and r2[0]["presize_pooled_bytes"] == 0,
            f"--no-presize: nothing pre-sized: {r2}",
        )
        check(
            [d.metric("tenplex_store_pool_clean_reused_bytes") for d in daemons] == after,
            "--no-presize: no clean pool file taken",
        )
        got2, _ = steps_of(log2)
        check_steps(check, got2, base, n)
    finally:
        for d in daemons:
            d.stop()
    check.finish()
