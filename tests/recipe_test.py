"""The deploy recipe and the install story as a new user follows them (issue 34, item 6).

Under pytest (issue 32 §4), TENPLEX_BIN the CLI under test:

    python -m pytest tests/recipe_test.py::test_loopback   (ctest recipe_loopback)
    python -m pytest tests/recipe_test.py::test_netns      (ctest recipe_netns)
    python -m pytest tests/recipe_test.py::test_install    (ctest recipe_install; TENPLEX_BUILD_DIR,
                                                            its CMake build, default the checkout's build/)

test_loopback, test_netns: the bash blocks of docs/deploy.md marked `<!-- recipe: NAME -->` run
verbatim (`bash -c`, the settings given in the environment as the doc says) with HOME a
new empty folder: `token` twice (one token file, mode 600, kept), then two "hosts" that
each run `settings` in their own folder, host 0 then the `node` block (daemon + torchrun)
and host 1 `node-sh` (deploy/slurm/node.sh by hand), joining one rendezvous. The job
trains 4 steps on both hosts (world size 4, tp=2,dp=2) with finite losses, commits step
4, both daemons kept their state in their --shm-dir and stopped. loopback: the hosts
are 127.0.0.1 with two store ports (what CI runs); netns: each host in its own network
namespace on a bridge with its own UTS host name, the recipe's defaults for the
addresses and one store port (skipped, pytest's skip, where namespaces cannot be made).
Covers issue 34's recipe findings: no token file, $REPO and gpt.json undefined, no
--shm-dir, torchrun's 30 s last call, node.sh's undocumented variables.

test_install: `cmake --install BUILD --prefix P` and `pip install --prefix Q` of the checkout
give a CLI that runs its Python helper (`tenplex export --to hf`, which starts Python)
from the package installed beside it. The source tree stays where it is, so the test
proves independence from it by removing the helper from the installed prefix: the
installed CLI must then fail naming the prefix, where a CLI that used the source path
compiled into it (issue 34's finding) would succeed through the checkout's python/.
"""

from __future__ import annotations

import json
import logging
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

from elastic_run_testing import Checks
from multihost_testing import netns

from tenplex.testing import NetnsBridge, free_port

_log = logging.getLogger(__name__)

HostRun = tuple["subprocess.Popen[bytes]", str, str, int]  # (its bash, its folder, its --shm-dir, its store port)


def recipes(repo: str) -> dict[str, str]:
    """{name: bash text} of the blocks marked `<!-- recipe: NAME -->` in docs/deploy.md."""
    with open(os.path.join(repo, "docs/deploy.md")) as f:
        text = f.read()
    found = re.findall(r"<!-- recipe: ([\w-]+) -->\n```bash\n(.*?)```", text, re.S)
    return dict(found)


def base_env(home: str) -> dict[str, str]:
    """The caller's environment without tenplex's variables (a new user has none)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TENPLEX", "TORCH")) and k not in ("PYTHONPATH", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(HOME=home, OMP_NUM_THREADS="1")
    return env


def check_token(check: Checks, blocks: dict[str, str], env: dict[str, str]) -> None:
    for run in range(2):  # a second run keeps the token
        p = subprocess.run(["bash", "-c", blocks["token"]], env=env, capture_output=True, text=True)
        check(p.returncode == 0, f"token block exits 0: {p.stderr}")
        path = os.path.join(env["HOME"], ".tenplex", "token")
        token = ""
        if os.path.exists(path):
            with open(path) as f:
                token = f.read()
        if run == 0:
            first = token
    check(len(token.strip()) >= 40 and token == first, "~/.tenplex/token: one random token, kept on a rerun")
    check(stat.S_IMODE(os.stat(path).st_mode) == 0o600, "the token file is readable only by its user")


def start_hosts(blocks: dict[str, str], env: dict[str, str], tmp: str, net: NetnsBridge | None) -> list[HostRun]:
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
        prefix: tuple[str, ...] = ()
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


def check_job(check: Checks, hosts: list[HostRun], tmp: str, net: NetnsBridge | None) -> None:
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
            with open(os.path.join(tmp, f"host{i}.log")) as f:
                _log.warning("---- host %d\n%s", i, f.read()[-3000:])
    logs = [os.path.join(f, "steps.jsonl") for _, f, _, _ in hosts if os.path.exists(os.path.join(f, "steps.jsonl"))]
    check(len(logs) == 1, f"one host (rank 0's) wrote steps.jsonl: {logs}")
    lines = []
    if logs:
        with open(logs[0]) as f:
            lines = [json.loads(x) for x in f]
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


def recipe(tenplex: str, repo: str, tmp: str, on_netns: bool) -> None:
    check = Checks()
    blocks = recipes(repo)
    check({"token", "settings", "node", "node-sh"} <= set(blocks), f"recipe blocks in docs/deploy.md: {sorted(blocks)}")
    node = blocks.get("node", "")
    check(
        "last_call_timeout=" in node and re.search(r"--monitor_interval=[1-5]\b", node) is not None,
        "the recipe sets torchrun's last call and a short monitor interval",
    )
    check("--shm-dir" in node, "the recipe's daemon keeps its state in a --shm-dir")
    if check.failures:
        check.finish()
    home = os.path.join(tmp, "home")
    os.makedirs(home)
    env = base_env(home)
    env.update(REPO=repo, TENPLEX=tenplex, PYTHON=sys.executable)
    check_token(check, blocks, env)
    net = netns(2) if on_netns else None
    try:
        t0 = time.time()
        check_job(check, start_hosts(blocks, env, tmp, net), tmp, net)
        _log.info("two hosts trained 4 steps in %.1f s", time.time() - t0)
    finally:
        if net:
            net.close()
    check.finish()


def test_loopback(tenplex: str, repo: str, tmp: str) -> None:
    recipe(tenplex, repo, tmp, False)


def test_netns(tenplex: str, repo: str, tmp: str) -> None:
    recipe(tenplex, repo, tmp, True)


def export_hf(binary: str, tmp: str, name: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], str]:
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


def test_install(repo: str, tmp: str) -> None:
    check = Checks()
    build = os.environ.get("TENPLEX_BUILD_DIR", os.path.join(repo, "build"))
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
    used = None
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
    check.finish()
