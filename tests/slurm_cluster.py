"""A real Slurm cluster on this machine, for tests (as root; Debian's slurmctld, slurmd,
slurm-client and munge).

One munged (its own key and socket), one slurmctld (in the root network namespace, on the
bridge's address) and one slurmd per emulated node. Node i runs in namespace i of a
`NetnsBridge` and in its own UTS and mount namespaces: its host name is its node name
(`node0`, ...), /etc/hosts is a generated file naming every node (bind-mounted, so the
machine's own file is untouched) and /dev/shm is a tmpfs of its own, as on separate
machines. Everything lives under one temporary directory; the clients find the cluster
through SLURM_CONF (`env()`). `close()` kills every process it started and every process
left in the namespaces, then removes the namespaces.

Where something is missing (not root, no namespaces, no Slurm or munge) the constructor
prints "SKIP: ..." and exits 77.
"""

import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemons import NetnsBridge  # noqa: E402
from torchrun_elastic_test import free_port  # noqa: E402

from tenplex.testing import Unavailable  # noqa: E402

PROGRAMS = ["munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "unshare", "nsenter"]
SBIN = ["/usr/sbin", "/sbin"]
# A node's namespaces ($0 node name, $1 hosts file, $2 a mount point): its host name; /sys the
# node's own sysfs (UCX lists the network interfaces there; nsenter keeps the machine's, which
# `ip netns exec` would replace together with the cgroup mounts) with the machine's cgroup mounts
# kept (slurmd 22.05 looks for them even with cgroup-free plugins); /etc/hosts naming the nodes
# (the machine's file untouched); /dev/shm a tmpfs of its own, as on separate machines.
NODE_SETUP = (
    'hostname "$0" && mount --rbind /sys/fs/cgroup "$2" && mount -t sysfs sysfs /sys'
    ' && mount --rbind "$2" /sys/fs/cgroup && mount --bind "$1" /etc/hosts'
    " && mount -t tmpfs -o size=4g tmpfs /dev/shm"
)


def which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN))


