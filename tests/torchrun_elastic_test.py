"""End to end under torchrun: hosts join and die, the job changes TP/PP/DP, and every step
matches a static run.

Under pytest (issue 32 §4), TENPLEX_BIN the CLI under test:

    python -m pytest tests/torchrun_elastic_test.py::test_loopback   (ctest torchrun_elastic)
    python -m pytest tests/torchrun_elastic_test.py::test_netns      (ctest torchrun_elastic_netns)

Three "hosts" on 127.0.0.1 (different ports): each one store daemon (`tenplex store
serve`) and one torchrun agent (`torchrun`, i.e. `python -m torch.distributed.run`, nproc 2, c10d rendezvous
hosted by host 0's agent, --nnodes=2:3) running `train.py --elastic` with the policy
{"4": "tp=2,pp=2", "6": "tp=2,dp=3"} and a commit every 2 steps. Hosts 0 and 1 start
(tp=2,pp=2); at step 3 host 2 joins: the agents stop their workers (SIGTERM: a commit
at the next step boundary), rendezvous with 3 hosts and the new workers transform the
state onto 6 ranks (tp=2,dp=3). After a commit there, every process of host 1 (its
daemon, its agent, its workers) is SIGKILLed: the survivors fail, their agents restart
them, and they go on as tp=2,pp=2 from the last commit, host 1's ranks re-placed from
the data-parallel replicas on hosts 0 and 2. The job finishes (both agents exit 0) and
every step's loss (the last line of a re-run step counts) matches a static tp=1 run
within 1e-3 relative, with the same samples.

test_netns: each host runs in its own network namespace (veth pairs on a bridge, as
root; skipped, pytest's skip, where unavailable): the daemons listen on the namespace's
address with a bearer token, the rendezvous, gloo and the transform's UCX traffic cross
the bridge.

The helpers below serve torchrun_etcd_test, membership_test, slurm_test and
bench/torchrun_bench.py too. Run as a script, this file is only the delayed agent of a
joining host (Host's go_file): `torchrun_elastic_test.py --agent-after GO_FILE ARGS...`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from elastic_run_testing import Checks, check_steps, small_model, steps_of
from multihost_testing import netns

from tenplex.testing import Daemon, NetnsBridge, free_port

_log = logging.getLogger(__name__)

PY = sys.executable  # the project interpreter (.venv/bin/python) that runs this file
STEPS = 24
COMMIT_EVERY = 2
POLICY = {"4": "tp=2,pp=2", "6": "tp=2,dp=3", "2": "tp=2"}
TRAIN_ARGS = ["--global-batch-size", "12", "--micro-batch-size", "2", "--seq-length", "32"]
RDZV_TIMEOUTS = "last_call_timeout=1,join_timeout=120,close_timeout=10"  # --rdzv_conf of every backend

Procs = list[tuple[str, "subprocess.Popen[bytes]"]]  # (name, agent) of the agents a test waits for


def train_command(repo: str, policy: str, model: str, log_flag: str, log: str) -> list[str]:
    """`train.py --elastic` as these tests run it: the policy, the model, STEPS, a commit every
    COMMIT_EVERY steps, the step log (log_flag: --step-log or --log), steps padded to 0.4 s."""
    return [
        os.path.join(repo, "examples/gpt/train.py"),
        "--elastic",
        policy,
        "--job",
        "gpt",
        "--model",
        model,
        "--steps",
        str(STEPS),
        "--commit-every",
        str(COMMIT_EVERY),
        log_flag,
        log,
        "--min-step-seconds",
        "0.4",
        "--timeout",
        "60",
        *TRAIN_ARGS,
    ]


def read_log(path: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(steps, events) of a JSON-lines log written so far (a partial last line left out)."""
    if not os.path.exists(path):
        return [], []
    steps: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    with open(path) as f:
        for line in f:
            if not line.endswith("\n"):
                break
            j = json.loads(line)
            (events if "event" in j else steps).append(j)
    return steps, events


