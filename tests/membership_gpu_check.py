"""GPU check of in-process membership (issue 37 item 2; run by scripts/gpu_check.sh on a
machine with a GPU): NCCL process groups torn down and re-created in one process across
worlds, the GPU state left on the device.

usage: membership_gpu_check.py [--cpu]   (exit 77 without CUDA unless --cpu)

One worker (tenplex.member.Member, world size 1: a GPU per rank is what NCCL needs, and
the check machine has one) follows worlds that this script writes into a control
directory as a host agent would, each with a fresh TCPStore (membership.serve_store):
  world 1   init_process_group(nccl) on the GPU; an all_reduce; a "state" tensor of
            256 MiB made on the GPU (its address and checksum kept);
  world 2   announced without abort: teardown (warm.drop_world: the NCCL group destroyed),
            the next world joined (new communicators, device_id given); an all_reduce;
            the state tensor must be the same memory with the same values;
  world 3   announced with abort while the worker runs all_reduces: the watcher aborts the
            NCCL communicators (member.abort_device_groups); the worker must see its
            collective fail or finish, then tear down and join world 4 with a working
            all_reduce and the state still in place.
Prints the seconds of each teardown and init (communicator creation). --cpu runs the same
with gloo on the CPU (what CI can run; the NCCL parts are only exercised on a GPU).
"""

import json
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))


def main():
    import torch
    import torch.distributed as dist

    cpu = "--cpu" in sys.argv[1:]
    if not cpu and not torch.cuda.is_available():
        print("SKIP: no CUDA device (run with --cpu for the gloo variant)")
        return 77
    from tenplex import member as mbr
    from tenplex import membership as mb

    backend, device = ("gloo", torch.device("cpu")) if cpu else ("nccl", torch.device("cuda", 0))
    failures = []

    def check(cond, what):
        print(("ok: " if cond else "FAIL: ") + what, flush=True)
        if not cond:
            failures.append(what)

    stores = []
    with tempfile.TemporaryDirectory(prefix="membership-gpu-") as d:
        control = mb.Control(d)

        def world(epoch, abort=False):
            w = mb.World(epoch, ["h0"], {"h0": {"nproc": 1, "store_url": "http://127.0.0.1:1", "addr": "127.0.0.1"}})
            control.write_world(w, abort=abort)
            store, address = mb.serve_store("127.0.0.1")
            stores.append(store)
            control.write_master(epoch, address)

        member = mbr.Member(d, 0, "h0", timeout=60)

        def join():
            t0 = time.perf_counter()
            numbers = member.next_world()
            member.init_process_group(backend, numbers["RANK"], numbers["WORLD_SIZE"], 60)
            x = torch.ones(1024, device=device)
            dist.all_reduce(x)
            took = time.perf_counter() - t0
            check(float(x.sum()) == 1024.0, f"world {member.epoch}: {backend} all_reduce (joined in {took:.3f} s)")

        world(1)
        join()
        state = torch.arange(64 << 20, dtype=torch.float32, device=device)  # 256 MiB
        ptr, total = state.data_ptr(), float(state.sum())

        def same_state(when):
            check(
                state.data_ptr() == ptr and float(state.sum()) == total,
                f"{when}: the state tensor is the same {device.type} memory with the same values",
            )

        world(2)
        deadline = time.time() + 10
        while not member.announced.is_set() and time.time() < deadline:
            time.sleep(0.01)
        check(member.announced.is_set() and not member.aborted.is_set(), "world 2 announced, not aborted")
        t0 = time.perf_counter()
        member.teardown()
        print(f"teardown {time.perf_counter() - t0:.3f} s")
        join()
        same_state("world 2")

        errors = []

        def spin():
            y = torch.ones(1 << 20, device=device)
            try:
                for _ in range(100000):
                    dist.all_reduce(y)
                    if member.aborted.is_set():
                        break
                if device.type == "cuda":
                    torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - an aborted collective may raise anything
                errors.append(f"{type(e).__name__}: {str(e)[:120]}")

        t = threading.Thread(target=spin)
        t.start()
        time.sleep(0.5)
        world(3, abort=True)
        t.join(60)
        check(not t.is_alive(), f"the collectives returned after the abort ({errors or 'no error'})")
        check(member.aborted.is_set(), "world 3's abort seen by the watcher")
        member.teardown()
        world(4)
        join()
        same_state("world 4 (after an abort)")
        member.teardown()
    print(json.dumps({"backend": backend, "failures": len(failures)}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
