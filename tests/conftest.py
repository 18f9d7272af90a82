"""Fixtures shared by the pytest modules of tests/ (issue 32 §4).

`tenplex`: the CLI under test. ctest passes it in the environment
(`set_tests_properties(... ENVIRONMENT TENPLEX_BIN=...)`); without TENPLEX_BIN, the
package's own lookup (`tenplex.elastic_policy.tenplex_binary`: beside the interpreter,
then PATH). The package is imported only then: it loads torch.

`tmp`: a directory of the test's own, removed afterwards.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest


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
