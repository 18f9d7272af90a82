"""The coordinator's side of tenplex.elastic: what rank 0 asks of the store daemons.

No torch here: every function talks to the daemons only (the native client and the
C++ two-phase commit through ``_tenplex.cluster_*``), so the rules can be tested
without a process group.

- ``probe_hosts``: every daemon's view of the job, retrying the ones that do not answer
  until a deadline. Silence is never "no job": a caller gets the unreachable hosts and
  refuses to start (``ElasticError`` naming them).
- ``resolve``: the owner recovery of the C++ side (``ResolvePending``): a commit that a
  dead coordinator or host left half done is finished (every participant prepared it)
  or rolled back, before anyone reads the job's state; ``roll_back_lost``: what it
  leaves undecided because the decision record's host is lost (outside the world).
- ``committed_state``: the newest version current on any host and whether every host of
  the world holds it (same number, same info); hosts are matched by host id.
- ``check_fence``: a commit that would release a version newer than the one this job
  restored from (another coordinator moved the job on) is refused.
- ``FatalElasticError`` and the fatal marker: an unrecoverable loss ends the job once,
  not once per torchrun restart.
- ``run_transform``: the distributed transform, which runs as ``tenplex transform`` in a
  process of its own on behalf of this coordinator (``TENPLEX_COORDINATOR``: the lease
  this process holds), not through the native module. Deliberately: the transform moves
  bytes over UCX, and the binding links no transport (``python/CMakeLists.txt``: no UCX
  in the training process, whose allocator and signal handlers UCX's would share); a
  UCX abort under load (docs/reliability.md) then fails the transform with a message
  instead of killing rank 0 with the job's state in its hands.
"""

import json
import logging
import math
import os
import signal
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Optional

from . import _tenplex

log = logging.getLogger("tenplex.elastic")

FATAL_EXIT_STATUS = 76  # an unrecoverable loss: the launcher must not restart the job
DEFAULT_CONNECT_TIMEOUT = 60.0  # seconds a restore waits for daemons that do not answer
DEFAULT_REQUEST_TIMEOUT = 120  # seconds one request to a daemon may take


class ElasticError(RuntimeError):
    pass


class FatalElasticError(ElasticError):
    """The job's state cannot be brought onto any world (every replica of some rank is
    gone): restarting the workers cannot help."""

    exit_status = FATAL_EXIT_STATUS


@dataclass
class HostView:
    """One daemon's answer: state "down" (no answer), "none" (answered, no such job) or
    "job" (current: its current version or None, with that version's info text)."""

    url: str
    state: str
    host_id: str = ""
    current: Optional[int] = None
    info: str = ""
    versions: list[dict] = field(default_factory=list)
    error: str = ""
    last: int = 0  # the highest version number the job has had there (rolled back ones too)


LEASE_TTL_MS = 10000  # rank 0's job lease: a dead rank 0 holds it up to this long


def connect(url: str, token: str, timeout_s: int = DEFAULT_REQUEST_TIMEOUT, coordinator: str = "") -> "_tenplex.Store":
    return _tenplex.Store.connect(url, token, timeout_s, coordinator)


class Coordinator:
    """Rank 0 as the job's one coordinator (store/lease.h): a name carried by every
    request that changes the job's versions, and the job's lease on every host, taken at
    the restore and renewed (a C++ thread) until release(). Another coordinator of the
    job (an operator's `tenplex transform`, a stale rank 0) waits or is refused; a rank 0
    that dies leaves the lease to expire after LEASE_TTL_MS."""

    def __init__(self, job: str, token: str, request_timeout: int, what: str = "tenplex-elastic"):
        self.job, self.token, self.request_timeout = job, token, request_timeout
        self.name = _tenplex.new_coordinator(what)
        self._lease = None

    def hold(self, urls: list[str]) -> None:
        """Takes the lease on the hosts that answer (waits TENPLEX_LEASE_WAIT, 60 s, for
        another coordinator); the one held already when it covers them."""
        if self._lease is not None and not self._lease.error() and set(urls) <= set(self._lease.hosts):
            return
        self.release()
        t0 = time.monotonic()
        try:  # wait_s left out: TENPLEX_LEASE_WAIT, parsed (and refused when malformed) in C++
            self._lease = _tenplex.JobLease(
                urls, self.token, self.job, self.name, LEASE_TTL_MS, timeout_s=min(self.request_timeout, 30)
            )
        except _tenplex.Error as e:
            raise ElasticError(f"job {self.job}: cannot become its coordinator: {e}") from None
        waited = time.monotonic() - t0
        if waited >= 1.0:  # another coordinator's lease (a dead rank 0's expires after LEASE_TTL_MS)
            log.warning("job %s: waited %.1f s for the job's lease before coordinating", self.job, waited)

    def check(self) -> None:
        """Raises when the lease was lost (another coordinator took it while this rank 0
        was stopped): this job must not decide anything more."""
        err = "not taken (restore first)" if self._lease is None else self._lease.error()
        if err:
            raise ElasticError(f"job {self.job}: rank 0 no longer holds the job's lease: {err}")

    def release(self) -> None:
        if self._lease is not None:
            self._lease.release()
            self._lease = None

    def env(self) -> dict[str, str]:
        """For a `tenplex transform` run on behalf of this coordinator (under its lease)."""
        return {"TENPLEX_COORDINATOR": self.name}


