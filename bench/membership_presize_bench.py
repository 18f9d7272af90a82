#!/usr/bin/env python3
"""Pre-sizing the next world in membership mode (issue 37): a join's transform with and
without the pre-size that rank 0 starts as soon as the new world is announced
(tenplex.member.presize_world, the code MemberJob runs), against this machine's memcpy
and fresh-write rates measured in the same run.

Three store daemons play three hosts (2 workers each). A synthetic GPT state with Adam
(--model, default a GPT of about 1 GB with Adam: 8 layers, hidden 1024) is loaded as
tp=2,pp=2 on hosts 0 and 1; host 2 joins, and the policy gives tp=2,dp=3 for the 6
ranks. Each round loads the state afresh (`tenplex store load`), then transforms it the
way tenplex.elastic's restore does in membership mode (elastic_cluster.run_transform:
the committed version's cluster -> the world's hosts), alternating:
  plain      no pre-size (every new byte lands in fresh shared-memory pages);
  presized   presize_world() first, with the world record the agents write, finished
             before the transform (in a job it runs while the old world stops and commits
             and the new one forms, off the reconfiguration's path: its seconds are
             reported apart).
Limits, measured in the same run (bench/cluster_transform_bench.py's probe: every daemon
at once): all_memcpy_gbps (copy between warm pages), all_write_gbps (allocate + write
fresh shared memory). The machine limit of a transform is
  max(fetched / all_memcpy_gbps, (written + fetched) / all_write_gbps)
(docs/benchmarks.md, cluster transform: the same formula); "achieved GB/s" is the new
version's bytes over the transform's seconds.

Usage: membership_presize_bench.py [--tenplex build/bin/tenplex] [--model M.json] [--rounds 2]
       [--json OUT.json]
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.error

import cluster_transform_bench as ctb

from tenplex.testing import Daemon, write_cluster

HERE = os.path.dirname(os.path.abspath(__file__))

POLICY = {"4": "tp=2,pp=2", "6": "tp=2,dp=3"}


def make_model(tmp):
    path = os.path.join(tmp, "model.json")
    ctb.tenplex(
        "model",
        "gpt",
        "--num-layers",
        "8",
        "--hidden-size",
        "1024",
        "--num-attention-heads",
        "16",
        "--vocab-size",
        "8192",
        "--max-position-embeddings",
        "512",
        "-o",
        path,
    )
    return path


def one_round(daemons, old_file, ckpt, presize):
    """Loads the state on hosts 0-1, optionally pre-sizes the 3-host world, transforms; the stats."""
    from tenplex import elastic_cluster as ec
    from tenplex import elastic_policy as ep
    from tenplex import member

    ctb.tenplex("store", "load", "--cluster", old_file, "--job", "bench", "--dir", ckpt)
    old = {"hosts": [d.url for d in daemons[:2]], "gpus_per_host": 2}
    world = {
        "epoch": 2,
        "hosts": ["h0", "h1", "h2"],
        "info": {f"h{i}": {"store_url": d.url, "nproc": 2} for i, d in enumerate(daemons)},
    }
    pre = None
    if presize:
        pre = member.presize_world("bench", ep.read_policy(POLICY), world, old, "").finish(wait=600)
        if "error" in pre:
            sys.exit(f"presize failed: {pre['error']}")
    new = {"hosts": [d.url for d in daemons], "gpus_per_host": 2}
    t0 = time.perf_counter()
    s = ec.run_transform(
        ctb.ARGS.tenplex, ["transform", "--job", "bench", "--to", POLICY["6"], "--json", "--quiet"], old, new, "", {}
    )
    s["wall_s"] = time.perf_counter() - t0
    s["presize"] = pre
    for d in daemons:
        try:
            d.call("DELETE", "/v1/jobs/bench")
        except urllib.error.HTTPError:
            pass
    return s


def summary(runs, limits):
    """(seconds, new bytes, fetched, machine limit s) of the median run."""
    secs = statistics.median(r["seconds"] for r in runs)
    r = runs[0]
    fetched = sum(h["bytes_fetched"] for h in r["hosts"])
    written = sum(h["bytes_kept"] + h["bytes_local"] for h in r["hosts"])
    limit = max(fetched / limits["all_memcpy_gbps"], (written + fetched) / limits["all_write_gbps"]) / 1e9
    return secs, written + fetched, fetched, limit


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tenplex", default=os.path.join(HERE, "..", "build", "bin", "tenplex"))
    ap.add_argument("--model", help="a model JSON (tenplex model gpt ...); default ~1 GB with Adam")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of each kind (alternating)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    args.tenplex, args.presize = os.path.abspath(args.tenplex), False
    ctb.ARGS = args  # its tenplex() and checkpoint() read ARGS.tenplex, ARGS.model
    os.environ["TENPLEX_BIN"] = args.tenplex
    with tempfile.TemporaryDirectory(prefix="membership-presize-") as tmp:
        args.model = args.model or make_model(tmp)
        daemons = [Daemon(args.tenplex) for _ in range(3)]
        try:
            old_file = os.path.join(tmp, "old.json")
            write_cluster(old_file, daemons[:2], 2)
            ckpt = ctb.checkpoint(tmp, POLICY["4"])
            limits = ctb.probe(daemons)
            plain, presized = [], []
            for _ in range(args.rounds):
                plain.append(one_round(daemons, old_file, ckpt, presize=False))
                presized.append(one_round(daemons, old_file, ckpt, presize=True))
            again = ctb.probe(daemons)  # the best of two probes counts (one may have run on a busy machine)
            for k in ("all_memcpy_gbps", "all_write_gbps", "memcpy_gbps", "fresh_write_gbps"):
                limits[k] = max(limits[k], again[k])
        finally:
            for d in daemons:
                d.stop()
    rows = {}
    print(
        f"join: {POLICY['4']} on 2 hosts -> {POLICY['6']} on 3 hosts; memcpy {limits['all_memcpy_gbps']:.2f} GB/s, "
        f"fresh writes {limits['all_write_gbps']:.2f} GB/s (all daemons at once, this run)"
    )
    for name, runs in (("plain", plain), ("presized", presized)):
        secs, nbytes, fetched, limit = summary(runs, limits)
        rows[name] = {
            "seconds": [round(r["seconds"], 4) for r in runs],
            "median_s": round(secs, 4),
            "new_bytes": nbytes,
            "fetched_bytes": fetched,
            "machine_limit_s": round(limit, 4),
            "ratio_to_machine_limit": round(secs / limit, 3),
            "achieved_gbps": round(nbytes / secs / 1e9, 3),
            "achieved_over_memcpy": round(nbytes / secs / 1e9 / limits["all_memcpy_gbps"], 3),
            "presize": [r["presize"] for r in runs],
        }
        pre = [r["presize"]["seconds"] for r in runs if r["presize"]]
        print(
            f"  {name:9s} transform {secs:.3f} s (runs {rows[name]['seconds']}) for {nbytes / 1e9:.2f} GB new "
            f"({fetched / 1e9:.2f} GB fetched): {nbytes / secs / 1e9:.2f} GB/s = "
            f"{rows[name]['achieved_over_memcpy']:.2f} x memcpy; machine limit {limit:.3f} s, ratio "
            f"{secs / limit:.2f}" + (f"; pre-size ahead {statistics.median(pre):.2f} s" if pre else "")
        )
    out = {
        "limits": {k: round(v, 3) for k, v in limits.items() if isinstance(v, (int, float))},
        "rows": rows,
        "model": os.path.basename(args.model),
        "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
