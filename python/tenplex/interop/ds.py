"""DeepSpeed universal checkpoints (the output of DeepSpeed's ds_to_universal) -> tenplex.

`python -m deepspeed.checkpoint.ds_to_universal --input_folder ROOT/global_stepN
--output_folder ROOT/global_stepN_universal` turns a ZeRO stage 1/2/3 checkpoint into one
folder per parameter holding the whole (unpartitioned, TP-merged, vocabulary padding
stripped) tensors:

  U/zero/<param name>/fp32.pt        {"param": fp32 tensor, "cat_dim": ...} (stage <= 2),
                                     a bare tensor (stage 3)
  U/zero/<param name>/exp_avg.pt     Adam's first moment, same form
  U/zero/<param name>/exp_avg_sq.pt  Adam's second moment, same form
  U/zero/<param name>/step.pt        Adam's step count (a tensor or int)
  U/zero/optimizer_state.pt          param_groups, loss scaler, ... (not tensors per parameter)
  U/mp_rank_TT_model_states.pt       {"module": state dict in the training dtype, "iteration",
                                     "global_steps", "global_samples", "param_shapes", ...}
  ROOT/latest_universal              "global_stepN_universal"

SRC is U or ROOT (then `latest_universal` names U). The parameter names must be tenplex
global names (spec §1: a model built with those names, as in tests/interop_ds_test.py);
an optional leading `module.` is dropped. Every parameter of the model must be present
and every name in zero/ must be a parameter of the model. Each global tensor is put whole
into every target piece, one file at a time (torch.load with mmap), so memory stays at
about one parameter.

Parameters: from the single model-states file's `module` when the source had no tensor
parallelism (the values DeepSpeed trained with, bf16 or fp32); otherwise, or when a
parameter is absent there, the fp32 master copy rounded to the parameter dtype (what
DeepSpeed's mixed-precision optimizers copy back after each step). fp32 master copies
(for non-fp32 parameters) and Adam moments come from the universal files; `step` is the
model-states `iteration` (else `global_steps`), `samples_consumed` its `global_samples`.
"""

import os
import re

from .. import safetensors as st
from . import pickles
from .dcp import to_numpy
from .ptc import InteropError

LATEST = "latest_universal"
STATE_FILES = {"exp_avg": "exp_avg.pt", "exp_avg_sq": "exp_avg_sq.pt"}
_MODEL_STATES = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")


def universal_dir(src):
    """The universal folder (holding zero/) of SRC, which is it or its parent."""
    if os.path.isdir(os.path.join(src, "zero")):
        return src
    latest = os.path.join(src, LATEST)
    if os.path.isfile(latest):
        with open(latest) as f:
            tag = f.read().strip()
        u = os.path.join(src, tag)
        if not tag or not os.path.isdir(os.path.join(u, "zero")):
            raise InteropError(f"{latest} names '{tag}', which is not a universal checkpoint folder with zero/")
        return u
    raise InteropError(
        f"{src}: no zero/ folder and no {LATEST} file (not a DeepSpeed universal checkpoint; "
        "make one with python -m deepspeed.checkpoint.ds_to_universal)"
    )


def _load(path):
    return pickles.load(path, "DeepSpeed checkpoint file", mmap=True)


def model_states(u):
    """(path, loaded dict) of mp_rank_00_model_states.pt and the number of mp_rank files."""
    files = sorted(f for f in os.listdir(u) if _MODEL_STATES.match(f))
    if not files:
        raise InteropError(f"{u}: no mp_rank_*_model_states.pt (ds_to_universal copies them from the source)")
    path = os.path.join(u, files[0])
    sd = _load(path)
    if not isinstance(sd, dict):
        raise InteropError(f"{path}: not a DeepSpeed model-states dict")
    return path, sd, len(files)


def _tensor(path, what, shape):
    """The fp32 tensor stored in a universal file, checked against the global shape."""
    import torch

    d = _load(path)
    t = d.get("param") if isinstance(d, dict) else d
    if not torch.is_tensor(t):
        raise InteropError(f"{path}: no tensor (expected {{'param': tensor}} or a tensor)")
    if list(t.shape) != list(shape):
        raise InteropError(
            f"{path}: {what} has shape {list(t.shape)}, the model says {list(shape)}"
            f"{' (padded vocabulary?)' if isinstance(d, dict) and d.get('vocab_tensor') else ''}"
        )
    if t.dtype != torch.float32:
        raise InteropError(f"{path}: {what} is {t.dtype}, expected torch.float32")
    return t.contiguous()


