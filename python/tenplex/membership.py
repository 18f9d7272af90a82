"""In-process membership on many hosts (issue 37): workers stay alive across joins and losses.

Under torchrun every join or loss restarts every worker. Here one host agent per host
(``python -m tenplex.hostagent``, hostagent.py) starts its workers once; a quorum kept
by etcd decides each new world and the workers re-form their process groups in-process.
No consensus of ours: etcd's atomic operations only (the v2 API, through python-etcd,
as torchrun's etcd-v2 rendezvous uses it). Under ``/tenplex/<job>/``:

  hosts/<host id>   one TTL key per live host (value: {"store_url", "addr", "nproc",
                    "alive", "leaving"}), refreshed every TTL/3 by its agent; a host that
                    dies loses it after at most TTL seconds, or at once when a survivor
                    reported a failed collective and its agent's liveness port refuses
                    (`suspect` below).
  leader            the host id of the agent that decides worlds: taken by an atomic
                    create (prevExist=False) with a TTL, refreshed by compare-and-swap on
                    its own value; a dead leader's key expires and another agent takes it.
  world             the current world (World.to_json): written by the leader with
                    compare-and-swap on the previous world's modifiedIndex (a stale
                    leader's write fails), once the live hosts were stable for `settle`
                    seconds (none for a proven death, a planned leave or a world of
                    max_hosts) and there are at least min_hosts: survivors keep their order,
                    new hosts come at the end (in registration order) up to max_hosts,
                    a host marked leaving is left out (planned), a host whose key is gone
                    is `lost` (its workers died with it: the others abort their step).
  epochs/<e>/store  host:port of the TCPStore the first host's agent serves for epoch e
                    (the workers' rendezvous; a fresh one per world).
  suspect           the epoch of a world in which a worker's collective or rendezvous
                    failed (written by that worker's agent, TTL as the hosts' keys). The
                    leader then probes the liveness port ("alive": Liveness) of every host
                    of that world every PROBE_EVERY s: a host whose port refuses the
                    connect has no agent process any more (a live process's kernel
                    completes the handshake however stalled the process is), so its key
                    is deleted (compare-and-delete on its modifiedIndex) and the next
                    world counts it lost without waiting for its TTL (World.refused). A
                    connect that succeeds, times out or fails otherwise proves nothing:
                    the TTL decides as before. A non-leader that reported probes the
                    leader so, and deletes the leader key of a dead one.
  done              written when the job finished: no world after it.

The agent tells its workers through a control directory (Control): ``world-<e>.json``
(the world, written as soon as the agent sees it: a stop at the next step boundary, or
an abort when it lost a host) and ``master-<e>`` (the epoch's store address). A worker
(tenplex.member.Member, used by tenplex.elastic.Job when TENPLEX_MEMBERSHIP names that directory)
watches for them in a thread: a new epoch raises Job.step_done's stop flag; an abort
shuts down the process's connected sockets (warm.shutdown_sockets) so that a pending
gloo collective fails at once; Job.rejoin() then joins the next world.
"""

import json
import logging
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

from .liveness import PROBE_EVERY, probe_target, refused_hosts

log = logging.getLogger("tenplex.membership")

ENV_DIR = "TENPLEX_MEMBERSHIP"  # the control directory (set by the agent for its workers)
ENV_LOCAL_RANK = "TENPLEX_LOCAL_RANK"
ENV_HOST_ID = "TENPLEX_HOST_ID"
ENV_ABORT_WAIT = "TENPLEX_ABORT_WAIT"  # seconds a worker whose step failed waits for the agent's abort


class MembershipError(RuntimeError):
    """A membership operation failed (etcd unreachable, bad arguments, no world in time)."""


class WorldAborted(MembershipError):
    """The world being joined was aborted before its rendezvous finished (a host of it was
    lost meanwhile): join the next one."""


@dataclass
class World:
    epoch: int
    hosts: list[str]  # host ids in rank order: host i holds ranks i*nproc .. i*nproc+nproc-1
    info: dict[str, dict]  # host id -> its registration value (store_url, addr, nproc)
    lost: list[str] = field(default_factory=list)  # hosts of the previous world that died
    left: list[str] = field(default_factory=list)  # hosts of the previous world that left (planned)
    time: float = 0.0  # the leader's wall clock when it wrote the world
    refused: list[str] = field(default_factory=list)  # lost hosts found dead by the probe (not the TTL)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "World":
        d = json.loads(text)
        return World(
            int(d["epoch"]),
            list(d["hosts"]),
            dict(d["info"]),
            list(d.get("lost", [])),
            list(d.get("left", [])),
            float(d.get("time", 0.0)),
            list(d.get("refused", [])),
        )


