#!/usr/bin/env python3
"""Validation of `tenplex simulate` against real transforms on loopback or shaped links (issue 36, item 2).

    .venv/bin/python scripts/sim_validate.py [--tenplex build/bin/tenplex] [--runs 3]
        [--hosts 2,4,8] [--netns 1,4] [--markdown FILE] [--json FILE]

For 2, 4 and 8 store daemons on this machine (2 GPUs each, `--no-local-peer-reads`, so
every cross-host byte goes over UCX-over-TCP as between separate hosts), each row loads a
synthetic GPT state and runs a real `tenplex transform --cluster --json` (a TP change, a
DP scale-down by one host, a PP change) `--runs` times from a fresh load; the median run
(by total seconds) is the measurement. The cluster parameters are measured on the same
daemons just before, then written into a scenario for `tenplex simulate`, whose
prediction is compared with the measurement, total and phase by phase (the max over
hosts of each phase, both sides):

  nic_gbit_s      the daemons' UCX fetch probe (POST /v1/transform/probe), every daemon
                  fetching from the next at once, summed and divided by the daemons
                  (they share this machine's cores, as a transform's hosts do here)
  copy_gbyte_s    the same probe's memcpy rate, all at once, divided by the daemons
  memory_gbyte_s  first touch: posix_fallocate + mmap MAP_POPULATE of 256 MiB of fresh
                  shared memory (as the store allocates), one process per daemon
                  directory, all at once: the slowest one's rate
  hash_gbyte_s    xxh64 (libxxhash, as the seal's checksums) of those pages, the same way
  map_gbyte_s     mapping the same (now resident) pages again with MAP_POPULATE
  rpc_us          median round trip of GET /v1/health on a kept-alive connection
  latency_us      5 (loopback; inside the request's round trip)

Each row's old state is 0.5-1.4 GiB (a GPT with hidden size 1024; ZeRO-1 for the DP rows).

--netns RATES (Gbit/s, e.g. 1,4; as root): each daemon runs in a network namespace of its
own on a bridge (tests/daemons.py NetnsBridge), and every row runs once per rate, with the
egress of both ends of every daemon's veth shaped to it by `tc qdisc ... tbf` (this kernel
has no netem, so the links get a rate but no added delay). The scenario then says
nic_gbit_s = the rate and latency_us = half the measured ping round trip between two
namespaces; C, M, H, W and R are measured as above, on the unshaped links. The bytes that
crossed the daemons' veths during each transform (their counters) are reported next to
the plan's cross-host bytes.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import http.client
import json
import logging
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from tenplex.testing import Daemon, NetnsBridge, all_at_once, probe_daemons, run_tenplex, write_cluster

HERE = os.path.dirname(os.path.abspath(__file__))

log = logging.getLogger("sim_validate")
PHASES = ["plan", "warm", "alloc", "fetch", "local", "seal"]
GPUS_PER_HOST = 2
QUEUE = os.environ.get("SIMVAL_QUEUE", "5ms")  # tbf: the longest a packet waits in a shaped veth


@dataclass
class Row:
    hosts: int
    layers: int  # GPT layers (hidden 1024, vocab 8192, fp32 + Adam: ~150 MB each)
    change: str
    frm: str
    to: str


ROWS = [
    Row(2, 4, "TP change", "tp=2,pp=2", "tp=4"),
    Row(2, 2, "DP -1 host", "tp=2,dp=2,zero=1", "tp=2,zero=1"),
    Row(2, 4, "PP change", "tp=2,pp=2", "tp=2,dp=2"),
    Row(4, 4, "TP change", "tp=2,pp=4", "tp=4,pp=2"),
    Row(4, 2, "DP -1 host", "tp=2,dp=4,zero=1", "tp=2,dp=3,zero=1"),
    Row(4, 4, "PP change", "tp=2,pp=4", "tp=2,pp=2,dp=2"),
    Row(8, 8, "TP change", "tp=2,pp=8", "tp=4,pp=4"),
    Row(8, 2, "DP -1 host", "tp=2,dp=8,zero=1", "tp=2,dp=7,zero=1"),
    Row(8, 8, "PP change", "tp=2,pp=8", "tp=2,pp=4,dp=2"),
]


@dataclass
class Result:
    row: Row
    cluster: dict[str, float]
    measured: dict[str, float] = field(default_factory=dict)
    predicted: dict[str, float] = field(default_factory=dict)
    cross_measured: int = 0
    cross_predicted: int = 0
    runs: list[float] = field(default_factory=list)
    fetch_gbps: float = 0.0  # the slowest fetch's host: its bytes fetched / its fetch seconds
    remote_ops: int = 0  # the most remote ops of a host (the simulator's count)
    link_gbit_s: float = 0.0  # the shaped rate (--netns), 0 on loopback
    veth_bytes: int = 0  # bytes into the daemons' namespaces during the median transform (--netns)
    probe_gbit_s: float = 0.0  # the UCX probe on the shaped links, per daemon, all at once (--netns)
    predicted_at_probe: float = 0.0  # the total predicted with nic_gbit_s = probe_gbit_s (--netns)


# Round trip of a TCP connect, run inside a namespace (the image has no ping).
CONNECT_RTT = """
import socket, statistics, sys, time
t = []
for _ in range(50):
    t0 = time.perf_counter()
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()
    t.append(time.perf_counter() - t0)
