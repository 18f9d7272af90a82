#!/usr/bin/env python3
"""GPU-resident state from Python (tenplex.device, issue 30) against an independent reference.

  device_test.py            pytest (ctest device_python): the CPU backend of the copy engine
                            (the CUDA tests skip without a GPU)
  device_test.py --cuda     only the CUDA tests, each against the CPU reference (GPU machines;
                            fails when no CUDA device is usable)

The reference is plain file reads and writes (open/read/pwrite, torch.from_file): bytes
equal for many tensors of mixed dtypes (bf16 too), sizes around the engine's chunk
boundaries (chunk_bytes 4096 with 4095/4096/4097-byte tensors, and a few MB), zero-size
tensors, errors naming the file; Store.load_state(device=) against load_state();
AsyncCommit's snapshot semantics (an in-place update after start() never reaches the
written bytes); hand-off read_rank/write_rank with a device; a warm worker's kept state
(handoff.KeptState: what a next version links unchanged is reused, the rest read) and
`tenplex run --warm` of examples/gpt keeping tensors with the static run's losses. Runs without pytest too (a
small runner below), for GPU machines that lack it.
"""
import inspect
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402

import tenplex  # noqa: E402
from tenplex import _tenplex  # noqa: E402
from tenplex import device as tdev  # noqa: E402
from tenplex import handoff  # noqa: E402
from tenplex.safetensors import DTYPES  # noqa: E402

try:
    import pytest
except ImportError:  # the runner at the end
    pytest = None

log = logging.getLogger("device_test")
HAVE_CUDA = torch.cuda.is_available()
CHUNK = 4096
NAME_OF = {t: n for n, (t, _) in DTYPES.items()}


def cuda_only(fn: Callable) -> Callable:
    """Marks a test that needs a CUDA device (skipped without one; `--cuda` runs only these)."""
    fn.cuda_only = True
    if pytest is not None:
        return pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device")(fn)
    return fn


# ---- the reference --------------------------------------------------------------------


def ref_read(path: str, dtype: torch.dtype, shape: List[int], offset: int = 0) -> torch.Tensor:
    """The tensor of the bytes at `offset` of `path`, read with plain reads."""
    n = torch.empty(shape, dtype=dtype).numel() * torch.empty(0, dtype=dtype).element_size()
    with open(path, "rb") as f:
        f.seek(offset)
        raw = bytearray(f.read(n))
    assert len(raw) == n, f"{path}: short read"
    if n == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).view(shape)


