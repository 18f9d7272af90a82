"""The elastic API's input checks (python/tenplex/elastic.py).

Under pytest (issue 32 §4), ctest elastic_api (TENPLEX_BIN the CLI the package runs):

    python -m pytest tests/elastic_api_test.py

- tenplex.elastic: policies (file, text, bad JSON, wrong world size, non-numeric key),
  a world size the policy lacks, a missing torchrun environment, a missing store URL,
  ranks not numbered host by host, a TENPLEX_CONNECT_TIMEOUT that is not a number: each
  an ElasticError naming the problem; the timeouts' defaults and overrides.
- a recorded fatal error (issue 34 finding 4) stops a torchrun with --max_restarts=10 at
  once: one worker start, a non-zero exit, the message on stderr.
- member.Presize (test_presize_tries_once_more): a failed pre-size is tried once more, its
  record keeps the first error; its byte counts are summed over the hosts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import pytest
from elastic_run_testing import Checks

from tenplex import elastic
from tenplex.elastic_cluster import is_torchrun


def expect_error(check: Checks, fn: Callable[[], object], needle: str, what: str) -> None:
    try:
        fn()
    except elastic.ElasticError as e:
        check(needle in str(e), f"{what}: {e}")
        return
    check(False, f"{what}: no ElasticError")


WORKER = """
import sys
with open(sys.argv[1], "a") as f:
    f.write("start\\n")
