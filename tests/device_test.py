#!/usr/bin/env python3
"""GPU-resident state from Python (tenplex.device, issue 30) against an independent reference:
the copy engine, restore_files/commit_files, Store.load_state/save_state(_async), AsyncCommit
and the hand-off.

  python -m pytest tests/device_test.py   (ctest device_python, issue 32 §4): the CPU
                            backend of the copy engine (the CUDA tests skip without a GPU)
  device_test.py --cuda     only the CUDA tests, each against the CPU reference (GPU machines,
                            scripts/gpu_check.sh; fails when no CUDA device is usable)

The reference (tests/device_testing.py) is plain file reads and writes: bytes equal for many
tensors of mixed dtypes (bf16 too), sizes around the engine's chunk boundaries (chunk_bytes
4096 with 4095/4096/4097-byte tensors, and a few MB), zero-size tensors, errors naming the
file; Store.load_state(device=) against load_state(); AsyncCommit's snapshot semantics (an
in-place update after start() never reaches the written bytes); hand-off read_rank/write_rank
with a device. Jobs, train.py --device and warm reconfigurations: tests/device_run_test.py.
Runs without pytest too (device_testing's small runner), for GPU machines that lack it.
"""

import logging
import sys
import threading
from pathlib import Path
from typing import Any

import device_testing  # (puts python/ on sys.path: script mode on GPU machines)
import torch
from device_testing import (
    CHUNK,
    NAME_OF,
    Records,
    _raises,
    cuda_only,
    fresh_cpu_engine,
    log,
    make_files,
    raw_bytes,
    ref_read,
    same,
    state,
)

import tenplex
from tenplex import (
    _tenplex,
    handoff,
)
from tenplex import device as tdev

# ---- the engine itself ------------------------------------------------------------------


def test_engine_backend() -> None:
    assert tdev.engine("cpu").backend == "cpu"
    assert tdev.engine("cpu") is tdev.engine(torch.device("cpu"))
    assert isinstance(_tenplex.cuda_built(), bool)


