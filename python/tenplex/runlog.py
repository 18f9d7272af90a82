"""Reading the JSON-lines log that `tenplex run --log` and examples/gpt/train.py --log
write: one line per completed step ({"step", "loss", "samples", "seconds",
"rank_seconds", "config", ...}) and event lines ({"event": "reconfigure" | "rebalance" |
..., ...}). Pure Python (no native module needed)."""

import json
import os
from typing import Any


def read_run_log(path: str, missing_ok: bool = False) -> tuple[dict[int, Any], list[Any]]:
    """(steps, events) of the log at `path`: steps maps a step number to its line (the
    last one, so a step that was re-run after a failure counts once, as re-run), events
    lists the event lines in order. A line that is not complete JSON (the writer is in
    the middle of it) is skipped. A missing file is ({}, []) with missing_ok, else an
    error."""
    steps: dict[int, Any] = {}
    events: list[Any] = []
    if missing_ok and not os.path.exists(path):
        return steps, events
    with open(path) as f:
        for line in f:
            try:
                j = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "event" in j:
                events.append(j)
            elif "step" in j:
                steps[j["step"]] = j
    return steps, events
