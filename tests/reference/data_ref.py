"""Dataset state without FUSE: the global sample order and a rank's slice of it.

A second, independent implementation of docs/data.md (the C++ one is
src/tenplex/data): the SplitMix64 generator, Lemire's bounded integers, the
Fisher-Yates permutation of each epoch seeded by (seed, epoch), the dropped partial
global batch, the balanced contiguous rank slices, and readers for the index
directories written by `tenplex data index` (JSONL offsets files and Megatron
MMIDIDX indexes). Pure Python (standard library only).

    it = RankIterator("idx", seed=1, global_batch=32, dp=4, rank=1, start_sample=640)
    for step, ids, records in it:      # records: bytes (JSONL line) or token lists
        ...                            # it.position = samples consumed after this step

Command line (the same JSON as `tenplex data batches --json`):

    python3 data.py batches --index DIR --seed S --global-batch B --dp D --rank R \
        --start-sample P --steps N
    python3 data.py read --index DIR --sample N
"""

import json
import mmap
import os
import struct
import sys

MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def mix64(z):
    """The SplitMix64 output function (a bijection of 64-bit words)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


class SplitMix64:
    def __init__(self, state):
        self.state = state & MASK64

    def next(self):
        self.state = (self.state + GAMMA) & MASK64
        return mix64(self.state)

    def below(self, n):
        """Uniform in [0, n): Lemire's nearly divisionless method."""
        m = self.next() * n
        low = m & MASK64
        if low < n:
            threshold = ((1 << 64) - n) % n
            while low < threshold:
                m = self.next() * n
                low = m & MASK64
        return m >> 64


def epoch_state(seed, epoch):
    return mix64((mix64(seed & MASK64) ^ epoch) & MASK64)


def permutation(n, seed, epoch):
    """The order of epoch `epoch`: Fisher-Yates over [0, n)."""
    rng = SplitMix64(epoch_state(seed, epoch))
    a = list(range(n))
    below = rng.below
    for i in range(n - 1, 0, -1):
        j = below(i + 1)
        a[i], a[j] = a[j], a[i]
    return a


def weighted_sizes(total, weights):
    """Spec §9 largest-remainder apportionment with exact fractions: quotas
    total * w / W, floors, then one unit each to the ranks with the largest fractional
    parts, ties to the lower rank."""
    from fractions import Fraction

    W = sum(weights)
    quotas = [Fraction(total * w, W) for w in weights]
    sizes = [q.numerator // q.denominator for q in quotas]
    by_rest = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - sizes[i]), i))
    for i in by_rest[: total - sum(sizes)]:
        sizes[i] += 1
    return sizes


def rank_slice(global_batch, dp, rank, dp_weights=None):
    """[begin, end) of rank `rank`'s part of a global batch: the first B mod dp ranks
    take one sample more; with dp_weights (spec §9) the sizes are the largest-remainder
    apportionment of the batch by the weights."""
    if dp_weights:
        if isinstance(dp_weights, str):
            dp_weights = [int(w) for w in dp_weights.split("+")]
        if len(dp_weights) != dp or min(dp_weights) < 1:
            raise ValueError(f"dp weights {dp_weights} do not give {dp} positive weights")
        if global_batch <= 0:
            raise ValueError(f"global batch must be positive, got {global_batch}")
        if not 0 <= rank < dp:
            raise ValueError(f"rank {rank} is not in [0, dp={dp})")
        sizes = weighted_sizes(global_batch, dp_weights)
        if 0 in sizes:
            raise ValueError(f"dp weights {dp_weights} give dp rank {sizes.index(0)} no samples")
        return sum(sizes[:rank]), sum(sizes[: rank + 1])
    if global_batch <= 0:
        raise ValueError(f"global batch must be positive, got {global_batch}")
    if dp <= 0:
        raise ValueError(f"dp must be positive, got {dp}")
    if dp > global_batch:
        raise ValueError(f"dp {dp} is larger than the global batch {global_batch}: some ranks would get no samples")
    if not 0 <= rank < dp:
        raise ValueError(f"rank {rank} is not in [0, dp={dp})")
    q, m = divmod(global_batch, dp)

    def begin(r):
        return r * q + min(r, m)

    return begin(rank), begin(rank + 1)


