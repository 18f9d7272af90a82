#!/usr/bin/env python3
"""Restoring a job's state from the store onto a device (issue 30), against the pinned
host-to-device limit measured in the same run, torch.load and DCP.

Per size (GB = 1e9 bytes; default 1,4,16 on cuda, 0.25,1 on cpu) the state is a mix of
tensors of realistic sizes (per 200 MiB: 2 x 64 MiB, 4 x 16 MiB, 8 x 1 MiB, bf16 and
fp32 alternating) filled with random bits on the device. It is written into an embedded
store in /dev/shm (`save_state` + `commit`) and restored:

  limit            : cuda: a 1 GiB pinned host tensor copied to the device
                     (`copy_(non_blocking=True)`), median of 7; cpu: memcpy (torch
                     `copy_`) of min(size, 1 GiB) between two host buffers
  engine-staged    : `_tenplex.CopyEngine(mode="staged").restore` of the store's files
                     into preallocated device tensors (through a pinned ring)
  engine-registered: the same with mode "registered" (the files' pages registered)
  load_state       : `Store.load_state(job, rank, device=...)` (when the store has it)
  torch.load       : `torch.load(f, map_location=device)` of the same tensors saved with
                     `torch.save` to /dev/shm (tmpfs: the page cache is warm)
  dcp.load         : `torch.distributed.checkpoint.load` into preallocated device tensors
                     from a `dcp.save` directory in /dev/shm (one process, no group)

Each restore is checked once per size: every restored tensor equals the saved one bit for
bit (compared on the device). The peers run one at a time and their files are deleted
before the next, so /dev/shm holds one copy of the state at a time. Goals: ours >= 0.8 of
the limit and >= 5x both peers. Every row records the device's name, the memlock limit,
the GPU's NUMA node and torch's version.

Writes device_restore_<device>.csv into --out (default docs/benchmarks) and prints a table.
Usage: device_restore.py [--device cuda|cpu] [--sizes 1,4,16] [--reps 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import inspect
import logging
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, ".."))

import torch  # noqa: E402
from bench_csv import write_rows  # noqa: E402

log = logging.getLogger("device_restore")

GB = 1e9
MIB = 1 << 20
GOAL_LIMIT_RATIO = 0.8
GOAL_SPEEDUP = 5.0
JOB = "restore"
# One 200 MiB cycle of the state: (MiB, dtype).
CYCLE = (
    [(64, torch.bfloat16), (64, torch.float32)]
    + [(16, torch.bfloat16), (16, torch.float32)] * 2
    + [(1, torch.bfloat16), (1, torch.float32)] * 4
)
# Same-width integer views: bit-for-bit comparison (random bits hold NaNs).
_BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}
State = dict[str, torch.Tensor]


# ---- the machine -------------------------------------------------------------------------


def memlock_text() -> str:
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return "unlimited" if soft == resource.RLIM_INFINITY else f"{soft >> 10} KiB"


def gpu_bus_id(index: int) -> str:
    """The GPU's PCI address as sysfs writes it (0000:18:00.0), or ""."""
    p = torch.cuda.get_device_properties(index)
    if hasattr(p, "pci_bus_id"):
        return f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader", "-i", str(index)],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return out[-12:].lower() if out else ""  # 00000000:18:00.0 -> 0000:18:00.0


