"""The --quorum case of tests/membership_test.py (ctest membership_quorum): the etcd quorum of
tenplex.membership alone, against a real etcd server, no torch; and the host agent's refusal
of bad arguments. quorum_case: joins, deaths (keys left to expire), a dead leader, leaves,
min/max hosts. suspect_case: a reported failure makes the leader probe the world's hosts'
liveness ports (tenplex.liveness): a stalled host stays, a dead one (and a dead leader) is
counted lost at once."""

import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
from elastic_run_test import Checks  # noqa: E402
from torchrun_elastic_test import PY  # noqa: E402

TTL = 2.0  # the hosts' keys' TTL here and in the training scenario


def quorum_case(endpoint: str) -> None:
    from tenplex import membership as mb

    check = Checks()
    live = {}

    def join(name):
        q = mb.Quorum(
            endpoint,
            "qtest",
            name,
            {"store_url": f"http://{name}:1", "addr": name, "nproc": 2},
            ttl=TTL,
            min_hosts=2,
            max_hosts=3,
            settle=0.2,
        )
        q.join()
        q.start()
        live[name] = q
        return q

    def die(name):
        live.pop(name).close(remove_keys=False)

    def world_after(epoch, timeout=4 * TTL + 5):
        any_q = next(iter(live.values()))
        deadline = time.time() + timeout
        while time.time() < deadline:
            w = any_q.world()
            if w is not None and w.epoch > epoch:
                return w
            time.sleep(0.02)
        return None

    def expect(epoch, hosts, lost=(), left=(), since=None):
        w = world_after(epoch - 1)
        ok = w is not None and w.epoch == epoch and w.hosts == hosts and w.lost == list(lost) and w.left == list(left)
        took = f" after {time.time() - since:.2f} s" if since else ""
        check(
            ok,
            f"world {epoch}: hosts {hosts}, lost {list(lost)}, left {list(left)}{took}: "
            f"{w and (w.epoch, w.hosts, w.lost, w.left)}",
        )
        return w

    try:
        join("h0")
        time.sleep(1.0)
        check(live["h0"].world() is None, "no world below min_hosts (2)")
        join("h1")
        expect(1, ["h0", "h1"])
        join("h2")
        expect(2, ["h0", "h1", "h2"])
        t = time.time()
        die("h1")
        expect(3, ["h0", "h2"], lost=["h1"], since=t)
        join("h3")
        expect(4, ["h0", "h2", "h3"])
        leader = [n for n, q in live.items() if q.leader]
        check(leader == ["h0"], f"the first host leads: {leader}")
        t = time.time()
        die("h0")  # the leader dies: another agent takes the leader key after the TTL
        expect(5, ["h2", "h3"], lost=["h0"], since=t)
        check(sum(q.leader for q in live.values()) == 1, "one new leader")
        t = time.time()
        live["h3"].leave()
        time.sleep(1.0)
        check(live["h2"].world().epoch == 5, "a leave that would go below min_hosts waits")
        join("h4")
        expect(6, ["h2", "h4"], left=["h3"], since=t)
        join("h5")
        expect(7, ["h2", "h4", "h5"])
        join("h6")
        time.sleep(1.0)
        check(live["h2"].world().epoch == 7, "max_hosts (3): no world with a 4th host")
        live.pop("h5").close()  # an orderly exit removes its key: h6 takes the place
        expect(8, ["h2", "h4", "h6"], lost=["h5"])
        try:
            mb.Quorum(endpoint, "qtest", "a/b", {})
            check(False, "a host id with '/' is refused")
        except mb.MembershipError as e:
            check("'/'" in str(e), f"clear error: {e}")
    finally:
        for q in live.values():
            q.close()
    suspect_case(check, endpoint)
    bad_agent_args(check, endpoint)
    check.finish()


def stopped_port():
    """A process listening on a liveness port (tenplex.liveness.Liveness), SIGSTOPped: what the
    kernel shows of a live agent that does not run (stalled). (process, port)."""
    code = (
        "import time; from tenplex.liveness import Liveness; "
        "print(Liveness('127.0.0.1').port, flush=True); time.sleep(300)"
    )
    env = dict(
        os.environ, PYTHONPATH=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")
    )
    p = subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    port = int(p.stdout.readline())
    os.kill(p.pid, signal.SIGSTOP)
    return p, port


def wait_world(q, pred, timeout=4 * TTL + 5):
    """The first world q reads (polling every 10 ms) that satisfies pred, else the last one read."""
    deadline, w = time.time() + timeout, None
    while time.time() < deadline:
        w = q.world()
        if w is not None and pred(w):
            break
        time.sleep(0.01)
    return w


