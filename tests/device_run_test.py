#!/usr/bin/env python3
"""GPU-resident state in runs (tenplex.device, issue 30): tenplex.elastic.Job(async_commit=True),
examples/gpt/train.py --device, a warm worker's kept state (handoff.KeptState: what a next
version links unchanged is reused, the rest read) and `tenplex run --warm` of examples/gpt
keeping tensors with the static run's losses.

  python -m pytest tests/device_run_test.py   (ctest device_run_python, issue 32 §4): on
                             the CPU (the CUDA tests skip without a GPU; the runs need the
                             CLI: TENPLEX_BIN or build/bin/tenplex)
  device_run_test.py --cuda  only the CUDA tests, against the CPU reference (GPU machines:
                             `python3 tests/device_run_test.py --cuda`; fails when no CUDA
                             device is usable)

The reference is tests/device_testing.py's (plain file reads); the engine, restore_files,
the store and the hand-off themselves: tests/device_test.py. Runs without pytest too
(device_testing's small runner), for GPU machines that lack it.
"""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import device_testing  # (puts python/ on sys.path: script mode on GPU machines)
import torch
from device_testing import HAVE_CUDA, NAME_OF, ROOT, cuda_only, fresh_cpu_engine, log, raw_bytes, ref_read, same, state
from elastic_run_testing import small_model

import tenplex
from tenplex import device as tdev
from tenplex import handoff
from tenplex.safetensors import DTYPES

# ---- tenplex.elastic.Job(async_commit=True) -----------------------------------------------


def check_job_async(device: str) -> None:
    """A one-rank elastic job over a store daemon: periodic commits in the background
    (step_done), each version equal to the state at its step although the training loop
    updated the tensors in place meanwhile; restore(device=) brings the last one back."""
    import torch.distributed as dist
    from daemons import Daemon

    from tenplex import elastic
    from tenplex.testing import free_port

    daemon = Daemon(tenplex_bin())
    port = free_port()
    env = {
        "WORLD_SIZE": "1",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TENPLEX_STORE_URL": daemon.url,
    }
    saved_env = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        job = elastic.Job("dev", {"1": "tp=1"}, commit_every=2, async_commit=True)
        job.init_process_group("gloo", timeout=60)
        assert job.restore(device=device) is None
        live = {k: v for k, v in state(14, device).items() if v.dtype != torch.bool}
        st = tenplex.attach(url=daemon.url)
        at_step: dict[int, dict[str, bytes]] = {}
        seen = []
        for step in range(1, 8):
            for t in live.values():  # a training step: in place
                t.add_(1)
            if step % 2 == 0 or step == 7:
                at_step[step] = {k: raw_bytes(t) for k, t in live.items()}
            before = job.version
            job.step_done(step, lambda: {"config": job.config, "step": step}, lambda: live, last=step == 7)
            if job.version != before:  # a commit completed here: the version is the state at its step
                done = st.status("dev")["step"]
                got = st.load_state("dev", 0)
                assert {k: raw_bytes(t) for k, t in got.items()} == at_step[done], f"version of step {done}"
                seen.append(done)
        assert seen == [2, 4, 7] and job._pending is None, seen  # (6 completes in step 7's step_done, then 7)
        back = job.restore(device=device)
        assert back.step == 7
        for k, t in live.items():
            assert back.tensors[k].device.type == torch.device(device).type and same(back.tensors[k], t), k
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        daemon.stop()


def test_job_async_commit() -> None:
    if not tenplex_bin():
        return  # (ctest gives TENPLEX_BIN)
    fresh_cpu_engine()
    check_job_async("cpu")


@cuda_only
def test_cuda_job_async_commit() -> None:
    assert tenplex_bin(), "needs the tenplex CLI (TENPLEX_BIN or build/bin/tenplex)"
    tdev.configure("cuda")
    check_job_async("cuda")


# ---- examples/gpt/train.py --device ------------------------------------------------------


def tenplex_bin() -> str:
    exe = os.environ.get("TENPLEX_BIN") or os.path.join(ROOT, "build", "bin", "tenplex")
    return exe if os.path.exists(exe) else ""


