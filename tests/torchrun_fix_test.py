"""The torchrun fix (python/tenplex/torchrun.py) and the elastic API's input checks.

usage: torchrun_fix_test.py REPO_ROOT

- `python -m tenplex.torchrun` runs a 2-worker job with the default `--redirects 0`
  (and `--redirects 3`), every worker seeing its RANK; torch's own `torch.distributed.run`
  is run the same way and, where it crashes with the to_map AttributeError (torch 1.13 on
  Python 3.11), that is shown, so the test proves the fix is needed and works.
- `Std.from_str` after the patch against the documented examples.
- tenplex.elastic: policies (file, text, bad JSON, wrong world size, non-numeric key),
  a world size the policy lacks, a missing torchrun environment, a missing store URL,
  ranks not numbered host by host: each an ElasticError naming the problem.
"""
import json
import os
import socket
import subprocess
import sys
import tempfile

PY = "/usr/bin/python3"
failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what)
    if not cond:
        failures.append(what)


def expect_error(fn, needle, what):
    from tenplex import elastic
    try:
        fn()
    except elastic.ElasticError as e:
        check(needle in str(e), f"{what}: {e}")
        return
    check(False, f"{what}: no ElasticError")


def rendezvous():
    """A one-node rendezvous on a free port (--standalone's is always 29400, which a
    concurrent torchrun on this machine may hold)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return ["--nnodes=1", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}"]


def main():
    repo = sys.argv[1]
    sys.path.insert(0, os.path.join(repo, "python"))
    env = dict(os.environ, PYTHONPATH=os.path.join(repo, "python"))
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "w.py")
        with open(script, "w") as f:
            # One write(2) per line: the two workers share torchrun's stdout pipe, and
            # print() under torchrun (unbuffered) writes word by word, interleaving them.
            f.write("import os\nos.write(1, f\"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}\\n\".encode())\n")
        for redirects in ("0", "3"):
            for attempt in range(2):  # a free port is found by binding and releasing it:
                args = rendezvous() + ["--nproc_per_node=2", f"--redirects={redirects}", "--log_dir", tmp, script]
                p = subprocess.run([PY, "-m", "tenplex.torchrun", *args], capture_output=True, text=True, env=env,
                                   timeout=180)  # another process on a shared machine may take it first
                if p.returncode == 0:
                    break
                print(f"note: attempt {attempt + 1} exited {p.returncode}: {(p.stdout + p.stderr)[-600:]}")
            out = p.stdout + p.stderr
            seen = sorted(line.split()[1] for line in p.stdout.splitlines() if line.startswith("rank "))
            if redirects == "0":
                check(p.returncode == 0 and seen == ["0", "1"],
                      f"tenplex.torchrun --redirects 0: exit {p.returncode}, ranks {seen} {out[-300:]!r}")
            else:  # redirected into files under --log_dir
                logs = [os.path.join(d, n) for d, _, ns in os.walk(tmp) for n in ns if n == "stdout.log"]
                text = "".join(open(x).read() for x in logs)
                check(p.returncode == 0 and "rank 0 of 2" in text and "rank 1 of 2" in text,
                      f"tenplex.torchrun --redirects 3: exit {p.returncode}, stdout files {len(logs)}")
        p = subprocess.run([PY, "-m", "torch.distributed.run", *rendezvous(), "--nproc_per_node=1", script],
                           capture_output=True, text=True, env=env, timeout=180)
        broken = "object has no attribute 'get'" in p.stderr
        print(f"note: torch.distributed.run itself {'crashes in to_map (the bug)' if broken else 'works'} "
              f"(exit {p.returncode})")
        check(broken or p.returncode == 0, "plain torchrun either shows the known bug or works")

        import tenplex.torchrun
        tenplex.torchrun.patch()
        from torch.distributed.elastic.multiprocessing import api
        Std = api.Std
        check(Std.from_str("0") is Std.NONE and Std.from_str("3") is Std.ALL, "from_str of values")
        check(Std.from_str("0:3,1:0,2:1,3:2") == {0: Std.ALL, 1: Std.NONE, 2: Std.OUT, 3: Std.ERR},
              "from_str of a mapping")
        check(api.to_map(Std.from_str("0"), 2) == {0: Std.NONE, 1: Std.NONE}, "to_map of --redirects 0")
        try:
            Std.from_str("7")
            check(False, "from_str('7') raises")
        except ValueError:
            check(True, "from_str('7') raises ValueError")

        from tenplex import elastic
        pol = os.path.join(tmp, "policy.json")
        with open(pol, "w") as f:
            json.dump({"4": "tp=2,pp=2", "6": "tp=2,dp=3", "2": "tp=2"}, f)
        p1 = elastic.read_policy(pol)
        check(p1 == {4: "tp=2,pp=2,dp=1", 6: "tp=2,pp=1,dp=3", 2: "tp=2,pp=1,dp=1"}, f"policy file: {p1}")
        check(elastic.read_policy('{"1": "tp=1"}') == {1: "tp=1,pp=1,dp=1"}, "policy text")
        check(elastic.pick_config(p1, 6) == "tp=2,pp=1,dp=3", "pick for world 6")
        expect_error(lambda: elastic.pick_config(p1, 8), "no config for world size 8", "world size without config")
        expect_error(lambda: elastic.read_policy('{"4": "tp=2"}'), "world size 2, not 4", "config of another size")
        expect_error(lambda: elastic.read_policy('{"x": "tp=2"}'), "entry 'x'", "non-numeric world size")
        expect_error(lambda: elastic.read_policy('{"4": '), "not JSON", "truncated policy")
        expect_error(lambda: elastic.read_policy('[]'), "cannot read policy file", "not an object (a path)")
        expect_error(lambda: elastic.read_policy("{}"), "expected a JSON object", "empty policy")
        expect_error(lambda: elastic.read_policy('{"2": "tp=2,pp=zz"}'), "entry '2'", "malformed config")
        expect_error(lambda: elastic.read_policy(os.path.join(tmp, "missing.json")), "cannot read policy file",
                     "missing policy file")
        # No table: the config policy picks, for each world size, the fastest predicted
        # config that fits and uses every worker (checked against suggest's own listing).
        model = os.path.join(tmp, "m.json")
        subprocess.run([elastic.tenplex_binary(), "model", "gpt", "--num-layers", "2", "--hidden-size", "64",
                        "--num-attention-heads", "4", "--vocab-size", "100", "-o", model], check=True)
        sargs = f"--model {model} --device-profile cpu --global-batch 8 --micro-batch 1 --seq-length 16"
        sp = elastic.read_policy("suggest:" + sargs)
        for w in (1, 2, 4, 8):
            got = elastic.pick_config(sp, w, 2)
            out = subprocess.run([elastic.tenplex_binary(), "config", "suggest", *sargs.split(), "--gpus", str(w),
                                  "--gpus-per-host", "2", "--all", "--json"], capture_output=True, text=True,
                                 check=True)
            ok = [c for c in json.loads(out.stdout)["configs"]
                  if c["fits"] and c["tp"] * c["pp"] * c["dp"] == w]
            best = min(ok, key=lambda c: c["step_seconds"])
            check(elastic.Config.parse(got).world_size == w and
                  got == str(elastic.Config.parse(best["config"])), f"suggested config for {w} workers: {got}")
        expect_error(lambda: elastic.pick_config(sp, 6, 2), "no config that fits on 6 workers",
                     "suggest with no config for the world size")
        expect_error(lambda: elastic.read_policy("suggest:--gpus 4"), "needs --model", "suggest without a model")
        for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "TENPLEX_STORE_URL"):
            os.environ.pop(k, None)
        expect_error(lambda: elastic.Job("gpt", pol), "WORLD_SIZE is not set", "outside torchrun")
        os.environ.update(WORLD_SIZE="4", RANK="3", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", GROUP_RANK="1")
        expect_error(lambda: elastic.Job("gpt", pol), "TENPLEX_STORE_URL", "no store daemon named")
        os.environ["TENPLEX_STORE_URL"] = "http://127.0.0.1:1"
        job = elastic.Job("gpt", pol)
        check(job.config == "tp=2,pp=2,dp=1" and job.rank == 3, "a job from the torchrun environment")
        os.environ["RANK"] = "2"
        expect_error(lambda: elastic.Job("gpt", pol), "same --nproc_per_node", "ranks not numbered host by host")
        os.environ["RANK"] = "3"
        expect_error(lambda: elastic.Job("a/b", pol), "without '/'", "bad job name")
        os.environ["WORLD_SIZE"] = "8"
        expect_error(lambda: elastic.Job("gpt", pol), "no config for world size 8", "world without a config")
    print(f"{'FAILED' if failures else 'passed'}: {len(failures)} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
