#!/usr/bin/env python3
"""Committing a training job's state from the device every step (issue 30): the step-time
overhead of a blocking commit and of the asynchronous path, against no commit.

The job: an MLP of --layers square fp32 layers (default hidden 6144 x 4 layers on cuda:
0.6 GB of parameters, 1.8 GB with the Adam moments exp_avg and exp_avg_sq; hidden 512 x 2
on cpu, with one torch thread), trained with an Adam-like in-place update
(torch._foreach_*). The batch is calibrated first so that a step takes about --target-ms
(default 150 ms on cuda, 20 on cpu). Every step ends with `loss.item()`, as a training
loop that logs its loss does.
Variants, --steps steps each after --warmup untimed ones, one store version per step:

  baseline : no commit
  blocking : at the step boundary `save_state` (from the device through the copy engine)
             and `commit`, the loop waiting for both
  async    : `tenplex.device.AsyncCommit.start(state, write)`: the state is cloned on the
             device (snapshot, on the current stream) and a background thread writes the
             snapshot into a new version (`begin`, the store's `allocate`,
             `tenplex.device.commit_files`, `commit`) while the next steps run
  async-api: the store's own API: `save_state_async` at the boundary (files allocated in
             the loop, snapshot written in the background), its `wait()` and `commit` at
             the next boundary

Snapshot semantics are checked in each committing variant at step --steps/2: right after
that step's commit is submitted, every bit of the live state is inverted in place (queued
behind the snapshot, while the write is in flight); once the write is done, the version
read back from the store must equal a copy of the state from before the change, bit for
bit (and its info's step must be that step); then the change is undone. The last version
must equal the final state. The checked step is left out of the step times. Reported per
variant: median and mean step time, the overhead of the median against the baseline's
(goal for async: < 5 %), the loop's own time at the boundary, and for async the snapshot's
and the background write's time. The pinned device-to-host limit is measured in the same run.

Writes device_commit_<device>[_every<N>].csv into --out (default docs/benchmarks) and prints a table.
Usage: device_commit.py [--device cuda|cpu] [--steps 30] [--hidden 6144 --layers 4] [--out DIR]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))

import torch  # noqa: E402
from bench_csv import write_rows  # noqa: E402
from device_restore import GB, machine_info, mismatches, pinned_copy_gbps, sync  # noqa: E402

import tenplex  # noqa: E402 (device_restore put python/ on the path)
from tenplex import device as tdev  # noqa: E402

log = logging.getLogger("device_commit")

GOAL_OVERHEAD = 0.05
JOB = "train"
VARIANTS = ("baseline", "blocking", "async", "async-api")
State = dict[str, torch.Tensor]


class Trainer:
    """An MLP with Adam-like state, updated in place: the job whose state is committed."""

    def __init__(self, hidden: int, layers: int, batch: int, device: str, seed: int = 1) -> None:
        g = torch.Generator(device=device)
        g.manual_seed(seed)
        self.device = device
        self.w = [
            (torch.randn(hidden, hidden, device=device, generator=g) / hidden**0.5).requires_grad_()
            for _ in range(layers)
        ]
        self.m = [torch.zeros_like(w) for w in self.w]
        self.v = [torch.zeros_like(w) for w in self.w]
        self.x = torch.randn(batch, hidden, device=device, generator=g)
        self.t = 0

    def state(self) -> State:
        """The tensors to commit: views of the live storage (updated in place)."""
        out: State = {}
        for i, (w, m, v) in enumerate(zip(self.w, self.m, self.v)):
            out[f"layers.{i}.weight"] = w.detach()
            out[f"optimizer.exp_avg.layers.{i}.weight"] = m
            out[f"optimizer.exp_avg_sq.layers.{i}.weight"] = v
        return out

    def step(self, lr: float = 1e-4, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> float:
        y = self.x
        for i, w in enumerate(self.w):
            y = y @ w
            if i + 1 < len(self.w):
                y = torch.relu(y)
        loss = y.pow(2).mean()
        loss.backward()
        self.t += 1
        with torch.no_grad():
            grads = [w.grad for w in self.w]
            params = [w.detach() for w in self.w]
            torch._foreach_mul_(self.m, b1)
            torch._foreach_add_(self.m, grads, alpha=1 - b1)
            torch._foreach_mul_(self.v, b2)
            torch._foreach_addcmul_(self.v, grads, grads, value=1 - b2)
            denom = torch._foreach_sqrt(self.v)
            torch._foreach_add_(denom, eps)
            torch._foreach_addcdiv_(params, self.m, denom, value=-lr * (1 - b2**self.t) ** 0.5 / (1 - b1**self.t))
        for w in self.w:
            w.grad = None
        return loss.item()


def calibrate(a: argparse.Namespace) -> int:
    """The batch (a multiple of 64) whose step takes about a.target_ms."""
    batch = 1024 if a.device == "cuda" else 256
    tr = Trainer(a.hidden, a.layers, batch, a.device)
    for _ in range(2):
        tr.step()
    times = []
    for _ in range(3):
        t = time.perf_counter()
        tr.step()
        times.append(time.perf_counter() - t)
    per = statistics.median(times)
    del tr
    scaled = int(batch * a.target_ms / 1e3 / per) // 64 * 64
    out = max(64, min(scaled, a.max_batch))
    log.info("calibration: batch %d took %.1f ms per step; batch %d for %.0f ms", batch, per * 1e3, out, a.target_ms)
    return out


PHASES: dict[str, list[float]] = {"allocate": [], "engine": [], "commit": []}


def write_version(st: Any, step: int, snap: State) -> int:
    """A new version holding snap: files allocated by the store, filled by the copy
    engine, committed (each phase timed into PHASES). Runs in AsyncCommit's writer thread."""
    t0 = time.perf_counter()
    v = st.begin(JOB, info={"step": step})
    prefix = f"jobs/{JOB}/{v}/rank-00000/"
    infos = st._s.allocate(
        [(prefix + k, tenplex.store._NAME_OF[t.dtype], list(t.shape)) for k, t in snap.items()], zero_fill=False
    )
    t1 = time.perf_counter()
    tdev.commit_files([(k, t, info["file"]) for (k, t), info in zip(snap.items(), infos)])
    t2 = time.perf_counter()
    st.commit(JOB, v)
    t3 = time.perf_counter()
    for name, d in (("allocate", t1 - t0), ("engine", t2 - t1), ("commit", t3 - t2)):
        PHASES[name].append(d)
    return v


