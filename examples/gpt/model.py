"""A Megatron-style GPT pipeline stage in PyTorch whose parameters are a PTC's local tensors.

The stage of rank r holds exactly the local tensors that spec ptc-layout.md §4 gives
r (names, shapes, TP slicing, vocabulary padding), built by python/tenplex/layout.py
from the model description JSON that `tenplex model gpt` writes. All of them live in
one flat fp32 buffer in the order of spec §5 (the ZeRO-1 flat order), padding included,
so the optimizer works on flat ranges and ZeRO-1 is a slice of the same buffer.

Initialisation does not depend on the layout: every global tensor is drawn from a
generator seeded by hash(seed, global path) and then sliced, so every parallel
configuration starts from the same weights (normal(0, 0.02); the output projections
linear_proj and linear_fc2 use 0.02 / sqrt(2 L); biases 0; norm weights 1).

Forward (per micro-batch, activations [b, s, h], fp32):
  first stage  vocab-parallel embedding (ids outside the rank's rows give 0, then an
               all-reduce over tp), plus learned positions;
  each layer   x += proj(attn(norm(x))); x += fc2(act(fc1(norm(x)))), with the norms
               fused in front of linear_qkv / linear_fc1 as in Megatron-Core; fused QKV
               rows grouped by query group ([q heads of the group; k; v] x d rows);
               rope (Megatron's rotate-half form, base 10000) when configured;
               gelu, or SwiGLU with fc1 = [gate; up] blocks;
  last stage   final norm, logits against output_layer.weight (or the tied word
               embedding when pp == 1), vocab-parallel cross entropy with vocabulary
               padding excluded from the softmax, so the loss does not depend on tp.
With tp_weights (spec §9) tp ranks hold different numbers of query groups, MLP rows and
vocabulary rows (uneven.py); the forward is the same code, reading each rank's share
from its tensors' shapes and its vocabulary offset from the layout.
Column-parallel linears take their input through copy_to_tp (all-reduce of the input
gradient), row-parallel linears all-reduce their output, as in Megatron.
Activation recomputation (Megatron's --recompute-granularity/-method/-num-layers,
class Recompute) checkpoints the attention core or whole layers with torch.utils.checkpoint.

Parameters whose dtype is BF16/F16 keep an fp32 master copy (the spec's
optimizer.fp32_param companion); forward uses the master rounded to that dtype.
"""

import hashlib
import math

import parallel
import torch
import torch.nn.functional as F
import uneven
from torch.utils.checkpoint import checkpoint

from tenplex import layout as L

TORCH_DTYPE = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}

# Forward runs of Stage.layer and Stage.attention_core, recomputations included, and the
# checkpointed regions entered; per process, never reset here (tests/recompute_test.py).
CALLS = {"layer": 0, "attention_core": 0, "checkpoint": 0}


