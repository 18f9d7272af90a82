"""State hand-off with `tenplex run` through shared-memory files (no copies in between).

The runner (src/tenplex/runtime/runner.h) writes a hand-off JSON per segment:
  {"step", "samples_consumed", "config", "model",
   "ranks": [{"rank", "tensors": [{"name", "dtype", "shape", "file"}]}]}
where `file` is a store file holding the local tensor's bytes at offset 0. A worker
maps its rank's files: from --state-in it loads its state, into --state-out it writes
its final state; rank 0 then writes `<state-out>.result` ({"step",
"samples_consumed"}), which tells the runner the segment finished. With
--commit-every N the same happens every N steps into `<commit-prefix><step>.json`
while training goes on (the runner commits each of those versions).

A warm worker (`tenplex run --warm`) keeps the state it wrote at its stop for its next
load (`KeptState`): the files the runner's plan leaves unchanged are hard links of those
it wrote, so their tensors need not be read again.
"""

import json
import logging
import math
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any, Optional, Union

import numpy as np
import torch

from . import safetensors

log = logging.getLogger(__name__)


class HandoffError(ValueError):
    pass


def read(path):
    try:
        with open(path) as f:
            h = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise HandoffError(f"cannot read hand-off file {path}: {e}") from None
    if not isinstance(h, dict) or not isinstance(h.get("ranks"), list) or "config" not in h:
        raise HandoffError(f'{path}: not a hand-off file (needs "config" and "ranks")')
    return h


def wait_for(path, timeout, abort=None):
    """Waits until the runner has written the hand-off file `path` (periodic commits
    are opened one after another); HandoffError after `timeout` seconds, and when the
    threading.Event `abort` is set (a warm worker's aborted segment)."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if abort is not None and abort.is_set():
            raise HandoffError(f"aborted while waiting for hand-off file {path}")
        if time.monotonic() > deadline:
            raise HandoffError(f"hand-off file {path} did not appear within {timeout:g} s")
        time.sleep(0.002)


def _rank_entry(handoff, rank):
    entry = next((r for r in handoff["ranks"] if r.get("rank") == rank), None)
    if entry is None:
        raise HandoffError(f"hand-off has no rank {rank}")
    return entry


def _rank_tensors(handoff, rank):
    """(name, dtype name, torch dtype, element size, shape, elements, file) of each of
    `rank`'s tensors."""
    for t in _rank_entry(handoff, rank)["tensors"]:
        name, dt, shape, path = t["name"], t["dtype"], list(t["shape"]), t["file"]
        if dt not in safetensors.DTYPES:
            raise HandoffError(f"hand-off tensor {name}: unknown dtype {dt}")
        torch_dtype, size = safetensors.DTYPES[dt]
        yield name, dt, torch_dtype, size, shape, math.prod(shape), path


def _through_engine(rank, fn, *args):
    """tenplex.device.<fn>(*args), its errors as HandoffError (the native module is
    imported only here: hand-offs of CPU tensors work without it)."""
    from . import _tenplex
    from . import device as _device

    try:
        return getattr(_device, fn)(*args)
    except _tenplex.Error as e:
        raise HandoffError(f"hand-off rank {rank}: {e}") from e


def read_rank(handoff, rank, device=None, keep=None):
    """{local name: tensor} of `rank`, private copies read from its store files with one
    read each (for state copied on at once, as a warm worker's load: cheaper than
    map_rank's map, copy and unmap per tensor). With a device ("cuda", "cuda:1", "cpu")
    the tensors are on it, filled by the copy engine in one call (tenplex.device).

    With `keep` (a KeptState remembered at the worker's last stop) the tensors whose files
    are the very files it wrote then (hard links of the plan's unchanged tensors) are
    taken from it instead of read; only the others are read. The KeptState is emptied,
    and its `stats` say what was kept and what was loaded."""
    specs = list(_rank_tensors(handoff, rank))
    if keep is None:
        return _load(specs, rank, device)
    t0 = time.perf_counter()
    kept, rest = keep.take(specs, device)
    loaded = _load(rest, rank, device)
    keep.finish(kept, rest, device, time.perf_counter() - t0)
    return {s[0]: kept[s[0]] if s[0] in kept else loaded[s[0]] for s in specs}


