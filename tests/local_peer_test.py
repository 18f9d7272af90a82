"""Integration test of same-host reads between store daemons (docs/transport.md,
"Same-host peers"): daemons on this machine read each other's committed tensors
through their shared-memory files instead of UCX.

Under pytest (issue 32 §4), ctest cluster_transform_local_peer, TENPLEX_BIN the CLI under test:

    python -m pytest tests/local_peer_test.py::test_local_peer

- two daemons as two hosts (2 GPUs each) hold a synthetic tp=2,pp=2 checkpoint; a TP
  change moves boxes between them: every fetched byte went through the peers' files
  (the transform report's bytes_fetched_shm equals bytes_fetched, the daemons'
  tenplex_transform_fetched_shm_bytes_total grew by as much, and their UCX data plane
  served nothing), and the result saved back is checked element by element by
  `tenplex ckpt verify` (the spec's slicing of the synthetic global tensors);
- the same with `transform --no-local-peer-reads`: every byte over UCX (served by the
  data plane, none through files), verified the same way;
- a daemon started with `--no-local-peer-reads` neither offers nor uses them;
- a peer that dies while its peer is about to read its files (TENPLEX_FAULT=
  exit-in-locate) aborts the transform (the reader's prepare fails naming it): with
  the host lost the new layout does not fit and the error says so, the
  survivor keeps the old version and nothing newer; restarted on its shared-memory
  directory the dead host still has its state, and the transform then succeeds,
  verified (no data lost).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from typing import Any

import pytest
from cli_testing import Cli
from elastic_run_testing import small_model

from tenplex.testing import Daemon, write_cluster

_log = logging.getLogger(__name__)
run = Cli()  # the CLI under test, bound to the tenplex fixture's by _cli_under_test


@pytest.fixture(autouse=True)
def _cli_under_test(tenplex: str) -> None:
    run.binary = tenplex


def counters(daemons: list[Daemon]) -> list[tuple[int, int]]:
    return [
        (d.metric("tenplex_transform_fetched_shm_bytes_total"), d.metric("tenplex_fetch_served_bytes_total"))
        for d in daemons
    ]


def transform(cluster: str, job: str, to: str, *extra: str) -> tuple[dict[str, Any], int, int]:
    p = run("transform", "--cluster", cluster, "--job", job, "--to", to, "--json", *extra)
    s: dict[str, Any] = json.loads(p.stdout)
    fetched = sum(h["bytes_fetched"] for h in s["hosts"])
    shm = sum(h["bytes_fetched_shm"] for h in s["hosts"])
    assert s["attempts"] == 1 and fetched == s["plan"]["bytes_cross_host"] > 0, "unexpected: %r" % s
    _log.info(
        "%s -> %s: %.3f s, fetched %d B, %d B through peers' files" % (s["from"], s["to"], s["seconds"], fetched, shm)
    )
    return s, fetched, shm


def verify(tmp: str, cluster: str, job: str) -> None:
    out = os.path.join(tmp, "out")
    shutil.rmtree(out, ignore_errors=True)
    run("store", "save", "--cluster", cluster, "--job", job, "--out", out)
    run("ckpt", "verify", "--in", out)


def test_local_peer(tmp: str) -> None:
    daemons: list[Daemon] = []
    try:
        extra = ["--ffn-hidden-size", "96", "--make-vocab-size-divisible-by", "8"]
        model = small_model(run.binary, tmp, "m.json", layers=4, hidden=64, vocab=301, seq=16, extra=extra)
        ckpt = os.path.join(tmp, "in")
        run("ckpt", "init", "--model", model, "--config", "tp=2,pp=2", "--out", ckpt, "--seed", "3")
        a, b = Daemon(run.binary), Daemon(run.binary)
        daemons += [a, b]
        assert "local" in a.get("/v1/transform/address"), "no same-host offer by default"
        cluster = os.path.join(tmp, "ab.json")
        write_cluster(cluster, [a, b], 2)
        run("store", "load", "--cluster", cluster, "--job", "j", "--dir", ckpt)

        # Same-host reads: every fetched byte through the peer's files, none over UCX.
        before = counters([a, b])
        s, fetched, shm = transform(cluster, "j", "tp=4")
        after = counters([a, b])
        assert shm == fetched, "not every byte went through the files: %r" % s["hosts"]
        assert sum(x[0] - y[0] for x, y in zip(after, before)) == fetched, "shm metric %r %r" % (before, after)
        assert all(x[1] == y[1] for x, y in zip(after, before)), "UCX served bytes: %r %r" % (before, after)
        assert a.metric("tenplex_peer_files_located_total") > 0, "a located no file for b"
        verify(tmp, cluster, "j")

        # The same daemons with the data plane only.
        before = counters([a, b])
        s, fetched, shm = transform(cluster, "j", "tp=2,pp=2", "--no-local-peer-reads")
        after = counters([a, b])
        assert shm == 0, "bytes through files with --no-local-peer-reads: %r" % s["hosts"]
        assert sum(x[1] - y[1] for x, y in zip(after, before)) == fetched, "UCX served %r %r" % (before, after)
        verify(tmp, cluster, "j")

        # A daemon that turned them off neither offers nor uses them; b still offers.
        c = Daemon(run.binary, args=("--no-local-peer-reads",))
        daemons.append(c)
        assert "local" not in c.get("/v1/transform/address"), "c offers same-host reads"
        bc = os.path.join(tmp, "bc.json")
        write_cluster(bc, [b, c], 2)
        p = run("transform", "--cluster", cluster, "--to-cluster", bc, "--job", "j", "--to", "tp=4", "--json")
        s = json.loads(p.stdout)
        hosts = {h["url"]: h for h in s["hosts"]}
        assert hosts[c.url]["bytes_fetched"] > 0 and hosts[c.url]["bytes_fetched_shm"] == 0, (
            "c used same-host reads: %r" % hosts[c.url]
        )
        assert hosts[b.url]["bytes_fetched_shm"] == hosts[b.url]["bytes_fetched"] > 0, (
            "b did not read a's files: %r" % hosts[b.url]
        )
        verify(tmp, bc, "j")

        # A peer that dies as its peer is about to read its files: no replica, so the
        # transform fails; the survivor keeps version 1; restarted, the state is whole.
        fdir = os.path.join("/dev/shm", os.path.basename(tmp) + "-f")
        f = Daemon(run.binary, {"TENPLEX_FAULT": "exit-in-locate"}, args=("--shm-dir", fdir))
        daemons.append(f)
        af = os.path.join(tmp, "af.json")
        write_cluster(af, [a, f], 2)
        run("store", "load", "--cluster", af, "--job", "k", "--dir", ckpt)
        p = run("transform", "--cluster", af, "--job", "k", "--to", "tp=4", expect_ok=False)
        assert f.proc.poll() is not None, "the faulty daemon did not exit"
        # a's read of f's files failed (f died as a asked where they are), the round
        # was aborted, and without f the new layout does not fit / has no replica.
        assert "fetching from host 1" in p.stderr, "a did not see f die: %r" % p.stderr
        assert "lost: 1 hosts" in p.stderr or "no surviving replica" in p.stderr, "unclear error: %r" % p.stderr
        j = a.get("/v1/jobs/k")
        assert j["current"] == 1 and all(v["version"] <= 1 for v in j["versions"]), "survivor changed: %r" % j
        port = f.url.rsplit(":", 1)[1]
        f2 = Daemon(run.binary, listen="127.0.0.1:" + port, args=("--shm-dir", fdir))
        daemons.append(f2)
        s, fetched, shm = transform(af, "k", "tp=4")
        assert shm == fetched, "not through the files after the restart: %r" % s["hosts"]
        verify(tmp, af, "k")
    finally:
        for d in daemons:
            d.stop()
        for name in os.listdir("/dev/shm"):
            if name.startswith(os.path.basename(tmp)):
                shutil.rmtree(os.path.join("/dev/shm", name), ignore_errors=True)
