"""Integration test of `tenplex store load|save --cluster` with 4 store daemons as 4 hosts.

Under pytest (issue 32 §4), ctest cluster_store, TENPLEX_BIN the CLI under test:

    python -m pytest tests/cluster_store_test.py::test_cluster_store

- a synthetic checkpoint (`tenplex ckpt init`, every element a function of its global
  index) is loaded onto 4 daemons with 2 GPUs per host; each daemon must hold exactly
  the ranks r with r // 2 == its index (asked over its own HTTP API), all under one
  common committed version number;
- saved back from the 4 daemons, the rank files are byte-identical to the input and
  `tenplex ckpt verify` (the synthetic oracle) accepts every element;
- a second load gets the next common version on all hosts;
- a layout smaller than the cluster lives on the hosts that get ranks, and load and
  save report those hosts;
- bad cluster files and a dead host fail with a clear error and leave no new version
  on the surviving hosts (they still serve the old one);
- with a dead host, save rebuilds its ranks from dp replicas on the others (byte-
  identical output) or, with ZeRO-1 (no replica of the optimizer shards), fails.
"""

from __future__ import annotations

import json
import logging
import os
import re
import urllib.error

import pytest
from cli_testing import Cli

from tenplex.testing import Daemon

_log = logging.getLogger(__name__)
run = Cli()  # the CLI under test, bound to the tenplex fixture's by _cli_under_test


@pytest.fixture(autouse=True)
def _cli_under_test(tenplex: str) -> None:
    run.binary = tenplex


def holds(d: Daemon, job: str) -> bool:
    try:
        return bool(d.get("/v1/list/jobs/%s/" % job))
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return False
        raise


def same_ranks(a: str, b: str) -> None:
    names = sorted(n for n in os.listdir(a) if n.endswith(".safetensors"))
    assert names == sorted(n for n in os.listdir(b) if n.endswith(".safetensors")), "rank files differ"
    for name in names:
        with open(os.path.join(a, name), "rb") as x, open(os.path.join(b, name), "rb") as y:
            assert x.read() == y.read(), "%s differs after the round trip" % name


