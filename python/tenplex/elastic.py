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
3. Rank 0 (the coordinator) finds the job's committed version on the daemons (the
   newest; its info's ``cluster`` says where its ranks were) and, unless it is already
   in this config on these hosts, runs ``tenplex transform --cluster OLD --to-cluster
   NEW`` (the C++ distributed transform: two-phase commit, hosts that do not answer are
   lost and the plan reads their replicas). Its result is broadcast; on failure every
   worker raises ``ElasticError`` with the coordinator's message.
4. Each worker maps its rank's tensors of that version from its own daemon
   (copy-on-write shared memory: no bytes copied until written).

Commits (``step_done``): every ``commit_every`` steps, and at the first step boundary
after any worker got SIGTERM (torchrun's agent stops its workers so for a membership
change), the workers write their tensors into a new version on their own daemon (one
copy into shared memory), rank 0 begins that version (same number and info on every
host, one past any version any host has had) before and commits it on every host after
all workers reported success (phase one: every write done; phase two: the commits, a
rename each), or aborts it everywhere. With ``async_commit=True`` the periodic writes
overlap the following steps (a snapshot of the tensors, on their GPU when they are there,
written by a background thread); the collectives of both phases stay in the training
thread, at a later ``step_done``. A planned change therefore loses no finished
step; a failure loses the steps since the last commit.

A lost host is a daemon that does not answer: its ranks are re-placed from replicas by
the transform. A worker that stopped for a change waits for its own SIGTERM (its agent
restarts it) and exits 0; when none comes within ``term_wait`` seconds (a planned
scale-down, where the other agents see no waiting host) it exits with status 3, which
torchrun treats as a failure and answers with a new rendezvous.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist

from . import _tenplex
from . import store as _store
from .layout import Config


class ElasticError(RuntimeError):
    pass


STOP_EXIT_STATUS = 3  # stopped for a change but no SIGTERM came: ask torchrun for a new round


class SuggestPolicy:
    """The config policy (``tenplex config suggest``, docs/policy.md) instead of a table:
    for each world size the best-ranked config that fits and uses every worker."""

    def __init__(self, args):
        self.args = list(args)


def read_policy(policy):
    """{world size: config string} from a policy file path, a JSON text or a dict; or, for
    ``"suggest:ARGS"`` (e.g. ``"suggest:--model m.json --device-profile cpu"``), a
    SuggestPolicy that asks ``tenplex config suggest ARGS`` at start-up."""
    if isinstance(policy, str) and policy.startswith("suggest:"):
        args = policy[len("suggest:"):].split()
        if "--model" not in args:
            raise ElasticError(f"policy {policy!r}: suggest needs --model M (the model JSON or a preset)")
        return SuggestPolicy(args)
    if isinstance(policy, dict):
        raw = policy
    else:
        text = policy
        if not policy.lstrip().startswith("{"):
            try:
                with open(policy) as f:
                    text = f.read()
            except OSError as e:
                raise ElasticError(f"cannot read policy file {policy}: {e}") from None
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise ElasticError(f"policy {policy}: not JSON ({e})") from None
    if not isinstance(raw, dict) or not raw:
        raise ElasticError("policy: expected a JSON object mapping world sizes to configs, "
                           "e.g. {\"4\": \"tp=2,pp=2\", \"2\": \"tp=2\"}")
    out = {}
    for k, v in raw.items():
        try:
            n = int(k)
        except (TypeError, ValueError):
            n = 0
        if n < 1 or not isinstance(v, str):
            raise ElasticError(f"policy: entry {k!r}: {v!r} is not world size -> config string")
        try:
            cfg = Config.parse(v)
        except _tenplex.Error as e:
            raise ElasticError(f"policy: entry {k!r}: {e}") from None
        if cfg.world_size != n:
            raise ElasticError(f"policy: entry {k!r}: config {v} has world size {cfg.world_size}, not {n}")
        out[n] = str(cfg)
    return out