class Committer:
    """One variant's commit at a step boundary; flush() makes everything submitted committed."""

    def __init__(self, variant: str, st: Any) -> None:
        self.variant, self.st = variant, st
        self.ac = tdev.AsyncCommit()
        self.started = False  # async: a write was started and not waited for
        self.pending: int | None = None  # async-api: the version written in the background
        self.snapshot_s: list[float] = []
        self.write_s: list[float] = []

    def submit(self, step: int, state: State) -> None:
        if self.variant == "blocking":
            sync(next(iter(state.values())).device.type)  # the step's kernels: not the commit's time
            write_version(self.st, step, state)
        elif self.variant == "async":
            self.flush()
            self.ac.start(state, lambda snap: write_version(self.st, step, snap))
            self.snapshot_s.append(self.ac.snapshot_seconds)
            self.started = True
        elif self.variant == "async-api":
            self.flush()
            v = self.st.begin(JOB, info={"step": step})
            self.ac = self.st.save_state_async(JOB, v, 0, state)
            self.snapshot_s.append(self.ac.snapshot_seconds)
            self.pending = v

    def flush(self) -> None:
        if self.variant == "async" and self.started:
            self.ac.wait()
            self.write_s.append(self.ac.write_seconds)
            self.started = False
        elif self.variant == "async-api" and self.pending is not None:
            self.ac.wait()
            self.write_s.append(self.ac.write_seconds)
            self.st.commit(JOB, self.pending)
            self.pending = None


def check_version(st: Any, step: int, want: State, device: str) -> list[str]:
    """Problems of the current version against the state `want` of `step`."""
    info = st.status(JOB)
    problems = (
        []
        if info.get("step") == step
        else [f"current version {info['version']} is of step {info.get('step')}, not {step}"]
    )
    got = st.load_state(JOB, 0, device=device)
    bad = mismatches(want, got)
    if bad:
        problems.append(
            f"step {step}: {len(bad)} of {len(want)} tensors differ from the state at that step (first {bad[0]})"
        )
    return problems


