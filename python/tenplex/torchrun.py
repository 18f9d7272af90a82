"""torchrun for torch 1.13 on Python 3.11, without editing system files.

    /usr/bin/python3 -m tenplex.torchrun --nnodes=2:3 --nproc_per_node=2 ... train.py ARGS

takes exactly torchrun's arguments (``python -m torch.distributed.run``) and runs its
``main`` after one fix:

torch 1.13's ``Std.from_str`` (torch/distributed/elastic/multiprocessing/api.py) turns
the number of ``--redirects``/``--tee`` into a member by iterating ``Std``. Since Python
3.11 iterating an ``IntFlag`` yields only its canonical (single-bit) members, so the
zero member ``Std.NONE`` is never seen and the default ``--redirects 0`` becomes
``None``; ``to_map`` then fails with ``AttributeError: 'NoneType' object has no
attribute 'get'`` before any worker starts. ``patch()`` replaces ``from_str`` with one
that converts through ``Std(int)`` (and ``to_map`` with one that reads ``None`` as
``Std.NONE``) in the running interpreter only. On a torch whose ``from_str`` already
works, the patch changes nothing (the results are the same).
"""
import re
import sys

_patched = False


def patch():
    """Applies the fix to the imported torch (idempotent); returns True when applied."""
    global _patched
    if _patched:
        return True
    import torch.distributed.elastic.multiprocessing as mp
    from torch.distributed.elastic.multiprocessing import api

    Std = api.Std
    orig_to_map = api.to_map

    def from_str(vm):
        vm = vm.strip()
        if re.fullmatch(r"[0-3]", vm):
            return Std(int(vm))
        if re.fullmatch(r"(\d+:[0-3],)*\d+:[0-3]", vm):
            return {int(k): Std(int(v)) for k, v in (kv.split(":") for kv in vm.split(","))}
        raise ValueError(f"{vm} does not match: {api._VALUE_REGEX} or {api._MAPPING_REGEX}")

    def to_map(val_or_map, local_world_size):
        return orig_to_map(Std.NONE if val_or_map is None else val_or_map, local_world_size)

    Std.from_str = staticmethod(from_str)
    api.to_map = to_map
    if getattr(mp, "to_map", None) is orig_to_map:
        mp.to_map = to_map
    _patched = True
    return True


def main(argv=None):
    patch()
    from torch.distributed import run

    run.main(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