def machine_info(device: str) -> dict[str, str]:
    """What the figures depend on: device name, memlock limit, NUMA node, torch."""
    info = {"torch": torch.__version__, "memlock": memlock_text(), "numa_node": "", "device_name": ""}
    if device == "cuda":
        i = torch.cuda.current_device()
        info["device_name"] = torch.cuda.get_device_name(i)
        bus = gpu_bus_id(i)
        try:
            with open(f"/sys/bus/pci/devices/{bus}/numa_node") as f:
                info["numa_node"] = f.read().strip()
        except OSError:
            info["numa_node"] = "unknown"
    else:
        try:
            with open("/proc/cpuinfo") as f:
                info["device_name"] = next((x.split(":", 1)[1].strip() for x in f if x.startswith("model name")), "cpu")
        except OSError:
            info["device_name"] = "cpu"
        info["numa_node"] = "-"
    return info


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def pinned_copy_gbps(device: str, to_device: bool = True, nbytes: int = 1 << 30, reps: int = 7) -> float:
    """cuda: GB/s of a pinned host <-> device copy_(non_blocking=True) of nbytes, median
    of reps. cpu: memcpy (torch copy_) between two host buffers."""
    if device == "cuda":
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).fill_(1)
        dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        src, dst = (host, dev) if to_device else (dev, host)
    else:
        src = torch.ones(nbytes, dtype=torch.uint8)
        dst = torch.empty_like(src)
    dst.copy_(src, non_blocking=True)  # first touch, warm-up
    times = []
    for _ in range(reps):
        sync(device)
        t = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        sync(device)
        times.append(time.perf_counter() - t)
    return nbytes / statistics.median(times) / GB


# ---- the engine and the store ------------------------------------------------------------


def native() -> Any:
    """tenplex._tenplex, or None when it cannot be imported."""
    try:
        from tenplex import _tenplex

        return _tenplex
    except ImportError as e:
        log.error("tenplex._tenplex does not import: %s", e)
        return None


def open_engine(device: str, mode: str, args: argparse.Namespace, **override: int) -> Any:
    """A CopyEngine for device in mode (options: the command line's, then override);
    raises RuntimeError when there is none."""
    tx = native()
    if tx is None or not hasattr(tx, "CopyEngine"):
        raise RuntimeError("tenplex._tenplex has no CopyEngine")
    backend = "cuda" if device == "cuda" else "cpu"
    if backend == "cuda" and not tx.cuda_built():
        raise RuntimeError("tenplex._tenplex was built without CUDA (cuda_built() is False)")
    idx = torch.cuda.current_device() if device == "cuda" else 0
    return tx.CopyEngine(backend=backend, device=idx, mode=mode, **{**engine_options(args), **override})


def engine_options(args: argparse.Namespace) -> dict[str, int]:
    """The CopyEngine options given on the command line (the engine's defaults otherwise)."""
    opts = {
        "chunk_bytes": args.chunk_mb * MIB if args.chunk_mb else None,
        "slots": args.slots,
        "streams": args.streams,
        "threads": args.threads,
    }
    return {k: v for k, v in opts.items() if v}


class Source:
    """The state's files: a tenplex store (embedded, in /dev/shm) or, when the store's
    Python API does not import, plain files in /dev/shm (noted in every row)."""

    def __init__(self, shm_root: str) -> None:
        self.kind = "store"
        self.store: Any = None
        self.dir = tempfile.mkdtemp(prefix="tenplex-restore-", dir=shm_root)
        try:
            import tenplex

            self.store = tenplex.attach(shm_dir=os.path.join(self.dir, "store"))
        except (ImportError, AttributeError) as e:
            log.warning("the store's Python API is unavailable (%s): the state goes into plain files", e)
            self.kind = "files"
        self.files: dict[str, tuple[str, int]] = {}

    def write(self, state: State) -> None:
        """Writes state as one committed version; records {name: (file, bytes)}."""
        if self.store is not None:
            v = self.store.begin(JOB, info={"step": 0})
            self.store.save_state(JOB, v, 0, state)
            self.store.commit(JOB, v)
            for info in self.store._s.list(f"jobs/{JOB}/{v}/rank-00000/"):
                self.files[info["path"].rsplit("/", 1)[1]] = (info["file"], int(info["bytes"]))
            return
        fdir = os.path.join(self.dir, "files")
        os.makedirs(fdir, exist_ok=True)
        for name, t in state.items():
            path = os.path.join(fdir, name)
            with open(path, "wb") as f:
                f.truncate(t.numel() * t.element_size())
            dst = torch.from_file(path, shared=True, size=t.numel(), dtype=t.dtype)
            dst.copy_(t.reshape(-1))
            del dst
            self.files[name] = (path, t.numel() * t.element_size())

    def load_state_fn(self, device: str) -> Callable[[], State] | None:
        """Store.load_state(..., device=) when the store has it."""
        if self.store is None or "device" not in inspect.signature(self.store.load_state).parameters:
            return None
        return lambda: self.store.load_state(JOB, 0, device=device)

    def clear(self) -> None:
        if self.store is not None and JOB in self.store.jobs():
            self.store.delete(JOB)
        shutil.rmtree(os.path.join(self.dir, "files"), ignore_errors=True)
        self.files = {}

    def close(self) -> None:
        self.clear()
        self.store = None
        shutil.rmtree(self.dir, ignore_errors=True)


