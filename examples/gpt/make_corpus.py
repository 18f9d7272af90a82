#!/usr/bin/env python3
"""Writes data/corpus.jsonl: a small deterministic corpus for the reference GPT client.

Each line is one sample, {"text": "..."}: a few sentences built from fixed word lists
and simple arithmetic, so a tiny model can learn something in a few hundred steps.
The output depends only on --seed (Python's random.Random is stable across versions).
"""

import argparse
import json
import os
import random

NOUNS = "cat dog bird fox horse river mountain city garden robot ship train lamp book tree".split()
ADJS = "small large quick lazy red blue green old young bright quiet loud".split()
VERBS = "sees follows finds watches likes carries builds paints".split()
PLACES = "forest harbor market station library valley bridge tower".split()


def sentence(rng):
    kind = rng.randrange(3)
    if kind == 0:
        return (
            f"the {rng.choice(ADJS)} {rng.choice(NOUNS)} {rng.choice(VERBS)} "
            f"the {rng.choice(ADJS)} {rng.choice(NOUNS)} near the {rng.choice(PLACES)}."
        )
    if kind == 1:
        a, b = rng.randrange(50), rng.randrange(50)
        return f"{a} plus {b} is {a + b}."
    n = rng.randrange(2, 6)
    return f"count to {n}: " + " ".join(str(i) for i in range(1, n + 1)) + "."


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lines", type=int, default=400)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("-o", "--output", default=os.path.join(os.path.dirname(__file__), "data", "corpus.jsonl"))
    a = ap.parse_args()
    rng = random.Random(a.seed)
    with open(a.output, "w") as f:
        for _ in range(a.lines):
            text = " ".join(sentence(rng) for _ in range(rng.randrange(2, 6)))
            f.write(json.dumps({"text": text}) + "\n")


if __name__ == "__main__":
    main()
