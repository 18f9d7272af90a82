"""tenplex: state management for PyTorch jobs whose parallelism changes while they run.

The three things a training script does with it (docs/python.md has the whole guide):

Run elastically under torchrun (``torchrun --nnodes=MIN:MAX ... train.py``; one
``tenplex store serve`` per host, ``TENPLEX_STORE_URL`` naming it)::

    import tenplex
    job = tenplex.Job("gpt", policy={"4": "tp=2,pp=2", "8": "tp=2,pp=2,dp=2"}, commit_every=10)
    job.init_process_group()                 # the world torchrun gave this worker
    state = job.restore()                    # None for a new job; job.config: this world's config

Restore state into a model: ``state.tensors`` is this rank's ``{local name: tensor}`` of
the last committed version, re-partitioned for ``job.config`` (names and shapes as
``tenplex.layout.rank_tensors(model, config, rank)`` says); ``state.info`` holds the fields
committed with it, ``state.step`` the step::

    if state is not None:
        load_my_tensors(state.tensors)       # e.g. copy_() into the rank's parameters
        step = state.step

Commit state: after every step. Every ``commit_every`` steps, at the last, and when
torchrun stops the workers for a change of hosts, every rank's tensors become one new
version on all hosts, or none does (a two-phase commit). The info names the model
description (docs/layout.md) and the config, which a later world's transform needs::

    info = lambda: {"model": model_json, "config": job.config, "step": step}
    if job.step_done(step, info, my_tensors, last=step == total):
        job.finish()                         # this world ends: torchrun starts the next
    job.close()                              # after the last step

Outside torchrun, one store: ``tenplex.attach(url)`` gives a `Store` (``begin``,
``save_state``, ``commit``, ``load_state``). Files without a daemon:
``tenplex.checkpoint`` (checkpoint directories, docs/layout.md) and
``tenplex.safetensors`` need neither the native module nor torch. Everything else needs
the native module ``tenplex._tenplex`` (built by CMake or ``pip install``, docs/install.md)
and torch. The names in ``__all__`` are the supported API; the other modules are the
parts it is built from.
"""

import sys as _sys
import typing as _typing

# The interpreter the native module is built for: CMake's TENPLEX_PY (python/CMakeLists.txt),
# or the one that ran `pip install` (docs/install.md).
_PYTHON = "the interpreter it was built with (a checkout's .venv/bin/python, or the one pip installed it for)"
_import_error = None

try:  # the native module (built by CMake into this folder, or installed beside it)
    from ._tenplex import (  # noqa: F401
        Error,
        InvalidArgumentError,
        NotFoundError,
        ResourceExhaustedError,
        UnavailableError,
        layout_json,
        parse_config,
    )
    from .store import Store, attach  # noqa: F401
except ImportError as e:  # safetensors and checkpoint still work without it
    _import_error = e

# The elastic API (tenplex.elastic), imported when first named: it brings torch.distributed.
_ELASTIC = ("Job", "Restored", "ElasticError", "FatalElasticError")

__all__ = [
    # run elastically, restore, commit (tenplex.elastic)
    "Job",
    "Restored",
    "ElasticError",
    "FatalElasticError",
    # one store, outside torchrun (tenplex.store)
    "Store",
    "attach",
    # the native module's errors (each also a Python builtin error: ValueError, KeyError, ...)
    "Error",
    "InvalidArgumentError",
    "NotFoundError",
    "ResourceExhaustedError",
    "UnavailableError",
    # layouts (spec §6)
    "layout_json",
    "parse_config",
]


def __getattr__(name: str) -> _typing.Any:
    """A name that needs the native module or torch, when importing them failed: say
    which module is missing and which interpreter has it. The elastic API on first use."""
    if name in _ELASTIC and _import_error is None:
        from . import elastic

        return getattr(elastic, name)
    if not name.startswith("_"):  # a submodule (`from tenplex import safetensors`) imports as usual
        import importlib.util

        if importlib.util.find_spec(f"{__name__}.{name}") is not None:
            return importlib.import_module(f"{__name__}.{name}")
    if _import_error is not None and not name.startswith("__"):
        missing = getattr(_import_error, "name", None) or str(_import_error)
        raise ImportError(
            f"tenplex.{name} is unavailable: importing '{missing}' failed ({_import_error}) under "
            f"{_sys.executable} (Python {_sys.version_info[0]}.{_sys.version_info[1]}). tenplex's native module "
            f"and torch are installed for {_PYTHON}: run with that, and build the native module first "
            f"(scripts/build.sh, or cmake --install; docs/install.md)"
        ) from _import_error
    raise AttributeError(f"module 'tenplex' has no attribute '{name}'")
