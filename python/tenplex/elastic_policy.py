"""Config policies of tenplex.elastic: which parallel config a job runs in for each
world size (a table, or ``tenplex config suggest``), and the tenplex CLI it asks.

``suggest:`` policies run ``tenplex config suggest`` (a process, not the native module):
its arguments are the CLI's own option language (``--model``, ``--device-profile``,
``--recompute``, ...), which lives in the CLI, and the policy module (memory and step-time
models, device profiles, presets) is not linked into ``_tenplex``; a binding would copy
the option set. It runs once when the job starts and once per new world size.
"""

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from typing import Any, Optional, Union

from . import _tenplex
from .elastic_cluster import ElasticError
from .layout import Config


class SuggestPolicy:
    """The config policy (``tenplex config suggest``, docs/policy.md) instead of a table:
    for each world size the best-ranked config that fits and uses every worker."""

    def __init__(self, args: Iterable[str]) -> None:
        self.args = list(args)


Policy = Union[dict[int, str], SuggestPolicy]  # world size -> config string, or a suggest: policy


def read_policy(policy: Union[str, dict[Any, Any]]) -> Policy:
    """{world size: config string} from a policy file path, a JSON text or a dict; or, for
    ``"suggest:ARGS"`` (e.g. ``"suggest:--model m.json --device-profile cpu"``), a
    SuggestPolicy that asks ``tenplex config suggest ARGS`` at start-up."""
    if isinstance(policy, str) and policy.startswith("suggest:"):
        args = policy[len("suggest:") :].split()
        if "--model" not in args:
            raise ElasticError(f"policy {policy!r}: suggest needs --model M (the model JSON or a preset)")
        return SuggestPolicy(args)
    if isinstance(policy, dict):
        raw = policy
    else:
        text = policy
        if not policy.lstrip().startswith("{"):
            try:
                with open(policy) as f:
                    text = f.read()
            except OSError as e:
                raise ElasticError(f"cannot read policy file {policy}: {e}") from None
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise ElasticError(f"policy {policy}: not JSON ({e})") from None
    if not isinstance(raw, dict) or not raw:
        raise ElasticError(
            'policy: expected a JSON object mapping world sizes to configs, e.g. {"4": "tp=2,pp=2", "2": "tp=2"}'
        )
    out = {}
    for k, v in raw.items():
        try:
            n = int(k)
        except (TypeError, ValueError):
            n = 0
        if n < 1 or not isinstance(v, str):
            raise ElasticError(f"policy: entry {k!r}: {v!r} is not world size -> config string")
        try:
            cfg = Config.parse(v)
        except _tenplex.Error as e:
            raise ElasticError(f"policy: entry {k!r}: {e}") from None
        if cfg.world_size != n:
            raise ElasticError(f"policy: entry {k!r}: config {v} has world size {cfg.world_size}, not {n}")
        out[n] = str(cfg)
    return out


def suggest_choice(
    policy: SuggestPolicy, world_size: int, gpus_per_host: Optional[int] = None
) -> tuple[str, list[str]]:
    """The best config of `tenplex config suggest` that fits and uses all world_size
    workers, and its Megatron-LM arguments (the knobs the policy chose with it:
    micro-batch, recomputation, sequence parallelism, virtual stages)."""
    cmd = [tenplex_binary(), "config", "suggest", *policy.args, "--gpus", str(world_size), "--all", "--json"]
    if gpus_per_host and "--gpus-per-host" not in policy.args:
        cmd += ["--gpus-per-host", str(gpus_per_host)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise ElasticError(f"tenplex config suggest failed: {(r.stderr or r.stdout).strip()}")
    try:
        configs = json.loads(r.stdout)["configs"]
    except (ValueError, KeyError, TypeError) as e:
        raise ElasticError(f"tenplex config suggest: unreadable output ({e})") from None
    for c in configs:
        cfg = Config.parse(c["config"])
        if c.get("fits") and cfg.world_size == world_size:
            return str(cfg), list(c.get("megatron_args", []))
    raise ElasticError(f"tenplex config suggest has no config that fits on {world_size} workers")


def suggest_config(policy: SuggestPolicy, world_size: int, gpus_per_host: Optional[int] = None) -> str:
    """The config of suggest_choice."""
    return suggest_choice(policy, world_size, gpus_per_host)[0]


def pick_choice(policy: Policy, world_size: int, gpus_per_host: Optional[int] = None) -> tuple[str, list[str]]:
    """(config, Megatron-LM arguments of its knobs) for world_size: a table policy gives
    no arguments, a suggest: policy those of its choice."""
    if isinstance(policy, SuggestPolicy):
        return suggest_choice(policy, world_size, gpus_per_host)
    if world_size not in policy:
        raise ElasticError(
            f"the policy has no config for world size {world_size} "
            f"(it has {sorted(policy)}): add an entry or change --nnodes/--nproc_per_node"
        )
    return policy[world_size], []


def pick_config(policy: Policy, world_size: int, gpus_per_host: Optional[int] = None) -> str:
    """The policy's config for world_size, or ElasticError naming the sizes it has."""
    return pick_choice(policy, world_size, gpus_per_host)[0]


def tenplex_binary() -> str:
    """The tenplex CLI: TENPLEX_BIN, else the `tenplex` beside this interpreter (where
    `pip install` puts it, docs/install.md), else `tenplex` on PATH. Never a path inside a
    source checkout: a package does not know where one is (set TENPLEX_BIN to a build's
    bin/tenplex)."""
    exe = os.environ.get("TENPLEX_BIN")
    if exe:
        return exe
    beside = os.path.join(os.path.dirname(sys.executable), "tenplex")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("tenplex")
    if found:
        return found
    raise ElasticError("cannot find the tenplex CLI: set TENPLEX_BIN or put tenplex on PATH")
