#!/usr/bin/env python3
"""Benchmark of the distributed state transformation (`tenplex transform --cluster`).

Store daemons on this machine play the hosts (2 GPUs each). A synthetic GPT state with
Adam (fp32; gpt3-350m: about 4.6 GiB) is loaded and transformed; each case is run four
times from the same loaded state, alternating: ours (every host moves its share in
parallel) and the central baseline (`--central`: one host gathers all state, re-slices
it, scatters it: what a single-process converter does), each with same-host reads (the
daemons read each other's shared-memory files, the default: docs/transport.md) and with
`--no-local-peer-reads` (every cross-host byte over UCX-over-TCP, as separate hosts
would move it). An untimed transform of ours comes first (--no-warmup: none): the first
transform after a checkpoint is written allocates its pages slower than the rest.

Limits, measured in the same run:
  fetch_gbps  UCX fetch bandwidth between two daemons (POST /v1/transform/probe: 512 MiB
              of distinct memory on both sides, as a transform moves)
  write_gbps  writing fresh shared memory in a daemon (allocate + memcpy), which is
              what every new byte of a new version costs
  limit (s)   max over hosts of  max(sent_h, received_h) / fetch_gbps
                                 + (kept_h + local_h) / write_gbps
              (hosts work in parallel, as separate machines would; linked tensors
              cost nothing): the issue's formula
  alloc limit max over hosts of  max(new_h / write_gbps, max(sent_h, received_h) / fetch_gbps)
              where new_h = every byte of the new version written on h (kept, local or
              fetched: all of them land in new memory)
  machine     the same for this machine with all daemons at once:
              max(cross / all_fetch_gbps, new / all_write_gbps)      (UCX rows)
              max(cross / all_memcpy_gbps, new / all_write_gbps)     (same-host reads:
              the link is a copy out of the peer's pages, memcpy-class; the copy into
              new memory is already in the write term)
              all_write_gbps: one process per daemon directory writing 256 MiB of new
              shared memory (fallocate, MAP_POPULATE, copy), all started together, best
              of 2 (since 2026-11-25; the sum of the daemons' separate probes, which do
              not overlap and overstated it ~1.6x, is all_write_sum_gbps)
Note that here all daemons share this machine's cores and memory bus, which separate
hosts would not: docs/transform.md discusses what that means for the ratio.

Figures:
  per-dimension (paper Fig. 14): 4 hosts; from tp=2,pp=2 on 4 GPUs to 8 GPUs with a
      DP, a TP and a PP change;
  cluster size (paper Fig. 15): 2, 4, 8 hosts; a TP change over all of their GPUs.

Usage: cluster_transform_bench.py [--tenplex build/bin/tenplex] [--model gpt3-350m]
       [--out docs/benchmarks] [--quick] [--figures dims,size]
"""

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error

from tenplex.testing import Daemon, probe_daemons, run_tenplex, write_cluster

ARGS = None


def log(*a):
    print(*a, flush=True)


def tenplex(*args):
    return run_tenplex(ARGS.tenplex, *args)


probe = probe_daemons  # this machine's limits (tenplex.testing; sim_validate.py measures them so too)


class Cluster:
    def __init__(self, hosts, tmp):
        extra = ["--page-pool-presize"] if ARGS.presize else []
        dirs = [[]] * hosts
        if HUGE_MOUNT:  # each daemon its own directory on the huge-page tmpfs
            dirs = [["--shm-dir", os.path.join(HUGE_MOUNT, "h%d-%d" % (hosts, i))] for i in range(hosts)]
        self.daemons = [Daemon(ARGS.tenplex, args=extra + dirs[i]) for i in range(hosts)]
        self.file = os.path.join(tmp, "cluster-%d.json" % hosts)
        write_cluster(self.file, self.daemons, 2)
        self.limits = probe(self.daemons)

    def stop(self):
        for d in self.daemons:
            d.stop()


HUGE_MOUNT = None


def mount_huge(tmp):
    """--huge-shm: a tmpfs of up to 80 % of this machine's memory with huge=within_size (tensors
    of 2 MiB and more in huge pages, smaller ones in small pages)."""
    global HUGE_MOUNT
    path = os.path.join(tmp, "huge-shm")
    os.makedirs(path)
    size = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 4 // 5
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "huge=within_size,size=%d,mode=0700" % size, "tmpfs", path],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        sys.exit("--huge-shm: mounting a tmpfs with huge=within_size failed (root needed): " + r.stderr.strip())
    HUGE_MOUNT = path
    log("  shared memory: tmpfs huge=within_size at %s (%.1f GiB)" % (path, size / 2**30))


