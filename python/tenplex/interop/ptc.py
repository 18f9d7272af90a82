"""Our side of every conversion: reading and writing tenplex checkpoint directories
(spec ptc-layout.md §7) as pieces of global tensors.

The layouts come from the C++ implementation (`tenplex layout --json`, spec §6), so
the pieces used here are exactly those of `tenplex reshard` and the store, including
ZeRO-1 flat optimizer tensors and the tied output embedding.

Every foreign format is a source or a sink of *global boxes*: (global tensor, box,
array with the box's extents). A piece (global box, local box or 1-D flat range) of a
rank file is such a view without a copy (a flat range is reshaped to the box's
extents). Copying between two layouts is the intersection of boxes, so nothing ever
assembles a whole checkpoint in memory:

  Writer.put(tensor, box, array)  copies the array into every target piece it
                                  intersects (every rank file, replicas included);
  Reader.read_into(tensor, box, out)
                                  fills `out` from the distinct source pieces that
                                  intersect the box.

Arrays are raw numpy: BF16 is held as uint16 bits (numpy has no bfloat16).
The writer fills a staging directory `<out>.partial` with rank files sized up front
(zero-filled, so padding is zero) and memory-mapped; `finish()` checks that every
element of every global tensor was written exactly once (or is allowed to stay zero),
then writes `tenplex.json` and renames the directory into place. Any failure removes
the staging directory: no partial output is left behind.
"""

import json
import math
import os
import shutil
import struct
import subprocess
from typing import Any

import numpy as np

from .. import checkpoint as ckpt
from .. import safetensors as st

NP_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": np.uint16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}
DTYPE_SIZE = {k: np.dtype(v).itemsize for k, v in NP_DTYPES.items()}
st_dtype_name = st.dtype_name  # torch dtype -> "F32"


class InteropError(ValueError):
    """Bad input: the message names the file, tensor and rule; exit code 2."""


def to_f32(arr, dtype):
    """A raw array of dtype (safetensors name) as float32."""
    if dtype == "BF16":
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(np.float32)


def volume(box):
    return math.prod(e - b for b, e in box)


def intersect(a, b):
    out = [(max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b)]
    return out if all(b < e for b, e in out) else None


def sub(box, origin):
    """Slices of `box` relative to the begin of `origin`."""
    return tuple(slice(b - o, e - o) for (b, e), (o, _) in zip(box, origin))


def _box(x):
    return [(int(b), int(e)) for b, e in x]


# ----------------------------------------------------------------------------- layouts


def layout(tenplex_bin, model_path, config):
    """The C++ layout (spec §6 JSON) of model_path under config."""
    p = subprocess.run(
        [tenplex_bin, "layout", "--model", model_path, "--config", config, "--json"], capture_output=True, text=True
    )
    if p.returncode != 0:
        raise InteropError(
            p.stderr.strip().removeprefix("tenplex: error: ") or f"tenplex layout failed for config {config}"
        )
    return json.loads(p.stdout)


def global_tensors(model):
    """{global name: (dtype, shape)}: parameters, then optimizer companions (spec §5)."""
    out = {t["path"]: (t["dtype"], list(t["shape"])) for t in model["tensors"]}
    states = list(model.get("optimizer", {}).get("states", []))
    for kind in states + ["fp32_param"]:
        for t in model["tensors"]:
            if kind == "fp32_param" and (not states or t["dtype"] == "F32"):
                continue
            out[f"optimizer.{kind}.{t['path']}"] = ("F32", list(t["shape"]))
    return out


def piece_view(local, piece):
    """(global box, view of `local` with the box's extents) of a piece."""
    g = _box(piece["global"])
    lb = _box(piece["local"])
    if len(g) != len(lb) or any(e - b != ge - gb for (b, e), (gb, ge) in zip(lb, g)):
        # a 1-D flat range (ZeRO-1) of equal volume: row-major over the box
        ((b, e),) = lb
        return g, local.reshape(-1)[b:e].reshape([ge - gb for gb, ge in g])
    return g, local[tuple(slice(b, e) for b, e in lb)]


# ----------------------------------------------------------------------------- reading