print(statistics.median(t) * 1e6)
"""


class ShapedNet:
    """Daemons each in a network namespace of its own on a bridge (NetnsBridge), with
    `--no-local-peer-reads`, and the egress of both ends of each veth shaped by tbf."""

    def __init__(self, tenplex: str, n: int) -> None:
        # Off loopback the daemons require a token; Daemon.call and the CLI send this one.
        os.environ.setdefault("TENPLEX_TOKEN", "sim-validate-token")
        self.net = NetnsBridge(n)
        self.daemons: list[Daemon] = []
        try:
            for i in range(n):
                self.daemons.append(
                    Daemon(
                        tenplex,
                        listen=self.net.addr(i) + ":7480",
                        prefix=self.net.prefix(i),
                        args=["--no-local-peer-reads"],
                    )
                )
        except BaseException:
            self.close()
            raise

    def bridge_side(self, i: int) -> str:
        return "tpv%s%d" % (self.net.tag, i)  # NetnsBridge's name of veth i's end on the bridge

    def shape(self, gbit_s: float) -> None:
        burst = max(256 << 10, int(gbit_s * 1e9 / 8 * 1e-3))  # 1 ms at the rate, and several GSO packets
        for i in range(len(self.daemons)):
            for prefix, dev in (((), self.bridge_side(i)), (self.net.prefix(i), self.net.ifname(i))):
                subprocess.run(
                    [
                        *prefix,
                        "tc",
                        "qdisc",
                        "replace",
                        "dev",
                        dev,
                        "root",
                        "tbf",
                        "rate",
                        "%dmbit" % round(gbit_s * 1000),
                        "burst",
                        str(burst),
                        "latency",
                        QUEUE,
                    ],
                    check=True,
                    capture_output=True,
                )

    def crossed(self) -> int:
        """Bytes delivered into the daemons' namespaces so far (bridge side's tx of each veth)."""
        total = 0
        for i in range(len(self.daemons)):
            with open("/sys/class/net/%s/statistics/tx_bytes" % self.bridge_side(i)) as f:
                total += int(f.read())
        return total

    def latency_us(self) -> float:
        """Half the median round trip of a TCP connect from namespace 0 to daemon 1."""
        out = subprocess.run(
            [*self.net.prefix(0), sys.executable, "-c", CONNECT_RTT, self.net.addr(1), "7480"],
            check=True,
            capture_output=True,
            text=True,
        )
        return float(out.stdout) / 2

    def close(self) -> None:
        for d in self.daemons:
            d.stop()
        self.net.close()


def _xxh64() -> Any:
    """XXH64 of libxxhash (what the store's seal computes), through ctypes."""
    lib = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
    lib.XXH64.restype = ctypes.c_uint64
    lib.XXH64.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64]
    return lib.XXH64


def _touch(shm_dir: str, nbytes: int, barrier: Any, out: Any) -> None:
    """First touch of fresh shared memory, its xxh64, then a second mapping of the
    resident pages: seconds of each."""
    xxh64 = _xxh64()
    path = os.path.join(shm_dir, "tmp", "simval-%d" % os.getpid())
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        barrier.wait()
        t0 = time.perf_counter()
        os.posix_fallocate(fd, 0, nbytes)
        m = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        t1 = time.perf_counter()
        buf = ctypes.c_char.from_buffer(m)
        xxh64(ctypes.addressof(buf), nbytes, 0)
        t2 = time.perf_counter()
        del buf
        m.close()
        t3 = time.perf_counter()
        m = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        t4 = time.perf_counter()
        m.close()
        out.put((t1 - t0, t2 - t1, t4 - t3))
    finally:
        os.close(fd)
        os.unlink(path)


