"""Checkpoint writers on a full disk, and stale staging directories (issue 19 §2).

Under pytest (issue 32 §4), ctest ckpt_full_disk, TENPLEX_BIN the CLI under test:

    python -m pytest tests/ckpt_full_disk_test.py::test_ckpt_full_disk

The test runs its body (`in_namespace`) in a private mount namespace (`unshare -m`, a
Python of its own) with an 8 MiB tmpfs as the output file system. Every command that
writes a checkpoint through a memory map or pwrite (`ckpt init`, `store save --url`,
`store save --cluster`, `reshard` streamed and `--mmap-output`) writes a 39 MiB checkpoint into it and must
fail by itself (exit 1, not a signal: before, the first touch of an unbacked page was
a SIGBUS, exit 135) with an error that says the disk is full, leaving nothing behind
(no output, no `*.partial-*`). A checkpoint that fits is written and verified on the
same file system.

Stale staging directories: writers record themselves (host, pid, process start time)
in their `<dir>.partial-<pid>-<n>`; the next write into the same directory removes
those of dead writers (the pid is gone, or belongs to a process started at another
time) and keeps the others (a live writer, another host's, one without a record).
The dead writer's directory fills 5 of the 8 MiB, so the next 5.4 MiB checkpoint
only fits because it was removed first.

Without root or mount namespaces, the same commands run under RLIMIT_FSIZE (8 MiB,
SIGXFSZ ignored) instead and the test is skipped after them (the tmpfs part did not run).
"""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import socket
import subprocess
import sys

import pytest
from elastic_run_testing import small_model

from tenplex.testing import Daemon

_log = logging.getLogger(__name__)
LIMIT = 8 << 20


class Tenplex:
    """run(args, ok=..., limit=...): the CLI under test, under RLIMIT_FSIZE when `limit`;
    with ok, a failure is an AssertionError with its output."""

    def __init__(self, binary: str) -> None:
        self.binary = binary

    def __call__(self, args: list[str], ok: bool = True, limit: bool = False) -> subprocess.CompletedProcess[str]:
        def preexec() -> None:
            if limit:
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))

        p = subprocess.run([self.binary, *args], capture_output=True, text=True, timeout=120, preexec_fn=preexec)
        if ok:
            assert p.returncode == 0, "%s failed: %s%s" % (" ".join(args), p.stdout, p.stderr)
        return p


def expect_full(run: Tenplex, what: str, args: list[str], where: str, limit: bool) -> None:
    p = run(args, ok=False, limit=limit)
    assert 0 < p.returncode < 128, "%s: exit %d (a signal?), want a clean failure: %s" % (
        what,
        p.returncode,
        p.stderr[-400:],
    )
    assert "tenplex: error:" in p.stderr and ("disk is full" in p.stderr or "File too large" in p.stderr), (
        "%s: no clear full-disk error: %r" % (what, p.stderr[-400:])
    )
    left = os.listdir(where)
    assert not left, "%s left %s behind in %s" % (what, left, where)
    _log.info("%s: exit %d: %s", what, p.returncode, p.stderr.strip().splitlines()[-1][:160])


def process_start(pid: int) -> str:
    with open("/proc/%d/stat" % pid) as f:
        text = f.read()
    return text[text.rindex(")") + 2 :].split()[19]


def stage(parent: str, name: str, host: str | None, pid: int, start: str, fill: int = 0) -> str:
    d = os.path.join(parent, name)
    os.makedirs(d)
    if host is not None:
        with open(os.path.join(d, ".tenplex-writer"), "w") as f:
            json.dump({"host": host, "pid": pid, "start": start}, f)
    with open(os.path.join(d, "rank-00000.safetensors.tmp.1.0"), "wb") as f:
        f.write(b"\1" * fill)
    return d


