"""Shared by the multi-host pytest modules (torchrun_elastic_test, torchrun_etcd_test,
membership_test, recipe_test; issue 32 §4): network namespaces that skip the test where
they cannot be made, an etcd server of the test's own, the processes a test left behind,
and the figures a test prints on purpose.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request

import pytest

from tenplex.testing import Daemon, NetnsBridge, Unavailable, free_port

_log = logging.getLogger(__name__)


def netns(count: int, name_prefix: str = "tp") -> NetnsBridge:
    """NetnsBridge(count, name_prefix), which the caller closes; where namespaces cannot be
    made (its Unavailable) the test is skipped (pytest.skip) saying why."""
    try:
        return NetnsBridge(count, name_prefix=name_prefix)
    except Unavailable as e:
        pytest.skip(e.why)


class Figures:
    """The figures a test prints on purpose (reconfiguration times): each is logged at INFO
    and written to the terminal with pytest's capture off for that line only. ctest runs
    `pytest -q` without log_cli (tenplex_pytest), which shows logs only of a failed test
    and then from WARNING up, so a logged figure alone would not reach ctest's output as
    the scripts' printed ones did (bench/ reads them there). Diagnostics only log."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys

    def __call__(self, message: str) -> None:
        _log.info("%s", message)
        with self.capsys.disabled():
            print(message, flush=True)


class Etcd(Daemon):
    """`etcd --enable-v2` on addr (a free port), its data in a temp dir in tmp; stop() (Daemon's:
    SIGTERM, then SIGKILL after 20 s) removes both. The test is skipped where etcd is not installed."""

    def __init__(self, addr: str, tmp: str) -> None:
        if shutil.which("etcd") is None:
            pytest.skip("etcd is not installed (Debian: etcd-server)")
        self.dir = tempfile.mkdtemp(prefix="etcd-", dir=tmp)
        port, peer = free_port(), free_port()
        self.endpoint = f"{addr}:{port}"
        clients = f"http://{addr}:{port}" + ("" if addr == "127.0.0.1" else f",http://127.0.0.1:{port}")
        self.log = open(os.path.join(tmp, "etcd.log"), "w")
        self.proc = subprocess.Popen(
            [
                "etcd",
                "--name",
                "tenplex-test",
                "--data-dir",
                self.dir,
                "--enable-v2",
                "--listen-client-urls",
                clients,
                "--advertise-client-urls",
                f"http://{addr}:{port}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-cluster",
                f"tenplex-test=http://127.0.0.1:{peer}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.time() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if b"true" in r.read():
                        break
            except OSError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError(f"etcd did not come up on {self.endpoint} (see {self.log.name})")
            time.sleep(0.2)

    def stop(self) -> None:
        super().stop()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def alive(pid: int) -> bool:
    """pid runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def procs_naming(folder: str) -> list[int]:
    """The ids of processes whose command line names folder (the workers' --step-log, the agents' policy)."""
    out = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if folder.encode() in f.read():
                    out.append(int(d))
        except OSError:
            continue  # gone meanwhile
    return out