def train_losses(tmp_path: Path, config: str, device: str, extra: list[str]) -> list[float]:
    """Losses of examples/gpt/launch.py running train.py in `config` on `device`."""
    model = tmp_path / "model.json"
    if not model.exists():
        small_model(tenplex_bin(), str(tmp_path), hidden=64, vocab=250, seq=64)
    logf = tmp_path / f"{config}-{device}.jsonl"
    if logf.exists():
        logf.unlink()
    cmd = [
        sys.executable,
        os.path.join(ROOT, "examples", "gpt", "launch.py"),
        "--config",
        config,
        "--model",
        str(model),
        "--steps",
        "4",
        "--seq-length",
        "32",
        "--global-batch-size",
        "4",
        "--micro-batch-size",
        "2",
        "--timeout",
        "120",
        "--device",
        device,
        "--log",
        str(logf),
    ] + extra
    subprocess.run(cmd, check=True, timeout=600, stdout=subprocess.DEVNULL)
    recs = [json.loads(line) for line in logf.read_text().splitlines()]
    return [r["loss"] for r in recs if "loss" in r]


def check_train(tmp_path: Path, device: str) -> None:
    """`device` gives the losses of the CPU run (the reference): in tp=1, and through gloo
    collectives staged through host memory (tp=2,pp=2: all-reduces, sends and receives;
    dp=2,zero=1: all-gathers); a checkpoint written from the device and resumed onto it
    goes on with the reference's losses."""
    ref = {}
    for config in ("tp=1", "tp=2,pp=2", "dp=2,zero=1"):
        ref[config] = train_losses(tmp_path, config, "cpu", [])
        got = train_losses(tmp_path, config, device, [])
        log.info("%s: cpu %s, %s %s", config, ref[config], device, got)
        assert len(ref[config]) == len(got) == 4
        for a, b in zip(ref[config], got):
            assert abs(a - b) <= 1e-4 * abs(a), (config, ref[config], got)
    ckpt = tmp_path / "ckpt"
    train_losses(tmp_path, "tp=1", device, ["--save-dir", str(ckpt), "--save-at", "2"])
    resumed = train_losses(tmp_path, "tp=1", device, ["--load-dir", str(ckpt), "--steps", "2"])
    assert len(resumed) == 2
    assert all(abs(a - b) <= 1e-4 * abs(a) for a, b in zip(ref["tp=1"][2:], resumed)), (ref["tp=1"], resumed)


def test_train_cpu_device_flag(tmp_path: Path) -> None:
    """The harness of test_cuda_train with --device cpu (the flag's plumbing)."""
    if not tenplex_bin():
        return  # (ctest gives TENPLEX_BIN; a GPU machine may have only the module)
    assert train_losses(tmp_path, "tp=1", "cpu", []) == train_losses(tmp_path, "tp=1", "cpu", ["--threads", "1"])


@cuda_only
def test_cuda_train(tmp_path: Path) -> None:
    assert tenplex_bin(), "test_cuda_train needs the tenplex CLI (TENPLEX_BIN or build/bin/tenplex)"
    check_train(tmp_path, "cuda")


# ---- warm reconfigurations: unchanged tensors stay where they are (handoff.KeptState) ------
#
# Unit: a "stop" version of plain files written with handoff.write_rank and remembered, and a
# next version made as the runner makes one: some files hard links of the stop's (the plan's
# unchanged tensors, under new names, shapes and another rank), some new files with other
# bytes, one recycled file (an older version's, renamed in: same size as a stop file, another
# inode), links whose new dtype or element count differs, a linked file rewritten after the
# stop, a file linked under two names. Checked: which tensors are kept and which loaded, every
# resulting tensor's bytes equal a plain read of its new file, kept tensors are the stop's
# memory (no copy), and an in-place update of one result never shows in another.
# Integration: `tenplex run --warm` through dp=2 -> pp=2 -> tp=2: rank 0's warm_join events
# report kept tensors (all at dp=2 -> pp=2, some at pp=2 -> tp=2), and every step's samples
# and loss equal those of a static tp=1 run.


def warm_spec(name: str, dtype: torch.dtype, shape: list[int], path: Path) -> dict[str, Any]:
    return {"name": name, "dtype": NAME_OF[dtype], "shape": list(shape), "file": str(path)}


