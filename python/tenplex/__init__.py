"""tenplex: state management for jobs whose parallelism changes while they run.

Parts without the native module: `tenplex.safetensors` (reader and writer) and
`tenplex.checkpoint` (checkpoint directories, docs/layout.md). Everything else
(`attach`, `Store`, `layout_json`, `tenplex.layout`, `tenplex.data`) needs the native
module `tenplex._tenplex`, built by CMake for the project's interpreter (.venv/bin/python,
made by scripts/setup-venv.sh), and torch for the store.
"""

import sys as _sys
import typing as _typing

# The interpreter the native module is built for (CMake's TENPLEX_PY, python/CMakeLists.txt).
PYTHON = "the project's .venv/bin/python (scripts/setup-venv.sh)"
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


def __getattr__(name: str) -> _typing.Any:
    """A name that needs the native module or torch, when importing them failed: say
    which module is missing and which interpreter has it."""
    if not name.startswith("_"):  # a submodule (`from tenplex import safetensors`) imports as usual
        import importlib.util

        if importlib.util.find_spec(f"{__name__}.{name}") is not None:
            return importlib.import_module(f"{__name__}.{name}")
    if _import_error is not None and not name.startswith("__"):
        missing = getattr(_import_error, "name", None) or str(_import_error)
        raise ImportError(
            f"tenplex.{name} is unavailable: importing '{missing}' failed ({_import_error}) under "
            f"{_sys.executable} (Python {_sys.version_info[0]}.{_sys.version_info[1]}). tenplex's native module "
            f"and torch are installed for {PYTHON}: run with {PYTHON}, and build the native module first "
            f"(scripts/build.sh, or cmake --install; docs/install.md)"
        ) from _import_error
    raise AttributeError(f"module 'tenplex' has no attribute '{name}'")