class SlurmCluster:
    """Nodes node0..node{count-1}; `slurmd_timeout`: seconds after which a silent node is DOWN."""

    def __init__(self, tmp: str, count: int = 3, slurmd_timeout: int = 10) -> None:
        missing = [p for p in PROGRAMS if which(p) is None]
        if missing:
            why = f"Slurm/munge programs missing: {' '.join(missing)} (scripts/install-deps.sh installs them)"
            print(f"SKIP: {why}")
            raise Unavailable(why)
        self.dir = os.path.join(tmp, "slurm")
        os.makedirs(self.dir)
        self.names = [f"node{i}" for i in range(count)]
        self.procs = {}  # name -> Popen of every daemon started here
        self.left = []
        self.net = NetnsBridge(count)  # Unavailable (exit 77) where namespaces cannot be made
        try:
            self._check_namespaces()
            self._start(slurmd_timeout)
        except BaseException:
            self.close()
            raise

    def path(self, *parts: str) -> str:
        return os.path.join(self.dir, *parts)

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a Slurm client (sbatch, scontrol, squeue) of this cluster."""
        return dict(os.environ, SLURM_CONF=self.path("slurm.conf"), **extra)

    def _node_cmd(self, i: int, setup: str, *args: str) -> list[str]:
        """sh -c setup in node i's network namespace and in UTS and mount namespaces of its own:
        $0 the node name, $1 the hosts file, $2 the cgroup mount point, then args."""
        cgroup = self.path("spool", self.names[i], "cgroup")
        os.makedirs(cgroup, exist_ok=True)
        return [
            which("nsenter"),
            f"--net=/run/netns/{self.net.spaces[i]}",
            which("unshare"),
            "--uts",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            NODE_SETUP + setup,
            self.names[i],
            self.path("hosts"),
            cgroup,
            *args,
        ]

    def _check_namespaces(self) -> None:
        """Unavailable (SystemExit(77)) where a node's namespaces cannot be set up (no mount or UTS namespace here)."""
        self._write_hosts()
        p = subprocess.run(self._node_cmd(0, " && true"), capture_output=True, text=True, timeout=30)
        if p.returncode != 0 and any(m in p.stderr.lower() for m in ("not permitted", "permission denied")):
            why = f"cannot set up a node's UTS and mount namespaces here: {p.stderr.strip()}"
            print(f"SKIP: {why}")
            self.close()
            raise Unavailable(why)
        if p.returncode != 0:
            raise RuntimeError(f"setting up a node's namespaces failed: {p.stderr.strip()}")

    def _write_hosts(self) -> None:
        with open(self.path("hosts"), "w") as f:
            f.write("127.0.0.1 localhost\n")
            f.write(f"{self.net.subnet}.1 slurmctld\n")
            f.writelines(f"{self.net.addr(i)} {n}\n" for i, n in enumerate(self.names))

    def _start(self, slurmd_timeout: int) -> None:
        for d in ("munge", "ctld"):
            os.makedirs(self.path(d), mode=0o700)
        key = self.path("munge", "munge.key")
        subprocess.run([which("mungekey"), "--create", "--keyfile", key], check=True, capture_output=True)
        self.munge_socket = self.path("munge", "munge.socket")
        self._spawn(
            "munged",
            [
                which("munged"),
                "--foreground",
                "--force",
                "--socket",
                self.munge_socket,
                "--key-file",
                key,
                "--pid-file",
                self.path("munge", "munged.pid"),
                "--seed-file",
                self.path("munge", "munged.seed"),
                "--log-file",
                self.path("munge", "munged.log"),
            ],
        )
        self._wait("munged's socket", lambda: os.path.exists(self.munge_socket), 20)
        self._write_conf(slurmd_timeout)
        # slurmctld checks that its host name is SlurmctldHost's: a UTS namespace of its own.
        self._spawn(
            "slurmctld",
            [
                which("unshare"),
                "--uts",
                "sh",
                "-c",
                'hostname slurmctld && exec "$@"',
                "-",
                which("slurmctld"),
                "-D",
                "-i",
                "-f",
                self.path("slurm.conf"),
            ],
        )
        for i, n in enumerate(self.names):
            self._spawn(
                n, self._node_cmd(i, ' && exec "$3" -D -N "$0" -f "$4"', which("slurmd"), self.path("slurm.conf"))
            )
        self._wait("every node idle", lambda: self.idle_nodes() == set(self.names), 60)

    def _write_conf(self, slurmd_timeout: int) -> None:
        self.ctld_port = free_port()
        nodes = "\n".join(
            f"NodeName={n} NodeAddr={self.net.addr(i)} CPUs=2 Sockets=1 CoresPerSocket=2 "
            "ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN"
            for i, n in enumerate(self.names)
        )
        conf = f"""# generated by tests/slurm_cluster.py
ClusterName=tenplextest
SlurmctldHost=slurmctld({self.net.subnet}.1)
SlurmctldPort={self.ctld_port}
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={self.path("ctld")}
SlurmctldPidFile={self.path("ctld", "slurmctld.pid")}
SlurmctldLogFile={self.path("slurmctld.log")}
SlurmdSpoolDir={self.path("spool", "%n")}
SlurmdPidFile={self.path("spool", "slurmd-%n.pid")}
SlurmdLogFile={self.path("slurmd-%n.log")}
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobContainerType=job_container/none
SwitchType=switch/none
MpiDefault=none
MailProg=/bin/true
SelectType=select/linear
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout={slurmd_timeout}
MessageTimeout=5
KillWait=5
InactiveLimit=0
MinJobAge=600
{nodes}
PartitionName=test Nodes={",".join(self.names)} Default=YES MaxTime=INFINITE State=UP
"""
        with open(self.path("slurm.conf"), "w") as f:
            f.write(conf)

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.path(f"{name}.out"), "w")
        self.procs[name] = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        log.close()

    def _wait(self, what: str, pred: Callable[[], bool], timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if pred():
                return
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode} while waiting for {what}: {self.tail(name)}")
            time.sleep(0.2)
        raise RuntimeError(f"timed out ({timeout} s) waiting for {what}")

    def tail(self, name: str, lines: int = 30) -> str:
        """The last lines of a daemon's output and log (name: munged, slurmctld or a node name)."""
        out = []
        for f in (f"{name}.out", f"{name}.log", f"slurmd-{name}.log", os.path.join("munge", "munged.log")):
            if (name == "munged") != f.startswith("munge") and f != f"{name}.out":
                continue
            if os.path.exists(self.path(f)):
                with open(self.path(f), errors="replace") as fh:
                    out.append(f"== {f}\n" + "".join(fh.readlines()[-lines:]))
        return "\n".join(out)

    def run(self, *args: str, check: bool = True, **kw) -> str:
        """A Slurm client command (sbatch, scontrol, ...) against this cluster; its stdout."""
        p = subprocess.run(
            [which(args[0]), *args[1:]],
            capture_output=True,
            text=True,
            env=kw.pop("env", self.env()),
            timeout=kw.pop("timeout", 30),
            **kw,
        )
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({p.returncode}): {p.stderr.strip()}")
        return p.stdout

    def nodes(self) -> dict[str, str]:
        """node name -> state (`sinfo`'s long state, e.g. idle, allocated, down*)."""
        out = self.run("scontrol", "show", "node", "-o", check=False)
        states = {}
        for line in out.splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            if "NodeName" in fields:
                states[fields["NodeName"]] = fields.get("State", "").lower()
        return states

    def idle_nodes(self) -> set[str]:
        return {n for n, s in self.nodes().items() if s == "idle"}

    def job(self, job_id: int) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, ExitCode, NodeList, StdOut, ...)."""
        out = self.run("scontrol", "show", "job", "-o", str(job_id))
        return dict(f.split("=", 1) for f in out.split() if "=" in f)

    def sbatch(self, args: list[str], env: dict[str, str], cwd: str) -> int:
        """Submits like a user (`sbatch ARGS` in cwd with env); the job id."""
        out = self.run("sbatch", "--parsable", *args, env=env, cwd=cwd)
        return int(out.strip().split(";")[0])

    def pids(self, i: int) -> list[int]:
        """Every process in node i's network namespace."""
        p = subprocess.run(["ip", "netns", "pids", self.net.spaces[i]], capture_output=True, text=True)
        return [int(x) for x in p.stdout.split()]

    def kill_node(self, i: int) -> None:
        """SIGKILLs node i: its slurmd and every process in its namespace (repeated until none is left)."""
        for _ in range(50):
            pids = self.pids(i)
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        raise RuntimeError(f"node {i} still has processes: {self.pids(i)}")

    def leftovers(self) -> list[int]:
        """Processes still running: in the namespaces and of the daemons started here."""
        left = [pid for i in range(len(self.names)) for pid in self.pids(i)]
        return left + [p.pid for p in self.procs.values() if p.poll() is None]

    def close(self) -> None:
        """Stops everything; self.left: the processes that survived it (checked before the namespaces
        are removed, and by any process whose command line names this cluster's folder)."""
        for i in range(len(self.names)):
            try:
                self.kill_node(i)
            except RuntimeError as e:
                print(f"warning: {e}")
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(10)
        self.left = self.leftovers()
        self.net.close()
        pgrep = subprocess.run(["pgrep", "-f", self.dir], capture_output=True, text=True)
        self.left += [int(x) for x in pgrep.stdout.split() if int(x) not in self.left]