# ---- the state ---------------------------------------------------------------------------


def make_state(nbytes: int, device: str, seed: int) -> State:
    """Tensors of CYCLE's sizes (the last one cut) summing to nbytes, random bits."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    out: State = {}
    left, i = nbytes, 0
    while left >= 4:
        mib, dtype = CYCLE[i % len(CYCLE)]
        n = min(mib * MIB, left) // 4 * 4
        words = torch.empty(n // 4, dtype=torch.int32, device=device).random_(generator=g)
        out[f"block{i // len(CYCLE):04d}.t{i % len(CYCLE):02d}"] = words.view(dtype)
        left -= n
        i += 1
    return out


def empty_like_state(state: State) -> State:
    return {k: torch.empty_like(v) for k, v in state.items()}


def state_bytes(state: State) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def mismatches(want: State, got: State) -> list[str]:
    """Names whose bits differ (or are missing / of another dtype or shape) in got."""
    bad = []
    for k, a in want.items():
        b = got.get(k)
        if b is None or b.dtype != a.dtype or b.shape != a.shape:
            bad.append(k)
            continue
        if not torch.equal(a.view(_BITS[a.dtype]), b.to(a.device).view(_BITS[a.dtype])):
            bad.append(k)
    return bad


# ---- measuring ---------------------------------------------------------------------------


def timed(
    fn: Callable[[], Any], device: str, reps: int, budget_s: float, before: Callable[[], None] | None = None
) -> tuple[list[float], Any]:
    """Seconds of up to reps calls of fn (at least one; no new one once budget_s has
    passed), and the last call's result. before() runs untimed ahead of each call."""
    times: list[float] = []
    result: Any = None
    start = time.perf_counter()
    for _ in range(reps):
        result = None  # the previous result's memory is free before the next call
        if before is not None:
            before()
        sync(device)
        t = time.perf_counter()
        result = fn()
        sync(device)
        times.append(time.perf_counter() - t)
        if time.perf_counter() - start > budget_s:
            break
    return times, result


