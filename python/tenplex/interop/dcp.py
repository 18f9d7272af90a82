"""PyTorch distributed checkpoints (DCP) <-> tenplex checkpoints, through torch's own
DCP code (torch.distributed._shard.checkpoint in torch 1.13, imported with the Python
3.11 fix of tenplex.dcp_compat).

A DCP directory holds `.metadata` (a pickled `Metadata`: for every state-dict key its
global size, dtype and chunks, and where each chunk's bytes are) and the data files
(`__<rank>_<n>.distcp`, chunks written with torch.save). Keys here are our global
tensor names (spec §1: `decoder.layers.3.mlp.linear_fc1.weight`,
`optimizer.exp_avg.<param>`); the values are ShardedTensors of the global shape.
Non-tensor entries `step` and `samples_consumed` carry the training position.

Export: one process (a 1-rank gloo group over a file store, no ports) saves one
ShardedTensor per global tensor whose chunks are the distinct pieces of the
checkpoint's own layout, each a view into the memory-mapped rank files (torch copies
one chunk at a time while it writes). A job of that layout loads its own chunks
without resharding; any other layout works too, DCP reshards on load.

Import: reads `.metadata` with torch's FileSystemReader, checks every key, dtype, size
and chunk coverage against the model description before anything is written, then
loads the tensors with torch's load_state_dict (no_dist) in batches of at most
`batch_bytes` and puts them into the new checkpoint's pieces.
"""
import os
import tempfile
import warnings

import numpy as np

from .. import safetensors as st
from . import ptc
from .ptc import InteropError

_SCALARS = ("step", "samples_consumed")


def _dcp():
    from ..dcp_compat import import_dcp
    return import_dcp()


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


def _single_rank_group(tmp):
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method="file://" + os.path.join(tmp, "pg"), rank=0, world_size=1)


def export(reader, out):
    dcp, _, _ = _dcp()  # first: the fix must precede any import of torch.distributed._shard
    import torch
    import torch.distributed as dist
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
    from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties
    model = reader.info["model"]
    ptc.check_target_dir(out)
    stage = out.rstrip("/") + ".partial"
    import shutil
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage)
    tmp = tempfile.mkdtemp(prefix="tenplex-dcp-")
    try:
        _single_rank_group(tmp)
        sd, total = {}, 0
        for name, (dt, shape) in ptc.global_tensors(model).items():
            shards, metas = [], []
            for g, view in reader.views(name):
                t = to_torch(view, dt)
                m = ShardMetadata(shard_offsets=[b for b, _ in g], shard_sizes=[e - b for b, e in g],
                                  placement="rank:0/cpu")
                shards.append(Shard(tensor=t, metadata=m))
                metas.append(m)
                total += t.numel() * t.element_size()
            if not shards:
                raise InteropError(f"{name}: the checkpoint holds no piece of it")
            props = TensorProperties(dtype=st.DTYPES[dt][0], layout=torch.strided, requires_grad=False,
                                     memory_format=torch.contiguous_format, pin_memory=False)
            meta = ShardedTensorMetadata(shards_metadata=metas, size=torch.Size(shape), tensor_properties=props)
            sd[name] = ShardedTensor._init_from_local_shards_and_global_metadata(shards, meta)
        for k in _SCALARS:
            if k in reader.info:
                sd[k] = int(reader.info[k])
        dcp.save_state_dict(sd, dcp.FileSystemWriter(stage, single_file_per_rank=True), no_dist=True)
        ptc.move_into_place(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        shutil.rmtree(tmp, ignore_errors=True)
    return total


def read_metadata(src):
    dcp, _, _ = _dcp()
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


def import_(src, writer, batch_bytes=1 << 29):
    dcp, _, _ = _dcp()
    import torch
    from torch.distributed._shard.checkpoint.metadata import TensorStorageMetadata
    meta = read_metadata(src)
    globals_ = writer.globals
    tensors, extra = [], {}
    for key, m in meta.state_dict_metadata.items():
        if not isinstance(m, TensorStorageMetadata):
            if key not in _SCALARS:
                raise InteropError(f"{src}: unknown entry '{key}' (not a tensor of the model; "
                                   f"known non-tensor entries: {', '.join(_SCALARS)})")
            extra[key] = None
            continue
        if key not in globals_:
            raise InteropError(f"{src}: unknown tensor '{key}' (not a global tensor of the model)")
        dt, shape = globals_[key]
        got_dt = st.dtype_name(m.properties.dtype)
        if got_dt != dt or list(m.size) != shape:
            raise InteropError(f"{src}: tensor '{key}' is {got_dt}{list(m.size)}, the model says {dt}{shape}")
        covered = sum(int(np.prod(list(c.sizes))) for c in m.chunks)
        if covered != int(np.prod(shape)):
            raise InteropError(f"{src}: the chunks of '{key}' cover {covered} of {int(np.prod(shape))} elements")
        tensors.append(key)
    params = [t["path"] for t in writer.model["tensors"]]
    have = set(tensors)
    for p in params:
        if p not in have:
            raise InteropError(f"{src}: tensor '{p}' is missing")
    with_optimizer = any(k.startswith("optimizer.") for k in have)
    if with_optimizer:
        for k in globals_:
            if k not in have:
                raise InteropError(f"{src}: optimizer tensor '{k}' is missing (a checkpoint has all of its "
                                   "optimizer state or none)")
    reader = dcp.FileSystemReader(src)

    def load(sd):
        try:
            dcp.load_state_dict(sd, reader, no_dist=True)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # torch 1.13's CheckpointException is a BaseException
            raise InteropError(f"{src}: torch's DCP failed to read {', '.join(list(sd)[:3])}"
                               f"{'...' if len(sd) > 3 else ''} ({_cause(e)}); "
                               "truncated or damaged files?") from None

    batch, size = {}, 0
    for key in tensors + [None]:
        if key is not None:
            dt, shape = globals_[key]
            t = torch.empty(shape, dtype=st.DTYPES[dt][0])
            batch[key] = t
            size += t.numel() * t.element_size()
        if batch and (key is None or size >= batch_bytes):
            load(batch)
            for k, t in batch.items():
                writer.put_param(k, [(0, n) for n in t.shape], to_numpy(t), derive_fp32=not with_optimizer)
            batch, size = {}, 0
    if extra:
        sd = {k: 0 for k in extra}
        load(sd)
        for k in extra:
            writer.extra[k] = int(sd[k])
    return [] if with_optimizer else ["optimizer."]
