"""Parallel configurations and what each rank holds (docs/layout.md), from the native
module: the C++ layouts of src/tenplex/ptc are the one implementation. This module
adds what a PyTorch training loop needs on top: slicing a full global tensor into a
rank's local tensor, and padding masks.

    cfg = Config.parse("tp=2,pp=2,dp=2,zero=1")
    model = Model.load("gpt.json")                   # from `tenplex model gpt`
    validate(model, cfg)                             # InvalidArgumentError naming the rule
    for p in local_params(model, cfg, pp_rank=0, tp_rank=1):
        local = p.slice(full_global_tensor[p.path])  # padding (vocab rows >= V) zero
    rank_tensors(model, cfg, rank)                   # [(name, dtype, shape)] incl. optimizer state
    begin, end, padded = flat_range(total, cfg.dp, dp_rank)   # ZeRO-1 ranges

Uneven splits for devices of different speed (spec §9, docs/hetero.md): a config may
give `tp_weights=3+1` (tp rank t's share of every TP split, in whole units: query
groups, rows, m vocabulary rows) and `dp_weights=2+1+1` (dp rank j's share of each global
batch, tenplex.data); local shapes then differ between tp ranks. `cfg.tp_weights`,
`cfg.dp_weights` are the weights as given ([] when none); `apportion(units, weights)` is
the largest-remainder split; `canonical_config(model, cfg)` drops weights that change
nothing.

Rank order is Megatron's, tensor-parallel fastest:
    tp_rank = r % tp;  dp_rank = (r // tp) % dp;  pp_rank = r // (tp * dp).

A local tensor is described by pieces (global box, local box) with equal extents;
local elements covered by no piece are padding and stay zero.
"""

import json
import math

from . import _tenplex

Config = _tenplex.Config
LayoutError = _tenplex.InvalidArgumentError  # also a ValueError


class Model:
    """A model description (the JSON written by `tenplex model gpt`): its fields for
    Python code, and its text for the native layout functions."""

    def __init__(self, desc):
        if isinstance(desc, str):
            desc = json.loads(desc)
        if desc.get("format") != "tenplex.model.v1":
            raise LayoutError(f"model: format is {desc.get('format')!r}, expected 'tenplex.model.v1'")
        self.desc = desc
        self.text = json.dumps(desc)
        _tenplex.validate(self.text, Config.parse("tp=1"))  # the native parser checks every field
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


apportion = _tenplex.apportion  # (units, weights) -> units per rank, spec §9


def canonical_config(model, cfg):
    """Spec §9 canonical config string: all-equal weights dropped where the even split applies."""
    return _tenplex.canonical_config(model.text, cfg)


def stage_bounds(model, cfg):
    """[first layer of each stage..., num_layers]."""
    return _tenplex.stage_bounds(model.text, cfg)


def validate(model, cfg):
    """Raises LayoutError (InvalidArgumentError, a ValueError) naming the rule when cfg
    cannot hold model."""
    _tenplex.validate(model.text, cfg)


def flat_range(total, dp, dp_rank):
    """ZeRO-1: (begin, end, padded total) of dp rank's part of `total` flat elements."""
    return _tenplex.zero_flat_range(total, dp, dp_rank)


def _slices(box):
    return tuple(slice(b, e) for b, e in box)


class LocalParam:
    """One local parameter of a rank: local name, global path, slicing."""

    def __init__(self, model, d):
        t = model.by_path[d["path"]]
        self.name, self.path, self.dtype = d["name"], d["path"], d["dtype"]
        self.global_shape, self.rule = list(t["shape"]), t["tp"]
        self.shape, self.alias = list(d["shape"]), d["alias"]
        self.pieces = [(list(g), list(loc)) for g, loc in d["pieces"]]

    @property
    def numel(self):
        return math.prod(self.shape)

    def slice(self, global_tensor):
        """The local tensor (padding zero) cut from a full global tensor."""
        out = global_tensor.new_zeros(self.shape)
        for g, loc in self.pieces:
            out[_slices(loc)] = global_tensor[_slices(g)]
        return out

    def padding_mask(self):
        """Bool tensor of the local shape, True on padding elements."""
        import torch

        mask = torch.ones(self.shape, dtype=torch.bool)
        for _, loc in self.pieces:
            mask[_slices(loc)] = False
        return mask


def local_params(model, cfg, pp_rank, tp_rank):
    """The local parameters of (stage, tp rank) in spec order, alias replicas last."""
    return [LocalParam(model, d) for d in _tenplex.rank_params(model.text, cfg, pp_rank, tp_rank)]


def rank_tensors(model, cfg, rank):
    """[(local name, dtype, shape)] of everything rank holds, in file order:
    parameters, then optimizer companions by kind (per parameter, or flat with zero=1)."""
    return [(n, d, list(s)) for n, d, s in _tenplex.rank_tensors(model.text, cfg, rank)]