def raw_bytes(t: torch.Tensor) -> bytes:
    """The tensor's bytes in row-major order (through host memory)."""
    t = t.detach().to("cpu").contiguous()
    if t.numel() == 0:
        return b""
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Dtype, shape and bytes equal (NaN payloads of random bytes included)."""
    return a.dtype == b.dtype and list(a.shape) == list(b.shape) and raw_bytes(a) == raw_bytes(b)


# Sizes in bytes around the chunk boundary, and larger; each in a dtype whose size divides it.
SIZES_BYTES = [1, 7, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK - 2, 2 * CHUNK + 2, 3 * CHUNK, (3 << 20) + 8,
               (5 << 20) + 3]
DTYPE_CYCLE = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8, torch.int32, torch.float64,
               torch.int8, torch.int16, torch.bool]


def make_files(directory: Path, count: int = 40, seed: int = 7) -> List[Tuple[str, torch.dtype, List[int], str]]:
    """Files of random bytes and the restore entries (name, dtype, shape, file) describing
    them: every size of SIZES_BYTES in the dtypes that fit it, plus zero-size tensors."""
    g = torch.Generator().manual_seed(seed)
    entries = []
    i = 0
    while len(entries) < count:
        nbytes = SIZES_BYTES[i % len(SIZES_BYTES)]
        dtype = DTYPE_CYCLE[i % len(DTYPE_CYCLE)]
        size = torch.empty(0, dtype=dtype).element_size()
        n = max(1, nbytes // size)
        shape = [n] if i % 3 else [1, n] if n % 2 else [2, n // 2]
        path = directory / f"t{i:03d}.bin"
        data = torch.randint(0, 256, (n * size + (i % 5),), dtype=torch.uint8, generator=g)  # some files longer
        if dtype == torch.bool:
            data = data % 2
        path.write_bytes(data.numpy().tobytes())
        entries.append((f"layer{i}.w", dtype, shape, str(path)))
        i += 1
    entries.append(("empty.a", torch.float32, [0, 3], str(directory / "absent-a")))
    entries.append(("empty.b", torch.bfloat16, [0], ""))
    return entries


def state(seed: int, device: str = "cpu") -> Dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {
        "decoder.layers.0.mlp.linear_fc1.weight": torch.randn(64, 33, generator=g),
        "embedding.word_embeddings.weight": torch.randn(257, 16, generator=g).to(torch.bfloat16),
        "optimizer.exp_avg.x": torch.randn(CHUNK // 2 + 1, generator=g).to(torch.float16),
        "counts": torch.arange(1025, dtype=torch.int64),
        "mask": torch.rand(CHUNK + 1, generator=g) > 0.5,
        "big": torch.randn(300, 1024, generator=g),
        "empty": torch.zeros(0, 3),
    }
    return {k: v.to(device) for k, v in out.items()}


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: List[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def fresh_cpu_engine(**options: Any) -> Any:
    """The CPU engine with small chunks (every tensor above 4 KiB spans several)."""
    return tdev.configure("cpu", chunk_bytes=CHUNK, slots=2, threads=3, **options)


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
    want[11:11 + src.numel()] = raw_bytes(src)
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
    got = tdev.restore_files([("e", torch.float32, [0, 5], str(tmp_path / "none")), ("f", torch.int8, [3, 0], "")],
                             "cpu")
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


def saved_store(seed: int = 1, device: str = "cpu", **attach: Any) -> Tuple[Any, Dict[str, torch.Tensor]]:
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

    def __init__(self, files: Dict[str, str]) -> None:
        self.files, self.go, self.entered = files, threading.Event(), threading.Event()
        self.order: List[str] = []

    def __call__(self, snap: Dict[str, torch.Tensor]) -> int:
        self.entered.set()
        assert self.go.wait(30)
        tdev.commit_files([(k, t, self.files[k]) for k, t in snap.items()])
        self.order.append(",".join(sorted(snap)))
        return len(snap)


def _files_for(tmp_path: Path, tensors: Dict[str, torch.Tensor]) -> Dict[str, str]:
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
    def boom(snap: Dict[str, torch.Tensor]) -> None:
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


def make_handoff(tmp_path: Path, tensors: Dict[str, torch.Tensor], rank: int = 0) -> Dict[str, Any]:
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


# ---- tenplex.elastic.Job(async_commit=True) -----------------------------------------------


def check_job_async(device: str) -> None:
    """A one-rank elastic job over a store daemon: periodic commits in the background
    (step_done), each version equal to the state at its step although the training loop
    updated the tensors in place meanwhile; restore(device=) brings the last one back."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import socket

    import torch.distributed as dist
    from daemons import Daemon
    from tenplex import elastic

    daemon = Daemon(tenplex_bin())
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TENPLEX_STORE_URL": daemon.url}
    saved_env = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        job = elastic.Job("dev", {"1": "tp=1"}, commit_every=2, async_commit=True)
        job.init_process_group("gloo", timeout=60)
        assert job.restore(device=device) is None
        live = {k: v for k, v in state(14, device).items() if v.dtype != torch.bool}
        st = tenplex.attach(url=daemon.url)
        at_step: Dict[int, Dict[str, bytes]] = {}
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


def train_losses(tmp_path: Path, config: str, device: str, extra: List[str]) -> List[float]:
    """Losses of examples/gpt/launch.py running train.py in `config` on `device`."""
    model = tmp_path / "model.json"
    if not model.exists():
        subprocess.run([tenplex_bin(), "model", "gpt", "-o", str(model), "--num-layers", "2", "--hidden-size", "64",
                        "--num-attention-heads", "4", "--vocab-size", "250", "--max-position-embeddings", "64"],
                       check=True)
    logf = tmp_path / f"{config}-{device}.jsonl"
    if logf.exists():
        logf.unlink()
    cmd = [sys.executable, os.path.join(ROOT, "examples", "gpt", "launch.py"), "--config", config, "--model",
           str(model), "--steps", "4", "--seq-length", "32", "--global-batch-size", "4", "--micro-batch-size", "2",
           "--timeout", "120", "--device", device, "--log", str(logf)] + extra
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


def warm_spec(name: str, dtype: torch.dtype, shape: List[int], path: Path) -> Dict[str, Any]:
    return {"name": name, "dtype": NAME_OF[dtype], "shape": list(shape), "file": str(path)}


