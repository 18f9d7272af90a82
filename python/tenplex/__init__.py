"""tenplex: state management for jobs whose parallelism changes while they run.

Pure-Python parts (no native module needed): `tenplex.layout` (parallel configs and
what each rank holds, spec ptc-layout.md §3-§5), `tenplex.safetensors` (reader and
writer), `tenplex.checkpoint` (checkpoint directories, spec §7).
"""

try:  # the native module (built by CMake into this folder)
    from ._tenplex import (Error, InvalidArgumentError, NotFoundError, ResourceExhaustedError,  # noqa: F401
                           UnavailableError, layout_json, parse_config)
    from .store import Store, attach  # noqa: F401
except ImportError:  # pure-Python parts still work without it
    pass