class Recompute:
    """Activation recomputation as Megatron-LM's --recompute-* arguments set it, done with
    torch.utils.checkpoint (use_reentrant=False): a checkpointed region keeps only its
    inputs in the forward and runs again in the backward, when its gradient is needed.

      granularity  None         store every activation (the default)
                   "selective"  recompute the attention core of every layer
                                (Stage.attention_core: scores, mask, softmax, probs @ v)
                   "full"       recompute whole layers, chosen by method:
      method       "uniform"    groups of num_layers consecutive local layers (the last
                                group may be shorter), each group's input stored
                   "block"      the first num_layers local layers of this pipeline stage
                                (all of them when it has fewer); the rest store theirs
    A recomputed layer runs its tensor-parallel all-reduces again in the backward; every
    tp rank recomputes the same layers in the same order, so they pair up as in the
    forward. The forward draws no random numbers (no dropout); the default
    preserve_rng_state stays on all the same.
    """

    def __init__(self, granularity=None, method=None, num_layers=None):
        if granularity not in (None, "full", "selective"):
            raise ValueError(f"--recompute-granularity must be full or selective, got {granularity!r}")
        if method is not None and method not in ("uniform", "block"):
            raise ValueError(f"--recompute-method must be uniform or block, got {method!r}")
        if granularity != "full":
            given = [
                a for a, v in (("--recompute-method", method), ("--recompute-num-layers", num_layers)) if v is not None
            ]
            if given:
                raise ValueError(
                    f"{' and '.join(given)} need{'s' if len(given) == 1 else ''} "
                    f"--recompute-granularity full (this run has "
                    f"{granularity or 'no recomputation'})"
                )
        if num_layers is not None and num_layers < 1:
            raise ValueError(f"--recompute-num-layers must be >= 1, got {num_layers}")
        self.granularity = granularity
        self.method = method or ("uniform" if granularity == "full" else None)
        self.num_layers = num_layers or (1 if granularity == "full" else None)

    @classmethod
    def from_args(cls, args):
        """From train.py's arguments; --recompute-activations is Megatron's older spelling
        of --recompute-granularity selective."""
        granularity = args.recompute_granularity
        if args.recompute_activations:
            if granularity not in (None, "selective"):
                raise ValueError(
                    "--recompute-activations (--recompute-granularity selective) conflicts with "
                    f"--recompute-granularity {granularity}"
                )
            granularity = "selective"
        return cls(granularity, args.recompute_method, args.recompute_num_layers)

    def describe(self):
        """The setting in `tenplex config suggest`'s notation: none, selective, full (uniform,
        one layer per group), full:N (block, N layers), full-uniform:N (groups of N)."""
        if self.granularity != "full":
            return self.granularity or "none"
        if self.method == "block":
            return f"full:{self.num_layers}"
        return "full" if self.num_layers == 1 else f"full-uniform:{self.num_layers}"

    def segments(self, n):
        """[(begin, end, checkpointed)]: the n local layers in order, in runs of layers."""
        if self.granularity != "full":
            return [(i, i + 1, False) for i in range(n)]
        if self.method == "uniform":
            return [(b, min(b + self.num_layers, n), True) for b in range(0, n, self.num_layers)]
        return [(i, i + 1, i < self.num_layers) for i in range(n)]


class HParams:
    def __init__(self, info):
        def num(k):
            return int(info[k])

        def flag(k):
            return info[k] == "true"

        if info.get("family") != "gpt":
            raise ValueError(f"model family is {info.get('family')!r}; the reference client trains 'gpt' models")
        self.num_layers, self.hidden = num("num_layers"), num("hidden_size")
        self.ffn, self.heads, self.groups = num("ffn_hidden_size"), num("num_attention_heads"), num("num_query_groups")
        self.kv_channels, self.vocab = num("kv_channels"), num("vocab_size")
        self.max_positions = num("max_position_embeddings")
        self.rope = info["position_embedding_type"] == "rope"
        self.swiglu, self.bias, self.tied = flag("swiglu"), flag("bias"), flag("tied")
        self.layernorm = info["normalization"] == "LayerNorm"
        self.params_dtype = info["params_dtype"]


def global_seed(seed, path):
    return int.from_bytes(hashlib.sha256(f"{seed}/{path}".encode()).digest()[:8], "little") & ((1 << 63) - 1)


def init_global(seed, path, shape, num_layers):
    """The initial value of global tensor `path` (fp32), the same in every layout."""
    if path.endswith("layer_norm_weight") or path == "decoder.final_layernorm.weight":
        return torch.ones(shape)
    if path.endswith("bias"):
        return torch.zeros(shape)
    std = 0.02
    if path.endswith("linear_proj.weight") or path.endswith("linear_fc2.weight"):
        std = 0.02 / math.sqrt(2.0 * num_layers)
    g = torch.Generator().manual_seed(global_seed(seed, path))
    return torch.randn(shape, generator=g) * std


