"""The deploy recipe and the install story as a new user follows them (issue 34, item 6).

usage: recipe_test.py TENPLEX_BIN REPO_ROOT PART [BUILD_DIR]   PART in: loopback, netns, install

loopback, netns: the bash blocks of docs/deploy.md marked `<!-- recipe: NAME -->` run
verbatim (`bash -c`, the settings given in the environment as the doc says) with HOME a
new empty folder: `token` twice (one token file, mode 600, kept), then two "hosts" that
each run `settings` in their own folder, host 0 then the `node` block (daemon + torchrun)
and host 1 `node-sh` (deploy/slurm/node.sh by hand), joining one rendezvous. The job
trains 4 steps on both hosts (world size 4, tp=2,dp=2) with finite losses, commits step
4, both daemons kept their state in their --shm-dir and stopped. loopback: the hosts
are 127.0.0.1 with two store ports (what CI runs); netns: each host in its own network
namespace on a bridge with its own UTS host name, the recipe's defaults for the
addresses and one store port (exit 77, skipped, where namespaces cannot be made).
Covers issue 34's recipe findings: no token file, $REPO and gpt.json undefined, no
--shm-dir, torchrun's 30 s last call, node.sh's undocumented variables.

install: `cmake --install BUILD --prefix P` and `pip install --prefix Q` of the checkout
give a CLI that runs its Python helper (`tenplex export --to hf`, which starts Python)
from the package installed beside it. The source tree stays where it is, so the test
proves independence from it by removing the helper from the installed prefix: the
installed CLI must then fail naming the prefix, where a CLI that used the source path
compiled into it (issue 34's finding) would succeed through the checkout's python/.
"""

import json
import math
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemons import NetnsBridge  # noqa: E402

from tenplex.testing import free_port  # noqa: E402

failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        failures.append(what)


def recipes(repo):
    """{name: bash text} of the blocks marked `<!-- recipe: NAME -->` in docs/deploy.md."""
    text = open(os.path.join(repo, "docs/deploy.md")).read()
    found = re.findall(r"<!-- recipe: ([\w-]+) -->\n```bash\n(.*?)```", text, re.S)
    return dict(found)


