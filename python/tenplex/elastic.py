"""Elastic jobs under torchrun, with the state in the per-host store daemons.

torchrun (torch.distributed.elastic) owns membership: one agent per host, a c10d
rendezvous, restarts of every worker when a host joins (``--nnodes=MIN:MAX``) or dies.
This module makes a training loop survive those restarts with a *different* parallel
config: every host runs ``tenplex store serve``; the job's state lives in those daemons
as one version number on all hosts; at start-up the workers re-place the last committed
version onto the new world (the distributed transform, docs/transform.md) and map their
local tensors from their own host's daemon.

    import tenplex.elastic as te
    job = te.Job("gpt", policy="policy.json", commit_every=10)
    job.init_process_group()                  # gloo/nccl, env:// from torchrun
    state = job.restore()                     # None for a new job, else .info / .tensors
    ...build the model for job.config, load state.tensors...
    while step < total:
        train_step()
        if job.step_done(step, info, state_tensors, last=step == total):  # commits every N
            job.finish()                      # steps and on SIGTERM; exits for a membership change
    job.close()                               # the end: a barrier, the process group down

Start-up (``restore``), all workers together:

1. The config is the policy's entry for WORLD_SIZE (a JSON object mapping world sizes
   to configs, ``{"4": "tp=2,pp=2", "6": "tp=2,dp=3"}``, a file or a dict).
2. Every worker's daemon URL (``TENPLEX_STORE_URL``, one per host) is all-gathered;
   host ``h`` of the new placement is the one of group rank ``h`` (torchrun numbers
   ranks host by host: rank = group_rank * LOCAL_WORLD_SIZE + local_rank), so rank r
   lives on the daemon of its own host.
3. Rank 0 (the coordinator) asks every daemon of this world for the job, retrying the
   silent ones until ``connect_timeout`` (TENPLEX_CONNECT_TIMEOUT, 60 s; -1: forever),
   then fails naming them: a job is new only when every daemon answered and none has
   it. The owner recovery of the C++ side (ResolvePending, ``_tenplex.cluster_resolve``)
   finishes or rolls back a commit a dead coordinator or host left half done; one left
   undecided because its decision record (the first host in commit order) is lost
   outside this world is rolled back on the live hosts, with a warning. The newest
   version current on any host is the state (its info's ``cluster``: where its ranks
   were, with the hosts' ids); it is used as it is only when it is in this config on
   these hosts (by host id) and current with the same info on all, else rank 0 runs
   ``tenplex transform --cluster OLD --to-cluster NEW`` (the C++ distributed transform:
   hosts that do not answer or missed a commit are lost and the plan reads replicas).
   The result is broadcast; a failure raises ``ElasticError`` on every worker. A
   transform that fails for data loss (every replica of some rank gone) ends the job:
   one message naming the recovery commands, a marker file (``TENPLEX_FATAL_FILE``, else
   one per job, run id and torchrun agent in the temp directory) that stops every later
   restart at once, this host's torchrun agent stopped, exit ``FATAL_EXIT_STATUS`` (76).
4. Each worker maps its rank's tensors of that version from its own daemon
   (copy-on-write shared memory: no bytes copied until written), after checking that
   it is the committed, current version there.

Commits (``step_done``): every ``commit_every`` steps, and at the first step boundary
after any worker got SIGTERM (torchrun's agent stops its workers so for a membership
change), the workers write their tensors into a new version on their own daemon (one
copy into shared memory); rank 0 begins that version before (same number and info on
every host, one past any version any host has had) and, once all workers reported
success, commits it with the C++ two-phase commit (``_tenplex.cluster_prepare_commit``:
prepare everywhere, durable; then CommitEverywhere, the first host first; old versions
released once every host confirmed) or aborts it everywhere. From the last prepare on
the decision is durable (a host that dies between the others' commits keeps the version
prepared; the next restore's recovery commits it). Rank 0 refuses a commit when some
host's current version is newer than the one this job restored from (another
coordinator moved the job on). One request may take ``request_timeout`` seconds
(TENPLEX_REQUEST_TIMEOUT, 120). With ``async_commit=True`` the periodic writes overlap
the next steps (a snapshot written by a background thread; the collectives of both
phases stay in the training thread, at a later ``step_done``). A planned change loses
no finished step; a failure loses the steps since the last commit.

A lost host is one of the version's hosts that is not in this world (its node left) or
that missed a commit: its ranks are re-placed from replicas by the transform. A daemon of
this world that does not answer is waited for, never taken as lost. A worker that stopped
for a change waits for its own SIGTERM (its agent restarts it) and exits 0; when none
comes within ``term_wait`` seconds (a planned scale-down, where the other agents see no
waiting host) it exits with status 3: torchrun answers with a new rendezvous.

Membership mode (TENPLEX_MEMBERSHIP, set by ``python -m tenplex.hostagent``; tenplex.membership):
workers stay alive. Rank and world come from the agent's worlds; a new world raises
step_done's stop flag; ``rejoin()`` (instead of finish()) joins the next world, then
restore() again; after a lost host, ``aborted(error)`` says the step's failure was the
agent's abort, and rejoin() restores from the last commit.
"""

