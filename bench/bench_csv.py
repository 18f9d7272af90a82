"""Shared by the bench/*.py scripts: write a list of dict rows as docs/benchmarks/NAME."""

import csv
import os


def write_rows(out_dir, name, rows, tag):
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    print(f"[{tag}] wrote {path}")
    return path