def suggest_choice(policy, world_size, gpus_per_host=None):
    """The best config of `tenplex config suggest` that fits and uses all world_size
    workers, and its Megatron-LM arguments (the knobs the policy chose with it:
    micro-batch, recomputation, sequence parallelism, virtual stages)."""
    cmd = [tenplex_binary(), "config", "suggest", *policy.args, "--gpus", str(world_size), "--all", "--json"]
    if gpus_per_host and "--gpus-per-host" not in policy.args:
        cmd += ["--gpus-per-host", str(gpus_per_host)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise ElasticError(f"tenplex config suggest failed: {(r.stderr or r.stdout).strip()}")
    try:
        configs = json.loads(r.stdout)["configs"]
    except (ValueError, KeyError, TypeError) as e:
        raise ElasticError(f"tenplex config suggest: unreadable output ({e})") from None
    for c in configs:
        cfg = Config.parse(c["config"])
        if c.get("fits") and cfg.world_size == world_size:
            return str(cfg), list(c.get("megatron_args", []))
    raise ElasticError(f"tenplex config suggest has no config that fits on {world_size} workers")


def suggest_config(policy, world_size, gpus_per_host=None):
    """The config of suggest_choice."""
    return suggest_choice(policy, world_size, gpus_per_host)[0]


def pick_choice(policy, world_size, gpus_per_host=None):
    """(config, Megatron-LM arguments of its knobs) for world_size: a table policy gives
    no arguments, a suggest: policy those of its choice."""
    if isinstance(policy, SuggestPolicy):
        return suggest_choice(policy, world_size, gpus_per_host)
    if world_size not in policy:
        raise ElasticError(f"the policy has no config for world size {world_size} "
                           f"(it has {sorted(policy)}): add an entry or change --nnodes/--nproc_per_node")
    return policy[world_size], []


def pick_config(policy, world_size, gpus_per_host=None):
    """The policy's config for world_size, or ElasticError naming the sizes it has."""
    return pick_choice(policy, world_size, gpus_per_host)[0]


def _env_int(name, default=None):
    v = os.environ.get(name)
    if v is None:
        if default is None:
            raise ElasticError(f"{name} is not set: run under torchrun")
        return default
    try:
        return int(v)
    except ValueError:
        raise ElasticError(f"{name}={v!r} is not an integer") from None


def process_age():
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


def tenplex_binary():
    """The tenplex CLI: TENPLEX_BIN, else `tenplex` on PATH, else this checkout's build."""
    exe = os.environ.get("TENPLEX_BIN") or shutil.which("tenplex")
    if exe:
        return exe
    here = os.path.dirname(os.path.abspath(__file__))
    built = os.path.join(here, "..", "..", "build", "bin", "tenplex")
    if os.path.exists(built):
        return os.path.abspath(built)
    raise ElasticError("cannot find the tenplex CLI: set TENPLEX_BIN or put tenplex on PATH")


class Restored:
    """The state a worker starts from: the version's info and the rank's tensors."""

    def __init__(self, version, info, tensors, seconds):
        self.version, self.info, self.tensors, self.seconds = version, info, tensors, seconds

    @property
    def step(self):
        return self.info.get("step")


def _barrier_and_teardown():
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


class Job:
    def __init__(self, job, policy, commit_every=0, store_url=None, token=None, term_wait=15.0, log=None,
                 async_commit=False):
        if not job or "/" in job:
            raise ElasticError(f"job name {job!r} must be non-empty without '/'")
        if commit_every < 0:
            raise ElasticError(f"commit_every must be >= 0, got {commit_every}")
        self.job, self.commit_every, self.term_wait = job, commit_every, term_wait
        self.async_commit = async_commit  # periodic commits overlap the next steps (step_done)
        self._pending = None  # (version, info, start time, AsyncCommit) of an asynchronous commit
        self.policy = read_policy(policy)
        self.world_size = _env_int("WORLD_SIZE")
        self.rank = _env_int("RANK")
        self.local_rank = _env_int("LOCAL_RANK")
        self.local_world_size = _env_int("LOCAL_WORLD_SIZE")
        self.group_rank = _env_int("GROUP_RANK")
        self.restart_count = _env_int("TORCHELASTIC_RESTART_COUNT", 0)
        if self.rank != self.group_rank * self.local_world_size + self.local_rank:
            raise ElasticError(f"rank {self.rank} is not group_rank {self.group_rank} x {self.local_world_size} + "
                               f"local_rank {self.local_rank}: every host must run the same --nproc_per_node")
        # knobs: the Megatron-LM arguments the policy chose with the config (suggest:
        # policies; none for a table), for the training script to apply
        self.config, self.knobs = pick_choice(self.policy, self.world_size, self.local_world_size)
        self.url = (store_url or os.environ.get("TENPLEX_STORE_URL") or "").rstrip("/")
        if not self.url.startswith("http://"):
            raise ElasticError("give this host's store daemon as TENPLEX_STORE_URL=http://host:port "
                               f"(got {self.url!r}); start it with `tenplex store serve`")
        self.token = token if token is not None else os.environ.get("TENPLEX_TOKEN", "")
        self.log = log
        self.hosts = None
        self.version = None  # the committed version this worker's state belongs to
        self._term = False
        self._stopping = False
        self._store = None
        signal.signal(signal.SIGTERM, self._on_term)

    # ---- signals ---------------------------------------------------------------------

    def _on_term(self, signum, frame):
        self._term = True

    @property
    def term_requested(self):
        return self._term

    # ---- process group and hosts -----------------------------------------------------

    def init_process_group(self, backend="gloo", timeout=120.0):
        import datetime
        dist.init_process_group(backend, init_method="env://", rank=self.rank, world_size=self.world_size,
                                timeout=datetime.timedelta(seconds=timeout))

    def _gather_hosts(self):
        mine = (self.group_rank, self.local_rank, self.url)
        every = [None] * self.world_size
        dist.all_gather_object(every, mine)
        by_group = {}
        for g, lr, url in every:
            if by_group.setdefault(g, url) != url:
                raise ElasticError(f"the workers of group rank {g} name different store daemons "
                                   f"({by_group[g]} and {url}): set one TENPLEX_STORE_URL per host")
        groups = sorted(by_group)
        if groups != list(range(len(groups))):
            raise ElasticError(f"group ranks {groups} are not 0..{len(groups) - 1}")
        urls = [by_group[g] for g in groups]
        if len(set(urls)) != len(urls):
            raise ElasticError(f"two hosts name the same store daemon: {urls}")
        return urls

    def _client(self, url):
        return _tenplex.Store.connect(url, self.token)

    def _local_store(self):
        """This host's daemon for the worker's own tensors: through shared memory when the
        client reaches it by a loopback address. The all-gathered URL is the one other
        hosts use (http://node-ip:port); a daemon listening on 0.0.0.0 is also reached
        as http://127.0.0.1:port (or TENPLEX_STORE_LOCAL_URL), which maps its files."""
        if self._store is None:
            client = self._client(self.url)
            if not client.local:
                local_url = os.environ.get("TENPLEX_STORE_LOCAL_URL") or \
                    "http://127.0.0.1:" + self.url.rsplit(":", 1)[1]
                try:
                    lc = self._client(local_url)
                    if lc.local:
                        client = lc
                except _tenplex.Error:
                    pass  # HTTP bodies then: slower, same bytes
            self._store = _store.Store(client)
        return self._store

    # ---- coordinator -----------------------------------------------------------------

    def _log_event(self, rec):
        if self.log and self.rank == 0:
            rec["time"] = round(time.time(), 3)
            with open(self.log, "a") as f:
                f.write(json.dumps(rec) + "\n")

    def _find_committed(self, urls):
        """(version, info text, info) of the newest current version on the hosts, or None."""
        best = None
        for u in urls:
            try:
                v = self._client(u).version(self.job, None)
            except _tenplex.NotFoundError:
                continue
            except _tenplex.UnavailableError:
                continue
            if best is None or v["version"] > best["version"]:
                best = v
        if best is None:
            return None
        return best["version"], best["info"], json.loads(best["info"] or "{}")

    def _transform(self, urls, old_cluster):
        exe = tenplex_binary()
        with tempfile.TemporaryDirectory(prefix="tenplex-elastic-") as tmp:
            old_path, new_path = os.path.join(tmp, "old.json"), os.path.join(tmp, "new.json")
            with open(old_path, "w") as f:
                json.dump(old_cluster, f)
            with open(new_path, "w") as f:
                json.dump({"hosts": urls, "gpus_per_host": self.local_world_size}, f)
            env = dict(os.environ)
            if self.token:
                env["TENPLEX_TOKEN"] = self.token
            p = subprocess.run([exe, "transform", "--cluster", old_path, "--to-cluster", new_path, "--job", self.job,
                                "--to", self.config, "--json", "--quiet"], capture_output=True, text=True, env=env)
        if p.returncode != 0:
            raise ElasticError(f"tenplex transform to {self.config} failed: {p.stderr.strip() or p.stdout.strip()}")
        stats = json.loads(p.stdout)
        if stats.get("new_hosts") not in (None, urls):
            raise ElasticError(f"tenplex transform placed the state on {stats.get('new_hosts')}, not on {urls}")
        return stats

    def _coordinate_restore(self, urls):
        """Rank 0: brings the committed state onto this world; returns the record to broadcast."""
        t0 = time.perf_counter()
        found = self._find_committed(urls)
        if found is None:
            return {"version": None}
        version, _, info = found
        old_cluster = info.get("cluster") or {"hosts": urls, "gpus_per_host": self.local_world_size}
        rec = {"version": version, "from": info.get("config"), "transformed": False}
        if info.get("config") != self.config or old_cluster.get("hosts") != urls \
                or old_cluster.get("gpus_per_host") != self.local_world_size:
            # The cluster file must list the old hosts; those gone stay in it (not answering = lost).
            stats = self._transform(urls, old_cluster)
            rec.update(version=stats["to_version"], transformed=True, lost_hosts=stats.get("lost_hosts", []),
                       bytes_moved=stats.get("plan", {}).get("bytes_total"), transform_stats_seconds=stats["seconds"])
        rec["transform_seconds"] = round(time.perf_counter() - t0, 4)
        return rec

    def restore(self, device=None):
        """Brings the job's committed state onto this world; None for a new job. With a
        device ("cuda", "cuda:1", "cpu") the tensors are loaded onto it (tenplex.device),
        else they map the store's files."""
        if not dist.is_initialized():
            raise ElasticError("call init_process_group() (or torch.distributed.init_process_group) first")
        t0 = time.perf_counter()
        age = process_age()
        self.hosts = self._gather_hosts()
        gathered = time.perf_counter()
        rec = [None]
        if self.rank == 0:
            try:
                rec[0] = self._coordinate_restore(self.hosts)
            except (ElasticError, _tenplex.Error, OSError, ValueError) as e:
                rec[0] = {"error": str(e)}
        dist.broadcast_object_list(rec, src=0)
        rec = rec[0]
        if "error" in rec:
            raise ElasticError(rec["error"])
        if rec["version"] is None:
            self._log_event({"event": "elastic_start", "world_size": self.world_size, "config": self.config,
                             "hosts": len(self.hosts), "version": None, "restart_count": self.restart_count,
                             "process_seconds": round(age, 3)})
            return None
        self.version = rec["version"]
        t1 = time.perf_counter()
        st = self._local_store()
        info = st.status(self.job, self.version)
        tensors = st.load_state(self.job, self.rank, self.version, device=device)
        load_s = time.perf_counter() - t1
        ok = torch.tensor([1 if info.get("config") == self.config else 0])
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        if ok.item() != 1:
            raise ElasticError(f"version {self.version} is in config {info.get('config')}, not {self.config}")
        self._log_event({"event": "elastic_start", "world_size": self.world_size, "config": self.config,
                         "hosts": len(self.hosts), "version": self.version, "from": rec.get("from"),
                         "step": info.get("step"), "transformed": rec.get("transformed"),
                         "lost_hosts": rec.get("lost_hosts", []), "bytes_moved": rec.get("bytes_moved"),
                         "gather_seconds": round(gathered - t0, 4), "transform_seconds": rec["transform_seconds"],
                         "load_seconds": round(load_s, 4), "restart_count": self.restart_count,
                         "process_seconds": round(age, 3)})
        return Restored(self.version, info, tensors, time.perf_counter() - t0)

    # ---- commits ---------------------------------------------------------------------

    def _next_version(self):
        nxt = 1
        for u in self.hosts:
            try:
                for v in self._client(u).job(self.job)["versions"]:
                    nxt = max(nxt, int(v["version"]) + 1)
            except _tenplex.NotFoundError:
                pass
        return nxt

    def _abort(self, version, urls):
        """Drops an open version wherever it was begun (best effort: a host that does
        not answer keeps it open; the next version number skips it)."""
        for u in urls if version is not None else []:
            try:
                self._client(u).abort(self.job, version)
            except (_tenplex.Error, OSError):
                pass

    def commit(self, info, tensors):
        """Two-phase commit of every rank's tensors as a new version on all hosts.

        info: the training fields (model, config, step, samples_consumed, ...);
        tensors: {local name: tensor} of this rank, on the CPU or a CUDA device. Returns
        the version number."""
        self.finish_pending()
        v, info, t0 = self._begin_commit(info)
        err = ""
        try:
            self._local_store().save_state(self.job, v, self.rank, dict(tensors))
        except (_tenplex.Error, OSError, RuntimeError) as e:
            err = f"rank {self.rank}: writing into {self.url}: {e}"
        return self._end_commit(v, info, t0, err)

    def _begin_commit(self, info):
        """Rank 0 begins the version on every host; (version, info, start time) on all ranks."""
        if self.hosts is None:
            raise ElasticError("commit before restore(): the hosts are not known yet")
        t0 = time.perf_counter()
        info = dict(info, cluster={"hosts": self.hosts, "gpus_per_host": self.local_world_size})
        text = json.dumps(info, sort_keys=True)
        rec = [None]
        if self.rank == 0:
            begun = []
            try:
                v = self._next_version()
                for u in self.hosts:
                    self._client(u).begin_version(self.job, v, text)
                    begun.append(u)
                rec[0] = {"version": v}
            except (_tenplex.Error, OSError) as e:
                self._abort(v if begun else None, begun)
                rec[0] = {"error": f"beginning the commit's version: {e}"}
        dist.broadcast_object_list(rec, src=0)
        if "error" in rec[0]:
            raise ElasticError(rec[0]["error"])
        return rec[0]["version"], info, t0

    def _end_commit(self, v, info, t0, err):
        """Phase one (every rank's write done: `err` is this rank's failure or "") and
        phase two (rank 0 commits on every host, or aborts everywhere)."""
        flags = [None] * self.world_size
        dist.all_gather_object(flags, err)  # phase one: every rank's bytes are in its daemon
        errors = [e for e in flags if e]
        outcome = [None]
        if self.rank == 0:
            outcome[0] = ""
            if not errors:
                try:
                    for u in self.hosts:  # phase two: a rename on each host
                        self._client(u).commit(self.job, v, False)
                except (_tenplex.Error, OSError) as e:
                    outcome[0] = f"committing version {v}: {e}"
            if errors or outcome[0]:
                self._abort(v, self.hosts)
                outcome[0] = outcome[0] or "; ".join(errors)
        dist.broadcast_object_list(outcome, src=0)
        if outcome[0]:
            raise ElasticError(f"commit of step {info.get('step')} failed: {outcome[0]}")
        self.version = v
        rec = {"event": "commit", "step": info.get("step"), "version": v, "seconds": round(time.perf_counter() - t0, 4)}
        if self._pending is not None:
            rec["async"] = True  # seconds: from the snapshot to the version's commit
        self._log_event(rec)
        return v

    def start_commit(self, info, tensors):
        """The first half of commit() without waiting for the bytes: the version is begun,
        a snapshot of the tensors taken (on their device) and written in the background
        (Store.save_state_async); finish_pending() completes the two-phase commit. One
        in flight: a pending one is finished first."""
        self.finish_pending()
        v, info, t0 = self._begin_commit(info)
        ac = self._local_store().save_state_async(self.job, v, self.rank, dict(tensors))
        self._pending = (v, info, t0, ac)

    def finish_pending(self):
        """Completes the asynchronous commit in flight (waits for this rank's write, then
        the two-phase commit's collectives, here in the calling thread); its version, or
        None when none was pending."""
        if self._pending is None:
            return None
        v, info, t0, ac = self._pending
        err = ""
        try:
            ac.wait()
        except (_tenplex.Error, OSError, RuntimeError) as e:
            err = f"rank {self.rank}: writing into {self.url}: {e}"
        try:
            return self._end_commit(v, info, t0, err)
        finally:
            self._pending = None

    def step_done(self, step, info_fn, tensors_fn, last=False):
        """Call after every finished step (`step` = steps done). Commits every
        commit_every steps, at the last step and when any worker got SIGTERM; returns True
        when the loop must stop for a membership change (then call finish()).

        With async_commit the periodic commits overlap the next steps: the state is
        snapshotted here and written in the background; the commit completes at the first
        step_done where every rank's write is done (the same all-reduce carries that),
        and at once before a stop, the last step or the next commit."""
        busy = self._pending is not None and not self._pending[3].done()
        flag = torch.tensor([1 if self._term else 0, 1 if busy else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        stop = flag[0].item() > 0
        if self._pending is not None and flag[1].item() == 0:
            self.finish_pending()  # every rank's bytes are written: phase one and two now
        due = self.commit_every > 0 and step % self.commit_every == 0
        if stop or last:
            self.commit(info_fn(), tensors_fn())
        elif due and self.async_commit:
            self.start_commit(info_fn(), tensors_fn())
        elif due:
            self.commit(info_fn(), tensors_fn())
        if stop:
            self._stopping = True
            self._log_event({"event": "elastic_stop", "step": step, "version": self.version})
        return stop

    def close(self):
        """At the end of the job, after the last step's commit: a barrier, then the
        process group's teardown. Without it the ranks that see the commit's outcome
        first exit and close their connections while a slower rank may still be inside
        that collective; it fails ("Connection closed by peer"), torchrun counts the
        failure and restarts its group, whose rendezvous then waits for agents that have
        already finished (their exit barrier). The job's state is committed by then, so
        a failing peer is reported, not raised."""
        err = _barrier_and_teardown()
        if err:
            print(f"tenplex.elastic: rank {self.rank}: the closing barrier failed after the last commit "
                  f"(version {self.version}): {err}", file=sys.stderr, flush=True)

    def finish(self):
        """After step_done returned True: wait for this worker's SIGTERM and exit (0), or
        exit with STOP_EXIT_STATUS after term_wait seconds without one."""
        self._stopping = True
        _barrier_and_teardown()  # a peer that died meanwhile changes nothing here
        deadline = time.monotonic() + self.term_wait
        while not self._term and time.monotonic() < deadline:
            time.sleep(0.05)
        self._log_event({"event": "elastic_exit", "sigterm": self._term})
        sys.exit(0 if self._term else STOP_EXIT_STATUS)
