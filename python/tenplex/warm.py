"""Warm workers of `tenplex run --warm` (src/tenplex/runtime/warm.h): a worker process
lives through many segments of the schedule instead of one.

The runner starts a worker with `--warm-control PREFIX`. After each segment (its state
written into the store, its process group destroyed) the worker writes
`PREFIX<n>.parked` and waits for the runner's message `PREFIX<n>.json`, n = 1, 2, ...:
  {"args": [...]}   the runner's arguments for the next segment (--config, --world-rank,
                    --world-size, --master-port, --start-step, --state-in, ...), which
                    replace those of the last one; the worker joins the new world, loads
                    its new local tensors from the store and trains on;
  {"exit": true}    the new world has no place for it: it exits 0.
A spare (`--warm-spare`, started ahead while the old world trains) parks at once.
While a segment runs, a watcher thread polls for `PREFIX<n>.abort`, which the runner
writes when a peer died (a failure): the thread shuts down the process's connected TCP
sockets, so that every pending gloo collective fails at once, here and (through the
closed connections) at every peer; the worker then drops its process groups and parks
like after a normal segment. A worker whose own collective fails first (a direct peer of
the dead one) breaks its connections the same way and waits for the abort; when none
comes (a real error, not a failure the runner knows), it raises the error.
"""

import faulthandler
import gc
import json
import os
import socket
import sys
import threading
import time

import torch
import torch.distributed as dist

from . import handoff
from ._torch_warm import warm_backward

# Seconds after an abort at which a worker that has not parked yet dumps its threads' stacks.
NOT_PARKED_DUMP_S = 10.0

# Set while the runner has aborted the current segment (read by handoff waits).
ABORT = threading.Event()


# Set once the runner asked for a planned stop of a healthy world (a rebalance).
STOP = threading.Event()


class Aborted(Exception):
    """The runner aborted the segment (a peer failed)."""


class Stopped(Exception):
    """Every rank agreed on the runner's planned stop at the same step boundary."""


def stop_agreed():
    """At a step boundary, on every rank of the world: whether any rank has seen the
    runner's planned stop (one all-reduce MAX of one int on the default group, so that
    all ranks stop at the same boundary). A rank that read the stop on its own and parked
    while a slower one entered the next step's collective broke that collective."""
    flag = torch.tensor([1 if STOP.is_set() else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def shutdown_sockets():
    """Shuts down every connected TCP socket of this process (listening ones stay)."""
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(int(name)))
        except (OSError, ValueError):
            continue
        try:
            if (
                s.family in (socket.AF_INET, socket.AF_INET6)
                and s.type == socket.SOCK_STREAM
                and not s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
            ):
                s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            s.close()


def _wait_file(path, timeout, what):
    deadline = time.monotonic() + timeout
    parent = os.getppid()
    while not os.path.exists(path):
        if os.getppid() != parent:
            raise SystemExit(f"warm worker: the runner is gone while waiting for {what}")
        if time.monotonic() > deadline:
            raise SystemExit(f"warm worker: no {what} ({path}) within {timeout:g} s")
        time.sleep(0.002)


def wait_port(host, port, timeout, cancel=None):
    """Waits until rank 0's rendezvous store listens on host:port. (torch's store client
    retries a refused connection only once a second: a warm world that joins in
    milliseconds would lose a second on it.) Returns early once cancel() is true (the
    world was aborted meanwhile: its store's host may be dead)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline or (cancel is not None and cancel()):
                return  # init_process_group reports it (or the caller sees the abort)
            time.sleep(0.002)


def drop_world(stop, thread):
    """Ends this process's part in a world: stops its watcher (sets `stop`, joins
    `thread` when there is one), destroys the default process group (a broken world is
    dropped all the same), collects the old world's groups and tensors (cycles) and
    freezes what lives on. Warm workers (Control.park) and membership workers
    (tenplex.membership.Member.teardown) both end their worlds so."""
    stop.set()
    if thread is not None:
        thread.join()
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a broken world is dropped all the same
            pass
    if not dist.is_initialized():
        # A default group whose rendezvous failed took a name (torch numbers the groups made
        # since the last default group was destroyed: "0", "1", ...) and was never made, so
        # nothing reset the count: the next world's ranks would name its group differently
        # (the ones whose rendezvous failed "1", the others "0") and wait for each other's
        # store keys in vain.
        dist.distributed_c10d._world.group_count = 0
    gc.collect()
    gc.freeze()


def _planned(path):
    """Whether the runner's abort file `path` asks for a planned stop ({"stop": true})."""
    try:
        with open(path) as f:
            return bool(json.load(f).get("stop"))
    except (OSError, ValueError, AttributeError):
        return False