def flip(state: State) -> None:
    """Inverts every bit of the tensors in place (its own inverse)."""
    for t in state.values():
        t.view(torch.int32 if t.element_size() == 4 else torch.int16).bitwise_not_()


def check_snapshot(c: Committer, st: Any, step: int, state: State, device: str) -> list[str]:
    """Commits `step` with an in-place change of every tensor queued right after the
    submit (while the write is in flight), then checks that the version holds the state
    from before the change, and undoes the change."""
    kept = {k: t.clone() for k, t in state.items()}
    c.submit(step, state)
    flip(state)
    c.flush()
    problems = check_version(st, step, kept, device)
    flip(state)
    sync(device)
    return problems


def run_variant(variant: str, a: argparse.Namespace, batch: int, failures: list[str]) -> dict[str, Any]:
    dev = a.device
    st = tenplex.attach(shm_dir="") if variant != "baseline" else None
    tr = Trainer(a.hidden, a.layers, batch, dev)
    state = tr.state()
    c = Committer(variant, st)
    for v in PHASES.values():
        v.clear()
    check = a.warmup + a.steps // 2
    step_s: list[float] = []
    boundary_s: list[float] = []
    problems: list[str] = []
    total = a.warmup + a.steps
    t_prev = time.perf_counter()
    for step in range(total):
        tr.step()
        t_b = time.perf_counter()
        if variant != "baseline" and step == check:
            problems += check_snapshot(c, st, step, state, dev)
        elif variant != "baseline" and (step % a.every == 0 or step == total - 1):
            c.submit(step, state)
        t = time.perf_counter()
        if step >= a.warmup and step != check:
            step_s.append(t - t_prev)
            boundary_s.append(t - t_b)
        t_prev = time.perf_counter()
    if st is not None:
        c.flush()
        sync(dev)
        problems += check_version(st, total - 1, state, dev)
        st.delete(JOB)
    for p in problems:
        failures.append(f"{variant}: {p}")
        log.error("%s: %s", variant, p)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    med = statistics.median(step_s)
    log.info(
        "%s: median step %.1f ms, boundary %.1f ms%s",
        variant,
        med * 1e3,
        statistics.mean(boundary_s) * 1e3,
        "" if st is None else (" (verified)" if not problems else " (WRONG BYTES)"),
    )
    row = {
        "variant": variant,
        "steps": len(step_s),
        "batch": batch,
        "hidden": a.hidden,
        "layers": a.layers,
        "state_bytes": nbytes,
        "step_ms": round(med * 1e3, 2),
        "step_ms_mean": round(statistics.mean(step_s) * 1e3, 2),
        "boundary_ms": round(statistics.mean(boundary_s) * 1e3, 2),
        "verified": "" if st is None else ("yes" if not problems else "NO"),
        "snapshot_ms": round(statistics.mean(c.snapshot_s) * 1e3, 2) if c.snapshot_s else "",
        "write_ms": round(statistics.mean(c.write_s) * 1e3, 2) if c.write_s else "",
        "every": a.every,
    }
    for name, ds in PHASES.items():  # where a write's time goes (blocking and async)
        row[f"{name}_ms"] = round(statistics.median(ds) * 1e3, 2) if ds else ""
    if any(PHASES.values()):
        log.info(
            "%s: write phases (median ms): %s", variant, ", ".join(f"{k} {row[k + '_ms']}" for k in PHASES if PHASES[k])
        )
    del tr, state, c
    if dev == "cuda":
        torch.cuda.empty_cache()
    return row


