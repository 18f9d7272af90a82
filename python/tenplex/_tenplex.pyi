# The native module (python/src/*.cc, pybind11) for the type checker: every name is Any
# until stubs are generated from the binding. Without this file mypy would take the
# module's names from tenplex.__getattr__ (the import-error fallback).
from typing import Any

def __getattr__(name: str) -> Any: ...