def base_env(home):
    """The caller's environment without tenplex's variables (a new user has none)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TENPLEX", "TORCH")) and k not in ("PYTHONPATH", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(HOME=home, OMP_NUM_THREADS="1")
    return env


def check_token(blocks, env):
    for run in range(2):  # a second run keeps the token
        p = subprocess.run(["bash", "-c", blocks["token"]], env=env, capture_output=True, text=True)
        check(p.returncode == 0, f"token block exits 0: {p.stderr}")
        path = os.path.join(env["HOME"], ".tenplex", "token")
        token = open(path).read() if os.path.exists(path) else ""
        if run == 0:
            first = token
    check(len(token.strip()) >= 40 and token == first, "~/.tenplex/token: one random token, kept on a rerun")
    check(stat.S_IMODE(os.stat(path).st_mode) == 0o600, "the token file is readable only by its user")


def start_hosts(blocks, env, tmp, net):
    """Host 0 runs settings+node, host 1 settings+node-sh; returns [(proc, folder, shm, port)]."""
    rdzv_port, hosts = free_port(), []
    same_port = free_port()
    for i, block in enumerate(("node", "node-sh")):
        folder = os.path.join(tmp, f"host{i}")
        os.makedirs(folder)
        shm = tempfile.mkdtemp(prefix=f"tenplex-recipe-{i}-", dir="/dev/shm")
        port = same_port if net else free_port()
        host_env = dict(
            env, RDZV_PORT=str(rdzv_port), STORE_PORT=str(port), NNODES="2:2", NPROC="2", STEPS="4", SHM_DIR=shm
        )
        prefix = ()
        if net:  # the recipe's own defaults for this node's address (`hostname -I`)
            prefix = (*net.prefix(i), "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', net.addr(i))
            host_env.update(RDZV_HOST=net.addr(0), GLOO_SOCKET_IFNAME=net.ifname(i))
        else:
            host_env.update(RDZV_HOST="127.0.0.1", NODE_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo")
        script = blocks["settings"] + "\n" + blocks[block]
        out = open(os.path.join(tmp, f"host{i}.log"), "w")
        proc = subprocess.Popen(
            [*prefix, "bash", "-c", script],
            cwd=folder,
            env=host_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        hosts.append((proc, folder, shm, port))
    return hosts


def check_job(hosts, tmp, net):
    deadline = time.time() + 150
    for proc, *_ in hosts:
        try:
            proc.wait(max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            pass
    for i, (proc, _folder, _shm, _port) in enumerate(hosts):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        check(proc.returncode == 0, f"host {i} ({['node', 'node-sh'][i]} block) exits 0 ({proc.returncode})")
        if proc.returncode != 0:
            print(open(os.path.join(tmp, f"host{i}.log")).read()[-3000:])
    logs = [os.path.join(f, "steps.jsonl") for _, f, _, _ in hosts if os.path.exists(os.path.join(f, "steps.jsonl"))]
    check(len(logs) == 1, f"one host (rank 0's) wrote steps.jsonl: {logs}")
    lines = [json.loads(x) for x in open(logs[0])] if logs else []
    steps = {x["step"]: x for x in lines if "loss" in x}
    check(sorted(steps) == [0, 1, 2, 3], f"steps 0-3 trained: {sorted(steps)}")
    check(
        all(
            x["world_size"] == 4 and x["config"] == "tp=2,pp=1,dp=2" and math.isfinite(x["loss"])
            for x in steps.values()
        ),
        "on both hosts (world size 4, tp=2,dp=2), finite losses",
    )
    check(any(x.get("event") == "commit" and x.get("step") == 4 for x in lines), "step 4 committed")
    for i, (_, _, shm, port) in enumerate(hosts):
        check(len(os.listdir(shm)) > 0, f"host {i}'s daemon kept its state in --shm-dir {shm}")
        if not net:
            with socket.socket() as s:
                check(s.connect_ex(("127.0.0.1", port)) != 0, f"host {i}'s daemon stopped")
        shutil.rmtree(shm, ignore_errors=True)


def test_recipe(tenplex, repo, tmp, netns):
    blocks = recipes(repo)
    check({"token", "settings", "node", "node-sh"} <= set(blocks), f"recipe blocks in docs/deploy.md: {sorted(blocks)}")
    node = blocks.get("node", "")
    check(
        "last_call_timeout=" in node and re.search(r"--monitor_interval=[1-5]\b", node) is not None,
        "the recipe sets torchrun's last call and a short monitor interval",
    )
    check("--shm-dir" in node, "the recipe's daemon keeps its state in a --shm-dir")
    if failures:
        return
    home = os.path.join(tmp, "home")
    os.makedirs(home)
    env = base_env(home)
    env.update(REPO=repo, TENPLEX=tenplex, PYTHON=sys.executable)
    check_token(blocks, env)
    net = NetnsBridge(2) if netns else None
    try:
        t0 = time.time()
        check_job(start_hosts(blocks, env, tmp, net), tmp, net)
        print(f"two hosts trained 4 steps in {time.time() - t0:.1f} s")
    finally:
        if net:
            net.close()


def export_hf(binary, tmp, name, env):
    """`tenplex export --to hf` of a fresh checkpoint with `binary` (it starts the helper)."""
    model, ck, out = (os.path.join(tmp, name + s) for s in ("-model.json", "-ck", "-hf"))
    subprocess.run(
        [
            binary,
            "model",
            "gpt",
            "--num-layers",
            "1",
            "--hidden-size",
            "8",
            "--num-attention-heads",
            "2",
            "--vocab-size",
            "16",
            "-o",
            model,
        ],
        check=True,
        env=env,
    )
    subprocess.run(
        [binary, "ckpt", "init", "--model", model, "--config", "tp=1", "--out", ck],
        check=True,
        env=env,
        capture_output=True,
    )
    return subprocess.run(
        [binary, "-v", "export", "--to", "hf", ck, "--out", out], capture_output=True, text=True, env=env, cwd=tmp
    ), out


def test_install(tenplex, repo, tmp, build):
    env = base_env(os.path.join(tmp, "home"))
    env["TENPLEX_PYTHON"] = sys.executable  # an environment with torch (the helper's formats need it)
    prefix = os.path.join(tmp, "prefix")
    subprocess.run(["cmake", "--install", build, "--prefix", prefix], check=True, capture_output=True)
    pip = os.path.join(tmp, "pip")
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--prefix",
            pip,
            repo,
        ],
        capture_output=True,
        text=True,
        cwd=tmp,
        env=dict(os.environ, TENPLEX_BUILD_DIR=build),
    )
    check(p.returncode == 0, f"pip install --prefix: {p.stderr[-1000:]}")
    for root in (prefix, pip):
        binary = os.path.join(root, "bin", "tenplex")
        check(os.access(binary, os.X_OK), f"{binary} installed")
        p, out = export_hf(binary, tmp, os.path.basename(root), env)
        used = re.search(r"with the tenplex package of (\S+)", p.stderr)
        check(
            p.returncode == 0 and os.path.exists(os.path.join(out, "config.json")),
            f"{root}: the installed CLI runs its Python helper: {p.stderr[-800:]}",
        )
        check(
            used is not None and used.group(1).startswith(os.path.realpath(root) + "/"),
            f"{root}: the helper used is the installed one: {used and used.group(1)}",
        )
    # pip into an environment: the CLI in ENV/bin uses ENV/bin/python3 (here a script that
    # runs ours: a bare link to it would start the base interpreter outside our venv,
    # without numpy and torch, wherever the system Python has none).
    wrapper = os.path.join(pip, "bin", "python3")
    with open(wrapper, "w") as f:
        f.write(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    os.chmod(wrapper, 0o755)
    p, _ = export_hf(os.path.join(pip, "bin", "tenplex"), tmp, "venv", dict(env, TENPLEX_PYTHON=""))
    check(
        p.returncode == 0 and f"running {os.path.realpath(pip)}/bin/python3 -m" in p.stderr,
        f"the CLI in an environment's bin/ runs that environment's python3: {p.stderr[-600:]}",
    )
    # The helper gone from the prefix: an error naming where it looked, no source tree.
    shutil.rmtree(os.path.join(used.group(1) if used else prefix, "tenplex", "interop"), ignore_errors=True)
    p, _ = export_hf(os.path.join(pip, "bin", "tenplex"), tmp, "gone", env)
    check(
        p.returncode != 0
        and "looked in " + os.path.join(pip, "bin", "..") in p.stderr
        and os.path.realpath(repo) + "/python" not in p.stderr,
        f"without its helper the installed CLI fails naming the prefix, not using the checkout: {p.stderr[-600:]}",
    )


def main():
    tenplex, repo, part = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]), sys.argv[3]
    tmp = tempfile.mkdtemp(prefix=f"tenplex-recipe-{part}-")
    try:
        if part == "install":
            test_install(tenplex, repo, tmp, os.path.abspath(sys.argv[4]))
        else:
            test_recipe(tenplex, repo, tmp, part == "netns")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'FAILED' if failures else 'passed'}: {len(failures)} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
