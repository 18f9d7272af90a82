#!/usr/bin/python3
"""Integration test of `tenplex store load|save --cluster` with 4 store daemons as 4 hosts.

Usage: cluster_store_test.py TENPLEX_BIN

- a synthetic checkpoint (`tenplex ckpt init`, every element a function of its global
  index) is loaded onto 4 daemons with 2 GPUs per host; each daemon must hold exactly
  the ranks r with r // 2 == its index (asked over its own HTTP API), all under one
  common committed version number;
- saved back from the 4 daemons, the rank files are byte-identical to the input and
  `tenplex ckpt verify` (the synthetic oracle) accepts every element;
- a second load gets the next common version on all hosts;
- bad cluster files and a dead host fail with a clear error and leave no new version
  on the surviving hosts (they still serve the old one).
"""
import json
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemons import Daemon, check, run_cli  # noqa: E402

TENPLEX = sys.argv[1]


def run(*args, expect_ok=True):
    return run_cli(TENPLEX, *args, expect_ok=expect_ok)


def main():
    tmp = tempfile.mkdtemp(prefix="tenplex-cluster-test-")
    daemons = [Daemon(TENPLEX) for _ in range(4)]
    try:
        cluster = os.path.join(tmp, "cluster.json")
        with open(cluster, "w") as f:
            json.dump({"hosts": [d.url for d in daemons], "gpus_per_host": 2}, f)
        ckpt = os.path.join(tmp, "in")
        model = os.path.join(tmp, "m.json")
        run("model", "gpt", "--num-layers", "4", "--hidden-size", "16", "--num-attention-heads", "4",
            "--num-query-groups", "2", "--ffn-hidden-size", "24", "--vocab-size", "101",
            "--make-vocab-size-divisible-by", "8", "--max-position-embeddings", "8", "--swiglu",
            "--params-dtype", "bf16", "-o", model)
        run("ckpt", "init", "--model", model, "--config", "tp=2,pp=2,dp=2,zero=1", "--out", ckpt, "--seed", "7")
        p = run("store", "load", "--cluster", cluster, "--job", "j", "--dir", ckpt)
        print(p.stdout.strip())
        for h, d in enumerate(daemons):
            v = d.get("/v1/jobs/j/versions/current")
            check(v["version"] == 1 and v["state"] == "committed", "host %d: %r" % (h, v))
            ranks = set()
            for path in d.get("/v1/list/jobs/j/current/"):
                m = re.search(r"/rank-(\d+)/", path)
                check(m, "odd path %s" % path)
                ranks.add(int(m.group(1)))
            check(ranks == {2 * h, 2 * h + 1}, "host %d holds ranks %s" % (h, sorted(ranks)))
        out = os.path.join(tmp, "out")
        print(run("store", "save", "--cluster", cluster, "--job", "j", "--out", out).stdout.strip())
        run("ckpt", "verify", "--in", out)
        for name in sorted(os.listdir(ckpt)):
            if name.endswith(".safetensors"):
                with open(os.path.join(ckpt, name), "rb") as a, open(os.path.join(out, name), "rb") as b:
                    check(a.read() == b.read(), "%s differs after the round trip" % name)
        run("store", "load", "--cluster", cluster, "--job", "j", "--dir", ckpt)
        for d in daemons:
            check(d.get("/v1/jobs/j/versions/current")["version"] == 2, "second load is not version 2")

        # Bad cluster files.
        for bad in ['{"hosts": [], "gpus_per_host": 2}', '{"hosts": ["x"], "gpus_per_host": 2}', "not json",
                    json.dumps({"hosts": [daemons[0].url], "gpus_per_host": 2})]:  # too few slots
            with open(cluster + ".bad", "w") as f:
                f.write(bad)
            run("store", "load", "--cluster", cluster + ".bad", "--job", "k", "--dir", ckpt, expect_ok=False)
        run("store", "load", "--cluster", cluster, "--url", daemons[0].url, "--job", "k", "--dir", ckpt,
            expect_ok=False)

        # A dead host: the load fails and no survivor gets a new version.
        daemons[3].stop()
        run("store", "load", "--cluster", cluster, "--job", "j", "--dir", ckpt, expect_ok=False)
        run("store", "save", "--cluster", cluster, "--job", "j", "--out", os.path.join(tmp, "o2"), expect_ok=False)
        check(not os.path.exists(os.path.join(tmp, "o2")) or not os.listdir(os.path.join(tmp, "o2")),
              "a failed save left files")
        for d in daemons[:3]:
            v = d.get("/v1/jobs/j/versions/current")
            check(v["version"] == 2 and v["state"] == "committed", "survivor changed: %r" % v)
            check(all(x["version"] <= 2 for x in d.get("/v1/jobs/j")["versions"]), "survivor kept a new version")
        print("PASS")
    finally:
        for d in daemons:
            d.stop()
        shutil.rmtree(tmp, ignore_errors=True)


main()
