"""Dataset state without FUSE: the global sample order and a rank's slice of it
(docs/data.md), from the native module (src/tenplex/data is the one implementation).

    it = RankIterator("idx", seed=1, global_batch=32, dp=4, rank=1, start_sample=640)
    for step, ids, records in it:      # records: bytes (JSONL line) or token lists
        ...                            # it.position = samples consumed after this step

    ids, mine = step_samples(num_samples, seed, global_batch, position, dp, dp_rank)

Uneven data parallelism (spec §9, devices of different speed): `dp_weights=[2, 1, 1]`
(or "2+1+1") gives dp rank j a contiguous share of every global batch proportional to
w_j (largest-remainder apportionment; `RankIterator(..., dp_weights=...)`,
`rank_slice(B, dp, r, dp_weights)`); without weights the first B mod dp ranks take one
sample more.

Command line (the same JSON as `tenplex data batches --json`):

    .venv/bin/python -m tenplex.data batches --index DIR --seed S --global-batch B \\
        --dp D --rank R --start-sample P --steps N
    .venv/bin/python -m tenplex.data read --index DIR --sample N
"""

import json
import logging
import sys
from typing import Any

from . import _tenplex
from ._cli import cli_logging

log = logging.getLogger("tenplex.data")  # not __name__: "__main__" under python -m

Order = _tenplex.Order  # Order(num_samples, seed, global_batch): step_of(position), batch(step, begin, end)


def parse_weights(weights):
    """[] for None, a list of ints as is, "2+1+1" as [2, 1, 1]."""
    if weights is None:
        return []
    if isinstance(weights, str):
        try:
            return [int(w, 10) for w in weights.split("+")]
        except ValueError:
            raise ValueError(f"dp_weights {weights!r}: expected positive integers joined by '+'") from None
    return [int(w) for w in weights]


def rank_slice(global_batch, dp, rank, dp_weights=None):
    """(begin, end) of a dp rank's part of a global batch (spec §9 shares with dp_weights)."""
    return _tenplex.rank_slice(global_batch, dp, rank, parse_weights(dp_weights))


_orders: dict[Any, Any] = {}


def step_samples(num_samples, seed, global_batch, position, dp, dp_rank, dp_weights=None):
    """(global batch ids, this dp rank's ids) of the step that starts at `position`
    (samples consumed). The order of the last (num_samples, seed, global_batch) is kept,
    so a training loop pays for an epoch's permutation once."""
    key = (num_samples, seed, global_batch)
    order = _orders.get(key)
    if order is None:
        _orders.clear()
        order = _orders[key] = Order(num_samples, seed, global_batch)
    ids = order.batch(order.step_of(position))
    begin, end = rank_slice(global_batch, dp, dp_rank, dp_weights)
    return ids, ids[begin:end]


class Index:
    """An index directory written by `tenplex data index`."""

    def __init__(self, directory):
        self._ds = _tenplex.Dataset(directory)
        self.format = self._ds.format

    def __len__(self):
        return len(self._ds)

    def text(self, i):
        """As `tenplex data read` prints it."""
        return self._ds.sample(i).decode("utf-8", errors="surrogateescape")

    def record(self, i):
        """JSONL: the line's bytes without the newline. Megatron: the token ids."""
        raw = self._ds.sample(i)
        return raw if self.format == "jsonl" else json.loads(raw)


class RankIterator:
    """Yields (step, sample ids, records) for one data-parallel rank from a position,
    forever (epoch after epoch) or for `steps` steps. `position` is the samples
    consumed after the last yielded step: save it, and resume with any dp (and any
    dp_weights: rank j's share of each global batch is proportional to dp_weights[j])."""

    def __init__(self, index_dir, seed, global_batch, dp=None, rank=0, start_sample=0, steps=None, dp_weights=None):
        weights = parse_weights(dp_weights)
        if dp is None:
            dp = len(weights) or 1
        self.index = Index(index_dir)
        self.order = Order(len(self.index), seed, global_batch)
        self.slice = rank_slice(global_batch, dp, rank, weights)
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

    p = argparse.ArgumentParser(prog="python3 -m tenplex.data", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("batches")
    b.add_argument("--index", required=True)
    b.add_argument("--seed", type=int, required=True)
    b.add_argument("--global-batch", type=int, required=True)
    b.add_argument("--dp", type=int)
    b.add_argument("--dp-weights")
    b.add_argument("--rank", type=int, default=0)
    b.add_argument("--start-sample", type=int, default=0)
    b.add_argument("--steps", type=int, default=1)
    r = sub.add_parser("read")
    r.add_argument("--index", required=True)
    r.add_argument("--sample", type=int, action="append", required=True)
    a = p.parse_args(argv)
    try:
        index = Index(a.index)
        if a.cmd == "batches":
            if a.steps <= 0:
                raise ValueError(f"--steps must be positive, got {a.steps}")
            order = Order(len(index), a.seed, a.global_batch)
            weights = parse_weights(a.dp_weights)
            dp = a.dp if a.dp is not None else (len(weights) or 1)
            begin, end = rank_slice(a.global_batch, dp, a.rank, weights)
            first = order.step_of(a.start_sample)
            steps = [{"step": g, "samples": order.batch(g, begin, end)} for g in range(first, first + a.steps)]
            print(json.dumps({"steps": steps}, separators=(",", ":")))
        else:
            for i in a.sample:
                print(index.text(i))
    except (ValueError, LookupError, OSError, _tenplex.Error) as e:
        log.error("tenplex.data: error: %s", e)
        return 2
    return 0


if __name__ == "__main__":
    cli_logging()
    sys.exit(_main(sys.argv[1:]))
