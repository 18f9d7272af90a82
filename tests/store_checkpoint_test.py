#!/usr/bin/env python3
"""Integration test of `tenplex store load|save` (the ctest store_checkpoint): checkpoint
directories loaded into the store daemon and saved back are byte-identical, through shared
memory and over HTTP; bad checksums are refused without leaving a version behind; every
field of a version's info survives.

Usage: TENPLEX_BIN=build/bin/tenplex python -m pytest tests/store_checkpoint_test.py (pytest)

The references are independent of the C++ code: safetensors files are written and read
here by hand, checksums come from the pure-Python XXH64 of store_testing.py.
"""

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import pytest
from store_testing import ELEM, Daemon, begin, check, commit, jget, put, rand_bytes, request, xxh64


# ---------------------------------------------------------------- checkpoints
def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, dtype, shape, bytes) in data order."""
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    off = 0
    for name, dtype, shape, data in tensors:
        header[name] = {"data_offsets": [off, off + len(data)], "dtype": dtype, "shape": shape}
        off += len(data)
    text = json.dumps(header, sort_keys=True, separators=(",", ":"))
    text += " " * ((8 - (len(text) + 8) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text.encode())
        for _, _, _, data in tensors:
            f.write(data)


def make_checkpoint(tenplex, ckpt, config, reorder=False):
    model_path = os.path.join(os.path.dirname(ckpt), "model.json")
    subprocess.run(
        [
            tenplex,
            "model",
            "gpt",
            "--num-layers",
            "2",
            "--hidden-size",
            "16",
            "--num-attention-heads",
            "4",
            "--vocab-size",
            "100",
            "--max-position-embeddings",
            "32",
            "-o",
            model_path,
        ],
        check=True,
    )
    layout = json.loads(
        subprocess.run(
            [tenplex, "layout", "--model", model_path, "--config", config, "--json"], check=True, capture_output=True
        ).stdout
    )
    os.makedirs(ckpt)
    sums = {}
    for rank in layout["ranks"]:
        tensors = []
        for i, t in enumerate(rank["tensors"]):
            n = ELEM[t["dtype"]]
            for d in t["shape"]:
                n *= d
            tensors.append((t["name"], t["dtype"], t["shape"], rand_bytes(n, rank["rank"] * 1000 + i)))
        tensors.append(("__step__", "I64", [], struct.pack("<q", 42)))  # extra tensor outside the layout
        if reorder:
            tensors.reverse()
        name = "rank-%05d.safetensors" % rank["rank"]
        write_safetensors(os.path.join(ckpt, name), tensors, {"format": "pt"} if reorder else None)
        with open(os.path.join(ckpt, name), "rb") as f:
            sums[name] = xxh64(f.read())
    with open(model_path) as f:
        model = json.load(f)
    with open(os.path.join(ckpt, "tenplex.json"), "w") as f:
        json.dump({"model": model, "config": config, "step": 42, "checksums": sums}, f)
    return layout


def run(tenplex, *args, ok=True):
    p = subprocess.run([tenplex, *args], capture_output=True, text=True, timeout=120)
    if ok:
        check(p.returncode == 0, "%s failed: %s %s" % (args, p.stdout, p.stderr))
    return p


def same_checkpoint(a, b):
    names = sorted(os.listdir(a))
    check(names == sorted(os.listdir(b)), (names, sorted(os.listdir(b))))
    for n in names:
        with open(os.path.join(a, n), "rb") as f:
            x = f.read()
        with open(os.path.join(b, n), "rb") as f:
            y = f.read()
        if n == "tenplex.json":
            check(json.loads(x) == json.loads(y), "tenplex.json differs")
        else:
            check(x == y, "%s differs after the round trip" % n)


def read_safetensors(path):
    """[(name, dtype, shape, bytes)] in data order."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    out = []
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, end = e["data_offsets"]
        out.append((name, e["dtype"], e["shape"], raw[8 + n + b : 8 + n + end]))
    return out