def test_cluster_store(tmp: str) -> None:
    daemons = [Daemon(run.binary) for _ in range(4)]
    try:
        cluster = os.path.join(tmp, "cluster.json")
        with open(cluster, "w") as f:
            json.dump({"hosts": [d.url for d in daemons], "gpus_per_host": 2}, f)
        ckpt = os.path.join(tmp, "in")
        model = os.path.join(tmp, "m.json")
        run(
            "model",
            "gpt",
            "--num-layers",
            "4",
            "--hidden-size",
            "16",
            "--num-attention-heads",
            "4",
            "--num-query-groups",
            "2",
            "--ffn-hidden-size",
            "24",
            "--vocab-size",
            "101",
            "--make-vocab-size-divisible-by",
            "8",
            "--max-position-embeddings",
            "8",
            "--swiglu",
            "--params-dtype",
            "bf16",
            "-o",
            model,
        )
        run("ckpt", "init", "--model", model, "--config", "tp=2,pp=2,dp=2,zero=1", "--out", ckpt, "--seed", "7")
        p = run("store", "load", "--cluster", cluster, "--job", "j", "--dir", ckpt)
        _log.info("%s", p.stdout.strip())
        for h, d in enumerate(daemons):
            v = d.get("/v1/jobs/j/versions/current")
            assert v["version"] == 1 and v["state"] == "committed", "host %d: %r" % (h, v)
            ranks: set[int] = set()
            for path in d.get("/v1/list/jobs/j/current/"):
                m = re.search(r"/rank-(\d+)/", path)
                assert m, "odd path %s" % path
                ranks.add(int(m.group(1)))
            assert ranks == {2 * h, 2 * h + 1}, "host %d holds ranks %s" % (h, sorted(ranks))
        out = os.path.join(tmp, "out")
        _log.info("%s", run("store", "save", "--cluster", cluster, "--job", "j", "--out", out).stdout.strip())
        run("ckpt", "verify", "--in", out)
        for name in sorted(os.listdir(ckpt)):
            if name.endswith(".safetensors"):
                with open(os.path.join(ckpt, name), "rb") as a, open(os.path.join(out, name), "rb") as b:
                    assert a.read() == b.read(), "%s differs after the round trip" % name
        run("store", "load", "--cluster", cluster, "--job", "j", "--dir", ckpt)
        for d in daemons:
            assert d.get("/v1/jobs/j/versions/current")["version"] == 2, "second load is not version 2"

        # A layout smaller than the cluster: only the hosts that get ranks hold the
        # version, and the report names them (issue 16 bug 5).
        small = os.path.join(tmp, "small")
        run("ckpt", "init", "--model", model, "--config", "tp=2,pp=2,dp=1", "--out", small, "--seed", "3")
        p = run("store", "load", "--cluster", cluster, "--job", "s", "--dir", small)
        assert "onto 2 hosts" in p.stdout, "load report: " + p.stdout
        for h, d in enumerate(daemons):
            has = holds(d, "s")
            assert has == (h < 2), "host %d %s job s" % (h, "holds" if has else "lacks")
        out_s = os.path.join(tmp, "out-s")
        p = run("store", "save", "--cluster", cluster, "--job", "s", "--out", out_s)
        assert "from 2 hosts" in p.stdout, "save report: " + p.stdout
        same_ranks(small, out_s)

        # dp replicas on other hosts (tp=2,pp=2,dp=2 without ZeRO: host 3's ranks 6, 7
        # are replicas of ranks 4, 5 on host 2), loaded before a host dies.
        rep = os.path.join(tmp, "rep")
        run("ckpt", "init", "--model", model, "--config", "tp=2,pp=2,dp=2", "--out", rep, "--seed", "5")
        run("store", "load", "--cluster", cluster, "--job", "r", "--dir", rep)

        # Bad cluster files.
        for bad in [
            '{"hosts": [], "gpus_per_host": 2}',
            '{"hosts": ["x"], "gpus_per_host": 2}',
            "not json",
            json.dumps({"hosts": [daemons[0].url], "gpus_per_host": 2}),
        ]:  # too few slots
            with open(cluster + ".bad", "w") as f:
                f.write(bad)
            run("store", "load", "--cluster", cluster + ".bad", "--job", "k", "--dir", ckpt, expect_ok=False)
        run(
            "store", "load", "--cluster", cluster, "--url", daemons[0].url, "--job", "k", "--dir", ckpt, expect_ok=False
        )

        # A dead host: the load fails and no survivor gets a new version.
        daemons[3].stop()
        run("store", "load", "--cluster", cluster, "--job", "j", "--dir", ckpt, expect_ok=False)
        run("store", "save", "--cluster", cluster, "--job", "j", "--out", os.path.join(tmp, "o2"), expect_ok=False)
        assert not os.path.exists(os.path.join(tmp, "o2")) or not os.listdir(os.path.join(tmp, "o2")), (
            "a failed save left files"
        )
        # With a dead host, save reads the lost ranks from surviving replicas (issue 19),
        # and reports the 3 hosts it used and the lost one (issue 16 bug 5).
        out_r = os.path.join(tmp, "out-r")
        p = run("store", "save", "--cluster", cluster, "--job", "r", "--out", out_r)
        _log.info("%s", p.stdout.strip())
        assert "from 3 hosts" in p.stdout and daemons[3].url in p.stdout and "2 ranks rebuilt" in p.stdout, (
            "save report: " + p.stdout
        )
        run("ckpt", "verify", "--in", out_r)
        same_ranks(rep, out_r)
        for d in daemons[:3]:
            v = d.get("/v1/jobs/j/versions/current")
            assert v["version"] == 2 and v["state"] == "committed", "survivor changed: %r" % v
            assert all(x["version"] <= 2 for x in d.get("/v1/jobs/j")["versions"]), "survivor kept a new version"
    finally:
        for d in daemons:
            d.stop()