def next_world(
    prev: Optional[World], live: dict[str, dict], order: list[str], min_hosts: int, max_hosts: int
) -> Optional[World]:
    """The world that follows `prev` for the live hosts ({host id: value}, registered in
    `order`), or None when it is the same or too small. Survivors keep their places,
    new hosts come at the end, at most max_hosts; hosts marked leaving are left out."""
    staying = {h for h, v in live.items() if not v.get("leaving")}
    old = prev.hosts if prev else []
    hosts = [h for h in old if h in staying]
    hosts += [h for h in order if h in staying and h not in hosts]
    hosts = hosts[:max_hosts]
    if len(hosts) < min_hosts or (prev is not None and hosts == prev.hosts):
        return None
    nproc = {live[h].get("nproc") for h in hosts}
    if len(nproc) != 1:
        raise MembershipError(
            f"the hosts run different numbers of workers ({sorted(map(str, nproc))}): "
            "give every host agent the same --nproc"
        )
    gone = [h for h in old if h not in hosts]
    return World(
        (prev.epoch if prev else 0) + 1,
        hosts,
        {h: live[h] for h in hosts},
        lost=[h for h in gone if h not in live],
        left=[h for h in gone if h in live],
        time=time.time(),
    )


def _client(endpoint: str):
    import etcd  # python-etcd (in the project's .venv)

    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise MembershipError(f"--etcd {endpoint!r} must be HOST:PORT")
    return etcd.Client(host=host, port=int(port), read_timeout=10, allow_reconnect=False)


