"""tenplex._torch_warm: after the warm-up, a process's first backward() with an explicit
gradient (what every pipeline stage but the last runs) imports nothing more, and it did
import something before (so the check can fail). Each case runs in a fresh interpreter:
sys.modules of this one has seen other tests."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = r"""
import json, sys, time
import torch
warm = sys.argv[1] == "warm"
if warm:
    from tenplex._torch_warm import warm_backward
    warm_backward()
before = set(sys.modules)
t0 = time.perf_counter()
x = torch.randn(4, 8, requires_grad=True)
y = torch.nn.functional.linear(x, torch.randn(3, 8))
y.backward(torch.ones(3, 4).t())
print(json.dumps({"new": sorted(set(sys.modules) - before), "seconds": time.perf_counter() - t0}))
"""


def first_backward(mode: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], check=True, capture_output=True, text=True, timeout=300)
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_warm_backward_leaves_nothing_to_import() -> None:
    cold = first_backward("cold")
    warm = first_backward("warm")
    print(f"first backward with a gradient: cold {cold['seconds']:.3f} s, warm {warm['seconds']:.3f} s")
    assert cold["new"], "torch imported nothing on a cold first backward: the warm-up has nothing to do"
    assert warm["new"] == [], f"modules imported by the first backward after the warm-up: {warm['new']}"