def test_engine_offsets_against_reads(tmp_path: Path) -> None:
    """The binding itself: (file, offset, nbytes, pointer) items at odd offsets, across chunks."""
    eng = fresh_cpu_engine()
    blob = torch.randint(0, 256, (5 * CHUNK + 123,), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    path = tmp_path / "blob"
    path.write_bytes(blob.numpy().tobytes())
    spans = [(0, 1), (1, CHUNK - 1), (CHUNK - 1, CHUNK + 2), (17, 3 * CHUNK), (5 * CHUNK, 123), (0, 5 * CHUNK + 123)]
    dsts = [torch.empty(n, dtype=torch.uint8) for _, n in spans]
    stats = eng.restore([(str(path), off, n, d.data_ptr()) for (off, n), d in zip(spans, dsts)])
    assert stats["bytes"] == sum(n for _, n in spans) and stats["mode"] in ("staged", "registered")
    for (off, n), d in zip(spans, dsts):
        assert same(d, ref_read(str(path), torch.uint8, [n], off)), (off, n)
    # commit at an offset leaves the bytes around it alone
    src = torch.arange(CHUNK + 5, dtype=torch.int32).view(torch.uint8)[: CHUNK + 9].clone()
    eng.commit([(src.data_ptr(), str(path), 11, src.numel())])
    want = bytearray(blob.numpy().tobytes())
    want[11 : 11 + src.numel()] = raw_bytes(src)
    assert path.read_bytes() == bytes(want)


def test_engine_errors(tmp_path: Path) -> None:
    eng = fresh_cpu_engine()
    dst = torch.empty(16, dtype=torch.uint8)
    missing = str(tmp_path / "missing.bin")
    with _raises(_tenplex.NotFoundError, "missing.bin"):
        eng.restore([(missing, 0, 16, dst.data_ptr())])
    short = tmp_path / "short.bin"
    short.write_bytes(b"x" * 10)
    with _raises(_tenplex.InvalidArgumentError, "short.bin"):
        eng.restore([(str(short), 0, 16, dst.data_ptr())])
    with _raises(_tenplex.InvalidArgumentError, "short.bin"):
        eng.restore([(str(short), 8, 4, dst.data_ptr())])
    with _raises(_tenplex.Error, "missing.bin"):
        eng.commit([(dst.data_ptr(), missing, 0, 16)])


# ---- restore_files / commit_files on the CPU backend ------------------------------------


def test_restore_files_cpu(tmp_path: Path) -> None:
    for mode in ("staged", "registered", "auto"):
        fresh_cpu_engine(mode=mode)
        entries = make_files(tmp_path, count=40, seed=11)
        got = tdev.restore_files(entries, "cpu")
        assert list(got) == [e[0] for e in entries]
        for name, dtype, shape, path in entries:
            t = got[name]
            assert t.device.type == "cpu" and t.is_contiguous()
            want = torch.empty(shape, dtype=dtype) if t.numel() == 0 else ref_read(path, dtype, shape)
            assert same(t, want), f"{mode}: {name} {dtype} {shape}"


def test_commit_files_cpu(tmp_path: Path) -> None:
    fresh_cpu_engine()
    tensors = state(5)
    tensors["transposed"] = torch.randn(40, 70).t()  # not contiguous
    tensors["bf16.odd"] = torch.randn(CHUNK + 1).to(torch.bfloat16)
    entries, tails = [], {}
    for name, t in tensors.items():
        path = tmp_path / f"{name}.bin"
        tail = bytes([0xAB]) * 13  # past the tensor: never written
        path.write_bytes(b"\0" * (t.numel() * t.element_size()) + tail)
        tails[name] = tail
        entries.append((name, t, str(path)))
    tdev.commit_files(entries)
    for name, t, path in entries:
        data = Path(path).read_bytes()
        n = t.numel() * t.element_size()
        assert data[:n] == raw_bytes(t) and data[n:] == tails[name], name


def test_zero_size_without_engine(tmp_path: Path) -> None:
    got = tdev.restore_files(
        [("e", torch.float32, [0, 5], str(tmp_path / "none")), ("f", torch.int8, [3, 0], "")], "cpu"
    )
    assert got["e"].shape == (0, 5) and got["f"].shape == (3, 0) and got["f"].dtype == torch.int8
    tdev.commit_files([("e", torch.zeros(0), str(tmp_path / "none"))])
    assert not (tmp_path / "none").exists()


def test_errors_name_tensor_and_file(tmp_path: Path) -> None:
    short = tmp_path / "short.bin"
    short.write_bytes(b"\1" * 15)
    with _raises(_tenplex.NotFoundError, "missing.bin"):
        tdev.restore_files([("w", torch.float32, [4], str(tmp_path / "missing.bin"))], "cpu")
    with _raises(_tenplex.InvalidArgumentError, "short.bin"):
        tdev.restore_files([("ok", torch.uint8, [15], str(short)), ("w", torch.float32, [4], str(short))], "cpu")
    with _raises(_tenplex.InvalidArgumentError, "short.bin"):
        tdev.commit_files([("w", torch.ones(4), str(short))])
    with _raises(_tenplex.NotFoundError, "missing.bin"):
        tdev.commit_files([("w", torch.ones(4), str(tmp_path / "missing.bin"))])
    assert short.read_bytes() == b"\1" * 15
    with _raises(ValueError, "meta"):
        tdev.restore_files([("w", torch.float32, [4], str(short))], "meta")


# ---- the store ------------------------------------------------------------------------


def saved_store(seed: int = 1, device: str = "cpu", **attach: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    st = tenplex.attach(**attach)
    want = state(seed, device)
    v = st.begin("job", info={"config": "dp=1", "step": 3})
    st.save_state("job", v, 0, want)
    st.commit("job", v)
    return st, want


def test_load_state_cpu_device() -> None:
    fresh_cpu_engine()
    st, want = saved_store()
    mapped = st.load_state("job", 0)
    copied = st.load_state("job", 0, device="cpu")
    assert sorted(mapped) == sorted(copied) == sorted(want)
    for k in want:
        assert same(copied[k], mapped[k]) and same(copied[k], want[k]), k
    # private copies: writing to one changes neither the store nor a second load
    copied["big"].add_(1)
    assert same(st.load_state("job", 0, device="cpu")["big"], want["big"])
    # attach(device=) is load_state's default
    st2 = tenplex.attach(device="cpu")
    v = st2.begin("j")
    st2.save_state("j", v, 0, want)
    st2.commit("j", v)
    got = st2.load_state("j", 0)
    assert all(same(got[k], want[k]) for k in want)
    with _raises(_tenplex.NotFoundError, "rank 4"):
        st.load_state("job", 4, device="cpu")


def test_save_state_async_snapshot() -> None:
    """The version holds the state at start(); updates after it never leak in."""
    fresh_cpu_engine()
    st = tenplex.attach()
    live = state(2)
    before = {k: t.clone() for k, t in live.items()}
    v = st.begin("job", info={"step": 1})
    ac = st.save_state_async("job", v, 0, live)
    for t in live.values():
        if t.numel() and t.dtype != torch.bool:
            t.add_(1)
    ac.wait()
    st.commit("job", v)
    got = st.load_state("job", 0)
    assert sorted(got) == sorted(before)
    for k in before:
        assert same(got[k], before[k]), k
    # a second one: the same AsyncCommit, waits for the first
    v2 = st.begin("job", info={"step": 2})
    assert st.save_state_async("job", v2, 0, live) is ac
    ac.wait()
    st.commit("job", v2)
    assert same(st.load_state("job", 0)["big"], live["big"])
    with _raises(_tenplex.InvalidArgumentError, "'n'"):
        st.save_state_async("job", st.begin("job"), 0, {"n": 3})


class Gate:
    """A write_fn that blocks until released, then commits its snapshot into files."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files, self.go, self.entered = files, threading.Event(), threading.Event()
        self.order: list[str] = []

    def __call__(self, snap: dict[str, torch.Tensor]) -> int:
        self.entered.set()
        assert self.go.wait(30)
        tdev.commit_files([(k, t, self.files[k]) for k, t in snap.items()])
        self.order.append(",".join(sorted(snap)))
        return len(snap)


def _files_for(tmp_path: Path, tensors: dict[str, torch.Tensor]) -> dict[str, str]:
    files = {}
    for k, t in tensors.items():
        p = tmp_path / f"{k}.bin"
        p.write_bytes(b"\0" * (t.numel() * t.element_size()))
        files[k] = str(p)
    return files


def check_async_commit(tmp_path: Path, device: str) -> None:
    tensors = {k: v for k, v in state(4, device).items() if v.dtype != torch.bool}
    want = {k: raw_bytes(t) for k, t in tensors.items()}
    gate = Gate(_files_for(tmp_path, tensors))
    ac = tdev.AsyncCommit()
    assert ac.done() and ac.wait() is None
    ac.start(tensors, gate)
    assert gate.entered.wait(30) and not ac.done()
    for t in tensors.values():  # the next step's in-place updates
        t.mul_(3).add_(1)
    gate.go.set()
    assert ac.wait() == len(tensors) and ac.done()
    for k, path in gate.files.items():
        assert Path(path).read_bytes() == want[k], k

    # a failing write: wait() raises its error; an uncollected failure stops the next start()
    def boom(snap: dict[str, torch.Tensor]) -> None:
        raise OSError("disk on fire")

    ac.start(tensors, boom)
    with _raises(OSError, "disk on fire"):
        ac.wait()
    ac.start(tensors, boom)
    with _raises(RuntimeError, "previous asynchronous commit failed"):
        ac.start(tensors, gate)
    # start() while one is in flight waits for it: writes in order
    slow = Gate(gate.files)
    ac.start({"big": tensors["big"]}, slow)
    assert slow.entered.wait(30)
    threading.Timer(0.2, slow.go.set).start()
    ac.start(tensors, gate)  # blocks until slow's write is done
    assert slow.order == ["big"]
    ac.wait()
    assert len(gate.order) == 2


def test_async_commit_cpu(tmp_path: Path) -> None:
    fresh_cpu_engine()
    check_async_commit(tmp_path, "cpu")


def test_async_commit_out_of_memory_falls_back(tmp_path: Path) -> None:
    """Without device memory for the snapshot: a blocking copy to host memory, logged."""
    fresh_cpu_engine()
    tensors = {"w": torch.randn(CHUNK + 3), "h": torch.randn(5).to(torch.bfloat16)}
    want = {k: raw_bytes(t) for k, t in tensors.items()}
    files = _files_for(tmp_path, tensors)
    rec = Records()
    logging.getLogger("tenplex.device").addHandler(rec)
    original = torch.Tensor.clone

    def no_room(self: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    torch.Tensor.clone = no_room
    try:
        ac = tdev.AsyncCommit()
        ac.start(tensors, lambda snap: tdev.commit_files([(k, t, files[k]) for k, t in snap.items()]))
    finally:
        torch.Tensor.clone = original
        logging.getLogger("tenplex.device").removeHandler(rec)
    for t in tensors.values():
        t.add_(1)
    ac.wait()
    assert not ac.on_device
    assert any(r.levelno == logging.WARNING and "no device memory" in r.getMessage() for r in rec.records)
    for k, path in files.items():
        assert Path(path).read_bytes() == want[k], k


# ---- hand-off ---------------------------------------------------------------------------


def make_handoff(tmp_path: Path, tensors: dict[str, torch.Tensor], rank: int = 0) -> dict[str, Any]:
    """A hand-off whose rank `rank` has `tensors` in files (written by the reference)."""
    specs = []
    for k, t in tensors.items():
        p = tmp_path / f"h-{k}"
        p.write_bytes(raw_bytes(t))
        specs.append({"name": k, "dtype": NAME_OF[t.dtype], "shape": list(t.shape), "file": str(p)})
    return {"config": "tp=1", "ranks": [{"rank": rank, "tensors": specs}]}


def test_handoff_cpu_device(tmp_path: Path) -> None:
    fresh_cpu_engine()
    tensors = state(6)
    h = make_handoff(tmp_path, tensors)
    plain = handoff.read_rank(h, 0)
    on = handoff.read_rank(h, 0, device="cpu")
    assert sorted(plain) == sorted(on) == sorted(tensors)
    for k in tensors:
        assert same(on[k], plain[k]) and same(on[k], tensors[k]), k
    Path(h["ranks"][0]["tensors"][0]["file"]).write_bytes(b"\0" * 3)
    with _raises(handoff.HandoffError, "needs"):
        handoff.read_rank(h, 0, device="cpu")


# ---- CUDA: the same against the CPU reference --------------------------------------------


@cuda_only
def test_cuda_engine() -> None:
    assert _tenplex.cuda_built(), "the module was built without the CUDA backend"
    assert tdev.engine("cuda").backend == "cuda"
    assert tdev.engine("cuda") is tdev.engine(f"cuda:{torch.cuda.current_device()}")


@cuda_only
def test_cuda_restore_files(tmp_path: Path) -> None:
    for mode in ("registered", "staged"):
        tdev.configure("cuda", chunk_bytes=CHUNK * 16, mode=mode)
        entries = make_files(tmp_path, count=40, seed=13)
        rec = Records()
        logging.getLogger("tenplex.device").addHandler(rec)
        try:
            got = tdev.restore_files(entries, "cuda")
        finally:
            logging.getLogger("tenplex.device").removeHandler(rec)
        for name, dtype, shape, path in entries:
            assert got[name].is_cuda
            want = torch.empty(shape, dtype=dtype) if got[name].numel() == 0 else ref_read(path, dtype, shape)
            assert same(got[name], want), f"{mode}: {name}"
        for r in rec.records:
            log.info("cuda restore (%s): %s", mode, r.getMessage())
    tdev.configure("cuda")
    big = tmp_path / "big.bin"
    ref = torch.randn(64 << 20 >> 2)  # 64 MiB: many default-sized chunks
    big.write_bytes(raw_bytes(ref))
    assert same(tdev.restore_files([("big", torch.float32, [ref.numel()], str(big))], "cuda")["big"], ref)


@cuda_only
def test_cuda_commit_files(tmp_path: Path) -> None:
    tdev.configure("cuda", chunk_bytes=CHUNK * 16)
    tensors = state(8, "cuda")
    tensors["transposed"] = torch.randn(40, 70, device="cuda").t()
    tensors["computed"] = torch.randn(1 << 20, device="cuda").mul(2).add(1)  # queued kernels: ordered by the sync
    files = _files_for(tmp_path, tensors)
    tdev.commit_files([(k, t, files[k]) for k, t in tensors.items()])
    for k, t in tensors.items():
        assert Path(files[k]).read_bytes() == raw_bytes(t), k
    with _raises(_tenplex.InvalidArgumentError, "short.bin"):
        short = tmp_path / "short.bin"
        short.write_bytes(b"x")
        tdev.commit_files([("w", tensors["big"], str(short))])
    tdev.configure("cuda")


@cuda_only
def test_cuda_store(tmp_path: Path) -> None:
    tdev.configure("cuda")
    st, want = saved_store(seed=9, device="cuda")  # save_state from the device
    mapped = st.load_state("job", 0)
    on = st.load_state("job", 0, device="cuda")
    for k in want:
        assert on[k].is_cuda and same(on[k], mapped[k]) and same(on[k], want[k]), k
    st2 = tenplex.attach(device="cuda:0")
    v = st2.begin("j")
    st2.save_state("j", v, 0, mapped)
    st2.commit("j", v)
    assert all(t.is_cuda for t in st2.load_state("j", 0).values())
    # the async path from the device: snapshot semantics with kernels right after start()
    live = state(10, "cuda")
    before = {k: raw_bytes(t) for k, t in live.items()}
    v = st.begin("job", info={"step": 4})
    ac = st.save_state_async("job", v, 0, live)
    for t in live.values():
        if t.numel() and t.dtype != torch.bool:
            t.mul_(7).add_(3)
    ac.wait()
    st.commit("job", v)
    got = st.load_state("job", 0)
    for k in before:
        assert raw_bytes(got[k]) == before[k], k


@cuda_only
def test_cuda_async_commit(tmp_path: Path) -> None:
    tdev.configure("cuda")
    check_async_commit(tmp_path, "cuda")


@cuda_only
def test_cuda_handoff(tmp_path: Path) -> None:
    tdev.configure("cuda")
    tensors = state(12)
    h = make_handoff(tmp_path, tensors)
    on = handoff.read_rank(h, 0, device="cuda")
    for k in tensors:
        assert on[k].is_cuda and same(on[k], tensors[k]), k
    new = {k: (t.float().add(1).to(t.dtype) if t.dtype != torch.bool else ~t) for k, t in on.items()}
    handoff.write_rank(h, 0, list(new.items()))
    back = handoff.read_rank(h, 0)
    for k in tensors:
        assert same(back[k], new[k]), k


if __name__ == "__main__":
    sys.exit(device_testing.main(__file__, globals()))
