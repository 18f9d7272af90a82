"""One agent per host for in-process membership (tenplex.membership, docs/deploy.md):

    python -m tenplex.hostagent --etcd HOST:PORT --job J --nproc N --store-url URL \\
        [--min-hosts A --max-hosts B --ttl S --host-id ID --events FILE] -- SCRIPT ARGS...

starts N workers (`python SCRIPT ARGS...`) once, waits until they are ready (imports done,
waiting for a world), registers the host in the job's quorum kept by etcd and tells its
workers every world it sees, through a control directory (membership.Control):
rank = host index * N + local rank. For each world the agent of its first host serves a
fresh TCPStore and publishes its address; the others read it from etcd. A world that lost
a host makes the workers abort the running step (they restore from the last commit); any
other change makes them stop at the next step boundary with a commit.

SIGTERM is a planned leave: the host is marked leaving, the next world leaves it out, its
workers take part in the stop and commit, then exit 0. The agent exits 0 when its workers
finished the job (or left); a worker that fails otherwise makes it stop the others and
exit with that worker's status (its host key then disappears: the others lose this host).

The agent listens on a liveness port (tenplex.liveness, registered as "alive"); when a
worker's collective or rendezvous fails it writes failed-<epoch> in the control directory
and the agent reports the world to the quorum (suspect): a host whose liveness port
refuses the leader's probe is counted lost at once instead of after the TTL.
"""

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

from . import membership as mb
from ._cli import cli_logging
from .liveness import Liveness

log = logging.getLogger("tenplex.hostagent")  # not __name__: "__main__" under python -m


def parse_args(argv: list[str]) -> argparse.Namespace:
    if "--" not in argv:
        raise SystemExit("usage: python -m tenplex.hostagent [options] -- SCRIPT ARGS... (the '--' is missing)")
    i = argv.index("--")
    ap = argparse.ArgumentParser(prog="python -m tenplex.hostagent", description=__doc__.split("\n\n")[0])
    ap.add_argument("--etcd", required=True, help="HOST:PORT of the etcd server (v2 API enabled)")
    ap.add_argument("--job", required=True, help="job name (the etcd prefix /tenplex/JOB)")
    ap.add_argument("--nproc", type=int, required=True, help="workers on this host")
    ap.add_argument("--store-url", required=True, help="this host's store daemon (http://addr:port)")
    ap.add_argument("--addr", help="the address other hosts reach this one at (default: the store URL's)")
    ap.add_argument("--host-id", help="this host's id in the quorum (default: hostname-storeport)")
    ap.add_argument("--min-hosts", type=int, default=1)
    ap.add_argument("--max-hosts", type=int, default=1 << 30)
    ap.add_argument("--ttl", type=float, default=10.0, help="seconds a dead host stays in the quorum at most")
    ap.add_argument(
        "--settle",
        type=float,
        default=0.3,
        help="seconds the live hosts must be stable for a new world (none for a planned leave or a full world)",
    )
    ap.add_argument("--events", help="append this agent's events (JSON lines: registered, world) to FILE")
    ap.add_argument(
        "--register-after",
        metavar="FILE",
        help="register in the quorum only once FILE exists "
        "(scripted joins in tests and demos: the workers are started and ready before)",
    )
    args = ap.parse_args(argv[:i])
    args.command = argv[i + 1 :]
    if not args.command:
        ap.error("give the worker's script after '--'")
    if args.nproc < 1:
        ap.error(f"--nproc must be >= 1, got {args.nproc}")
    if not args.store_url.startswith("http://"):
        ap.error(f"--store-url must be http://addr:port, got {args.store_url!r}")
    return args