def _load(specs, rank, device):
    """{name: tensor} of the _rank_tensors entries `specs`, read from their files."""
    if device is not None:
        entries = [(name, torch_dtype, shape, path) for name, _, torch_dtype, _, shape, _, path in specs]
        return _through_engine(rank, "restore_files", entries, device) if entries else {}
    out = {}
    for name, _, torch_dtype, size, shape, n, path in specs:
        raw = torch.empty(n * size, dtype=torch.uint8)
        if n:
            with open(path, "rb", buffering=0) as f:
                view, done = raw.numpy().data, 0  # a memoryview of the bytes
                while done < len(view):
                    got = f.readinto(view[done:])
                    if not got:
                        raise HandoffError(f"hand-off tensor {name}: {path} has {done} bytes, needs {n * size}")
                    done += got
        out[name] = raw.view(torch_dtype).view(shape)
    return out


FileKey = tuple[int, int, int, int]  # (st_dev, st_ino, st_size, st_mtime_ns)


def _file_key(path: str) -> Optional[FileKey]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _device_of(device: Any) -> torch.device:
    """torch.device of read_rank's `device` (None: the CPU), a bare "cuda" with the current index."""
    d = torch.device(device if device is not None else "cpu")
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d


class KeptState:
    """The tensors a warm worker wrote into its store files at its last stop, kept (on
    their device) for its next load.

    Why a file identifies its bytes: at a reconfiguration the runner commits the stop's
    version and transforms it into the next one; a tensor the plan leaves unchanged is
    hard-linked into the new version (Store::Link), so its new file is the same inode
    the worker wrote, and committed versions never change. Every other file of the new
    version is a fresh allocation or a recycled file of an older, released version (the
    stop's version is in use during the transform, and linked files are never pooled),
    so it is another inode. A file of the next hand-off with the (device, inode, size,
    mtime) of a file written here therefore holds exactly the bytes of the tensor that
    was written into it; with equal dtype and element count that tensor is reused under
    the new name and shape, whatever rank the new layout gives the worker.

        keep.remember(h_out, rank, tensors)   # after write_rank(h_out, rank, tensors)
        ...                                   # park, re-join
        state = read_rank(h_in, rank, device, keep=keep)   # keep.stats: kept / loaded

    remember() takes the tensors over: they must not change afterwards (write_rank's
    state at the stop is a snapshot). One use: read_rank empties it, and it is emptied
    when the segment is aborted (clear()). Costs: the kept tensors stay allocated from
    the stop to the next load, beside the new segment's model. A tensor is reused only
    on the device read_rank is asked for; a new tensor never shares memory with another
    (a file or tensor handed out twice is cloned on the device), so in-place updates
    stay private.
    """

    def __init__(self) -> None:
        self._by_file: dict[FileKey, torch.Tensor] = {}
        self.stats: dict[str, Any] = {}  # of the last read_rank with this KeptState

    def __len__(self) -> int:
        return len(self._by_file)

    def clear(self) -> None:
        self._by_file = {}

    def remember(
        self,
        handoff: dict[str, Any],
        rank: int,
        tensors: Union[dict[str, torch.Tensor], Iterable[tuple[str, torch.Tensor]]],
    ) -> None:
        """Keeps `tensors` ([(name, tensor)] or {name: tensor}), just written into the
        rank's files of `handoff` (write_rank), keyed by their files (one stat each);
        replaces what was kept before."""
        files = {t["name"]: t["file"] for t in _rank_entry(handoff, rank)["tensors"]}
        items = tensors.items() if isinstance(tensors, dict) else tensors
        by_file: dict[FileKey, torch.Tensor] = {}
        for name, t in items:
            path = files.get(name)
            if path is None or t.numel() == 0:
                continue
            key = _file_key(path)
            if key is None or key[2] < t.numel() * t.element_size():
                continue
            by_file[key] = t.detach()
        self._by_file = by_file

    def take(self, specs: Sequence[tuple], device: Any) -> tuple[dict[str, torch.Tensor], list[tuple]]:
        """({name: kept tensor}, the specs to load) for _rank_tensors entries `specs`;
        empties the KeptState (what is not reused is freed before the load allocates)."""
        by_file, self._by_file = self._by_file, {}
        self.stats = {}
        if not by_file:
            return {}, list(specs)
        d = _device_of(device)
        kept: dict[str, torch.Tensor] = {}
        rest: list[tuple] = []
        handed = set()  # storages already given to a new tensor: a second one gets a clone
        for spec in specs:
            name, _, torch_dtype, _, shape, n, path = spec
            key = _file_key(path) if n else None
            t = by_file.get(key) if key is not None else None
            if t is None or t.dtype != torch_dtype or t.numel() != n or t.device != d:
                rest.append(spec)
                continue
            storage = t.untyped_storage().data_ptr()
            if storage in handed or not t.is_contiguous():
                kept[name] = t.clone(memory_format=torch.contiguous_format).view(shape)
            else:
                handed.add(storage)
                kept[name] = t.view(shape)
        return kept, rest

    def finish(self, kept: dict[str, torch.Tensor], loaded: Sequence[tuple], device: Any, seconds: float) -> None:
        """Records and logs what a read_rank kept and loaded."""
        kept_bytes = sum(t.numel() * t.element_size() for t in kept.values())
        loaded_bytes = sum(s[3] * s[5] for s in loaded)
        d = _device_of(device)
        self.stats = {
            "kept_tensors": len(kept),
            "kept_bytes": kept_bytes,
            "loaded_tensors": len(loaded),
            "loaded_bytes": loaded_bytes,
            "device": str(d),
            "seconds": seconds,
        }
        log.info(
            "warm restore: kept %d tensors (%.1f MB) on %s, loaded %d (%.1f MB) in %.4f s",
            len(kept),
            kept_bytes / 1e6,
            d,
            len(loaded),
            loaded_bytes / 1e6,
            seconds,
        )


