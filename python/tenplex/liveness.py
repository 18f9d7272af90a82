"""An agent's liveness port and the probe of other agents' (in-process membership,
tenplex.membership): how a survivor's report of a failed collective ends a dead host's
membership at once instead of after its key's TTL, without ever ending a live one's.

The kernel completes a TCP connect to a listening socket whether or not the owning
process runs (stalled, paused by SIGSTOP, swapped, in a long garbage collection), and
refuses it (ECONNREFUSED, an RST) once no socket listens on that port: the process is
gone, its sockets closed by the kernel. So a refused connect to an agent's liveness port
proves the agent dead; anything else (a connect that succeeds, times out, or fails as
unreachable: a host powered off, a partition) proves nothing and leaves the decision to
the TTL. The port is only trusted on the address the host registered as its own (the
one the others reach its TCPStore and store daemon at), never on an unspecified one.
"""

import errno
import ipaddress
import selectors
import socket
import threading
import time
from typing import Optional

# Seconds between two probes of a suspected world's hosts: a SIGKILLed agent's socket closes
# only once its exit has torn its memory down (tens to hundreds of ms after the kill).
PROBE_EVERY = 0.05
PROBE_TIMEOUT = 0.2  # seconds a probe's connect may take (then it proves nothing)
UNSPECIFIED = ("", "0.0.0.0", "::")  # addresses no other host can probe


class Liveness:
    """This agent's liveness port: a listening TCP socket on `addr` (port 0) that accepts
    and closes every connect. Other agents probe it (refused_hosts()) to tell a dead agent
    from a live one: the kernel completes a connect to a listening socket whether or not
    the process is scheduled (stalled, paused, swapped), and refuses it once the process
    is gone (the socket is not inherited by the workers: close-on-exec)."""

    def __init__(self, addr: str):
        if addr in UNSPECIFIED:
            raise ValueError(f"the liveness port needs this host's own address, not {addr!r}: give --addr")
        self.sock = socket.create_server((addr, 0), backlog=128)  # OSError when addr is not this host's
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, name="tenplex-liveness", daemon=True).start()

    def register(self, value: dict) -> dict:
        """`value` (a host's registration) with this port and this machine's name."""
        return dict(value, alive=self.port, machine=socket.gethostname())

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            conn.close()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept
        except OSError:
            pass
        self.sock.close()


def refused_hosts(targets: dict[str, tuple[str, int]], timeout: float = PROBE_TIMEOUT) -> set[str]:
    """The names of `targets` ({name: (addr, port)}) whose connect is refused (ECONNREFUSED:
    nothing listens there), all connected at once, waiting up to `timeout` s. A connect
    that succeeds, times out or fails otherwise (unreachable, ...) does not count."""
    out: set[str] = set()
    pending: dict[socket.socket, str] = {}
    sel = selectors.DefaultSelector()
    try:
        for name, (addr, port) in targets.items():
            try:
                fam, typ, proto, _, sa = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
                s = socket.socket(fam, typ, proto)
            except OSError:
                continue
            s.setblocking(False)
            err = s.connect_ex(sa)
            if err == errno.EINPROGRESS:
                pending[s] = name
                sel.register(s, selectors.EVENT_WRITE)
                continue
            if err == errno.ECONNREFUSED:
                out.add(name)
            s.close()
        deadline = time.monotonic() + timeout
        while pending and (left := deadline - time.monotonic()) > 0:
            for key, _ in sel.select(left):
                ready = key.fileobj
                assert isinstance(ready, socket.socket)
                if ready.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ECONNREFUSED:
                    out.add(pending[ready])
                sel.unregister(ready)
                ready.close()
                del pending[ready]
    finally:
        for s in pending:
            s.close()
        sel.close()
    return out


def probe_target(value: dict) -> Optional[tuple[str, int]]:
    """(addr, liveness port) of a host's registration value (Liveness.register); None when it
    has none, or a loopback address registered on another machine (its refusal would be
    this machine's)."""
    port, addr = value.get("alive"), value.get("addr")
    if not isinstance(port, int) or not isinstance(addr, str) or addr in UNSPECIFIED:
        return None
    if _loopback(addr) and value.get("machine") != socket.gethostname():
        return None
    return addr, port


def _loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return addr == "localhost"