def checkpoint(tmp, config):
    """A synthetic checkpoint on disk (kept for the whole run)."""
    path = os.path.join(tmp, "ckpt-" + config.replace(",", "_").replace("=", ""))
    if not os.path.exists(path):
        t0 = time.time()
        tenplex("ckpt", "init", "--model", ARGS.model, "--config", config, "--out", path)
        # Written back before the runs: otherwise the first run's new shared memory
        # waits for the kernel to write these dirty pages out to reclaim them.
        os.sync()
        log("  checkpoint %s written in %.1f s" % (config, time.time() - t0))
    return path


def wait_presized(cluster):
    """--presize: waits until every daemon's page pool stops growing (the store fills it
    after the load's commit, as it would while the job trains); returns the seconds."""
    t0, last, stable = time.time(), None, 0
    while time.time() - t0 < 120:
        now = [d.get("/v1/health")["pool_bytes"] for d in cluster.daemons]
        stable = stable + 1 if now == last and any(now) else 0
        if stable >= 3:
            break
        last = now
        time.sleep(0.25)
    return time.time() - t0


PHASES = ("plan_seconds", "alloc_seconds", "local_seconds", "fetch_seconds")


def slowest(stats, *phases):
    """The slowest host's seconds of each phase of a transform's --json stats, "a/b/..."."""
    return "/".join("%.2f" % max(h.get(k, 0) for h in stats["hosts"]) for k in phases)


def transform_once(cluster, ckpt, job, to, central, local=True, plan_presize=False):
    """One transform from a fresh load. plan_presize: first `tenplex transform --presize`
    (each host makes its new tensors of this transform ahead in its page pool, as it
    would while the old config trains), timed apart as presize_s."""
    tenplex("store", "load", "--cluster", cluster.file, "--job", job, "--dir", ckpt)
    presize_s = wait_presized(cluster) if ARGS.presize else 0.0
    if plan_presize:
        t0 = time.time()
        p = json.loads(
            tenplex("transform", "--cluster", cluster.file, "--job", job, "--to", to, "--presize", "--json", "--quiet")
        )
        presize_s = time.time() - t0
        short = [h for h in p["presized"] if h["pooled_bytes"] < h["poolable_bytes"]]
        if short:
            log(
                "       note: pools short of the plan (pool bound or memory): %s"
                % ", ".join(
                    "%s %.2f of %.2f GB" % (h["url"], h["pooled_bytes"] / 1e9, h["poolable_bytes"] / 1e9) for h in short
                )
            )
    pool_before = sum(d.get("/v1/health")["pool_bytes"] for d in cluster.daemons)
    args = ["transform", "--cluster", cluster.file, "--job", job, "--to", to, "--json", "--quiet"]
    if central:
        args.append("--central")
    if not local:
        args.append("--no-local-peer-reads")
    s = json.loads(tenplex(*args))
    s["presize_s"] = presize_s
    s["pool_bytes_before"] = pool_before
    for d in cluster.daemons:
        try:
            d.call("DELETE", "/v1/jobs/" + job)
        except urllib.error.HTTPError:
            pass  # a host that holds nothing of the job
    return s