def map_rank(handoff, rank, writable=False):
    """{local name: tensor} of `rank`, each sharing memory with its store file."""
    out = {}
    for name, dt, torch_dtype, size, shape, n, path in _rank_tensors(handoff, rank):
        if n == 0:
            out[name] = torch.empty(shape, dtype=torch_dtype)
            continue
        have = os.path.getsize(path)
        if have < n * size:
            raise HandoffError(f"hand-off tensor {name}: {path} has {have} bytes, needs {n * size}")
        np_dtype = np.int16 if dt == "BF16" else torch.empty(0, dtype=torch_dtype).numpy().dtype
        arr: np.ndarray = np.memmap(path, dtype=np_dtype, mode="r+" if writable else "r", shape=(n,))
        if not writable:
            arr = np.array(arr)  # a private copy: read-only maps cannot back torch tensors
        t_ = torch.from_numpy(arr)
        if dt == "BF16":
            t_ = t_.view(torch.bfloat16)
        out[name] = t_.view(shape)
        setattr(out[name], "_tenplex_map", arr)  # noqa: B010 (keep the map alive with the tensor; Tensor declares no such field)
    return out


def write_rank(handoff, rank, tensors):
    """Writes [(name, tensor)] into the rank's store files with one pwrite each; CUDA
    tensors with one copy-engine call for all of them (tenplex.device).

    (Writing through the page cache is 7-15x faster here than mapping every file: a
    commit writes hundreds of small tensors, and a map costs a syscall pair and a page
    fault per page.) The files are shared memory, so the bytes are visible to the store
    as soon as the call returns."""
    want = {t["name"]: t for t in _rank_entry(handoff, rank)["tensors"]}
    names = {n for n, _ in tensors}
    if names != set(want):
        raise HandoffError(f"rank {rank}: state tensors differ from the hand-off's: {sorted(names ^ set(want))[:5]}")
    on_device = []
    for name, t in tensors:
        spec = want[name]
        if spec["dtype"] not in safetensors.DTYPES:
            raise HandoffError(f"hand-off tensor {name}: unknown dtype {spec['dtype']}")
        torch_dtype, size = safetensors.DTYPES[spec["dtype"]]
        if list(t.shape) != list(spec["shape"]) or t.dtype != torch_dtype:
            raise HandoffError(
                f"rank {rank}: {name} is {t.dtype} {list(t.shape)}, the store has {torch_dtype} {list(spec['shape'])}"
            )
        if t.numel() == 0:
            continue
        if t.is_cuda:
            on_device.append((name, t, spec["file"]))
            continue
        src = t.detach().contiguous()
        arr = (src.view(torch.int16) if t.dtype == torch.bfloat16 else src).numpy().reshape(-1)
        buf = memoryview(arr).cast("B")
        fd = os.open(spec["file"], os.O_WRONLY | os.O_CLOEXEC)
        try:
            have = os.fstat(fd).st_size
            if have < len(buf):
                raise HandoffError(f"hand-off tensor {name}: {spec['file']} has {have} bytes, needs {len(buf)}")
            done = 0
            while done < len(buf):
                done += os.pwrite(fd, buf[done:], done)
        finally:
            os.close(fd)
    if on_device:
        _through_engine(rank, "commit_files", on_device)


def write_result(state_out, step, samples_consumed, durable=True):
    """Rank 0's `<state_out>.result`, written whole (a rename); durable=False skips the
    fsync (a warm worker's: a message to the live runner, on the reconfiguration's path)."""
    tmp = state_out + ".result.tmp"
    with open(tmp, "w") as f:
        json.dump({"step": step, "samples_consumed": samples_consumed}, f)
        f.flush()
        if durable:
            os.fsync(f.fileno())
    os.replace(tmp, state_out + ".result")
