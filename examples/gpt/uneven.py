"""Uneven tensor and data parallelism in the training math (spec ptc-layout.md §9).

With `tp_weights=w0+w1+...` tp rank t holds a contiguous range of whole units of
every split tensor: query groups of linear_qkv / linear_proj, rows of each linear_fc1
block, columns of linear_fc2, groups of m vocabulary rows. The layout itself comes from
the native module (`tenplex.layout.local_params`, pieces included); what the forward
pass needs on top is read from it or computed here with the same rule:

  * attention: the number of query groups a rank holds follows from its linear_qkv
    rows, (a/g + 2)·d per group; every group is whole, so a rank's heads attend
    exactly as in the even split and linear_proj (split by the same groups) takes
    them; its all-reduce sums full [b, s, h] partials, so uneven pieces need no
    change there;
  * MLP: linear_fc1 of a rank is [k·f_t, h] with its rows of every block; SwiGLU's
    gate/up are the two halves; linear_fc2 takes the same f_t columns;
  * vocabulary: rank t's first global row is m · (units of ranks < t), not t · Vp/tp;
    the vocab-parallel embedding and cross entropy use that offset and the rank's own
    row count (only its first V - start rows are real words);
  * data: each step's global batch of B samples is cut into dp contiguous slices of
    apportion(B, dp_weights) samples (`dp_slice`). The loss is the sum of token
    losses over the global batch divided by the global batch's token count, computed
    per rank over its own samples and summed over dp, so every dp rank's gradient is
    weighted by its share of the global batch and the step equals the even run's.

Collectives of unequal pieces: the model's own collectives are all-reduces of
full-size tensors (TP partial sums, per-token softmax statistics), and ZeRO-1 gathers
equal dp pieces of one tp rank's flat buffer (spec §9 pads each tp rank's N to a
multiple of dp). Gathering tensors whose pieces differ by rank (a vocabulary-sharded
tensor, the FlexTP helpers' column shares) goes through `all_gather_uneven`: pad every
piece to the largest, gather, cut each back to its size.

`apportion` is spec §9's largest-remainder rule of the native layout
(src/tenplex/util/apportion.h); `vocab_start` is checked against the layout's pieces.
"""

import torch
import torch.distributed as dist

from tenplex import _tenplex


def apportion(units, weights):
    """Spec §9: `units` whole units over ranks in proportion to `weights` (largest
    remainder, ties to the lower rank): the native layout's (src/tenplex/util/apportion.h)
    where the Python module exports it, else the same rule here."""
    if hasattr(_tenplex, "apportion"):
        return list(_tenplex.apportion(units, list(weights)))
    if units < 0 or not weights or any(w < 1 for w in weights):
        raise ValueError(f"apportion({units}, {weights}): needs units >= 0 and weights >= 1")
    total = sum(weights)
    counts = [units * w // total for w in weights]
    order = sorted(range(len(weights)), key=lambda i: (-(units * weights[i] % total), i))
    for i in order[: units - sum(counts)]:
        counts[i] += 1
    return counts


def unit_range(units, weights, rank):
    """Rank's units [begin, end) of apportion(units, weights)."""
    counts = apportion(units, weights)
    begin = sum(counts[:rank])
    return begin, begin + counts[rank]


def config_weights(cfg, key, n):
    """The config's `key` weights (tp_weights, dp_weights) from its canonical string,
    n ones when it has none."""
    for part in str(cfg).split(","):
        k, _, v = part.partition("=")
        if k == key and v:
            return [int(x) for x in v.split("+")]
    return [1] * n


def tp_weights(cfg):
    return config_weights(cfg, "tp_weights", cfg.tp)


def dp_weights(cfg):
    return config_weights(cfg, "dp_weights", cfg.dp)


def dp_slice(global_batch, cfg, dp_rank):
    """[begin, end) of dp rank's samples in a global batch (spec §9 Data)."""
    return unit_range(global_batch, dp_weights(cfg), dp_rank)


def vocab_start(p, cfg, tp_rank):
    """First global vocabulary row of tp rank's local tensor of vocab-rule parameter p
    (a tenplex.layout.LocalParam): m · (units of lower ranks), units of m rows of the
    padded vocabulary Vp = ceil(V / (m·tp))·(m·tp)."""
    m = int(p.rule["divisible_by"])
    vocab = p.global_shape[0]
    vp = -(-vocab // (m * cfg.tp)) * (m * cfg.tp)
    begin, end = unit_range(vp // m, tp_weights(cfg), tp_rank)
    if (end - begin) * m != p.shape[0]:
        raise ValueError(f"{p.name}: {p.shape[0]} local rows, the apportionment gives {(end - begin) * m}")
    for g, local in p.pieces:  # the layout's pieces agree with the offset
        if g[0][0] - local[0][0] != begin * m:
            raise ValueError(
                f"{p.name}: the layout puts local row {local[0][0]} at global row {g[0][0]}, not at offset {begin * m}"
            )
    return begin * m


def local_query_groups(qkv_rows, heads, groups, kv_channels):
    """Query groups held by a rank whose linear_qkv weight has qkv_rows rows."""
    per = (heads // groups + 2) * kv_channels
    if qkv_rows % per:
        raise ValueError(f"linear_qkv has {qkv_rows} rows, not whole query groups of {per}")
    return qkv_rows // per


def all_gather_uneven(t, sizes, group, dim=0):
    """Concatenation along dim of every rank's t, where rank i's t has sizes[i] along dim
    (other dims equal): pieces are padded to max(sizes), gathered, and cut back."""
    if len(sizes) == 1:
        return t
    big = max(sizes)
    pad_shape = list(t.shape)
    pad_shape[dim] = big - t.shape[dim]
    padded = torch.cat([t, t.new_zeros(pad_shape)], dim=dim).contiguous() if pad_shape[dim] else t.contiguous()
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([p.narrow(dim, 0, n) for p, n in zip(parts, sizes)], dim=dim)