def warm_ref(s: dict[str, Any]) -> torch.Tensor:
    """A plain read of a hand-off tensor spec's file (zero-size tensors have none)."""
    dtype = DTYPES[s["dtype"]][0]
    if 0 in s["shape"]:
        return torch.empty(s["shape"], dtype=dtype)
    return ref_read(s["file"], dtype, s["shape"])


def warm_stop_state(device: str) -> dict[str, torch.Tensor]:
    """The worker's state at its stop (what train.py's state_tensors gives: fresh tensors)."""
    g = torch.Generator().manual_seed(11)
    out = {
        "a": torch.randn(4, 6, generator=g),
        "b": torch.randn(33, generator=g).to(torch.bfloat16),
        "c": torch.randn(5, 5, generator=g),
        "d": torch.randn(64, generator=g),
        "e": torch.arange(7, dtype=torch.int64) * 3,
        "f": torch.randn(4, generator=g),
        "g": torch.randn(6, generator=g),
        "h": torch.randn(2, 8, generator=g),
        "zero": torch.zeros(0, 2),
    }
    return {k: v.to(device) for k, v in out.items()}


def warm_write_stop(tmp: Path, tensors: dict[str, torch.Tensor], rank: int = 0) -> dict[str, Any]:
    """The stop's hand-off: files allocated (zeros, as the store does) and written by
    handoff.write_rank."""
    v1 = tmp / "v1"
    v1.mkdir()
    specs = []
    for k, t in tensors.items():
        p = v1 / k
        p.write_bytes(b"\0" * (t.numel() * t.element_size()))
        specs.append(warm_spec(k, t.dtype, list(t.shape), p))
    h = {"config": "dp=2", "ranks": [{"rank": rank, "tensors": specs}]}
    handoff.write_rank(h, rank, list(tensors.items()))
    return h


