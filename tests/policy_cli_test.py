"""`tenplex config suggest` through the real binary (docs/policy.md).

Under pytest (issue 32 §4), ctest policy_cli, TENPLEX_BIN the CLI under test:

    python -m pytest tests/policy_cli_test.py::test_policy_cli

Checks the JSON against independent sources: every listed config's parameter and
optimizer bytes against the per-rank bytes of `tenplex layout --json` for that config
(the most loaded rank), the memory parts summing to the total and the total within
the GPU memory, the time parts summing to the step time and the list sorted by it,
every config valid (`tenplex layout` accepts it) and using the GPUs; the ranking of a
hand-checked case; and bad input (exit 2 with a message naming the problem, exit 1
when nothing fits).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable

from elastic_run_testing import Checks, small_model

Suggest = Callable[..., "subprocess.CompletedProcess[str]"]


def knobs_searched(check: Checks, suggest: Suggest) -> None:
    """With the knobs searched, each config's setting is the fastest of the settings the
    CLI gives when each is pinned (the CLI as its own oracle over a grid), its Megatron
    arguments name it, and pinning it reproduces its step time."""
    base = [
        "--model",
        "gpt3-1.3b",
        "--gpus",
        "16",
        "--gpu-memory",
        "24GiB",
        "--global-batch",
        "64",
        "--json",
        "--top",
        "0",
        "--no-distributed-optimizer",
    ]
    got = {c["config"]: c for c in json.loads(suggest(*base).stdout)["configs"]}
    check(len(got) >= 4, f"searched: {len(got)} configs fit")
    best: dict[str, float] = {}
    for b in ["1", "2", "4"]:
        for r in ["none", "selective", "full", "full:2", "full:6"]:
            for sp in ["--sequence-parallel", "--no-sequence-parallel"]:
                p = suggest(*base, "--micro-batch", b, "--recompute", r, sp, "--virtual-stages", "1")
                if p.returncode != 0:
                    continue
                for c in json.loads(p.stdout)["configs"]:
                    if c["config"] in got and c["step_seconds"] < best.get(c["config"], 1e300):
                        best[c["config"]] = c["step_seconds"]
    for name, c in got.items():
        if c["virtual_stages"] == 1 and c["micro_batch"] in (1, 2, 4):
            check(
                abs(c["step_seconds"] - best[name]) <= 1e-9 * best[name],
                f"{name}: searched {c['step_seconds']:.4f} s = fastest pinned {best[name]:.4f} s",
            )
        else:
            check(
                c["step_seconds"] <= best[name] * (1 + 1e-9),
                f"{name}: searched (b={c['micro_batch']}, v={c['virtual_stages']}) no slower than the pinned grid",
            )
        a = c["megatron_args"]
        check(
            a[a.index("--micro-batch-size") + 1] == str(c["micro_batch"])
            and ("--sequence-parallel" in a) == (c["sequence_parallel"] and c["tp"] > 1)
            and ("--recompute-granularity" in a) == (c["recompute"] != "none"),
            f"{name}: Megatron arguments {a}",
        )
        pin = [
            "--micro-batch",
            str(c["micro_batch"]),
            "--recompute",
            c["recompute"],
            "--virtual-stages",
            str(c["virtual_stages"]),
            "--sequence-parallel" if c["sequence_parallel"] else "--no-sequence-parallel",
        ]
        again = {x["config"]: x for x in json.loads(suggest(*base, *pin).stdout)["configs"]}
        check(
            name in again and again[name]["step_seconds"] == c["step_seconds"],
            f"{name}: pinning its knobs gives the same step",
        )


def test_policy_cli(tenplex: str, tmp: str) -> None:
    check = Checks()

    def suggest(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([tenplex, "config", "suggest", *args], capture_output=True, text=True)

    model = os.path.join(tmp, "m.json")
    subprocess.run(
        [tenplex, "model", "gpt", "--preset", "gpt3-350m", "--params-dtype", "bf16", "-o", model], check=True
    )
    # the knobs fixed as in the hand-checked case below (selective recompute, SP, no chunks)
    fixed = ["--recompute", "selective", "--sequence-parallel", "--virtual-stages", "1"]
    # 8 GPUs of 16 GiB on one host, the training shape of the hand-checked case, every fitting config
    shape = [
        "--model",
        model,
        "--gpus",
        "8",
        "--gpus-per-host",
        "8",
        "--gpu-memory",
        "16GiB",
        "--global-batch",
        "32",
        "--micro-batch",
        "4",
        "--seq-length",
        "2048",
        "--top",
        "0",
    ]
    p = suggest(*shape, "--json", *fixed)
    check(p.returncode == 0, f"suggest --json exits 0 ({p.stderr.strip()})")
    j = json.loads(p.stdout)
    cfgs = j["configs"]
    check(j["gpus"] == 8 and j["world_size"] == 8 and j["idle_gpus"] == 0, "8 GPUs, all used")
    check(len(cfgs) > 3 and j["considered"] >= len(cfgs), f"{len(cfgs)} fitting of {j['considered']} considered")
    steps = [c["step_seconds"] for c in cfgs]
    check(steps == sorted(steps), "ranked by predicted step time")
    for c in cfgs:
        t, m = c["time"], c["memory"]
        parts = t["compute"] + t["tp"] + t["p2p"] + t["bubble"] + t["dp"]
        check(abs(parts - c["step_seconds"]) <= 1e-9 * c["step_seconds"], f"{c['config']}: time parts sum to the step")
        total = m["params"] + m["optimizer"] + m["gradients"] + m["activations"] + m["reserve"]
        check(
            total == m["total"] and m["total"] <= 16 << 30 and c["fits"],
            f"{c['config']}: memory parts, fits in 16 GiB",
        )
        check(c["tp"] * c["pp"] * c["dp"] == 8, f"{c['config']}: uses 8 GPUs")
        lay = subprocess.run(
            [tenplex, "layout", "--model", model, "--config", c["config"], "--json"], capture_output=True, text=True
        )
        check(lay.returncode == 0, f"{c['config']}: tenplex layout accepts it")
        if lay.returncode == 0:
            ranks = json.loads(lay.stdout)["ranks"]
            want = max(r["bytes"] for r in ranks if r["pp"] == m["stage"] and r["tp"] == m["tp_rank"])
            check(
                m["params"] + m["optimizer"] == want,
                f"{c['config']}: parameters + optimizer {m['params'] + m['optimizer']} B "
                f"= layout's rank bytes {want} B",
            )
            # gradients: one FP32 main gradient per parameter element (bf16: 2 bytes each)
            check(m["gradients"] == 2 * m["params"], f"{c['config']}: FP32 gradients = 2 x bf16 parameters")
    # Hand-checked: 356M parameters x 18 B = 6.0 GiB + 8 GiB of activations (4 x 2048 tokens
    # x 24 layers x 34 B per hidden unit) + 2 GiB reserve do not fit in 16 GiB, so plain
    # dp=8 is out; zero=1 (2 + 4 + 12/8 B per parameter) fits and, on one host without
    # bubble or TP traffic, is the fastest.
    names = [c["config"] for c in cfgs]
    check("tp=1,pp=1,dp=8" not in names, "dp=8 without ZeRO does not fit in 16 GiB")
    check(names[0] == "tp=1,pp=1,dp=8,zero=1", f"dp=8,zero=1 ranks first: {names[:3]}")
    # --all lists the configs that do not fit, after those that do.
    p = suggest(*shape, "--all", "--json", *fixed)
    allc = json.loads(p.stdout)["configs"]
    fits = [c["fits"] for c in allc]
    check(fits == sorted(fits, reverse=True) and not fits[-1], "--all: unfit configs listed last")
    check(
        any(c["config"] == "tp=1,pp=1,dp=8" and c["memory"]["total"] > 16 << 30 for c in allc),
        "--all: dp=8 listed with its memory above 16 GiB",
    )
    knobs_searched(check, suggest)
    # Text output: the dtype in the header (presets are bf16 here), the rows the footer counts.
    p = suggest("--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "256", "--top", "3")
    rows = [ln for ln in p.stdout.splitlines() if ln.strip()[:1].isdigit()]
    check(
        p.returncode == 0
        and "step s" in p.stdout
        and "(bf16 parameters)" in p.stdout
        and len(rows) == 3
        and "3 shown" in p.stdout
        and "Megatron-LM arguments of #1: --tensor-model-parallel-size" in p.stdout,
        f"text table: bf16 header, 3 rows, footer says 3 shown:\n{p.stdout}",
    )
    # One layer and 2 GPUs per host: only TP shards it further, so what fits crosses hosts.
    one = small_model(tenplex, tmp, "one.json", layers=1, hidden=64, heads=8, vocab=256)
    xa = [
        "--model",
        one,
        "--gpus",
        "8",
        "--gpus-per-host",
        "2",
        "--device-profile",
        "cpu",
        "--global-batch",
        "8",
        "--seq-length",
        "32",
    ]
    j = json.loads(suggest(*xa, "--gpu-memory", "400KiB", "--json").stdout)
    check(
        j["fits_only_across_hosts"] and all(c["tp_crosses_hosts"] and c["tp"] > 2 for c in j["configs"]),
        f"only configs with TP across hosts fit: {[c['config'] for c in j['configs']]}",
    )
    text = suggest(*xa, "--gpu-memory", "400KiB").stdout
    check("(x-host tp)" in text and "no config with its tp group inside a host fits" in text, "marked in the table")
    j = json.loads(suggest(*xa, "--gpu-memory", "8MiB", "--json").stdout)
    check(not j["fits_only_across_hosts"] and not j["configs"][0]["tp_crosses_hosts"], "with room: TP in a host")
    # Decimal units as written: 80GB is 80e9 bytes, 80GiB 80 x 2^30.
    for text, want in [("80GB", 80 * 10**9), ("80GiB", 80 << 30)]:
        p = suggest("--model", model, "--gpus", "1", "--gpu-memory", text, "--json")
        check(
            p.returncode == 0 and json.loads(p.stdout)["profile"]["memory"] == want,
            f"--gpu-memory {text} = {want} B",
        )
    # Errors.
    for args, rc, needle in [
        (["--model", model, "--gpus", "0"], 2, "--gpus must be >= 1"),
        (["--model", model, "--gpus", "4", "--device-profile", "tpu"], 2, "unknown device profile"),
        (["--model", model, "--gpus", "4", "--gpu-memory", "lots"], 2, "--gpu-memory"),
        (["--model", model, "--gpus", "4", "--recompute", "some"], 2, "--recompute must be"),
        (["--model", model, "--gpus", "3", "--device-speeds", "1,1"], 2, "--device-speeds has 2 entries"),
        (["--model", model, "--gpus", "4", "--global-batch", "10", "--micro-batch", "4"], 2, "not a multiple"),
        (["--model", "gpt3-175b", "--params-dtype", "bf16", "--gpus", "2"], 1, "fits in 80.00 GiB"),
        (["--model", model, "--params-dtype", "bf16", "--gpus", "2"], 2, "needs a preset name"),
        (["--model", model, "--gpus", "2", "--recompute", "full:0"], 2, "full:N needs N >= 1"),
        (["--model", model, "--gpus", "2", "--recompute", "selective:2"], 2, "full:N needs N >= 1"),
        (["--model", model, "--gpus", "2", "--sequence-parallel", "--no-sequence-parallel"], 2, "give one of"),
        (["--model", model, "--gpus", "2", "--virtual-stages", "-1"], 2, "--virtual-stages must be >= 1"),
    ]:
        p = suggest(*args)
        check(
            p.returncode == rc and needle in p.stderr,
            f"{' '.join(args)} -> exit {p.returncode}: {p.stderr.strip()}",
        )
    bad = os.path.join(tmp, "bad.json")
    with open(bad, "w") as f:
        f.write('{"peak_tflops": -1}')
    p = suggest("--model", model, "--gpus", "4", "--device-profile", bad)
    check(p.returncode == 2 and "peak_tflops" in p.stderr, f"bad profile file: {p.stderr.strip()}")
    check.finish()
