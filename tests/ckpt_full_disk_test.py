#!/usr/bin/env python3
"""Checkpoint writers on a full disk, and stale staging directories (issue 19 §2).

  ckpt_full_disk_test.py TENPLEX_BIN

The test re-runs itself in a private mount namespace (`unshare -m`) with an 8 MiB
tmpfs as the output file system. Every command that writes a checkpoint through a
memory map or pwrite (`ckpt init`, `store save --url`, `store save --cluster`,
`reshard` streamed and `--mmap-output`) writes a 39 MiB checkpoint into it and must
fail by itself (exit 1, not a signal: before, the first touch of an unbacked page was
a SIGBUS, exit 135) with an error that says the disk is full, leaving nothing behind
(no output, no `*.partial-*`). A checkpoint that fits is written and verified on the
same file system.

Stale staging directories: writers record themselves (host, pid, process start time)
in their `<dir>.partial-<pid>-<n>`; the next write into the same directory removes
those of dead writers (the pid is gone, or belongs to a process started at another
time) and keeps the others (a live writer, another host's, one without a record).
The dead writer's directory fills 5 of the 8 MiB, so the next 5.4 MiB checkpoint
only fits because it was removed first.

Without root or mount namespaces, the same commands run under RLIMIT_FSIZE (8 MiB,
SIGXFSZ ignored) instead and the test exits 77 (skipped: the tmpfs part did not run).
"""

import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemons import Daemon, check  # noqa: E402

TENPLEX = None
LIMIT = 8 << 20


def run(args, ok=True, limit=False):
    def preexec():
        if limit:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))

    p = subprocess.run([TENPLEX, *args], capture_output=True, text=True, timeout=120, preexec_fn=preexec)
    if ok:
        check(p.returncode == 0, "%s failed: %s%s" % (" ".join(args), p.stdout, p.stderr))
    return p


def expect_full(what, args, where, limit):
    p = run(args, ok=False, limit=limit)
    check(
        0 < p.returncode < 128,
        "%s: exit %d (a signal?), want a clean failure: %s" % (what, p.returncode, p.stderr[-400:]),
    )
    check(
        "tenplex: error:" in p.stderr and ("disk is full" in p.stderr or "File too large" in p.stderr),
        "%s: no clear full-disk error: %r" % (what, p.stderr[-400:]),
    )
    left = os.listdir(where)
    check(not left, "%s left %s behind in %s" % (what, left, where))
    print("%s: exit %d: %s" % (what, p.returncode, p.stderr.strip().splitlines()[-1][:160]))


def process_start(pid):
    with open("/proc/%d/stat" % pid) as f:
        text = f.read()
    return text[text.rindex(")") + 2 :].split()[19]


def stage(parent, name, host, pid, start, fill=0):
    d = os.path.join(parent, name)
    os.makedirs(d)
    if host is not None:
        with open(os.path.join(d, ".tenplex-writer"), "w") as f:
            json.dump({"host": host, "pid": pid, "start": start}, f)
    with open(os.path.join(d, "rank-00000.safetensors.tmp.1.0"), "wb") as f:
        f.write(b"\1" * fill)
    return d


