"""Hostile checkpoint files (issue 19 §2) against every command that reads one.

Under pytest (issue 32 §4), ctest ckpt_hostile, TENPLEX_BIN the CLI under test:

    python -m pytest tests/ckpt_hostile_test.py

A good synthetic checkpoint (`tenplex ckpt init`, tp=2,pp=2: 4 rank files with
checksums) is copied and broken in one way per case: the file system (a symbolic link
loop, a FIFO, a directory or a symbolic link in place of a rank file or tenplex.json,
a missing file), the bytes (truncated, empty, a huge or overlong header length, a
header that is not JSON, a flipped bit in the data or the header, a header whose
tensor disagrees with the layout under a matching checksum) and tenplex.json (not
JSON, nested 100000 deep, wrong types, checksums missing, a list, one rank missing, a
number, too short, one for a file that is not a rank file). Each case runs

  ckpt verify, reshard, store load (one daemon), store load --cluster, export --to hf

and an HF source broken the same ways runs `import --from hf`. Every run must end
within 30 s (import, which starts Python and torch first: 120 s; else: hang), by itself
(no signal, exit < 128: else crash), non-zero, with one "tenplex: error:" line that
names the broken file or field, and leave no output or staging directory behind. The
unbroken checkpoint passes every command (the control), and `--no-verify` loads one
without checksums (the explicit way out).

test_checksums_agree: the rank files' checksums as the C++ writer records them and as
the Python writer computes them (checkpoint.file_xxh64, files_xxh64) are the same.
"""

import json
import logging
import os
import shutil
import subprocess

import pytest
from cli_testing import Cli
from elastic_run_testing import small_model

from tenplex.testing import Daemon

_log = logging.getLogger(__name__)
run = Cli()  # the CLI under test, bound to the tenplex fixture's by _cli_under_test
TIMEOUT = 30


@pytest.fixture(autouse=True)
def _cli_under_test(tenplex: str) -> None:
    run.binary = tenplex


def rank(d, r=0):
    return os.path.join(d, "rank-%05d.safetensors" % r)


def info_path(d):
    return os.path.join(d, "tenplex.json")


def edit_info(fn):
    def apply(d):
        with open(info_path(d)) as f:
            j = json.load(f)
        fn(j)
        with open(info_path(d), "w") as f:
            json.dump(j, f)

    return apply


def replace_with(kind, target_fn):
    def apply(d):
        p = target_fn(d)
        os.unlink(p)
        if kind == "loop":
            os.symlink(os.path.basename(p), p)  # points at itself
        elif kind == "fifo":
            os.mkfifo(p)
        elif kind == "dir":
            os.mkdir(p)
        elif kind == "symlink":
            # a symbolic link to an intact copy: refused too (only regular files are read)
            shutil.copy(os.path.join(os.path.dirname(d), "good", os.path.basename(p)), p + ".real")
            os.symlink(os.path.basename(p) + ".real", p)
        elif kind == "devzero":
            os.symlink("/dev/zero", p)

    return apply


def rewrite(fn):
    def apply(d):
        with open(rank(d), "rb") as f:
            data = bytearray(f.read())
        data = fn(data)
        with open(rank(d), "wb") as f:
            f.write(data)

    return apply


def flip(offset_fn):
    def f(data):
        data[offset_fn(data)] ^= 0x10
        return data

    return f


def header_len(data):
    return int.from_bytes(data[:8], "little")


def reshape_with_checksum(d):
    """The first tensor's shape changed in the header (same byte count) and the
    checksum updated to match: the checksum passes, the layout check must not."""
    with open(rank(d), "rb") as f:
        data = f.read()
    n = header_len(data)
    h = json.loads(data[8 : 8 + n])
    name = next(k for k in h if k != "__metadata__" and len(h[k]["shape"]) == 2)
    a, b = h[name]["shape"]
    h[name]["shape"] = [b, a] if a != b else [a * b]
    text = json.dumps(h, separators=(",", ":")).encode()
    text += b" " * ((-len(text) - 8) % 8)
    assert len(text) <= n, "test setup: the edited header grew"
    text += b" " * (n - len(text))
    new = data[:8] + text + data[8 + n :]
    with open(rank(d), "wb") as f:
        f.write(new)
    import ctypes

    lib = ctypes.CDLL("libxxhash.so.0")
    lib.XXH64.restype = ctypes.c_ulonglong
    lib.XXH64.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_ulonglong]
    edit_info(lambda j: j["checksums"].__setitem__("rank-00000.safetensors", "%016x" % lib.XXH64(new, len(new), 0)))(d)


