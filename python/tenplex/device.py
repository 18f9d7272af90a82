"""GPU-resident state: store files straight into device tensors and back (issue 30).

The store keeps every tensor of a rank in its own shared-memory file (bytes at offset 0).
Moving them to or from a device goes through the native copy engine
(`tenplex._tenplex.CopyEngine`): it reads the files into pinned (registered or staged)
host buffers in chunks and overlaps the host-to-device copies on several streams, with no
pageable intermediate copy. Its "cpu" backend runs the same chunking and errors into
ordinary host memory, which is what the CPU tests exercise.

    tensors = restore_files([(name, dtype, shape, path), ...], "cuda:0")   # one engine call
    commit_files([(name, tensor, path), ...])                              # the inverse

Ordering with torch: the engine uses its own streams, so before it touches a CUDA tensor
the current torch stream is synchronized (the kernels that produce a tensor to commit, or
that last used the memory a restore is given, are done); when the engine returns, its
copies are complete.

`AsyncCommit` writes a step boundary's state while training goes on: `start()` clones the
tensors on the device (on the current stream, so later in-place updates never reach the
snapshot), records an event, and a background thread waits for that event and writes the
snapshot (the engine releases the GIL). Without room on the device for the snapshot it
copies to host memory instead (blocking) and says so in the log.
"""

import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any, Callable, Optional, Union

import torch

from . import _tenplex

log = logging.getLogger(__name__)

DeviceLike = Union[torch.device, str]
RestoreEntry = tuple[str, torch.dtype, Sequence[int], str]  # (name, dtype, shape, file)
CommitEntry = tuple[str, torch.Tensor, str]  # (name, tensor, file)

_engines: dict[tuple[str, int], Any] = {}
_engines_lock = threading.Lock()
# Set in AsyncCommit's writer thread: its snapshot is ordered by an event already, and
# synchronizing that thread's current stream would only wait for the next steps' kernels.
_ordered = threading.local()


def resolve(device: DeviceLike) -> torch.device:
    """torch.device of `device`, with the index of a bare "cuda" filled in (the current
    device); ValueError for a device kind the engine does not serve."""
    d = torch.device(device)
    if d.type == "cuda":
        return torch.device("cuda", d.index if d.index is not None else torch.cuda.current_device())
    if d.type == "cpu":
        return torch.device("cpu")
    raise ValueError(f"device {device!r}: the copy engine serves cpu and cuda devices only")


def engine(device: DeviceLike) -> Any:
    """The copy engine for `device` (a CopyEngine per backend and device index, made once)."""
    d = resolve(device)
    key = (d.type, d.index or 0)
    with _engines_lock:
        eng = _engines.get(key)
        if eng is None:
            eng = _tenplex.CopyEngine(backend=d.type, device=key[1])
            log.debug("copy engine for %s: backend %s", d, eng.backend)
            _engines[key] = eng
        return eng


def configure(device: DeviceLike, **options: Any) -> Any:
    """Replaces the device's cached engine by one made with `options` (CopyEngine's
    chunk_bytes, slots, streams, threads, mode) and returns it: for tests and benchmarks."""
    d = resolve(device)
    key = (d.type, d.index or 0)
    eng = _tenplex.CopyEngine(backend=d.type, device=key[1], **options)
    with _engines_lock:
        _engines[key] = eng
    return eng


def _on_device(d: torch.device) -> Any:
    """A context where `d` is torch's current CUDA device (the engine's pointers are
    device pointers of the current device); nothing for the CPU."""
    return torch.cuda.device(d) if d.type == "cuda" else _Nothing()


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _sync(d: torch.device) -> None:
    """Orders the engine's copies after the work queued on torch's current stream of `d`."""
    if d.type == "cuda" and not getattr(_ordered, "on", False):
        torch.cuda.current_stream(d).synchronize()


def _report(what: str, d: torch.device, stats: dict[str, Any], count: int) -> None:
    log.debug(
        "%s %d tensors on %s: %d bytes in %.4f s (%.2f GB/s, %s, %d chunks)",
        what,
        count,
        d,
        stats.get("bytes", 0),
        stats.get("seconds", 0.0),
        stats.get("gbps", 0.0),
        stats.get("mode"),
        stats.get("chunks", 0),
    )
    if stats.get("fallback"):
        log.info("%s on %s: registered host memory fell back to staged copies: %s", what, d, stats["fallback"])


def _check_file(name: str, path: str, need: int) -> None:
    """NotFoundError / InvalidArgumentError naming the tensor when `path` cannot hold `need` bytes."""
    try:
        have = os.stat(path).st_size
    except FileNotFoundError:
        raise _tenplex.NotFoundError(f"tensor {name}: file {path} does not exist") from None
    except OSError as e:
        raise _tenplex.InvalidArgumentError(f"tensor {name}: file {path}: {e}") from None
    if have < need:
        raise _tenplex.InvalidArgumentError(f"tensor {name}: file {path} has {have} bytes, needs {need}")