def body(tmp, full, limit):
    model = os.path.join(tmp, "m.json")
    run(
        [
            "model",
            "gpt",
            "--num-layers",
            "4",
            "--hidden-size",
            "256",
            "--num-attention-heads",
            "4",
            "--vocab-size",
            "1024",
            "--max-position-embeddings",
            "64",
            "-o",
            model,
        ]
    )
    small = os.path.join(tmp, "small.json")
    run(
        [
            "model",
            "gpt",
            "--num-layers",
            "2",
            "--hidden-size",
            "128",
            "--num-attention-heads",
            "4",
            "--vocab-size",
            "512",
            "--max-position-embeddings",
            "64",
            "-o",
            small,
        ]
    )
    good = os.path.join(tmp, "good")
    run(["ckpt", "init", "--model", model, "--config", "tp=2", "--out", good, "--seed", "5"])

    expect_full(
        "ckpt init",
        ["ckpt", "init", "--model", model, "--config", "tp=2", "--out", os.path.join(full, "ck")],
        full,
        limit,
    )
    expect_full("reshard", ["reshard", "--in", good, "--to", "tp=1", "--out", os.path.join(full, "rs")], full, limit)
    expect_full(
        "reshard --mmap-output",
        ["reshard", "--in", good, "--to", "tp=1", "--mmap-output", "--out", os.path.join(full, "rs")],
        full,
        limit,
    )
    daemon = Daemon(TENPLEX, args=("--transport", "none"))
    try:
        run(["store", "load", "--url", daemon.url, "--job", "j", "--dir", good])
        expect_full(
            "store save",
            ["store", "save", "--url", daemon.url, "--job", "j", "--out", os.path.join(full, "saved")],
            full,
            limit,
        )
        cluster = os.path.join(tmp, "cluster.json")
        with open(cluster, "w") as f:
            json.dump({"hosts": [daemon.url], "gpus_per_host": 2}, f)
        expect_full(
            "store save --cluster",
            ["store", "save", "--cluster", cluster, "--job", "j", "--out", os.path.join(full, "saved")],
            full,
            limit,
        )
        check(daemon.proc.poll() is None, "the daemon died")
    finally:
        daemon.stop()

    # Stale staging directories of dead writers are removed by the next write.
    dead = subprocess.Popen(["true"])
    dead.wait()
    host = socket.gethostname()
    me = os.getpid()
    stale = stage(full, "old.partial-%d-0" % dead.pid, host, dead.pid, "1", fill=5 << 20)
    reused = stage(full, "reused.partial-%d-0" % me, host, me, "1")  # our pid, another start time
    live = stage(full, "live.partial-%d-0" % me, host, me, process_start(me))
    other = stage(full, "other.partial-%d-0" % dead.pid, "elsewhere.example", dead.pid, "1")
    unrecorded = stage(full, "unrecorded.partial-%d-0" % dead.pid, None, dead.pid, "1")
    out = os.path.join(full, "fits")
    run(["ckpt", "init", "--model", small, "--config", "tp=2", "--out", out, "--seed", "2"], limit=limit)
    run(["ckpt", "verify", "--in", out])
    check(not os.path.exists(stale), "the dead writer's staging directory is still there")
    check(not os.path.exists(reused), "the staging directory of a reused pid is still there")
    for d in (live, other, unrecorded):
        check(os.path.exists(d), "%s (not a dead writer's of this host) was removed" % d)
    check(not any(n.startswith(".tenplex-writer") for n in os.listdir(out)), "the writer record is in the output")
    print(
        "stale staging: the dead writer's and the reused pid's removed; live, other host's, unrecorded kept; "
        "a 5.4 MiB checkpoint fits after the cleanup"
    )


def main():
    global TENPLEX
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    TENPLEX = os.path.abspath(sys.argv[1])
    if len(sys.argv) == 4 and sys.argv[2] == "--inner":
        tmp = sys.argv[3]
        full = os.path.join(tmp, "full")
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%d" % LIMIT, "tmpfs", full], check=True)
        body(tmp, full, limit=False)
        print("ckpt_full_disk: OK (8 MiB tmpfs)")
        return
    tmp = tempfile.mkdtemp(prefix="tenplex-fulldisk-")
    try:
        os.makedirs(os.path.join(tmp, "full"))
        probe = subprocess.run(
            ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs '%s'" % os.path.join(tmp, "full")],
            capture_output=True,
        )
        if probe.returncode == 0:
            p = subprocess.run(["unshare", "-m", sys.executable, os.path.abspath(__file__), TENPLEX, "--inner", tmp])
            sys.exit(p.returncode)
        print("no tmpfs in a private mount namespace (%s); RLIMIT_FSIZE instead" % probe.stderr.decode().strip())
        body(tmp, os.path.join(tmp, "full"), limit=True)
        print("ckpt_full_disk: fallback OK; the tmpfs part is skipped")
        sys.exit(77)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