def measure(figure, case, cluster, tmp, frm, to):
    ckpt = checkpoint(tmp, frm)
    # An untimed transform first: on this VM the first one after the checkpoint is written
    # allocates its new pages several times slower than the next ones (2026-12-06: 8-9 s
    # against 1-2 s in DP), whichever method runs first; its seconds go into the CSV.
    warmup = None if ARGS.no_warmup else transform_once(cluster, ckpt, "bench", to, central=False)
    # Alternating A/B: same-host reads, UCX, for ours and for the central baseline.
    ours = transform_once(cluster, ckpt, "bench", to, central=False)
    ours_ucx = transform_once(cluster, ckpt, "bench", to, central=False, local=False)
    central = transform_once(cluster, ckpt, "bench", to, central=True)
    central_ucx = transform_once(cluster, ckpt, "bench", to, central=True, local=False)
    planned = (
        transform_once(cluster, ckpt, "bench", to, central=False, plan_presize=True) if ARGS.presize_plan else None
    )
    shm = sum(h["bytes_fetched_shm"] for h in ours["hosts"])
    if shm != sum(h["bytes_fetched"] for h in ours["hosts"]) or any(h["bytes_fetched_shm"] for h in ours_ucx["hosts"]):
        sys.exit("same-host reads did not (or did with --no-local-peer-reads) carry the fetched bytes")
    # The limits again, right after the runs: the best of the two probes counts (a
    # limit must not be lowered by a probe that ran while the machine was busy).
    again = probe(cluster.daemons)
    for k in (
        "fetch_gbps",
        "fetch_large_gbps",
        "fresh_write_gbps",
        "all_fetch_gbps",
        "all_write_gbps",
        "all_write_sum_gbps",
        "all_memcpy_gbps",
    ):
        cluster.limits[k] = max(cluster.limits[k], again[k])
    fetch_gbps = cluster.limits["fetch_large_gbps"]
    write_gbps = cluster.limits["fresh_write_gbps"]
    # A host's link carries what it receives and what it sends: the busier side counts.
    plan = ours["plan"]
    sent = dict(zip(plan["hosts"], plan["host_send_bytes"]))
    recv = dict(zip(plan["hosts"], plan["host_recv_bytes"]))
    copied = {h["url"]: h["bytes_kept"] + h["bytes_local"] for h in ours["hosts"]}
    per_host = [
        max(sent.get(u, 0), recv.get(u, 0)) / fetch_gbps / 1e9 + copied.get(u, 0) / write_gbps / 1e9
        for u in plan["hosts"]
    ]
    limit = max(per_host)
    # Every byte of the new version that is not linked lands in new memory, fetched or
    # copied: at best the larger of that and the link time, per host.
    new_bytes = {h["url"]: h["bytes_kept"] + h["bytes_local"] + h["bytes_fetched"] for h in ours["hosts"]}
    alloc_limit = (
        max(
            max(new_bytes.get(u, 0) / write_gbps, max(sent.get(u, 0), recv.get(u, 0)) / fetch_gbps)
            for u in plan["hosts"]
        )
        / 1e9
    )
    fetched = sum(h["bytes_fetched"] for h in ours["hosts"])
    written = sum(h["bytes_kept"] + h["bytes_local"] for h in ours["hosts"])
    write_term = (written + fetched) / cluster.limits["all_write_gbps"] / 1e9
    machine_limit_ucx = max(fetched / cluster.limits["all_fetch_gbps"] / 1e9, write_term)
    machine_limit = max(fetched / cluster.limits["all_memcpy_gbps"] / 1e9, write_term)
    busiest = max(max(plan["host_send_bytes"]), max(plan["host_recv_bytes"]))
    local = sum(h["bytes_kept"] + h["bytes_local"] for h in ours["hosts"])
    row = {
        "figure": figure,
        "model": os.path.basename(ARGS.model),
        "case": case,
        "hosts": len(cluster.daemons),
        "from": frm,
        "to": to,
        "state_bytes": ours["plan"]["bytes_total"],
        "cross_bytes": ours["plan"]["bytes_cross_host"],
        "busiest_host_cross_bytes": busiest,
        "local_bytes": local,
        "ours_s": round(ours["seconds"], 3),
        "ours_prepare_s": round(ours["prepare_seconds"], 3),
        "central_s": round(central["seconds"], 3),
        "central_rounds_s": "/".join("%.2f" % x for x in central["round_seconds"]),
        "limit_s": round(limit, 3),
        "ratio_to_limit": round(ours["seconds"] / limit, 2),
        "alloc_limit_s": round(alloc_limit, 3),
        "ratio_to_alloc_limit": round(ours["seconds"] / alloc_limit, 2),
        "machine_limit_s": round(machine_limit, 3),
        "ratio_to_machine_limit": round(ours["seconds"] / machine_limit, 2),
        "speedup_vs_central": round(central["seconds"] / ours["seconds"], 2),
        "ours_ucx_s": round(ours_ucx["seconds"], 3),
        "central_ucx_s": round(central_ucx["seconds"], 3),
        "machine_limit_ucx_s": round(machine_limit_ucx, 3),
        "ratio_ucx_to_machine_limit": round(ours_ucx["seconds"] / machine_limit_ucx, 2),
        "speedup_vs_central_ucx": round(central_ucx["seconds"] / ours_ucx["seconds"], 2),
        "speedup_local_vs_ucx": round(ours_ucx["seconds"] / ours["seconds"], 2),
        "shm_bytes": shm,
        # Where ours spends its prepare, the slowest host's seconds per phase: plan,
        # allocate (link + new memory), local copies, fetches (then the commit round).
        "ours_phases_s": slowest(ours, *PHASES),
        "ours_commit_s": round(ours["seconds"] - ours["prepare_seconds"], 3),
        "pool_bytes_before": ours["pool_bytes_before"],
        "presize_s": round(ours["presize_s"], 2),
        "fetch_gbps": round(fetch_gbps, 2),
        "write_gbps": round(write_gbps, 2),
        "all_fetch_gbps": round(cluster.limits["all_fetch_gbps"], 2),
        "all_write_gbps": round(cluster.limits["all_write_gbps"], 2),
        "all_write_sum_gbps": round(cluster.limits["all_write_sum_gbps"], 2),
        "all_memcpy_gbps": round(cluster.limits["all_memcpy_gbps"], 2),
        # The untimed first transform (ours, same-host reads; empty with --no-warmup).
        "warmup_s": "" if warmup is None else round(warmup["seconds"], 3),
        "warmup_alloc_s": "" if warmup is None else slowest(warmup, "alloc_seconds"),
    }
    if planned is not None:
        # The same transform with every host's pool pre-sized from the plan first.
        row.update(
            {
                "ours_presized_s": round(planned["seconds"], 3),
                "plan_presize_s": round(planned["presize_s"], 2),
                "ratio_presized_to_machine_limit": round(planned["seconds"] / machine_limit, 2),
                "speedup_presized_vs_central": round(central["seconds"] / planned["seconds"], 2),
                "presized_pool_bytes": planned["pool_bytes_before"],
                "ours_presized_phases_s": slowest(planned, *PHASES),
            }
        )
    log(
        "  %-4s %-12s -> %-22s ours %6.2f s  central %6.2f s (%s)  central/ours %.2f\n"
        "       limits: link+memcpy %5.2f s (ours/limit %.2f), with new memory %5.2f s (%.2f), "
        "this machine all at once %5.2f s (%.2f)"
        % (
            case,
            frm,
            to,
            row["ours_s"],
            row["central_s"],
            row["central_rounds_s"],
            row["speedup_vs_central"],
            row["limit_s"],
            row["ratio_to_limit"],
            row["alloc_limit_s"],
            row["ratio_to_alloc_limit"],
            row["machine_limit_s"],
            row["ratio_to_machine_limit"],
        )
    )
    log(
        "       ours: slowest host's plan/alloc/copy/fetch %s s, commit round %.2f s%s"
        % (
            row["ours_phases_s"],
            row["ours_commit_s"],
            "" if warmup is None else "; untimed first %.2f s (alloc %s s)" % (row["warmup_s"], row["warmup_alloc_s"]),
        )
    )
    log(
        "       UCX: ours %6.2f s  central %6.2f s  central/ours %.2f  machine limit %5.2f s (%.2f); "
        "same-host reads %.2fx faster than UCX"
        % (
            row["ours_ucx_s"],
            row["central_ucx_s"],
            row["speedup_vs_central_ucx"],
            row["machine_limit_ucx_s"],
            row["ratio_ucx_to_machine_limit"],
            row["speedup_local_vs_ucx"],
        )
    )
    if planned is not None:
        log(
            "       pre-sized from the plan (%.2f s ahead, %.2f GB pooled): ours %6.2f s (ours/limit %.2f), "
            "plan/alloc/copy/fetch %s s, central/ours %.2f"
            % (
                row["plan_presize_s"],
                row["presized_pool_bytes"] / 1e9,
                row["ours_presized_s"],
                row["ratio_presized_to_machine_limit"],
                row["ours_presized_phases_s"],
                row["speedup_presized_vs_central"],
            )
        )
    return row


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tenplex", default="build/bin/tenplex")
    ap.add_argument("--model", default=None, help="preset or model JSON (default gpt3-350m, --quick: a small GPT)")
    ap.add_argument("--out", default="docs/benchmarks")
    ap.add_argument("--quick", action="store_true", help="a small model, for a smoke run")
    ap.add_argument("--figures", default="dims,size")
    ap.add_argument(
        "--presize",
        action="store_true",
        help="daemons with --page-pool-presize: after each load the store fills its page pool "
        "(waited for, as while a job trains), so a transform's new tensors take warm "
        "pages; writes cluster_transform_presized.csv",
    )
    ap.add_argument(
        "--presize-plan",
        action="store_true",
        help="also run ours once more after `tenplex transform --presize` (every host makes its "
        "new tensors of the transform ahead in its page pool, as it would while the old "
        "config trains; the joining hosts hold nothing otherwise): columns ours_presized_s, "
        "plan_presize_s; writes cluster_transform_planned.csv",
    )
    ap.add_argument(
        "--no-warmup",
        action="store_true",
        help="no untimed transform before each row's four timed ones (the first after a "
        "checkpoint pays for fresh pages more than the others; warmup_s in the CSV)",
    )
    ap.add_argument(
        "--huge-shm",
        action="store_true",
        help="the daemons' shared memory on a private tmpfs mounted with huge=within_size "
        "(needs root; docs/store.md): fresh memory in 2 MiB pages; writes "
        "cluster_transform_huge.csv",
    )
    ARGS = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="tenplex-bench-", dir="/tmp")
    if ARGS.huge_shm:
        mount_huge(tmp)
    if ARGS.model is None:
        if ARGS.quick:
            ARGS.model = os.path.join(tmp, "small.json")
            tenplex(
                "model",
                "gpt",
                "--num-layers",
                "4",
                "--hidden-size",
                "256",
                "--num-attention-heads",
                "16",
                "--vocab-size",
                "5000",
                "-o",
                ARGS.model,
            )
        else:
            ARGS.model = "gpt3-350m"
    os.makedirs(ARGS.out, exist_ok=True)
    rows = []
    figures = ARGS.figures.split(",")
    try:
        if "dims" in figures:
            log("reconfiguration per dimension (4 hosts x 2 GPUs, %s with Adam):" % ARGS.model)
            c = Cluster(4, tmp)
            log(
                "  limits: UCX fetch %.2f GB/s between two daemons (%.2f GB/s from a 64 MiB region), fresh "
                "shared-memory write %.2f GB/s, memcpy %.2f GB/s; all daemons at once: fetch %.2f GB/s, "
                "fresh write %.2f GB/s (probes summed %.2f), memcpy %.2f GB/s"
                % (
                    c.limits["fetch_large_gbps"],
                    c.limits["fetch_gbps"],
                    c.limits["fresh_write_gbps"],
                    c.limits["memcpy_gbps"],
                    c.limits["all_fetch_gbps"],
                    c.limits["all_write_gbps"],
                    c.limits["all_write_sum_gbps"],
                    c.limits["all_memcpy_gbps"],
                )
            )
            try:
                for case, to in [("DP", "tp=2,pp=2,dp=2,zero=1"), ("TP", "tp=4,pp=2"), ("PP", "tp=2,pp=4")]:
                    rows.append(measure("dims", case, c, tmp, "tp=2,pp=2", to))
            finally:
                c.stop()
        if "size" in figures:
            log("reconfiguration against cluster size (TP change over all GPUs):")
            for hosts in [2, 4] if ARGS.quick else [2, 4, 8]:
                c = Cluster(hosts, tmp)
                try:
                    gpus = 2 * hosts
                    rows.append(measure("size", "TP", c, tmp, "tp=%d,pp=2" % (gpus // 2), "tp=%d" % gpus))
                finally:
                    c.stop()
    finally:
        if HUGE_MOUNT:
            subprocess.run(["umount", HUGE_MOUNT], check=False)
        shutil.rmtree(tmp, ignore_errors=True)
        # The rows measured so far are written also when a later row fails (a
        # daemon killed for memory on a small machine, say).
        if rows:
            name = "cluster_transform%s%s%s.csv" % (
                "_huge" if ARGS.huge_shm else "",
                "_presized" if ARGS.presize else "",
                "_planned" if ARGS.presize_plan else "",
            )
            path = os.path.join(ARGS.out, name)
            with open(path, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
                w.writeheader()
                w.writerows(rows)
            log("wrote", path, "(%d rows)" % len(rows))


if __name__ == "__main__":
    main()
