"""A dead coordinator's job lease released by the next one (issue 37: a loss whose dead host
held rank 0 waited out the 10 s lease before its survivors could restore).

ctest lease_break: python -m pytest tests/lease_break_test.py, TENPLEX_BIN in the environment
(tests/conftest.py).

Against real store daemons: leases are taken over HTTP as a dead rank 0 left them (no
renewal), `elastic_cluster.break_leases` with `member.coordinator_prefix` of the dead host
releases exactly those on every daemon, never a live host's (host10's beside a dead
host1), skips a daemon that does not answer, and the next coordinator (the binding's
JobLease) takes the lease at once instead of after its TTL.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator

import pytest

from tenplex import _tenplex
from tenplex.elastic_cluster import break_leases
from tenplex.member import coordinator_prefix, coordinator_what
from tenplex.testing import Daemon, free_port


def lease(url: str, method: str, job: str, holder: str = "", ttl_ms: int = 0) -> dict:
    """One /v1/jobs/{job}/lease request as a coordinator sends it (no token: loopback)."""
    query = f"?ttl_ms={ttl_ms}" if ttl_ms else ""
    headers = {"X-Tenplex-Coordinator": holder} if holder else {}
    req = urllib.request.Request(f"{url}/v1/jobs/{job}/lease{query}", method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=10) as r:
        body = r.read()
    return json.loads(body) if body else {}


@pytest.fixture
def daemons(tenplex: str) -> Iterator[list[Daemon]]:
    ds = [Daemon(tenplex, env={"TENPLEX_TOKEN": ""}) for _ in range(2)]
    try:
        yield ds
    finally:
        for d in ds:
            d.stop()


def test_a_dead_hosts_lease_is_released_everywhere_and_no_other(daemons: list[Daemon]) -> None:
    urls = [d.url for d in daemons]
    dead = _tenplex.new_coordinator(coordinator_what("host1"))
    live = _tenplex.new_coordinator(coordinator_what("host10"))
    for u in urls:  # the dead rank 0's lease on job j, a minute left, nobody renewing it
        assert lease(u, "POST", "j", dead, ttl_ms=60000)["holder"] == dead
    assert lease(urls[0], "POST", "k", live, ttl_ms=60000)["holder"] == live
    gone = f"http://127.0.0.1:{free_port()}"  # a daemon that does not answer: skipped

    assert break_leases(urls + [gone], "k", "", [coordinator_prefix("host1")], timeout_s=2) == []
    assert lease(urls[0], "GET", "k")["holder"] == live  # host10's is not host1's
    released = break_leases([gone] + urls, "j", "", [coordinator_prefix("host1")], timeout_s=2)
    assert released == [f"{u}: {dead}" for u in urls]
    for u in urls:
        assert lease(u, "GET", "j")["holder"] is None

    # The next coordinator takes it at once (before: after the dead one's TTL).
    t0 = time.monotonic()
    nxt = _tenplex.JobLease(urls, "", "j", _tenplex.new_coordinator(coordinator_what("host0")), 10000, timeout_s=5)
    try:
        assert time.monotonic() - t0 < 2.0
        assert nxt.error() == ""
        assert lease(urls[1], "GET", "j")["holder"].startswith(coordinator_prefix("host0"))
    finally:
        nxt.release()


def test_prefixes_stop_at_the_at_sign_in_holder_characters() -> None:
    assert coordinator_prefix("host1") == "tenplex-member.host1@"
    assert not _tenplex.new_coordinator(coordinator_what("host10")).startswith(coordinator_prefix("host1"))
    # a character a holder may not have becomes '-', as in the name rank 0 really takes
    assert coordinator_prefix("h 1") == "tenplex-member.h-1@"
