#!/usr/bin/env python3
"""Step time of the reference GPT client per parallel config, on this machine.

  bench.py --model M.json [--steps 10] [--configs tp=1,tp=2,...] [train.py args]

Runs each config with launch.py and prints seconds per step (mean after the first
step) and the ratio to the single-process tp=1 step measured in the same run; the goal
for the default small model is well under 1 s per step on 2 cores.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
from tenplex.layout import Config  # noqa: E402

DEFAULT = "tp=1;tp=2;pp=2;dp=2;dp=2,zero=1;tp=2,pp=2;tp=2,pp=2,dp=2,zero=1"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--configs", default=DEFAULT, help="configs separated by ';'")
    a, rest = ap.parse_known_args()
    print(f"{'config':28} {'ranks':>5} {'s/step':>8} {'vs tp=1':>8} {'loss at end':>12}")
    base = None
    with tempfile.TemporaryDirectory() as tmp:
        for c in a.configs.split(";"):
            log = os.path.join(tmp, "log.jsonl")
            if os.path.exists(log):
                os.unlink(log)
            r = subprocess.run(
                [
                    sys.executable,
                    os.path.join(HERE, "launch.py"),
                    "--config",
                    c,
                    "--model",
                    a.model,
                    "--steps",
                    str(a.steps),
                    "--log",
                    log,
                ]
                + rest,
                capture_output=True,
                text=True,
            )
            if r.returncode != 0:
                sys.exit(f"bench.py: {c} failed:\n{r.stderr[-2000:]}")
            recs = [json.loads(x) for x in open(log)]
            times = [x["seconds"] for x in recs][1:] or [recs[0]["seconds"]]
            t = sum(times) / len(times)
            base = base or t
            ranks = Config.parse(c).world_size
            print(f"{c:28} {ranks:5d} {t:8.3f} {t / base:8.2f} {recs[-1]['loss']:12.6f}", flush=True)


if __name__ == "__main__":
    main()