def body(tenplex: str, tmp: str, full: str, limit: bool) -> None:
    run = Tenplex(tenplex)
    model = small_model(tenplex, tmp, "m.json", layers=4, hidden=256, vocab=1024, seq=64)
    small = small_model(tenplex, tmp, "small.json", hidden=128, vocab=512, seq=64)
    good = os.path.join(tmp, "good")
    run(["ckpt", "init", "--model", model, "--config", "tp=2", "--out", good, "--seed", "5"])

    expect_full(
        run,
        "ckpt init",
        ["ckpt", "init", "--model", model, "--config", "tp=2", "--out", os.path.join(full, "ck")],
        full,
        limit,
    )
    expect_full(
        run, "reshard", ["reshard", "--in", good, "--to", "tp=1", "--out", os.path.join(full, "rs")], full, limit
    )
    expect_full(
        run,
        "reshard --mmap-output",
        ["reshard", "--in", good, "--to", "tp=1", "--mmap-output", "--out", os.path.join(full, "rs")],
        full,
        limit,
    )
    daemon = Daemon(tenplex, args=("--transport", "none"))
    try:
        run(["store", "load", "--url", daemon.url, "--job", "j", "--dir", good])
        expect_full(
            run,
            "store save",
            ["store", "save", "--url", daemon.url, "--job", "j", "--out", os.path.join(full, "saved")],
            full,
            limit,
        )
        cluster = os.path.join(tmp, "cluster.json")
        with open(cluster, "w") as f:
            json.dump({"hosts": [daemon.url], "gpus_per_host": 2}, f)
        expect_full(
            run,
            "store save --cluster",
            ["store", "save", "--cluster", cluster, "--job", "j", "--out", os.path.join(full, "saved")],
            full,
            limit,
        )
        assert daemon.proc.poll() is None, "the daemon died"
    finally:
        daemon.stop()

    # Stale staging directories of dead writers are removed by the next write.
    dead = subprocess.Popen(["true"])
    dead.wait()
    host = socket.gethostname()
    me = os.getpid()
    stale = stage(full, "old.partial-%d-0" % dead.pid, host, dead.pid, "1", fill=5 << 20)
    reused = stage(full, "reused.partial-%d-0" % me, host, me, "1")  # our pid, another start time
    live = stage(full, "live.partial-%d-0" % me, host, me, process_start(me))
    other = stage(full, "other.partial-%d-0" % dead.pid, "elsewhere.example", dead.pid, "1")
    unrecorded = stage(full, "unrecorded.partial-%d-0" % dead.pid, None, dead.pid, "1")
    out = os.path.join(full, "fits")
    run(["ckpt", "init", "--model", small, "--config", "tp=2", "--out", out, "--seed", "2"], limit=limit)
    run(["ckpt", "verify", "--in", out])
    assert not os.path.exists(stale), "the dead writer's staging directory is still there"
    assert not os.path.exists(reused), "the staging directory of a reused pid is still there"
    for d in (live, other, unrecorded):
        assert os.path.exists(d), "%s (not a dead writer's of this host) was removed" % d
    assert not any(n.startswith(".tenplex-writer") for n in os.listdir(out)), "the writer record is in the output"
    _log.info(
        "stale staging: the dead writer's and the reused pid's removed; live, other host's, unrecorded kept; "
        "a 5.4 MiB checkpoint fits after the cleanup"
    )


def in_namespace(tenplex: str, tmp: str) -> None:
    """The body on an 8 MiB tmpfs mounted on tmp/full; run by test_ckpt_full_disk in a
    private mount namespace (the mount goes with it)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    full = os.path.join(tmp, "full")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%d" % LIMIT, "tmpfs", full], check=True)
    body(tenplex, tmp, full, limit=False)
    _log.info("ckpt_full_disk: OK (8 MiB tmpfs)")


def test_ckpt_full_disk(tenplex: str, tmp: str) -> None:
    full = os.path.join(tmp, "full")
    os.makedirs(full)
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs '%s'" % full], capture_output=True
    )
    if probe.returncode == 0:
        # A Python of its own in the namespace, importing this module from tests/ (its cwd).
        code = "import ckpt_full_disk_test as t; t.in_namespace(%r, %r)" % (tenplex, tmp)
        here = os.path.dirname(os.path.abspath(__file__))
        p = subprocess.run(["unshare", "-m", sys.executable, "-c", code], cwd=here)
        assert p.returncode == 0, "the test in the mount namespace failed (exit %d): its output above" % p.returncode
        return
    why = probe.stderr.decode().strip()
    _log.info("no tmpfs in a private mount namespace (%s); RLIMIT_FSIZE instead", why)
    body(tenplex, tmp, full, limit=True)
    pytest.skip(
        "no tmpfs in a private mount namespace (%s): the RLIMIT_FSIZE fallback passed, the tmpfs part skipped" % why
    )