def warm_next_version(tmp: Path, stop: dict[str, torch.Tensor], rank: int = 1) -> tuple[dict[str, Any], list[str]]:
    """The next hand-off (for `rank`) as a transform makes it from the stop's version
    tmp/v1, and the names that must be kept."""
    v1, v2, v0 = tmp / "v1", tmp / "v2", tmp / "v0"
    v2.mkdir()
    v0.mkdir()
    g = torch.Generator().manual_seed(99)
    specs = []
    os.link(v1 / "a", v2 / "layers.0.a")  # unchanged, a new name and shape (same elements)
    specs.append(warm_spec("layers.0.a", torch.float32, [6, 4], v2 / "layers.0.a"))
    os.link(v1 / "b", v2 / "b")  # unchanged, bf16
    specs.append(warm_spec("b", torch.bfloat16, [33], v2 / "b"))
    (v2 / "c").write_bytes(torch.randn(25, generator=g).numpy().tobytes())  # moved: a new file, same size
    specs.append(warm_spec("c", torch.float32, [5, 5], v2 / "c"))
    # A file of an older, released version (not the stop's) recycled for d: same size as
    # the stop's d, another inode, other bytes.
    (v0 / "old").write_bytes(torch.randn(64, generator=g).numpy().tobytes())
    os.rename(v0 / "old", v2 / "d")
    specs.append(warm_spec("d", torch.float32, [64], v2 / "d"))
    os.link(v1 / "e", v2 / "e1")  # one file under two names
    os.link(v1 / "e", v2 / "e2")
    specs.append(warm_spec("e1", torch.int64, [7], v2 / "e1"))
    specs.append(warm_spec("e2", torch.int64, [7], v2 / "e2"))
    os.link(v1 / "f", v2 / "f.as_int")  # the same bytes as another dtype
    specs.append(warm_spec("f.as_int", torch.int32, [4], v2 / "f.as_int"))
    os.link(v1 / "g", v2 / "g.half")  # the same bytes as another dtype and element count
    specs.append(warm_spec("g.half", torch.float16, [12], v2 / "g.half"))
    # h's file changed after the stop (same inode and size, other bytes, later mtime).
    os.link(v1 / "h", v2 / "h")
    st = os.stat(v1 / "h")
    fd = os.open(v1 / "h", os.O_WRONLY)
    try:
        os.pwrite(fd, torch.randn(16, generator=g).numpy().tobytes(), 0)
    finally:
        os.close(fd)
    os.utime(v1 / "h", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    specs.append(warm_spec("h", torch.float32, [2, 8], v2 / "h"))
    specs.append(warm_spec("zero", torch.float32, [0, 2], v2 / "absent"))
    return {"config": "pp=2", "ranks": [{"rank": rank, "tensors": specs}]}, ["layers.0.a", "b", "e1", "e2"]


def check_warm_keep(tmp: Path, device: str, read_device: Optional[str]) -> None:
    """remember at the stop on `device`, read_rank(device=read_device, keep=)."""
    stop = warm_stop_state(device)
    h_out = warm_write_stop(tmp, stop)
    keep = handoff.KeptState()
    keep.remember(h_out, 0, list(stop.items()))
    assert len(keep) == 8  # every file but the zero-size tensor's
    h_in, want_kept = warm_next_version(tmp, stop)
    got = handoff.read_rank(h_in, 1, device=read_device, keep=keep)
    specs = h_in["ranks"][0]["tensors"]
    assert list(got) == [s["name"] for s in specs]
    st = keep.stats
    log.info("%s -> %s: %s", device, read_device, st)
    nbytes = {s["name"]: got[s["name"]].numel() * got[s["name"]].element_size() for s in specs}
    assert st["kept_tensors"] == len(want_kept), st
    assert st["kept_bytes"] == sum(nbytes[n] for n in want_kept), st
    assert st["loaded_tensors"] == len(specs) - len(want_kept), st
    assert st["loaded_bytes"] == sum(nbytes.values()) - st["kept_bytes"], st
    assert len(keep) == 0, "one use: emptied by the load"
    want_device = torch.device(read_device or "cpu")
    for s in specs:
        t = got[s["name"]]
        assert t.device.type == want_device.type, (s["name"], t.device)
        assert same(t, warm_ref(s)), s["name"]
    # Kept: the stop's memory itself, viewed with the new shape; the file's second name a copy.
    assert got["layers.0.a"].data_ptr() == stop["a"].data_ptr()
    assert list(got["layers.0.a"].shape) == [6, 4]
    assert got["b"].data_ptr() == stop["b"].data_ptr()
    storages = {n: got[n].untyped_storage().data_ptr() for n in got if got[n].numel()}
    assert len(set(storages.values())) == len(storages), f"results share memory: {storages}"
    # In-place updates stay in their tensor.
    before = {n: got[n].clone() for n in got}
    got["e1"].fill_(-1)
    got["layers.0.a"].add_(1.0)
    got["b"].mul_(2)
    for n in got:
        if n not in ("e1", "layers.0.a", "b"):
            assert same(got[n], before[n]), f"{n} changed with another tensor"
    assert same(got["e2"], ref_read(str(tmp / "v2" / "e2"), torch.int64, [7]))
    # Used up: the same hand-off again loads everything.
    again = handoff.read_rank(h_in, 1, device=read_device, keep=keep)
    assert keep.stats["kept_tensors"] == 0 and keep.stats["loaded_tensors"] == len(specs)
    for s in specs:
        assert same(again[s["name"]], warm_ref(s)), s["name"]


def test_warm_keep_plain_reads(tmp_path: Path) -> None:
    """A CPU worker's warm load (read_rank without a device)."""
    check_warm_keep(tmp_path, "cpu", None)


def test_warm_keep_cpu_engine(tmp_path: Path) -> None:
    """The rest through the copy engine's cpu backend."""
    check_warm_keep(tmp_path, "cpu", "cpu")


def test_warm_keep_other_device_loads(tmp_path: Path) -> None:
    """Tensors kept on another device than the load's are not reused; a failed load
    empties the KeptState all the same."""
    stop = warm_stop_state("cpu")
    h_out = warm_write_stop(tmp_path, stop)
    keep = handoff.KeptState()
    keep.remember(h_out, 0, stop)
    h_in, _ = warm_next_version(tmp_path, stop)
    other = "cuda" if HAVE_CUDA else "meta"
    if other == "meta":  # the kept tensors' device differs: all loaded (plain reads here)
        kept, rest = keep.take(list(handoff._rank_tensors(h_in, 1)), "meta")
        assert kept == {} and len(rest) == len(h_in["ranks"][0]["tensors"])
    else:
        got = handoff.read_rank(h_in, 1, device=other, keep=keep)
        assert keep.stats["kept_tensors"] == 0
        assert all(t.is_cuda for t in got.values())
    assert len(keep) == 0
    keep.remember(h_out, 0, stop)
    os.unlink(tmp_path / "v2" / "c")  # a file the load needs is missing
    try:
        handoff.read_rank(h_in, 1, keep=keep)
        raise AssertionError("a missing file was not an error")
    except (handoff.HandoffError, OSError) as e:
        log.info("raised as expected: %s", e)
    assert len(keep) == 0


@cuda_only
def test_cuda_warm_keep(tmp_path: Path) -> None:
    """On the GPU: kept tensors stay in device memory, the rest through the engine."""
    check_warm_keep(tmp_path, "cuda", "cuda")


# ---- tenplex run --warm of examples/gpt --------------------------------------------------


def warm_run(
    tmp: Path, name: str, schedule: list[dict[str, Any]], model: Path, extra: list[str], device: str
) -> list[dict[str, Any]]:
    """The log lines of `tenplex run` of examples/gpt/train.py."""
    sched = tmp / f"{name}.json"
    sched.write_text(json.dumps(schedule))
    logf = tmp / f"{name}.jsonl"
    cmd = [
        tenplex_bin(),
        "run",
        "--schedule",
        str(sched),
        "--log",
        str(logf),
        "--work-dir",
        str(tmp / name),
        "--hang-seconds",
        "120",
    ] + extra
    cmd += [
        "--",
        sys.executable,
        os.path.join(ROOT, "examples", "gpt", "train.py"),
        "--model",
        str(model),
        "--global-batch-size",
        "8",
        "--micro-batch-size",
        "2",
        "--seq-length",
        "32",
        "--device",
        device,
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise AssertionError(f"tenplex run {name} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return [json.loads(line) for line in logf.read_text().splitlines()]


def check_warm_run(tmp: Path, device: str) -> None:
    model = Path(small_model(tenplex_bin(), str(tmp)))
    n = 6
    static = warm_run(tmp, "static", [{"step": 0, "config": "tp=1"}, {"step": n, "stop": True}], model, [], device)
    warm = warm_run(
        tmp,
        "warm",
        [
            {"step": 0, "config": "dp=2"},
            {"step": 2, "config": "pp=2"},
            {"step": 4, "config": "tp=2"},
            {"step": n, "stop": True},
        ],
        model,
        ["--warm"],
        device,
    )
    base = {r["step"]: r for r in static if "event" not in r}
    got = {r["step"]: r for r in warm if "event" not in r}
    assert sorted(got) == sorted(base) == list(range(n)), (sorted(got), sorted(base))
    for s in range(n):
        rel = abs(got[s]["loss"] - base[s]["loss"]) / abs(base[s]["loss"])
        assert got[s]["samples"] == base[s]["samples"] and rel <= 1e-5, (s, got[s], base[s])
    joins = {e["step"]: e for e in warm if e.get("event") == "warm_join" and e["step"] > 0}
    log.info("warm joins: %s", joins)
    assert sorted(joins) == [2, 4], joins
    # dp=2 -> pp=2: rank 0's stage (embedding, layer 0) is unchanged in full: all kept.
    assert joins[2]["kept_tensors"] > 0 and joins[2]["loaded_tensors"] == 0, joins[2]
    # pp=2 -> tp=2: the tp-replicated tensors (norms, biases of row-parallel layers) stay.
    assert joins[4]["kept_tensors"] > 0 and joins[4]["loaded_tensors"] > 0, joins[4]


def test_warm_run_keeps_unchanged(tmp_path: Path) -> None:
    if not tenplex_bin():
        return  # (ctest gives TENPLEX_BIN; a GPU machine may have only the module)
    check_warm_run(tmp_path, "cpu")


@cuda_only
def test_cuda_warm_run(tmp_path: Path) -> None:
    assert tenplex_bin(), "test_cuda_warm_run needs the tenplex CLI (TENPLEX_BIN or build/bin/tenplex)"
    check_warm_run(tmp_path, "cuda")


if __name__ == "__main__":
    sys.exit(device_testing.main(__file__, globals()))
