"""PyTorch distributed checkpoints (DCP, torch 2.x `torch.distributed.checkpoint`)
<-> tenplex checkpoints, through torch's own DCP code (dcp.save / dcp.load in one
process, no_dist=True; FileSystemWriter / FileSystemReader).

A DCP directory holds `.metadata` (a pickled `Metadata`: for every state-dict key a
`TensorStorageMetadata` (global size, properties, chunks as `ChunkStorageMetadata`
offsets/sizes) or a `BytesStorageMetadata`, and in `storage_data` where each chunk's
bytes are) and the data files (`__<rank>_<n>.distcp`). Keys here are our global
tensor names (spec §1: `decoder.layers.3.mlp.linear_fc1.weight`,
`optimizer.exp_avg.<param>`), as a job writes them with one DTensor (or ShardedTensor,
or plain tensor) per global tensor. Non-tensor entries `step` and `samples_consumed`
carry the training position (an int, or a one-element integer tensor).

Export: one process saves, with a save planner that emits one chunk per distinct piece
of the checkpoint's own layout, each a view into the memory-mapped rank files (torch's
serial writer copies one chunk at a time). A job of that layout loads its own chunks
whole; any other layout or DTensor placement works too, DCP reshards on load.

Import: reads `.metadata` with torch's FileSystemReader, checks every key, dtype, size
and chunk (bounds, no overlap, coverage) against the model description before
anything is written, then loads the saved chunks whole, in batches of at most
`batch_bytes` (or one chunk if larger), with a load planner whose destinations are
plain tensors of the chunks' boxes (torch reads each chunk once: its reader always
reads whole chunks), and puts them into the new checkpoint's pieces.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import shutil
import warnings
from typing import Any

import numpy as np

from .. import safetensors as st
from . import ptc
from .ptc import InteropError

_SCALARS = ("step", "samples_consumed")


def to_torch(arr, dtype):
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # read-only memmaps: torch never writes to them here
        if dtype == "BF16":
            return torch.from_numpy(np.ascontiguousarray(arr).view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(np.ascontiguousarray(arr))


def to_numpy(t):
    import torch

    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


@contextlib.contextmanager
def _quiet():
    """torch warns on every no_dist save/load that it assumes one process."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        yield


def _save_planner_class():
    import torch
    from torch.distributed.checkpoint import DefaultSavePlanner
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
    from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType

    class PieceSavePlanner(DefaultSavePlanner):
        """Writes `pieces` ({name: (global shape, [(box, tensor)])}) as chunks of the
        global tensors, plus the state dict's non-tensor entries as DCP does."""

        def __init__(self, pieces: dict[str, tuple[list[int], list[tuple[list, Any]]]]):
            super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
            self.pieces = pieces
            self.by_index: dict[tuple, Any] = {}

        def create_local_plan(self) -> SavePlan:
            items = list(super().create_local_plan().items)  # BYTE_IO items of the scalars
            for name, (shape, parts) in self.pieces.items():
                for box, t in parts:
                    off = torch.Size([b for b, _ in box])
                    self.by_index[(name, tuple(off))] = t
                    items.append(
                        WriteItem(
                            index=MetadataIndex(name, off),
                            type=WriteItemType.SHARD,
                            tensor_data=TensorWriteData(
                                chunk=ChunkStorageMetadata(offsets=off, sizes=torch.Size([e - b for b, e in box])),
                                properties=TensorProperties.create_from_tensor(t),
                                size=torch.Size(shape),
                            ),
                        )
                    )
            self.plan = SavePlan(items)
            return self.plan

        def resolve_data(self, write_item):
            if write_item.type == WriteItemType.BYTE_IO:
                return super().resolve_data(write_item)
            return self.by_index[(write_item.index.fqn, tuple(write_item.index.offset))]

    return PieceSavePlanner


def save(state_dict, pieces, stage):
    """dcp.save (one process, fsynced) into `stage` of `pieces` ({name: (global shape,
    [(box, tensor)])}) as chunks of their global tensors, plus the non-tensor entries of
    `state_dict` as DCP writes them."""
    import torch.distributed.checkpoint as dcp

    with _quiet():
        dcp.save(
            state_dict,
            storage_writer=dcp.FileSystemWriter(stage, single_file_per_rank=True, sync_files=True),
            planner=_save_planner_class()(pieces),
            no_dist=True,
        )