class Quorum:
    """An agent's membership in the job's quorum: its TTL key, the leader's duty when it
    holds the leader key, and the worlds. Thread-safety: start() runs a background thread
    (keys refreshed, leader steps); the other methods are called from one thread."""

    def __init__(
        self,
        endpoint: str,
        job: str,
        host_id: str,
        value: dict,
        ttl: float = 10.0,
        min_hosts: int = 1,
        max_hosts: int = 1 << 30,
        settle: float = 0.3,
        poll: float = 0.05,
    ):
        if not job or "/" in job or not host_id or "/" in host_id:
            raise MembershipError(f"job {job!r} and host id {host_id!r} must be non-empty without '/'")
        if ttl < 1 or min_hosts < 1 or max_hosts < min_hosts:
            raise MembershipError(
                f"need ttl >= 1 (got {ttl}) and 1 <= min_hosts <= max_hosts (got {min_hosts}, {max_hosts})"
            )
        self.endpoint, self.job, self.host_id, self.value = endpoint, job, host_id, dict(value)
        self.ttl, self.min_hosts, self.max_hosts, self.settle, self.poll = ttl, min_hosts, max_hosts, settle, poll
        self.root = f"/tenplex/{job}"
        self._key = f"{self.root}/hosts/{host_id}"
        self._etcd = _client(endpoint)  # the caller's thread
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.leader = False
        self.registered = False  # join() succeeded (close() then removes the key)
        self.error = ""  # the background thread's last failure ("" while fine)
        self.probes = 0  # rounds of liveness probes this agent made (after reported failures)
        self._suspected: Optional[tuple[int, float]] = None  # (epoch, monotonic time) of this host's last report
        self._next_probe = 0.0  # the leader's next probe of a suspected world, not before (monotonic)

    # ---- this host ---------------------------------------------------------------

    def join(self, timeout: float = 0.0) -> None:
        """Registers this host (atomic create: a live host of the same id makes it wait up
        to `timeout` seconds for that key to expire, then fail)."""
        import etcd

        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            try:
                self._etcd.write(self._key, json.dumps(self.value), ttl=int(self.ttl), prevExist=False)
                self.registered = True
                return
            except etcd.EtcdAlreadyExist:
                if time.monotonic() > deadline:
                    raise MembershipError(
                        f"host id {self.host_id} is already registered in job {self.job} "
                        f"({self.endpoint}): another live agent uses it"
                    ) from None
                time.sleep(0.2)
            except etcd.EtcdException as e:
                raise MembershipError(f"etcd at {self.endpoint}: registering {self._key}: {e}") from None

    def check(self) -> None:
        """MembershipError unless etcd answers (with its v2 API)."""
        import etcd

        try:
            self._etcd.read(self.root)
        except etcd.EtcdKeyNotFound:
            pass
        except etcd.EtcdException as e:
            raise MembershipError(
                f"etcd at {self.endpoint} does not answer (v2 API; start it with --enable-v2): {e}"
            ) from None

    def leave(self) -> None:
        """A planned leave: the host stays registered but marked leaving, so that the next
        world leaves it out without counting it lost."""
        self.value["leaving"] = True
        self._etcd.write(self._key, json.dumps(self.value), ttl=int(self.ttl), prevExist=True)

    def suspect(self, epoch: int) -> None:
        """A worker of world `epoch` on this host saw a collective or its rendezvous fail:
        the leader probes that world's hosts (this agent the leader: a dead leader's key is
        deleted). Best effort: an etcd error is logged, the TTL still decides."""
        import etcd

        self._suspected = (epoch, time.monotonic())
        try:
            self._etcd.write(f"{self.root}/suspect", str(epoch), ttl=int(self.ttl))
        except etcd.EtcdException as e:
            log.warning("job %s: reporting a failure in world %d: %s", self.job, epoch, e)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tenplex-quorum", daemon=True)
        self._thread.start()

    def close(self, remove_keys: bool = True) -> None:
        """Stops the thread and removes this host's key (and the leader key when held);
        remove_keys=False leaves them to expire (what a host that dies does)."""
        import etcd

        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if not remove_keys:
            return
        for key, prev in ((self._key, None), (f"{self.root}/leader", self.host_id)):
            try:
                self._etcd.delete(key, **({"prevValue": prev} if prev else {}))
            except etcd.EtcdException:
                pass  # gone already (expired, or another leader)

    # ---- the job's records ----------------------------------------------------------

    def world(self) -> Optional[World]:
        import etcd

        try:
            return World.from_json(self._etcd.read(f"{self.root}/world").value)
        except etcd.EtcdKeyNotFound:
            return None

    def publish_store(self, epoch: int, address: str) -> None:
        self._etcd.write(f"{self.root}/epochs/{epoch}/store", address, ttl=24 * 3600)

    def wait_store(self, epoch: int, timeout: float) -> Optional[str]:
        """host:port of epoch's store; None when it did not appear within timeout or a newer
        world came first (the first host of `epoch` died before publishing it: the world
        that counts it lost follows within the TTL)."""
        import etcd

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                return self._etcd.read(f"{self.root}/epochs/{epoch}/store").value
            except etcd.EtcdKeyNotFound:
                w = self.world()
                if w is not None and w.epoch > epoch:
                    return None
                time.sleep(0.01)
        return None

    def mark_done(self) -> None:
        self._etcd.write(f"{self.root}/done", "1")

    def done(self) -> bool:
        import etcd

        try:
            self._etcd.read(f"{self.root}/done")
            return True
        except etcd.EtcdKeyNotFound:
            return False

    # ---- the background thread: keys refreshed, the leader's steps -------------------

    def _run(self) -> None:
        import etcd

        c = _client(self.endpoint)
        next_refresh = next_probe = 0.0
        candidate: tuple[Optional[list[str]], float] = (None, 0.0)  # (hosts, since when they are so)
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                if now >= next_refresh:
                    c.refresh(self._key, ttl=int(self.ttl), prevExist=True)
                    next_refresh = now + self.ttl / 3
                    if self.leader:
                        self.leader = self._refresh_leader(c)
                if not self.leader:
                    self.leader = self._take_leader(c)
                    if self.leader:
                        next_refresh = now  # refresh the leader key on the next round
                        log.info("host %s leads job %s", self.host_id, self.job)
                if self.leader:
                    candidate = self._lead(c, candidate)
                elif self._suspected is not None and now - self._suspected[1] < self.ttl and now >= next_probe:
                    next_probe = now + PROBE_EVERY
                    self._check_leader(c)
                self.error = ""
            except etcd.EtcdKeyNotFound:
                # our key expired (a stall longer than the TTL): register again; the world that
                # counted this host lost already decided, the agent sees it left out
                self.error = f"host key {self._key} expired"
                try:
                    c.write(self._key, json.dumps(self.value), ttl=int(self.ttl), prevExist=False)
                except etcd.EtcdException:
                    pass
            except (etcd.EtcdException, MembershipError, OSError) as e:
                if str(e) != self.error:  # once per distinct failure, not every poll
                    log.warning("job %s: quorum: %s", self.job, e)
                self.error = str(e)
            self._stop.wait(self.poll)

    def _take_leader(self, c) -> bool:
        import etcd

        try:
            c.write(f"{self.root}/leader", self.host_id, ttl=int(self.ttl), prevExist=False)
            return True
        except etcd.EtcdAlreadyExist:
            return False

    def _refresh_leader(self, c) -> bool:
        import etcd

        try:
            c.write(f"{self.root}/leader", self.host_id, ttl=int(self.ttl), prevValue=self.host_id)
            return True
        except (etcd.EtcdCompareFailed, etcd.EtcdKeyNotFound):
            return False

    def _lead(self, c, candidate):
        """One leader step: reads the live hosts; writes the next world once the set was
        stable for `settle` seconds (compare-and-swap on the previous world)."""
        import etcd

        try:
            c.read(f"{self.root}/done")
            return candidate
        except etcd.EtcdKeyNotFound:
            pass
        try:
            res = c.read(f"{self.root}/hosts", recursive=True)
            nodes = [n for n in res.leaves if n.key != f"{self.root}/hosts" and n.value is not None]
        except etcd.EtcdKeyNotFound:
            nodes = []
        nodes.sort(key=lambda n: n.createdIndex)
        try:
            node = c.read(f"{self.root}/world")
            prev, index = World.from_json(node.value), node.modifiedIndex
        except etcd.EtcdKeyNotFound:
            prev, index = None, None
        dead = self._probe_suspects(c, prev, nodes) if prev is not None else set()
        live = {n.key.rsplit("/", 1)[1]: json.loads(n.value) for n in nodes}
        live = {h: v for h, v in live.items() if h not in dead}
        order = list(live)
        w = next_world(prev, live, order, self.min_hosts, self.max_hosts)
        if w is None:
            return (None, 0.0)
        now = time.monotonic()
        w.refused = sorted(dead & set(w.lost))
        # The settle only batches hosts still registering: a proven death needs none, nor a
        # planned leave (the leaving hosts marked themselves; no host joins or is lost), nor
        # a world of max_hosts without a loss (no further host could come into it).
        planned = prev is not None and not w.lost and set(w.hosts) <= set(prev.hosts)
        full = not w.lost and len(w.hosts) == self.max_hosts
        if not dead and not planned and not full:
            if candidate[0] != w.hosts:
                return (w.hosts, now)
            if now - candidate[1] < self.settle:
                return candidate
        try:
            if index is None:
                c.write(f"{self.root}/world", w.to_json(), prevExist=False)
            else:
                c.write(f"{self.root}/world", w.to_json(), prevIndex=index)
            log.info(
                "job %s: world %d: %s (lost %s, refused %s, left %s)",
                self.job,
                w.epoch,
                w.hosts,
                w.lost,
                w.refused,
                w.left,
            )
        except (etcd.EtcdCompareFailed, etcd.EtcdAlreadyExist):
            pass  # another leader wrote one meanwhile: the next step starts from it
        return (None, 0.0)

    def _probe_suspects(self, c, prev: World, nodes) -> set[str]:
        """The leader, when a failure in world `prev` was reported (the suspect key): the
        hosts of it whose liveness port refuses a connect, their keys deleted (compare-and-
        delete on the modifiedIndex read: a key refreshed meanwhile stays). At most one
        probe per PROBE_EVERY s while the report stands (its key expires after the TTL)."""
        import etcd

        if time.monotonic() < self._next_probe:
            return set()
        try:
            if int(c.read(f"{self.root}/suspect").value) != prev.epoch:
                return set()
        except (etcd.EtcdKeyNotFound, ValueError):
            return set()
        self._next_probe = time.monotonic() + PROBE_EVERY
        by_name = {n.key.rsplit("/", 1)[1]: n for n in nodes}
        targets = {}
        for h in prev.hosts:
            if h != self.host_id and h in by_name and (t := probe_target(json.loads(by_name[h].value))):
                targets[h] = t
        self.probes += 1
        dead = set()
        for h in sorted(refused_hosts(targets)):
            try:
                c.delete(by_name[h].key, prevIndex=by_name[h].modifiedIndex)
            except (etcd.EtcdCompareFailed, etcd.EtcdKeyNotFound):
                continue  # refreshed meanwhile (alive after all), or gone already
            dead.add(h)
            log.warning(
                "job %s: host %s refused its liveness probe after a failure in world %d: lost", self.job, h, prev.epoch
            )
        return dead

    def _check_leader(self, c) -> None:
        """A non-leader whose worker reported a failure: probes the leader's liveness port and
        deletes the leader key of a dead leader (compare-and-delete on its value), so that an
        agent takes it on its next round instead of after the TTL."""
        import etcd

        try:
            leader = c.read(f"{self.root}/leader").value
            target = probe_target(json.loads(c.read(f"{self.root}/hosts/{leader}").value))
        except etcd.EtcdKeyNotFound:
            return
        self.probes += 1
        if leader == self.host_id or target is None or not refused_hosts({leader: target}):
            return
        try:
            c.delete(f"{self.root}/leader", prevValue=leader)
            log.warning("job %s: the leader %s refused its liveness probe: its leader key deleted", self.job, leader)
        except (etcd.EtcdCompareFailed, etcd.EtcdKeyNotFound):
            pass


