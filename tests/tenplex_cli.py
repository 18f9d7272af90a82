"""Running the tenplex CLI from a test: one place for the exit-status check."""

import subprocess
import sys


def run(binary, *args, expect=0):
    """Runs `binary args...`; exits the test with both outputs unless it exits `expect`."""
    p = subprocess.run([binary, *map(str, args)], capture_output=True, text=True)
    if p.returncode != expect:
        sys.exit(
            f"FAIL: tenplex {' '.join(map(str, args))}: exit {p.returncode}, expected {expect}\n{p.stdout}\n{p.stderr}"
        )
    return p
