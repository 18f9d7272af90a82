"""The worker's side of in-process membership (tenplex.membership, issue 37): Member (a
worker's view of its host agent's worlds, through the control directory) and MemberJob
(the membership mode of tenplex.elastic.Job: joining each world in-process, rejoin(),
aborted(), and the pre-sizing of the next world's memory while the old one stops)."""

import gc
import logging
import os
import sys
import threading
import time
from typing import Any, Callable, Optional

from . import _tenplex
from ._early_restore import ENV_NO_EARLY_RESTORE, EarlyRestore, finish_presize
from ._job_state import JobState
from ._torch_warm import warm_backward
from .elastic_cluster import ElasticError, break_leases, run_transform
from .elastic_policy import pick_choice, tenplex_binary
from .membership import ENV_ABORT_WAIT, ENV_DIR, ENV_HOST_ID, ENV_LOCAL_RANK, Control, MembershipError, WorldAborted

log = logging.getLogger("tenplex.membership")


class Member:
    """A worker's view of its agent's worlds (tenplex.elastic.Job in membership mode)."""

    def __init__(self, directory: str, local_rank: int, host_id: str, timeout: float = 600.0):
        self.control, self.local_rank, self.host_id, self.timeout = Control(directory), local_rank, host_id, timeout
        self.epoch = 0  # the world this worker is in (0: none yet)
        self.world: Optional[dict] = None
        self.announced = threading.Event()  # a newer world than self.epoch exists
        self.aborted = threading.Event()  # ... and it lost a host: the segment is aborted
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        # Called from the watcher with a newer world's record when no host of this one was lost.
        self.on_world: Optional[Callable[[dict], None]] = None

    @staticmethod
    def from_env() -> Optional["Member"]:
        d = os.environ.get(ENV_DIR)
        if not d:
            return None
        if not os.path.isdir(d) or ENV_LOCAL_RANK not in os.environ or ENV_HOST_ID not in os.environ:
            raise MembershipError(
                f"{ENV_DIR}={d!r} needs an existing control directory and {ENV_LOCAL_RANK}, "
                f"{ENV_HOST_ID} (set by python -m tenplex.hostagent)"
            )
        return Member(d, int(os.environ[ENV_LOCAL_RANK]), os.environ[ENV_HOST_ID])

    def next_world(self) -> Optional[dict[str, int]]:
        """Waits for the newest world after self.epoch; torchrun-style numbers of this worker
        in it ({"WORLD_SIZE", "RANK", ...}), or None when it has no place for this host."""
        if self.epoch == 0:
            warm_backward()  # torch's lazy imports of a backward with a gradient: not in a reconfiguration
            # What is loaded by now (torch, the client's modules) lives as long as the process: out
            # of the collector's sight, the collection at each teardown takes milliseconds, not 0.5 s.
            gc.collect()
            gc.freeze()
            self.control.write_ready(self.local_rank)
        deadline = time.monotonic() + self.timeout
        while True:  # (the agent writes the worlds that have this host, and the first one without it)
            e, w = self.control.newest()
            if e > self.epoch and w is not None:  # (w is None only at epoch 0)
                if self.host_id not in w["hosts"]:
                    return None
                break
            if time.monotonic() > deadline:
                raise MembershipError(f"no world with host {self.host_id} within {self.timeout:g} s")
            time.sleep(0.005)
        assert w is not None  # the loop left with a world
        self.epoch, self.world = e, w
        self.announced.clear()
        self.aborted.clear()
        nproc = int(w["info"][self.host_id]["nproc"])
        g = w["hosts"].index(self.host_id)
        return {
            "WORLD_SIZE": nproc * len(w["hosts"]),
            "RANK": g * nproc + self.local_rank,
            "LOCAL_RANK": self.local_rank,
            "LOCAL_WORLD_SIZE": nproc,
            "GROUP_RANK": g,
        }

    def init_process_group(self, backend: str, rank: int, world_size: int, timeout: float, attempt: int = 0) -> None:
        """Joins this epoch's process group through the first host's TCPStore (a
        PrefixStore per epoch and attempt). The watcher for the next world runs from before
        the rendezvous, and every wait of it can be ended by a newer world: a host of this
        world lost during it (its agent's key expired, the leader wrote a world without it)
        aborts the rendezvous within about the TTL (WorldAborted, or the store's error once
        the watcher broke its connection), instead of init_process_group waiting for its
        timeout. The ranks first meet in the store (arrive(): polled, so an abort ends it);
        a gloo world then connects a throwaway full mesh under mesh_timeout() (probe_mesh())
        before the group's own, which has `timeout` for its connect and collectives alike."""
        import datetime

        import torch.distributed as dist

        from . import warm

        if self._thread is None or not self._thread.is_alive():
            self._watch()
        deadline = time.monotonic() + self.timeout
        while (address := self.control.master(self.epoch)) is None:
            if self.aborted.is_set():
                raise WorldAborted(f"world {self.epoch} aborted before its store's address came")
            if time.monotonic() > deadline:
                raise MembershipError(f"no store address for world {self.epoch} within {self.timeout:g} s")
            time.sleep(0.002)
        host, port = address.rsplit(":", 1)
        warm.wait_port(host, int(port), timeout, cancel=self.aborted.is_set)
        if self.aborted.is_set():
            raise WorldAborted(f"world {self.epoch} aborted before its rendezvous")
        td = datetime.timedelta(seconds=timeout)
        prefix = f"epoch{self.epoch}/" if attempt == 0 else f"epoch{self.epoch}.{attempt}/"
        store = dist.PrefixStore(prefix, dist.TCPStore(host, int(port), is_master=False, timeout=td))
        self.arrive(store, "arrived", rank, world_size, timeout)
        if backend == "gloo":
            self.probe_mesh(store, rank, world_size, timeout)
        dist.init_process_group(
            backend,
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=td,
            **device_group_args(backend, self.local_rank),
        )

    def arrive(self, store, tag: str, rank: int, world_size: int, timeout: float) -> None:
        """Waits until every rank of the world set its key `tag`/<rank> in `store` (polled
        every 5 ms): WorldAborted as soon as the watcher saw an abort, MembershipError when a
        rank set `tag`_failed or after `timeout` s."""
        store.set(f"{tag}/{rank}", str(os.getpid()))
        keys = [f"{tag}/{r}" for r in range(world_size)]
        deadline = time.monotonic() + timeout
        while not store.check(keys):
            if self.aborted.is_set():
                raise WorldAborted(f"world {self.epoch} aborted while its ranks met ({tag})")
            if store.check([f"{tag}_failed"]):
                who = store.get(f"{tag}_failed").decode()
                raise MembershipError(f"rank {who} of world {self.epoch} failed ({tag})")
            if time.monotonic() > deadline:
                raise MembershipError(f"not every rank of world {self.epoch} met ({tag}) within {timeout:g} s")
            time.sleep(0.005)

    def probe_mesh(self, store, rank: int, world_size: int, timeout: float) -> None:
        """Connects a gloo full mesh of the world's ranks under mesh_timeout() and drops it
        once every rank connected its own (waiting up to `timeout` for that, or a rank's
        failure, or the abort). A pair whose peer died after publishing its address but
        before connecting waits on its listening side (the lower address listens), out of
        the watcher's reach (no socket to shut down), for the group's timeout: gloo gives
        the probe no less than 10 s whatever mesh_timeout() says, the group (whose
        point-to-point operations keep the timeout it was made with) the full one. A host
        lost after the probe, in the milliseconds of the group's own connect, still costs
        that timeout."""
        import datetime

        import torch.distributed as dist

        td = datetime.timedelta(seconds=mesh_timeout(world_size))
        try:
            probe = dist.ProcessGroupGloo(dist.PrefixStore("probe/", store), rank, world_size, td)
        except Exception:
            try:
                store.set("probed_failed", str(rank))  # the others stop waiting for this rank
            except Exception:  # noqa: BLE001 - the watcher broke the store's connection: the abort tells them
                pass
            raise
        self.arrive(store, "probed", rank, world_size, timeout)
        del probe

    def _watch(self) -> None:
        from . import warm

        self._stop.clear()

        def loop():
            while not self._stop.is_set():
                e, w = self.control.newest()
                if e > self.epoch and w is not None:
                    if w.get("abort"):
                        self.aborted.set()
                        warm.ABORT.set()
                        warm.shutdown_sockets()  # a pending collective fails at once, here and at the peers
                        abort_device_groups()  # NCCL's own connections: its communicators aborted
                    self.announced.set()
                    if self.on_world is not None and not w.get("abort"):
                        self.on_world(w)
                    return
                self._stop.wait(0.005)

        self._thread = threading.Thread(target=loop, name="tenplex-member", daemon=True)
        self._thread.start()

    def failed(self, error: BaseException, wait: float) -> bool:
        """A step or collective raised `error`: True when the agent aborted the world (a
        host was lost; waits up to `wait` seconds for that news), else False."""
        from . import warm

        warm.shutdown_sockets()  # the peers fail too, instead of waiting for a timeout
        self.report(error)
        deadline = time.monotonic() + wait
        while not self.aborted.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.aborted.is_set()

    def report(self, error: BaseException) -> None:
        """Tells the agent that this world's collective or rendezvous failed (failed-<epoch>):
        it reports the world to the quorum, whose leader probes the world's hosts' liveness
        ports and counts a dead one lost at once (tenplex.liveness). Any error is reported:
        the probe, not the error, decides."""
        try:
            self.control.write_failed(self.epoch, self.local_rank, f"{type(error).__name__}: {error}")
        except OSError as e:  # the control directory is gone: the agent died (this worker dies with it)
            log.warning("reporting the failure of world %d: %s", self.epoch, e)

    def rendezvous_failed(self, wait: float, error: BaseException) -> bool:
        """The rendezvous of this world failed (any error: a refused or timed-out connect, a
        store error, WorldAborted): True when a newer world is announced within `wait`
        seconds (this one is dropped for it), False when none came (every rank of this
        world failed too: this process's connections are broken, so that its peers' waits
        end). Either way the caller tears this world's group down."""
        from . import warm

        warm.shutdown_sockets()
        self.report(error)
        return self.announced.wait(wait)

    def teardown(self) -> None:
        from . import warm

        warm.drop_world(self._stop, self._thread)
        self._thread = None
        warm.ABORT.clear()