class SizeRun:
    """The rows of one size: every method restores the same state and is checked."""

    def __init__(self, size_gb: float, a: argparse.Namespace, failures: list[str]) -> None:
        self.size_gb, self.a, self.failures = size_gb, a, failures
        self.state = make_state(int(size_gb * GB), a.device, seed=int(size_gb * 1000) + 1)
        self.nbytes, self.n = state_bytes(self.state), len(self.state)
        self.dst = empty_like_state(self.state)  # preallocated destination (engine, DCP)
        self.rows: list[dict[str, Any]] = []

    def row(self, method: str, times: list[float], ok: bool | None, note: str = "", stats: dict | None = None) -> None:
        med = statistics.median(times) if times else float("nan")
        stats = stats or {}
        self.rows.append(
            {
                "size_gb": self.size_gb,
                "method": method,
                "bytes": self.nbytes,
                "tensors": self.n,
                "reps": len(times),
                "seconds": round(med, 4),
                "seconds_min": round(min(times), 4) if times else float("nan"),
                "gbps": round(self.nbytes / med / GB, 2) if times else float("nan"),
                "verified": "" if ok is None else ("yes" if ok else "NO"),
                "engine_mode": stats.get("mode", ""),
                "engine_chunks": stats.get("chunks", ""),
                "engine_fallback": stats.get("fallback", ""),
                "engine_gbps": round(float(stats["gbps"]), 2) if "gbps" in stats else "",
                "note": note,
            }
        )

    def fail(self, method: str, e: BaseException) -> None:
        why = f"{type(e).__name__}: {e}"
        log.error("%g GB %s: %s", self.size_gb, method, why)
        self.failures.append(f"{self.size_gb:g} GB {method}: {why}")
        self.row(method, [], False, note=why[:200])

    def verified(self, method: str, got: State) -> bool:
        bad = mismatches(self.state, got)
        if bad:
            self.failures.append(
                f"{self.size_gb:g} GB {method}: {len(bad)} of {self.n} tensors differ (first {bad[0]})"
            )
            log.error("%s", self.failures[-1])
        return not bad

    def zero_dst(self) -> None:
        for v in self.dst.values():
            v.zero_()

    def timed(self, fn: Callable[[], Any], reps: int, zero: bool = False) -> tuple[list[float], Any]:
        return timed(fn, self.a.device, reps, self.a.budget_s, before=self.zero_dst if zero else None)

    def ours(self) -> None:
        """The engine in both modes and Store.load_state(device=), from a fresh store
        (closed afterwards: its page pool goes with it)."""
        src = Source(self.a.shm_root)
        try:
            t = time.perf_counter()
            src.write(self.state)
            log.info(
                "state: %d tensors, %.2f GB written to the %s in %.1f s",
                self.n,
                self.nbytes / GB,
                src.kind,
                time.perf_counter() - t,
            )
            note = "" if src.kind == "store" else "plain files (store API unavailable)"
            items = [(src.files[k][0], 0, src.files[k][1], self.dst[k].data_ptr()) for k in self.state]
            runs = [(f"engine-{m}", m, {}) for m in ("staged", "registered")]
            runs += [(f"engine-staged[{k}]", "staged", opts) for k, opts in self.a.staged_variants]
            runs += [(f"engine-registered[{k}]", "registered", opts) for k, opts in self.a.registered_variants]
            for method, mode, opts in runs:
                try:
                    eng = open_engine(self.a.device, mode, self.a, **opts)
                    times, stats = self.timed(lambda: eng.restore(items), self.a.reps, zero=True)  # noqa: F821 - called before the del
                    self.row(method, times, self.verified(method, self.dst), note=note, stats=dict(stats))
                    del eng
                except Exception as e:  # noqa: BLE001 - one method failing must not hide the others
                    self.fail(method, e)
            load = src.load_state_fn(self.a.device)
            if load is None:
                self.row("load_state", [], None, note="Store.load_state has no device= here")
                return
            try:
                times, got = self.timed(load, self.a.reps)
                self.row("load_state", times, self.verified("load_state", got), note=note)
                del got
            except Exception as e:  # noqa: BLE001
                self.fail("load_state", e)
        finally:
            src.close()

    def peers(self) -> None:
        """torch.load and dcp.load, one at a time, each from its own files in /dev/shm."""
        dev, a = self.a.device, self.a
        reps = a.peer_reps or max(1, min(3, int(8 / max(self.size_gb, 1e-3))))
        for method in ("torch.load", "dcp.load"):
            pdir = tempfile.mkdtemp(prefix="tenplex-restore-peer-", dir=a.shm_root)
            try:
                t = time.perf_counter()
                if method == "torch.load":
                    path = os.path.join(pdir, "state.pt")
                    torch.save(self.state, path)
                    log.info("torch.save: %.1f s", time.perf_counter() - t)
                    times, got = self.timed(lambda: torch.load(path, map_location=dev, weights_only=True), reps)
                else:
                    import torch.distributed.checkpoint as dcp

                    with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
                        warnings.simplefilter("ignore")
                        dcp.save(self.state, checkpoint_id=pdir)
                        log.info("dcp.save: %.1f s", time.perf_counter() - t)
                        times, _ = self.timed(lambda: dcp.load(self.dst, checkpoint_id=pdir), reps, zero=True)
                    got = self.dst
                self.row(method, times, self.verified(method, got))
                del got
            except Exception as e:  # noqa: BLE001
                self.fail(method, e)
            finally:
                shutil.rmtree(pdir, ignore_errors=True)