import json
import os
import signal
import sys
import time
from typing import Any, Optional, Union

import torch.distributed as dist

from . import _tenplex
from . import elastic_cluster as _ec
from . import membership as _mb
from . import store as _store
from .elastic_cluster import FATAL_EXIT_STATUS, ElasticError, FatalElasticError  # noqa: F401 (the API)
from .elastic_commit import Commits as _Commits
from .elastic_policy import (  # noqa: F401 (re-exported: elastic.pick_config etc. are the API)
    SuggestPolicy,
    pick_choice,
    pick_config,
    read_policy,
    suggest_choice,
    suggest_config,
    tenplex_binary,
)
from .layout import Config  # noqa: F401 (elastic.Config)

log = _ec.log

STOP_EXIT_STATUS = 3  # stopped for a change but no SIGTERM came: ask torchrun for a new round


def process_age() -> float:
    """Seconds since this process started (Linux /proc; 0 where unknown): the share of
    a restart spent before the training script runs (interpreter, imports)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


class Restored:
    """The state a worker starts from: the version's info (a dict of its JSON, and
    ``state_info``: typed, validated by the C++ StateInfo) and the rank's tensors."""

    def __init__(
        self,
        version: int,
        info: dict[str, Any],
        tensors: dict[str, Any],
        seconds: float,
        state_info: Any = None,
    ) -> None:
        self.version, self.info, self.tensors, self.seconds = version, info, tensors, seconds
        self.state_info = state_info if state_info is not None else _ec.parse_info(json.dumps(info))

    @property
    def step(self) -> Optional[int]:
        return self.state_info.step


def _barrier_and_teardown() -> str:
    """A last barrier and the process group's teardown; returns the error text of a
    failed barrier ("" when it passed or no group exists)."""
    if not dist.is_initialized():
        return ""
    try:
        dist.barrier()
        dist.destroy_process_group()
    except RuntimeError as e:
        return str(e)
    return ""