ENV_MESH_TIMEOUT = "TENPLEX_MESH_TIMEOUT"  # seconds a gloo world's full-mesh connect may take (default: mesh_timeout)
RENDEZVOUS_ATTEMPTS = 3  # tries of one world's rendezvous when it fails and no newer world comes


def mesh_timeout(world_size: int) -> float:
    """Seconds a gloo group's full-mesh connect may take once every rank of the world
    arrived: TENPLEX_MESH_TIMEOUT, else 2 s + 20 ms per rank (milliseconds on loopback;
    the slack is for loaded machines and long networks)."""
    v = os.environ.get(ENV_MESH_TIMEOUT)
    if v:
        try:
            if float(v) > 0:
                return float(v)
        except ValueError:
            pass
        raise MembershipError(f"{ENV_MESH_TIMEOUT}={v!r} must be a number of seconds > 0")
    return 2.0 + 0.02 * world_size


def env_int(name, default=None):
    v = os.environ.get(name)
    if v is None:
        if default is None:
            raise ElasticError(f"{name} is not set: run under torchrun")
        return default
    try:
        return int(v)
    except ValueError:
        raise ElasticError(f"{name}={v!r} is not an integer") from None


def device_group_args(backend: str, local_rank: int) -> dict:
    """init_process_group's arguments for a device backend: with NCCL and CUDA, this worker's
    GPU (local rank modulo the visible devices) made current and given as device_id (the
    communicators are made at once, each world anew; the tensors on the GPU stay). Empty
    for gloo or without CUDA. Not run on a GPU yet: tests/membership_gpu_check.py
    (scripts/gpu_check.sh) is its check."""
    import torch

    if "nccl" not in backend or not torch.cuda.is_available():
        return {}
    dev = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    return {"device_id": dev}