def check_info_fields(tenplex, d, tmp):
    """Every field of a version's info survives `store save` and `store load` (issue 16 bug 1).

    A version as `tenplex run` commits it (step, samples_consumed and other training
    fields at the top of its info) is saved: tenplex.json must carry every field; loaded
    back, the new version's info must carry them again, where the runner reads them."""
    src = os.path.join(tmp, "fields-src")
    layout = make_checkpoint(tenplex, src, "tp=2,pp=1,dp=1")
    with open(os.path.join(src, "tenplex.json")) as f:
        meta = json.load(f)
    fields = {"step": 24, "samples_consumed": 192, "seed": 5, "global_batch_size": 8, "note": {"a": [1, 2]}}
    info = {"model": meta["model"], "config": "tp=2,pp=1,dp=1", **fields}
    v = begin(d.url, "run", info=info)
    for rank in layout["ranks"]:
        name = "rank-%05d.safetensors" % rank["rank"]
        for t, dtype, shape, data in read_safetensors(os.path.join(src, name)):
            put(d.url, "jobs/run/%d/rank-%05d/%s" % (v, rank["rank"], t), dtype, shape, data)
    commit(d.url, "run", v)
    out = os.path.join(tmp, "fields-out")
    run(tenplex, "store", "save", "--url", d.url, "--job", "run", "--out", out)
    with open(os.path.join(out, "tenplex.json")) as f:
        saved = json.load(f)
    for k, want in fields.items():
        check(saved.get(k) == want, "store save lost info field %s: %r in tenplex.json" % (k, saved.get(k)))
    check(saved["config"] == "tp=2,pp=1,dp=1" and saved["model"] == meta["model"], "model/config changed")
    run(tenplex, "store", "load", "--url", d.url, "--job", "run2", "--dir", out)
    back = jget(d.url, "/v1/jobs/run2/versions/current")["info"]
    for k, want in fields.items():
        check(back.get(k) == want, "store load lost tenplex.json field %s: %r in the info" % (k, back.get(k)))
    # A tenplex.json field named like the store's bookkeeping ("cluster", "source") survives too.
    with open(os.path.join(src, "tenplex.json")) as f:
        meta = json.load(f)
    meta["cluster"] = "not ours"
    meta["source"] = [1, 2]
    with open(os.path.join(src, "tenplex.json"), "w") as f:
        json.dump(meta, f)
    run(tenplex, "store", "load", "--url", d.url, "--job", "run3", "--dir", src)
    out2 = os.path.join(tmp, "fields-out2")
    run(tenplex, "store", "save", "--url", d.url, "--job", "run3", "--out", out2)
    with open(os.path.join(out2, "tenplex.json")) as f:
        saved = json.load(f)
    for k in ("cluster", "source", "step"):
        check(saved.get(k) == meta[k], "field %s: %r after a round trip, %r before" % (k, saved.get(k), meta[k]))


def test_checkpoint(tenplex):
    tmp = tempfile.mkdtemp(prefix="tenplex-store-ckpt-")
    d = Daemon(tenplex)
    try:
        for config, reorder in [("tp=2,pp=2,dp=1", False), ("tp=1,pp=2,dp=2,zero=1", True)]:
            ck = os.path.join(tmp, "ck-" + config.replace(",", "_"))
            os.makedirs(ck)
            src = os.path.join(ck, "src")
            make_checkpoint(tenplex, src, config, reorder)
            job = "j" + str(len(config))
            p = run(tenplex, "store", "load", "--url", d.url, "--job", job, "--dir", src)
            check("shared memory" in p.stdout and "checksums verified" in p.stdout, p.stdout)
            out = os.path.join(ck, "out-shm")
            p = run(tenplex, "store", "save", "--url", d.url, "--job", job, "--out", out)
            check("shared memory" in p.stdout, p.stdout)
            same_checkpoint(src, out)
            # The same through HTTP bodies, into a second job.
            p = run(tenplex, "store", "load", "--url", d.url, "--job", job + "h", "--dir", src, "--http")
            check("via HTTP" in p.stdout, p.stdout)
            out2 = os.path.join(ck, "out-http")
            p = run(tenplex, "store", "save", "--url", d.url, "--job", job + "h", "--out", out2, "--http")
            check("via HTTP" in p.stdout, p.stdout)
            same_checkpoint(src, out2)
            # Saving onto an existing checkpoint is refused.
            p = run(tenplex, "store", "save", "--url", d.url, "--job", job, "--out", out, ok=False)
            check(p.returncode != 0 and "already exists" in p.stderr, p.stderr)
        check_info_fields(tenplex, d, tmp)
        # A corrupted rank file: the recorded checksum does not match, the load fails
        # and leaves no version behind.
        bad = os.path.join(tmp, "bad")
        make_checkpoint(tenplex, bad, "tp=2,pp=1,dp=1")
        fn = os.path.join(bad, "rank-00001.safetensors")
        with open(fn, "r+b") as f:
            f.seek(-5, 2)
            c = f.read(1)
            f.seek(-5, 2)
            f.write(bytes([c[0] ^ 0xFF]))
        p = run(tenplex, "store", "load", "--url", d.url, "--job", "bad", "--dir", bad, ok=False)
        check(p.returncode != 0 and "does not match" in p.stderr, p.stderr)
        status, _, body = request(d.url, "GET", "/v1/jobs/bad")
        check(status == 404 or json.loads(body)["versions"] == [], (status, body))
        p = run(tenplex, "store", "load", "--url", d.url, "--job", "bad", "--dir", os.path.join(tmp, "nope"), ok=False)
        check(p.returncode != 0 and "tenplex.json" in p.stderr, p.stderr)
        p = run(tenplex, "store", "save", "--url", d.url, "--job", "nojob", "--out", os.path.join(tmp, "o"), ok=False)
        check(p.returncode != 0 and "nojob" in p.stderr, p.stderr)
        p = run(tenplex, "store", "load", "--url", "http://127.0.0.1:1", "--job", "x", "--dir", bad, ok=False)
        check(p.returncode != 0 and "cannot reach" in p.stderr, p.stderr)
    finally:
        rc, err = d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    check(rc == 0, err)


if __name__ == "__main__":
    sys.exit(pytest.main([os.path.abspath(__file__), "-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
