"""Checkpoint directories (spec ptc-layout.md §7), written by many ranks at once.

A directory holds `tenplex.json` ({"model": <model JSON>, "config": "<config>", plus
"step", "samples_consumed" and other fields}) and `rank-%05d.safetensors` per rank
with that rank's local tensors under their local names, padding zeroed.

Writing, as the C++ writer does: files go into a staging directory beside the target
(`<dir>.partial`); every rank writes its file there (temporary name, fsync, rename);
after all ranks are done, rank 0 writes `tenplex.json` last and renames the staging
directory onto the target. A crash therefore never leaves a directory that looks
complete. The target must not exist or be empty (checkpoints are not overwritten).
"""
import json
import os
import shutil

from . import safetensors

INFO_FILE = "tenplex.json"


class CheckpointError(ValueError):
    pass


def rank_file(rank):
    return f"rank-{rank:05d}.safetensors"


def staging_dir(directory):
    return os.path.abspath(directory).rstrip("/") + ".partial"


def check_target(directory):
    if os.path.exists(directory) and (not os.path.isdir(directory) or os.listdir(directory)):
        raise CheckpointError(f"{directory} exists and is not an empty directory (checkpoints are not overwritten)")


def begin(directory):
    """Rank 0, before any rank writes: checks the target and makes a fresh staging directory."""
    check_target(directory)
    stage = staging_dir(directory)
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage)


def write_rank(directory, rank, tensors, metadata=None):
    """Every rank: writes its local tensors ([(name, tensor)]) into the staging directory."""
    safetensors.save(os.path.join(staging_dir(directory), rank_file(rank)), tensors, metadata)


def commit(directory, info, world_size):
    """Rank 0, after every rank wrote: tenplex.json last, then the directory moves in place."""
    stage = staging_dir(directory)
    for r in range(world_size):
        if not os.path.exists(os.path.join(stage, rank_file(r))):
            raise CheckpointError(f"checkpoint {directory}: {rank_file(r)} was not written")
    tmp = os.path.join(stage, INFO_FILE + ".tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(info, indent=1) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(stage, INFO_FILE))
    safetensors.sync_dir(stage)
    check_target(directory)
    if os.path.isdir(directory):
        os.rmdir(directory)
    os.replace(stage, directory)
    safetensors.sync_dir(os.path.dirname(os.path.abspath(directory)) or ".")


def read_info(directory):
    path = os.path.join(directory, INFO_FILE)
    if not os.path.exists(path):
        raise CheckpointError(f"{path} is missing: {directory} is not a complete tenplex checkpoint")
    with open(path) as f:
        try:
            info = json.load(f)
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{path} is not JSON ({e})") from None
    if not isinstance(info, dict) or "model" not in info or not isinstance(info.get("config"), str):
        raise CheckpointError(f"{path} needs \"model\" and \"config\"")
    return info


def read_rank(directory, rank):
    path = os.path.join(directory, rank_file(rank))
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint {directory} lacks {rank_file(rank)}")
    return safetensors.load(path)