def restore_files(entries: Sequence[RestoreEntry], device: DeviceLike) -> dict[str, torch.Tensor]:
    """{name: tensor on `device`} filled from the files (each tensor's bytes at offset 0 of
    its file) with one engine call; zero-size tensors need no file."""
    d = resolve(device)
    out: dict[str, torch.Tensor] = {}
    items: list[tuple[str, int, int, int]] = []
    for name, dtype, shape, path in entries:
        t = torch.empty(list(shape), dtype=dtype, device=d)
        out[name] = t
        if t.numel() == 0:
            continue
        nbytes = t.numel() * t.element_size()
        _check_file(name, path, nbytes)
        items.append((path, 0, nbytes, t.data_ptr()))
    if items:
        eng = engine(d)
        with _on_device(d):
            _sync(d)  # the memory may have been freed by kernels still queued on the stream
            stats = eng.restore(items)
        _report("restore", d, stats, len(items))
    return out


def commit_files(entries: Sequence[CommitEntry]) -> None:
    """Writes each tensor's bytes at offset 0 of its (allocated, large enough) file: one
    engine call per device the tensors are on. Complete when it returns."""
    by_device: dict[torch.device, list[tuple[int, str, int, int]]] = {}
    keep: list[torch.Tensor] = []  # the contiguous copies live until the engine is done
    for name, t, path in entries:
        if t.numel() == 0:
            continue
        src = t.detach().contiguous()
        keep.append(src)
        nbytes = src.numel() * src.element_size()
        _check_file(name, path, nbytes)
        by_device.setdefault(resolve(src.device), []).append((src.data_ptr(), path, 0, nbytes))
    for d, items in by_device.items():
        eng = engine(d)
        with _on_device(d):
            _sync(d)
            stats = eng.commit(items)
        _report("commit", d, stats, len(items))


def _cuda_devices(tensors: dict[str, torch.Tensor]) -> list[torch.device]:
    return sorted({t.device for t in tensors.values() if t.is_cuda}, key=lambda d: d.index or 0)


def _snapshot(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], bool]:
    """(copies of the tensors at this point of their streams, whether they are on the
    device); copies in host memory, made blocking, when the device has no room for them."""
    try:
        return {k: t.detach().clone(memory_format=torch.contiguous_format) for k, t in tensors.items()}, True
    except torch.cuda.OutOfMemoryError as e:
        log.warning(
            "commit snapshot: no device memory for a copy of the state (%s); copying it to host "
            "memory instead (blocking)",
            str(e).splitlines()[0] if str(e) else "out of memory",
        )
    return {k: t.detach().to("cpu", copy=True) for k, t in tensors.items()}, False


class AsyncCommit:
    """A state write that overlaps the following steps, with snapshot semantics: the
    written bytes are those of the tensors when start() was called. One in flight at a time."""

    def __init__(self) -> None:
        self._thread: Optional[threading.Thread] = None
        self._result: Any = None
        self._error: Optional[BaseException] = None
        self._collected = True
        self.snapshot_seconds = 0.0  # start()'s own time (the training loop's stall)
        self.write_seconds = 0.0  # the background write's
        self.on_device = True  # whether the last snapshot was taken on the device

    def start(self, tensors: dict[str, torch.Tensor], write_fn: Callable[[dict[str, torch.Tensor]], Any]) -> None:
        """Snapshots `tensors` and has write_fn(snapshot) run in a background thread.
        Waits for a commit still in flight first (and raises its error if nobody has)."""
        if self._thread is not None:
            pending = not self._collected
            try:
                self.wait()
            except BaseException as e:
                if pending:
                    raise RuntimeError("the previous asynchronous commit failed") from e
        t0 = time.perf_counter()
        snap, self.on_device = _snapshot(tensors)
        events = []
        for d in _cuda_devices(snap):
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(d))
            events.append(ev)
        self._result, self._error, self._collected = None, None, False
        self._thread = threading.Thread(
            target=self._run, args=(snap, events, write_fn), name="tenplex-commit", daemon=True
        )
        self._thread.start()
        self.snapshot_seconds = time.perf_counter() - t0

    def _run(
        self, snap: dict[str, torch.Tensor], events: list[Any], write_fn: Callable[[dict[str, torch.Tensor]], Any]
    ) -> None:
        t0 = time.perf_counter()
        _ordered.on = True
        try:
            for ev in events:
                ev.synchronize()
            self._result = write_fn(snap)
        except BaseException as e:  # handed to wait()
            self._error = e
        finally:
            _ordered.on = False
            snap.clear()
            self.write_seconds = time.perf_counter() - t0

    def done(self) -> bool:
        """True when no write is in flight (finished, failed or never started)."""
        return self._thread is None or not self._thread.is_alive()

    def wait(self) -> Any:
        """Waits for the write; its write_fn's result, or its exception re-raised."""
        if self._thread is not None:
            self._thread.join()
        self._collected = True
        if self._error is not None:
            raise self._error
        return self._result
