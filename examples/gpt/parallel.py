"""Process groups and the tensor-parallel communication functions (Megatron-style).

Rank order is Megatron's (tp fastest, then dp, then pp). Groups, created identically
on every rank (torch.distributed requires every rank to create every group in the same
order):
  tp     the tp ranks of one (dp, pp) position: all-reduce of partial results;
  dp     the dp ranks of one (tp, pp) position: gradient reduction, ZeRO-1 gathers;
  mp     the tp*pp ranks of one dp replica: gradient norm, loss;
  embed  first and last stage of one (tp, dp) position when pp > 1: tied embedding grads.
Pipeline neighbours talk point to point with send/recv on the default group.
"""
import torch
import torch.distributed as dist

from meter import METER


class Groups:
    def __init__(self, cfg, rank, tied_embeddings=True):
        self.cfg, self.rank = cfg, rank
        self.tp_rank, self.dp_rank, self.pp_rank = cfg.tp_rank(rank), cfg.dp_rank(rank), cfg.pp_rank(rank)
        R = cfg.rank_of
        self.tp, self.tp_ranks = self._make([[R(t, d, p) for t in range(cfg.tp)]
                                             for p in range(cfg.pp) for d in range(cfg.dp)])
        self.dp, self.dp_ranks = self._make([[R(t, d, p) for d in range(cfg.dp)]
                                             for p in range(cfg.pp) for t in range(cfg.tp)])
        self.mp, self.mp_ranks = self._make([[R(t, d, p) for p in range(cfg.pp) for t in range(cfg.tp)]
                                             for d in range(cfg.dp)])
        self.embed, self.embed_ranks = None, [rank]
        if cfg.pp > 1 and tied_embeddings:
            self.embed, self.embed_ranks = self._make([[R(t, d, 0), R(t, d, cfg.pp - 1)]
                                                       for d in range(cfg.dp) for t in range(cfg.tp)])

    def _make(self, rank_lists):
        """Creates one group per list (every rank creates all); returns ours and its ranks."""
        mine = (None, [self.rank])
        for ranks in rank_lists:
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


def all_reduce(t, group, ranks, op=dist.ReduceOp.SUM):
    if len(ranks) > 1:
        with METER.comm():
            dist.all_reduce(t, op=op, group=group)
    return t


def send(t, dst):
    with METER.comm():
        dist.send(t, dst)


def recv(t, src):
    with METER.comm():
        dist.recv(t, src)
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
        rows = torch.arange(logits.shape[0])
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
        rows = torch.arange(grad.shape[0])
        grad[rows, local_t] -= (~outside).float()
        grad *= g.unsqueeze(1)
        return grad, None, None, None, None


def vocab_parallel_cross_entropy(logits, target, start, valid, groups):
    return _VocabParallelCrossEntropy.apply(logits, target, start, valid, groups)
