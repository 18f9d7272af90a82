"""FlexTP-style per-step straggler offload (`train.py --flextp-straggler T`), the peer
that issue 14 measures `tenplex run --rebalance` against (docs/hetero.md).

Our own code, after the scheme of FlexTP's released implementation as the issue
describes it: who owns the weights never changes. The tensor-parallel split stays even;
in each of the four linears of a layer (linear_qkv, linear_proj, linear_fc1,
linear_fc2) the straggler tp rank s keeps the first (1 - share) of its weight shard's
input-feature columns and the helper ranks compute the rest (share = 0.875 fixed, as
theirs), split evenly among them:

  forward   s broadcasts its whole weight shard W_s (once per step: cached for the
            step's later micro-batches) and, where the input is not replicated over tp
            (linear_proj, linear_fc2 take s's own activations), its input x_s; helper h
            computes x_s[:, C_h] W_s[:, C_h]^T, and the partial products are summed into
            s (reduce to s);
  backward  s broadcasts its output gradient dy_s; helper h computes its columns of
            dW_s (dy_s^T x_s[:, C_h]) and of dx_s (dy_s W_s[:, C_h]), which are summed
            into s (reduce of zero-padded full-size tensors).

The result equals the plain linear up to float summation order, so losses match the
even run. Every step pays the broadcasts and reductions; `--rebalance` instead moves
slices once and then trains at the uneven split with no per-step traffic.
"""

import torch
import torch.distributed as dist
from meter import METER


class FlexTp:
    def __init__(self, groups, straggler, share=0.875):
        self.groups, self.straggler, self.share = groups, straggler, share
        self.tp = groups.cfg.tp
        self.src = groups.tp_ranks[straggler] if groups.tp is not None else groups.rank
        self.cache = {}

    def new_step(self):
        self.cache.clear()

    def columns(self, n):
        """(kept by the straggler, [columns of helper h...]) over n input features."""
        keep = n - int(round(n * self.share))
        helpers = [t for t in range(self.tp) if t != self.straggler]
        rest = n - keep
        out, b = {}, keep
        for i, h in enumerate(helpers):
            e = b + rest * (i + 1) // len(helpers) - rest * i // len(helpers)
            out[h] = (b, e)
            b = e
        return (0, keep), out

    def _bcast(self, t):
        with METER.comm():
            dist.broadcast(t, self.src, group=self.groups.tp)
        return t

    def _reduce(self, t):
        with METER.comm():
            dist.reduce(t, self.src, group=self.groups.tp)
        return t

    def weight_of_straggler(self, name, w):
        """W_s on every tp rank, broadcast once per step."""
        if name not in self.cache:
            buf = w.detach().clone() if self.groups.tp_rank == self.straggler else torch.empty_like(w)
            self.cache[name] = self._bcast(buf)
        return self.cache[name]

    def linear(self, name, x, w, replicated_input):
        if self.tp < 2:
            return torch.nn.functional.linear(x, w)
        return _FlexLinear.apply(x, w, self, name, replicated_input)


class _FlexLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, flex, name, replicated_input):
        me = flex.groups.tp_rank == flex.straggler
        ws = flex.weight_of_straggler(name, w)
        xs = x if (me or replicated_input) else torch.empty_like(x)
        if not replicated_input:
            xs = flex._bcast(xs.contiguous() if me else xs)
        (kb, ke), helpers = flex.columns(ws.shape[1])
        if me:
            part = xs[..., kb:ke] @ ws[:, kb:ke].t()
        else:
            hb, he = helpers[flex.groups.tp_rank]
            part = xs[..., hb:he] @ ws[:, hb:he].t()
        part = flex._reduce(part.contiguous())
        y = part if me else x @ w.t()
        ctx.flex, ctx.replicated = flex, replicated_input
        ctx.save_for_backward(x, w, xs, ws)
        return y

    @staticmethod
    def backward(ctx, dy):
        flex = ctx.flex
        x, w, xs, ws = ctx.saved_tensors
        me = flex.groups.tp_rank == flex.straggler
        dys = flex._bcast(dy.contiguous().clone() if me else torch.empty(*x.shape[:-1], ws.shape[0]))
        (kb, ke), helpers = flex.columns(ws.shape[1])
        b, e = (kb, ke) if me else helpers[flex.groups.tp_rank]
        dws = torch.zeros_like(ws)
        dxs = torch.zeros_like(xs)
        flat_dy = dys.reshape(-1, dys.shape[-1])
        dws[:, b:e] = flat_dy.t() @ xs[..., b:e].reshape(-1, e - b)
        dxs[..., b:e] = dys @ ws[:, b:e]
        dws = flex._reduce(dws)
        dxs = flex._reduce(dxs)
        if me:
            return dxs, dws, None, None, None
        # A helper's own linear: its usual gradients.
        return dy @ w, dy.reshape(-1, dy.shape[-1]).t() @ x.reshape(-1, x.shape[-1]), None, None, None
