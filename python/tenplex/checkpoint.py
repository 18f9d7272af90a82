"""Checkpoint directories (spec ptc-layout.md §7), written by many ranks at once.

A directory holds `tenplex.json` ({"model": <model JSON>, "config": "<config>", plus
"step", "samples_consumed" and other fields}) and `rank-%05d.safetensors` per rank
with that rank's local tensors under their local names, padding zeroed.

Writing, as the C++ writer does: files go into a staging directory beside the target
(`<dir>.partial`); every rank writes its file there (temporary name, fsync, rename);
after all ranks are done, rank 0 writes `tenplex.json` last, with the xxh64 of every rank
file under "checksums" (the tenplex commands require them), and renames the staging
directory onto the target. A crash therefore never leaves a directory that looks
complete. The target must not exist or be empty (checkpoints are not overwritten).
"""

import concurrent.futures
import ctypes
import ctypes.util
import json
import os
import shutil

from . import safetensors

INFO_FILE = "tenplex.json"


class CheckpointError(ValueError):
    pass


_XXH = None


def _libxxhash():
    """libxxhash (the library the tenplex binary links), loaded once through ctypes."""
    global _XXH
    if _XXH is None:
        name = ctypes.util.find_library("xxhash") or "libxxhash.so.0"
        try:
            lib = ctypes.CDLL(name)
        except OSError as e:
            raise CheckpointError(f"cannot load libxxhash for checkpoint checksums ({e}); install libxxhash0") from None
        lib.XXH64_createState.restype = ctypes.c_void_p
        lib.XXH64_freeState.argtypes = [ctypes.c_void_p]
        lib.XXH64_reset.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong]
        lib.XXH64_update.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
        lib.XXH64_digest.argtypes = [ctypes.c_void_p]
        lib.XXH64_digest.restype = ctypes.c_ulonglong
        _XXH = lib
    return _XXH


def file_xxh64(path, chunk=1 << 20):
    """xxh64 (seed 0) of a whole file as 16 hex digits, as tenplex.json records it. Read
    into one reused buffer of `chunk` bytes, which stays in the CPU's cache (a new 16 MiB
    bytes object per read hashed 3.7-5.1 GB/s of /dev/shm here, this 5.5-6.2); the GIL
    is released while it reads and hashes (ctypes, readinto), so files hash in parallel."""
    lib = _libxxhash()
    buf = bytearray(chunk)
    view, cbuf = memoryview(buf), (ctypes.c_char * chunk).from_buffer(buf)
    state = lib.XXH64_createState()
    try:
        lib.XXH64_reset(state, 0)
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(view):
                lib.XXH64_update(state, cbuf, n)
        return "%016x" % lib.XXH64_digest(state)
    finally:
        view.release()
        lib.XXH64_freeState(state)


def files_xxh64(paths):
    """file_xxh64 of each path, several at once (threads: the hashing runs without the GIL)."""
    if len(paths) <= 1:
        return [file_xxh64(p) for p in paths]
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(paths), os.cpu_count() or 1, 8)) as pool:
        return list(pool.map(file_xxh64, paths))


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
    info = dict(info)
    names = [rank_file(r) for r in range(world_size)]
    info["checksums"] = dict(zip(names, files_xxh64([os.path.join(stage, n) for n in names])))
    tmp = os.path.join(stage, INFO_FILE + ".tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(info, indent=1) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(stage, INFO_FILE))
    move_into_place(stage, directory)


def move_into_place(stage, directory):
    """Renames a finished staging directory (synced now) onto directory, which must be
    absent or empty (check_target: CheckpointError), and syncs its parent."""
    safetensors.fsync_path(stage)
    check_target(directory)
    if os.path.isdir(directory):
        os.rmdir(directory)
    os.replace(stage, directory)
    safetensors.fsync_path(os.path.dirname(os.path.abspath(directory)) or ".")


def read_info(directory):
    path = os.path.join(directory, INFO_FILE)
    if not os.path.lexists(path):
        raise CheckpointError(f"{path} is missing: {directory} is not a complete tenplex checkpoint")
    try:
        f = safetensors.open_regular(path)  # a FIFO or directory is refused, not waited on
    except safetensors.SafetensorsError as e:
        raise CheckpointError(str(e)) from None
    with f:
        try:
            info = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise CheckpointError(f"{path} is not JSON ({e})") from None
    if not isinstance(info, dict) or "model" not in info or not isinstance(info.get("config"), str):
        raise CheckpointError(f'{path} needs "model" and "config"')
    return info


def read_rank(directory, rank):
    path = os.path.join(directory, rank_file(rank))
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint {directory} lacks {rank_file(rank)}")
    return safetensors.load(path)