from tenplex import elastic
elastic.Job("gpt", {"1": "tp=1"}, store_url="http://127.0.0.1:1")
print("the worker went on", flush=True)
"""


def fatal_is_final(check: Checks, tmp: str) -> None:
    """issue 34 finding 4: a worker that finds the fatal marker (an earlier round met an
    unrecoverable loss) exits 76 and stops its torchrun agent: torchrun ends at once,
    with no restart, although --max_restarts=10."""
    script, starts, marker = (os.path.join(tmp, n) for n in ("w.py", "starts", "fatal"))
    with open(script, "w") as f:
        f.write(WORKER)
    with open(marker, "w") as f:
        f.write("tenplex.elastic: job gpt cannot continue: (a test's loss)")
    env = dict(os.environ, TENPLEX_FATAL_FILE=marker)
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        env.pop(k, None)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=1",
            "--max_restarts=10",
            "--monitor_interval=1",
            script,
            starts,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    with open(starts) as f:
        n = len(f.read().splitlines())
    check(
        p.returncode != 0 and n == 1 and "a test's loss" in p.stderr and "went on" not in p.stdout,
        f"a recorded fatal error stops torchrun at once: exit {p.returncode}, {n} worker start(s)",
    )


def test_elastic_api(tmp: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks of the module docstring; the torchrun environment set through monkeypatch."""
    check = Checks()
    pol = os.path.join(tmp, "policy.json")
    with open(pol, "w") as f:
        json.dump({"4": "tp=2,pp=2", "6": "tp=2,dp=3", "2": "tp=2"}, f)
    p1 = elastic.read_policy(pol)
    check(p1 == {4: "tp=2,pp=2,dp=1", 6: "tp=2,pp=1,dp=3", 2: "tp=2,pp=1,dp=1"}, f"policy file: {p1}")
    check(elastic.read_policy('{"1": "tp=1"}') == {1: "tp=1,pp=1,dp=1"}, "policy text")
    check(elastic.pick_config(p1, 6) == "tp=2,pp=1,dp=3", "pick for world 6")
    expect_error(check, lambda: elastic.pick_config(p1, 8), "no config for world size 8", "world size without config")
    expect_error(check, lambda: elastic.read_policy('{"4": "tp=2"}'), "world size 2, not 4", "config of another size")
    expect_error(check, lambda: elastic.read_policy('{"x": "tp=2"}'), "entry 'x'", "non-numeric world size")
    expect_error(check, lambda: elastic.read_policy('{"4": '), "not JSON", "truncated policy")
    expect_error(check, lambda: elastic.read_policy("[]"), "cannot read policy file", "not an object (a path)")
    expect_error(check, lambda: elastic.read_policy("{}"), "expected a JSON object", "empty policy")
    expect_error(check, lambda: elastic.read_policy('{"2": "tp=2,pp=zz"}'), "entry '2'", "malformed config")
    expect_error(
        check,
        lambda: elastic.read_policy(os.path.join(tmp, "missing.json")),
        "cannot read policy file",
        "missing policy file",
    )
    # No table: the config policy picks, for each world size, the fastest predicted
    # config that fits and uses every worker (checked against suggest's own listing).
    model = os.path.join(tmp, "m.json")
    subprocess.run(
        [
            elastic.tenplex_binary(),
            "model",
            "gpt",
            "--num-layers",
            "2",
            "--hidden-size",
            "64",
            "--num-attention-heads",
            "4",
            "--vocab-size",
            "100",
            "-o",
            model,
        ],
        check=True,
    )
    sargs = f"--model {model} --device-profile cpu --global-batch 8 --micro-batch 1 --seq-length 16"
    sp = elastic.read_policy("suggest:" + sargs)
    for w in (1, 2, 4, 8):
        got = elastic.pick_config(sp, w, 2)
        out = subprocess.run(
            [
                elastic.tenplex_binary(),
                "config",
                "suggest",
                *sargs.split(),
                "--gpus",
                str(w),
                "--gpus-per-host",
                "2",
                "--all",
                "--json",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        ok = [c for c in json.loads(out.stdout)["configs"] if c["fits"] and c["tp"] * c["pp"] * c["dp"] == w]
        best = min(ok, key=lambda c: c["step_seconds"])
        check(
            elastic.Config.parse(got).world_size == w and got == str(elastic.Config.parse(best["config"])),
            f"suggested config for {w} workers: {got}",
        )
        cfg, knobs = elastic.pick_choice(sp, w, 2)
        check(
            cfg == got
            and knobs == best["megatron_args"]
            and ("--recompute-granularity" in knobs) == (best["recompute"] != "none"),
            f"{w} workers: the choice's Megatron arguments {knobs}",
        )
    check(elastic.pick_choice({2: "tp=2"}, 2) == ("tp=2", []), "a table policy gives no knobs")
    expect_error(
        check,
        lambda: elastic.pick_config(sp, 6, 2),
        "no config that fits on 6 workers",
        "suggest with no config for the world size",
    )
    expect_error(check, lambda: elastic.read_policy("suggest:--gpus 4"), "needs --model", "suggest without a model")
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "TENPLEX_STORE_URL"):
        monkeypatch.delenv(k, raising=False)
    expect_error(check, lambda: elastic.Job("gpt", pol), "WORLD_SIZE is not set", "outside torchrun")
    for k, v in dict(WORLD_SIZE="4", RANK="3", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", GROUP_RANK="1").items():
        monkeypatch.setenv(k, v)
    expect_error(check, lambda: elastic.Job("gpt", pol), "TENPLEX_STORE_URL", "no store daemon named")
    monkeypatch.setenv("TENPLEX_STORE_URL", "http://127.0.0.1:1")
    job = elastic.Job("gpt", pol)
    check(job.config == "tp=2,pp=2,dp=1" and job.rank == 3, "a job from the torchrun environment")
    monkeypatch.setenv("RANK", "2")
    expect_error(check, lambda: elastic.Job("gpt", pol), "same --nproc_per_node", "ranks not numbered host by host")
    monkeypatch.setenv("RANK", "3")
    expect_error(check, lambda: elastic.Job("a/b", pol), "without '/'", "bad job name")
    check(job.connect_timeout == 60.0 and job.request_timeout == 120, "default timeouts (60 s, 120 s)")
    monkeypatch.setenv("TENPLEX_CONNECT_TIMEOUT", "-1")
    check(elastic.Job("gpt", pol).connect_timeout is None, "TENPLEX_CONNECT_TIMEOUT=-1 waits forever")
    check(elastic.Job("gpt", pol, connect_timeout=5).connect_timeout == 5.0, "connect_timeout= wins")
    monkeypatch.setenv("TENPLEX_CONNECT_TIMEOUT", "soon")
    expect_error(
        check,
        lambda: elastic.Job("gpt", pol),
        "TENPLEX_CONNECT_TIMEOUT='soon' is not a number",
        "a bad TENPLEX_CONNECT_TIMEOUT",
    )
    monkeypatch.delenv("TENPLEX_CONNECT_TIMEOUT")
    monkeypatch.setenv("WORLD_SIZE", "8")
    expect_error(check, lambda: elastic.Job("gpt", pol), "no config for world size 8", "world without a config")
    fatal_is_final(check, tmp)
    # Only torchrun's own command line is an agent to stop (not a test script or a
    # ctest -R naming it: elastic_restore's fatal case once SIGTERMed ctest itself).
    for argv, want in [
        (["/v/bin/python", "-m", "torch.distributed.run", "a.py"], True),
        (["/v/bin/torchrun", "a.py"], True),
        (["/v/bin/python", "/v/bin/torchrun", "a.py"], True),
        (["/v/bin/python", "tests/torchrun_elastic_test.py"], False),
        (["ctest", "-R", "torchrun|elastic_restore"], False),
        ([], False),
    ]:
        check(is_torchrun(argv) == want, f"is_torchrun({argv}) should be {want}")
    check.finish()


def test_presize_tries_once_more(monkeypatch: pytest.MonkeyPatch) -> None:
    """member.Presize: a failed `tenplex transform --presize` is tried once more (its event keeps the
    first error); two failures end in the second's error; the stats are summed over the hosts."""
    from tenplex import member

    calls: list[list[str]] = []
    outcomes: list[object] = []

    def fake_transform(exe: str, args: list[str], old: dict, new: dict, token: str, env: dict) -> dict:
        calls.append(args)
        got = outcomes.pop(0)
        if isinstance(got, Exception):
            raise got
        assert isinstance(got, dict)
        return got

    monkeypatch.setattr(member, "run_transform", fake_transform)
    monkeypatch.setattr(member, "PRESIZE_RETRY_PAUSE", 0.0)
    stats = {"presized": [{"poolable_bytes": 10, "pooled_bytes": 12}, {"poolable_bytes": 5, "pooled_bytes": 3}]}
    old, new = {"hosts": ["http://a"], "gpus_per_host": 2}, {"hosts": ["http://a", "http://b"], "gpus_per_host": 2}

    outcomes[:] = [member.ElasticError("no live host holds it (1 of 2 hosts did not answer)"), stats]
    rec = member.Presize("gpt", "tp=2,dp=2", old, new, "").start().finish(10)
    assert len(calls) == 2 and "--presize" in calls[0] and calls[0] == calls[1], calls
    assert rec["attempts"] == 2 and "did not answer" in rec["first_error"] and "error" not in rec, rec
    assert (rec["poolable_bytes"], rec["pooled_bytes"], rec["hosts"]) == (15, 13, 2), rec

    calls.clear()
    outcomes[:] = [stats]
    rec = member.Presize("gpt", "tp=2,dp=2", old, new, "").start().finish(10)
    assert len(calls) == 1 and rec["attempts"] == 1 and "first_error" not in rec, rec

    calls.clear()
    outcomes[:] = [member.ElasticError("first"), OSError("second")]
    rec = member.Presize("gpt", "tp=2,dp=2", old, new, "").start().finish(10)
    assert len(calls) == 2 and rec["error"] == "second" and rec["first_error"] == "first", rec