def open_rank_file(path, expect):
    """{local name: read-only view} of a rank file (one mapping per file), checked
    against the layout's [(name, dtype, shape)]."""
    entries, _, offset, _ = st.read_header(path)
    have = {name: (dt, shape, b, e) for name, dt, shape, b, e in entries}
    ranges = {}
    for name, dt, shape in expect:
        if name not in have:
            raise InteropError(f"{path}: tensor '{name}' is missing")
        hdt, hshape, b, e = have[name]
        if hdt != dt or list(hshape) != list(shape):
            raise InteropError(f"{path}: tensor '{name}' is {hdt}{hshape}, the layout says {dt}{shape}")
        ranges[name] = (b, e)
    return map_tensors(path, expect, offset, ranges, mode="r")[1]


def rank_expect(rank_layout):
    return [(t["name"], t["dtype"], t["shape"]) for t in rank_layout["tensors"]]


class Reader:
    """Global boxes of a tenplex checkpoint directory (or of any per-rank tensors that
    follow a layout: `open_rank(rank)` returns {local name: array})."""

    def __init__(self, lay, open_rank):
        self.layout = lay
        self._open = open_rank
        self._ranks: dict[int, Any] = {}
        self.info: dict[str, Any] = {}  # a checkpoint directory's info (directory())
        self.model_file = ""  # and its model file
        self.pieces: dict[str, list[Any]] = {}  # global tensor -> [(rank, local name, piece)] distinct global boxes
        seen = set()
        for r in lay["ranks"]:
            for t in r["tensors"]:
                for p in t["pieces"]:
                    key = (p["tensor"], tuple(map(tuple, p["global"])))
                    if key not in seen:
                        seen.add(key)
                        self.pieces.setdefault(p["tensor"], []).append((r["rank"], t["name"], p))

    @classmethod
    def directory(cls, tenplex_bin, path):
        info = ckpt.read_info(path)
        model_file = _model_file(info["model"])
        lay = layout(tenplex_bin, model_file, info["config"])
        by_rank = {r["rank"]: r for r in lay["ranks"]}
        reader = cls(
            lay, lambda rank: open_rank_file(os.path.join(path, ckpt.rank_file(rank)), rank_expect(by_rank[rank]))
        )
        reader.info = info
        reader.model_file = model_file
        return reader

    def rank(self, r):
        if r not in self._ranks:
            self._ranks[r] = self._open(r)
        return self._ranks[r]

    def views(self, tensor):
        """[(global box, view)] of the distinct pieces of a global tensor."""
        out = []
        for rank, name, p in self.pieces.get(tensor, []):
            out.append(piece_view(self.rank(rank)[name], p))
        return out

    def read_into(self, tensor, box, out):
        """Fills out (the box's extents) from the pieces intersecting box."""
        covered = 0
        for g, v in self.views(tensor):
            i = intersect(g, box)
            if i:
                out[sub(i, box)] = v[sub(i, g)]
                covered += volume(i)
        if covered != volume(box):
            raise InteropError(f"{tensor}: the checkpoint covers {covered} of {volume(box)} elements")
        return out

    def tensor(self, tensor, dtype, shape):
        return self.read_into(tensor, [(0, n) for n in shape], np.empty(shape, NP_DTYPES[dtype]))


def _model_file(model):
    """tenplex.json's "model" as a temporary file (the layout command reads a file);
    removed by cleanup()."""
    import tempfile

    fd, path = tempfile.mkstemp(prefix="tenplex-model-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(model, f)
    _TEMP_FILES.append(path)
    return path


_TEMP_FILES: list[str] = []


def cleanup():
    for p in _TEMP_FILES:
        try:
            os.unlink(p)
        except OSError:
            pass
    _TEMP_FILES.clear()


# ----------------------------------------------------------------------------- writing


def create_safetensors(path, entries, metadata=None):
    """Creates a safetensors file of [(name, dtype, shape)] sized up front (zero-filled)
    and returns (data offset, {name: (begin, end)})."""
    header, ranges, off = {}, {}, 0
    for name, dt, shape in entries:
        n = math.prod(shape) * DTYPE_SIZE[dt]
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + n]}
        ranges[name] = (off, off + n)
        off += n
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.truncate(8 + len(text) + off)
    return 8 + len(text), ranges


def map_tensors(path, entries, offset, ranges, mode="r+"):
    """(mapping, {name: view}) of a safetensors file: one mapping, a view per tensor."""
    mm = np.memmap(path, dtype=np.uint8, mode=mode)
    out = {}
    for name, dt, shape in entries:
        b, e = ranges[name]
        out[name] = mm[offset + b : offset + e].view(NP_DTYPES[dt]).reshape(shape)
    return mm, out


