"""The commit side of tenplex.elastic.Job: commit(), start_commit()/finish_pending()
(asynchronous commits) and step_done(), the per-step call that commits every
commit_every steps and stops for a membership change.

A commit is two-phase: rank 0 begins the version on every host, every rank writes its
tensors into its own host's daemon (phase one, an all-gather of the failures), then rank
0 commits through the C++ protocol (``_tenplex.cluster_prepare_commit``: prepare
everywhere, durable, then commit everywhere) or aborts everywhere. A mixin of Job (the
attributes it reads are Job's: hosts, job, token, rank, world_size, version, ...).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from . import _tenplex
from . import elastic_cluster as _ec
from ._job_state import JobState
from .elastic_cluster import ElasticError


class Commits(JobState):
    """Job's commits (a mixin: Job provides the state)."""

    def _coordinator(self) -> _ec.Coordinator:
        """Rank 0's coordinator of the job (from restore() on)."""
        if self._coord is None:
            raise ElasticError("rank 0 is not the job's coordinator before restore()")
        return self._coord

    def commit(self, info: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> int:
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

    def _begin_commit(self, info: Mapping[str, Any]) -> tuple[int, dict[str, Any], float]:
        """Rank 0 begins the version on every host; (version, info, start time) on all ranks."""
        hosts = self.hosts
        if hosts is None:
            raise ElasticError("commit before restore(): the hosts are not known yet")
        t0 = time.perf_counter()
        full = dict(info, cluster=self.cluster or {"hosts": hosts, "gpus_per_host": self.local_world_size})
        text = json.dumps(full, sort_keys=True)
        rec: list[dict[str, Any]] = [{}]
        if self.rank == 0:
            coord = self._coordinator()
            begun: list[str] = []
            v = 0
            try:
                views = _ec.probe_hosts(hosts, self.job, self.token, 0, self.request_timeout)
                down = [x.url for x in views if x.state == "down"]
                if down:
                    raise ElasticError(f"the store daemons {down} do not answer")
                coord.check()
                v = _ec.next_version_and_fence(views, self.job, self.version)
                for u in hosts:
                    _ec.connect(u, self.token, self.request_timeout, coord.name).begin_version(self.job, v, text)
                    begun.append(u)
                rec[0] = {"version": v}
            except (ElasticError, _tenplex.Error, OSError) as e:
                if begun:
                    _ec.abort(begun, self.job, v, self.token, self.request_timeout, coord.name)
                rec[0] = {"error": f"beginning the commit's version: {e}"}
        dist.broadcast_object_list(rec, src=0)
        if "error" in rec[0]:
            raise ElasticError(rec[0]["error"])
        return rec[0]["version"], full, t0

    def _end_commit(self, v: int, info: Mapping[str, Any], t0: float, err: str) -> int:
        """Phase one (every rank's write done: `err` is this rank's failure or "") and
        phase two (rank 0 commits on every host, or aborts everywhere)."""
        flags: list[str] = [""] * self.world_size
        dist.all_gather_object(flags, err)  # phase one: every rank's bytes are in its daemon
        errors = [e for e in flags if e]
        outcome = [""]
        if self.rank == 0:
            hosts, coord_name = self.hosts or [], self._coordinator().name
            if errors:
                _ec.abort(hosts, self.job, v, self.token, self.request_timeout, coord_name)
                outcome[0] = "; ".join(errors)
            else:
                try:  # phase two: prepare everywhere (durable), then commit everywhere (C++ 2PC)
                    _ec.prepare_commit(hosts, self.job, v, self.token, self.request_timeout, coord_name)
                except _tenplex.Error as e:  # a failed prepare was aborted everywhere
                    outcome[0] = f"committing version {v}: {e}"
        dist.broadcast_object_list(outcome, src=0)
        if outcome[0]:
            raise ElasticError(f"commit of step {info.get('step')} failed: {outcome[0]}")
        self.version = v
        rec: dict[str, Any] = {
            "event": "commit",
            "step": info.get("step"),
            "version": v,
            "seconds": round(time.perf_counter() - t0, 4),
        }
        if self._pending is not None:
            rec["async"] = True  # seconds: from the snapshot to the version's commit
        self._log_event(rec)
        return v

    def start_commit(self, info: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> None:
        """The first half of commit() without waiting for the bytes: the version is begun,
        a snapshot of the tensors taken (on their device) and written in the background
        (Store.save_state_async); finish_pending() completes the two-phase commit. One
        in flight: a pending one is finished first."""
        self.finish_pending()
        v, info, t0 = self._begin_commit(info)
        ac = self._local_store().save_state_async(self.job, v, self.rank, dict(tensors))
        self._pending = (v, info, t0, ac)

    def finish_pending(self) -> int | None:
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

    def step_done(
        self,
        step: int,
        info_fn: Callable[[], Mapping[str, Any]],
        tensors_fn: Callable[[], Mapping[str, torch.Tensor]],
        last: bool = False,
    ) -> bool:
        """Call after every finished step (`step` = steps done). Commits every
        commit_every steps, at the last step and when any worker got SIGTERM; returns True
        when the loop must stop for a membership change (then call finish()).

        With async_commit the periodic commits overlap the next steps: the state is
        snapshotted here and written in the background; the commit completes at the first
        step_done where every rank's write is done (the same all-reduce carries that),
        and at once before a stop, the last step or the next commit."""
        busy = self._pending is not None and not self._pending[3].done()
        if self._first_step:  # the first step of a world (membership): its reconfiguration ends here
            self._first_step = False
            self._log_event({"event": "first_step", "step": step})
        announced = self._member is not None and self._member.announced.is_set()
        flag = torch.tensor([1 if self._term or announced else 0, 1 if busy else 0])
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