class Job(_Commits, _mb.MemberJob):
    def __init__(
        self,
        job: str,
        policy: Union[str, dict[Any, Any]],
        commit_every: int = 0,
        store_url: Optional[str] = None,
        token: Optional[str] = None,
        term_wait: float = 15.0,
        log: Optional[str] = None,
        async_commit: bool = False,
        connect_timeout: Optional[float] = None,
        request_timeout: Optional[float] = None,
        exit_on_fatal: bool = True,
    ) -> None:
        """connect_timeout: seconds restore() waits for daemons that do not answer before it
        fails naming them (default TENPLEX_CONNECT_TIMEOUT or 60; -1: forever); never a new
        job on silence. request_timeout: seconds one request of the coordinator may take
        (TENPLEX_REQUEST_TIMEOUT or 120). exit_on_fatal: an unrecoverable loss exits the
        worker with FATAL_EXIT_STATUS (and stops its torchrun agent) instead of raising
        FatalElasticError."""
        if not job or "/" in job:
            raise ElasticError(f"job name {job!r} must be non-empty without '/'")
        if commit_every < 0:
            raise ElasticError(f"commit_every must be >= 0, got {commit_every}")
        self.job, self.commit_every, self.term_wait = job, commit_every, term_wait
        self.async_commit = async_commit  # periodic commits overlap the next steps (step_done)
        self._pending = None  # (version, info, start time, AsyncCommit) of an asynchronous commit
        self.policy = read_policy(policy)
        self.restart_count = _mb.env_int("TORCHELASTIC_RESTART_COUNT", 0)
        self._member = _mb.Member.from_env()  # in-process membership (tenplex.hostagent); None: torchrun
        self._set_world(self._member.next_world() if self._member else None)
        self.url = (store_url or os.environ.get("TENPLEX_STORE_URL") or "").rstrip("/")
        if not self.url.startswith("http://"):
            raise ElasticError(
                "give this host's store daemon as TENPLEX_STORE_URL=http://host:port "
                f"(got {self.url!r}); start it with `tenplex store serve`"
            )
        self.token = token if token is not None else os.environ.get("TENPLEX_TOKEN", "")
        self.log = log
        self.connect_timeout = _ec.env_timeout(connect_timeout, "TENPLEX_CONNECT_TIMEOUT", _ec.DEFAULT_CONNECT_TIMEOUT)
        rt = _ec.env_timeout(request_timeout, "TENPLEX_REQUEST_TIMEOUT", _ec.DEFAULT_REQUEST_TIMEOUT)
        self.request_timeout = max(1, int(rt if rt is not None else 24 * 3600))
        self.exit_on_fatal = exit_on_fatal
        self._coord = None  # rank 0: the job's coordinator (name and lease), from restore() on
        fatal = _ec.read_fatal(job)
        if fatal is not None:  # an earlier round of this run ended the job: do not try again
            self._fatal(fatal, recorded=True)
        self.hosts = None
        self.cluster = None  # the "cluster" record of the versions this job commits (hosts, ids)
        self.version = None  # the committed version this worker's state belongs to
        self._term = False
        self._stopping = False
        self._store: Optional[_store.Store] = None
        self._first_step = False
        signal.signal(signal.SIGTERM, self._on_term)

    # ---- signals ---------------------------------------------------------------------

    def _on_term(self, signum: int, frame: Any) -> None:
        self._term = True

    @property
    def term_requested(self) -> bool:
        return self._term

    # ---- process group and hosts -----------------------------------------------------

    def init_process_group(self, backend: str = "gloo", timeout: float = 120.0) -> None:
        import datetime

        self._pg = (backend, timeout)
        if self._member is not None:
            return self._join_world()
        dist.init_process_group(
            backend,
            init_method="env://",
            rank=self.rank,
            world_size=self.world_size,
            timeout=datetime.timedelta(seconds=timeout),
        )

    def _gather_hosts(self) -> list[str]:
        mine = (self.group_rank, self.local_rank, self.url)
        every: list[tuple[int, int, str]] = [mine] * self.world_size
        dist.all_gather_object(every, mine)
        by_group: dict[int, str] = {}
        for g, _local_rank, url in every:
            if by_group.setdefault(g, url) != url:
                raise ElasticError(
                    f"the workers of group rank {g} name different store daemons "
                    f"({by_group[g]} and {url}): set one TENPLEX_STORE_URL per host"
                )
        groups = sorted(by_group)
        if groups != list(range(len(groups))):
            raise ElasticError(f"group ranks {groups} are not 0..{len(groups) - 1}")
        urls = [by_group[g] for g in groups]
        if len(set(urls)) != len(urls):
            raise ElasticError(f"two hosts name the same store daemon: {urls}")
        return urls

    def _client(self, url: str) -> Any:
        return _ec.connect(url, self.token, self.request_timeout)

    def _local_store(self) -> _store.Store:
        """This host's daemon for the worker's own tensors: through shared memory when the
        client reaches it by a loopback address. The all-gathered URL is the one other
        hosts use (http://node-ip:port); a daemon listening on 0.0.0.0 is also reached
        as http://127.0.0.1:port (or TENPLEX_STORE_LOCAL_URL), which maps its files."""
        if self._store is None:
            client = self._client(self.url)
            if not client.local:
                local_url = (
                    os.environ.get("TENPLEX_STORE_LOCAL_URL") or "http://127.0.0.1:" + self.url.rsplit(":", 1)[1]
                )
                try:
                    lc = self._client(local_url)
                    if lc.local:
                        client = lc
                except _tenplex.Error:
                    pass  # HTTP bodies then: slower, same bytes
            self._store = _store.Store(client)
        return self._store

    # ---- coordinator -----------------------------------------------------------------

    def _log_event(self, rec: dict[str, Any]) -> None:
        if self.log and self.rank == 0:
            rec["time"] = round(time.time(), 3)
            with open(self.log, "a") as f:
                f.write(json.dumps(rec) + "\n")

    def _transform(self, urls: list[str], old_cluster: dict[str, Any]) -> dict[str, Any]:
        cmd = ["transform", "--job", self.job, "--to", self.config, "--json", "--quiet"]
        return _ec.run_transform(
            tenplex_binary(),
            cmd,
            old_cluster,
            {"hosts": urls, "gpus_per_host": self.local_world_size},
            self.token,
            self._coordinator().env(),
        )

    def _views(self, urls: list[str]) -> list[_ec.HostView]:
        """Every daemon's view of the job (retried until connect_timeout); ElasticError
        naming the daemons that still do not answer, or two hosts that are one daemon."""
        views = _ec.probe_hosts(urls, self.job, self.token, self.connect_timeout, self.request_timeout)
        if any(v.state == "down" for v in views):
            raise _ec.down_error(self.job, views, self.connect_timeout)
        for i, v in enumerate(views):
            for w in views[:i]:
                if v.host_id and v.host_id == w.host_id:
                    raise ElasticError(
                        f"{w.url} and {v.url} are one store daemon (host id {v.host_id}): "
                        "set one TENPLEX_STORE_URL per host, each host its own daemon"
                    )
        return views

    def _answers(self, url: str) -> bool:
        """True when an old host outside this world still answers as a store daemon (its
        versions then take part in the recovery); a dead one or another service: no."""
        try:
            return _ec.probe(url, self.job, self.token, self.request_timeout).state != "down"
        except _tenplex.Error:
            return False

    def _coordinate_restore(self, urls: list[str]) -> dict[str, Any]:
        """Rank 0: brings the committed state onto this world; returns the record to broadcast.

        Every daemon of this world must answer (retried until connect_timeout): a job
        starts new only when all answered and none has it. Half-done commits are finished
        or rolled back first (ResolvePending, also on the old hosts still answering); the
        newest committed version is then used as it is only when it is in this config on
        these hosts (by host id) and current with the same info on every one of them, else
        the transform re-places it (a stale host's ranks come from replicas)."""
        t0 = time.perf_counter()
        views = self._views(urls)
        found = _ec.committed_state(views)
        extra = []  # hosts of the newest version outside this world: recovery asks them too
        if found is not None:
            extra = [
                u
                for u, i in _ec.old_hosts(found[2])
                if not any(_ec.same_host(u, i, v.url, v.host_id) for v in views) and self._answers(u)
            ]
        self._coord = self._coord or _ec.Coordinator(
            self.job, self.token, self.request_timeout, self._coordinator_what()
        )
        self._break_dead_leases(urls + extra)  # membership mode: a dead host's rank 0 held it
        self._coord.hold(urls + extra)  # then read again: nobody else changes the job from here on
        views = self._views(urls)
        found = _ec.committed_state(views)
        if any(v.state == "job" for v in views):
            res = _ec.resolve(urls + extra, self.job, self.token, self.request_timeout, self._coord.name)
            views = self._views(urls)
            found = _ec.committed_state(views)
            if found is None and res["pending"]:
                raise ElasticError(
                    f"job {self.job}: version(s) {res['pending']} are prepared but undecided "
                    f"(a host that took part does not answer) and no version is committed: "
                    f"bring that host's daemon back; {'; '.join(res['lines'])}"
                )
            if res["pending"]:
                views, found = self._resolve_lost(urls, extra)
        cluster = _ec.cluster_record(views, self.local_world_size)
        if found is None:
            return {"version": None, "cluster": cluster}
        version, _, info, everywhere = found
        old_cluster = _ec.rebase_cluster(info, views, self.local_world_size)
        rec = {
            "version": version,
            "from": str(info.config),
            "transformed": False,
            "cluster": cluster,
            "step": info.step,
        }
        if not (everywhere and _ec.unchanged(info, views, self.config, self.local_world_size)):
            if not everywhere:
                log.warning(
                    "job %s: version %d is not current on every host (%s): re-placing it",
                    self.job,
                    version,
                    _ec.by_version(views),
                )
            # The cluster file must list the old hosts; those gone stay in it (not answering = lost).
            try:
                stats = self._transform(urls, old_cluster)
            except ElasticError as e:
                if "no surviving replica" in str(e):
                    where = list(dict.fromkeys(urls + [u for u, _ in _ec.old_hosts(info)]))
                    raise FatalElasticError(_ec.fatal_message(self.job, version, where, str(e))) from None
                raise
            rec.update(
                version=stats["to_version"],
                transformed=True,
                lost_hosts=stats.get("lost_hosts", []),
                bytes_moved=stats.get("plan", {}).get("bytes_total"),
                transform_stats_seconds=stats["seconds"],
            )
        rec["transform_seconds"] = round(time.perf_counter() - t0, 4)
        return rec

    def _guarded_restore(self, urls: list[str]) -> dict[str, Any]:
        """Rank 0: _coordinate_restore's record, or its error as one ({"error"}, "fatal": True
        for a loss that ends the job)."""
        try:
            return self._coordinate_restore(urls)
        except FatalElasticError as e:
            return {"error": str(e), "fatal": True}
        except (ElasticError, _tenplex.Error, OSError, ValueError) as e:
            return {"error": str(e)}

    def _resolve_lost(self, urls: list[str], extra: list[str]) -> tuple[list[_ec.HostView], Any]:
        """(views, committed state) after versions that the recovery left undecided are decided
        again, now that every daemon of this world answers (_views), and those still undecided,
        which wait on hosts outside this world only (lost), are rolled back (roll_back_lost)."""
        coord = self._coordinator()
        res = _ec.resolve(urls + extra, self.job, self.token, self.request_timeout, coord.name)
        views = self._views(urls)
        found = _ec.committed_state(views)
        if (
            res["pending"]
            and found is not None
            and _ec.roll_back_lost(
                urls + extra, self.job, res["pending"], found[0], self.token, self.request_timeout, coord.name
            )
        ):
            views = self._views(urls)
            found = _ec.committed_state(views)
        return views, found

    def restore(self, device: Any = None) -> Optional[Restored]:
        """Brings the job's committed state onto this world; None for a new job. With a
        device ("cuda", "cuda:1", "cpu") the tensors are loaded onto it (tenplex.device),
        else they map the store's files."""
        if not dist.is_initialized():
            raise ElasticError("call init_process_group() (or torch.distributed.init_process_group) first")
        t0 = time.perf_counter()
        age = process_age()
        self.hosts = hosts = self._gather_hosts()
        gathered = time.perf_counter()
        box: list[dict[str, Any]] = [{}]
        if self.rank == 0:
            early = self._early_record(hosts)  # membership mode: started by rejoin()
            box[0] = early if early is not None else self._guarded_restore(hosts)
        dist.broadcast_object_list(box, src=0)
        rec = box[0]
        if rec.get("fatal"):
            self._fatal(rec["error"])
        if "error" in rec:
            raise ElasticError(rec["error"])
        self.cluster = rec["cluster"]
        if rec["version"] is None:
            self._log_event(
                {
                    "event": "elastic_start",
                    "world_size": self.world_size,
                    "config": self.config,
                    "hosts": len(hosts),
                    "version": None,
                    "restart_count": self.restart_count,
                    "process_seconds": round(age, 3),
                }
            )
            return None
        self.version = rec["version"]
        t1 = time.perf_counter()
        infos, tensors, err = self._load_own(device)
        load_s = time.perf_counter() - t1
        flags: list[str] = [""] * self.world_size
        dist.all_gather_object(flags, err)
        errors = [e for e in flags if e]
        if errors:
            raise ElasticError("; ".join(errors))
        assert infos is not None and tensors is not None  # err was "" on this rank
        self._log_event(
            {
                "event": "elastic_start",
                "world_size": self.world_size,
                "config": self.config,
                "hosts": len(hosts),
                "version": self.version,
                "from": rec.get("from"),
                "step": infos[1].step,
                "transformed": rec.get("transformed"),
                "lost_hosts": rec.get("lost_hosts", []),
                "bytes_moved": rec.get("bytes_moved"),
                "gather_seconds": round(gathered - t0, 4),
                "transform_seconds": rec["transform_seconds"],
                "load_seconds": round(load_s, 4),
                "restart_count": self.restart_count,
                "process_seconds": round(age, 3),
            }
        )
        return Restored(self.version, infos[0], tensors, time.perf_counter() - t0, infos[1])

    def _load_own(self, device: Any) -> tuple[Optional[tuple], Optional[dict], str]:
        """((info, typed info), tensors, "") of this rank from its own daemon, which must
        have the restored version committed and current; else (None, None, the error)."""
        st = self._local_store()
        try:
            cur = st.status(self.job)
            if cur["version"] != self.version or not cur["committed"]:
                return (
                    None,
                    None,
                    (
                        f"rank {self.rank}: version {self.version} of job {self.job} is not the "
                        f"committed version on {self.url} (it has version {cur['version']})"
                    ),
                )
            info = st.status(self.job, self.version)
            typed = _ec.parse_info(json.dumps(info))
            if typed.config != _tenplex.Config.parse(self.config):
                return None, None, f"version {self.version} is in config {typed.config}, not {self.config}"
            return (info, typed), st.load_state(self.job, self.rank, self.version, device=device), ""
        except (_tenplex.Error, OSError, ValueError) as e:
            return None, None, f"rank {self.rank}: loading version {self.version} from {self.url}: {e}"

    def _fatal(self, message: str, recorded: bool = False) -> None:
        """An unrecoverable loss: the message once (rank 0, or a worker that found the
        marker), the marker that makes the next restart stop at once, the torchrun agent
        stopped (local rank 0), then exit FATAL_EXIT_STATUS (or raise FatalElasticError)."""
        if not recorded:
            _ec.record_fatal(self.job, message)
        if recorded:
            message += (
                f"\n(recorded by an earlier round of this run in {_ec.fatal_marker(self.job)}; "
                "remove that file to try again)"
            )
        if self.rank == 0 or recorded:
            log.critical("%s", message)
        if self._coord is not None:
            self._coord.release()
        if self.exit_on_fatal:
            if self.local_rank == 0 and _ec.stop_agent():
                log.info("job %s: stopped this host's torchrun agent (fatal error)", self.job)
            sys.exit(FATAL_EXIT_STATUS)
        raise FatalElasticError(message)

    def close(self) -> None:
        """At the end of the job, after the last step's commit: a barrier, then the
        process group's teardown. Without it the ranks that see the commit's outcome
        first exit and close their connections while a slower rank may still be inside
        that collective; it fails ("Connection closed by peer"), torchrun counts the
        failure and restarts its group, whose rendezvous then waits for agents that have
        already finished (their exit barrier). The job's state is committed by then, so
        a failing peer is reported, not raised."""
        if self._coord is not None:
            self._coord.release()
        err = _barrier_and_teardown()
        if err:
            log.warning(
                "tenplex.elastic: rank %d: the closing barrier failed after the last commit (version %s): %s",
                self.rank,
                self.version,
                err,
            )

    def finish(self) -> None:
        """After step_done returned True: wait for this worker's SIGTERM and exit (0), or
        exit with STOP_EXIT_STATUS after term_wait seconds without one."""
        self._stopping = True
        if self._coord is not None:
            self._coord.release()
        _barrier_and_teardown()  # a peer that died meanwhile changes nothing here
        deadline = time.monotonic() + self.term_wait
        while not self._term and time.monotonic() < deadline:
            time.sleep(0.05)
        self._log_event({"event": "elastic_exit", "sigterm": self._term})
        sys.exit(0 if self._term else STOP_EXIT_STATUS)