def check_target_dir(out):
    """An export target must not exist or be an empty directory (nothing is overwritten)."""
    try:
        ckpt.check_target(out)
    except ckpt.CheckpointError as e:
        raise InteropError(str(e)) from None


def move_into_place(stage, out):
    """Renames a finished staging directory onto out (absent or empty), as checkpoints do."""
    try:
        ckpt.move_into_place(stage, out)
    except ckpt.CheckpointError as e:
        raise InteropError(str(e)) from None


class Writer:
    """A new tenplex checkpoint directory for (model, layout), filled by put()."""

    def __init__(self, out, model, lay, extra=None):
        check_target_dir(out)
        self.out, self.model, self.layout = out, model, lay
        self.extra = dict(extra or {})
        self.stage = ckpt.staging_dir(out)
        shutil.rmtree(self.stage, ignore_errors=True)
        os.makedirs(self.stage)
        self.globals = global_tensors(model)
        self.targets: dict[str, list[Any]] = {}  # global tensor -> [(global box, view)]
        self.files = []
        self.written = {}  # global tensor -> set of boxes put
        self.covered = {}  # global tensor -> elements put
        try:
            for r in lay["ranks"]:
                path = os.path.join(self.stage, ckpt.rank_file(r["rank"]))
                expect = rank_expect(r)
                offset, ranges = create_safetensors(path, expect)
                mm, arrays = map_tensors(path, expect, offset, ranges)
                self.files.append((path, mm))
                for t in r["tensors"]:
                    for p in t["pieces"]:
                        self.targets.setdefault(p["tensor"], []).append(piece_view(arrays[t["name"]], p))
        except BaseException:
            self.abort()
            raise

    def put(self, tensor, box, arr, dtype=None):
        """Copies arr (box's extents, raw dtype of the tensor) into every target piece."""
        if tensor not in self.globals:
            raise InteropError(f"'{tensor}' is not a tensor of the model")
        want_dt, shape = self.globals[tensor]
        if dtype is not None and dtype != want_dt:
            raise InteropError(f"{tensor}: dtype {dtype}, the model says {want_dt}")
        if list(arr.shape) != [e - b for b, e in box]:
            raise InteropError(f"{tensor}: {list(arr.shape)} elements given for box {box}")
        if any(b < 0 or e > n for (b, e), n in zip(box, shape)) or len(box) != len(shape):
            raise InteropError(f"{tensor}: box {box} is outside its shape {shape}")
        key = tuple(box)
        done = self.written.setdefault(tensor, set())
        if key in done:
            return
        done.add(key)
        self.covered[tensor] = self.covered.get(tensor, 0) + volume(box)
        for g, v in self.targets.get(tensor, []):
            i = intersect(g, box)
            if i:
                v[sub(i, g)] = arr[sub(i, box)]

    def put_param(self, tensor, box, arr, dtype=None, derive_fp32=False):
        """put() a parameter and, with derive_fp32, its fp32 master copy (formats that
        carry no optimizer state)."""
        self.put(tensor, box, arr, dtype)
        comp = "optimizer.fp32_param." + tensor
        if derive_fp32 and comp in self.globals:
            self.put(comp, box, to_f32(np.asarray(arr), self.globals[tensor][0]))

    def finish(self, zero_ok=()):
        """Checks coverage, writes tenplex.json last and moves the directory in place.
        Global tensors whose name starts with a prefix in zero_ok may stay unwritten."""
        for name, (_, shape) in self.globals.items():
            got = self.covered.get(name, 0)
            if got == 0 and any(name.startswith(p) for p in zero_ok):
                continue
            if got != math.prod(shape):
                what = "is missing" if got == 0 else f"has {got} of {math.prod(shape)} elements"
                raise InteropError(f"tensor '{name}' {what} in the source")
        for path, mm in self.files:
            mm.flush()
            st.fsync_path(path)
        self.files = []
        info = {"model": self.model, "config": self.layout["config"]}
        info.update(self.extra)
        ckpt.commit(self.out, info, len(self.layout["ranks"]))

    def abort(self):
        self.files = []
        shutil.rmtree(self.stage, ignore_errors=True)
