#!/usr/bin/env python3
"""Starts every rank of a parallel config on this machine and waits for them.

  launch.py --config tp=2,pp=2 --model M.json [train.py args...]

Picks a free port, runs world-size `train.py` processes (--world-rank r
--world-size n --master-port P, other arguments passed through), and exits with the
first non-zero status, stopping the remaining ranks when one fails.
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
from tenplex import layout as L  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(config, train_args, port=None, python=sys.executable, script=None, timeout=None):
    """Runs all ranks; returns the exit status (0 when all succeeded)."""
    n = L.Config.parse(config).world_size
    port = port or free_port()
    script = script or os.path.join(HERE, "train.py")
    procs = [
        subprocess.Popen(
            [
                python,
                script,
                "--config",
                config,
                "--world-rank",
                str(r),
                "--world-size",
                str(n),
                "--master-port",
                str(port),
            ]
            + list(train_args)
        )
        for r in range(n)
    ]
    deadline = time.monotonic() + timeout if timeout else None
    status = 0
    try:
        while procs:
            for p in list(procs):
                rc = p.poll()
                if rc is None:
                    continue
                procs.remove(p)
                if rc != 0 and status == 0:
                    status = rc
                    for q in procs:
                        q.send_signal(signal.SIGTERM)
            if deadline and time.monotonic() > deadline and status == 0:
                print(f"launch.py: timeout after {timeout} s", file=sys.stderr)
                status = 124
                for q in procs:
                    q.send_signal(signal.SIGTERM)
            time.sleep(0.02)
    finally:
        for q in procs:
            q.kill()
            q.wait()
    return status


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--master-port", type=int)
    ap.add_argument("--timeout", type=float, help="seconds before all ranks are stopped")
    a, rest = ap.parse_known_args()
    try:
        L.Config.parse(a.config)
    except ValueError as e:
        print(f"launch.py: error: {e}", file=sys.stderr)
        sys.exit(2)
    sys.exit(launch(a.config, rest, port=a.master_port, timeout=a.timeout))


if __name__ == "__main__":
    main()