def abort_device_groups() -> None:
    """Aborts this process's NCCL communicators (a pending NCCL collective returns with an
    error: shutting the sockets down reaches gloo only); nothing without CUDA or a group.
    Called by the watcher on an abort; not run on a GPU yet (tests/membership_gpu_check.py)."""
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available() or not dist.is_initialized() or "nccl" not in str(dist.get_backend()):
        return
    try:
        dist.distributed_c10d._abort_process_group()
    except (RuntimeError, ValueError) as e:  # already aborted or destroyed: teardown drops it
        log.warning("aborting the NCCL communicators: %s", e)


ENV_NO_PRESIZE = "TENPLEX_NO_PRESIZE"  # set (to anything but "" or "0"): no pre-sizing (benchmarks' baseline)
PRESIZE_WAIT = 30.0  # seconds rejoin() waits at most for a pre-size still running (then the transform goes on)
PRESIZE_ATTEMPTS = 2  # a failed pre-size is tried once more (Presize._run)
PRESIZE_RETRY_PAUSE = 0.5  # seconds between the attempts


class Presize:
    """`tenplex transform --presize` of the next world, in a background thread: from the
    job's committed version on `old_cluster` to `config` on `new_cluster`, every host
    with new ranks fills its page pool with exactly the files its prepare will allocate
    (docs/transform.md, "Pre-sizing ahead"). Nothing is written or committed: the
    transform that follows takes those files and writes into warm pages. Best effort:
    its failure is reported, never raised."""

    def __init__(self, job: str, config: str, old_cluster: dict, new_cluster: dict, token: str, timeout: float = 60.0):
        self.job, self.config, self.token, self.timeout = job, config, token, timeout
        self.old_cluster, self.new_cluster = old_cluster, new_cluster
        self.result: dict = {}
        self._thread = threading.Thread(target=self._run, name="tenplex-presize", daemon=True)

    def start(self) -> "Presize":
        self._t0 = time.perf_counter()
        self._thread.start()
        return self

    def _run(self) -> None:
        cmd = [
            "transform",
            "--job",
            self.job,
            "--to",
            self.config,
            "--presize",
            "--json",
            "--quiet",
            "--prepare-timeout",
            str(int(self.timeout)),
        ]
        # Tried again once: it runs while the old world stops and commits, when a loaded host's
        # daemon may answer the listing too late (the error names hosts that did not answer).
        first_error = ""
        for attempt in range(1, PRESIZE_ATTEMPTS + 1):
            try:
                out = run_transform(tenplex_binary(), cmd, self.old_cluster, self.new_cluster, self.token, {})
                hosts = out.get("presized", [])
                self.result = {
                    "poolable_bytes": sum(h["poolable_bytes"] for h in hosts),
                    "pooled_bytes": sum(min(h["pooled_bytes"], h["poolable_bytes"]) for h in hosts),
                    "hosts": len(hosts),
                }
                break
            except (ElasticError, OSError, ValueError, KeyError) as e:
                self.result = {"error": str(e)[:300]}
                first_error = first_error or self.result["error"]
                if attempt < PRESIZE_ATTEMPTS:
                    log.warning("job %s: pre-size attempt %d failed, trying again: %s", self.job, attempt, e)
                    time.sleep(PRESIZE_RETRY_PAUSE)
        self.result["attempts"] = attempt
        if attempt > 1:
            self.result["first_error"] = first_error
        self.result["seconds"] = round(time.perf_counter() - self._t0, 4)

    def finish(self, wait: float = PRESIZE_WAIT) -> dict:
        """Waits up to `wait` s for it; its outcome ({"config", "seconds", "poolable_bytes",
        "pooled_bytes", "hosts"} or {"error"}), plus "waited_s"."""
        t0 = time.perf_counter()
        self._thread.join(wait)
        rec = dict(self.result) if not self._thread.is_alive() else {"error": f"still running after {wait:g} s"}
        return dict(rec, config=self.config, waited_s=round(time.perf_counter() - t0, 4))