def _np(t):
    return to_numpy(t.detach())  # DeepSpeed saves slices of parameters (requires_grad)


def _names(zero):
    """{global name: folder} of the parameter folders under zero/."""
    out: dict[str, str] = {}
    for entry in sorted(os.listdir(zero)):
        if not os.path.isdir(os.path.join(zero, entry)):
            continue
        name = entry.removeprefix("module.")
        if name in out:
            raise InteropError(f"{zero}: parameter '{name}' appears twice ('{entry}' and '{out[name]}')")
        out[name] = entry
    return out


def _module(sd, n_files):
    """{global name: tensor} of the model-states `module` when it holds whole tensors."""
    m = sd.get("module")
    if n_files != 1 or not isinstance(m, dict):
        return {}
    return {k.removeprefix("module."): v for k, v in m.items()}


def _check_names(u, zero_names, params, module):
    unknown = sorted(set(zero_names) - set(params))
    if unknown:
        raise InteropError(
            f"{u}/zero: unknown parameter '{unknown[0]}'"
            f"{f' (and {len(unknown) - 1} more)' if len(unknown) > 1 else ''}: not a global "
            "tensor of the model (parameter names must be tenplex global names)"
        )
    for p in params:
        if p not in zero_names:
            raise InteropError(f"{u}/zero: parameter '{p}' is missing")
    extra = sorted(k for k in module if k not in params and not k.endswith("._extra_state"))
    if extra:
        raise InteropError(
            f"{u}: model-states module has unknown tensor '{extra[0]}' (not a global tensor of the model)"
        )


def _param_value(name, dtype, shape, fp32, module, path, log):
    """The parameter in its model dtype: DeepSpeed's module tensor, else fp32 rounded."""
    want = st.DTYPES[dtype][0]
    t = module.get(name)
    if t is None:
        log(f"'{name}': not in the model states; the parameter is its fp32 master copy rounded to {dtype}")
        return fp32.to(want)
    if list(t.shape) != list(shape) or t.dtype != want:
        raise InteropError(
            f"{path}: module tensor '{name}' is {t.dtype}{list(t.shape)}, the model says {dtype}{list(shape)}"
        )
    return t.contiguous()


def import_(src, writer, log):
    """Puts every parameter, fp32 master copy and Adam moment of a universal checkpoint;
    returns the zero_ok prefixes for Writer.finish (none: everything is carried)."""
    u = universal_dir(src)
    zero = os.path.join(u, "zero")
    states_path, sd, n_files = model_states(u)
    module = _module(sd, n_files)
    if n_files != 1:
        log(
            f"{u}: {n_files} model-states files (tensor-parallel source); parameters are the fp32 master "
            "copies rounded to the model dtype"
        )
    params = {t["path"]: (t["dtype"], list(t["shape"])) for t in writer.model["tensors"]}
    zero_names = _names(zero)
    _check_names(u, zero_names, params, module)
    kinds = list(writer.model.get("optimizer", {}).get("states", []))
    for k in kinds:
        if k not in STATE_FILES:
            raise InteropError(
                f"the model's optimizer state '{k}' has no DeepSpeed universal file (known: {', '.join(STATE_FILES)})"
            )
    for name, (dtype, shape) in params.items():
        folder = os.path.join(zero, zero_names[name])
        box = [(0, n) for n in shape]
        fp32 = _tensor(os.path.join(folder, "fp32.pt"), f"'{name}' fp32", shape)
        writer.put(name, box, _np(_param_value(name, dtype, shape, fp32, module, states_path, log)), dtype)
        comp = "optimizer.fp32_param." + name
        if comp in writer.globals:
            writer.put(comp, box, _np(fp32), "F32")
        del fp32
        for k in kinds:
            path = os.path.join(folder, STATE_FILES[k])
            if not os.path.isfile(path):
                raise InteropError(f"{path} is missing (parameter '{name}' has no {k}: frozen or never stepped?)")
            writer.put(f"optimizer.{k}.{name}", box, _np(_tensor(path, f"'{name}' {k}", shape)), "F32")
    step = sd.get("iteration", sd.get("global_steps"))
    if isinstance(step, int):
        writer.extra["step"] = step
    if isinstance(sd.get("global_samples"), int):
        writer.extra["samples_consumed"] = sd["global_samples"]
    return []
