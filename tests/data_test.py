"""Integration tests of `tenplex data` (issue 6), under pytest (issue 32 §4):

    python -m pytest tests/data_test.py::test_CASE   CASE in: cli, python_order, megatron,
                                                     fuse, dp_weights (ctest data_CASE)

TENPLEX_BIN is the CLI under test; tests/reference/data_ref.py (an independent
pure-Python implementation of the order and the index readers) is the reference, and
the package's tenplex.data (over the native module) must agree with it. The FUSE case really mounts: it fails,
never skips, where mounting is impossible.
"""

import importlib.util
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TENPLEX = os.environ.get("TENPLEX_BIN", os.path.join(ROOT, "build", "bin", "tenplex"))
DATA_PY = os.path.join(ROOT, "tests", "reference", "data_ref.py")

_spec = importlib.util.spec_from_file_location("tenplex_data_ref", DATA_PY)
pydata = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pydata)
from tenplex import data as tdata  # noqa: E402  (the package, from the venv: native order and readers)


def run(*args, ok=True):
    p = subprocess.run([TENPLEX, *map(str, args)], capture_output=True, text=True, timeout=120)
    if ok and p.returncode != 0:
        raise AssertionError(f"tenplex {' '.join(map(str, args))} failed ({p.returncode}): {p.stderr}")
    return p


def expect_error(words, *args):
    p = run(*args, ok=False)
    assert p.returncode != 0, f"tenplex {' '.join(map(str, args))} succeeded"
    assert "error" in p.stderr and words in p.stderr, (
        f"tenplex {' '.join(map(str, args))}: stderr {p.stderr!r} lacks {words!r}"
    )


def batches(index, seed, b, dp, rank, start, steps):
    p = run(
        "data",
        "batches",
        "--index",
        index,
        "--seed",
        seed,
        "--global-batch",
        b,
        "--dp",
        dp,
        "--rank",
        rank,
        "--start-sample",
        start,
        "--steps",
        steps,
        "--json",
    )
    return json.loads(p.stdout)


def read_json(index, ids):
    args = ["data", "read", "--index", index, "--json"]
    for i in ids:
        args += ["--sample", i]
    out = run(*args).stdout
    assert out.endswith("\n")
    return out[:-1].split("\n")


def read(index, ids):
    if not ids:
        return []
    args = ["data", "read", "--index", index]
    for i in ids:
        args += ["--sample", i]
    out = run(*args).stdout
    assert out.endswith("\n")
    return out[:-1].split("\n")


def write_jsonl(path, n, seed=0):
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"id": i, "text": "ä" * rng.randrange(0, 30) + "x" * rng.randrange(0, 200)}) + "\n")


# An independent MMIDIDX writer, from the format description in docs/data.md.
FORMATS = {1: "B", 2: "b", 3: "h", 4: "i", 5: "q", 6: "d", 7: "f", 8: "H"}


def write_megatron(prefix, seqs, doc_sizes, code=8):
    fmt = FORMATS[code]
    size = struct.calcsize(fmt)
    pointers, pos = [], 0
    with open(prefix + ".bin", "wb") as f:
        for s in seqs:
            pointers.append(pos)
            f.write(struct.pack(f"<{len(s)}{fmt}", *s))
            pos += len(s) * size
    docs = [0]
    for d in doc_sizes:
        docs.append(docs[-1] + d)
    assert docs[-1] == len(seqs)
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(seqs)))
        f.write(struct.pack("<Q", len(docs)))
        f.write(struct.pack(f"<{len(seqs)}i", *[len(s) for s in seqs]))
        f.write(struct.pack(f"<{len(seqs)}q", *pointers))
        f.write(struct.pack(f"<{len(docs)}q", *docs))