def wait_for(what: str, pred: Callable[[], bool], timeout: float, procs: Procs) -> bool:
    """Polls pred() until true; False (the reason logged) on a timeout or a process of procs that failed."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        for name, p in procs:
            if p.poll() is not None and p.returncode != 0:
                _log.error("FAIL: %s exited with %s while waiting for %s", name, p.returncode, what)
                return False
        time.sleep(0.2)
    _log.error("FAIL: timed out (%s s) waiting for %s", timeout, what)
    return False


class Host:
    def __init__(
        self,
        index: int,
        tenplex: str,
        repo: str,
        tmp: str,
        rdzv_port: int,
        model: str,
        policy: str,
        log: str,
        go_file: str | None = None,
        extra: Sequence[str] = (),
        net: NetnsBridge | None = None,
        rdzv: Sequence[str] | None = None,
        daemon_args: Sequence[str] = (),
        store_url: str | None = None,
    ) -> None:
        """go_file: start the agent now (imports done) but let it join only once the file exists;
        extra: more train.py arguments (later ones win); net: a NetnsBridge, the host runs in
        its namespace i (its own address, a UTS namespace whose host name is that address);
        rdzv: the --rdzv_backend/--rdzv_endpoint/--rdzv_conf arguments (default: c10d hosted by
        host 0's agent on rdzv_port); daemon_args: more `store serve` arguments; store_url: the
        URL the workers reach their daemon at (default: the daemon's own, e.g. not a proxy's)."""
        self.index = index
        prefix: tuple[str, ...] = ()
        rdzv_host, ifname = "127.0.0.1", "lo"
        if net is not None:
            prefix, rdzv_host, ifname = net.prefix(index), net.addr(0), net.ifname(index)
            self.daemon = Daemon(tenplex, listen="0.0.0.0:7480", prefix=prefix, args=daemon_args)
            self.daemon.url = f"http://{net.addr(index)}:7480"
            prefix = (*prefix, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', net.addr(index))
        else:
            self.daemon = Daemon(tenplex, args=daemon_args)
        self.store_url = store_url or self.daemon.url
        self.out = open(os.path.join(tmp, f"host{index}.log"), "w")
        # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: torch 2.x's shared rendezvous store deadlocks a
        # node joining a later round (docs/deploy.md, "torchrun on torch 2.x").
        env = dict(
            os.environ,
            TENPLEX_STORE_URL=self.store_url,
            TENPLEX_BIN=tenplex,
            TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
            PYTHONPATH=os.path.join(repo, "python"),
            GLOO_SOCKET_IFNAME=ifname,
            OMP_NUM_THREADS="1",
            LOGLEVEL="INFO",
        )  # the agents log their workers' exits and restarts (logged on failure)
        if rdzv is None:
            conf = f"is_host={'true' if index == 0 else 'false'},{RDZV_TIMEOUTS}"
            rdzv = ["--rdzv_backend=c10d", f"--rdzv_endpoint={rdzv_host}:{rdzv_port}", f"--rdzv_conf={conf}"]
        launcher = (
            [PY, os.path.abspath(__file__), "--agent-after", go_file]
            if go_file
            else [PY, "-m", "torch.distributed.run"]
        )
        cmd = [
            *prefix,
            *launcher,
            "--nnodes=2:3",
            "--nproc_per_node=2",
            *rdzv,
            "--rdzv_id=torchrun-test",
            "--monitor_interval=0.5",
            "--max_restarts=3",
            *train_command(repo, policy, model, "--step-log", log),
            *extra,
        ]
        self.agent = subprocess.Popen(cmd, stdout=self.out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def kill_all(self) -> None:
        """SIGKILLs every process of the host: the agent's process group, every process below
        it (torchrun starts its workers in sessions of their own), and the daemon. The agent's
        group is stopped first, so that nothing starts a process meanwhile."""
        try:
            os.killpg(self.agent.pid, signal.SIGSTOP)
        except ProcessLookupError:
            pass
        for pid in [self.agent.pid, *descendants(self.agent.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.agent.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.agent.wait(20)
        self.daemon.kill()

    def stop(self) -> None:
        if self.agent.poll() is None:
            self.kill_all()
        self.daemon.stop()
        self.out.close()


def descendants(pid: int) -> list[int]:
    """The ids of every process below pid (children, their children, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def delayed_agent(go_file: str, args: list[str]) -> None:
    """A torchrun agent with its start-up done ahead: joins when go_file appears, so the
    test's scale-up happens at a known step instead of after an interpreter start."""
    from torch.distributed import run

    while not os.path.exists(go_file):
        time.sleep(0.05)
    run.main(args)


def setup_job(tenplex: str, repo: str, tmp: str) -> tuple[str, str, str]:
    """(model, policy, static run's log) in tmp: the model, the policy file and the static tp=1 run."""
    model = small_model(tenplex, tmp)
    policy = os.path.join(tmp, "policy.json")
    with open(policy, "w") as f:
        json.dump(POLICY, f)
    static_log = os.path.join(tmp, "static.jsonl")
    t0 = time.time()
    subprocess.run(
        [
            PY,
            os.path.join(repo, "examples/gpt/train.py"),
            "--config",
            "tp=1",
            "--model",
            model,
            "--steps",
            str(STEPS),
            "--log",
            static_log,
            "--master-port",
            str(free_port()),
            *TRAIN_ARGS,
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    _log.info("static run: %.1f s", time.time() - t0)
    return model, policy, static_log


def committed_on_6(log: str) -> bool:
    """True once the 6-rank world (3 hosts) committed a version."""
    steps, events = read_log(log)
    starts = [i for i, e in enumerate(events) if e["event"] == "elastic_start" and e["world_size"] == 6]
    return bool(starts) and any(e["event"] == "commit" for e in events[starts[0] :])


def scale_up(
    hosts: Sequence[Host],
    go: str,
    log: str,
    net: NetnsBridge | None,
    t0: float,
    until: tuple[str, Callable[[], bool] | None] = ("a commit on 3 hosts", None),
) -> tuple[bool, Procs]:
    """(ok, [(name, agent)]): hosts 0 and 1 train to step 3, host 2 joins (go), the 6-rank world commits
    (or until[1]() is true, described by until[0]). The test is skipped (pytest.skip) where the
    namespaces' daemons cannot be reached."""
    if net is not None:
        try:  # the bridge may be filtered on some machines: that is the environment, not us
            for h in hosts:
                h.daemon.get("/v1/health")
        except OSError as e:
            pytest.skip(f"the namespaces' daemons cannot be reached over the bridge ({e})")
    procs = [(f"agent {h.index}", h.agent) for h in hosts]
    ok = wait_for("step 3 on 2 hosts", lambda: any(s["step"] >= 3 for s in read_log(log)[0]), 180, procs)
    if ok:
        _log.info("2 hosts at step 3 after %.1f s; host 2 joins", time.time() - t0)
        open(go, "w").close()
        ok = wait_for(until[0], until[1] or (lambda: committed_on_6(log)), 180, procs)
    return ok, procs


def lose_host(host: Host, procs: Procs) -> Procs:
    """SIGKILLs every process of `host` (Host.kill_all); the agents left to wait for (procs without its agent)."""
    host.kill_all()
    return [(n, p) for n, p in procs if p is not host.agent]


def finish_agents(check: Checks, procs: Procs, t0: float) -> bool:
    """The end of a run: waits (240 s) for every agent of procs [(name, Popen)] to exit and checks
    that each exited 0; True when all exited."""
    ok = wait_for("the agents to finish", lambda: all(p.poll() is not None for _, p in procs), 240, [])
    for name, p in procs:
        check(p.returncode == 0, f"{name} finished with status {p.returncode}")
    _log.info("elastic run: %.1f s", time.time() - t0)
    return ok


def stop_hosts(check: Checks, ok: bool, what: str, tmp: str, hosts: Sequence[Host]) -> None:
    """Stops every host (what still runs is killed), checks `what` by ok, logs the hosts' logs when not."""
    for h in hosts:
        h.stop()
    check(ok, what)
    if not ok:
        log_host_logs(tmp, hosts)


def log_host_logs(tmp: str, hosts: Sequence[Host]) -> None:
    """The last 150 lines of each host's output, logged as a warning (pytest shows them when the test fails)."""
    for h in hosts:
        with open(os.path.join(tmp, f"host{h.index}.log")) as f:
            _log.warning("---- host %d\n%s", h.index, "".join(f.readlines()[-150:]))


def run_test(tenplex: str, repo: str, tmp: str, net: NetnsBridge | None) -> None:
    check = Checks()
    model, policy, static_log = setup_job(tenplex, repo, tmp)
    log = os.path.join(tmp, "elastic.jsonl")
    rdzv = free_port()
    hosts: list[Host] = []
    ok = True
    try:
        t0 = time.time()
        go = os.path.join(tmp, "go-host2")
        if net is not None:
            rdzv = 29400
        hosts = [Host(i, tenplex, repo, tmp, rdzv, model, policy, log, net=net) for i in range(2)]
        hosts.append(Host(2, tenplex, repo, tmp, rdzv, model, policy, log, go_file=go, net=net))
        ok, procs = scale_up(hosts, go, log, net, t0)
        if ok:
            _log.info("committed on 3 hosts after %.1f s; killing host 1", time.time() - t0)
            ok = finish_agents(check, lose_host(hosts[1], procs), t0)
    finally:
        stop_hosts(check, ok, "the scripted scale-up and failure happened and the job finished", tmp, hosts)
    check_run(check, static_log, log, hosts[1].daemon.url)
    check.finish()


def test_loopback(tenplex: str, repo: str, tmp: str) -> None:
    run_test(tenplex, repo, tmp, None)


def test_netns(tenplex: str, repo: str, tmp: str, monkeypatch: pytest.MonkeyPatch) -> None:
    net = netns(3)
    monkeypatch.setenv("TENPLEX_TOKEN", "torchrun-netns-token")  # daemons off loopback require one
    try:
        run_test(tenplex, repo, tmp, net)
    finally:
        net.close()


def check_replanned(check: Checks, down: dict[str, Any], lost_url: str | None, what: str) -> None:
    """The world after a host's loss: transformed back to tp=2,pp=2,dp=1 from the replicas,
    with exactly the lost host's daemon named lost (`what` says which loss)."""
    check(
        down["transformed"] and down["config"] == "tp=2,pp=2,dp=1" and down["lost_hosts"] == [lost_url],
        f"{what}: {down}",
    )


def check_steps_and_worlds(
    check: Checks, static_log: str, log: str, steps: int = STEPS
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every one of `steps` steps logged with the static run's samples and losses, and the
    starts' worlds 4, 6 (scale-up), 4 (a host lost); (events, starts) of the log."""
    base, _ = steps_of(static_log)
    got, events = steps_of(log) if os.path.exists(log) else ({}, [])
    for e in events:
        _log.info("%s", json.dumps(e))
    check(sorted(got) == list(range(steps)), f"every step logged: {sorted(got)}")
    check_steps(check, got, base, steps)
    starts = [e for e in events if e["event"] == "elastic_start"]
    worlds = [e["world_size"] for e in starts]
    check(worlds == [4, 6, 4], f"worlds of the starts: 4, then 6 (scale-up), then 4 (failure): {worlds}")
    return events, starts


def check_run(check: Checks, static_log: str, log: str, lost_url: str | None) -> None:
    """The elastic run's log against the static run's: every step, same samples and losses; worlds 4, 6
    (scale-up at a step boundary), 4 (the host at lost_url lost, re-placed from the last commit)."""
    events, starts = check_steps_and_worlds(check, static_log, log)
    if [e["world_size"] for e in starts] == [4, 6, 4]:
        up, down = starts[1], starts[2]
        stops = [e for e in events if e["event"] == "elastic_stop"]
        check(
            len(stops) == 1 and stops[0]["step"] == up["step"],
            f"the scale-up stopped at a step boundary with a commit and lost no step: {stops} / {up}",
        )
        check(
            up["transformed"] and up["from"] == "tp=2,pp=2,dp=1" and up["config"] == "tp=2,pp=1,dp=3",
            f"scale-up transformed tp=2,pp=2 -> tp=2,dp=3: {up}",
        )
        check_replanned(
            check, down, lost_url, "after the failure: the killed host's daemon lost, re-planned from replicas"
        )
        commits = [e["step"] for e in events if e["event"] == "commit"]
        before = [c for c in commits if c <= down["step"]]
        check(down["step"] == max(before), f"restarted from the last commit (step {down['step']}): {commits}")
        killed_at = max(s["step"] for s in read_log(log)[0] if s["world_size"] == 6)
        check(
            killed_at + 1 - down["step"] <= COMMIT_EVERY,
            f"the failure lost at most {COMMIT_EVERY} steps (last step on 6 ranks {killed_at}, "
            f"restart at {down['step']})",
        )


if __name__ == "__main__":  # Host's delayed agent (go_file); the tests run under pytest
    if sys.argv[1:2] != ["--agent-after"] or len(sys.argv) < 3:
        raise SystemExit("usage: torchrun_elastic_test.py --agent-after GO_FILE TORCHRUN_ARGS... (the tests: pytest)")
    delayed_agent(sys.argv[2], sys.argv[3:])
