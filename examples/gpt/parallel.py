"""Process groups and the tensor-parallel communication functions (Megatron-style).

Rank order is Megatron's (tp fastest, then dp, then pp). Groups, created identically
on every rank (torch.distributed requires every rank to create every group in the same
order):
  tp     the tp ranks of one (dp, pp) position: all-reduce of partial results;
  dp     the dp ranks of one (tp, pp) position: gradient reduction, ZeRO-1 gathers;
  mp     the tp*pp ranks of one dp replica: gradient norm, loss;
  embed  first and last stage of one (tp, dp) position when pp > 1: tied embedding grads.
Pipeline neighbours talk point to point with send/recv on the default group.

members_only=True (warm workers, `tenplex run --warm`, which re-join a new world at every
reconfiguration): each rank creates only its own groups, named after their kind and
index, and without torch's `new_group` world-wide store barrier (one per group, polled
every 10 ms: most of a warm re-join's group set-up). The gloo group's construction is a
rendezvous of its members already; every rank creates its groups in the same kind
order (tp, dp, mp, embed) and belongs to one group of each kind, so no rank waits on a
group another rank has not reached yet.
"""

import contextlib
import datetime
import weakref

import torch
import torch.distributed as dist
from meter import METER

_C10D_INTERNALS = ("_get_default_store", "_get_default_group", "_pg_map", "_pg_names", "_pg_group_ranks")
# Member groups are named "tenplex<n>-<kind><index>", n counting the Groups made in the
# current world (every rank makes the same ones in the same order): the world's store
# must not see a name twice. [weak reference to the world's default group, n]
_world = [None, 0]


def can_make_member_groups():
    """Whether this torch has the internals member_group needs (torch 1.13 and 2.15 have)."""
    return all(hasattr(dist.distributed_c10d, a) for a in _C10D_INTERNALS)


def member_group(ranks, name, timeout):
    """The gloo group of `ranks` (which hold this rank), created by its members only, with
    no world-wide barrier; registered with torch.distributed like one of `new_group`
    (collectives with src/dst ranks need that), so destroy_process_group() drops it."""
    c10d = dist.distributed_c10d
    store = c10d._get_default_store()
    ranks = sorted(ranks)  # group ranks in global rank order, as new_group's
    pg = dist.ProcessGroupGloo(dist.PrefixStore(name, store), ranks.index(dist.get_rank()), len(ranks), timeout)
    c10d._pg_map[pg] = (dist.Backend.GLOO, store)
    c10d._pg_names[pg] = name
    c10d._pg_group_ranks[pg] = {g: i for i, g in enumerate(ranks)}
    return pg


def _next_in_world():
    """The number of member-only Groups made in this world before (0 in a new world)."""
    default = dist.distributed_c10d._get_default_group()
    if _world[0] is None or _world[0]() is not default:
        _world[0], _world[1] = weakref.ref(default), 0
    _world[1] += 1
    return _world[1] - 1


class Groups:
    def __init__(self, cfg, rank, tied_embeddings=True, members_only=False, timeout=1800.0):
        self.cfg, self.rank = cfg, rank
        self.members_only = members_only and can_make_member_groups()
        self.timeout = datetime.timedelta(seconds=timeout)
        self.prefix = f"tenplex{_next_in_world()}-" if self.members_only else None
        self.tp_rank, self.dp_rank, self.pp_rank = cfg.tp_rank(rank), cfg.dp_rank(rank), cfg.pp_rank(rank)
        R = cfg.rank_of
        self.tp, self.tp_ranks = self._make(
            "tp", [[R(t, d, p) for t in range(cfg.tp)] for p in range(cfg.pp) for d in range(cfg.dp)]
        )
        self.dp, self.dp_ranks = self._make(
            "dp", [[R(t, d, p) for d in range(cfg.dp)] for p in range(cfg.pp) for t in range(cfg.tp)]
        )
        self.mp, self.mp_ranks = self._make(
            "mp", [[R(t, d, p) for p in range(cfg.pp) for t in range(cfg.tp)] for d in range(cfg.dp)]
        )
        self.embed, self.embed_ranks = None, [rank]
        if cfg.pp > 1 and tied_embeddings:
            self.embed, self.embed_ranks = self._make(
                "embed", [[R(t, d, 0), R(t, d, cfg.pp - 1)] for d in range(cfg.dp) for t in range(cfg.tp)]
            )

    def _make(self, kind, rank_lists):
        """Creates one group per list (every rank creates all; members_only: each rank
        only its own); returns ours and its ranks."""
        mine = (None, [self.rank])
        for i, ranks in enumerate(rank_lists):
            if self.members_only:
                if self.rank in ranks:
                    mine = (member_group(ranks, f"{self.prefix}{kind}{i}", self.timeout), ranks)
                continue
            g = dist.new_group(ranks)
            if self.rank in ranks:
                mine = (g, ranks)
        return mine

    @property
    def first_stage(self):
        return self.pp_rank == 0

    @property
    def last_stage(self):
        return self.pp_rank == self.cfg.pp - 1

    def prev_rank(self):
        return self.cfg.rank_of(self.tp_rank, self.dp_rank, self.pp_rank - 1)

    def next_rank(self):
        return self.cfg.rank_of(self.tp_rank, self.dp_rank, self.pp_rank + 1)