def _lease_call(url: str, method: str, job: str, token: str, timeout_s: float, holder: str = "") -> dict:
    """One request to a daemon's /v1/jobs/{job}/lease (store/lease.h); its JSON reply ({} for none)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if holder:
        headers["X-Tenplex-Coordinator"] = holder
    req = urllib.request.Request(
        f"{url}/v1/jobs/{urllib.parse.quote(job, safe='')}/lease", method=method, headers=headers
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        body = r.read()
    return json.loads(body) if body else {}


def break_leases(urls: list[str], job: str, token: str, dead: list[str], timeout_s: float = 10) -> list[str]:
    """Releases the job's lease on each daemon of `urls` whose holder's name starts with one of
    `dead` (coordinator names of processes known to be dead: the caller's proof, not a
    deadline), so that the next coordinator takes it at once instead of after LEASE_TTL_MS;
    a live coordinator's lease is never touched (a daemon releases only the holder named).
    Returns "url: holder" of each lease released; a daemon that does not answer is skipped
    (the lease's deadline decides there)."""
    released = []
    for url in urls:
        try:
            holder = _lease_call(url, "GET", job, token, timeout_s).get("holder")
            if isinstance(holder, str) and any(holder.startswith(p) for p in dead):
                _lease_call(url, "DELETE", job, token, timeout_s, holder)
                released.append(f"{url}: {holder}")
        except (OSError, ValueError) as e:
            log.warning("job %s: the lease of a dead coordinator stays on %s until it expires: %s", job, url, e)
    return released


def probe(url: str, job: str, token: str, timeout_s: int = DEFAULT_REQUEST_TIMEOUT) -> HostView:
    """The daemon's view of the job; "down" when it cannot be reached (other errors, such
    as a wrong token, raise: they do not go away by waiting)."""
    try:
        c = connect(url, token, timeout_s)
        hid = getattr(c, "host_id", "")
        try:
            j = c.job(job)
        except _tenplex.NotFoundError:
            return HostView(url, "none", hid)
        view = HostView(url, "job", hid, j["current"], versions=list(j["versions"]), last=int(j.get("last_version", 0)))
        for v in view.versions:
            if v["version"] == view.current:
                view.info = v["info"]
        return view
    except _tenplex.UnavailableError as e:
        return HostView(url, "down", error=str(e))


def probe_hosts(
    urls: list[str],
    job: str,
    token: str,
    connect_timeout: Optional[float],
    request_timeout: int = DEFAULT_REQUEST_TIMEOUT,
    poll: float = 0.5,
) -> list[HostView]:
    """Every daemon's view; the ones that do not answer are asked again until
    connect_timeout seconds passed (None or inf: forever; 0: once)."""
    limit = math.inf if connect_timeout is None else float(connect_timeout)
    deadline = time.monotonic() + limit
    views = [probe(u, job, token, request_timeout) for u in urls]
    warned = False
    while any(v.state == "down" for v in views) and time.monotonic() < deadline:
        if not warned:
            down = [v.url for v in views if v.state == "down"]
            log.warning(
                "job %s: store daemons %s do not answer; retrying for %s s",
                job,
                down,
                "ever" if limit == math.inf else f"{limit:g}",
            )
            warned = True
        time.sleep(min(poll, max(0.0, deadline - time.monotonic())))
        views = [v if v.state != "down" else probe(v.url, job, token, request_timeout) for v in views]
    return views


def same_host(url_a: str, id_a: str, url_b: str, id_b: str) -> bool:
    """Hosts are the same daemon when their host ids agree (URLs may differ: a host can
    be reached by another address); by URL only where a side has no id (an old daemon
    or info)."""
    if id_a and id_b:
        return id_a == id_b
    return url_a.rstrip("/") == url_b.rstrip("/")


def cluster_record(views: list[HostView], gpus_per_host: int) -> dict:
    """The "cluster" of a version's info: where its ranks live, with the host ids."""
    rec = {"hosts": [v.url for v in views], "gpus_per_host": gpus_per_host}
    if all(v.host_id for v in views):
        rec["host_ids"] = [v.host_id for v in views]
    return rec


def parse_info(text: str) -> "_tenplex.StateInfo":
    """A version's info, typed: parsed and validated by its C++ owner (StateInfo,
    transform/state_info.h); InvalidArgumentError (a ValueError) naming what is wrong.
    The elastic API commits the user's own fields: "model" may be absent (has_model)."""
    return _tenplex.StateInfo.parse(text, require_model=False)


def old_hosts(info: "_tenplex.StateInfo") -> list[tuple[str, str]]:
    """(url, host id) of each host where a version's ranks live (its placement)."""
    hosts, ids = list(info.hosts), list(info.host_ids)
    return list(zip(hosts, ids + [""] * (len(hosts) - len(ids))))


def rebase_cluster(info: "_tenplex.StateInfo", views: list[HostView], gpus_per_host: int) -> dict:
    """The cluster file of a version's placement (its info's "cluster"; these hosts with
    `gpus_per_host` when it has none) with each host's URL replaced by the one it answers
    at now (matched by host id): a host reached by another address is not lost."""
    if info.gpus_per_host is None:
        return {"hosts": [v.url for v in views], "gpus_per_host": gpus_per_host}
    out = {"hosts": [], "gpus_per_host": info.gpus_per_host}
    if info.host_ids:
        out["host_ids"] = list(info.host_ids)
    for u, i in old_hosts(info):
        now = [v.url for v in views if i and v.host_id == i]
        out["hosts"].append(now[0] if now else u)
    return out


def down_error(job: str, views: list[HostView], waited: Optional[float]) -> ElasticError:
    """The refusal to start when daemons of this world do not answer, naming the hosts
    (and those that held the newest version known)."""
    down = [v.url for v in views if v.state == "down"]
    newest = max((v for v in views if v.current is not None), key=lambda v: v.current or 0, default=None)
    held = ""
    if newest is not None:
        try:
            info = parse_info(newest.info)
            step, olds = info.step, old_hosts(info)
        except ValueError:  # not a valid info: its step and hosts are unknown
            step, olds = None, []
        holders = [u for u, i in olds if any(same_host(u, i, v.url, v.host_id) for v in views if v.state == "down")]
        held = (
            f"; version {newest.current} (step {step}) is the newest seen, held by {holders or 'hosts that answered'}"
        )
    else:
        held = "; no daemon that answered has the job, so whether it has committed state is unknown"
    wait = "forever" if waited is None else f"{waited:g} s"
    return ElasticError(
        f"job {job}: the store daemons {down} do not answer (waited {wait}){held}. The job does not "
        f"start over from step 0 on silence: start those daemons again (`tenplex store serve` with the "
        f"same --shm-dir), or wait longer (Job(connect_timeout=...) / TENPLEX_CONNECT_TIMEOUT, -1: forever)"
    )


def run_transform(
    exe: str, args: list[str], old_cluster: dict, new_cluster: dict, token: str, env_extra: dict[str, str]
) -> dict:
    """`tenplex transform` from the old cluster to the new one (on behalf of the job's
    coordinator: env_extra); its --json stats, or ElasticError with its message."""
    with tempfile.TemporaryDirectory(prefix="tenplex-elastic-") as tmp:
        old_path, new_path = os.path.join(tmp, "old.json"), os.path.join(tmp, "new.json")
        with open(old_path, "w") as f:
            json.dump(old_cluster, f)
        with open(new_path, "w") as f:
            json.dump(new_cluster, f)
        env = dict(os.environ, **env_extra)
        if token:
            env["TENPLEX_TOKEN"] = token
        p = subprocess.run(
            [exe, args[0], "--cluster", old_path, "--to-cluster", new_path] + args[1:],
            capture_output=True,
            text=True,
            env=env,
        )
    if p.returncode != 0:
        raise ElasticError(
            f"tenplex transform to {args[args.index('--to') + 1]} failed: {p.stderr.strip() or p.stdout.strip()}"
        )
    stats = json.loads(p.stdout)
    if stats.get("new_hosts") not in (None, new_cluster["hosts"]):
        raise ElasticError(
            f"tenplex transform placed the state on {stats.get('new_hosts')}, not on {new_cluster['hosts']}"
        )
    return stats


def resolve(
    urls: list[str], job: str, token: str, request_timeout: int = DEFAULT_REQUEST_TIMEOUT, coordinator: str = ""
) -> dict:
    """Owner recovery (ResolvePending) over the hosts: half-done commits finished or
    rolled back, leftover open versions removed; its lines are logged."""
    r = _tenplex.cluster_resolve(urls, token, job, True, request_timeout, coordinator)
    for line in r["lines"]:
        log.info("job %s: recovery: %s", job, line)
    return r


def roll_back_lost(
    urls: list[str],
    job: str,
    pending: list[int],
    fallback: int,
    token: str,
    request_timeout: int = DEFAULT_REQUEST_TIMEOUT,
    coordinator: str = "",
) -> list[int]:
    """Rolls back the versions the recovery left undecided, on hosts that are this world's
    and the old ones that answer (`urls`); the versions rolled back.

    The recovery leaves a version undecided only when its decision record (the first
    participant in commit order, two_phase.h) does not answer and no host that answers
    committed it. Under torchrun a host that does not answer is outside the world (every
    host of it answered), i.e. lost: a coordinator that died in the commit window
    together with the decision record's host (rank 0 on the first host) left it so.
    Whatever it decided was carried out on that host alone, so no live host may commit
    the version (its decision is unknown) and none needs it: it is aborted here and the
    job goes on from `fallback`, the newest version committed on the live hosts. A
    version that some host committed meanwhile is left to the next recovery (roll
    forward)."""
    done = []
    for v in pending:
        if not _tenplex.cluster_abort(urls, token, job, v, request_timeout, coordinator):
            log.warning("job %s: recovery: version %d was committed meanwhile: kept (rolled forward next)", job, v)
            continue
        done.append(v)
        log.warning(
            "job %s: recovery: version %d was prepared on the hosts that answer, but its decision record "
            "(the first host in commit order) is lost with its coordinator, outside this world, and no "
            "live host committed it: rolled back on %s; the job goes on from version %d",
            job,
            v,
            urls,
            fallback,
        )
    return done


def committed_state(views: list[HostView]) -> Optional[tuple[int, str, "_tenplex.StateInfo", bool]]:
    """(version, info text, info, held everywhere) of the newest version current on any
    answering host, or None when none has one. Held everywhere: every host of `views`
    reports it current with the same info (a host that missed a commit is stale). An
    info that is not valid (parse_info) raises InvalidArgumentError."""
    have = [(v.current, v) for v in views if v.state == "job" and v.current is not None]
    if not have:
        return None
    current, best = max(have, key=lambda p: p[0])
    everywhere = all(v.state == "job" and v.current == current and v.info == best.info for v in views)
    return current, best.info, parse_info(best.info), everywhere


def unchanged(info: "_tenplex.StateInfo", views: list[HostView], config: str, gpus_per_host: int) -> bool:
    """True when the version is already in `config` on exactly these hosts (by host id,
    in order) with this many ranks per host: no transform needed."""
    olds = old_hosts(info)
    return (
        info.config == _tenplex.Config.parse(config)
        and info.gpus_per_host == gpus_per_host
        and len(olds) == len(views)
        and all(same_host(u, i, v.url, v.host_id) for (u, i), v in zip(olds, views))
    )


def next_version_and_fence(views: list[HostView], job: str, restored: Optional[int]) -> int:
    """The version number one past any version any host has had (listed, or rolled back
    and gone: a number is not used again for other content), after refusing a commit
    that would release a version newer than `restored` (the version this job's state
    belongs to: None for a new job)."""
    nxt = 1
    for v in views:
        nxt = max(nxt, v.last + 1)
        for x in v.versions:
            nxt = max(nxt, int(x["version"]) + 1)
        if v.current is not None and (restored is None or v.current > restored):
            mine = "a new job (no version)" if restored is None else f"version {restored}"
            raise ElasticError(
                f"job {job}: refusing to commit: version {v.current} is current on {v.url}, newer than "
                f"{mine} this job restored from; another coordinator moved the job on (restart the "
                f"workers to restore version {v.current})"
            )
    return nxt


def prepare_commit(
    urls: list[str],
    job: str,
    version: int,
    token: str,
    request_timeout: int = DEFAULT_REQUEST_TIMEOUT,
    coordinator: str = "",
) -> dict:
    """Prepare everywhere, then commit everywhere (the C++ 2PC); raises on failure."""
    out = _tenplex.cluster_prepare_commit(urls, token, job, version, True, request_timeout, coordinator)
    if out["unconfirmed"]:
        log.warning(
            "job %s: version %d committed; hosts %s did not confirm (it is prepared there and "
            "is committed by the next restore's recovery)",
            job,
            version,
            [urls[i] for i in out["unconfirmed"]],
        )
    return out


def abort(
    urls: list[str],
    job: str,
    version: int,
    token: str,
    request_timeout: int = DEFAULT_REQUEST_TIMEOUT,
    coordinator: str = "",
) -> None:
    """Aborts an unfinished version on every host that answers (best effort: a host that
    does not keeps it open or prepared; the next restore's recovery removes it)."""
    try:
        if not _tenplex.cluster_abort(urls, token, job, version, request_timeout, coordinator):
            log.warning("job %s: version %d is already committed on its first host: kept", job, version)
    except _tenplex.Error as e:
        log.warning("job %s: aborting version %d: %s", job, version, e)


# ---- fatal losses ---------------------------------------------------------------------


def fatal_message(job: str, version: Optional[int], hosts: list[str], cause: str) -> str:
    """The one message of an unrecoverable loss, with the recovery commands."""
    return (
        f"tenplex.elastic: job {job} cannot continue: the state of version {version} cannot be placed "
        f"on this world: {cause}\nEvery replica of some rank is gone (its hosts are lost); restarting "
        f"the workers cannot help, so the job stops here (exit status {FATAL_EXIT_STATUS}). To recover:\n"
        f"  - bring the lost hosts' daemons back (`tenplex store serve --shm-dir` with their old shm "
        f"dir) and start the job again;\n"
        f"  - `tenplex store ls {job} --cluster CLUSTER.json` shows the versions left on the hosts "
        f"({' '.join(hosts)}), and `tenplex transform --recover --cluster CLUSTER.json --job {job}` "
        f"finishes or rolls back a half-done commit;\n"
        f"  - or load a checkpoint: `tenplex store load --cluster CLUSTER.json --job {job} --dir CKPT` "
        f"and start the job again."
    )


def fatal_marker(job: str) -> str:
    """The file that makes a fatal error final across torchrun's restarts:
    TENPLEX_FATAL_FILE, else one per job, torchrun run id and agent (this worker's
    parent, the same process across restarts; a new torchrun starts clean) in the temp
    directory."""
    path = os.environ.get("TENPLEX_FATAL_FILE")
    if path:
        return path
    run = os.environ.get("TORCHELASTIC_RUN_ID", "none").replace("/", "_")
    return os.path.join(tempfile.gettempdir(), f"tenplex-fatal-{job}-{run}-{os.getppid()}")


def read_fatal(job: str) -> Optional[str]:
    try:
        with open(fatal_marker(job)) as f:
            return f.read() or "a fatal error (no message recorded)"
    except OSError:
        return None


def record_fatal(job: str, message: str) -> None:
    path = fatal_marker(job)
    try:
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(message)
        os.replace(tmp, path)
    except OSError as e:
        log.warning("cannot record the fatal error in %s: %s", path, e)


def stop_agent() -> bool:
    """SIGTERM to this worker's torchrun agent (its parent, when it is one), so that it
    stops instead of restarting the workers; True when sent."""
    ppid = os.getppid()
    try:
        with open(f"/proc/{ppid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return False
    if not is_torchrun(argv):
        return False
    os.kill(ppid, signal.SIGTERM)
    return True


def is_torchrun(argv: list[str]) -> bool:
    """Whether argv launches torchrun: `torchrun ...`, `python .../torchrun ...` or
    `python -m torch.distributed.run ...`; not any command line that merely mentions it
    (a test script named torchrun_*.py, a ctest -R torchrun whose child is the worker)."""
    if not argv:
        return False
    if os.path.basename(argv[0]) == "torchrun":
        return True
    if len(argv) > 1 and os.path.basename(argv[1]) == "torchrun":
        return True
    return any(argv[i] == "-m" and argv[i + 1] == "torch.distributed.run" for i in range(len(argv) - 1))


def env_timeout(value: Optional[float], name: str, default: float) -> Optional[float]:
    """A timeout option: the argument, else the environment variable, else default;
    negative or inf: None (wait forever)."""
    if value is None:
        raw = os.environ.get(name)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            raise ElasticError(f"{name}={raw!r} is not a number of seconds") from None
    return None if value < 0 or math.isinf(value) else float(value)


def by_version(views: list[HostView]) -> dict[int, list[str]]:
    """current version -> the hosts reporting it (for messages)."""
    out: dict[int, list[str]] = {}
    for v in views:
        if v.current is not None:
            out.setdefault(v.current, []).append(v.url)
    return out
