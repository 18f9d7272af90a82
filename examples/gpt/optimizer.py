"""Adam (AdamW, as Megatron uses it) on flat fp32 ranges, with optional ZeRO-1.

The stage's parameters form one flat fp32 buffer in spec §5 order (model.Stage). The
optimizer owns a range [begin, end) of it: everything without ZeRO, dp rank j's part
[j Np/dp, (j+1) Np/dp) with zero=1. Its state, exp_avg and exp_avg_sq, are flat fp32
tensors over that range, so they are exactly the spec's companions: split per local
parameter (optimizer.exp_avg.<local name>) without ZeRO, or written as is
(optimizer.flat.exp_avg) with ZeRO-1. Padding elements have zero gradient and stay 0.

Step t (1-based), as apex FusedAdam in adam_w_mode:
  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
  p -= lr * ((m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * p)   (wd on matrices only)
The update is elementwise, so a ZeRO-1 shard computes bit for bit what the full update
computes on those elements; the updated shards are then all-gathered over dp.
"""

import parallel
import torch

from tenplex import layout as L


class Adam:
    def __init__(self, stage, groups, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        self.stage, self.groups = stage, groups
        self.lr, self.b1, self.b2, self.eps, self.wd = lr, betas[0], betas[1], eps, weight_decay
        cfg = stage.cfg
        self.zero = cfg.zero and cfg.dp > 1
        if cfg.zero:
            self.begin, self.end, _ = L.flat_range(stage.total, cfg.dp, groups.dp_rank)
        else:
            self.begin, self.end = 0, stage.total
        n = self.end - self.begin
        self.exp_avg = torch.zeros(n, device=stage.flat.device)
        self.exp_avg_sq = torch.zeros(n, device=stage.flat.device)

    @torch.no_grad()
    def step(self, flat_grad, t):
        b, e = self.begin, self.end
        g = flat_grad[b:e]
        p = self.stage.flat[b:e]
        self.exp_avg.mul_(self.b1).add_(g, alpha=1 - self.b1)
        self.exp_avg_sq.mul_(self.b2).addcmul_(g, g, value=1 - self.b2)
        bc1 = 1 - self.b1**t
        bc2 = 1 - self.b2**t
        denom = (self.exp_avg_sq / bc2).sqrt_().add_(self.eps)
        update = (self.exp_avg / bc1).div_(denom)
        if self.wd:
            update.add_(p * self.stage.decay_mask[b:e], alpha=self.wd)
        p.add_(update, alpha=-self.lr)
        if self.zero:
            per = e - b
            flat = self.stage.flat
            parts = [flat[j * per : (j + 1) * per] for j in range(self.stage.cfg.dp)]
            parallel.all_gather(parts, p.clone(), self.groups.dp)

    # ---- state as the spec's companions ---------------------------------------

    def kinds(self):
        return ["exp_avg", "exp_avg_sq"] + (["fp32_param"] if self.stage.dtype != "F32" else [])

    def _range(self, kind):
        if kind == "exp_avg":
            return self.exp_avg
        if kind == "exp_avg_sq":
            return self.exp_avg_sq
        return self.stage.flat[self.begin : self.end]

    def state_tensors(self):
        """[(local name, fp32 tensor)] per spec §5, padding zeroed."""
        pad = self.stage.pad_mask[self.begin : self.end]
        out = []
        for k in self.kinds():
            flat = self._range(k).masked_fill(pad, 0.0)
            if self.stage.cfg.zero:
                out.append((f"optimizer.flat.{k}", flat))
            else:
                out += [(f"optimizer.{k}.{p.name}", self.stage.view(flat, p).clone()) for p in self.stage.params]
        return out

    def load_state_tensors(self, tensors):
        """Inverse of state_tensors; returns the names used."""
        used = []
        for k in self.kinds():
            dst = self._range(k) if k != "fp32_param" else self.stage.flat[self.begin : self.end]
            if self.stage.cfg.zero:
                name = f"optimizer.flat.{k}"
                dst.copy_(_get(tensors, name, [self.end - self.begin]))
                used.append(name)
            else:
                for p in self.stage.params:
                    name = f"optimizer.{k}.{p.name}"
                    self.stage.view(dst, p).copy_(_get(tensors, name, p.shape))
                    used.append(name)
        if self.zero and self.stage.dtype != "F32":
            # Every rank needs the whole fp32 master; shards come from the dp peers.
            per = self.end - self.begin
            flat = self.stage.flat
            parts = [flat[j * per : (j + 1) * per] for j in range(self.stage.cfg.dp)]
            parallel.all_gather(parts, flat[self.begin : self.end].clone(), self.groups.dp, metered=False)
        return used


def _get(tensors, name, shape):
    if name not in tensors:
        raise KeyError(f"checkpoint lacks tensor {name}")
    t = tensors[name]
    if list(t.shape) != list(shape) or t.dtype != torch.float32:
        raise ValueError(f"checkpoint tensor {name} is {t.dtype} {list(t.shape)}, expected F32 {list(shape)}")
    return t
