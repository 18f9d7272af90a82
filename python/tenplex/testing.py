"""Helpers for tests that start daemons, rendezvous servers and process groups.

`free_port` is the one way the project's tests and scripts choose a TCP port. Asking the
kernel for port 0 and closing the socket returns a port from the ephemeral range
(`/proc/sys/net/ipv4/ip_local_port_range`); until the test binds it, any outgoing
connection on the machine (gloo's full mesh, a UCX wireup, HTTP clients of the tests
running beside it under `ctest -j`) may take it as its local port, and the daemon's
`listen` then fails with "port in use" (the deploy test failed so in a clean-clone CI).
This picks a random port below the ephemeral range instead, which connections never get
by chance, and checks that it is free on every address.
"""

from __future__ import annotations

import random
import socket

_LOWEST = 20000  # above the well-known and registered ports most services use


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_port(tries: int = 200) -> int:
    """A TCP port nothing listens on or holds now, below the ephemeral range."""
    high = _ephemeral_start() - 1
    if high <= _LOWEST:  # an unusual range: fall back to the kernel's choice
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    rng = random.SystemRandom()
    for _ in range(tries):
        port = rng.randint(_LOWEST, high)
        if _bindable(port):
            return port
    raise OSError(f"no free TCP port in {_LOWEST}..{high} after {tries} tries")