def measure_size(size_gb: float, a: argparse.Namespace, failures: list[str]) -> list[dict[str, Any]]:
    log.info("== %g GB", size_gb)
    run = SizeRun(size_gb, a, failures)
    run.ours()
    if not a.no_peers:
        run.peers()
    rows = run.rows
    del run
    if a.device == "cuda":
        torch.cuda.empty_cache()
    return rows


def add_ratios(rows: list[dict[str, Any]], limit_gbps: float) -> None:
    """ratio_to_limit of every row; our rows' speed-up over each peer of the same size."""
    peers = {(r["size_gb"], r["method"]): r["gbps"] for r in rows if r["method"] in ("torch.load", "dcp.load")}
    for r in rows:
        g = r["gbps"]
        r["limit_gbps"] = round(limit_gbps, 2)
        r["ratio_to_limit"] = round(g / limit_gbps, 3) if g == g else ""
        for peer, col in (("torch.load", "x_torch_load"), ("dcp.load", "x_dcp")):
            p = peers.get((r["size_gb"], peer))
            ours = r["method"].startswith("engine") or r["method"] == "load_state"
            r[col] = round(g / p, 1) if ours and p and p == p and g == g else ""


def print_table(rows: list[dict[str, Any]], info: dict[str, str], device: str) -> None:
    sys.stdout.flush()
    print(
        f"\nrestore onto {device} ({info['device_name']}; memlock {info['memlock']}, NUMA node "
        f"{info['numa_node']}, torch {info['torch']}); limit {rows[0]['limit_gbps']} GB/s "
        f"({'pinned H2D' if device == 'cuda' else 'memcpy'})"
    )
    print(
        f"{'GB':>6}  {'method':<26} {'reps':>4} {'s':>8} {'GB/s':>8} {'/limit':>7} {'x torch':>8} "
        f"{'x dcp':>6}  ok   note"
    )
    for r in rows:
        print(
            f"{r['size_gb']:>6g}  {r['method']:<26} {r['reps']:>4} {r['seconds']:>8} {r['gbps']:>8} "
            f"{r['ratio_to_limit']!s:>7} {r['x_torch_load']!s:>8} {r['x_dcp']!s:>6}  {r['verified']:<4} "
            f"{r['note']}"
        )
    best: dict[float, float] = {}
    for r in rows:
        if (r["method"].startswith("engine") or r["method"] == "load_state") and r["verified"] == "yes":
            best[r["size_gb"]] = max(best.get(r["size_gb"], 0.0), float(r["ratio_to_limit"]))
    for size, ratio in best.items():
        xs = [r for r in rows if r["size_gb"] == size and float(r["ratio_to_limit"] or 0) == ratio]
        x = xs[0] if xs else {}
        print(
            f"{size:g} GB: best of ours {ratio:.2f} of the limit (goal >= {GOAL_LIMIT_RATIO}: "
            f"{'met' if ratio >= GOAL_LIMIT_RATIO else 'missed'}); x torch.load {x.get('x_torch_load')}, "
            f"x dcp {x.get('x_dcp')} (goal >= {GOAL_SPEEDUP:g}x)"
        )


