"""deploy/slurm/ on a real Slurm cluster: a job grows by a second allocation, loses a
node, finishes, and every step matches a static run.

Under pytest (issue 32 §4), ctest slurm, TENPLEX_BIN the CLI under test:

    python -m pytest tests/slurm_test.py::test_slurm

A Slurm cluster of 3 nodes on this machine (tests/slurm_cluster.py: munged, slurmctld,
one slurmd per node, each node in its own network, UTS and mount namespace on a bridge;
as root; the test is skipped where that is unavailable: the cluster's SystemExit(77)).
In a fresh HOME and job folder, as docs/deploy.md tells users: the token file, gpt.json and policy.json, then

    MIN_NODES=2 MAX_NODES=3 NPROC=2 TRAIN_ARGS="--job gpt --model gpt.json ..." \
        sbatch --nodes=2 $REPO/deploy/slurm/tenplex-torchrun.sbatch

(node0 and node1: tp=2,pp=2 on 4 ranks). Once it has trained a few steps, a node joins
as a second job, as the sbatch script's header says:

    RDZV_ENDPOINT=node0:29400 RDZV_ID=<first job> MIN_NODES=2 MAX_NODES=3 ... sbatch --nodes=1 ...

(node2: the agents restart their workers, which transform the state to tp=2,dp=3 on 6
ranks). After a commit there, node1 is killed: its slurmd and every process in its
namespace (daemon, agent, workers, slurmstepd). The survivors go on as tp=2,pp=2 from the
last commit and finish. Checked: both jobs end (Slurm's states and exit codes, their
stdout files), the worlds of the step log are 4, 6, 4, every step's loss is within 1e-3 of
a static tp=1 run with the same samples, and no process is left in any namespace.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Callable

import pytest
from elastic_run_testing import Checks, small_model
from slurm_cluster import SlurmCluster
from torchrun_elastic_test import POLICY, TRAIN_ARGS, check_replanned, check_steps_and_worlds, free_port, read_log

from tenplex.testing import Unavailable

_log = logging.getLogger(__name__)
PY = sys.executable
STEPS = 30
COMMIT_EVERY = 2
ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING")


def wait_for(what: str, pred: Callable[[], bool], timeout: float, cluster: SlurmCluster, jobs: list[int]) -> bool:
    """Polls pred() until true; False (with the reason printed) on a timeout or a job that ended early."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        for j in jobs:
            state = cluster.job(j)["JobState"]
            if state not in ACTIVE:
                _log.error("FAIL: job %s ended (%s) while waiting for %s", j, state, what)
                return False
        time.sleep(0.5)
    _log.error("FAIL: timed out (%s s) waiting for %s", timeout, what)
    return False


def prepare(tenplex: str, tmp: str) -> tuple[str, str]:
    """A fresh HOME with the token file and a job folder with gpt.json and policy.json (docs/deploy.md)."""
    home, jobdir = os.path.join(tmp, "home"), os.path.join(tmp, "job")
    os.makedirs(jobdir)
    subprocess.run(
        [
            "bash",
            "-c",
            "mkdir -p ~/.tenplex && chmod 700 ~/.tenplex && "
            "(umask 077 && head -c 32 /dev/urandom | base64 > ~/.tenplex/token)",
        ],
        env=dict(os.environ, HOME=home),
        check=True,
    )
    small_model(tenplex, jobdir, "gpt.json")
    with open(os.path.join(jobdir, "policy.json"), "w") as f:
        json.dump(POLICY, f)
    return home, jobdir


