"""The tenplex package as a library (issue 32 §4): its facade, where it finds the CLI,
what its entry points log, and the shared test helpers.

Under pytest, ctest package (every test of the file), TENPLEX_BIN the CLI under test:

    python -m pytest tests/package_test.py
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest


def test_all_names_resolve_and_elastic_loads_on_first_use() -> None:
    """Every name of __all__ is there; the elastic API (torch.distributed) only when named."""
    code = (
        "import sys, tenplex\n"
        "print('tenplex.elastic' in sys.modules)\n"
        "missing = [n for n in tenplex.__all__ if getattr(tenplex, n, None) is None]\n"
        "print(missing)\n"
        "print(tenplex.Job.__module__, tenplex.ElasticError.__name__, 'tenplex.elastic' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "False", out
    assert out[1] == "[]", out
    assert out[2] == "tenplex.elastic ElasticError True", out
    import tenplex

    assert len(set(tenplex.__all__)) == len(tenplex.__all__)
    assert not any(n.startswith("_") for n in tenplex.__all__)


def _fake_cli(directory: str) -> str:
    path = os.path.join(directory, "tenplex")
    with open(path, "w") as f:
        f.write("#!/bin/sh\nexit 0\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


def test_cli_is_found_by_env_beside_interpreter_path_never_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TENPLEX_BIN first, then the tenplex beside the interpreter, then PATH; without any,
    a clear error (not the checkout's build/, which this test's checkout has)."""
    from tenplex import elastic_policy as ep
    from tenplex.elastic_cluster import ElasticError

    base = str(tmp_path)
    env_dir, bin_dir, path_dir = (os.path.join(base, d) for d in ("env", "venv-bin", "path"))
    for d in (env_dir, bin_dir, path_dir):
        os.makedirs(d)
    on_path = _fake_cli(path_dir)
    monkeypatch.delenv("TENPLEX_BIN", raising=False)
    monkeypatch.setenv("PATH", path_dir)
    monkeypatch.setattr(sys, "executable", os.path.join(bin_dir, "python"))
    assert ep.tenplex_binary() == on_path
    beside = _fake_cli(bin_dir)
    assert ep.tenplex_binary() == beside
    monkeypatch.setenv("TENPLEX_BIN", "/opt/x/tenplex")
    assert ep.tenplex_binary() == "/opt/x/tenplex"
    monkeypatch.delenv("TENPLEX_BIN")
    os.remove(beside)
    os.remove(on_path)
    with pytest.raises(ElasticError, match="set TENPLEX_BIN or put tenplex on PATH"):
        ep.tenplex_binary()


def test_entry_points_log_their_errors_as_they_printed_them(tmp_path: Path, tenplex: str) -> None:
    """python -m tenplex.data and tenplex.interop: the error line on stderr, exit 2."""
    missing = os.path.join(str(tmp_path), "none")
    p = subprocess.run(
        [sys.executable, "-m", "tenplex.data", "read", "--index", missing, "--sample", "0"],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2, p
    assert p.stderr.startswith("tenplex.data: error: ") and missing in p.stderr, p.stderr
    assert p.stdout == ""
    model = os.path.join(str(tmp_path), "model.json")
    with open(model, "w") as f:
        f.write("{}")
    p = subprocess.run(
        [sys.executable, "-m", "tenplex.interop", "import", "--from", "hf", "--model-file", model]
        + ["--config", "tp=1", missing, "--out", os.path.join(str(tmp_path), "out"), "--tenplex", tenplex],
        capture_output=True,
        text=True,
    )
    assert p.returncode in (1, 2), p
    assert p.stderr.startswith("tenplex: error: "), p.stderr
    assert "Traceback" not in p.stderr


def test_library_logs_reach_stderr_without_configuration() -> None:
    """A library warning (tenplex.elastic's logger) with no handler configured by the
    application: on stderr, the message alone (the fatal message of a job relies on it)."""
    code = "import logging; logging.getLogger('tenplex.elastic').critical('job gpt cannot continue: x')"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert p.stderr == "job gpt cannot continue: x\n", p.stderr


def test_run_tenplex_and_daemon(tenplex: str) -> None:
    """tenplex.testing: the CLI's output or SystemExit with it; a daemon announces its URL."""
    from tenplex.testing import Daemon, run_tenplex

    assert run_tenplex(tenplex, "--version").startswith("tenplex ")
    with pytest.raises(SystemExit, match="tenplex no-such-command failed"):
        run_tenplex(tenplex, "no-such-command")
    d = Daemon(tenplex)
    try:
        assert d.url.startswith("http://127.0.0.1:")
        assert "shm_dir" in d.get("/v1/health")
    finally:
        d.stop()
    assert d.proc.returncode is not None