class Agent:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.addr = args.addr or args.store_url.split("://", 1)[1].rsplit(":", 1)[0]
        self.host_id = args.host_id or mb.default_host_id(args.store_url)
        self.dir = tempfile.mkdtemp(prefix="tenplex-member-")
        self.control = mb.Control(self.dir)
        value = {"store_url": args.store_url.rstrip("/"), "addr": self.addr, "nproc": args.nproc}
        self.liveness: Optional[Liveness] = None  # the port other agents probe (tenplex.liveness)
        try:
            self.liveness = Liveness(self.addr)
            value = self.liveness.register(value)
        except (OSError, ValueError) as e:  # the TTL alone then detects this host's death
            log.warning("no liveness port on %s (%s): this host's loss is detected by the TTL only", self.addr, e)
        self.quorum = mb.Quorum(
            args.etcd,
            args.job,
            self.host_id,
            value,
            ttl=args.ttl,
            min_hosts=args.min_hosts,
            max_hosts=args.max_hosts,
            settle=args.settle,
        )
        self.workers: list[subprocess.Popen] = []
        self.stores: list[Any] = []  # the TCPStores this host serves (the last two epochs)
        self.seen = 0  # the newest epoch told to the workers
        self.member = False  # this host is in the world the workers were last told
        self.leaving: bool | str = False  # True: asked to leave (SIGTERM); "told": the quorum knows
        self.reported = 0  # the newest epoch in which a worker's failure was reported to the quorum

    def event(self, rec: dict) -> None:
        if self.args.events:
            rec = dict(rec, host=self.host_id, time=round(time.time(), 3))
            with open(self.args.events, "a") as f:
                f.write(json.dumps(rec) + "\n")

    def start_workers(self) -> None:
        for lr in range(self.args.nproc):
            env = dict(
                os.environ,
                **{
                    mb.ENV_DIR: self.dir,
                    mb.ENV_LOCAL_RANK: str(lr),
                    mb.ENV_HOST_ID: self.host_id,
                    "LOCAL_RANK": str(lr),
                    "LOCAL_WORLD_SIZE": str(self.args.nproc),
                    "TENPLEX_STORE_URL": self.args.store_url,
                },
            )
            env[mb.ENV_ABORT_WAIT] = str(3 * self.args.ttl + self.args.settle + 10)
            # UCX's memory hooks patch code at each load of UCX (0.4 s of system time per
            # process: every `tenplex transform` of a restore); relocation patching keeps the
            # same memory events at 0.01 s (docs/transport.md, "Which UCX"), as node.sh does
            env.setdefault("UCX_MEM_MMAP_HOOK_MODE", "reloc")
            self.workers.append(
                subprocess.Popen([sys.executable, *self.args.command], env=env, preexec_fn=_die_with_parent)
            )

    def tell(self, w: mb.World) -> None:
        """Tells the workers world w: the world file at once (stop or abort), then the store's address."""
        mine = self.host_id in w.hosts
        if not mine and not self.member:
            self.seen = w.epoch
            return  # a world without this host, which never had it: the workers wait for one with it
        self.control.write_world(w, abort=bool(w.lost) and self.member)
        self.seen, self.member = w.epoch, mine
        self.event(
            {
                "event": "world",
                "epoch": w.epoch,
                "hosts": w.hosts,
                "lost": w.lost,
                "refused": w.refused,
                "left": w.left,
                "world_time": w.time,
            }
        )
        if not mine:
            return
        if w.hosts[0] == self.host_id:
            store, address = mb.serve_store(self.addr)
            self.stores = (self.stores + [store])[-2:]
            self.quorum.publish_store(w.epoch, address)
        else:
            address = self.quorum.wait_store(w.epoch, 120)
            if address is None:
                newer = self.quorum.world()
                if newer is not None and newer.epoch > w.epoch:
                    return  # its first host died before serving the store: the loop tells the newer world
                raise mb.MembershipError(f"no store address for world {w.epoch} from {w.hosts[0]} within 120 s")
        self.control.write_master(w.epoch, address)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_term)
        self.quorum.check()
        try:
            self.start_workers()
            while not self.control.ready(self.args.nproc):
                rc = self._workers_exit()
                if rc is not None:
                    return rc or 1  # a worker gone before the job started
                if self.leaving:
                    return 0
                time.sleep(0.01)
            while self.args.register_after and not os.path.exists(self.args.register_after):
                if self.leaving:
                    return 0
                time.sleep(0.01)
            self.quorum.join(timeout=2 * self.args.ttl)
            self.quorum.start()
            self.event({"event": "registered"})
            return self._loop()
        finally:
            self._stop_workers()
            self.quorum.close(remove_keys=self.quorum.registered)
            if self.liveness is not None:
                self.liveness.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def _loop(self) -> int:
        next_done = 0.0
        while True:
            if self.leaving is True:
                self.quorum.leave()
                self.leaving = "told"
                self.event({"event": "leaving"})
            w = self.quorum.world()
            if w is not None and w.epoch > self.seen:
                self.tell(w)
            if self.member and self.reported < self.seen and self.control.failed(self.seen):
                self.reported = self.seen  # a worker's collective failed: the leader probes the world's hosts
                self.quorum.suspect(self.seen)
                self.event({"event": "suspect", "epoch": self.seen})
            if not self.member and time.monotonic() > next_done:
                next_done = time.monotonic() + 1.0
                if self.quorum.done():  # the job finished without this host (or after it left)
                    self.event({"event": "exit", "status": 0, "job_done": True})
                    return 0
            rc = self._workers_exit()
            if rc is not None:
                if rc == 0 and self.member and not self.leaving:
                    self.quorum.mark_done()  # every worker finished the job
                self.event({"event": "exit", "status": rc})
                return rc
            time.sleep(0.02)

    def _workers_exit(self) -> Optional[int]:
        """None while workers run; 0 when all exited 0; else the first failure's status."""
        codes = [p.poll() for p in self.workers]
        bad = [c for c in codes if c not in (None, 0)]
        if bad:
            return bad[0] if bad[0] > 0 else 128 - bad[0]
        return 0 if all(c == 0 for c in codes) else None

    def _stop_workers(self) -> None:
        for p in self.workers:
            if p.poll() is None:
                p.terminate()
        for p in self.workers:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def _on_term(self, signum: int, frame: Any) -> None:
        if not self.leaving:
            self.leaving = True


def _die_with_parent() -> None:
    """In the worker before exec: SIGKILL when the agent dies (PR_SET_PDEATHSIG), so that a
    killed agent leaves no worker behind (its host is lost for the others then)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except OSError:
        pass  # not Linux glibc: the agent's own exit path still stops its workers


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return Agent(args).run()
    except mb.MembershipError as e:
        log.error("tenplex.hostagent: error: %s", e)
        return 2


if __name__ == "__main__":
    cli_logging()
    sys.exit(main())