# ---- the control directory between an agent and its workers ---------------------------


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class Control:
    """The files of one host's control directory: world-<e>.json, master-<e>, ready-<local rank>, failed-<e>."""

    def __init__(self, directory: str):
        self.dir = directory

    def write_world(self, w: World, abort: bool) -> None:
        d = json.loads(w.to_json())
        d["abort"] = abort
        _write_atomic(os.path.join(self.dir, f"world-{w.epoch}.json"), json.dumps(d))

    def write_master(self, epoch: int, address: str) -> None:
        _write_atomic(os.path.join(self.dir, f"master-{epoch}"), address)

    def write_ready(self, local_rank: int) -> None:
        _write_atomic(os.path.join(self.dir, f"ready-{local_rank}"), str(os.getpid()))

    def write_failed(self, epoch: int, local_rank: int, error: str) -> None:
        """A worker's collective or rendezvous of world `epoch` failed (the agent reports it)."""
        _write_atomic(os.path.join(self.dir, f"failed-{epoch}"), f"local rank {local_rank}: {error[:300]}")

    def failed(self, epoch: int) -> bool:
        return os.path.exists(os.path.join(self.dir, f"failed-{epoch}"))

    def ready(self, nproc: int) -> bool:
        return all(os.path.exists(os.path.join(self.dir, f"ready-{i}")) for i in range(nproc))

    def newest(self) -> tuple[int, Optional[dict]]:
        """(epoch, world record) of the newest world file, (0, None) when none."""
        epochs = [int(n[6:-5]) for n in os.listdir(self.dir) if n.startswith("world-") and n.endswith(".json")]
        if not epochs:
            return 0, None
        e = max(epochs)
        with open(os.path.join(self.dir, f"world-{e}.json")) as f:
            return e, json.load(f)

    def master(self, epoch: int) -> Optional[str]:
        try:
            with open(os.path.join(self.dir, f"master-{epoch}")) as f:
                return f.read().strip()
        except FileNotFoundError:
            return None


def serve_store(addr: str):
    """A fresh TCPStore on addr (port 0) for one epoch's rendezvous: (store, "addr:port")."""
    import datetime

    import torch.distributed as dist

    store = dist.TCPStore(addr, 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=300))
    return store, f"{addr}:{store.port}"


def default_host_id(store_url: str) -> str:
    """<hostname>-<store port>: one agent per store daemon."""
    return f"{socket.gethostname()}-{store_url.rstrip('/').rsplit(':', 1)[-1]}"


def __getattr__(name: str):
    """The worker's side lives in tenplex.member (Member, MemberJob, env_int): reached through
    this module too (tenplex.elastic.Job uses it so), imported on first use (no import cycle)."""
    if name in ("Member", "MemberJob", "env_int"):
        from . import member

        return getattr(member, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
