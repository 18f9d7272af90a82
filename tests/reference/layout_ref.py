"""Parallel configurations and what each rank holds (spec ptc-layout.md §3-§5), in Python.

A second, independent implementation of the C++ layouts (src/tenplex/ptc), driven by
the same model description JSON ("tenplex.model.v1"): every tensor carries its TP rule
and stage, so nothing here knows about GPT. The training client (examples/gpt) uses it
to slice globally drawn tensors, to name local tensors and to build the ZeRO-1 flat
layout; tests compare it with `tenplex layout --json`.

Spec §9 uneven splits: with tp_weights every split dim is U whole units (a query group,
one row of each block, m vocabulary rows: tp_units) and tp rank t holds its contiguous
range of the largest-remainder apportionment of U (apportion, exact fractions).

Rank order is Megatron's, tensor-parallel fastest:
    tp_rank = r % tp;  dp_rank = (r // tp) % dp;  pp_rank = r // (tp * dp).

A local tensor is described by pieces (global box, local box) with equal extents;
local elements covered by no piece are padding (vocab rows >= V) and stay zero.
"""

import json
import math


class LayoutError(ValueError):
    pass


class Config:
    """A parallel configuration "tp=2,pp=2,dp=2[,zero=1][,layers=a+b]" with the spec §9
    uneven splits "tp_weights=3+1" and "dp_weights=2+1+1"."""

    KEYS = ("tp", "pp", "dp", "zero", "layers", "tp_weights", "dp_weights")

    def __init__(self, tp=1, pp=1, dp=1, zero=False, layers=None, tp_weights=None, dp_weights=None):
        self.tp, self.pp, self.dp, self.zero = tp, pp, dp, bool(zero)
        self.layers = list(layers or [])
        self.tp_weights = list(tp_weights or [])
        self.dp_weights = list(dp_weights or [])

    @classmethod
    def parse(cls, text):
        c = cls()
        if not text:
            raise LayoutError("config: empty (expected e.g. tp=2,pp=2,dp=2)")
        seen = set()
        for part in text.split(","):
            if "=" not in part:
                raise LayoutError(f"config: '{part}' is not key=value (keys: {', '.join(cls.KEYS)})")
            key, val = part.split("=", 1)
            if key in seen:
                raise LayoutError(f"config: {key} is given twice")
            seen.add(key)
            if key in ("tp", "pp", "dp"):
                v = _int(val, key)
                if v < 1:
                    raise LayoutError(f"config: {key} must be >= 1 (got {v})")
                setattr(c, key, v)
            elif key == "zero":
                v = _int(val, key)
                if v not in (0, 1):
                    raise LayoutError(f"config: zero must be 0 or 1 (got {v})")
                c.zero = v == 1
            elif key == "layers":
                c.layers = [_int(v, "layers") for v in val.split("+")]
                if any(v < 0 for v in c.layers):
                    raise LayoutError("config: layers per stage must be >= 0")
            elif key in ("tp_weights", "dp_weights"):
                w = [_int(v, key) for v in val.split("+")]
                if any(not 1 <= v <= 1000000 for v in w):
                    raise LayoutError(f"config: {key} must be integers in [1, 1000000]")
                setattr(c, key, w)
            else:
                raise LayoutError(f"config: unknown key '{key}' (keys: {', '.join(cls.KEYS)})")
        if c.layers and len(c.layers) != c.pp:
            raise LayoutError(f"config: layers= lists {len(c.layers)} stages but pp={c.pp}")
        for key, degree in (("tp_weights", c.tp), ("dp_weights", c.dp)):
            w = getattr(c, key)
            if w and len(w) != degree:
                raise LayoutError(f"config: {key}= lists {len(w)} weights but {key[:2]}={degree}")
        return c

    def __str__(self):
        s = f"tp={self.tp},pp={self.pp},dp={self.dp}"
        if self.zero:
            s += ",zero=1"
        if self.layers:
            s += ",layers=" + "+".join(map(str, self.layers))
        if self.tp_weights:
            s += ",tp_weights=" + "+".join(map(str, self.tp_weights))
        if self.dp_weights:
            s += ",dp_weights=" + "+".join(map(str, self.dp_weights))
        return s

    def __eq__(self, other):
        return str(self) == str(other)

    @property
    def world_size(self):
        return self.tp * self.pp * self.dp

    def tp_rank(self, r):
        return r % self.tp

    def dp_rank(self, r):
        return (r // self.tp) % self.dp

    def pp_rank(self, r):
        return r // (self.tp * self.dp)

    def rank_of(self, tp_rank, dp_rank, pp_rank):
        return tp_rank + self.tp * (dp_rank + self.dp * pp_rank)


def _int(text, key):
    try:
        return int(text, 10)
    except ValueError:
        raise LayoutError(f"config: {key} value '{text}' is not an integer") from None


class Model:
    """A model description (the JSON written by `tenplex model`)."""

    def __init__(self, desc):
        if isinstance(desc, str):
            desc = json.loads(desc)
        if desc.get("format") != "tenplex.model.v1":
            raise LayoutError(f"model: format is {desc.get('format')!r}, expected 'tenplex.model.v1'")
        self.desc = desc
        self.num_layers = int(desc["num_layers"])
        self.layer_prefix = desc.get("layer_prefix", "decoder.layers.")
        self.tensors = desc["tensors"]
        self.aliases = desc.get("aliases", [])
        self.optimizer_states = list(desc.get("optimizer", {}).get("states", []))
        self.info = desc.get("info", {})
        self.by_path = {t["path"]: t for t in self.tensors}

    @classmethod
    def load(cls, path):
        with open(path) as f:
            return cls(json.load(f))


def stage_bounds(model, cfg):
    L = model.num_layers
    if not cfg.layers:
        if L % cfg.pp:
            raise LayoutError(
                f"pp={cfg.pp} does not divide the {L} layers (L % pp != 0); give layers=a+b+... to split them unevenly"
            )
        per = [L // cfg.pp] * cfg.pp
    else:
        if sum(cfg.layers) != L:
            raise LayoutError(f"layers= sums to {sum(cfg.layers)} but the model has {L} layers")
        per = cfg.layers
    b = [0]
    for n in per:
        b.append(b[-1] + n)
    return b


def apportion(units, weights):
    """Spec §9: largest remainders with exact fractions; ties to the lower rank."""
    from fractions import Fraction

    W = sum(weights)
    quota = [Fraction(units * w, W) for w in weights]
    n = [int(q) for q in quota]
    for i in sorted(range(len(weights)), key=lambda i: (n[i] - quota[i], i))[: units - sum(n)]:
        n[i] += 1
    return n


def tp_units(shape, rule, T):
    """(U, unit): the spec §9 units along the split dim of a TP rule."""
    kind = rule["rule"]
    n = shape[rule.get("dim", 0)]
    if kind == "split":
        g = rule.get("granule", 1)
        return n // g, g
    if kind == "blocks":
        return n // rule["blocks"], 1
    if kind == "vocab":
        m = rule.get("divisible_by", 1)
        return math.ceil(n / (m * T)) * T, m
    return 0, 1


def validate(model, cfg):
    """Raises LayoutError naming the rule when cfg cannot hold model."""
    stage_bounds(model, cfg)
    T = cfg.tp
    if cfg.tp_weights:
        for t in model.tensors:
            r = t["tp"]
            if r["rule"] == "replicate":
                continue
            units, _ = tp_units(t["shape"], r, T)
            n = apportion(units, cfg.tp_weights)
            if 0 in n:
                raise LayoutError(
                    f"tp_weights={'+'.join(map(str, cfg.tp_weights))} gives tp rank {n.index(0)} "
                    f"no units of {t['path']}"
                )
        return
    for t in model.tensors:
        r = t["tp"]
        if r["rule"] == "split":
            n = t["shape"][r["dim"]]
            g = r.get("granule", 1)
            if g > 1:
                if n % g or (n // g) % T:
                    what = r.get("granule_name") or "units"
                    extra = " (g % tp != 0)" if what == "query groups" else ""
                    raise LayoutError(f"tp={T} does not divide the {n // g} {what} of {t['path']}{extra}")
            elif n % T:
                raise LayoutError(f"tp={T} does not divide dim {r['dim']} ({n}) of {t['path']}")
        elif r["rule"] == "blocks":
            block = t["shape"][r.get("dim", 0)] // r["blocks"]
            if block % T:
                raise LayoutError(f"tp={T} does not divide the blocks of {block} rows of {t['path']} (f % tp != 0)")


def tp_pieces(shape, rule, T, t, weights=None):
    """(local shape, [(global box, local box)]) of TP rank t of T; boxes are [(b, e), ...].
    With weights (spec §9), rank t holds its apportioned range of whole units."""
    full = [(0, n) for n in shape]
    kind = rule["rule"]
    if kind == "replicate":
        return list(shape), [(full, full)]
    if weights:
        return _weighted_pieces(shape, rule, T, t, weights)
    dim = rule.get("dim", 0)
    n = shape[dim]

    def with_dim(box, b, e):
        box = list(box)
        box[dim] = (b, e)
        return box

    local_shape = list(shape)
    if kind == "split":
        part = n // T
        local_shape[dim] = part
        return local_shape, [(with_dim(full, t * part, (t + 1) * part), with_dim(full, 0, part))]
    if kind == "blocks":
        B = rule["blocks"]
        block = n // B
        part = block // T
        local_shape[dim] = part * B
        return local_shape, [
            (with_dim(full, k * block + t * part, k * block + (t + 1) * part), with_dim(full, k * part, (k + 1) * part))
            for k in range(B)
        ]
    if kind == "vocab":
        m = rule.get("divisible_by", 1)
        vp = math.ceil(n / (m * T)) * m * T
        rows = vp // T
        local_shape[dim] = rows
        b, e = t * rows, min((t + 1) * rows, n)
        if e <= b:
            return local_shape, []
        return local_shape, [(with_dim(full, b, e), with_dim(full, 0, e - b))]
    raise LayoutError(f"unknown TP rule {kind!r}")


def _weighted_pieces(shape, rule, T, t, weights):
    dim = rule.get("dim", 0)
    units, unit = tp_units(shape, rule, T)
    counts = apportion(units, weights)
    b, e = sum(counts[:t]) * unit, sum(counts[: t + 1]) * unit
    full = [(0, n) for n in shape]
    local_shape = list(shape)

    def with_dim(box, lo, hi):
        box = list(box)
        box[dim] = (lo, hi)
        return box

    kind = rule["rule"]
    if kind == "split":
        local_shape[dim] = e - b
        return local_shape, [(with_dim(full, b, e), with_dim(full, 0, e - b))]
    if kind == "blocks":
        B, part = rule["blocks"], e - b
        local_shape[dim] = part * B
        return local_shape, [
            (with_dim(full, k * units + b, k * units + e), with_dim(full, k * part, (k + 1) * part)) for k in range(B)
        ]
    if kind == "vocab":
        local_shape[dim] = e - b
        hi = min(e, shape[dim])
        if hi <= b:
            return local_shape, []
        return local_shape, [(with_dim(full, b, hi), with_dim(full, 0, hi - b))]
    raise LayoutError(f"unknown TP rule {kind!r}")


class LocalParam:
    """One local parameter of a rank: local name, global path, slicing."""

    def __init__(self, name, path, dtype, global_shape, rule, shape, pieces, alias=False):
        self.name, self.path, self.dtype = name, path, dtype
        self.global_shape, self.rule = list(global_shape), rule
        self.shape, self.pieces, self.alias = shape, pieces, alias

    @property
    def numel(self):
        return math.prod(self.shape)

    def slice(self, global_tensor):
        """The local tensor (padding zero) cut from a full global tensor."""
        out = global_tensor.new_zeros(self.shape)
        for g, loc in self.pieces:
            out[tuple(slice(b, e) for b, e in loc)] = global_tensor[tuple(slice(b, e) for b, e in g)]
        return out

    def padding_mask(self):
        """Bool tensor of the local shape, True on padding elements."""
        import torch

        mask = torch.ones(self.shape, dtype=torch.bool)
        for _, loc in self.pieces:
            mask[tuple(slice(b, e) for b, e in loc)] = False
        return mask


def local_name(model, path, first_layer):
    p = model.layer_prefix
    if path.startswith(p):
        rest = path[len(p) :]
        i, _, tail = rest.partition(".")
        if i.isdigit():
            return f"{p}{int(i) - first_layer}.{tail}"
    return path


def _holds(stage, pp_rank, pp, bounds):
    if stage == "first":
        return pp_rank == 0
    if stage == "last":
        return pp_rank == pp - 1
    return bounds[pp_rank] <= stage["layer"] < bounds[pp_rank + 1]


def local_params(model, cfg, pp_rank, tp_rank):
    """The local parameters of (stage, tp rank) in spec order, alias replicas last."""
    bounds = stage_bounds(model, cfg)
    out = []
    for t in model.tensors:
        if not _holds(t["stage"], pp_rank, cfg.pp, bounds):
            continue
        shape, pieces = tp_pieces(t["shape"], t["tp"], cfg.tp, tp_rank, cfg.tp_weights)
        out.append(
            LocalParam(
                local_name(model, t["path"], bounds[pp_rank]), t["path"], t["dtype"], t["shape"], t["tp"], shape, pieces
            )
        )
    held = {p.path for p in out}
    for a in model.aliases:
        if _holds(a["stage"], pp_rank, cfg.pp, bounds) and a["target"] not in held:
            t = model.by_path[a["target"]]
            shape, pieces = tp_pieces(t["shape"], t["tp"], cfg.tp, tp_rank, cfg.tp_weights)
            out.append(LocalParam(a["name"], t["path"], t["dtype"], t["shape"], t["tp"], shape, pieces, alias=True))
    return out


def companion_kinds(model, dtype):
    kinds = list(model.optimizer_states)
    if kinds and dtype != "F32":
        kinds.append("fp32_param")
    return kinds


def flat_range(total, dp, dp_rank):
    """ZeRO-1: (begin, end, padded total) of dp rank's part of `total` flat elements."""
    padded = -(-total // dp) * dp
    per = padded // dp
    return dp_rank * per, (dp_rank + 1) * per, padded


def rank_tensors(model, cfg, rank):
    """[(local name, dtype, shape)] of everything rank holds, in file order:
    parameters, then optimizer companions by kind (per parameter, or flat with zero=1)."""
    validate(model, cfg)
    params = local_params(model, cfg, cfg.pp_rank(rank), cfg.tp_rank(rank))
    out = [(p.name, p.dtype, p.shape) for p in params]
    if not model.optimizer_states:
        return out
    if cfg.zero:
        b, e, _ = flat_range(sum(p.numel for p in params), cfg.dp, cfg.dp_rank(rank))
        kinds = list(model.optimizer_states)
        if any(p.dtype != "F32" for p in params):
            kinds.append("fp32_param")
        out += [(f"optimizer.flat.{k}", "F32", [e - b]) for k in kinds]
    else:
        kinds = list(model.optimizer_states) + ["fp32_param"]
        for k in kinds:
            out += [(f"optimizer.{k}.{p.name}", "F32", p.shape) for p in params if k in companion_kinds(model, p.dtype)]
    return out
