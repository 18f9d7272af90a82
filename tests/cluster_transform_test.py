"""Integration test of `tenplex transform --cluster`: 4 store daemons as 4 hosts
(2 GPUs each) on loopback, bytes between them over UCX.

Under pytest (issue 32 §4), TENPLEX_BIN the CLI under test:

    python -m pytest tests/cluster_transform_test.py::test_loopback   (ctest cluster_transform)
    python -m pytest tests/cluster_transform_test.py::test_netns      (ctest cluster_transform_netns)

test_netns runs the daemons in 4 network namespaces joined by veth pairs on a bridge,
each with a /dev/shm of its own (skipped where namespaces cannot be created).

On loopback the daemons read each other's committed tensors through their shared-memory
files (same-host reads, docs/transport.md): every fetched byte goes that way. In the
namespaces they cannot see each other's files and every byte crosses over UCX.

- a synthetic checkpoint (`tenplex ckpt init`: every element a function of its global
  index) is loaded, transformed through tp, pp, dp and zero changes, and after each
  transform saved back from the daemons and checked element by element by
  `tenplex ckpt verify` (the spec's slicing of the synthetic global tensors); the JSON
  stats must show cross-host bytes equal to the lower bound and to the bytes the hosts
  fetched;
- the same daemons named by other URLs (localhost for 127.0.0.1) are the same hosts
  (matched by their host id): the transform finds every rank (issue 34 finding 3);
- --to-cluster moves the state to two other daemons (4 GPUs each);
- a daemon killed (SIGKILL) before a transform, and a daemon that dies in the middle
  of its prepare (TENPLEX_FAULT=exit-in-prepare) are survived from the dp replicas,
  the result verified;
- with no replica (zero=1 optimizer shards) a lost host fails with a clear error and
  every survivor still serves the old version, with no newer version left behind.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from cli_testing import Cli
from elastic_run_testing import small_model
from multihost_testing import netns

from tenplex.testing import Daemon, NetnsBridge, write_cluster

_log = logging.getLogger(__name__)
run = Cli()  # the CLI under test, bound to the tenplex fixture's by _cli_under_test


@pytest.fixture(autouse=True)
def _cli_under_test(tenplex: str) -> None:
    run.binary = tenplex


@pytest.fixture
def net() -> Iterator[NetnsBridge]:
    """4 network namespaces on a bridge, removed afterwards; the test is skipped where
    they cannot be made (multihost_testing.netns)."""
    bridge = netns(4)
    try:
        yield bridge
    finally:
        bridge.close()


def transform(cluster: str, to: str, *extra: str, netns: bool = False) -> dict[str, Any]:
    """`tenplex transform --json`; netns: the hosts share no files (every byte over UCX)."""
    p = run("transform", "--cluster", cluster, "--job", "j", "--to", to, "--json", *extra)
    s: dict[str, Any] = json.loads(p.stdout)
    fetched = sum(h["bytes_fetched"] for h in s["hosts"])
    shm = sum(h["bytes_fetched_shm"] for h in s["hosts"])
    assert shm == (0 if netns else fetched), "bytes through peers' files: %d of %d" % (shm, fetched)
    if not s["central"]:  # (the central baseline reports its last round, the scatter)
        assert s["plan"]["bytes_cross_host"] == s["plan"]["cross_host_lower_bound"] == fetched, (
            "cross-host bytes %r vs fetched %d" % (s["plan"], fetched)
        )
    _log.info(
        "%s -> %s: v%d, %d attempt(s), lost %s, %.3f s, fetched %d B"
        % (s["from"], s["to"], s["to_version"], s["attempts"], s["lost_hosts"], s["seconds"], fetched)
    )
    return s


def canon(config: str) -> dict[str, str]:
    c = {"tp": "1", "pp": "1", "dp": "1", "zero": "0"}
    for kv in config.split(","):
        k, v = kv.split("=")
        if k in c:
            c[k] = v
    return c


def verify(tmp: str, cluster: str, config: str) -> None:
    out = os.path.join(tmp, "out")
    shutil.rmtree(out, ignore_errors=True)
    run("store", "save", "--cluster", cluster, "--job", "j", "--out", out)
    with open(os.path.join(out, "tenplex.json")) as f:
        saved = json.load(f)
    assert canon(saved["config"]) == canon(config), "saved config %r, expected %r" % (saved["config"], config)
    run("ckpt", "verify", "--in", out)


def load_state(tmp: str, cluster: str) -> None:
    extra = ["--num-query-groups", "2", "--ffn-hidden-size", "48", "--make-vocab-size-divisible-by", "8", "--swiglu"]
    model = small_model(run.binary, tmp, "m.json", layers=4, vocab=301, seq=16, extra=extra)
    ckpt = os.path.join(tmp, "in")
    run("ckpt", "init", "--model", model, "--config", "tp=2,pp=2,dp=2,zero=1", "--out", ckpt, "--seed", "5")
    run("store", "load", "--cluster", cluster, "--job", "j", "--dir", ckpt)


def test_netns(tmp: str, net: NetnsBridge, monkeypatch: pytest.MonkeyPatch) -> None:
    """4 daemons in 4 network namespaces on a bridge (veth pairs), a token on every
    request, UCX over the veths: transforms across every dimension, a host killed.
    Each daemon also has a private /dev/shm (a mount namespace of its own), as on
    separate hosts: same-host reads must fall back to UCX."""
    daemons: list[Daemon] = []
    try:
        monkeypatch.setenv("TENPLEX_TOKEN", "netns-test-token")
        private_shm = (
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            'mount -t tmpfs -o size=1G tmpfs /dev/shm && exec "$@"',
            "sh",
        )
        daemons = [
            Daemon(run.binary, listen=net.addr(i) + ":7480", prefix=net.prefix(i) + private_shm) for i in range(4)
        ]
        try:  # the bridge may be filtered on some machines: that is the environment, not us
            for d in daemons:
                d.get("/v1/health")
        except OSError as e:
            pytest.skip("the namespaces' daemons cannot be reached over the bridge (%s)" % e)
        cluster = os.path.join(tmp, "cluster.json")
        write_cluster(cluster, daemons, 2)
        load_state(tmp, cluster)
        for to in ["tp=1,pp=4,dp=2", "tp=2,dp=4,zero=1", "tp=2,pp=2,dp=2"]:
            s = transform(cluster, to, netns=True)
            assert s["attempts"] == 1 and sum(h["bytes_fetched"] for h in s["hosts"]) > 0, (
                "no bytes crossed the namespaces: %r" % s
            )
            verify(tmp, cluster, to)
        daemons[1].kill()
        s = transform(cluster, "tp=2,dp=3", netns=True)
        assert s["lost_hosts"] == [daemons[1].url], "lost %r" % s["lost_hosts"]
        verify(tmp, cluster, "tp=2,dp=3")
    finally:
        for d in daemons:
            d.stop()


def test_loopback(tmp: str) -> None:
    daemons: list[Daemon] = []
    try:
        daemons = [Daemon(run.binary) for _ in range(4)]
        cluster = os.path.join(tmp, "cluster.json")
        write_cluster(cluster, daemons, 2)
        load_state(tmp, cluster)

        # Every dimension, byte-exact.
        for to in ["tp=2,pp=4", "tp=1,pp=2,dp=4,zero=1", "tp=2,pp=2,dp=2", "tp=2,dp=4,zero=1", "tp=2,pp=2,dp=2"]:
            s = transform(cluster, to)
            assert s["attempts"] == 1 and not s["lost_hosts"], "unexpected retry: %r" % s
            verify(tmp, cluster, to)
        # Issue 34 finding 3: the same daemons named by other URLs (localhost): hosts are
        # matched by their host id, so no rank is on a "lost host" (it used to fail).
        renamed = os.path.join(tmp, "renamed.json")
        with open(renamed, "w") as f:
            json.dump({"hosts": [d.url.replace("127.0.0.1", "localhost") for d in daemons], "gpus_per_host": 2}, f)
        s = transform(renamed, "tp=2,pp=2,dp=2,zero=1")
        assert s["attempts"] == 1 and not s["lost_hosts"], "renamed hosts: %r" % s
        verify(tmp, renamed, "tp=2,pp=2,dp=2,zero=1")
        s = transform(cluster, "tp=1,pp=4,dp=2", "--central")
        assert len(s["round_seconds"]) == 3, "central baseline has 3 rounds"
        verify(tmp, cluster, "tp=1,pp=4,dp=2")

        # Redeployment onto two other daemons with 4 GPUs each.
        extra = [Daemon(run.binary) for _ in range(2)]
        daemons += extra
        other = os.path.join(tmp, "other.json")
        write_cluster(other, extra, 4)
        # First only pre-sized (as while the old config trains): nothing changes anywhere,
        # and the new hosts are asked for every byte of the new version (none is linked).
        before = [d.get("/v1/jobs/j")["current"] for d in daemons[:4]]
        p = run(
            "transform",
            "--cluster",
            cluster,
            "--job",
            "j",
            "--to",
            "tp=2,pp=2,dp=2",
            "--to-cluster",
            other,
            "--presize",
            "--json",
        )
        pre = json.loads(p.stdout)
        assert [h["url"] for h in pre["presized"]] == [d.url for d in extra], "presized hosts %r" % pre
        assert all(
            h["pooled_bytes"] == sum(d.get("/v1/health")["pool_bytes"] for d in extra if d.url == h["url"])
            for h in pre["presized"]
        ), "pooled bytes vs the daemons' pools: %r" % pre
        assert [d.get("/v1/jobs/j")["current"] for d in daemons[:4]] == before, "a pre-size changed a version"
        text = run(
            "transform",
            "--cluster",
            cluster,
            "--job",
            "j",
            "--to",
            "tp=2,pp=2,dp=2",
            "--to-cluster",
            other,
            "--presize",
        ).stdout
        assert "pre-sized version %d" % before[0] in text, "presize summary: %r" % text
        run(
            "transform",
            "--cluster",
            cluster,
            "--job",
            "j",
            "--to",
            "tp=2,pp=2,dp=2",
            "--presize",
            "--central",
            expect_ok=False,
        )
        p = run(
            "transform",
            "--cluster",
            cluster,
            "--job",
            "j",
            "--to",
            "tp=2,pp=2,dp=2",
            "--presize",
            "--recover",
            expect_ok=False,
        )
        assert "not with --central or --recover" in p.stderr, "--presize --recover: %r" % p.stderr
        s = transform(cluster, "tp=2,pp=2,dp=2", "--to-cluster", other)
        assert s["new_hosts"] == [d.url for d in extra], "new hosts %r" % s["new_hosts"]
        # What each new host was asked to pre-size is what it holds now (its only version).
        for h, d in zip(pre["presized"], extra):
            used = d.get("/v1/health")["used_bytes"]
            assert h["wanted_bytes"] == used, "%s: presize asked for %d B, it holds %d B" % (
                d.url,
                h["wanted_bytes"],
                used,
            )
        both = os.path.join(tmp, "both.json")
        write_cluster(both, daemons, 2)
        verify(tmp, both, "tp=2,pp=2,dp=2")
        # ... and back onto the first four.
        s = transform(other, "tp=2,pp=2,dp=2", "--to-cluster", cluster)
        verify(tmp, cluster, "tp=2,pp=2,dp=2")

        # A host killed before the transform: replicas on the others survive it.
        daemons[3].kill()
        s = transform(cluster, "tp=2,dp=3")
        assert s["lost_hosts"] == [daemons[3].url], "lost %r" % s["lost_hosts"]
        assert len(s["new_hosts"]) == 3, "new hosts %r" % s["new_hosts"]
        verify(tmp, cluster, "tp=2,dp=3")

        # A host that dies in the middle of its prepare (its second one), while it holds
        # old state that its peers may be fetching: the transform is retried without it,
        # from the replicas on the others.
        faulty = Daemon(run.binary, {"TENPLEX_FAULT": "exit-in-prepare:2"})
        daemons.append(faulty)
        c4 = os.path.join(tmp, "c4.json")
        write_cluster(c4, [daemons[0], daemons[1], daemons[2], faulty], 2)
        s = transform(cluster, "tp=2,pp=2,dp=2", "--to-cluster", c4)
        assert s["attempts"] == 1 and faulty.url in s["new_hosts"], "first move onto the faulty host: %r" % s
        f4 = os.path.join(tmp, "f4.json")
        write_cluster(f4, [faulty, daemons[0], daemons[1], daemons[2]], 2)
        s = transform(c4, "tp=1,pp=2,dp=3", "--to-cluster", f4, "--attempts", "3")
        assert faulty.proc.poll() is not None, "the faulty daemon did not exit"
        assert s["attempts"] == 2 and s["lost_hosts"] == [faulty.url], "no retry after the fault: %r" % s
        assert s["new_hosts"] == [d.url for d in daemons[:3]], "new hosts %r" % s["new_hosts"]
        verify(tmp, f4, "tp=1,pp=2,dp=3")

        # Total loss: zero=1 optimizer shards have no replica.
        transform(f4, "tp=2,pp=1,dp=3,zero=1")
        before = [d.get("/v1/jobs/j")["current"] for d in daemons[:3]]
        daemons[2].kill()
        p = run("transform", "--cluster", f4, "--job", "j", "--to", "tp=2,pp=1,dp=2", expect_ok=False)
        assert "no surviving replica" in p.stderr, "unclear total-loss error: %r" % p.stderr
        for d, b in zip(daemons[:2], before[:2]):
            j = d.get("/v1/jobs/j")
            assert j["current"] == b and all(v["version"] <= b for v in j["versions"]), (
                "survivor changed after a failed transform: %r" % j
            )

        # Bad input.
        run("transform", "--cluster", cluster, "--job", "j", "--to", "tp=zz", expect_ok=False)
        run("transform", "--cluster", os.path.join(tmp, "missing.json"), "--job", "j", "--to", "tp=1", expect_ok=False)
    finally:
        for d in daemons:
            d.stop()
