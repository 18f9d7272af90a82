"""Under torchrun's etcd-v2 rendezvous the job survives the loss of host 0: the host that
was first, that would have hosted c10d's rendezvous, and whose rank 0 coordinates the
job's commits and transforms.

Under pytest (issue 32 §4), TENPLEX_BIN the CLI under test:

    python -m pytest tests/torchrun_etcd_test.py::test_commit_window   (ctest torchrun_etcd)
    python -m pytest tests/torchrun_etcd_test.py::test_netns           (ctest torchrun_etcd_netns)
    python -m pytest tests/torchrun_etcd_test.py::test_between         (by hand: between, on loopback)

An etcd server (`etcd --enable-v2`, a temp data dir; on loopback, or on the bridge's
address in the root namespace in test_netns) stands in for the cluster's etcd. Three
hosts (tests/torchrun_elastic_test.py's Host: one store daemon and one torchrun agent
each, nproc 2, `--rdzv_backend=etcd-v2 --rdzv_endpoint=<etcd>`) run `train.py --elastic`
with the policy {"4": "tp=2,pp=2", "6": "tp=2,dp=3"} and a commit every 2 steps: hosts 0
and 1 start, host 2 joins at step 3 (tp=2,dp=3 on 6 ranks). The daemons' host ids are
set so that host 0's daemon comes first in commit order (the 2PC's decision record,
src/tenplex/transform/two_phase.h). After a commit on 3 hosts every process of host 0
(its daemon, agent and workers) is SIGKILLed:

- between (test_between; test_netns, every host in its own network namespace, skipped
  where unavailable): between two commits;
- commit-window (test_commit_window, on loopback: the fault proxy listens on 127.0.0.1):
  when host 0's daemon receives the commit request of the next periodic commit (a proxy
  in front of it, tests/fault_proxy.py): every host prepared that version, none committed
  it, and the coordinator that decided dies with the decision record. The survivors' new
  rank 0 waits for the dead coordinator's lease to expire, and its recovery rolls the
  in-doubt version back (no live host committed it, its decision record is lost with
  host 0) and says so in its log; the job goes on from the commit before.

The survivors' agents re-rendezvous through etcd (no host serves the rendezvous), restart
their workers as tp=2,pp=2 on 4 ranks and re-place host 0's ranks from the data-parallel
replicas. Checks: both surviving agents exit 0; every step's samples and loss (the last
line of a re-run step counts) within 1e-3 of a static tp=1 run; the worlds 4, 6, 4; the
restart from the last commit; host 0's daemon reported lost; in commit-window the
recovery's line in the new coordinator's log and no version left prepared or open on
the survivors; every daemon, agent and the etcd server gone afterwards. Prints the time
from the kill to the survivors' world's start. Skipped where etcd is not installed.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence

import pytest
from elastic_run_testing import Checks, steps_of
from fault_proxy import FaultProxy
from multihost_testing import Etcd, Figures, alive, netns, procs_naming
from torchrun_elastic_test import RDZV_TIMEOUTS, Host, check_run, log_host_logs, scale_up, setup_job, wait_for

from tenplex.testing import NetnsBridge

_log = logging.getLogger(__name__)

VICTIM = 0  # the host killed: the first one


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def group_ranks(tmp: str, hosts: Sequence[Host]) -> dict[int, int | None]:
    """{host index: its agent's group rank in the latest rendezvous} from the agents' logs."""
    out: dict[int, int | None] = {}
    for h in hosts:
        with open(os.path.join(tmp, f"host{h.index}.log")) as f:
            found = re.findall(r"\]\s+group_rank=(\d+)\s*$", f.read(), re.M)
        out[h.index] = int(found[-1]) if found else None
    return out


def seed_shm_dirs(count: int) -> list[str]:
    """One --shm-dir per host in /dev/shm whose HOST_ID makes host i the i-th in commit order."""
    dirs = []
    for i in range(count):
        d = tempfile.mkdtemp(prefix=f"tenplex-etcd-{i}-", dir="/dev/shm")
        with open(os.path.join(d, "HOST_ID"), "w") as f:
            f.write(f"{i:016x}\n")
        dirs.append(d)
    return dirs


def survivors_versions(hosts: Sequence[Host]) -> dict[int, dict[int, str]]:
    """{host index: {version: state}} of the survivors' daemons."""
    out = {}
    for h in hosts:
        if h.index == VICTIM:
            continue
        j = h.daemon.get("/v1/jobs/gpt")
        out[h.index] = {v["version"]: v["state"] for v in j["versions"]}
    return out


@pytest.fixture
def sigterm_exits() -> Iterator[None]:
    """ctest's timeout (SIGTERM): clean up in the finally blocks rather than leave the hosts and etcd behind."""
    old = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def test_commit_window(
    tenplex: str, repo: str, tmp: str, sigterm_exits: None, capsys: pytest.CaptureFixture[str]
) -> None:
    run_test(tenplex, repo, tmp, None, "commit-window", Figures(capsys))


def test_between(tenplex: str, repo: str, tmp: str, sigterm_exits: None, capsys: pytest.CaptureFixture[str]) -> None:
    run_test(tenplex, repo, tmp, None, "between", Figures(capsys))


def test_netns(
    tenplex: str,
    repo: str,
    tmp: str,
    sigterm_exits: None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    net = netns(3)
    monkeypatch.setenv("TENPLEX_TOKEN", "torchrun-etcd-token")
    try:
        run_test(tenplex, repo, tmp, net, "between", Figures(capsys))
    finally:
        net.close()


def run_test(tenplex: str, repo: str, tmp: str, net: NetnsBridge | None, case: str, show: Figures) -> None:
    """case: "between" or "commit-window" (loopback only: the fault proxy listens on 127.0.0.1)."""
    check, t_start = Checks(), time.time()
    shm_dirs: list[str] = []
    model, policy, static_log = setup_job(tenplex, repo, tmp)
    log = os.path.join(tmp, "elastic.jsonl")
    etcd = Etcd("127.0.0.1" if net is None else net.subnet + ".1", tmp)
    rdzv = ["--rdzv_backend=etcd-v2", f"--rdzv_endpoint={etcd.endpoint}", f"--rdzv_conf={RDZV_TIMEOUTS}"]
    # The rendezvous numbers the agents by address (then pid): host i has the i-th one, so host 0 is
    # group rank 0 in every round (its rank 0 coordinates), as the first host is under c10d's is_host.
    addrs = [f"127.0.0.{i + 1}" if net is None else net.addr(i) for i in range(3)]
    _log.info("etcd on %s", etcd.endpoint)
    proxy = FaultProxy() if case == "commit-window" else None
    hosts: list[Host] = []
    pids: list[int] = []
    ok, t0 = True, time.time()
    t_kill = t0
    try:
        go = os.path.join(tmp, "go-host2")
        shm_dirs = seed_shm_dirs(3)
        for i in range(3):
            url = None
            if proxy is not None and i == VICTIM:
                url = proxy.url
            hosts.append(
                Host(
                    i,
                    tenplex,
                    repo,
                    tmp,
                    0,
                    model,
                    policy,
                    log,
                    go_file=go if i == 2 else None,
                    net=net,
                    rdzv=[*rdzv, f"--local-addr={addrs[i]}"],
                    daemon_args=("--shm-dir", shm_dirs[i]),
                    store_url=url,
                )
            )
            if proxy is not None and i == VICTIM:
                proxy.point_at(hosts[-1].daemon)
        pids = [p for h in hosts for p in (h.daemon.proc.pid, h.agent.pid)]
        ok, procs = scale_up(hosts, go, log, net, t0)
        victim = hosts[VICTIM]
        if ok:
            ranks = group_ranks(tmp, hosts)
            check(ranks == {0: 0, 1: 1, 2: 2}, f"host i is group rank i (host {VICTIM} coordinates): {ranks}")
        if ok and proxy is None:
            _log.info("committed on 3 hosts after %.1f s; killing host %d", time.time() - t0, VICTIM)
            victim.kill_all()
        elif ok and proxy is not None:
            _log.info(
                "committed on 3 hosts after %.1f s; host %d dies when its daemon receives the next commit",
                time.time() - t0,
                VICTIM,
            )
            proxy.arm("POST", r"^/v1/jobs/gpt/versions/\d+/commit", victim.kill_all)
            ok = wait_for(
                f"host {VICTIM}'s commit request",
                lambda: victim.agent.poll() is not None,
                60,
                [(n, p) for n, p in procs if n != f"agent {VICTIM}"],
            )
            _log.info(
                "killed host %d at %s after %.1f s; prepared on the survivors then: %s",
                VICTIM,
                proxy.hits,
                time.time() - t0,
                survivors_versions(hosts),
            )
        t_kill = time.time()
        if ok:
            procs = [(n, p) for n, p in procs if n != f"agent {VICTIM}"]
            ok = wait_for(
                "the survivors' agents to finish", lambda: all(p.poll() is not None for _, p in procs), 300, []
            )
            for name, p in procs:
                check(p.returncode == 0, f"{name} finished with status {p.returncode}")
            _log.info("elastic run: %.1f s, %.1f s after the kill", time.time() - t0, time.time() - t_kill)
        if ok and proxy is not None:
            left = survivors_versions(hosts)
            check(
                all(st == "committed" for vs in left.values() for st in vs.values()),
                f"no version left prepared or open on the survivors: {left}",
            )
    finally:
        for h in hosts:
            h.stop()
        if proxy is not None:
            proxy.close()
        etcd.stop()
        for d in shm_dirs:
            shutil.rmtree(d, ignore_errors=True)
    check(ok, f"the scale-up, the loss of host {VICTIM} ({case}) happened and the job finished")
    lost_url = hosts[VICTIM].store_url if hosts else ""
    check_run(check, static_log, log, lost_url)
    starts = [e for e in steps_of(log)[1] if e["event"] == "elastic_start"] if os.path.exists(log) else []
    if ok and len(starts) == 3:
        show(f"host {VICTIM} killed -> the survivors' world started (restore done): {starts[2]['time'] - t_kill:.1f} s")
    if proxy is not None:
        check_recovery_logged(check, tmp, hosts)
    left_pids = [p for p in procs_naming(tmp) if alive(p)]
    check(
        not left_pids
        and not any(alive(p) for p in pids + [etcd.proc.pid])
        and not any(group_alive(h.agent.pid) for h in hosts),
        f"every daemon, agent, worker and etcd is gone (processes naming the test's folder: {left_pids})",
    )
    check(
        not any(os.path.exists(d) for d in shm_dirs) and not os.path.exists(etcd.dir),
        "the daemons' shm dirs and etcd's data dir are removed",
    )
    if check.failures:
        log_host_logs(tmp, hosts)
    _log.info("test: %.1f s", time.time() - t_start)
    check.finish()


def check_recovery_logged(check: Checks, tmp: str, hosts: Sequence[Host]) -> None:
    """The survivors' new coordinator said that it rolled the in-doubt version back."""
    lines = []
    for h in hosts:
        if h.index == VICTIM:
            continue
        with open(os.path.join(tmp, f"host{h.index}.log")) as f:
            lines += [line.rstrip() for line in f if "recovery:" in line]
    for line in lines:
        _log.info("  %s", line)
    check(
        any("rolled back" in line and "decision record" in line for line in lines),
        "the new coordinator's log says it rolled the in-doubt version back (its decision record lost)",
    )