def export(reader, out):
    model = reader.info["model"]
    ptc.check_target_dir(out)
    stage = out.rstrip("/") + ".partial"
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage)
    try:
        pieces, total = {}, 0
        for name, (dt, shape) in ptc.global_tensors(model).items():
            parts = [(g, to_torch(view, dt)) for g, view in reader.views(name)]
            if not parts:
                raise InteropError(f"{name}: the checkpoint holds no piece of it")
            total += sum(t.numel() * t.element_size() for _, t in parts)
            pieces[name] = (shape, parts)
        save({k: int(reader.info[k]) for k in _SCALARS if k in reader.info}, pieces, stage)
        ptc.move_into_place(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return total


def read_metadata(src):
    import torch.distributed.checkpoint as dcp

    if not os.path.isfile(os.path.join(src, ".metadata")):
        raise InteropError(f"{src}: no .metadata file (not a PyTorch distributed checkpoint)")
    try:
        return dcp.FileSystemReader(src).read_metadata()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # a truncated or foreign pickle
        raise InteropError(f"{src}/.metadata: cannot be read by torch's DCP ({type(e).__name__}: {e})") from None


def _cause(e):
    """The last error line of an exception (torch's CheckpointException embeds whole
    per-rank tracebacks)."""
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    errs = [x for x in lines if "Error" in x.split(":")[0] or "Exception" in x.split(":")[0]]
    return errs[-1] if errs else f"{type(e).__name__}: {lines[-1] if lines else ''}"


def load(state_dict, reader, src, keys, planner=None):
    """`dcp.load(no_dist=True)` from `reader`; any failure (torch's CheckpointException is
    a BaseException) is an InteropError naming the first of `keys` and the cause."""
    import torch.distributed.checkpoint as dcp

    try:
        with _quiet():
            dcp.load(state_dict, storage_reader=reader, planner=planner, no_dist=True)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:
        keys = list(dict.fromkeys(keys))
        raise InteropError(
            f"{src}: torch's DCP failed to read {', '.join(keys[:3])}"
            f"{'...' if len(keys) > 3 else ''} ({_cause(e)}); "
            "truncated or damaged files?"
        ) from None


def batches(items, nbytes, limit):
    """`items` in lists of at most `limit` bytes (`nbytes(item)` each; a larger item alone)."""
    batch, size = [], 0
    for item in items:
        batch.append(item)
        size += nbytes(item)
        if size >= limit:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _load_planner_class():
    import torch
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner
    from torch.distributed.checkpoint.planner_helpers import (
        _create_read_item_for_byteio,
        create_read_items_for_chunk_list,
    )

    class ChunkLoadPlanner(LoadPlanner):
        """Loads `chunks` ([(key, ChunkStorageMetadata, destination tensor of the
        chunk's box)]) and the non-tensor entries `scalars` (into self.values)."""

        def __init__(self, chunks, scalars=()):
            self.chunks, self.scalars, self.values = chunks, list(scalars), {}
            self.dest = {(k, tuple(c.offsets)): t for k, c, t in chunks}

        def set_up_planner(self, state_dict, metadata=None, is_coordinator=False):
            self.metadata = metadata

        def create_local_plan(self):
            items = []
            for key, chunk, _ in self.chunks:
                items += create_read_items_for_chunk_list(key, self.metadata.state_dict_metadata[key], [chunk])
            for key in self.scalars:
                items.append(_create_read_item_for_byteio(MetadataIndex(key), 0, MetadataIndex(key), 0, 0))
            return LoadPlan(items)

        def create_global_plan(self, global_plan):
            return global_plan

        def finish_plan(self, central_plan):
            return central_plan

        def load_bytes(self, read_item, value: io.BytesIO):
            self.values[read_item.dest_index.fqn] = torch.load(value, weights_only=True)

        def resolve_tensor(self, read_item):
            t = self.dest[(read_item.dest_index.fqn, tuple(read_item.dest_index.offset))]
            return t[tuple(slice(o, o + n) for o, n in zip(read_item.dest_offsets, read_item.lengths))]

        def commit_tensor(self, read_item, tensor):
            pass

    return ChunkLoadPlanner


def _check_chunks(src, key, m, shape):
    """Chunks inside the tensor, not overlapping, covering every element."""
    boxes = []
    for c in m.chunks:
        box = [(int(o), int(o) + int(n)) for o, n in zip(c.offsets, c.sizes)]
        if len(box) != len(shape) or any(b < 0 or e > n for (b, e), n in zip(box, shape)):
            raise InteropError(f"{src}: a chunk of '{key}' ({box}) lies outside its size {shape}")
        boxes.append(box)
    boxes.sort()
    for i, a in enumerate(boxes):  # sorted by the first dimension's start: stop once past a's end
        for b in boxes[i + 1 :]:
            if len(a) and b[0][0] >= a[0][1]:
                break
            if ptc.intersect(a, b):
                raise InteropError(f"{src}: chunks {a} and {b} of '{key}' overlap")
    covered = sum(ptc.volume(b) for b in boxes)
    if covered != math.prod(shape):
        raise InteropError(f"{src}: the chunks of '{key}' cover {covered} of {math.prod(shape)} elements")


def _check(src, meta, writer):
    """[tensor keys], [scalar keys stored as bytes], [scalar keys stored as tensors]."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    globals_ = writer.globals
    tensors, scalars, scalar_tensors = [], [], []
    for key, m in meta.state_dict_metadata.items():
        if key in _SCALARS:
            if not isinstance(m, TensorStorageMetadata):
                scalars.append(key)
            elif math.prod(m.size) == 1 and not m.properties.dtype.is_floating_point:
                scalar_tensors.append(key)
            else:
                raise InteropError(
                    f"{src}: '{key}' is a tensor of size {list(m.size)} ({m.properties.dtype}), expected an int"
                )
            continue
        if not isinstance(m, TensorStorageMetadata):
            raise InteropError(
                f"{src}: unknown entry '{key}' (not a tensor of the model; "
                f"known non-tensor entries: {', '.join(_SCALARS)})"
            )
        if key not in globals_:
            raise InteropError(f"{src}: unknown tensor '{key}' (not a global tensor of the model)")
        dt, shape = globals_[key]
        try:
            got_dt = st.dtype_name(m.properties.dtype)
        except Exception:
            got_dt = str(m.properties.dtype)
        if got_dt != dt or list(m.size) != shape:
            raise InteropError(f"{src}: tensor '{key}' is {got_dt}{list(m.size)}, the model says {dt}{shape}")
        _check_chunks(src, key, m, shape)
        tensors.append(key)
    have = set(tensors)
    for t in writer.model["tensors"]:
        if t["path"] not in have:
            raise InteropError(f"{src}: tensor '{t['path']}' is missing")
    if any(k.startswith("optimizer.") for k in have):
        for k in globals_:
            if k not in have:
                raise InteropError(
                    f"{src}: optimizer tensor '{k}' is missing (a checkpoint has all of its optimizer state or none)"
                )
    return tensors, scalars, scalar_tensors


def import_(src, writer, batch_bytes=1 << 29):
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import MetadataIndex

    meta = read_metadata(src)
    tensors, scalars, scalar_tensors = _check(src, meta, writer)
    with_optimizer = any(k.startswith("optimizer.") for k in tensors)
    planner_cls = _load_planner_class()
    reader = dcp.FileSystemReader(src)
    storage = meta.storage_data or {}

    def load_chunks(chunks, scalar_keys=()):
        planner = planner_cls(chunks, scalar_keys)
        load({}, reader, src, [k for k, _, _ in chunks] + list(scalar_keys), planner)
        return planner.values

    def where(item):  # read the data files front to back
        key, c = item
        info = storage.get(MetadataIndex(key, c.offsets))
        return (str(getattr(info, "relative_path", "")), int(getattr(info, "offset", 0)), key)

    order = sorted(((k, c) for k in tensors for c in meta.state_dict_metadata[k].chunks), key=where)
    chunks = ((k, c, torch.empty(list(c.sizes), dtype=meta.state_dict_metadata[k].properties.dtype)) for k, c in order)
    for batch in batches(chunks, lambda item: item[2].numel() * item[2].element_size(), batch_bytes):
        load_chunks(batch)
        for k, c, t in batch:
            box = [(int(o), int(o) + int(n)) for o, n in zip(c.offsets, c.sizes)]
            writer.put_param(k, box, to_numpy(t), derive_fp32=not with_optimizer)
    if scalars:
        for k, v in load_chunks([], scalars).items():
            if isinstance(v, torch.Tensor):
                v = v.item()
            if not isinstance(v, int) or isinstance(v, bool):
                raise InteropError(f"{src}: '{k}' holds {type(v).__name__} {v!r}, expected an int")
            writer.extra[k] = v
    if scalar_tensors:
        held = [
            (k, c, torch.empty(list(c.sizes), dtype=meta.state_dict_metadata[k].properties.dtype))
            for k in scalar_tensors
            for c in meta.state_dict_metadata[k].chunks
        ]
        load_chunks(held)
        for k, _, t in held:
            writer.extra[k] = int(t.reshape(-1)[0].item())
    return [] if with_optimizer else ["optimizer."]