def parse_variant(ap: argparse.ArgumentParser, text: str) -> tuple[str, dict[str, int]]:
    """("t8,c16", {"threads": 8, "chunk_bytes": 16 MiB}) of "8x16"; the chunk in KiB with a
    k ("8x512k": slots small enough to stay in the CPU's cache); "8x16x4" sets slots too."""
    parts = text.split("x")
    try:
        nums = [int(x) for x in parts if not x.endswith("k")]
        kib = len(parts) >= 2 and parts[1].endswith("k")
        if kib:
            nums.insert(1, int(parts[1][:-1]))
    except ValueError:
        nums = []
    if not 2 <= len(nums) <= 3:
        ap.error(f"--staged-variants: {text!r} is not THREADSxCHUNK_MB[xSLOTS] (CHUNK in KiB with a k)")
    opts = {"threads": nums[0], "chunk_bytes": nums[1] * (1024 if kib else MIB)}
    key = f"t{nums[0]},c{nums[1]}{'k' if kib else ''}"
    if len(nums) == 3:
        opts["slots"] = nums[2]
        key += f",s{nums[2]}"
    return key, opts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sizes", help="GB (1e9 bytes), comma-separated (default 1,4,16 on cuda, 0.25,1 on cpu)")
    ap.add_argument("--reps", type=int, default=5, help="restores per method of ours (median)")
    ap.add_argument(
        "--peer-reps", type=int, default=0, help="restores per peer (default: 3 up to 2 GB, 2 up to 4 GB, else 1)"
    )
    ap.add_argument("--budget-s", type=float, default=15.0, help="no further repetition of a method after this")
    ap.add_argument("--no-peers", action="store_true", help="skip torch.load and DCP")
    ap.add_argument("--chunk-mb", type=int, help="CopyEngine chunk_bytes in MiB (default: the engine's)")
    ap.add_argument("--slots", type=int, help="CopyEngine slots (default: the engine's)")
    ap.add_argument("--streams", type=int, help="CopyEngine streams (default: the engine's)")
    ap.add_argument("--threads", type=int, help="CopyEngine threads (default: the engine's)")
    ap.add_argument(
        "--staged-variants",
        default="",
        help="more staged runs with other engine options, THREADSxCHUNK_MB[xSLOTS] comma-separated (e.g. 8x16,12x32x4)",
    )
    ap.add_argument(
        "--registered-variants",
        default="",
        help="more registered runs (chunks locked in place), the same THREADSxCHUNK_MB[xSLOTS] form",
    )
    ap.add_argument("--shm-root", default="/dev/shm")
    ap.add_argument("--out", default=os.path.join(REPO, "docs", "benchmarks"))
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device")
    a.staged_variants = [parse_variant(ap, v) for v in a.staged_variants.split(",") if v]
    a.registered_variants = [parse_variant(ap, v) for v in a.registered_variants.split(",") if v]
    a.sizes = [float(x) for x in (a.sizes or ("1,4,16" if a.device == "cuda" else "0.25,1")).split(",")]
    return a


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="[device_restore] %(message)s")
    a = parse_args(argv)
    info = machine_info(a.device)
    log.info(
        "device %s (%s), memlock %s, NUMA node %s, torch %s",
        a.device,
        info["device_name"],
        info["memlock"],
        info["numa_node"],
        info["torch"],
    )
    limit = pinned_copy_gbps(a.device, nbytes=min(1 << 30, int(max(a.sizes) * GB)) if a.device == "cpu" else 1 << 30)
    log.info("limit: %.2f GB/s (%s)", limit, "pinned host-to-device" if a.device == "cuda" else "memcpy")
    failures: list[str] = []
    try:
        engine_desc = open_engine(a.device, "auto", a).description
    except Exception as e:  # noqa: BLE001 - the rows say so
        engine_desc = f"none: {e}"
    log.info("engine: %s", engine_desc)
    rows: list[dict[str, Any]] = []
    for size in a.sizes:
        rows += measure_size(size, a, failures)
    add_ratios(rows, limit)
    for r in rows:
        r.update(
            {
                "device": a.device,
                "limit_kind": "pinned_h2d" if a.device == "cuda" else "memcpy",
                "engine_options": " ".join(f"{k}={v}" for k, v in engine_options(a).items()) or "defaults",
                "engine": engine_desc,
                **info,
            }
        )
    print_table(rows, info, a.device)
    write_rows(a.out, f"device_restore_{a.device}.csv", rows, "device_restore")
    for f in failures:
        log.error("FAILED: %s", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
