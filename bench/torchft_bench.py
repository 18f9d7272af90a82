#!/usr/bin/env python3
"""torchft's heal against our in-process membership (issue 37 item 4): join, loss and
leave times on loopback, the DP-only case torchft covers.

torchft (pytorch/torchft, PyPI `torchft`, pinned in requirements.lock) keeps replica
groups of one layout alive across failures: a lighthouse decides each step's quorum,
a replica that joins or fell behind heals by fetching a live peer's state dict (HTTP
checkpoint transport), a dead one is dropped from the next quorum once its heartbeats
stop. Here each replica group is one process (group world size 1) on this machine,
gloo on loopback, a model with the parameter count of tests/membership_test.py's GPT
(2 layers, hidden 32, vocab 128: MLP of the same size), Adam, steps padded to 0.4 s as
there, the lighthouse's heartbeat timeout 2 s (the membership test's TTL), min 1
replica. Scenario as in the membership tests: replicas 0 and 1 train; after step 3
replica 2 joins (its process started ahead, imports done: the go file); after 3 steps
on 3 replicas replica 1 is SIGKILLed; after 3 more steps replica 2 leaves (SIGTERM:
it shuts its manager down at the next step boundary). Times, from the event to the end
of the first committed step of the new quorum (the membership test's "reconfiguration
end to end"):
  join    go file written -> first committed step with 3 participants
  loss    SIGKILL -> first committed step with 2 participants
  leave   SIGTERM -> first committed step with 1 participant

Usage: torchft_bench.py [--rounds 1] [--json OUT.json]; ours comes from
tests/membership_test.py (default and --leave) printed beside it with --ours BUILD/bin/tenplex.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

STEP_S = 0.4
HEARTBEAT_MS = 2000
PARAMS = 2 * 12 * 32 * 32 + 2 * 128 * 32  # ~ the test GPT: 2 layers x 12 h^2 + embeddings


def replica(idx, lighthouse, log, go):
    """One replica group (one process): trains until the driver stops it."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch import nn
    from torchft import Manager, ProcessGroupGloo

    torch.manual_seed(0)
    torch.set_num_threads(1)
    hidden = 64
    model = nn.Sequential(nn.Linear(PARAMS // hidden // 2, hidden), nn.Tanh(), nn.Linear(hidden, PARAMS // hidden // 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    leaving = []
    signal.signal(signal.SIGTERM, lambda s, f: leaving.append(time.time()))
    while go and not os.path.exists(go):
        time.sleep(0.01)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=10)),
        min_replica_size=1,
        load_state_dict=lambda sd: (model.load_state_dict(sd["model"]), opt.load_state_dict(sd["optim"])),
        state_dict=lambda: {"model": model.state_dict(), "optim": opt.state_dict()},
        replica_id=f"replica{idx}",
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=lighthouse,
        timeout=timedelta(seconds=10),
        quorum_timeout=timedelta(seconds=30),
        heartbeat_interval=timedelta(milliseconds=100),
    )
    gen = torch.Generator().manual_seed(idx)
    with open(log, "a") as f:
        while not leaving:
            t0 = time.perf_counter()
            manager.start_quorum()
            opt.zero_grad()
            x = torch.randn(8, PARAMS // hidden // 2, generator=gen)
            loss = (model(x) - x).pow(2).mean()
            loss.backward()
            # The gradients averaged over the quorum's replicas in one allreduce (torchft's
            # DistributedDataParallel wrapper's comm hook asserts on a failed allreduce under
            # torch 2.15: `assert fut._fut` in torchft/ddp.py; the manager's own allreduce
            # reports the error to should_commit instead).
            flat = torch.cat([q.grad.reshape(-1) for q in model.parameters()])
            manager.allreduce(flat).wait()
            off = 0
            for q in model.parameters():
                q.grad.copy_(flat[off : off + q.numel()].view_as(q))
                off += q.numel()
            committed = manager.should_commit()
            if committed:
                opt.step()
            spent = time.perf_counter() - t0
            if spent < STEP_S:
                time.sleep(STEP_S - spent)
            rec = {
                "replica": idx,
                "step": manager.current_step(),
                "participants": manager.num_participants(),
                "committed": committed,
                "loss": float(loss),
                "time": time.time(),
                "seconds": round(spent, 4),
            }
            f.write(json.dumps(rec) + "\n")
            f.flush()
    manager.shutdown(wait=False)
    os._exit(0)


def read(log):
    if not os.path.exists(log):
        return []
    with open(log) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


def wait_until(pred, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.02)
    raise SystemExit(f"torchft_bench: timed out ({timeout} s) waiting for {what}")


def first_step(log, since, participants, replicas=None):
    """Time of the end of the first committed step after `since` with `participants`."""
    for r in read(log):
        if (
            r["time"] > since
            and r["committed"]
            and r["participants"] == participants
            and (replicas is None or r["replica"] in replicas)
        ):
            return r["time"]
    return None


def run_torchft():
    from torchft._torchft import LighthouseServer

    lh = LighthouseServer(bind="[::]:0", min_replicas=1, heartbeat_timeout_ms=HEARTBEAT_MS)
    with tempfile.TemporaryDirectory(prefix="torchft-bench-", dir=os.environ.get("TORCHFT_BENCH_TMP")) as tmp:
        log, go = os.path.join(tmp, "steps.jsonl"), os.path.join(tmp, "go")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        me = os.path.abspath(__file__)
        procs = [
            subprocess.Popen(
                [sys.executable, me, "--replica", str(i), lh.address(), log, go if i == 2 else ""],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=open(os.path.join(tmp, f"r{i}.err"), "w"),
            )
            for i in range(3)
        ]
        try:
            wait_until(lambda: any(r["step"] >= 3 and r["participants"] == 2 for r in read(log)), 180, "step 3 on 2")
            t_join = time.time()
            open(go, "w").close()
            joined = wait_until(lambda: first_step(log, t_join, 3, {2}), 120, "replica 2 in a committed step")
            wait_until(
                lambda: sum(1 for r in read(log) if r["replica"] == 0 and r["participants"] == 3) >= 3,
                60,
                "3 steps on 3",
            )
            t_loss = time.time()
            procs[1].kill()
            lost = wait_until(lambda: first_step(log, t_loss, 2, {0, 2}), 120, "a committed step on 2 after the kill")
            wait_until(lambda: sum(1 for r in read(log) if r["time"] > lost and r["replica"] == 0) >= 3, 60, "3 more")
            t_leave = time.time()
            procs[2].send_signal(signal.SIGTERM)
            left = wait_until(lambda: first_step(log, t_leave, 1, {0}), 120, "a committed step on 1 after the leave")
            failed = sum(1 for r in read(log) if not r["committed"])
        except SystemExit:
            print("".join(json.dumps(r) + "\n" for r in read(log)[-12:]))
            for i in range(3):
                with open(os.path.join(tmp, f"r{i}.err")) as f:
                    print(f"---- replica {i}\n" + "".join(f.readlines()[-30:]))
            raise
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
            lh.shutdown()
    return {
        "join_s": round(joined - t_join, 3),
        "loss_s": round(lost - t_loss, 3),
        "leave_s": round(left - t_leave, 3),
        "uncommitted_steps": failed,
    }


def run_ours(tenplex, mode):
    """tests/membership_test.py::test_kill or ::test_leave (mode "" or "--leave"), under pytest:
    the reconfiguration times it prints."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    node = "test_leave" if mode == "--leave" else "test_kill"
    p = subprocess.run(
        [sys.executable, "-m", "pytest", os.path.join(repo, "tests", f"membership_test.py::{node}"), "-q"]
        + ["-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, TENPLEX_BIN=tenplex),
    )
    times = {
        m.group(1): float(m.group(2))
        for m in re.finditer(r"^(join|loss|leave)[^:]*: reconfiguration ([0-9.]+) s", p.stdout, re.M)
    }
    if p.returncode != 0 or not times:
        raise SystemExit(f"membership_test.py {mode} failed ({p.returncode}):\n{p.stdout[-3000:]}{p.stderr[-2000:]}")
    return times


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--replica":
        return replica(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--ours", metavar="TENPLEX_BIN", help="also run tests/membership_test.py (default, --leave)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    out = {"torchft": [], "ours": [], "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    for _ in range(args.rounds):
        t = run_torchft()
        out["torchft"].append(t)
        print(
            f"torchft: join {t['join_s']:.2f} s, loss {t['loss_s']:.2f} s, leave {t['leave_s']:.2f} s "
            f"(event to the end of the new quorum's first committed step; {t['uncommitted_steps']} steps "
            "not committed)",
            flush=True,
        )
        if args.ours:
            o = dict(
                run_ours(os.path.abspath(args.ours), ""),
                **{"leave": run_ours(os.path.abspath(args.ours), "--leave")["leave"]},
            )
            out["ours"].append(o)
            print(
                f"ours:    join {o['join']:.2f} s, loss {o['loss']:.2f} s, leave {o['leave']:.2f} s "
                "(tests/membership_test.py, the same measure, TP/PP changing)",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
