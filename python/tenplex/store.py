"""The tensor store from Python: hand a rank's state to the store and get it back.

    import tenplex
    st = tenplex.attach()                      # an embedded store in this process
    st = tenplex.attach(url="http://127.0.0.1:7480")   # or a `tenplex store serve` daemon
    v = st.begin("job", info={"config": "tp=2", "step": 10})
    st.save_state("job", v, rank, model.state_dict())  # straight into shared memory
    st.commit("job", v)
    state = st.load_state("job", rank)         # torch tensors mapping the store's memory
    state = st.load_state("job", rank, device="cuda")  # or copied onto a device
    st.status("job")                           # {"version", "config", "step", ...}

Tensors are saved under the rank's local names (spec ptc-layout.md §4-§5). Loading
maps the store's shared-memory files copy-on-write (`torch.from_file`), so no bytes are
copied until a tensor is written to, and the store's committed bytes never change.
With a daemon on another machine, bytes travel over HTTP instead. A device (load_state's
`device`, attach's default) gives private tensors on it, filled from the files by the copy
engine; CUDA tensors are saved from the device the same way (tenplex.device).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import torch

from . import _tenplex
from . import device as _device
from .safetensors import DTYPES

_NAME_OF = {t: name for name, (t, _) in DTYPES.items()}


def _rank_prefix(job: str, version: int, rank: int) -> str:
    return f"jobs/{job}/{version}/rank-{rank:05d}/"


class Store:
    def __init__(self, native: Any, device: _device.DeviceLike | None = None) -> None:
        self._s = native
        self.device = device  # load_state's default device (None: map the files)
        self._async: _device.AsyncCommit | None = None  # the AsyncCommit of save_state_async

    @property
    def local(self) -> bool:
        """True when tensors can be mapped (embedded, or a daemon on this machine)."""
        return self._s.local

    def begin(self, job: str, info: Mapping[str, Any] | None = None, version: int | None = None) -> int:
        """Opens a new version of job; returns its number."""
        return self._s.begin_version(job, version, json.dumps(info or {}))

    def commit(self, job: str, version: int, keep_old: bool = False) -> None:
        self._s.commit(job, version, keep_old)

    def abort(self, job: str, version: int) -> None:
        self._s.abort(job, version)

    def status(self, job: str, version: int | None = None) -> dict[str, Any]:
        """The version's info ({"config", "step", "samples_consumed", ...}) and number."""
        v = self._s.version(job, version)
        info = json.loads(v["info"] or "{}")
        info["version"] = v["version"]
        info["committed"] = v["committed"]
        return info

    def jobs(self) -> list[str]:
        """Names of the jobs in the store, sorted."""
        return sorted(self._s.jobs())

    def versions(self, job: str) -> list[dict[str, Any]]:
        """The job's versions, oldest first: [{"version", "committed", "current", "bytes",
        "tensors", "info": {...}}]; NotFoundError for an unknown job."""
        out = []
        for v in self._s.job(job)["versions"]:
            v = dict(v)
            v["info"] = json.loads(v["info"] or "{}")
            out.append(v)
        return out

    def delete(self, job: str, version: int | None = None) -> None:
        """Removes the job with all its versions, or one version of it (an open one, or
        an old committed one; the current version is only removed with the job)."""
        if version is None:
            self._s.delete_job(job)
        else:
            self._s.drop_version(job, version)

    def save_state(self, job: str, version: int, rank: int, tensors: Mapping[str, torch.Tensor]) -> None:
        """Writes {local name: tensor} of a rank into an open version. CUDA tensors go
        from the device into the store's files through the copy engine (tenplex.device)."""
        prefix = _rank_prefix(job, version, rank)
        _check_tensors(tensors)
        items = [(name, t.detach() if t.is_cuda else t.detach().contiguous()) for name, t in tensors.items()]
        if self.local:
            reqs = [(prefix + name, _NAME_OF[t.dtype], list(t.shape)) for name, t in items]
            infos = self._s.allocate(reqs, zero_fill=False)  # every byte is written below
            on_device = []
            for (name, t), info in zip(items, infos):
                if t.numel() == 0:
                    continue
                if t.is_cuda:
                    on_device.append((name, t, info["file"]))
                    continue
                dst = torch.from_file(info["file"], shared=True, size=t.numel(), dtype=t.dtype)
                dst.copy_(t.reshape(-1))
                del dst
            if on_device:
                _device.commit_files(on_device)
        else:
            for name, t in items:
                t = t.cpu().contiguous()
                raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
                self._s.write(prefix + name, _NAME_OF[t.dtype], list(t.shape), raw.numpy())

    def save_state_async(
        self, job: str, version: int, rank: int, tensors: Mapping[str, torch.Tensor]
    ) -> _device.AsyncCommit:
        """save_state of a snapshot of `tensors` taken now (on their device), written in
        the background while training goes on: returns the store's AsyncCommit, whose
        wait() the caller calls before committing the version (one write in flight: a
        second call waits for the first). A local store's files are allocated here."""
        _check_tensors(tensors)
        if self._async is None:
            self._async = _device.AsyncCommit()
        if self.local:
            prefix = _rank_prefix(job, version, rank)
            infos = self._s.allocate(
                [(prefix + name, _NAME_OF[t.dtype], list(t.shape)) for name, t in tensors.items()], zero_fill=False
            )
            files = {name: info["file"] for name, info in zip(tensors, infos)}

            def write(snap: dict[str, torch.Tensor]) -> None:
                _device.commit_files([(name, t, files[name]) for name, t in snap.items()])
        else:

            def write(snap: dict[str, torch.Tensor]) -> None:
                self.save_state(job, version, rank, snap)

        self._async.start(dict(tensors), write)
        return self._async

    def load_state(
        self, job: str, rank: int, version: int | None = None, device: _device.DeviceLike | None = None
    ) -> dict[str, torch.Tensor]:
        """{local name: tensor} of a rank in a committed version (default: current).

        Without a device (and no default from attach(device=)) the tensors map the
        store's files copy-on-write; with one ("cpu", "cuda", "cuda:1") they are private
        tensors on it, filled through the copy engine in one call (a remote store's bytes
        travel over HTTP and are then moved to the device)."""
        device = device if device is not None else self.device
        v = self._s.version(job, version)["version"]
        out, files = {}, []
        for info in self._s.list(_rank_prefix(job, v, rank)):
            name = info["path"].rsplit("/", 1)[1]
            dtype, size = DTYPES[info["dtype"]]
            n = info["bytes"] // size
            if device is not None and self.local and info["file"]:
                files.append((name, dtype, info["shape"], info["file"]))
            elif n == 0:
                out[name] = torch.empty(info["shape"], dtype=dtype)
            elif self.local and info["file"]:
                out[name] = torch.from_file(info["file"], shared=False, size=n, dtype=dtype).view(info["shape"])
            else:
                buf = bytearray(self._s.read(info["path"]))
                out[name] = torch.frombuffer(buf, dtype=dtype).view(info["shape"])
        if not out and not files:
            raise _tenplex.NotFoundError(f"job {job} version {v} has no tensors for rank {rank}")
        if device is not None:
            out = {name: t.to(device) for name, t in out.items()}
            out.update(_device.restore_files(files, device))
        return out


