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


def wait_for(path, timeout):
    """Waits until the runner has written the hand-off file `path` (periodic commits
    are opened one after another); HandoffError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise HandoffError(f"hand-off file {path} did not appear within {timeout:g} s")
        time.sleep(0.002)


def map_rank(handoff, rank, writable=False):
    """{local name: tensor} of `rank`, each sharing memory with its store file."""
    entry = next((r for r in handoff["ranks"] if r.get("rank") == rank), None)
    if entry is None:
        raise HandoffError(f"hand-off has no rank {rank}")
    out = {}
    for t in entry["tensors"]:
        name, dt, shape, path = t["name"], t["dtype"], list(t["shape"]), t["file"]
        if dt not in safetensors.DTYPES:
            raise HandoffError(f"hand-off tensor {name}: unknown dtype {dt}")
        torch_dtype, size = safetensors.DTYPES[dt]
        n = int(np.prod(shape, dtype=np.int64))
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
    """Writes [(name, tensor)] into the rank's store files and flushes them."""
    mapped = map_rank(handoff, rank, writable=True)
    names = {n for n, _ in tensors}
    if names != set(mapped):
        raise HandoffError(f"rank {rank}: state tensors differ from the hand-off's: "
                           f"{sorted(names ^ set(mapped))[:5]}")
    for name, t in tensors:
        dst = mapped[name]
        if list(dst.shape) != list(t.shape) or dst.dtype != t.dtype:
            raise HandoffError(f"rank {rank}: {name} is {t.dtype} {list(t.shape)}, the store has "
                               f"{dst.dtype} {list(dst.shape)}")
        dst.copy_(t)
    for dst in mapped.values():
        m = getattr(dst, "_tenplex_map", None)
        if m is not None:
            m.flush()


def write_result(state_out, step, samples_consumed):
    tmp = state_out + ".result.tmp"
    with open(tmp, "w") as f:
        json.dump({"step": step, "samples_consumed": samples_consumed}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, state_out + ".result")