# (name, how to break a copy of the good checkpoint, a word the error must contain)
CASES = [
    ("rank file: symlink loop", replace_with("loop", rank), "rank-00000.safetensors"),
    ("rank file: FIFO", replace_with("fifo", rank), "rank-00000.safetensors"),
    ("rank file: directory", replace_with("dir", rank), "rank-00000.safetensors"),
    ("rank file: symlink to a copy", replace_with("symlink", rank), "rank-00000.safetensors"),
    ("rank file: symlink to /dev/zero", replace_with("devzero", rank), "rank-00000.safetensors"),
    ("rank file: missing", lambda d: os.unlink(rank(d, 3)), "rank-00003.safetensors"),
    ("rank file: truncated to half", rewrite(lambda b: b[: len(b) // 2]), "rank-00000.safetensors"),
    ("rank file: empty", rewrite(lambda b: bytearray()), "rank-00000.safetensors"),
    ("rank file: 5 bytes", rewrite(lambda b: b[:5]), "rank-00000.safetensors"),
    (
        "rank file: header length 2^63",
        rewrite(lambda b: bytearray((1 << 63).to_bytes(8, "little")) + b[8:]),
        "rank-00000.safetensors",
    ),
    (
        "rank file: header length past the end",
        rewrite(lambda b: bytearray((len(b)).to_bytes(8, "little")) + b[8:]),
        "rank-00000.safetensors",
    ),
    (
        "rank file: header not JSON",
        rewrite(lambda b: b[:8] + b"\xff" * header_len(b) + b[8 + header_len(b) :]),
        "rank-00000.safetensors",
    ),
    ("rank file: bit flipped in the data", rewrite(flip(lambda b: len(b) - 3)), "rank-00000.safetensors"),
    ("rank file: bit flipped in the header", rewrite(flip(lambda b: 8 + header_len(b) // 2)), "rank-00000.safetensors"),
    ("rank file: shape changed, checksum matching", reshape_with_checksum, "rank-00000.safetensors"),
    ("tenplex.json: missing", lambda d: os.unlink(info_path(d)), "tenplex.json"),
    ("tenplex.json: symlink loop", replace_with("loop", info_path), "tenplex.json"),
    ("tenplex.json: FIFO", replace_with("fifo", info_path), "tenplex.json"),
    ("tenplex.json: directory", replace_with("dir", info_path), "tenplex.json"),
    ("tenplex.json: not JSON", lambda d: open(info_path(d), "w").write('{"model": '), "tenplex.json"),
    (
        "tenplex.json: nested 100000 deep",
        lambda d: open(info_path(d), "w").write("[" * 100000 + "]" * 100000),
        "tenplex.json",
    ),
    ("tenplex.json: config a number", edit_info(lambda j: j.__setitem__("config", 4)), "tenplex.json"),
    ("tenplex.json: model a list", edit_info(lambda j: j.__setitem__("model", [1, 2])), "tenplex.json"),
    ("tenplex.json: checksums missing", edit_info(lambda j: j.pop("checksums")), "checksums"),
    (
        "tenplex.json: checksums a list",
        edit_info(lambda j: j.__setitem__("checksums", list(j["checksums"].values()))),
        "checksums",
    ),
    ("tenplex.json: checksums a string", edit_info(lambda j: j.__setitem__("checksums", "none")), "checksums"),
    (
        "tenplex.json: one rank's checksum missing",
        edit_info(lambda j: j["checksums"].pop("rank-00002.safetensors")),
        "rank-00002.safetensors",
    ),
    (
        "tenplex.json: a checksum a number",
        edit_info(lambda j: j["checksums"].__setitem__("rank-00001.safetensors", 7)),
        "rank-00001.safetensors",
    ),
    (
        "tenplex.json: a checksum too short",
        edit_info(lambda j: j["checksums"].__setitem__("rank-00001.safetensors", "abc")),
        "rank-00001.safetensors",
    ),
    (
        "tenplex.json: a checksum of another rank's file",
        edit_info(
            lambda j: j["checksums"].__setitem__("rank-00001.safetensors", j["checksums"]["rank-00000.safetensors"])
        ),
        "rank-00001.safetensors",
    ),
    (
        "tenplex.json: checksum for a file that is no rank file",
        edit_info(lambda j: j["checksums"].__setitem__("rank-00009.safetensors", "0" * 16)),
        "rank-00009.safetensors",
    ),
]

HF_CASES = [
    ("hf model.safetensors: symlink loop", "loop"),
    ("hf model.safetensors: FIFO", "fifo"),
    ("hf model.safetensors: directory", "dir"),
    ("hf model.safetensors: truncated", "truncate"),
    ("hf model.safetensors: header length 2^63", "huge"),
]


def commands(d, out, url, cluster):
    return [
        ("ckpt verify", ["ckpt", "verify", "--in", d]),
        ("reshard", ["reshard", "--in", d, "--to", "tp=1,pp=2", "--out", out]),
        ("store load", ["store", "load", "--url", url, "--job", "h", "--dir", d]),
        ("store load --cluster", ["store", "load", "--cluster", cluster, "--job", "hc", "--dir", d]),
        ("export", ["export", "--to", "hf", d, "--out", out]),
    ]


def judge(label, args, expect, out, failures, timeout=TIMEOUT):
    """Runs one command that must fail cleanly; records what went wrong."""
    try:
        p = subprocess.run([run.binary, *args], capture_output=True, text=True, timeout=timeout, errors="replace")
    except subprocess.TimeoutExpired:
        failures.append("%s: HANG (no exit within %d s)" % (label, timeout))
        return "hang"
    err = p.stderr.strip()
    if p.returncode < 0 or p.returncode >= 128:
        failures.append("%s: CRASH (exit %d): %s" % (label, p.returncode, err[-300:]))
        return "crash"
    if p.returncode == 0:
        failures.append("%s: ACCEPTED (exit 0): %s" % (label, p.stdout.strip()[-200:]))
        return "accepted"
    if "tenplex: error:" not in err or "Traceback" in err or "terminate called" in err:
        failures.append("%s: UNCLEAR error (exit %d): %s" % (label, p.returncode, err[-300:]))
        return "unclear"
    if expect not in err:
        failures.append("%s: error does not name %s: %s" % (label, expect, err[-300:]))
        return "unnamed"
    left = [x for x in os.listdir(os.path.dirname(out)) if x.startswith(os.path.basename(out))]
    if left:
        failures.append("%s: left %s behind" % (label, left))
        return "left"
    return "ok"


def test_ckpt_hostile(tmp: str) -> None:
    daemon = Daemon(run.binary, args=("--transport", "none"))
    try:
        model = small_model(
            run.binary, tmp, "m.json", hidden=16, vocab=64, seq=8, extra=("--make-vocab-size-divisible-by", "8")
        )
        good = os.path.join(tmp, "good")
        run("ckpt", "init", "--model", model, "--config", "tp=2,pp=2", "--out", good, "--seed", "3")
        cluster = os.path.join(tmp, "cluster.json")
        with open(cluster, "w") as f:
            json.dump({"hosts": [daemon.url], "gpus_per_host": 4}, f)
        out = os.path.join(tmp, "out")
        # The control: the intact checkpoint passes every command.
        for _name, args in commands(good, out, daemon.url, cluster):
            run(*[a if a not in ("h", "hc") else a + "-good" for a in args])
            shutil.rmtree(out, ignore_errors=True)
        hf = os.path.join(tmp, "hf")
        run("export", "--to", "hf", good, "--out", hf)
        imp = ["import", "--from", "hf", None, "--model", model, "--config", "tp=2", "--out", out]
        run(*[a if a is not None else hf for a in imp])
        shutil.rmtree(out)

        failures: list[str] = []
        counts: dict[str, int] = {}
        runs = broken_checkpoints(tmp, good, out, daemon.url, cluster, failures, counts)
        runs += broken_hf_sources(tmp, hf, imp, out, failures, counts)
        _log.info(
            "%d cases x commands = %d runs: %s",
            len(CASES) + len(HF_CASES),
            runs,
            ", ".join("%s %d" % kv for kv in sorted(counts.items())),
        )
        for f in failures:
            _log.error("FAIL: %s", f)
        assert daemon.proc.poll() is None, "the store daemon died"
        assert not failures, "%d of %d runs did not fail cleanly:\n%s" % (len(failures), runs, "\n".join(failures))
        # The explicit way out: --no-verify loads a checkpoint without checksums.
        d = os.path.join(tmp, "nosums")
        shutil.copytree(good, d)
        edit_info(lambda j: j.pop("checksums"))(d)
        run("store", "load", "--url", daemon.url, "--job", "nosums", "--dir", d, "--no-verify")
        run("reshard", "--in", d, "--to", "tp=1,pp=2", "--out", os.path.join(tmp, "nosums-out"), "--no-verify")
        run("ckpt", "verify", "--in", os.path.join(tmp, "nosums-out"))  # the output has checksums again
    finally:
        daemon.stop()


def broken_checkpoints(
    tmp: str, good: str, out: str, url: str, cluster: str, failures: list[str], counts: dict[str, int]
) -> int:
    """Every case of CASES against every command; the number of runs."""
    runs = 0
    for name, breaker, expect in CASES:
        d = os.path.join(tmp, "case")
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(good, d)
        breaker(d)
        for cmd, args in commands(d, out, url, cluster):
            r = judge("%s / %s" % (name, cmd), args, expect, out, failures)
            counts[r] = counts.get(r, 0) + 1
            runs += 1
            shutil.rmtree(out, ignore_errors=True)
        # a FIFO must not be left for rmtree to trip over
    return runs


def broken_hf_sources(tmp: str, hf: str, imp: list, out: str, failures: list[str], counts: dict[str, int]) -> int:
    """Every case of HF_CASES against `import --from hf`; the number of runs."""
    runs = 0
    for name, kind in HF_CASES:
        s = os.path.join(tmp, "hfcase")
        shutil.rmtree(s, ignore_errors=True)
        shutil.copytree(hf, s)
        p = os.path.join(s, "model.safetensors")
        if kind in ("loop", "fifo", "dir"):
            os.unlink(p)
            {
                "loop": lambda: os.symlink("model.safetensors", p),
                "fifo": lambda: os.mkfifo(p),
                "dir": lambda: os.mkdir(p),
            }[kind]()
        else:
            with open(p, "rb") as f:
                data = f.read()
            data = data[: len(data) // 2] if kind == "truncate" else (1 << 63).to_bytes(8, "little") + data[8:]
            with open(p, "wb") as f:
                f.write(data)
        # import starts Python and torch first: seconds on a loaded machine, so a longer limit
        r = judge(
            "%s / import" % name,
            [a if a is not None else s for a in imp],
            "model.safetensors",
            out,
            failures,
            timeout=4 * TIMEOUT,
        )
        counts[r] = counts.get(r, 0) + 1
        runs += 1
        shutil.rmtree(out, ignore_errors=True)
    return runs


def test_checksums_agree(tmp: str) -> None:
    """The rank files' checksums two ways: as `tenplex ckpt init` records them (C++, read
    through a 1 MiB buffer) and as the Python checkpoint writer computes them
    (checkpoint.file_xxh64 in threads, and with a buffer of an odd size so that pieces end
    anywhere); a file one byte short hashes differently."""
    from tenplex import checkpoint

    model = small_model(run.binary, tmp, "m.json", layers=4, hidden=256, vocab=1000, seq=64)
    good = os.path.join(tmp, "good")
    run("ckpt", "init", "--model", model, "--config", "tp=2,pp=2", "--out", good, "--seed", "3")
    with open(os.path.join(good, "tenplex.json")) as f:
        recorded: dict[str, str] = json.load(f)["checksums"]
    names = sorted(recorded)
    paths = [os.path.join(good, n) for n in names]
    assert len(names) == 4 and min(os.path.getsize(p) for p in paths) > 1 << 20, names
    assert checkpoint.files_xxh64(paths) == [recorded[n] for n in names]
    assert [checkpoint.file_xxh64(p, chunk=4096 + 7) for p in paths] == [recorded[n] for n in names]
    short = os.path.join(tmp, "short")
    with open(paths[0], "rb") as src, open(short, "wb") as dst:
        dst.write(src.read()[:-1])
    assert checkpoint.file_xxh64(short) != recorded[names[0]]
