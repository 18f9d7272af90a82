"""`tenplex config suggest` through the real binary (docs/policy.md).

usage: policy_cli_test.py TENPLEX_BIN

Checks the JSON against independent sources: every listed config's parameter and
optimizer bytes against the per-rank bytes of `tenplex layout --json` for that config
(the most loaded rank), the memory parts summing to the total and the total within
the GPU memory, the time parts summing to the step time and the list sorted by it,
every config valid (`tenplex layout` accepts it) and using the GPUs; the ranking of a
hand-checked case; and bad input (exit 2 with a message naming the problem, exit 1
when nothing fits).
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from elastic_run_test import Checks  # noqa: E402


def main():
    tenplex = sys.argv[1]
    check = Checks()

    def suggest(*args):
        return subprocess.run([tenplex, "config", "suggest", *args], capture_output=True, text=True)

    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "m.json")
        subprocess.run([tenplex, "model", "gpt", "--preset", "gpt3-350m", "--params-dtype", "bf16", "-o", model],
                       check=True)
        p = suggest("--model", model, "--gpus", "8", "--gpus-per-host", "8", "--gpu-memory", "16GiB",
                    "--global-batch", "32", "--micro-batch", "4", "--seq-length", "2048", "--top", "0", "--json")
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
            check(total == m["total"] and m["total"] <= 16 << 30 and c["fits"], f"{c['config']}: memory parts, fits in 16 GiB")
            check(c["tp"] * c["pp"] * c["dp"] == 8, f"{c['config']}: uses 8 GPUs")
            lay = subprocess.run([tenplex, "layout", "--model", model, "--config", c["config"], "--json"],
                                 capture_output=True, text=True)
            check(lay.returncode == 0, f"{c['config']}: tenplex layout accepts it")
            if lay.returncode == 0:
                ranks = json.loads(lay.stdout)["ranks"]
                want = max(r["bytes"] for r in ranks if r["pp"] == m["stage"] and r["tp"] == m["tp_rank"])
                check(m["params"] + m["optimizer"] == want,
                      f"{c['config']}: parameters + optimizer {m['params'] + m['optimizer']} B = layout's rank bytes {want} B")
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
        p = suggest("--model", model, "--gpus", "8", "--gpus-per-host", "8", "--gpu-memory", "16GiB", "--global-batch",
                    "32", "--micro-batch", "4", "--seq-length", "2048", "--top", "0", "--all", "--json")
        allc = json.loads(p.stdout)["configs"]
        fits = [c["fits"] for c in allc]
        check(fits == sorted(fits, reverse=True) and not fits[-1], "--all: unfit configs listed last")
        check(any(c["config"] == "tp=1,pp=1,dp=8" and c["memory"]["total"] > 16 << 30 for c in allc),
              "--all: dp=8 listed with its memory above 16 GiB")
        # Text output.
        p = suggest("--model", "gpt3-1.3b", "--params-dtype", "bf16", "--gpus", "16", "--global-batch", "256")
        check(p.returncode == 0 and "step s" in p.stdout and "tp=" in p.stdout, "text table")
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
        ]:
            p = suggest(*args)
            check(p.returncode == rc and needle in p.stderr, f"{' '.join(args)} -> exit {p.returncode}: {p.stderr.strip()}")
        bad = os.path.join(tmp, "bad.json")
        with open(bad, "w") as f:
            f.write('{"peak_tflops": -1}')
        p = suggest("--model", model, "--gpus", "4", "--device-profile", bad)
        check(p.returncode == 2 and "peak_tflops" in p.stderr, f"bad profile file: {p.stderr.strip()}")
    check.finish()


if __name__ == "__main__":
    main()