class Order:
    """The global order of `num_samples` samples; caches the last epoch's permutation."""

    def __init__(self, num_samples, seed, global_batch):
        if global_batch <= 0:
            raise ValueError(f"global batch must be positive, got {global_batch}")
        if num_samples < global_batch:
            raise ValueError(f"the dataset has {num_samples} samples, fewer than one global batch of {global_batch}")
        self.num_samples, self.seed, self.global_batch = num_samples, seed, global_batch
        self.batches_per_epoch = num_samples // global_batch
        self._epoch, self._perm = None, None

    def step_of(self, position):
        """Global step index at a position (samples consumed): position / B."""
        if position < 0 or position % self.global_batch:
            raise ValueError(
                f"start sample {position} is not a non-negative multiple of the global batch {self.global_batch}"
            )
        return position // self.global_batch

    def epoch_order(self, epoch):
        if self._epoch != epoch:
            self._perm, self._epoch = permutation(self.num_samples, self.seed, epoch), epoch
        return self._perm

    def batch(self, step, begin=0, end=None):
        """Ids of global step `step`, or of its slice [begin, end)."""
        epoch, j = divmod(step, self.batches_per_epoch)
        base = j * self.global_batch
        end = self.global_batch if end is None else end
        return self.epoch_order(epoch)[base + begin : base + end]

    def rank_batch(self, step, dp, rank):
        return self.batch(step, *rank_slice(self.global_batch, dp, rank))


def step_samples(num_samples, seed, global_batch, position, dp, dp_rank, dp_weights=None):
    """(global batch ids, this dp rank's ids) of the step that starts at `position`."""
    order = Order(num_samples, seed, global_batch)
    step = order.step_of(position)
    ids = order.batch(step)
    begin, end = rank_slice(global_batch, dp, dp_rank, dp_weights)
    return ids, ids[begin:end]


_DTYPES = {1: ("B", 1), 2: ("b", 1), 3: ("h", 2), 4: ("i", 4), 5: ("q", 8), 6: ("d", 8), 7: ("f", 4), 8: ("H", 2)}
_DTYPE_NAMES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64", 7: "float32", 8: "uint16"}


def _map(path):
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""


class MegatronIndex:
    """A PREFIX.idx / PREFIX.bin pair (MMIDIDX), validated like the C++ reader."""

    def __init__(self, prefix):
        for ext in (".bin", ".idx"):
            if prefix.endswith(ext):
                prefix = prefix[:-4]
        self.prefix = prefix
        idx, self.bin = _map(prefix + ".idx"), _map(prefix + ".bin")
        if len(idx) < 34:
            raise ValueError(f"{prefix}.idx: truncated header")
        if idx[:9] != b"MMIDIDX\x00\x00":
            raise ValueError(f"{prefix}.idx: bad magic")
        version, code, n, d = struct.unpack_from("<QBQQ", idx, 9)
        if version != 1:
            raise ValueError(f"{prefix}.idx: unsupported version {version}")
        if code not in _DTYPES:
            raise ValueError(f"{prefix}.idx: unknown dtype code {code}")
        base = 34 + 12 * n + 8 * d
        if len(idx) not in (base, base + n):
            raise ValueError(f"{prefix}.idx: size {len(idx)} does not match its counts")
        self.dtype_code, self.num_sequences = code, n
        self.format_char, self.itemsize = _DTYPES[code]
        self.lengths = struct.unpack_from(f"<{n}i", idx, 34)
        self.pointers = struct.unpack_from(f"<{n}q", idx, 34 + 4 * n)
        self.documents = struct.unpack_from(f"<{d}q", idx, 34 + 12 * n)
        for i, (length, ptr) in enumerate(zip(self.lengths, self.pointers)):
            if length < 0 or ptr < 0 or ptr + length * self.itemsize > len(self.bin):
                raise ValueError(f"{prefix}.idx: sequence {i} lies outside the data file")
        docs = self.documents
        if not docs or docs[0] != 0 or docs[-1] != n or any(a > b for a, b in zip(docs, docs[1:])):
            raise ValueError(f"{prefix}.idx: bad document index")

    def sequence_bytes(self, i):
        p = self.pointers[i]
        return bytes(self.bin[p : p + self.lengths[i] * self.itemsize])

    def tokens(self, i):
        return list(struct.unpack_from(f"<{self.lengths[i]}{self.format_char}", self.bin, self.pointers[i]))


