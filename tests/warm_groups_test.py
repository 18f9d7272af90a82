"""Warm workers' process groups (examples/gpt/parallel.py, members_only=True): each rank
creates only its own tp/dp/mp/embed groups, without torch's world-wide barrier per group.

Under pytest (issue 32 §4), ctest warm_groups:

    python -m pytest tests/warm_groups_test.py::test_warm_groups

Four processes (a gloo world on loopback) build the groups of several configs both ways
(members only, and torch's new_group for every group) and check each against an
independent oracle: the members of a rank's group are the ranks that share its other
coordinates (rank = t + tp * (d + dp * p), Megatron's order, computed here from the
definition), an all-reduce over the group sums exactly those ranks' values, an
all-gather returns them in rank order, and a broadcast from the group's last member
(torch must know the group's ranks for that) reaches every member. Then a second world
is joined in the same processes (a warm worker's next segment) and checked again.

examples/gpt is not a package: the fixture `gpt_example` puts it on the path for the test
(pytest's monkeypatch, undone afterwards); the spawned workers get the parent's path.
"""

from __future__ import annotations

import datetime
import logging
import os
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tenplex import layout as L
from tenplex.testing import free_port

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
_log = logging.getLogger(__name__)

WORLD = 4
CONFIGS = ["tp=2,pp=2", "tp=2,dp=2", "pp=2,dp=2", "dp=4", "tp=4"]


def oracle(tp: int, dp: int, pp: int, rank: int) -> dict[str, list[int]]:
    """{kind: sorted member ranks} of `rank`'s groups, from the rank formula."""
    t, d, p = rank % tp, (rank // tp) % dp, rank // (tp * dp)

    def r(t_: int, d_: int, p_: int) -> int:
        return t_ + tp * (d_ + dp * p_)

    out = {
        "tp": sorted(r(x, d, p) for x in range(tp)),
        "dp": sorted(r(t, x, p) for x in range(dp)),
        "mp": sorted(r(x, d, y) for y in range(pp) for x in range(tp)),
    }
    if pp > 1:
        out["embed"] = sorted({r(t, d, 0), r(t, d, pp - 1)})
    return out


def check_groups(rank: int, cfg_text: str, members_only: bool) -> list[str]:
    import parallel  # examples/gpt (the gpt_example fixture)

    cfg = L.Config.parse(cfg_text)
    g = parallel.Groups(cfg, rank, tied_embeddings=True, members_only=members_only, timeout=60)
    want = oracle(cfg.tp, cfg.dp, cfg.pp, rank)
    errors: list[str] = []
    for kind, members in want.items():
        group, ranks = getattr(g, kind), getattr(g, kind + "_ranks")
        if sorted(ranks) != members:
            errors.append(f"{cfg_text} rank {rank} {kind}: ranks {ranks}, want {members}")
            continue
        if len(members) == 1:
            continue
        x = torch.tensor([float(10**rank)], dtype=torch.float64)
        parallel.all_reduce(x, group, ranks)
        if x.item() != sum(10**m for m in members):
            errors.append(f"{cfg_text} rank {rank} {kind}: all-reduce {x.item()}, want {sum(10**m for m in members)}")
        parts = [torch.zeros(1) for _ in members]
        dist.all_gather(parts, torch.tensor([float(rank)]), group=group)
        if [int(p.item()) for p in parts] != members:
            errors.append(f"{cfg_text} rank {rank} {kind}: all-gather {parts}, want {members}")
        b = torch.tensor([float(rank)])
        dist.broadcast(b, members[-1], group=group)
        if b.item() != members[-1]:
            errors.append(f"{cfg_text} rank {rank} {kind}: broadcast from {members[-1]} gave {b.item()}")
    if members_only and not g.members_only:
        errors.append("this torch cannot make member-only groups (parallel.can_make_member_groups)")
    return errors


def worker(rank: int, ports: list[int], queue: Any) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    errors: list[str] = []
    try:
        for port in ports:  # a world, then the next one in the same process
            dist.init_process_group(
                "gloo",
                init_method=f"tcp://127.0.0.1:{port}",
                rank=rank,
                world_size=WORLD,
                timeout=datetime.timedelta(seconds=60),
            )
            for cfg in CONFIGS:
                for members_only in (True, False):
                    errors += check_groups(rank, cfg, members_only)
            dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - reported by the parent
        errors.append(f"rank {rank}: {type(e).__name__}: {e}")
    queue.put((rank, errors))


@pytest.fixture
def gpt_example(monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/gpt on the path (its parallel.py imports meter.py beside it)."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "examples", "gpt"))


def test_warm_groups(gpt_example: None) -> None:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    ports = [free_port(), free_port()]
    procs = [ctx.Process(target=worker, args=(r, ports, queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    errors = [e for r in sorted(results) for e in results[r]]
    errors += [f"rank {r} exited {p.exitcode}" for r, p in enumerate(procs) if p.exitcode != 0]
    for e in errors:
        _log.error("FAIL %s", e)
    assert not errors, "\n".join(errors)
    _log.info("ok: %d configs x 2 ways x 2 worlds, %d ranks", len(CONFIGS), WORLD)