def touch_rates(shm_dirs: list[str], nbytes: int = 256 << 20) -> tuple[float, float, float]:
    """Per-daemon GB/s of first touch, of xxh64 and of mapping resident pages, all daemons
    at once (the slowest one's)."""
    secs = all_at_once(_touch, shm_dirs, nbytes)
    return tuple(nbytes / max(s[i] for s in secs) / 1e9 for i in range(3))  # type: ignore[return-value]


def rpc_us(url: str, n: int = 200) -> float:
    """Median round trip of GET /v1/health on one kept-alive connection, in µs."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=20)
    times = []
    token = os.environ.get("TENPLEX_TOKEN")
    headers = {"Authorization": "Bearer " + token} if token else {}
    for _ in range(n):
        t0 = time.perf_counter()
        conn.request("GET", "/v1/health", headers=headers)
        conn.getresponse().read()
        times.append(time.perf_counter() - t0)
    conn.close()
    return statistics.median(times) * 1e6


def measure_cluster(daemons: list[Daemon], repeats: int = 3) -> dict[str, float]:
    """The median of `repeats` probes of each parameter (they vary ~2x on a loaded machine)."""
    probes = [probe_cluster(daemons) for _ in range(repeats)]
    return {k: statistics.median(p[k] for p in probes) for k in probes[0]}


def probe_cluster(daemons: list[Daemon]) -> dict[str, float]:
    n = len(daemons)
    p = probe_daemons(daemons)
    first, hashed, mapped = touch_rates([d.get("/v1/health")["shm_dir"] for d in daemons])
    return {
        "nic_gbit_s": 8 * p["all_fetch_gbps"] / n,
        "copy_gbyte_s": p["all_memcpy_gbps"] / n,
        "memory_gbyte_s": first,
        "hash_gbyte_s": hashed,
        "map_gbyte_s": mapped,
        "rpc_us": rpc_us(daemons[0].url),
        "latency_us": 5.0,
    }


def transform_once(
    args: argparse.Namespace,
    cluster_file: str,
    daemons: list[Daemon],
    ckpt: str,
    job: str,
    to: str,
    net: ShapedNet | None,
) -> dict[str, Any]:
    """One transform from a fresh load, every cross-host byte over UCX; with `net`, the
    bytes that crossed the daemons' veths during the transform alone."""
    run_tenplex(args.tenplex, "store", "load", "--cluster", cluster_file, "--job", job, "--dir", ckpt)
    pool_before = sum(d.get("/v1/health")["pool_bytes"] for d in daemons)
    before = net.crossed() if net else 0
    s = json.loads(
        run_tenplex(
            args.tenplex,
            "transform",
            "--cluster",
            cluster_file,
            "--job",
            job,
            "--to",
            to,
            "--json",
            "--quiet",
            "--no-local-peer-reads",
        )
    )
    s["veth_bytes"] = net.crossed() - before if net else 0
    s["pool_bytes_before"] = pool_before
    for d in daemons:
        try:
            d.call("DELETE", "/v1/jobs/" + job)
        except urllib.error.HTTPError:
            pass  # a host that holds nothing of the job
    return s


def phases_of(hosts: list[dict[str, Any]], key: str) -> dict[str, float]:
    """Max over hosts of each phase: measured reports (`fetch_seconds`) or predicted."""
    if key == "measured":
        return {ph: max(h.get(ph + "_seconds", 0.0) for h in hosts) for ph in PHASES}
    return {ph: max(h["seconds"][ph] for h in hosts) for ph in PHASES}