def test_cli(tmp):
    src = os.path.join(tmp, "d.jsonl")
    write_jsonl(src, 50)
    idx = os.path.join(tmp, "idx")
    out = run("data", "index", "--input", src, "--format", "jsonl", "-o", idx).stdout
    assert "50 samples" in out, out
    lines = open(src, encoding="utf-8").read().splitlines()
    assert read(idx, [0, 49, 7]) == [lines[0], lines[49], lines[7]]
    # --json: one object per line, the line as a string and its byte size.
    got = [json.loads(x) for x in read_json(idx, [49, 0])]
    assert got == [{"sample": i, "bytes": len(lines[i].encode()), "text": lines[i]} for i in (49, 0)], got
    r = batches(idx, 3, 8, 3, 2, 40, 4)
    assert [s["step"] for s in r["steps"]] == [5, 6, 7, 8]
    assert all(len(s["samples"]) == 2 for s in r["steps"])  # 8 = 3 + 3 + 2
    base = ["data", "batches", "--index", idx, "--seed", "1"]
    expect_error("--global-batch must be positive", *base, "--global-batch", "0")
    expect_error("--global-batch must be positive", *base, "--global-batch", "-4")
    expect_error("--dp must be positive", *base, "--global-batch", "8", "--dp", "0")
    expect_error("rank 3 is not below dp 3", *base, "--global-batch", "8", "--dp", "3", "--rank", "3")
    expect_error("--rank must be non-negative", *base, "--global-batch", "8", "--dp", "3", "--rank", "-1")
    expect_error("larger than the global batch", *base, "--global-batch", "4", "--dp", "5")
    expect_error("not a multiple of the global batch", *base, "--global-batch", "8", "--start-sample", "12")
    expect_error("--steps must be positive", *base, "--global-batch", "8", "--steps", "0")
    expect_error("fewer than one global batch", *base, "--global-batch", "51")
    expect_error(
        "not a dataset index", "data", "batches", "--index", tmp + "/none", "--seed", "1", "--global-batch", "8"
    )
    expect_error("out of range", "data", "read", "--index", idx, "--sample", "50")
    # Issue 16 bug 9: a non-empty mountpoint is refused (the mount would hide its files),
    # with exit 2, before FUSE is touched; the files stay.
    full = os.path.join(tmp, "full")
    os.makedirs(full)
    open(os.path.join(full, "keep.txt"), "w").write("x")
    # (Before the fix the mount went ahead and served in the foreground: give it 20 s.)
    try:
        p = subprocess.run(
            [TENPLEX, "data", "mount", "--index", idx, "--mountpoint", full, "--seed", "1", "--global-batch", "8"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError("data mount went ahead on a non-empty mountpoint") from None
    assert p.returncode == 2 and "is not empty" in p.stderr and "keep.txt" in p.stderr, p.stderr
    assert os.listdir(full) == ["keep.txt"] and not mounted(full)
    expect_error("unknown dataset format", "data", "index", "--input", src, "--format", "csv", "-o", tmp + "/x")
    bad = os.path.join(tmp, "bad.jsonl")
    open(bad, "w").write('{"a": 1}\n{"a": \n')
    expect_error("line 2 is not valid JSON", "data", "index", "--input", bad, "--format", "jsonl", "-o", tmp + "/x")
    # A corrupt offsets file and a changed source are clear errors.
    off = os.path.join(idx, "offsets.bin")
    data = open(off, "rb").read()
    open(off, "wb").write(data[:-8])
    expect_error("does not match", "data", "read", "--index", idx, "--sample", "0")
    open(off, "wb").write(data)
    with open(src, "a") as f:
        f.write('{"more": 1}\n')
    expect_error("rebuild the index", "data", "read", "--index", idx, "--sample", "0")


def test_python_order(tmp):
    src = os.path.join(tmp, "d.jsonl")
    write_jsonl(src, 45, seed=1)
    idx = os.path.join(tmp, "idx")
    run("data", "index", "--input", src, "--format", "jsonl", "-o", idx)
    cases = [
        (0, 1, 1, 0, 0, 3),
        (7, 8, 3, 1, 0, 12),
        (7, 8, 3, 2, 32, 9),
        ((1 << 64) - 1, 10, 4, 3, 40, 7),
        (12345678901234567890, 45, 8, 7, 90, 3),
        (2, 6, 6, 5, 600, 10),
    ]
    for seed, b, dp, rank, start, steps in cases:
        want = batches(idx, seed, b, dp, rank, start, steps)
        p = subprocess.run(
            [
                sys.executable,
                DATA_PY,
                "batches",
                "--index",
                idx,
                "--seed",
                str(seed),
                "--global-batch",
                str(b),
                "--dp",
                str(dp),
                "--rank",
                str(rank),
                "--start-sample",
                str(start),
                "--steps",
                str(steps),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        assert json.loads(p.stdout) == want, (seed, b, dp, rank, start, steps)
        # The package's tenplex.data (the native order) agrees, as a module and as a command.
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "tenplex.data",
                "batches",
                "--index",
                idx,
                "--seed",
                str(seed),
                "--global-batch",
                str(b),
                "--dp",
                str(dp),
                "--rank",
                str(rank),
                "--start-sample",
                str(start),
                "--steps",
                str(steps),
            ],
            capture_output=True,
            text=True,
            check=True,
            env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")),
        )
        assert json.loads(p.stdout) == want, ("python3 -m tenplex.data", seed, b, dp, rank, start, steps)
        got = [(s, i, r) for s, i, r in tdata.RankIterator(idx, seed, b, dp, rank, start, steps)]
        ref = [(s, i, r) for s, i, r in pydata.RankIterator(idx, seed, b, dp, rank, start, steps)]
        assert got == ref, ("tenplex.data.RankIterator", seed, b, dp, rank, start, steps)
        assert tdata.step_samples(45, seed, b, start, dp, rank) == pydata.step_samples(45, seed, b, start, dp, rank)
    # The records the iterator yields are the lines `tenplex data read` prints.
    it = pydata.RankIterator(idx, seed=7, global_batch=8, dp=3, rank=0, start_sample=16, steps=3)
    for _step, ids, records in it:
        assert [r.decode() for r in records] == read(idx, ids)
    assert it.position == 40
    # Continuation after dp changes at every boundary: same global sequence, every
    # epoch exactly once (5 batches of 8 per epoch, 5 samples dropped).
    ref = []
    for _step, ids, _ in pydata.RankIterator(idx, 7, 8, 1, 0, 0, steps=12):
        ref += ids
    for change in range(13):
        seq = []
        for step in range(12):
            dp = 3 if step < change else 5
            for r in range(dp):
                seq += next(pydata.RankIterator(idx, 7, 8, dp, r, start_sample=step * 8))[1]
        assert seq == ref, change
    for e in range(2):
        assert len(set(ref[e * 40 : (e + 1) * 40])) == 40
    # Python's errors match.
    for args in [(8, 0, 0), (8, 3, 3), (4, 5, 0), (0, 1, 0)]:
        for impl in (pydata, tdata):
            try:
                impl.rank_slice(*args)
            except ValueError:
                continue
            raise AssertionError(f"{impl.__name__}.rank_slice{args} accepted")


def test_megatron(tmp):
    rng = random.Random(5)
    for code, top in [(8, 65535), (4, 2**31 - 1), (1, 255), (5, 2**62), (3, 30000)]:
        seqs = [[rng.randrange(0, top) for _ in range(rng.randrange(0, 12))] for _ in range(37)]
        prefix = os.path.join(tmp, f"corpus{code}_text_document")
        write_megatron(prefix, seqs, [10, 20, 7], code)
        idx = os.path.join(tmp, f"idx{code}")
        run("data", "index", "--input", prefix + ".bin", "--format", "megatron", "-o", idx)
        meta = json.load(open(os.path.join(idx, "index.json")))
        assert meta["num_samples"] == 37 and meta["num_documents"] == 3, meta
        assert meta["dtype"] == {8: "uint16", 4: "int32", 1: "uint8", 5: "int64", 3: "int16"}[code]
        got = [json.loads(t) for t in read(idx, list(range(37)))]
        assert got == seqs, code
        got = [json.loads(t) for t in read_json(idx, [36, 0, 5])]
        size = {8: 2, 4: 4, 1: 1, 5: 8, 3: 2}[code]
        assert got == [{"sample": i, "bytes": len(seqs[i]) * size, "tokens": seqs[i]} for i in (36, 0, 5)], (code, got)
        index = pydata.Index(idx)
        assert [index.record(i) for i in range(37)] == seqs
        assert [tdata.Index(idx).record(i) for i in range(37)] == seqs
    # Corrupt indexes: clear errors from `tenplex data index`.
    prefix = os.path.join(tmp, "c")
    write_megatron(prefix, [[1, 2, 3], [4], [5, 6]], [1, 2])
    good = open(prefix + ".idx", "rb").read()
    corruptions = [
        (b"XMIDIDX" + good[7:], "bad magic"),
        (good[:9] + b"\x02" + good[10:], "version"),
        (good[:17] + b"\x09" + good[18:], "dtype code 9"),
        (good[:30], "header"),
        (good[:-3], "imply"),
        (good + b"\x00\x00", "imply"),
        (good[:-8] + struct.pack("<q", 2), "ends at 2"),
    ]
    for data, words in corruptions:
        open(prefix + ".idx", "wb").write(data)
        expect_error(words, "data", "index", "--input", prefix, "--format", "megatron", "-o", tmp + "/cidx")
    open(prefix + ".idx", "wb").write(good)
    open(prefix + ".bin", "wb").write(b"\x01\x00")
    expect_error("outside", "data", "index", "--input", prefix, "--format", "megatron", "-o", tmp + "/cidx")
    expect_error(
        "No such file", "data", "index", "--input", tmp + "/missing", "--format", "megatron", "-o", tmp + "/cidx"
    )


def mounted(mp):
    with open("/proc/self/mountinfo") as f:
        return any(f" {mp} " in line for line in f)


class Mount:
    def __init__(self, idx, mp, seed, b, dp, start, extra=()):
        os.makedirs(mp, exist_ok=True)
        self.mp = mp
        self.p = subprocess.Popen(
            [
                TENPLEX,
                "data",
                "mount",
                "--index",
                idx,
                "--mountpoint",
                mp,
                "--seed",
                str(seed),
                "--global-batch",
                str(b),
                "--dp",
                str(dp),
                "--start-sample",
                str(start),
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.time() + 30
        while not os.path.exists(os.path.join(mp, "info.json")):
            if self.p.poll() is not None:
                raise AssertionError(f"tenplex data mount exited ({self.p.returncode}): {self.p.stderr.read()}")
            if time.time() > deadline:
                self.p.kill()
                raise AssertionError("the FUSE mount did not appear within 30 s")
            time.sleep(0.05)

    def wait(self):
        rc = self.p.wait(timeout=30)
        err = self.p.stderr.read()
        assert rc == 0, f"tenplex data mount exited {rc}: {err}"
        assert not mounted(self.mp), "still mounted after the server ended"


def rank_ids(idx, seed, b, dp, rank, start, n):
    """Rank's ids from `start` to the end of its epoch, via `tenplex data batches`."""
    k = n // b
    first = start // b
    steps = k - first % k
    return [i for s in batches(idx, seed, b, dp, rank, start, steps)["steps"] for i in s["samples"]]


def test_fuse(tmp):
    assert os.path.exists("/dev/fuse"), "/dev/fuse is missing: the FUSE view cannot be tested (modprobe fuse)"
    # JSONL: every rank's file equals `data read` of the ids from `data batches`.
    src = os.path.join(tmp, "d.jsonl")
    write_jsonl(src, 203, seed=3)
    idx = os.path.join(tmp, "idx")
    run("data", "index", "--input", src, "--format", "jsonl", "-o", idx)
    for seed, b, dp, start in [(11, 16, 3, 32), (11, 16, 5, 0), (4, 20, 8, 200)]:
        mp = os.path.join(tmp, f"mnt-{dp}")
        m = Mount(idx, mp, seed, b, dp, start)
        try:
            assert sorted(os.listdir(mp)) == ["info.json"] + [f"rank-{r:05d}" for r in range(dp)]
            info = json.load(open(os.path.join(mp, "info.json")))
            assert info["first_step"] == start // b and info["dp"] == dp
            for r in range(dp):
                ids = rank_ids(idx, seed, b, dp, r, start, 203)
                want = "".join(line + "\n" for line in read(idx, ids))
                path = os.path.join(mp, f"rank-{r:05d}", "samples.jsonl")
                assert os.path.getsize(path) == len(want.encode())
                got = open(path, encoding="utf-8").read()
                assert got == want, f"rank {r} of dp {dp} differs"
                # Random seeks read the same bytes.
                raw = want.encode()
                with open(path, "rb", buffering=0) as f:
                    for off in random.Random(r).sample(range(len(raw)), 20):
                        f.seek(off)
                        assert f.read(37) == raw[off : off + 37]
        finally:
            m.p.send_signal(signal.SIGTERM)
        m.wait()  # SIGTERM: exit 0 and unmounted
    # Megatron: samples.bin + samples.idx load as a Megatron dataset.
    rng = random.Random(9)
    seqs = [[rng.randrange(0, 50000) for _ in range(rng.randrange(0, 40))] for _ in range(101)]
    prefix = os.path.join(tmp, "m_text_document")
    write_megatron(prefix, seqs, [50, 51])
    midx = os.path.join(tmp, "midx")
    run("data", "index", "--input", prefix, "--format", "megatron", "-o", midx)
    mp = os.path.join(tmp, "mnt-megatron")
    m = Mount(midx, mp, 5, 12, 4, 24)
    try:
        for r in range(4):
            ids = rank_ids(midx, 5, 12, 4, r, 24, 101)
            view = pydata.MegatronIndex(os.path.join(mp, f"rank-{r:05d}", "samples"))
            assert view.num_sequences == len(ids)
            assert list(view.documents) == list(range(len(ids) + 1))
            want = [json.loads(t) for t in read(midx, ids)]
            assert [view.tokens(k) for k in range(len(ids))] == want, f"rank {r}"
            del view
    finally:
        # An external unmount also ends the server cleanly.
        subprocess.run(["fusermount3", "-u", mp], check=True)
    m.wait()
    # A bad mountpoint is a clear error.
    expect_error(
        "mountpoint",
        "data",
        "mount",
        "--index",
        idx,
        "--mountpoint",
        tmp + "/nope",
        "--seed",
        "1",
        "--global-batch",
        "8",
    )


def test_dp_weights(tmp):
    """Spec §9 dp weights: `data batches --dp-weights`, tenplex.data.RankIterator(dp_weights=)
    and the FUSE view give each dp rank the contiguous slice of every global batch that the
    reference's exact-fraction largest-remainder apportionment says."""
    src = os.path.join(tmp, "d.jsonl")
    write_jsonl(src, 61, seed=4)
    idx = os.path.join(tmp, "idx")
    run("data", "index", "--input", src, "--format", "jsonl", "-o", idx)
    cases = [
        (7, 10, [2, 1, 1], 20, 3),
        (3, 12, [1, 5, 2, 3], 0, 6),
        (5, 16, [7, 1], 32, 3),
        ((1 << 64) - 1, 9, [1, 2, 3], 0, 5),
    ]
    for seed, b, w, start, steps in cases:
        dp, text = len(w), "+".join(map(str, w))
        sizes = pydata.weighted_sizes(b, w)
        whole = batches(idx, seed, b, 1, 0, start, steps)["steps"]
        off = 0
        for r in range(dp):
            p = run(
                "data",
                "batches",
                "--index",
                idx,
                "--seed",
                seed,
                "--global-batch",
                b,
                "--dp-weights",
                text,
                "--rank",
                r,
                "--start-sample",
                start,
                "--steps",
                steps,
                "--json",
            )
            got = json.loads(p.stdout)["steps"]
            want = [{"step": s["step"], "samples": s["samples"][off : off + sizes[r]]} for s in whole]
            assert got == want, (seed, b, w, r)
            ours = [
                (s, i)
                for s, i, _ in tdata.RankIterator(
                    idx, seed, b, rank=r, start_sample=start, steps=steps, dp_weights=text
                )
            ]
            ref = [(s, i) for s, i, _ in pydata.RankIterator(idx, seed, b, dp, r, start, steps, dp_weights=w)]
            assert ours == ref == [(s["step"], s["samples"]) for s in want], (seed, b, w, r)
            assert tdata.rank_slice(b, dp, r, w) == pydata.rank_slice(b, dp, r, w) == (off, off + sizes[r])
            assert tdata.step_samples(61, seed, b, start, dp, r, w) == pydata.step_samples(61, seed, b, start, dp, r, w)
            if seed != 7:  # the package's command line once (a process start each)
                off += sizes[r]
                continue
            p = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "tenplex.data",
                    "batches",
                    "--index",
                    idx,
                    "--seed",
                    str(seed),
                    "--global-batch",
                    str(b),
                    "--dp-weights",
                    text,
                    "--rank",
                    str(r),
                    "--start-sample",
                    str(start),
                    "--steps",
                    str(steps),
                ],
                capture_output=True,
                text=True,
                check=True,
                env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")),
            )
            assert json.loads(p.stdout)["steps"] == want
            off += sizes[r]
        assert off == b
    # The spec's example and equal weights (the v1 rule).
    assert pydata.weighted_sizes(10, [2, 1, 1]) == [5, 3, 2]
    for b, dp in [(10, 4), (7, 7), (9, 2)]:
        for r in range(dp):
            assert tdata.rank_slice(b, dp, r, [3] * dp) == tdata.rank_slice(b, dp, r) == pydata.rank_slice(b, dp, r)
    base = ["data", "batches", "--index", idx, "--seed", "1", "--global-batch", "4"]
    expect_error("dp rank 1 no samples", *base, "--dp-weights", "1+1+9")
    expect_error("lists 3 weights but --dp is 2", *base, "--dp", "2", "--dp-weights", "1+1+1")
    expect_error("--dp-weights=1+x", *base, "--dp-weights", "1+x")
    expect_error("--dp-weights=1+0", *base, "--dp-weights", "1+0")
    for impl in (pydata, tdata):
        for args in [(4, 3, 0, [1, 1, 9]), (4, 2, 0, [1, 1, 1])]:
            try:
                impl.rank_slice(*args)
            except ValueError:
                continue
            raise AssertionError(f"{impl.__name__}.rank_slice{args} accepted")
    # The FUSE view serves the weighted slices.
    if not os.path.exists("/dev/fuse"):
        raise AssertionError("/dev/fuse is missing: the FUSE view cannot be tested (modprobe fuse)")
    seed, b, w, start = 11, 10, [2, 1, 1], 20
    mp = os.path.join(tmp, "mnt")
    m = Mount(idx, mp, seed, b, 3, start, ["--dp-weights", "2+1+1"])
    try:
        info = json.load(open(os.path.join(mp, "info.json")))
        assert info["dp_weights"] == w and [r["slice"] for r in info["ranks"]] == [[0, 5], [5, 8], [8, 10]], info
        for r in range(3):
            ids = [
                i for s in pydata.RankIterator(idx, seed, b, 3, r, start, 6 - start // b, dp_weights=w) for i in s[1]
            ]
            want = "".join(line + "\n" for line in read(idx, ids))
            assert open(os.path.join(mp, f"rank-{r:05d}", "samples.jsonl"), encoding="utf-8").read() == want, r
    finally:
        m.p.send_signal(signal.SIGTERM)
    m.wait()


@pytest.fixture
def tmp(request: pytest.FixtureRequest) -> Iterator[str]:
    """A directory of the test's own, removed after it (FUSE mounts left in it unmounted first)."""
    d = tempfile.mkdtemp(prefix=f"tenplex-{request.node.name}-")
    try:
        yield d
    finally:
        for e in os.listdir(d):
            p = os.path.join(d, e)
            if os.path.isdir(p) and mounted(p):
                subprocess.run(["fusermount3", "-u", "-z", p])
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(pytest.main([os.path.abspath(__file__), "-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