class Stage:
    """The parameters and the forward pass of one (pipeline stage, tp rank)."""

    def __init__(self, model, cfg, groups, seed, device="cpu"):
        self.model, self.cfg, self.groups = model, cfg, groups
        self.hp = hp = HParams(model.info)
        self.params = L.local_params(model, cfg, groups.pp_rank, groups.tp_rank)
        bounds = L.stage_bounds(model, cfg)
        self.num_local_layers = bounds[groups.pp_rank + 1] - bounds[groups.pp_rank]
        self.total = sum(p.numel for p in self.params)
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) > 1 or not dtypes <= set(TORCH_DTYPE):
            raise ValueError(f"parameter dtypes {sorted(dtypes)}: the client needs one of F32, BF16, F16")
        self.dtype = dtypes.pop() if dtypes else "F32"
        # One flat fp32 buffer; for ZeRO-1 padded to a multiple of dp (spec §5).
        _, _, padded = L.flat_range(self.total, cfg.dp if cfg.zero else 1, 0)
        self.flat = torch.zeros(padded)
        self.offsets = {}
        off = 0
        for p in self.params:
            self.offsets[p.name] = (off, off + p.numel)
            g = init_global(seed, p.path, p.global_shape, hp.num_layers)
            self.view(self.flat, p).copy_(p.slice(g))
            off += p.numel
        self.by_name = {p.name: p for p in self.params}
        # Per flat element: counts in the gradient norm (TP-split, or replicated on tp
        # rank 0, never the tied replica), gets weight decay (matrices), is padding.
        self.norm_mask = torch.zeros(padded, dtype=torch.bool)
        self.decay_mask = torch.zeros(padded, dtype=torch.bool)
        self.pad_mask = torch.ones(padded, dtype=torch.bool)
        for p in self.params:
            counts = not p.alias and (p.rule["rule"] != "replicate" or groups.tp_rank == 0)
            self.view(self.norm_mask, p).fill_(counts)
            self.view(self.decay_mask, p).fill_(len(p.shape) >= 2)
            self.view(self.pad_mask, p).copy_(p.padding_mask())
        # Built on the host (the same initial values everywhere), then moved to the device.
        self.flat, self.norm_mask, self.decay_mask, self.pad_mask = (
            t.to(device) for t in (self.flat, self.norm_mask, self.decay_mask, self.pad_mask)
        )
        # First global vocabulary row of this tp rank (uneven with tp_weights, spec §9).
        self.vocab_start = 0
        for p in self.params:
            if p.rule["rule"] == "vocab":
                self.vocab_start = uneven.vocab_start(p, cfg, groups.tp_rank)
        self.weights = {}
        self.recompute = Recompute()  # activation recomputation (train.py --recompute-*)
        self.flex = None  # flextp.FlexTp: the per-step straggler offload (train.py --flextp-straggler)

    def view(self, flat, p):
        b, e = self.offsets[p.name]
        return flat[b:e].view(p.shape)

    # ---- weights used by autograd ----------------------------------------------

    def make_weights(self):
        """Leaf tensors for one step's forward/backward (views of the master buffer
        for F32; rounded copies for BF16/F16)."""
        src = self.flat
        if self.dtype != "F32":
            src = self.flat.to(TORCH_DTYPE[self.dtype]).float()
        self.weights = {}
        for p in self.params:
            w = self.view(src, p).detach()
            w.requires_grad_(True)
            self.weights[p.name] = w
        return self.weights

    def flat_grad(self):
        g = torch.zeros_like(self.flat)
        for p in self.params:
            w = self.weights[p.name]
            if w.grad is not None:
                self.view(g, p).copy_(w.grad)
        return g

    # ---- forward -----------------------------------------------------------------

    def _norm(self, x, prefix_w, prefix_b):
        w = self.weights
        h = self.hp.hidden
        if self.hp.layernorm:
            return F.layer_norm(x, (h,), w[prefix_w], w[prefix_b], 1e-5)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w[prefix_w]

    def _rope(self, x, s):
        d = x.shape[-1]
        inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))
        freqs = torch.outer(torch.arange(s, dtype=torch.float32, device=x.device), inv)
        emb = torch.cat([freqs, freqs], dim=-1)[None, :, None, :]  # [1, s, 1, d]
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return x * emb.cos() + torch.cat([-x2, x1], dim=-1) * emb.sin()

    def _linear(self, name, x, bias_name=None, replicated_input=True):
        w = self.weights
        if self.flex is None:
            return F.linear(x, w[name], w.get(bias_name))
        y = self.flex.linear(name, x, w[name], replicated_input)
        return y + w[bias_name] if bias_name in w else y

    def embed(self, ids):
        w, g = self.weights, self.groups
        W = w["embedding.word_embeddings.weight"]
        rows, start = W.shape[0], self.vocab_start
        outside = (ids < start) | (ids >= start + rows)
        e = F.embedding((ids - start).masked_fill(outside, 0), W)
        e = e.masked_fill(outside.unsqueeze(-1), 0.0)
        e = parallel.reduce_from_tp(e, g)
        if not self.hp.rope:
            e = e + w["embedding.position_embeddings.weight"][: ids.shape[1]].unsqueeze(0)
        return e

    def attention_core(self, q, k, v):
        """Scores, causal mask, softmax and probs @ v of this rank's heads: q [b, s, n, d],
        k and v [b, s, groups, d] (each group shared by n / groups query heads); returns
        the context [b, s, n·d]. The part that selective recomputation recomputes (its
        [b, n, s, s] scores and probabilities are most of a layer's activations)."""
        CALLS["attention_core"] += 1
        b, s, n, d = q.shape
        r = n // k.shape[2]
        q = q.transpose(1, 2)
        k = k.transpose(1, 2).repeat_interleave(r, dim=1)
        v = v.transpose(1, 2).repeat_interleave(r, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        causal = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        probs = scores.masked_fill(causal, float("-inf")).softmax(dim=-1)
        return (probs @ v).transpose(1, 2).reshape(b, s, n * d)

    def layer(self, i, x):
        CALLS["layer"] += 1
        w, g, hp = self.weights, self.groups, self.hp
        p = f"{self.model.layer_prefix}{i}."
        b, s, _ = x.shape
        r, d = hp.heads // hp.groups, hp.kv_channels
        # attention (this rank's query groups: all of them, g / tp, or with tp_weights its share)
        a = p + "self_attention."
        gl = uneven.local_query_groups(w[a + "linear_qkv.weight"].shape[0], hp.heads, hp.groups, d)
        y = self._norm(x, a + "linear_qkv.layer_norm_weight", a + "linear_qkv.layer_norm_bias")
        qkv = self._linear(a + "linear_qkv.weight", parallel.copy_to_tp(y, g), a + "linear_qkv.bias")
        qkv = qkv.view(b, s, gl, r + 2, d)
        q = qkv[:, :, :, :r].reshape(b, s, gl * r, d)
        k, v = qkv[:, :, :, r], qkv[:, :, :, r + 1]
        if hp.rope:
            q, k = self._rope(q, s), self._rope(k, s)
        if self.recompute.granularity == "selective":
            CALLS["checkpoint"] += 1
            ctx = checkpoint(self.attention_core, q, k, v, use_reentrant=False)
        else:
            ctx = self.attention_core(q, k, v)
        out = parallel.reduce_from_tp(self._linear(a + "linear_proj.weight", ctx, replicated_input=False), g)
        if hp.bias:
            out = out + w[a + "linear_proj.bias"]
        x = x + out
        # mlp
        m = p + "mlp."
        y = self._norm(x, m + "linear_fc1.layer_norm_weight", m + "linear_fc1.layer_norm_bias")
        h = self._linear(m + "linear_fc1.weight", parallel.copy_to_tp(y, g), m + "linear_fc1.bias")
        if hp.swiglu:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h)
        out = parallel.reduce_from_tp(self._linear(m + "linear_fc2.weight", h, replicated_input=False), g)
        if hp.bias:
            out = out + w[m + "linear_fc2.bias"]
        return x + out

    def layers(self, begin, end, x):
        """Local layers [begin, end) on x."""
        for i in range(begin, end):
            x = self.layer(i, x)
        return x

    def loss(self, x, labels, mask, total_tokens):
        """Sum over the micro-batch of the token losses / tokens of the global batch."""
        w, g, hp = self.weights, self.groups, self.hp
        x = self._norm(x, "decoder.final_layernorm.weight", "decoder.final_layernorm.bias")
        W = w.get("output_layer.weight")
        if W is None:
            W = w["embedding.word_embeddings.weight"]
        rows, start = W.shape[0], self.vocab_start
        valid = max(0, min(rows, hp.vocab - start))
        logits = F.linear(parallel.copy_to_tp(x, g), W)
        per_token = parallel.vocab_parallel_cross_entropy(logits.reshape(-1, rows), labels.reshape(-1), start, valid, g)
        return (per_token * mask.reshape(-1)).sum() / total_tokens

    def forward(self, inp, labels=None, mask=None, total_tokens=None):
        """First stage: inp are token ids; others: hidden states. Last stage returns
        the loss term, others the hidden states."""
        x = self.embed(inp) if self.groups.first_stage else inp
        for begin, end, recomputed in self.recompute.segments(self.num_local_layers):
            if recomputed:
                CALLS["checkpoint"] += 1
                x = checkpoint(self.layers, begin, end, x, use_reentrant=False)
            else:
                x = self.layers(begin, end, x)
        if self.groups.last_stage:
            return self.loss(x, labels, mask, total_tokens)
        return x
