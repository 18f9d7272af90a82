"""Fixtures shared by the pytest modules of tests/ (issue 32 §4).

`tenplex`: the CLI under test. ctest passes it in the environment
(`set_tests_properties(... ENVIRONMENT TENPLEX_BIN=...)`); without TENPLEX_BIN, the
package's own lookup (`tenplex.elastic_policy.tenplex_binary`: beside the interpreter,
then PATH). The package is imported only then: it loads torch.

`tmp`: a directory of the test's own, removed afterwards.

`repo`: the checkout under test (its deploy/, examples/, python/). `references`: the
independent pure-Python references of tests/reference (layout_ref, data_ref), loaded
by path. `examples_gpt`: examples/gpt (not a package) importable for a test module and
the processes it starts (sys.path and PYTHONPATH, both restored after the module).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from types import ModuleType, SimpleNamespace

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def tenplex() -> str:
    exe = os.environ.get("TENPLEX_BIN")
    if exe:
        return exe
    from tenplex.elastic_policy import tenplex_binary

    return tenplex_binary()


@pytest.fixture
def tmp(request: pytest.FixtureRequest) -> Iterator[str]:
    """A directory of the test's own (named after it), removed afterwards."""
    d = tempfile.mkdtemp(prefix=f"tenplex-{request.node.name}-")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def repo() -> str:
    """The checkout's root."""
    return REPO


def _load_reference(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        f"tenplex_{name}", os.path.join(REPO, "tests", "reference", f"{name}.py")
    )
    assert spec is not None and spec.loader is not None, name
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def references() -> SimpleNamespace:
    """tests/reference's modules: `references.layout_ref`, `references.data_ref`."""
    return SimpleNamespace(layout_ref=_load_reference("layout_ref"), data_ref=_load_reference("data_ref"))


@pytest.fixture(scope="module")
def examples_gpt() -> Iterator[str]:
    """examples/gpt first on sys.path and on the PYTHONPATH of the processes a test starts,
    for one test module; its directory."""
    gpt = os.path.join(REPO, "examples", "gpt")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(gpt)
        old = os.environ.get("PYTHONPATH")
        mp.setenv("PYTHONPATH", gpt + (os.pathsep + old if old else ""))
        yield gpt


@pytest.fixture
def interop(tenplex: str, tmp: str, references: SimpleNamespace) -> Iterator[str]:
    """The interop tests' shared state: tests/interop_test.py's module globals (the CLI, the
    test's directory, the reference layout) set for one test and restored after it
    (interop_test.configured); the directory."""
    import interop_test

    with interop_test.configured(tenplex, tmp, references.layout_ref):
        yield tmp
