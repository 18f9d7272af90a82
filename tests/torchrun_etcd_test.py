"""Under torchrun's etcd-v2 rendezvous the job survives the loss of host 0: the host that
was first, that would have hosted c10d's rendezvous, and whose rank 0 coordinates the
job's commits and transforms.

usage: torchrun_etcd_test.py TENPLEX_BIN REPO_ROOT [--netns] [--case between|commit-window]

An etcd server (`etcd --enable-v2`, a temp data dir; on loopback, or on the bridge's
address in the root namespace with --netns) stands in for the cluster's etcd. Three
hosts (tests/torchrun_elastic_test.py's Host: one store daemon and one torchrun agent
each, nproc 2, `--rdzv_backend=etcd-v2 --rdzv_endpoint=<etcd>`) run `train.py --elastic`
with the policy {"4": "tp=2,pp=2", "6": "tp=2,dp=3"} and a commit every 2 steps: hosts 0
and 1 start, host 2 joins at step 3 (tp=2,dp=3 on 6 ranks). The daemons' host ids are
set so that host 0's daemon comes first in commit order (the 2PC's decision record,
src/tenplex/transform/two_phase.h). After a commit on 3 hosts every process of host 0
(its daemon, agent and workers) is SIGKILLed:

- between (the default with --netns): between two commits;
- commit-window (the default on loopback): when host 0's daemon receives the commit
  request of the next periodic commit (a proxy in front of it, tests/fault_proxy.py):
  every host prepared that version, none committed it, and the coordinator that decided
  dies with the decision record. The survivors' new rank 0 waits for the dead
  coordinator's lease to expire, and its recovery rolls the in-doubt version back (no
  live host committed it, its decision record is lost with host 0) and says so in its
  log; the job goes on from the commit before.

The survivors' agents re-rendezvous through etcd (no host serves the rendezvous), restart
their workers as tp=2,pp=2 on 4 ranks and re-place host 0's ranks from the data-parallel
replicas. Checks: both surviving agents exit 0; every step's samples and loss (the last
line of a re-run step counts) within 1e-3 of a static tp=1 run; the worlds 4, 6, 4; the
restart from the last commit; host 0's daemon reported lost; in commit-window the
recovery's line in the new coordinator's log and no version left prepared or open on
the survivors; every daemon, agent and the etcd server gone afterwards.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemons import Daemon, NetnsBridge  # noqa: E402
from elastic_run_test import Checks, steps_of  # noqa: E402
from fault_proxy import FaultProxy  # noqa: E402
from torchrun_elastic_test import (  # noqa: E402
    RDZV_TIMEOUTS,
    Host,
    check_run,
    free_port,
    print_host_logs,
    scale_up,
    setup_job,
    wait_for,
)

VICTIM = 0  # the host killed: the first one


class Etcd(Daemon):
    """`etcd --enable-v2` on addr (a free port), its data in a temp dir; stop() (Daemon's: SIGTERM, then
    SIGKILL after 20 s) removes both."""

    def __init__(self, addr: str, tmp: str):
        if shutil.which("etcd") is None:
            print("SKIP: etcd is not installed (Debian: etcd-server)")
            sys.exit(77)
        self.dir = tempfile.mkdtemp(prefix="etcd-", dir=tmp)
        port, peer = free_port(), free_port()
        self.endpoint = f"{addr}:{port}"
        clients = f"http://{addr}:{port}" + ("" if addr == "127.0.0.1" else f",http://127.0.0.1:{port}")
        self.log = open(os.path.join(tmp, "etcd.log"), "w")
        self.proc = subprocess.Popen(
            [
                "etcd",
                "--name",
                "tenplex-test",
                "--data-dir",
                self.dir,
                "--enable-v2",
                "--listen-client-urls",
                clients,
                "--advertise-client-urls",
                f"http://{addr}:{port}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-cluster",
                f"tenplex-test=http://127.0.0.1:{peer}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.time() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if b"true" in r.read():
                        break
            except OSError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise SystemExit(f"FAIL: etcd did not come up on {self.endpoint} (see {self.log.name})")
            time.sleep(0.2)

    def stop(self):
        super().stop()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone too
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def procs_naming(folder):
    """The ids of processes whose command line names folder (the workers' --step-log, the agents' policy)."""
    out = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if folder.encode() in f.read():
                    out.append(int(d))
        except OSError:
            continue  # gone meanwhile
    return out


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def group_ranks(tmp, hosts):
    """{host index: its agent's group rank in the latest rendezvous} from the agents' logs."""
    out = {}
    for h in hosts:
        with open(os.path.join(tmp, f"host{h.index}.log")) as f:
            found = re.findall(r"\]\s+group_rank=(\d+)\s*$", f.read(), re.M)
        out[h.index] = int(found[-1]) if found else None
    return out


def seed_shm_dirs(count: int):
    """One --shm-dir per host in /dev/shm whose HOST_ID makes host i the i-th in commit order."""
    dirs = []
    for i in range(count):
        d = tempfile.mkdtemp(prefix=f"tenplex-etcd-{i}-", dir="/dev/shm")
        with open(os.path.join(d, "HOST_ID"), "w") as f:
            f.write(f"{i:016x}\n")
        dirs.append(d)
    return dirs


def survivors_versions(hosts):
    """{host index: {version: state}} of the survivors' daemons."""
    out = {}
    for h in hosts:
        if h.index == VICTIM:
            continue
        j = h.daemon.get("/v1/jobs/gpt")
        out[h.index] = {v["version"]: v["state"] for v in j["versions"]}
    return out


def main():
    tenplex, repo = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    netns = "--netns" in sys.argv[3:]
    case = sys.argv[sys.argv.index("--case") + 1] if "--case" in sys.argv else ("between" if netns else "commit-window")
    if case not in ("between", "commit-window"):
        raise SystemExit(f"unknown --case {case!r}: between or commit-window")
    if netns and case == "commit-window":
        raise SystemExit("--case commit-window runs on loopback only (the fault proxy listens on 127.0.0.1)")
    net = None
    if netns:
        net = NetnsBridge(3)
        os.environ["TENPLEX_TOKEN"] = "torchrun-etcd-token"
    try:
        run_test(tenplex, repo, net, case)
    finally:
        if net is not None:
            net.close()


def run_test(tenplex, repo, net, case):
    check, t_start = Checks(), time.time()
    shm_dirs = []
    with tempfile.TemporaryDirectory() as tmp:
        model, policy, static_log = setup_job(tenplex, repo, tmp)
        log = os.path.join(tmp, "elastic.jsonl")
        etcd = Etcd("127.0.0.1" if net is None else net.subnet + ".1", tmp)
        rdzv = ["--rdzv_backend=etcd-v2", f"--rdzv_endpoint={etcd.endpoint}", f"--rdzv_conf={RDZV_TIMEOUTS}"]
        # The rendezvous numbers the agents by address (then pid): host i has the i-th one, so host 0 is
        # group rank 0 in every round (its rank 0 coordinates), as the first host is under c10d's is_host.
        addrs = [f"127.0.0.{i + 1}" if net is None else net.addr(i) for i in range(3)]
        print(f"etcd on {etcd.endpoint}")
        proxy = FaultProxy() if case == "commit-window" else None
        hosts, pids, ok, t0 = [], [], True, time.time()
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
                print(f"committed on 3 hosts after {time.time() - t0:.1f} s; killing host {VICTIM}")
                victim.kill_all()
            elif ok:
                print(
                    f"committed on 3 hosts after {time.time() - t0:.1f} s; host {VICTIM} dies when its daemon "
                    f"receives the next commit"
                )
                proxy.arm("POST", r"^/v1/jobs/gpt/versions/\d+/commit", victim.kill_all)
                ok = wait_for(
                    f"host {VICTIM}'s commit request",
                    lambda: victim.agent.poll() is not None,
                    60,
                    [(n, p) for n, p in procs if n != f"agent {VICTIM}"],
                )
                print(
                    f"killed host {VICTIM} at {proxy.hits} after {time.time() - t0:.1f} s; prepared on the "
                    f"survivors then: {survivors_versions(hosts)}"
                )
            t_kill = time.time()
            if ok:
                procs = [(n, p) for n, p in procs if n != f"agent {VICTIM}"]
                ok = wait_for(
                    "the survivors' agents to finish", lambda: all(p.poll() is not None for _, p in procs), 300, []
                )
                for name, p in procs:
                    check(p.returncode == 0, f"{name} finished with status {p.returncode}")
                print(f"elastic run: {time.time() - t0:.1f} s, {time.time() - t_kill:.1f} s after the kill")
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
            print(
                f"host {VICTIM} killed -> the survivors' world started (restore done): "
                f"{starts[2]['time'] - t_kill:.1f} s"
            )
        if proxy is not None:
            check_recovery_logged(check, tmp, hosts)
        left = [p for p in procs_naming(tmp) if alive(p)]
        check(
            not left
            and not any(alive(p) for p in pids + [etcd.proc.pid])
            and not any(group_alive(h.agent.pid) for h in hosts),
            f"every daemon, agent, worker and etcd is gone (processes naming the test's folder: {left})",
        )
        check(
            not any(os.path.exists(d) for d in shm_dirs) and not os.path.exists(etcd.dir),
            "the daemons' shm dirs and etcd's data dir are removed",
        )
        if check.failures:
            print_host_logs(tmp, hosts)
    print(f"test: {time.time() - t_start:.1f} s")
    check.finish()


def check_recovery_logged(check, tmp, hosts):
    """The survivors' new coordinator said that it rolled the in-doubt version back."""
    lines = []
    for h in hosts:
        if h.index == VICTIM:
            continue
        with open(os.path.join(tmp, f"host{h.index}.log")) as f:
            lines += [line.rstrip() for line in f if "recovery:" in line]
    for line in lines:
        print("  " + line)
    check(
        any("rolled back" in line and "decision record" in line for line in lines),
        "the new coordinator's log says it rolled the in-doubt version back (its decision record lost)",
    )


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # ctest's timeout: clean up in the finally blocks
    main()
