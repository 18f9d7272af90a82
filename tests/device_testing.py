#!/usr/bin/env python3
"""What tests/device_test.py and tests/device_run_test.py share (a test-only module: no tests).

The reference they check GPU-resident state against (tenplex.device, issue 30): plain file
reads and writes (open/read/pwrite, torch.from_file), files of random bytes in many dtypes
(bf16 too) with sizes around the engine's chunk boundaries (chunk_bytes 4096: 4095/4096/4097
bytes, and a few MB) and zero-size tensors, a model-like state; `cuda_only`, `_raises`, and
`main`, which runs a test file under pytest or, where pytest is absent (GPU machines may lack
it), a small runner:

    if __name__ == "__main__":
        sys.exit(device_testing.main(__file__, globals()))

`--cuda` runs only the file's CUDA tests and fails when no CUDA device is usable.
"""

import inspect
import logging
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402

from tenplex import device as tdev  # noqa: E402
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


def ref_read(path: str, dtype: torch.dtype, shape: list[int], offset: int = 0) -> torch.Tensor:
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
SIZES_BYTES = [1, 7, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK - 2, 2 * CHUNK + 2, 3 * CHUNK, (3 << 20) + 8, (5 << 20) + 3]
DTYPE_CYCLE = [
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.int64,
    torch.uint8,
    torch.int32,
    torch.float64,
    torch.int8,
    torch.int16,
    torch.bool,
]


def make_files(directory: Path, count: int = 40, seed: int = 7) -> list[tuple[str, torch.dtype, list[int], str]]:
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


def state(seed: int, device: str = "cpu") -> dict[str, torch.Tensor]:
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
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def fresh_cpu_engine(**options: Any) -> Any:
    """The CPU engine with small chunks (every tensor above 4 KiB spans several)."""
    return tdev.configure("cpu", chunk_bytes=CHUNK, slots=2, threads=3, **options)


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


def _run_without_pytest(test_globals: dict[str, Any], only_cuda: bool) -> int:
    tests = [(n, f) for n, f in test_globals.items() if n.startswith("test_") and callable(f)]
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


def main(test_file: str, test_globals: dict[str, Any]) -> int:
    """Runs the tests of `test_file` (its globals: `test_globals`) under pytest, or the small
    runner without it; `--cuda` in sys.argv: only the CUDA tests, 1 without a CUDA device."""
    logging.basicConfig(level=logging.INFO)
    cuda = "--cuda" in sys.argv[1:]
    if cuda and not HAVE_CUDA:
        print(f"{os.path.basename(test_file)} --cuda: torch sees no CUDA device", file=sys.stderr)
        return 1
    if pytest is None:
        return _run_without_pytest(test_globals, cuda)
    args = [os.path.abspath(test_file), "-q", "-p", "no:cacheprovider", "-o", "log_cli=true", "--log-cli-level=INFO"]
    return int(pytest.main(args + (["-k", "cuda"] if cuda else [])))
