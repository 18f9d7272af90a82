"""What every fault campaign shares (scripts/fault_campaign*.py): the configs a job
moves between, deadlines, the outcome names, the checks of a version's holders, and the
harness that runs trials and prints the table by fault kind and phase.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

CONFIGS = [
    "tp=2,pp=2,dp=2",
    "tp=2,pp=4",
    "tp=1,pp=2,dp=4",
    "tp=4,pp=2",
    "tp=2,dp=4",
    "tp=1,pp=4,dp=2",
    "tp=2,pp=2,dp=2,zero=1",
    "tp=2,dp=3",
    "tp=1,pp=2,dp=3",
    "tp=2,pp=2",
]
OP_DEADLINE = 90  # seconds: transform ~ silent timeout + a round; load ~ 2 x its 30 s request timeout
RUN_DEADLINE = 240  # seconds: a run of 6 steps (~20-60 s) plus its --hang-seconds 60
REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TRANSFORM_FLAGS = ["--silent-timeout", "3", "--control-timeout", "5"]


def canon(config):
    c = {"tp": "1", "pp": "1", "dp": "1", "zero": "0"}
    for kv in config.split(","):
        k, v = kv.split("=")
        c[k] = v
    return tuple(sorted(c.items()))


def holders_of(info):
    """(URLs, host ids) of the hosts that hold ranks of a version: rank r on
    hosts[r // gpus_per_host] of its placement (a run records the whole cluster; hosts
    past its ranks hold nothing); ids only where the info records them."""
    c = dict(canon(info["config"]))
    world = int(c["tp"]) * int(c["pp"]) * int(c["dp"])
    placement = info.get("cluster", {})
    hosts, k = placement.get("hosts", []), int(placement.get("gpus_per_host", 1))
    ids = placement.get("host_ids") or []
    used = [r // k for r in range(world) if r // k < len(hosts)]
    return {hosts[h] for h in used}, {ids[h] for h in used if h < len(ids) and ids[h]}


def finish(proc, deadline):
    """(stdout, stderr, hang) of an operation; past the deadline it and its children
    (own session) are killed."""
    try:
        out, err = proc.communicate(timeout=deadline)
        return out, err, False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return out, err, True


def signal_record(n, op, src, dst, kind, victim, phase, delay, seconds, rc, long_stop):
    """A signal trial's record (the table's row keys, what happened); its outcome is added by
    the trial's checks."""
    return {
        "trial": n,
        "op": op,
        "from": src,
        "to": dst,
        "kind": kind,
        "victim": victim,
        "phase": phase,
        "delay": round(delay, 3),
        "seconds": round(seconds, 2),
        "rc": rc,
        "long_stop": long_stop,
    }


def dir_bytes(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


OUTCOMES = ["completed", "recovered", "clean abort", "data lost", "split", "orphans", "hang", "crash", "unclear"]
GOOD = ("completed", "recovered", "clean abort")


def table(results, outcomes=OUTCOMES):
    kinds = sorted({(r["kind"], r["op"], r["phase"]) for r in results})
    lines = [
        "| fault | operation | phase | trials | " + " | ".join(outcomes) + " |",
        "|---|---|---|---|" + "---|" * len(outcomes),
    ]
    for k in kinds:
        rs = [r for r in results if (r["kind"], r["op"], r["phase"]) == k]
        lines.append(
            "| %s | %s | %s | %d | " % (k[0], k[1], k[2], len(rs))
            + " | ".join(str(sum(r["outcome"] == o for r in rs)) for o in outcomes)
            + " |"
        )
    lines.append(
        "| all | | | %d | " % len(results)
        + " | ".join("**%d**" % sum(r["outcome"] == o for r in results) for o in outcomes)
        + " |"
    )
    return "\n".join(lines)


def base_args(ap):
    """The arguments every campaign script takes."""
    ap.add_argument("tenplex")
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--markdown", help="write the table (and the seed) to this file")
    ap.add_argument("--json", help="write every trial's record to this file")
    ap.add_argument("--verbose", action="store_true")


def run_campaign(make, a, outcomes=OUTCOMES):
    """Runs a.trials trials of the campaign make(tmp) returns (its .trial(n) and .stop()),
    prints and writes the table; exits 1 when a trial's outcome is not completed,
    recovered or clean abort."""
    tmp = tempfile.mkdtemp(prefix="tenplex-campaign-")
    c = None
    results = []
    t0 = time.time()
    try:
        c = make(tmp)
        for n in range(a.trials):
            results.append(c.trial(n))
    finally:
        if c:
            c.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    t = table(results, outcomes)
    print(t)
    print("%d trials, seed %d, %.0f s" % (len(results), a.seed, time.time() - t0))
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write("%d trials, seed %d, %.0f s\n\n%s\n" % (len(results), a.seed, time.time() - t0, t))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    bad = [r for r in results if r["outcome"] not in GOOD]
    if bad:
        print("FAIL: %d trial(s) with %s" % (len(bad), ", ".join(sorted({r["outcome"] for r in bad}))))
        sys.exit(1)
    print("PASS")
