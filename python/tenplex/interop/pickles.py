"""Loading the torch pickles of other libraries' checkpoints without running their code.

Megatron-LM's `model_optim_rng.pt`, Megatron-Core's `common.pt` and DeepSpeed's
`mp_rank_*_model_states.pt` are `torch.save` pickles. Since torch 2.6 `torch.load`
defaults to `weights_only=True`, which refuses any class outside torch's allow-list
(Megatron's `args` is an `argparse.Namespace`); `weights_only=False` would run whatever
a hostile file names. `load` takes the middle way: the restricted unpickler with the
plain-data classes these formats really use added (`argparse.Namespace`, numpy's array
and dtype reconstructors for RNG states, `collections.OrderedDict`), so a file that
pickles anything else fails with an error naming the class. A user who trusts the file
sets `TENPLEX_TRUST_PICKLES=1` (the full unpickler, as Megatron and DeepSpeed themselves
load it).
"""

from __future__ import annotations

import argparse
import collections
import os
import pickle
from typing import Any

from .ptc import InteropError

TRUST_ENV = "TENPLEX_TRUST_PICKLES"


def _safe_classes() -> list[Any]:
    out: list[Any] = [argparse.Namespace, collections.OrderedDict]
    try:
        import numpy as np

        out += [
            np.dtype,
            np.ndarray,
            type(np.dtype("float32")),
            type(np.dtype("int64")),
            type(np.dtype("uint32")),
            type(np.dtype("float64")),
        ]
        try:
            from numpy._core.multiarray import _reconstruct, scalar
        except ImportError:  # numpy 1.x
            from numpy.core.multiarray import _reconstruct, scalar  # type: ignore
        out += [_reconstruct, scalar]
    except ImportError:
        pass
    return out


def load(path: str, what: str, mmap: bool = False) -> Any:
    """torch.load of a checkpoint file of another library (`what` names it in errors)."""
    import torch

    if not os.path.isfile(path):
        raise InteropError(f"{path} is missing")
    trusted = os.environ.get(TRUST_ENV) == "1"
    try:
        if trusted:
            return torch.load(path, map_location="cpu", mmap=mmap, weights_only=False)
        with torch.serialization.safe_globals(_safe_classes()):
            return torch.load(path, map_location="cpu", mmap=mmap, weights_only=True)
    except pickle.UnpicklingError as e:
        msg = str(e)
        if not trusted and ("Unsupported global" in msg or "weights_only" in msg.lower()):
            lines = [ln.strip() for ln in msg.splitlines() if "global" in ln.lower() and "weights_only" not in ln]
            lines = lines or [msg.strip()[:200]]
            raise InteropError(
                f"{path}: the file pickles a class outside the plain-data allow-list "
                f"({lines[0][:300]}); "
                f"if you trust this {what}, set {TRUST_ENV}=1 to load it with the full unpickler"
            ) from None
        raise InteropError(
            f"{path}: torch.load failed (UnpicklingError: {msg[:300]}); truncated or not a {what}?"
        ) from None
    except Exception as e:
        raise InteropError(
            f"{path}: torch.load failed ({type(e).__name__}: {str(e)[:300]}); truncated or not a {what}?"
        ) from None