def presize_world(job: str, policy, world: dict, old_cluster: dict, token: str) -> Presize:
    """Starts pre-sizing `world` (a world record: hosts, info with store_url and nproc) for
    the job's committed state on old_cluster; its config is the policy's for its size."""
    nproc = int(world["info"][world["hosts"][0]]["nproc"])
    urls = [world["info"][h]["store_url"] for h in world["hosts"]]
    config = pick_choice(policy, nproc * len(urls), nproc)[0]
    return Presize(job, config, old_cluster, {"hosts": urls, "gpus_per_host": nproc}, token).start()


def coordinator_what(host_id: str) -> str:
    """What rank 0 on host `host_id` names itself by in membership mode (its coordinator name
    is "<this>@<machine>:<pid>:<random>", job_lease.h)."""
    return f"tenplex-member.{host_id}"


def coordinator_prefix(host_id: str) -> str:
    """The start of the coordinator name of any rank 0 on host `host_id` in membership mode, up
    to and with its "@" (so that host1's does not match host10's), in the characters a lease
    holder may have (NewCoordinator's)."""
    return _tenplex.new_coordinator(coordinator_what(host_id)).rsplit("@", 1)[0] + "@"


class MemberJob(JobState):
    """The membership mode of tenplex.elastic.Job (its base class): joining each world
    in-process. Uses Job's _member, _pg, rank, world_size, _coord, cluster, policy, job,
    token, _log_event, _set_world."""

    _presize: Optional[Presize] = None  # rank 0: the pre-size of the next world, from its announcement
    _early: Optional[EarlyRestore] = None  # rank 0: the restore started by rejoin()

    def _start_early_restore(self) -> None:
        """Rank 0 of the world just read (rejoin()): the restore's coordination starts now."""
        member = self._member
        if self.rank != 0 or member is None or not member.world:
            return
        if os.environ.get(ENV_NO_EARLY_RESTORE, "0") not in ("", "0"):
            return
        urls = [member.world["info"][h]["store_url"] for h in member.world["hosts"]]
        presize, self._presize = self._presize, None
        self._early = EarlyRestore(self, member.epoch, urls, presize)

    def _settle_early(self) -> Optional[tuple[EarlyRestore, float]]:
        """Waits for the early restore, if one runs, and drops it (the world may change after
        this): it and the seconds waited, or None."""
        early, self._early = self._early, None
        return None if early is None else (early, early.wait())

    def _early_record(self, hosts: list[str]) -> Optional[dict]:
        """restore(), rank 0: the early restore's record when it coordinated for `hosts` (the
        daemons the workers gathered), else None (restore() coordinates itself)."""
        settled = self._settle_early()
        if settled is None:
            return None
        early, waited = settled
        if early.urls != hosts:
            log.warning(
                "job %s: the world named daemons %s, the workers %s: restoring again", self.job, early.urls, hosts
            )
            return None
        self._log_event({"event": "early_restore", "seconds": round(early.seconds, 4), "waited_s": round(waited, 4)})
        return early.result()

    def _presize_next(self, world: dict) -> None:
        """Rank 0, from the watcher, when a newer world that lost no host is announced: the
        plan is known now (the config is the policy's for its size), so the hosts that get
        new ranks pre-size their pools while this world stops and commits and the next one
        forms; rejoin() waits for it before the restore's transform."""
        if self.rank != 0 or self.cluster is None or os.environ.get(ENV_NO_PRESIZE, "0") not in ("", "0"):
            return
        try:
            self._presize = presize_world(self.job, self.policy, world, self.cluster, self.token)
        except (ElasticError, KeyError, ValueError) as e:  # a policy without this size: the restore says so
            self._log_event({"event": "presize", "epoch": world.get("epoch"), "error": str(e)[:300]})

    def _set_world(self, world) -> None:
        """Rank and sizes from torchrun's environment, or the agent's world (a dict of the same
        names); the config (and knobs: the Megatron-LM arguments of a suggest: policy's choice)."""
        get = world.__getitem__ if world else env_int
        self.world_size, self.rank, self.local_rank, self.local_world_size, self.group_rank = (
            get(k) for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")
        )
        if self.rank != self.group_rank * self.local_world_size + self.local_rank:
            raise ElasticError(
                f"rank {self.rank} is not group_rank {self.group_rank} x {self.local_world_size} + "
                f"local_rank {self.local_rank}: every host must run the same --nproc_per_node"
            )
        self.config, self.knobs = pick_choice(self.policy, self.world_size, self.local_world_size)

    def _coordinator_what(self) -> str:
        """The start of rank 0's coordinator name (elastic_cluster.Coordinator): in membership
        mode it names this host, so that the next world's rank 0 can tell a dead host's lease."""
        return "tenplex-elastic" if self._member is None else coordinator_what(self._member.host_id)

    def _break_dead_leases(self, urls: list[str]) -> None:
        """Rank 0 in membership mode, before it takes the job's lease: a host whose liveness port
        refused the quorum's probe (the world's "refused": its agent is gone, and its workers with
        it, PR_SET_PDEATHSIG) may have held the lease as the last world's rank 0. Its lease is
        released on every daemon now instead of after its TTL (10 s; a loss whose dead host held
        rank 0 waited it out). Hosts lost by their key's TTL alone keep theirs: they may only be
        stalled, and the deadline decides for them (store/lease.h)."""
        if self._member is None or not self._member.world:
            return
        dead = [coordinator_prefix(h) for h in self._member.world.get("refused", [])]
        if dead:
            released = break_leases(urls, self.job, self.token, dead)
            if released:
                self._log_event({"event": "lease_released", "epoch": self._member.epoch, "holders": released})

    @property
    def membership(self) -> bool:
        """True in membership mode (workers stay alive: rejoin()), False under torchrun."""
        return self._member is not None

    def _join_world(self, times: Optional[dict[str, float]] = None) -> None:
        """Joins the process group of the world just read; rank 0 logs it ("world": the
        epoch, every rank's (host, local rank, pid), the seconds of rejoin's phases). Any
        error of the rendezvous (a host of the world lost during it: a refused connect, a
        store error, the watcher's abort) makes it wait for a newer world (up to the
        agent's abort wait, about 3 x TTL + 10 s): it drops this world for that one (rank 0
        logs "rendezvous_aborted": the epoch, the seconds it waited), or, when none comes,
        tries this world again (a fresh store prefix; "rendezvous_retry") up to
        RENDEZVOUS_ATTEMPTS times before it raises the error."""
        import torch.distributed as dist

        backend, timeout = self._pg
        member = self._member
        assert member is not None  # membership mode (init_process_group checked)
        member.on_world = self._presize_next
        wait = float(os.environ.get(ENV_ABORT_WAIT, 120))
        attempt = 0
        while True:
            t0 = time.perf_counter()
            try:
                member.init_process_group(backend, self.rank, self.world_size, timeout, attempt)
                pids: list[Any] = [None] * self.world_size
                dist.all_gather_object(pids, (member.host_id, self.local_rank, os.getpid()))
                break
            except Exception as e:  # noqa: BLE001 - a lost peer shows as any error of the rendezvous
                log.warning("rank %d: world %d's rendezvous failed: %s", self.rank, member.epoch, str(e)[:300])
                newer = member.rendezvous_failed(wait, e)
                self._log_event(
                    {
                        "event": "rendezvous_aborted" if newer else "rendezvous_retry",
                        "epoch": member.epoch,
                        "attempt": attempt,
                        "seconds": round(time.perf_counter() - t0, 4),
                        "error": str(e)[:200],
                    }
                )
                member.teardown()
                if newer:
                    attempt = 0
                    self._next_world_or_exit()
                elif attempt + 1 < RENDEZVOUS_ATTEMPTS:
                    attempt += 1
                else:
                    raise
        self._first_step = True  # step_done logs the world's first step (its reconfiguration ends there)
        rec = {"event": "world", "epoch": member.epoch, "world_size": self.world_size, "pids": pids}
        if times:
            rec.update({k: round(v, 4) for k, v in times.items()}, init_pg_s=round(time.perf_counter() - t0, 4))
        self._log_event(rec)

    def _next_world_or_exit(self) -> None:
        """The next world's numbers set; exits 0 when it has no place for this worker (its host left)."""
        assert self._member is not None  # membership mode
        self._settle_early()  # (an early restore for a world given up: its version stays committed)
        world = self._member.next_world()
        if world is None:
            self._log_event({"event": "elastic_exit", "left": True})
            # Its state is committed and its groups torn down: no interpreter finalization
            # (0.8-2.5 s of CPU for torch's modules, which on a shared machine slows the new
            # world's first step).
            sys.stdout.flush()
            sys.stderr.flush()
            logging.shutdown()
            os._exit(0)
        self._set_world(world)

    def rejoin(self) -> None:
        """Membership mode, after step_done returned True or after a failure that aborted()
        took: the process group down, the next world joined; call restore() next. Exits 0
        when that world has no place for this worker (its host left)."""
        if self._member is None:
            raise RuntimeError("rejoin() needs membership mode (run under python -m tenplex.hostagent)")
        t0 = time.perf_counter()
        if self._coord is not None:
            self._coord.release()
            self._coord = None
        self._pending = None
        t1 = time.perf_counter()
        self._member.teardown()
        t2 = time.perf_counter()
        self._next_world_or_exit()
        self.hosts, self._term = None, False
        self._start_early_restore()
        self._join_world({"release_s": t1 - t0, "teardown_s": t2 - t1, "wait_world_s": time.perf_counter() - t2})
        if self._presize is not None:  # done before the restore's transform takes its files
            finish_presize(self, self._presize, self._member.epoch)
            self._presize = None

    def aborted(self, error: BaseException) -> bool:
        """True when `error` (raised by a step or a collective) came from the agent's abort
        (a host of the world was lost: rejoin() next), False for a real error (and always
        under torchrun)."""
        return self._member is not None and self._member.failed(error, wait=float(os.environ.get(ENV_ABORT_WAIT, 120)))