def run_row(
    args: argparse.Namespace,
    row: Row,
    tmp: str,
    model: str,
    cluster_file: str,
    daemons: list[Daemon],
    cparams: dict[str, float],
    net: ShapedNet | None = None,
    probe_gbit_s: float = 0.0,
) -> Result:
    ckpt = checkpoint(args, tmp, model, row)
    res = Result(row, cparams, link_gbit_s=cparams["nic_gbit_s"] if net else 0.0)
    reports = []
    for i in range(args.runs):
        s = transform_once(args, cluster_file, daemons, ckpt, "v%d" % i, row.to, net)
        reports.append(s)
        log.info(
            "  %s -> %s run %d: %.3f s (pages pooled before it: %.0f MB; veths %.0f MB; load avg %.2f)",
            row.frm,
            row.to,
            i,
            s["seconds"],
            s["pool_bytes_before"] / 1e6,
            s["veth_bytes"] / 1e6,
            os.getloadavg()[0],
        )
    reports.sort(key=lambda s: s["seconds"])
    med = reports[len(reports) // 2]
    res.runs = [s["seconds"] for s in reports]
    res.measured = {"total": med["seconds"], "prepare": med["prepare_seconds"], **phases_of(med["hosts"], "measured")}
    res.cross_measured = med["plan"]["bytes_cross_host"]
    res.veth_bytes = med["veth_bytes"]
    slow = max(med["hosts"], key=lambda h: h.get("fetch_seconds", 0.0))
    if slow.get("fetch_seconds", 0.0) > 0:
        res.fetch_gbps = slow["bytes_fetched"] / slow["fetch_seconds"] / 1e9
    sim = simulate(args, tmp, row, model, cparams)
    pred = sim["prediction"]
    res.predicted = {
        "total": pred["total_seconds"],
        "prepare": pred["prepare_round_seconds"],
        **phases_of(sim["hosts"], "predicted"),
    }
    res.cross_predicted = sim["plan"]["bytes_cross_host"]
    res.remote_ops = max(h["remote_ops"] for h in sim["hosts"])
    if probe_gbit_s:  # the same scenario at the rate UCX reached on these links
        res.probe_gbit_s = probe_gbit_s
        res.predicted_at_probe = simulate(args, tmp, row, model, dict(cparams, nic_gbit_s=probe_gbit_s))["prediction"][
            "total_seconds"
        ]
    return res


def simulate(args: argparse.Namespace, tmp: str, row: Row, model: str, cparams: dict[str, float]) -> dict[str, Any]:
    scen = {
        "model": model,
        "from": {"config": row.frm, "gpus_per_host": GPUS_PER_HOST},
        "to": {"config": row.to, "gpus_per_host": GPUS_PER_HOST, "hosts": row.hosts},
        "cluster": cparams,
        "sim": {"mode": "full"},
    }
    sfile = os.path.join(tmp, "scenario-%d-%s-%g.json" % (row.hosts, row.to, cparams["nic_gbit_s"]))
    with open(sfile, "w") as f:
        json.dump(scen, f)
    out = subprocess.run([args.tenplex, "simulate", sfile, "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def checkpoint(args: argparse.Namespace, tmp: str, model: str, row: Row) -> str:
    path = os.path.join(tmp, "ckpt-L%d-%s" % (row.layers, row.frm.replace(",", "_").replace("=", "")))
    if not os.path.exists(path):
        subprocess.run(
            [args.tenplex, "ckpt", "init", "--model", model, "--config", row.frm, "--out", path],
            check=True,
            capture_output=True,
        )
        os.sync()
    return path


def make_model(args: argparse.Namespace, tmp: str, layers: int) -> str:
    path = os.path.join(tmp, "gpt-L%d.json" % layers)
    if not os.path.exists(path):
        subprocess.run(
            [
                args.tenplex,
                "model",
                "gpt",
                "--num-layers",
                str(layers),
                "--hidden-size",
                "1024",
                "--num-attention-heads",
                "16",
                "--vocab-size",
                "8192",
                "--max-position-embeddings",
                "256",
                "-o",
                path,
            ],
            check=True,
            capture_output=True,
        )
    return path


def err(m: float, p: float) -> float:
    return 100.0 * (p - m) / m if m > 0 else 0.0


def table(results: list[Result]) -> str:
    shaped = any(r.link_gbit_s for r in results)
    head = (
        "| hosts | "
        + ("link Gbit/s (probe) | " if shaped else "")
        + "change | cross-host MB (real = sim) | "
        + ("veth MB | " if shaped else "")
        + "measured total s (runs) | predicted s | error % | "
        + ("at the probe's rate s (error %) | " if shaped else "")
        + " | ".join("%s s meas / pred" % ph for ph in PHASES)
        + " | real fetch GB/s (remote ops) |"
    )
    lines = [head, "|" + "---|" * (7 + len(PHASES) + 3 * shaped)]
    for r in results:
        same = "yes" if r.cross_measured == r.cross_predicted else "NO: sim %d" % r.cross_predicted
        link = "%g (%.2f) | " % (r.link_gbit_s, r.probe_gbit_s) if shaped else ""
        veth = "%.0f | " % (r.veth_bytes / 1e6) if shaped else ""
        at_probe = (
            "%.2f (%+.0f) | " % (r.predicted_at_probe, err(r.measured["total"], r.predicted_at_probe)) if shaped else ""
        )
        lines.append(
            "| %d | %s%s: %s -> %s | %.0f (%s) | %s%.2f (%s) | %.2f | %+.0f | %s%s | %.2f (%d) |"
            % (
                r.row.hosts,
                link,
                r.row.change,
                r.row.frm,
                r.row.to,
                r.cross_measured / 1e6,
                same,
                veth,
                r.measured["total"],
                ", ".join("%.2f" % x for x in r.runs),
                r.predicted["total"],
                err(r.measured["total"], r.predicted["total"]),
                at_probe,
                " | ".join("%.2f / %.2f" % (r.measured[ph], r.predicted[ph]) for ph in PHASES),
                r.fetch_gbps,
                r.remote_ops,
            )
        )
    return "\n".join(lines)


def run_size(args: argparse.Namespace, tmp: str, n: int, daemons: list[Daemon], net: ShapedNet | None) -> list[Result]:
    """Every row of n hosts: once on loopback, or once per --netns rate."""
    rows = [r for r in ROWS if r.hosts == n]
    cluster_file = os.path.join(tmp, "cluster-%d.json" % n)
    write_cluster(cluster_file, daemons, GPUS_PER_HOST)
    cparams = measure_cluster(daemons)  # on the unshaped links
    log.info("%d hosts: %s", n, json.dumps({k: round(v, 3) for k, v in cparams.items()}))
    if net is None:
        return [
            run_row(args, row, tmp, make_model(args, tmp, row.layers), cluster_file, daemons, cparams) for row in rows
        ]
    cparams["latency_us"] = net.latency_us()
    results = []
    for rate in args.rates:
        net.shape(rate)
        probes = [probe_daemons(daemons) for _ in range(3)]
        p = {k: statistics.median(q[k] for q in probes) for k in ("all_fetch_gbps", "fetch_large_gbps")}
        log.info(
            "%d hosts shaped to %g Gbit/s: probe (median of 3) %.2f Gbit/s per daemon all at once, "
            "%.2f for one pair; latency %.0f us (load avg %.2f)",
            n,
            rate,
            8 * p["all_fetch_gbps"] / n,
            8 * p["fetch_large_gbps"],
            cparams["latency_us"],
            os.getloadavg()[0],
        )
        shaped = dict(cparams, nic_gbit_s=rate)
        for row in rows:
            results.append(
                run_row(
                    args,
                    row,
                    tmp,
                    make_model(args, tmp, row.layers),
                    cluster_file,
                    daemons,
                    shaped,
                    net,
                    8 * p["all_fetch_gbps"] / n,
                )
            )
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tenplex", default=os.path.join(HERE, "..", "build", "bin", "tenplex"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hosts", default="2,4,8")
    ap.add_argument("--netns", help="shaped rates in Gbit/s, e.g. 1,4: daemons in network namespaces (root)")
    ap.add_argument("--markdown")
    ap.add_argument("--json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sizes = [int(x) for x in args.hosts.split(",")]
    for n in sizes:
        if not any(r.hosts == n for r in ROWS):
            sys.exit("no rows for %d hosts (rows: 2, 4, 8)" % n)
    try:
        args.rates = [float(x) for x in args.netns.split(",")] if args.netns else []
    except ValueError:
        sys.exit("--netns: a comma-separated list of rates in Gbit/s, e.g. 1,2.5; got %r" % args.netns)
    if any(not 0 < r <= 100 for r in args.rates):
        sys.exit("--netns: rates must be in (0, 100] Gbit/s, got %s" % args.netns)
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="simval-") as tmp:
        # A copy of the binary: a rebuild in the shared tree must not swap it mid-run.
        args.tenplex = shutil.copy2(args.tenplex, os.path.join(tmp, "tenplex"))
        for n in sizes:
            if args.netns:
                net = ShapedNet(args.tenplex, n)
                try:
                    results += run_size(args, tmp, n, net.daemons, net)
                finally:
                    net.close()
                continue
            daemons = [Daemon(args.tenplex, args=["--no-local-peer-reads"]) for _ in range(n)]
            try:
                results += run_size(args, tmp, n, daemons, None)
            finally:
                for d in daemons:
                    d.stop()
    text = table(results)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                [
                    {
                        "hosts": r.row.hosts,
                        "change": r.row.change,
                        "from": r.row.frm,
                        "to": r.row.to,
                        "cluster": r.cluster,
                        "measured": r.measured,
                        "predicted": r.predicted,
                        "runs": r.runs,
                        "fetch_gbps": r.fetch_gbps,
                        "remote_ops": r.remote_ops,
                        "link_gbit_s": r.link_gbit_s,
                        "probe_gbit_s": r.probe_gbit_s,
                        "predicted_at_probe": r.predicted_at_probe,
                        "veth_bytes": r.veth_bytes,
                        "cross_host_bytes": r.cross_measured,
                    }
                    for r in results
                ],
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
