"""Pure-Python safetensors reader and writer (numpy + torch, no safetensors package).

Format: an 8-byte little-endian header length N, N bytes of JSON
``{"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]}, ...,
"__metadata__": {"key": "value"}}``, then the data section; offsets are relative to
its first byte. Tensors are written back to back in the order given, the header is
padded with spaces to a multiple of 8 bytes (as the C++ writer does).

``save`` writes to a temporary name in the same directory, fsyncs and renames, so a
reader never sees a half-written file. ``load`` checks the header before use: it fits
in the file, every dtype is known, every range lies inside the data section and holds
exactly dtype-size x volume bytes, and no two ranges overlap.
"""

import json
import os
import stat
import struct

import numpy as np
import torch

# safetensors dtype name -> (torch dtype, element size)
DTYPES = {
    "F64": (torch.float64, 8),
    "F32": (torch.float32, 4),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "I64": (torch.int64, 8),
    "I32": (torch.int32, 4),
    "I16": (torch.int16, 2),
    "I8": (torch.int8, 1),
    "U8": (torch.uint8, 1),
    "BOOL": (torch.bool, 1),
}
_NAME_OF = {t: name for name, (t, _) in DTYPES.items()}
MAX_HEADER = 100 << 20


class SafetensorsError(ValueError):
    pass


def dtype_name(t):
    """The safetensors name of a torch dtype ("F32")."""
    if t not in _NAME_OF:
        raise SafetensorsError(f"dtype {t} has no safetensors name")
    return _NAME_OF[t]


def _to_bytes(t):
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def save(path, tensors, metadata=None):
    """Writes ``tensors`` (a dict or a list of (name, tensor) pairs) atomically."""
    items = list(tensors.items()) if isinstance(tensors, dict) else list(tensors)
    header, blobs, offset = {}, [], 0
    for name, t in items:
        if name in header or name == "__metadata__":
            raise SafetensorsError(f"{path}: duplicate or reserved tensor name '{name}'")
        b = _to_bytes(t)
        header[name] = {"dtype": dtype_name(t.dtype), "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    # The canonical header (the same bytes as the C++ writer, io::EncodeSafetensorsHeader):
    # compact JSON, keys sorted by code point, UTF-8 unescaped, padded with spaces.
    text = json.dumps(header, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()
    text += b" " * (-(8 + len(text)) % 8)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for b in blobs:
                f.write(b)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_path(os.path.dirname(os.path.abspath(path)))


def fsync_path(path):
    """fsync of a file or a directory, by its path (a directory: the names in it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_regular(path):
    """Opens a file for reading only if it is a regular file (symbolic links followed, as
    in Hugging Face caches): a FIFO, directory or device is refused instead of blocking,
    and an OSError (a loop of symbolic links, ...) becomes a SafetensorsError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise SafetensorsError(f"{path}: {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SafetensorsError(f"{path}: not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_header(path):
    """Returns (entries, metadata, data_offset, file_size); entries keep file order."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise SafetensorsError(f"{path}: shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER or 8 + n > size:
            raise SafetensorsError(f"{path}: header length {n} does not fit in a file of {size} bytes")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    data_size = size - 8 - n
    entries = []
    for name, ent in header.items():
        try:
            dt, shape, (b, end) = ent["dtype"], ent["shape"], ent["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise SafetensorsError(f"{path}: malformed entry '{name}'") from None
        if dt not in DTYPES:
            raise SafetensorsError(f"{path}: tensor '{name}' has unknown dtype {dt!r}")
        if not all(isinstance(d, int) and d >= 0 for d in shape):
            raise SafetensorsError(f"{path}: tensor '{name}' has a bad shape {shape}")
        want = int(np.prod(shape, dtype=np.int64)) * DTYPES[dt][1]
        if not (isinstance(b, int) and isinstance(end, int) and 0 <= b <= end <= data_size) or end - b != want:
            raise SafetensorsError(
                f"{path}: tensor '{name}' range [{b}, {end}) is not {want} bytes inside a data section of {data_size}"
            )
        entries.append((name, dt, list(shape), b, end))
    entries.sort(key=lambda x: x[3])
    for prev, cur in zip(entries, entries[1:]):
        if cur[3] < prev[4]:
            raise SafetensorsError(f"{path}: tensors '{prev[0]}' and '{cur[0]}' overlap")
    return entries, metadata, 8 + n, size


def load(path, with_metadata=False):
    """Reads a whole file: dict name -> torch tensor (own memory), in file order."""
    entries, metadata, offset, _ = read_header(path)
    with open_regular(path) as f:
        f.seek(offset)
        data = f.read()
    out = {}
    for name, dt, shape, b, e in entries:
        torch_dtype, _ = DTYPES[dt]
        if dt == "BF16":
            arr = np.frombuffer(data, dtype=np.int16, count=(e - b) // 2, offset=b)
            t = torch.from_numpy(arr.copy()).view(torch.bfloat16)
        elif dt == "BOOL":
            t = torch.from_numpy(np.frombuffer(data, dtype=np.bool_, count=e - b, offset=b).copy())
        else:
            np_dtype = torch.empty(0, dtype=torch_dtype).numpy().dtype
            arr = np.frombuffer(data, dtype=np_dtype, count=(e - b) // np_dtype.itemsize, offset=b)
            t = torch.from_numpy(arr.copy())
        out[name] = t.reshape(shape)
    return (out, metadata) if with_metadata else out
