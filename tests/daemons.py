"""The tests' CLI runner and check; the store daemons (`Daemon`, `write_cluster`) and
network namespaces (`NetnsBridge`) are the package's (`tenplex.testing`, which benchmarks
and scripts import too), re-exported here for the tests that import them from here."""

import subprocess
import sys

from tenplex.testing import Daemon, NetnsBridge, write_cluster

__all__ = ["Daemon", "NetnsBridge", "check", "run_cli", "write_cluster"]


def check(cond, msg):
    if not cond:
        print("FAIL:", msg)
        sys.exit(1)


def run_cli(tenplex, *args, expect_ok=True):
    """Runs `tenplex ARGS`; expect_ok=False requires a failure with a clear error."""
    p = subprocess.run([tenplex, *args], capture_output=True, text=True, timeout=300)
    if expect_ok:
        check(p.returncode == 0, "%s failed: %s%s" % (" ".join(args), p.stdout, p.stderr))
    else:
        check(p.returncode != 0, "%s should have failed: %s" % (" ".join(args), p.stdout))
        check("error" in p.stderr and "Traceback" not in p.stderr, "unclear error: %r" % p.stderr)
    return p