def _check_tensors(tensors: Mapping[str, Any]) -> None:
    """InvalidArgumentError unless `tensors` maps non-empty names to tensors of a supported dtype."""
    for name, t in tensors.items():
        if not isinstance(name, str) or not name:
            raise _tenplex.InvalidArgumentError(f"save_state: key {name!r} is not a tensor name (a non-empty str)")
        if not isinstance(t, torch.Tensor):
            raise _tenplex.InvalidArgumentError(
                f"save_state: value of {name!r} is a {type(t).__module__}.{type(t).__qualname__}, "
                "not a torch.Tensor (save tensors only; put other state in the version info)"
            )
        if t.dtype not in _NAME_OF:
            raise _tenplex.InvalidArgumentError(
                f"save_state: tensor {name!r}: dtype {t.dtype} is not supported "
                f"(supported: {', '.join(sorted(map(str, _NAME_OF)))})"
            )


def attach(
    url: str | None = None,
    shm_dir: str = "",
    memory_limit: int = 0,
    token: str | None = None,
    device: _device.DeviceLike | None = None,
) -> Store:
    """A store: the daemon at `url` (bearer `token`, default TENPLEX_TOKEN), or an
    embedded one (in `shm_dir`, default a fresh private directory in /dev/shm removed
    when the store is garbage collected). `device` ("cuda", "cuda:1", "cpu"): where
    load_state puts tensors by default (None: mapped store files)."""
    if url:
        native = _tenplex.Store.connect(url, token if token is not None else os.environ.get("TENPLEX_TOKEN", ""))
        return Store(native, device)
    return Store(_tenplex.Store.embedded(shm_dir, memory_limit), device)