def _on_host(t):
    """The tensor a gloo collective can take: `t` itself, or a host copy of a CUDA tensor
    (train.py --device cuda; gloo has no CUDA transport for every collective). The one
    place device tensors are staged through host memory for communication."""
    return t.cpu() if t.is_cuda else t


def _back(t, host):
    """Copies a staged host tensor's result back into the device tensor `t`."""
    if host is not t:
        t.copy_(host)
    return t


def all_reduce(t, group, ranks, op=dist.ReduceOp.SUM):
    if len(ranks) > 1:
        with METER.comm():
            h = _on_host(t)
            dist.all_reduce(h, op=op, group=group)
            _back(t, h)
    return t


def all_gather(parts, t, group, metered=True):
    """dist.all_gather of `t` into the tensors `parts` (views into one buffer, e.g. ZeRO-1
    shards); metered: the time counts as a step's waiting (meter.py)."""
    with METER.comm() if metered else contextlib.nullcontext():
        hosts = [_on_host(x) for x in parts]
        dist.all_gather(hosts, _on_host(t), group=group)
        for x, h in zip(parts, hosts):
            _back(x, h)


def send(t, dst):
    with METER.comm():
        dist.send(_on_host(t), dst)


def recv(t, src):
    with METER.comm():
        h = _on_host(t)
        dist.recv(h, src)
        _back(t, h)
    return t


class _CopyToTp(torch.autograd.Function):
    """Forward identity, backward all-reduce (input of a column-parallel linear)."""

    @staticmethod
    def forward(ctx, x, groups):
        ctx.groups = groups
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous().clone()
        return all_reduce(g, ctx.groups.tp, ctx.groups.tp_ranks), None


class _ReduceFromTp(torch.autograd.Function):
    """Forward all-reduce, backward identity (output of a row-parallel linear)."""

    @staticmethod
    def forward(ctx, x, groups):
        return all_reduce(x.contiguous().clone(), groups.tp, groups.tp_ranks)

    @staticmethod
    def backward(ctx, g):
        return g, None


def copy_to_tp(x, groups):
    return _CopyToTp.apply(x, groups) if groups.cfg.tp > 1 else x


def reduce_from_tp(x, groups):
    return _ReduceFromTp.apply(x, groups) if groups.cfg.tp > 1 else x


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross entropy over logits split by vocabulary rows across the tp group.

    logits: [n, Vl] local columns for global vocabulary ids [start, start + Vl);
    only the first `valid` columns are real words, the rest are vocabulary padding
    (they depend on tp) and are excluded from the softmax, so the loss is the same for
    every tp.
    """

    @staticmethod
    def forward(ctx, logits, target, start, valid, groups):
        logits = logits.float().clone()
        if valid < logits.shape[1]:
            logits[:, valid:] = float("-inf")
        tp, ranks = groups.tp, groups.tp_ranks
        mx = logits.max(dim=1).values
        all_reduce(mx, tp, ranks, dist.ReduceOp.MAX)
        logits -= mx.unsqueeze(1)
        outside = (target < start) | (target >= start + valid)
        local_t = (target - start).masked_fill(outside, 0)
        rows = torch.arange(logits.shape[0], device=logits.device)
        picked = logits[rows, local_t].masked_fill(outside, 0.0)
        all_reduce(picked, tp, ranks)
        exp = logits.exp()
        sum_exp = exp.sum(dim=1)
        all_reduce(sum_exp, tp, ranks)
        loss = sum_exp.log() - picked
        exp /= sum_exp.unsqueeze(1)
        ctx.save_for_backward(exp, local_t, outside)
        return loss

    @staticmethod
    def backward(ctx, g):
        softmax, local_t, outside = ctx.saved_tensors
        grad = softmax.clone()
        rows = torch.arange(grad.shape[0], device=grad.device)
        grad[rows, local_t] -= (~outside).float()
        grad *= g.unsqueeze(1)
        return grad, None, None, None, None


def vocab_parallel_cross_entropy(logits, target, start, valid, groups):
    return _VocabParallelCrossEntropy.apply(logits, target, start, valid, groups)