def static_run(repo: str, jobdir: str) -> str:
    log = os.path.join(jobdir, "static.jsonl")
    t0 = time.time()
    subprocess.run(
        [
            PY,
            os.path.join(repo, "examples/gpt/train.py"),
            "--config",
            "tp=1",
            "--model",
            os.path.join(jobdir, "gpt.json"),
            "--steps",
            str(STEPS),
            "--log",
            log,
            "--master-port",
            str(free_port()),
            *TRAIN_ARGS,
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    _log.info("static run: %.1f s", time.time() - t0)
    return log


def committed_on(log: str, world: int) -> bool:
    _, events = read_log(log)
    starts = [i for i, e in enumerate(events) if e["event"] == "elastic_start" and e["world_size"] == world]
    return bool(starts) and any(e["event"] == "commit" for e in events[starts[0] :])


def scenario(
    cluster: SlurmCluster, check: Checks, tenplex: str, repo: str, home: str, jobdir: str
) -> tuple[list[int], bool]:
    """The two jobs, the join and the kill; the job ids (empty if none started) and whether all happened."""
    sbatch = os.path.join(repo, "deploy/slurm/tenplex-torchrun.sbatch")
    args = (
        f"--job gpt --model gpt.json --steps {STEPS} --commit-every {COMMIT_EVERY} --step-log steps.jsonl "
        f"--min-step-seconds 0.4 --timeout 60 " + " ".join(TRAIN_ARGS)
    )
    env = cluster.env(
        HOME=home,
        TENPLEX_REPO=repo,
        TENPLEX=tenplex,
        PYTHON=PY,
        MIN_NODES="2",
        MAX_NODES="3",
        NPROC="2",
        LAST_CALL="2",
        KEEP_ALIVE_INTERVAL="2",
        OMP_NUM_THREADS="1",
        TRAIN_ARGS=args,
    )
    log = os.path.join(jobdir, "steps.jsonl")
    t0 = time.time()
    first = cluster.sbatch(["--nodes=2", sbatch], env, jobdir)
    jobs = [first]
    _log.info("job %s submitted", first)
    if not wait_for("step 2 on 2 nodes", lambda: any(s["step"] >= 2 for s in read_log(log)[0]), 120, cluster, jobs):
        return jobs, False
    _log.info("2 nodes at step 2 after %.1f s; a third joins", time.time() - t0)
    join_env = dict(env, RDZV_ENDPOINT="node0:29400", RDZV_ID=str(first))
    jobs.append(cluster.sbatch(["--nodes=1", sbatch], join_env, jobdir))
    _log.info("job %s submitted", jobs[1])
    if not wait_for("a commit on 3 nodes", lambda: committed_on(log, 6), 120, cluster, jobs):
        return jobs, False
    _log.info("committed on 3 nodes after %.1f s; killing node1", time.time() - t0)
    check(
        cluster.job(first)["NodeList"] == "node[0-1]" and cluster.job(jobs[1])["NodeList"] == "node2",
        "the first job runs on node0 and node1, the joining one on node2",
    )
    cluster.kill_node(1)
    t_kill = time.time()
    ok = wait_for(
        "both jobs to end", lambda: all(cluster.job(j)["JobState"] not in ACTIVE for j in jobs), 120, cluster, []
    )
    _log.info("jobs ended %.1f s after the kill; elastic run: %.1f s", time.time() - t_kill, time.time() - t0)
    after = [e for e in read_log(log)[1] if e["event"] == "elastic_start" and e.get("time", 0) > t_kill]
    if after:  # keep-alive (KEEP_ALIVE_INTERVAL x 3) + restart + transform
        _log.info("restored on %d ranks %.1f s after the kill", after[0]["world_size"], after[0]["time"] - t_kill)
    state = cluster.nodes().get("node1", "")
    check(state.startswith("down"), f"Slurm marked node1 down: {state}")
    return jobs, ok


def check_jobs(cluster: SlurmCluster, check: Checks, jobs: list[int], jobdir: str, ok: bool) -> None:
    for j in jobs:
        info = cluster.job(j)
        out_file = info.get("StdOut", os.path.join(jobdir, f"slurm-{j}.out"))
        with open(out_file, errors="replace") as f:
            out = f.read()
        _log.info(
            f"---- job {j}: {info['JobState']} exit {info['ExitCode']} on {info['NodeList']}; "
            f"{out_file}{':' if not ok else ', last lines:'}\n" + "".join(out.splitlines(True)[-25 if ok else 0 :])
        )
        check(
            info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0",
            f"job {j} completed with exit code 0:0: {info['JobState']} {info['ExitCode']}",
        )
        check(
            not any(m in out for m in ("node.sh: error", "node.sh: the job stopped", "node.sh: torchrun exited")),
            f"job {j}'s stdout names no node.sh failure",
        )
        if j == jobs[0]:
            check(
                "srun: error: Node failure on node1" in out and "Force Terminated" not in out,
                "the first job's srun saw node1 fail and kept the step on node0",
            )


@pytest.fixture
def sigterm_exits() -> Iterator[None]:
    """ctest's timeout (SIGTERM): stop the cluster (finally) rather than leave its daemons behind."""
    old = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def start_cluster(tmp: str) -> SlurmCluster:
    """3 nodes; the test is skipped where SlurmCluster cannot make them (its Unavailable says why)."""
    try:
        return SlurmCluster(tmp, count=3, slurmd_timeout=10)
    except Unavailable as e:
        pytest.skip(e.why)


def test_slurm(tenplex: str, repo: str, tmp: str, sigterm_exits: None) -> None:
    check = Checks()
    home, jobdir = prepare(tenplex, tmp)
    static_log = static_run(repo, jobdir)
    t0 = time.time()
    cluster = start_cluster(tmp)
    _log.info("Slurm cluster up in %.1f s: %s", time.time() - t0, cluster.nodes())
    ok, jobs = False, []
    try:
        jobs, ok = scenario(cluster, check, tenplex, repo, home, jobdir)
        check(ok, "the scripted scale-up and failure happened and both jobs ended")
        check_jobs(cluster, check, jobs, jobdir, ok)
    finally:
        if not ok:
            for n in ("slurmctld", *cluster.names):
                _log.info("%s", cluster.tail(n))
        cluster.close()
    node1_url = f"http://{cluster.net.addr(1)}:7480"
    left = cluster.left
    check(not left, f"no process left in the namespaces or of the daemons: {left}")
    log = os.path.join(jobdir, "steps.jsonl")
    _, starts = check_steps_and_worlds(check, static_log, log, STEPS)
    if [e["world_size"] for e in starts] == [4, 6, 4]:
        up, down = starts[1], starts[2]
        check(up["transformed"] and up["config"] == "tp=2,pp=1,dp=3", f"scale-up to tp=2,dp=3: {up}")
        check_replanned(check, down, node1_url, "after the kill: node1's daemon lost, re-planned")
    check.finish()