class Index:
    """An index directory written by `tenplex data index`."""

    def __init__(self, directory):
        with open(os.path.join(directory, "index.json")) as f:
            meta = json.load(f)
        if meta.get("tenplex_data_index") != 1:
            raise ValueError(f"{directory}: unsupported index version")
        self.format = meta["format"]
        if self.format == "jsonl":
            self._source = _map(meta["source"])
            if len(self._source) != meta["source_bytes"]:
                raise ValueError(f"{meta['source']} changed since indexing, rebuild the index")
            off = _map(os.path.join(directory, "offsets.bin"))
            if len(off) < 32 or off[:8] != b"TPLXJSNL":
                raise ValueError(f"{directory}/offsets.bin: bad header")
            version, n, size = struct.unpack_from("<QQQ", off, 8)
            if version != 1 or len(off) != 32 + 8 * (n + 1) or size != len(self._source):
                raise ValueError(f"{directory}/offsets.bin: does not match its source")
            self._offsets = struct.unpack_from(f"<{n + 1}Q", off, 32)
            self.num_samples = n
            self.megatron = None
        elif self.format == "megatron":
            self.megatron = MegatronIndex(meta["prefix"])
            self.num_samples = self.megatron.num_sequences
        else:
            raise ValueError(f"{directory}: unknown format {self.format}")
        if self.num_samples != meta["num_samples"]:
            raise ValueError(f"{directory}: num_samples does not match the data")

    def __len__(self):
        return self.num_samples

    def record(self, i):
        """JSONL: the line's bytes without the newline. Megatron: the token ids."""
        if not 0 <= i < self.num_samples:
            raise IndexError(f"sample {i} is out of range (the dataset has {self.num_samples})")
        if self.megatron is not None:
            return self.megatron.tokens(i)
        begin, end = self._offsets[i], self._offsets[i + 1] - 1
        if end < len(self._source) and self._source[end : end + 1] != b"\n":
            raise ValueError(f"line {i} does not end where the index says, rebuild the index")
        return bytes(self._source[begin:end])

    def text(self, i):
        """As `tenplex data read` prints it."""
        r = self.record(i)
        if self.megatron is None:
            return r.decode("utf-8", errors="surrogateescape")
        return json.dumps(r, separators=(",", ":"))


class RankIterator:
    """Yields (step, sample ids, records) for one data-parallel rank from a position,
    forever (epoch after epoch) or for `steps` steps. `position` is the samples
    consumed after the last yielded step: save it, and resume with any dp."""

    def __init__(self, index_dir, seed, global_batch, dp, rank, start_sample=0, steps=None, dp_weights=None):
        self.index = Index(index_dir)
        self.order = Order(len(self.index), seed, global_batch)
        self.slice = rank_slice(global_batch, dp, rank, dp_weights)
        self.step = self.order.step_of(start_sample)
        self.remaining = steps

    @property
    def position(self):
        return self.step * self.order.global_batch

    def __iter__(self):
        return self

    def __next__(self):
        if self.remaining is not None:
            if self.remaining <= 0:
                raise StopIteration
            self.remaining -= 1
        ids = self.order.batch(self.step, *self.slice)
        step = self.step
        self.step += 1
        return step, ids, [self.index.record(i) for i in ids]


def _main(argv):
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("batches")
    b.add_argument("--index", required=True)
    b.add_argument("--seed", type=int, required=True)
    b.add_argument("--global-batch", type=int, required=True)
    b.add_argument("--dp", type=int, default=1)
    b.add_argument("--dp-weights")
    b.add_argument("--rank", type=int, default=0)
    b.add_argument("--start-sample", type=int, default=0)
    b.add_argument("--steps", type=int, default=1)
    r = sub.add_parser("read")
    r.add_argument("--index", required=True)
    r.add_argument("--sample", type=int, action="append", required=True)
    a = p.parse_args(argv)
    try:
        if a.cmd == "batches":
            if a.steps <= 0:
                raise ValueError(f"--steps must be positive, got {a.steps}")
            index = Index(a.index)
            order = Order(len(index), a.seed, a.global_batch)
            begin, end = rank_slice(a.global_batch, a.dp, a.rank, a.dp_weights)
            first = order.step_of(a.start_sample)
            steps = [{"step": g, "samples": order.batch(g, begin, end)} for g in range(first, first + a.steps)]
            print(json.dumps({"steps": steps}, separators=(",", ":")))
        else:
            index = Index(a.index)
            for i in a.sample:
                print(index.text(i))
    except (ValueError, IndexError, OSError) as e:
        print(f"data.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