def warm_ref(s: Dict[str, Any]) -> torch.Tensor:
    """A plain read of a hand-off tensor spec's file (zero-size tensors have none)."""
    dtype = DTYPES[s["dtype"]][0]
    if 0 in s["shape"]:
        return torch.empty(s["shape"], dtype=dtype)
    return ref_read(s["file"], dtype, s["shape"])


def warm_stop_state(device: str) -> Dict[str, torch.Tensor]:
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


def warm_write_stop(tmp: Path, tensors: Dict[str, torch.Tensor], rank: int = 0) -> Dict[str, Any]:
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


def warm_next_version(tmp: Path, stop: Dict[str, torch.Tensor], rank: int = 1) -> Tuple[Dict[str, Any], List[str]]:
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


def warm_run(tmp: Path, name: str, schedule: List[Dict[str, Any]], model: Path, extra: List[str],
        device: str) -> List[Dict[str, Any]]:
    """The log lines of `tenplex run` of examples/gpt/train.py."""
    sched = tmp / f"{name}.json"
    sched.write_text(json.dumps(schedule))
    logf = tmp / f"{name}.jsonl"
    cmd = [tenplex_bin(), "run", "--schedule", str(sched), "--log", str(logf), "--work-dir", str(tmp / name),
           "--hang-seconds", "120"] + extra
    cmd += ["--", sys.executable, os.path.join(ROOT, "examples", "gpt", "train.py"), "--model", str(model),
            "--global-batch-size", "8", "--micro-batch-size", "2", "--seq-length", "32", "--device", device]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise AssertionError(f"tenplex run {name} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return [json.loads(line) for line in logf.read_text().splitlines()]


def check_warm_run(tmp: Path, device: str) -> None:
    model = tmp / "model.json"
    subprocess.run([tenplex_bin(), "model", "gpt", "--num-layers", "2", "--hidden-size", "32",
                    "--num-attention-heads", "4", "--vocab-size", "128", "--max-position-embeddings", "32",
                    "-o", str(model)], check=True)
    n = 6
    static = warm_run(tmp, "static", [{"step": 0, "config": "tp=1"}, {"step": n, "stop": True}], model, [], device)
    warm = warm_run(tmp, "warm", [{"step": 0, "config": "dp=2"}, {"step": 2, "config": "pp=2"},
                             {"step": 4, "config": "tp=2"}, {"step": n, "stop": True}], model, ["--warm"], device)
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


# ---- helpers and the runner ---------------------------------------------------------------


class _raises:
    """with _raises(Exc, "text"): the block raises Exc with text in its message."""

    def __init__(self, exc: type, text: str) -> None:
        self.exc, self.text = exc, text

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: Any, value: Any, tb: Any) -> bool:
        if typ is None:
            raise AssertionError(f"expected {self.exc.__name__} ({self.text!r}), nothing raised")
        if not issubclass(typ, self.exc) or self.text not in str(value):
            raise AssertionError(f"expected {self.exc.__name__} with {self.text!r}, got {typ.__name__}: {value}")
        log.info("raised as expected: %s: %s", typ.__name__, value)
        return True


def _run_without_pytest(only_cuda: bool) -> int:
    tests = [(n, f) for n, f in globals().items() if n.startswith("test_") and callable(f)]
    failed = 0
    for name, fn in tests:
        if only_cuda and not getattr(fn, "cuda_only", False):
            continue
        if getattr(fn, "cuda_only", False) and not HAVE_CUDA:
            print(f"SKIP {name} (no CUDA device)", flush=True)
            continue
        tmp = Path(tempfile.mkdtemp(prefix="device-test-"))
        try:
            fn(**({"tmp_path": tmp} if "tmp_path" in inspect.signature(fn).parameters else {}))
            print(f"PASS {name}", flush=True)
        except Exception:  # noqa: BLE001
            failed += 1
            print(f"FAIL {name}\n{traceback.format_exc()}", flush=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    cuda = "--cuda" in sys.argv[1:]
    if cuda and not HAVE_CUDA:
        print("device_test.py --cuda: torch sees no CUDA device", file=sys.stderr)
        sys.exit(1)
    if pytest is None:
        sys.exit(_run_without_pytest(cuda))
    args = [os.path.abspath(__file__), "-q", "-p", "no:cacheprovider", "-o", "log_cli=true", "--log-cli-level=INFO"]
    sys.exit(pytest.main(args + (["-k", "cuda"] if cuda else [])))
