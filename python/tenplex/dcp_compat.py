"""Importing torch 1.13's distributed checkpointing (DCP) on Python 3.11.

torch 1.13's ``sharded_tensor/metadata.py`` declares
``tensor_properties: TensorProperties = field(default=TensorProperties())``. Python
3.11 rejects an unhashable dataclass instance as a default ("mutable default ... use
default_factory"), so ``import torch.distributed._shard.checkpoint`` fails there.
``import_dcp()`` wraps ``dataclasses.field`` during the import so that such a default
becomes a ``default_factory`` returning a deep copy; system files stay untouched and
later torch versions (where the import works) are imported unchanged.

Returns ``(dcp, sharded_tensor, ChunkShardingSpec)``: the checkpoint module
(``save_state_dict``, ``load_state_dict``, ``FileSystemReader``/``Writer``), the
sharded tensor module and the chunk sharding spec class.
"""
import copy
import dataclasses


def import_dcp():
    orig = dataclasses.field

    def field(*args, **kw):
        d = kw.get("default", dataclasses.MISSING)
        if d is not dataclasses.MISSING and dataclasses.is_dataclass(d) and type(d).__hash__ is None:
            kw.pop("default")
            kw["default_factory"] = lambda d=d: copy.deepcopy(d)
        return orig(*args, **kw)

    dataclasses.field = field
    try:
        import torch.distributed._shard.checkpoint as dcp
        import torch.distributed._shard.sharded_tensor as st
        from torch.distributed._shard.sharding_spec import ChunkShardingSpec
    finally:
        dataclasses.field = orig
    return dcp, st, ChunkShardingSpec