class Control:
    def __init__(self, prefix, timeout):
        self.prefix, self.timeout, self.seq = prefix, timeout, 0
        # perf_counter() times of this worker's phases (rank 0 logs them as "warm_join"):
        # "saved" (its state written), "parked", "message" (the next segment's read).
        self.times = {}
        # The state this worker wrote at its last stop, for its next load (the client's:
        # handoff.KeptState.remember at the stop, read_rank(keep=) at the load).
        self.kept = handoff.KeptState()
        self._stop = threading.Event()
        self._thread = None

    def _path(self, ext):
        return f"{self.prefix}{self.seq + 1}.{ext}"

    def watch(self):
        """Starts watching for the runner's abort of the running segment."""
        ABORT.clear()
        STOP.clear()
        self._stop.clear()
        path = self._path("abort")

        def loop():
            while not self._stop.is_set():
                if os.path.exists(path):
                    if _planned(path):  # the ranks park at an agreed step boundary
                        STOP.set()
                        return
                    ABORT.set()
                    shutdown_sockets()
                    # Where this process is when it has not parked 10 s later (the runner
                    # stops a worker that does not park within 30 s): every thread's stack
                    # into the worker's log. park() cancels it.
                    faulthandler.dump_traceback_later(NOT_PARKED_DUMP_S, exit=False)
                    return
                self._stop.wait(0.003)

        self._thread = threading.Thread(target=loop, name="tenplex-warm-abort", daemon=True)
        self._thread.start()

    def failed(self, error):
        """The segment raised `error`: True when it is the runner's abort (after breaking
        this process's connections so that the peers fail too), else False."""
        shutdown_sockets()
        if not ABORT.is_set():
            _wait_abort = self._path("abort")
            deadline = time.monotonic() + min(self.timeout, 60)
            while not os.path.exists(_wait_abort) and time.monotonic() < deadline:
                time.sleep(0.003)
            if not os.path.exists(_wait_abort):
                return False
            ABORT.set()
        return True

    def park(self):
        """After a segment: drops the process groups, says so and waits for the next
        message; returns it."""
        drop_world(self._stop, self._thread)
        faulthandler.cancel_dump_traceback_later()
        self._thread = None
        with open(self._path("parked"), "w"):
            pass
        self.times["parked"] = time.perf_counter()
        msg_path = self._path("json")
        _wait_file(msg_path, self.timeout, "message from the runner")
        with open(msg_path) as f:
            msg = json.load(f)
        self.times["message"] = time.perf_counter()
        self.seq += 1
        ABORT.clear()
        STOP.clear()
        return msg


def join_event(times, step):
    """The "warm_join" log event: the seconds of each phase between the last segment's
    state written and this one's state loaded, from perf_counter() stamps (those absent
    are left out)."""
    phases = [
        ("saved", "parked", "park_s"),
        ("parked", "message", "wait_s"),
        ("message", "start", "args_s"),
        ("start", "pg", "init_pg_s"),
        ("pg", "trainer", "trainer_s"),
        ("trainer", "transformed", "wait_in_s"),
        ("transformed", "loaded", "load_s"),
    ]
    if "transformed" not in times and "trainer" in times:
        times = dict(times, transformed=times["trainer"])  # no --state-in to wait for
    ev = {"event": "warm_join", "step": step}
    ev.update({k: round(times[b] - times[a], 4) for a, b, k in phases if a in times and b in times})
    return ev


def user_args(argv):
    """The worker's own arguments: argv up to the runner's (they start at its last
    --config, or for a spare at --warm-control)."""
    if "--warm-spare" in argv:
        return argv[: argv.index("--warm-control")]
    if "--config" not in argv:
        raise SystemExit("--warm-control needs the runner's arguments (--config ...)")
    return argv[: len(argv) - 1 - argv[::-1].index("--config")]


def serve(args, argv, parse_args, run_segment):
    """Runs segments in this process until the runner says exit. A spare
    (--warm-spare, started ahead of the world that needs it) parks first."""
    control = Control(args.warm_control, args.timeout)
    base = user_args(list(argv))
    # A warm worker may move from the last stage to an earlier one in a later segment:
    # the imports of its first backward with a gradient are paid here, not there.
    warm_backward()
    # What is loaded by now (torch, the client's modules) lives as long as the process:
    # out of the collector's sight, a full collection (each park, and the automatic
    # ones during steps) takes a millisecond instead of 0.1-0.4 s.
    gc.collect()
    gc.freeze()
    spare = args.warm_spare
    while True:
        if not spare:
            try:
                run_segment(args, control)
            except Stopped as e:
                control.kept.clear()  # the next state comes from the commit before the stop
                print(f"warm worker: segment stopped by the runner ({e})", flush=True)
            except Exception as e:  # noqa: BLE001 - a failed peer shows as any error
                if not control.failed(e):
                    raise
                control.kept.clear()  # the next state need not come from this segment's stop
                print(f"warm worker: segment aborted by the runner ({type(e).__name__}: {str(e)[:200]})", flush=True)
        spare = False
        msg = control.park()
        if msg.get("exit"):
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)  # no interpreter teardown: the CPU goes to the new world's workers
        args = parse_args(base + list(msg["args"]))