def print_table(
    rows: list[dict[str, Any]], info: dict[str, str], a: argparse.Namespace, batch: int, limit: float
) -> None:
    sys.stdout.flush()
    if not rows:
        return
    print(
        f"\ncommit every {a.every} step(s) from {a.device} ({info['device_name']}; memlock {info['memlock']}, "
        f"NUMA node {info['numa_node']}, torch {info['torch']}); state {rows[0]['state_bytes'] / GB:.2f} GB, "
        f"batch {batch}, D2H limit {limit:.1f} GB/s"
    )
    print(
        f"{'variant':<10} {'steps':>5} {'step ms':>8} {'mean':>8} {'overhead':>9} {'boundary ms':>11} "
        f"{'snapshot ms':>11} {'write ms':>9}  ok"
    )
    for r in rows:
        print(
            f"{r['variant']:<10} {r['steps']:>5} {r['step_ms']:>8} {r['step_ms_mean']:>8} "
            f"{r['overhead_pct']!s:>8}% {r['boundary_ms']:>11} {r['snapshot_ms']!s:>11} {r['write_ms']!s:>9}  "
            f"{r['verified']}"
        )
    for r in rows:
        if r["variant"].startswith("async") and r["overhead_pct"] != "":
            met = r["overhead_pct"] < GOAL_OVERHEAD * 100
            print(
                f"{r['variant']}: overhead {r['overhead_pct']} % (goal < {GOAL_OVERHEAD * 100:g} %: "
                f"{'met' if met else 'missed'})"
            )
    sys.stdout.flush()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per variant")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--hidden", type=int, help="default 6144 on cuda, 512 on cpu")
    ap.add_argument("--layers", type=int, help="default 4 on cuda, 2 on cpu")
    ap.add_argument("--target-ms", type=float, help="step time the batch is calibrated for (150 on cuda, 20 on cpu)")
    ap.add_argument("--batch", type=int, help="a fixed batch instead of calibrating one")
    ap.add_argument("--max-batch", type=int, default=65536)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument(
        "--every", type=int, default=1, help="commit every N steps (the checked and the last step always commit)"
    )
    ap.add_argument("--out", default=os.path.join(os.path.dirname(HERE), "docs", "benchmarks"))
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device")
    cuda = a.device == "cuda"
    a.hidden = a.hidden or (6144 if cuda else 512)
    a.layers = a.layers or (4 if cuda else 2)
    a.target_ms = a.target_ms or (150.0 if cuda else 20.0)
    a.variants = [v for v in a.variants.split(",") if v]
    if a.steps < 4 or any(v not in VARIANTS for v in a.variants) or "baseline" not in a.variants:
        ap.error(f"--steps >= 4 and --variants among {','.join(VARIANTS)}, baseline included")
    return a


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="[device_commit] %(message)s")
    a = parse_args(argv)
    if a.device == "cpu":  # the copy engine's threads need cores too: spinning OpenMP threads stall them
        torch.set_num_threads(1)
    info = machine_info(a.device)
    log.info(
        "device %s (%s), memlock %s, NUMA node %s, torch %s; engine %s",
        a.device,
        info["device_name"],
        info["memlock"],
        info["numa_node"],
        info["torch"],
        tdev.engine(a.device).description,
    )
    limit = pinned_copy_gbps(a.device, to_device=False, nbytes=1 << 30 if a.device == "cuda" else 64 << 20)
    log.info("limit: %.2f GB/s (%s)", limit, "pinned device-to-host" if a.device == "cuda" else "memcpy")
    batch = a.batch or calibrate(a)
    failures: list[str] = []
    rows = []
    for variant in a.variants:
        try:
            rows.append(run_variant(variant, a, batch, failures))
        except Exception as e:  # noqa: BLE001 - one variant failing must not hide the others
            log.exception("%s failed", variant)
            failures.append(f"{variant}: {type(e).__name__}: {e}")
    base = next((r["step_ms"] for r in rows if r["variant"] == "baseline"), None)
    base_mean = next((r["step_ms_mean"] for r in rows if r["variant"] == "baseline"), None)
    for r in rows:
        r["overhead_pct"] = round((r["step_ms"] / base - 1) * 100, 2) if base else ""
        r["overhead_mean_pct"] = round((r["step_ms_mean"] / base_mean - 1) * 100, 2) if base_mean else ""
        r.update({"device": a.device, "limit_d2h_gbps": round(limit, 2), **info})
    print_table(rows, info, a, batch, limit)
    if rows:
        name = f"device_commit_{a.device}" + ("" if a.every == 1 else f"_every{a.every}")
        write_rows(a.out, name + ".csv", rows, "device_commit")
    for f in failures:
        log.error("FAILED: %s", f)
    return 1 if failures or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
