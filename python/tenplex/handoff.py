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
"""
import json
import math
import os
import time

import numpy as np
import torch

from . import safetensors


class HandoffError(ValueError):
    pass


def read(path):
    try:
        with open(path) as f:
            h = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise HandoffError(f"cannot read hand-off file {path}: {e}") from None
    if not isinstance(h, dict) or not isinstance(h.get("ranks"), list) or "config" not in h:
        raise HandoffError(f"{path}: not a hand-off file (needs \"config\" and \"ranks\")")
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


def _rank_tensors(handoff, rank):
    """(name, dtype name, torch dtype, element size, shape, elements, file) of each of
    `rank`'s tensors."""
    entry = next((r for r in handoff["ranks"] if r.get("rank") == rank), None)
    if entry is None:
        raise HandoffError(f"hand-off has no rank {rank}")
    for t in entry["tensors"]:
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


def read_rank(handoff, rank, device=None):
    """{local name: tensor} of `rank`, private copies read from its store files with one
    read each (for state copied on at once, as a warm worker's load: cheaper than
    map_rank's map, copy and unmap per tensor). With a device ("cuda", "cuda:1", "cpu")
    the tensors are on it, filled by the copy engine in one call (tenplex.device)."""
    if device is not None:
        entries = [(name, torch_dtype, shape, path) for name, _, torch_dtype, _, shape, _, path
                   in _rank_tensors(handoff, rank)]
        return _through_engine(rank, "restore_files", entries, device)
    out = {}
    for name, _, torch_dtype, size, shape, n, path in _rank_tensors(handoff, rank):
        raw = torch.empty(n * size, dtype=torch.uint8)
        if n:
            with open(path, "rb", buffering=0) as f:
                view, done = memoryview(raw.numpy()), 0
                while done < len(view):
                    got = f.readinto(view[done:])
                    if not got:
                        raise HandoffError(f"hand-off tensor {name}: {path} has {done} bytes, needs {n * size}")
                    done += got
        out[name] = raw.view(torch_dtype).view(shape)
    return out


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
        arr = np.memmap(path, dtype=np_dtype, mode="r+" if writable else "r", shape=(n,))
        if not writable:
            arr = np.array(arr)  # a private copy: read-only maps cannot back torch tensors
        t_ = torch.from_numpy(arr)
        if dt == "BF16":
            t_ = t_.view(torch.bfloat16)
        out[name] = t_.view(shape)
        out[name]._tenplex_map = arr  # keep the map alive with the tensor
    return out


def write_rank(handoff, rank, tensors):
    """Writes [(name, tensor)] into the rank's store files with one pwrite each; CUDA
    tensors with one copy-engine call for all of them (tenplex.device).

    (Writing through the page cache is 7-15x faster here than mapping every file: a
    commit writes hundreds of small tensors, and a map costs a syscall pair and a page
    fault per page.) The files are shared memory, so the bytes are visible to the store
    as soon as the call returns."""
    entry = next((r for r in handoff["ranks"] if r.get("rank") == rank), None)
    if entry is None:
        raise HandoffError(f"hand-off has no rank {rank}")
    want = {t["name"]: t for t in entry["tensors"]}
    names = {n for n, _ in tensors}
    if names != set(want):
        raise HandoffError(f"rank {rank}: state tensors differ from the hand-off's: "
                           f"{sorted(names ^ set(want))[:5]}")
    on_device = []
    for name, t in tensors:
        spec = want[name]
        if spec["dtype"] not in safetensors.DTYPES:
            raise HandoffError(f"hand-off tensor {name}: unknown dtype {spec['dtype']}")
        torch_dtype, size = safetensors.DTYPES[spec["dtype"]]
        if list(t.shape) != list(spec["shape"]) or t.dtype != torch_dtype:
            raise HandoffError(f"rank {rank}: {name} is {t.dtype} {list(t.shape)}, the store has "
                               f"{torch_dtype} {list(spec['shape'])}")
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
