"""The package's layouts and sample order (tenplex.layout, tenplex.data: the native
module, one implementation shared with the CLI) against the independent pure-Python
references in tests/reference (issue 20: the package and examples/gpt use the native
code; a second implementation lives only here, as the oracle).

Under pytest (issue 32 §4), ctest python_reference, TENPLEX_BIN the CLI under test:

    python -m pytest tests/python_reference_test.py::test_python_reference

The references come from the `references` fixture (tests/conftest.py). The first check
that fails ends the test, naming what differs.
"""

from __future__ import annotations

import logging
import os
import random
import subprocess
from types import ModuleType
from typing import Any

import torch
from small_models import SMALL_GPT, SMALL_LLAMA

from tenplex import _tenplex, data, layout

_log = logging.getLogger(__name__)


class Counted:
    """check(cond, what): an AssertionError naming `what` when cond is false; `count` checks made."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, cond: object, what: str) -> None:
        self.count += 1
        assert cond, what


MODELS = {
    "small": SMALL_GPT,
    "llama": SMALL_LLAMA,
    "bf16": [
        "--num-layers",
        "3",
        "--hidden-size",
        "32",
        "--num-attention-heads",
        "4",
        "--vocab-size",
        "100",
        "--max-position-embeddings",
        "16",
        "--params-dtype",
        "bf16",
    ],
    "nostate": [
        "--num-layers",
        "2",
        "--hidden-size",
        "32",
        "--num-attention-heads",
        "4",
        "--vocab-size",
        "33",
        "--make-vocab-size-divisible-by",
        "8",
        "--max-position-embeddings",
        "16",
        "--optimizer",
        "none",
    ],
}
CONFIGS = [
    "tp=1",
    "tp=2",
    "tp=4",
    "pp=2",
    "dp=3",
    "tp=2,pp=2",
    "tp=2,dp=2,zero=1",
    "pp=3,layers=1+2+1",
    "tp=2,pp=2,dp=2,zero=1",
    "pp=2,dp=3,zero=1",
    "tp=8",
    "pp=4",
    # Spec §9 uneven splits (some are errors for some models: a rank with no unit).
    "tp=2,tp_weights=3+1",
    "tp=3,tp_weights=1+1+1",
    "tp=2,tp_weights=1+1",
    "tp=4,tp_weights=4+3+2+1",
    "tp=2,pp=2,dp=2,zero=1,tp_weights=1+2,dp_weights=2+1",
    "tp=3,pp=2,dp=3,zero=1,tp_weights=5+2+3",
    "dp=3,dp_weights=1+2+3",
]


def compare_layouts(check: Counted, tenplex: str, tmp: str, layout_ref: ModuleType) -> None:
    for name, args in MODELS.items():
        path = os.path.join(tmp, name + ".json")
        subprocess.run([tenplex, "model", "gpt", *args, "-o", path], check=True)
        ours, ref = layout.Model.load(path), layout_ref.Model.load(path)
        for text in CONFIGS:
            try:
                rcfg = layout_ref.Config.parse(text)
                layout_ref.validate(ref, rcfg)
                ref_error = None
            except layout_ref.LayoutError as e:
                ref_error = str(e)
            cfg = layout.Config.parse(text)
            check(str(cfg) == str(layout_ref.Config.parse(text)), f"config {text}: {cfg}")
            try:
                layout.validate(ours, cfg)
                error = None
            except layout.LayoutError as e:
                error = str(e)
            check((error is None) == (ref_error is None), f"{name} {text}: native {error!r}, reference {ref_error!r}")
            if error is not None:
                continue
            check(layout.stage_bounds(ours, cfg) == layout_ref.stage_bounds(ref, rcfg), f"{name} {text}: bounds")
            for pp in range(cfg.pp):
                for tp in range(cfg.tp):
                    got = layout.local_params(ours, cfg, pp, tp)
                    want = layout_ref.local_params(ref, rcfg, pp, tp)
                    check([p.name for p in got] == [p.name for p in want], f"{name} {text} ({pp},{tp}): names")
                    for a, b in zip(got, want):
                        same = (
                            a.path == b.path
                            and a.dtype == b.dtype
                            and a.shape == list(b.shape)
                            and a.global_shape == b.global_shape
                            and a.rule == b.rule
                            and a.alias == b.alias
                            and [(list(map(tuple, g)), list(map(tuple, loc))) for g, loc in a.pieces]
                            == [(list(map(tuple, g)), list(map(tuple, loc))) for g, loc in b.pieces]
                        )
                        check(same, f"{name} {text} ({pp},{tp}) {a.name}: {vars(a)} vs {vars(b)}")
                        g = torch.randn(a.global_shape)
                        check(
                            torch.equal(a.slice(g), b.slice(g)) and torch.equal(a.padding_mask(), b.padding_mask()),
                            f"{name} {text} {a.name}: slice/padding",
                        )
            for r in range(cfg.world_size):
                check(
                    layout.rank_tensors(ours, cfg, r)
                    == [(n, d, list(s)) for n, d, s in layout_ref.rank_tensors(ref, rcfg, r)],
                    f"{name} {text} rank {r}: rank_tensors",
                )
    rng = random.Random(9)
    for _ in range(500):
        units, w = rng.randrange(0, 200), [rng.randrange(1, 9) for _ in range(rng.randrange(1, 7))]
        check(list(_tenplex.apportion(units, w)) == layout_ref.apportion(units, w), f"apportion({units}, {w})")
    for total, dp in [(0, 1), (10, 3), (12, 4), (7, 8), (1000003, 16)]:
        for r in range(dp):
            check(
                tuple(layout.flat_range(total, dp, r)) == tuple(layout_ref.flat_range(total, dp, r)),
                f"flat_range({total}, {dp}, {r})",
            )


def compare_orders(check: Counted, data_ref: ModuleType) -> None:
    rng = random.Random(20)
    cases = [(45, 0, 1), (45, 7, 8), (100, (1 << 64) - 1, 10), (1, 3, 1), (1000, 12345678901234567890, 64)]
    cases += [(rng.randrange(1, 500), rng.getrandbits(64), 0) for _ in range(20)]
    for n, seed, b in cases:
        b = b or rng.randrange(1, n + 1)
        ours, ref = data.Order(n, seed, b), data_ref.Order(n, seed, b)
        for step in list(range(0, 3 * (n // b) + 2)) + [10**6]:
            check(ours.batch(step) == ref.batch(step), f"order n={n} seed={seed} B={b} step {step}")
        for dp in sorted({1, 2, 3, b}):
            if dp > b:
                continue
            for r in range(dp):
                check(data.rank_slice(b, dp, r) == data_ref.rank_slice(b, dp, r), f"rank_slice({b}, {dp}, {r})")
                w = [rng.randrange(1, 4) for _ in range(dp)]
                try:
                    want = data_ref.rank_slice(b, dp, r, w)
                except ValueError:
                    want = None
                try:
                    got = data.rank_slice(b, dp, r, w)
                except ValueError:
                    got = None
                check(got == want, f"rank_slice({b}, {dp}, {r}, {w}): {got} vs {want}")
                check(
                    data.step_samples(n, seed, b, 2 * b, dp, r) == data_ref.step_samples(n, seed, b, 2 * b, dp, r),
                    f"step_samples n={n} B={b} dp={dp} r={r}",
                )
    for bad in [lambda m: m.Order(3, 1, 4), lambda m: m.Order(10, 1, 0), lambda m: m.Order(10, 1, 2).step_of(3)]:
        for m in (data, data_ref):
            try:
                bad(m)
            except ValueError:
                continue
            check(False, f"{m.__name__} accepted a bad order")


def test_python_reference(tenplex: str, tmp: str, references: Any) -> None:
    check = Counted()
    compare_layouts(check, tenplex, tmp, references.layout_ref)
    compare_orders(check, references.data_ref)
    _log.info("python_reference: %d checks passed", check.count)