def suspect_case(check, endpoint):
    """A failure reported in a world (Quorum.suspect, as an agent does when a worker's
    collective failed): the leader probes the world's hosts' liveness ports. A live host
    whose agent stalls (its key not refreshed, its port's process SIGSTOPped) stays; a
    dead one (its port closed, its key left to expire) is counted lost at once
    (World.refused), before its key's TTL; a dead leader's key is deleted by the reporter."""
    import socket

    from tenplex import membership as mb
    from tenplex.liveness import Liveness

    live, ports = {}, {}
    stalled, port_d = stopped_port()

    def quorum(name, v=None):
        if v is None:
            ports[name] = Liveness("127.0.0.1")
            v = ports[name].register({"addr": "127.0.0.1", "nproc": 2})
        return mb.Quorum(endpoint, "qsuspect", name, v, ttl=TTL, min_hosts=2, max_hosts=4, settle=0.2)

    def die_and_report(name, epoch):
        live.pop(name).close(remove_keys=False)
        ports.pop(name).close()
        live["c"].suspect(epoch)
        t, hosts, lost = time.time(), [h for h in "acd" if h in live], [name]
        w = wait_world(live["c"], lambda w: w.epoch > epoch)
        got = w and (w.epoch, w.hosts, w.lost, w.refused)
        check(
            got == (epoch + 1, hosts, lost, lost),
            f"world {epoch + 1}: {hosts}, {lost} lost and refused its probe, {time.time() - t:.2f} s "
            f"after the report (TTL {TTL:g} s): {got}",
        )

    try:
        d = {"addr": "127.0.0.1", "nproc": 2, "alive": port_d, "machine": socket.gethostname()}
        for name in "abcd":
            live[name] = quorum(name, d if name == "d" else None)
            live[name].join()
            live[name].start()
            while name == "a" and not live["a"].leader:
                time.sleep(0.01)
        w = wait_world(live["c"], lambda w: w.hosts == ["a", "b", "c", "d"])
        check(w is not None and w.hosts == ["a", "b", "c", "d"], f"a world of a, b, c, d: {w}")
        e = w.epoch if w else 0
        q = live.pop("d")  # d stalls: its key's refreshes stop, its port's process is stopped
        q.close(remove_keys=False)
        q._etcd.refresh(q._key, ttl=int(TTL), prevExist=True)  # 2 s from now before the TTL could end it
        probes = live["a"].probes
        live["c"].suspect(e)
        time.sleep(1.0)
        check(
            live["c"].world().epoch == e and live["a"].probes >= probes + 2,
            f"a stalled host is not removed: world {live['c'].world().epoch}, the leader probed "
            f"{live['a'].probes - probes} times in 1 s",
        )
        os.kill(stalled.pid, signal.SIGCONT)
        live["d"] = quorum("d", q.value)
        live["d"].start()  # refreshes the key again (registered before)
        die_and_report("b", e)
        die_and_report("a", e + 1)  # the leader: c deletes its leader key, the new leader probes
        check(sum(q.leader for q in live.values()) == 1, "one new leader")
    finally:
        for q in live.values():
            q.close()
        for port in ports.values():
            port.close()
        stalled.kill()
        stalled.wait()


def bad_agent_args(check, endpoint):
    """The host agent refuses bad input with a clear error (no traceback, no worker started)."""
    env = dict(
        os.environ, PYTHONPATH=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")
    )
    base = ["--job", "j", "--nproc", "1", "--store-url", "http://127.0.0.1:1"]
    for args, want in (
        ([*base, "--etcd", endpoint, "train.py"], "'--' is missing"),
        ([*base, "--etcd", "127.0.0.1:1", "--", "train.py"], "does not answer"),
        ([*base, "--etcd", endpoint, "--nproc", "0", "--", "train.py"], "--nproc must be >= 1"),
        (
            [*base, "--etcd", endpoint, "--min-hosts", "3", "--max-hosts", "2", "--", "train.py"],
            "min_hosts <= max_hosts",
        ),
    ):
        p = subprocess.run([PY, "-m", "tenplex.hostagent", *args], capture_output=True, text=True, env=env, timeout=60)
        out = p.stdout + p.stderr
        check(
            p.returncode != 0 and want in out and "Traceback" not in out,
            f"hostagent {' '.join(args[6:])}: refused with {want!r} (status {p.returncode}): {out.strip()[-200:]}",
        )
