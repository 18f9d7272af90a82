"""The deployment files (deploy/, docs/deploy.md) checked offline.

Under pytest (issue 32 §4), ctest deploy, TENPLEX_BIN the CLI under test:

    python -m pytest tests/deploy_test.py::test_deploy

Kubernetes (deploy/k8s/*.yaml, parsed with PyYAML; their schemas: k8s_schema_test.py),
how the objects fit together: every document has apiVersion, kind
and metadata.name; the Secret holds the key the others read; the store DaemonSet's
selector matches its pod labels, it runs `tenplex store serve` on the port it exposes,
with hostIPC, the host's /dev/shm and TENPLEX_TOKEN from the Secret; the PyTorchJob is
elastic (c10d, 1 <= min <= replicas <= max), runs `torchrun` with
`train.py --elastic` and the policy of the ConfigMap it mounts (every entry a valid
config of its world size, a multiple of nproc_per_node), reaches the daemon's port at the
node's address, shares /dev/shm and IPC with the daemon, one pod per node.

Slurm (deploy/slurm/): `bash -n` of both scripts, then the sbatch script really runs on
this machine with stand-ins for `scontrol` and `srun` (one node, as srun would start
node.sh there): it starts a daemon with the token, a torchrun agent (nproc 2, the
rendezvous on this node) and trains 4 steps of the demo model as tp=2; the log has
steps 0-3 and a commit of step 4, the exit status is 0, the daemon is gone and kept its
state in SHM_DIR; node.sh without one of its required variables fails naming it, and
exits 76 repeating the message when a worker recorded a fatal loss (a stand-in python).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import subprocess
import tempfile
import time
from typing import Any

import yaml
from elastic_run_testing import Checks, small_model

from tenplex import elastic
from tenplex.testing import free_port

_log = logging.getLogger(__name__)


def test_deploy(tenplex: str, repo: str, tmp: str) -> None:
    check = Checks()
    check_k8s(check, repo)
    check_slurm(check, tenplex, repo, tmp)
    check.finish()


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in container.get("env", [])}


def mounts_of(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    vols = {v["name"]: v for v in pod.get("volumes", [])}
    return {m["mountPath"]: vols.get(m["name"], {}) for m in container.get("volumeMounts", [])}


def check_k8s(check: Checks, repo: str) -> None:
    docs = []
    for name in sorted(os.listdir(os.path.join(repo, "deploy/k8s"))):
        if name.endswith(".yaml"):
            with open(os.path.join(repo, "deploy/k8s", name)) as f:
                docs += [(name, d) for d in yaml.safe_load_all(f) if d is not None]
    for name, d in docs:
        check(
            all(k in d for k in ("apiVersion", "kind")) and d.get("metadata", {}).get("name"),
            f"{name}: {d.get('kind')} has apiVersion, kind, metadata.name",
        )
    by_kind = {d["kind"]: d for _, d in docs}
    check(set(by_kind) >= {"Secret", "DaemonSet", "PyTorchJob", "ConfigMap"}, f"kinds: {sorted(by_kind)}")
    secret = by_kind.get("Secret", {})
    secret_keys = set(secret.get("stringData", {})) | set(secret.get("data", {}))

    def token_ok(container: dict[str, Any]) -> bool:
        ref = env_of(container).get("TENPLEX_TOKEN", {}).get("valueFrom", {}).get("secretKeyRef", {})
        return ref.get("name") == secret.get("metadata", {}).get("name") and ref.get("key") in secret_keys

    ds = by_kind.get("DaemonSet", {})
    check(ds.get("apiVersion") == "apps/v1", "DaemonSet apiVersion apps/v1")
    pod = ds.get("spec", {}).get("template", {}).get("spec", {})
    labels = ds.get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {})
    sel = ds.get("spec", {}).get("selector", {}).get("matchLabels", {})
    check(sel and all(labels.get(k) == v for k, v in sel.items()), "DaemonSet selector matches its pod labels")
    store = (pod.get("containers") or [{}])[0]
    cmd = store.get("command", [])
    listen = cmd[cmd.index("--listen") + 1] if "--listen" in cmd else ""
    port = int(listen.rsplit(":", 1)[1]) if ":" in listen else -1
    check(
        cmd[:3] == ["tenplex", "store", "serve"] and store.get("image"), f"the daemon runs tenplex store serve: {cmd}"
    )
    check(
        any(p.get("containerPort") == port and p.get("hostPort") == port for p in store.get("ports", [])),
        f"the daemon's port {port} is exposed on the host",
    )
    check(pod.get("hostIPC") is True and pod.get("hostNetwork") is True, "the daemon uses host IPC and network")
    check(
        mounts_of(pod, store).get("/dev/shm", {}).get("hostPath", {}).get("path") == "/dev/shm",
        "the daemon keeps its tensors in the host's /dev/shm",
    )
    check(token_ok(store), "the daemon's TENPLEX_TOKEN comes from the Secret")

    job = by_kind.get("PyTorchJob", {})
    spec = job.get("spec", {})
    ep = spec.get("elasticPolicy", {})
    worker = spec.get("pytorchReplicaSpecs", {}).get("Worker", {})
    lo, hi, n = ep.get("minReplicas", 0), ep.get("maxReplicas", 0), worker.get("replicas", 0)
    check(ep.get("rdzvBackend") == "c10d" and 1 <= lo <= n <= hi, f"elastic c10d job, min {lo} <= {n} <= max {hi}")
    conf = {c.get("key"): c.get("value") for c in ep.get("rdzvConf", [])}
    check(0 < float(conf.get("last_call_timeout", "30")) <= 5, f"a short rendezvous last call: {conf}")
    wpod = worker.get("template", {}).get("spec", {})
    wc = (wpod.get("containers") or [{}])[0]
    wcmd = wc.get("command", [])
    check("--monitor_interval=1" in wcmd, "a short monitor interval")
    check(wcmd[:1] == ["torchrun"] and "--elastic" in wcmd, f"workers run torchrun ... train.py --elastic: {wcmd[:4]}")
    nproc = next((int(a.split("=", 1)[1]) for a in wcmd if a.startswith("--nproc_per_node=")), 0)
    url = env_of(wc).get("TENPLEX_STORE_URL", {}).get("value", "")
    check(
        url.endswith(f":{port}")
        and "$(NODE_IP)" in url
        and env_of(wc).get("NODE_IP", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.hostIP",
        f"workers reach the daemon at the node's address and port: {url}",
    )
    check(token_ok(wc), "the workers' TENPLEX_TOKEN comes from the Secret")
    check(
        wpod.get("hostIPC") is True
        and wpod.get("hostNetwork") is True
        and mounts_of(wpod, wc).get("/dev/shm", {}).get("hostPath", {}).get("path") == "/dev/shm",
        "workers share IPC, loopback and /dev/shm with the daemon",
    )
    anti = wpod.get("affinity", {}).get("podAntiAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution", [])
    check(any(t.get("topologyKey") == "kubernetes.io/hostname" for t in anti), "one worker pod per node")
    policy_path = wcmd[wcmd.index("--elastic") + 1] if "--elastic" in wcmd else ""
    mounts = mounts_of(wpod, wc)
    cm_vol = mounts.get(os.path.dirname(policy_path), {}).get("configMap", {}).get("name")
    cm = by_kind.get("ConfigMap", {})
    check(cm_vol == cm.get("metadata", {}).get("name"), f"the policy {policy_path} comes from the ConfigMap")
    text = cm.get("data", {}).get(os.path.basename(policy_path), "")
    try:
        pol = elastic.read_policy(text)
        sizes = [w for w in range(lo * nproc, hi * nproc + 1, nproc)]
        check(all(w in pol for w in sizes), f"the policy covers every world size {sizes} of min..max x {nproc}")
    except elastic.ElasticError as e:
        check(False, f"the ConfigMap's policy: {e}")


def sbatch_script(sdir: str, cwd: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """deploy/slurm's sbatch script run by bash (the stand-ins for srun and scontrol on PATH)."""
    return subprocess.run(
        ["bash", os.path.join(sdir, "tenplex-torchrun.sbatch")],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def check_slurm(check: Checks, tenplex: str, repo: str, tmp: str) -> None:
    sdir = os.path.join(repo, "deploy/slurm")
    for name in ("tenplex-torchrun.sbatch", "node.sh"):
        p = subprocess.run(["bash", "-n", os.path.join(sdir, name)], capture_output=True, text=True)
        check(p.returncode == 0, f"bash -n {name} {p.stderr.strip()}")
    fake = os.path.join(tmp, "bin")
    os.makedirs(fake)
    host = socket.gethostname().split(".")[0]
    stubs = {
        "scontrol": f"#!/bin/sh\n[ \"$1 $2\" = 'show hostnames' ] && echo {host}\n",
        # srun on one node: run the command once, as its task 0
        "srun": '#!/bin/sh\nwhile [ "${1#-}" != "$1" ]; do shift; done\nSLURM_NODEID=0 exec "$@"\n',
    }
    for name, text in stubs.items():
        path = os.path.join(fake, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, stat.S_IRWXU)
    token = os.path.join(tmp, "token")
    with open(token, "w") as f:
        f.write("test-token-123")
    model, log = small_model(tenplex, tmp), os.path.join(tmp, "log.jsonl")
    port = free_port()
    shm = tempfile.mkdtemp(prefix="tenplex-deploy-", dir="/dev/shm")
    env = dict(
        os.environ,
        SHM_DIR=shm,
        PATH=fake + ":" + os.environ["PATH"],
        TENPLEX_TOKEN_FILE=token,
        SLURM_JOB_NODELIST=host,
        SLURM_JOB_NUM_NODES="1",
        SLURM_JOB_ID="4242",
        NPROC="2",
        STORE_PORT=str(port),
        RDZV_PORT=str(free_port()),
        POLICY='{"2": "tp=2"}',
        NODE_ADDR="127.0.0.1",
        TENPLEX_REPO=repo,
        TENPLEX=tenplex,
        GLOO_SOCKET_IFNAME="lo",
        MONITOR_INTERVAL="0.5",
        LAST_CALL="1",
        TRAIN_ARGS=f"--model {model} --steps 4 --commit-every 4 --step-log {log} --seq-length 32",
    )
    env.pop("TENPLEX_TOKEN", None)
    t0 = time.time()
    p = sbatch_script(sdir, tmp, env, timeout=240)
    _log.info("sbatch script ran in %.1f s", time.time() - t0)
    check(
        p.returncode == 0,
        f"the sbatch script with stand-in srun/scontrol exits 0 ({p.returncode}): {p.stderr[-800:]}",
    )
    lines = [json.loads(x) for x in open(log)] if os.path.exists(log) else []
    steps = sorted(x["step"] for x in lines if "loss" in x)
    check(
        steps == [0, 1, 2, 3] and all(x["config"] == "tp=2,pp=1,dp=1" for x in lines if "loss" in x),
        f"4 steps of tp=2 trained: {steps}",
    )
    check(any(x.get("event") == "commit" and x["step"] == 4 for x in lines), "the last step was committed")
    with socket.socket() as s:
        check(s.connect_ex(("127.0.0.1", port)) != 0, "the node's daemon stopped with the job")
    check(len(os.listdir(shm)) > 0, "the daemon kept the job's state in SHM_DIR (--shm-dir)")
    subprocess.run(["rm", "-rf", shm])
    # node.sh by hand without a required variable: an error naming it, before a daemon
    # starts (issue 34: TRAIN_ARGS was needed but undocumented, an "unbound variable").
    for name in ("TENPLEX_TOKEN", "RDZV_ENDPOINT", "RDZV_ID", "POLICY", "TRAIN_ARGS"):
        hand = dict(env, TENPLEX_TOKEN="t", RDZV_ENDPOINT="127.0.0.1:1", RDZV_ID="x")
        hand.pop(name)
        p = subprocess.run(
            ["bash", os.path.join(sdir, "node.sh")], env=hand, capture_output=True, text=True, timeout=30
        )
        check(
            p.returncode != 0 and f"set {name}" in p.stderr and "docs/deploy.md" in p.stderr,
            f"node.sh without {name}: a clear error {p.stderr.strip()[-200:]!r}",
        )
    # A worker's unrecoverable loss (tenplex.elastic writes TENPLEX_FATAL_FILE and stops
    # the agent): node.sh exits 76 and repeats the message (issue 34 finding 4).
    stub = os.path.join(fake, "python-fatal")
    with open(stub, "w") as f:
        f.write('#!/bin/sh\necho "tenplex: fatal: every old rank is on a lost host" > "$TENPLEX_FATAL_FILE"\nexit 1\n')
    os.chmod(stub, stat.S_IRWXU)
    hand = dict(
        env,
        TENPLEX_TOKEN="t",
        RDZV_ENDPOINT="127.0.0.1:1",
        RDZV_ID="x",
        PYTHON=stub,
        SHM_DIR=tempfile.mkdtemp(prefix="tenplex-deploy-", dir="/dev/shm"),
    )
    p = subprocess.run(["bash", os.path.join(sdir, "node.sh")], env=hand, capture_output=True, text=True, timeout=60)
    subprocess.run(["rm", "-rf", hand["SHM_DIR"]])
    check(
        p.returncode == 76 and "unrecoverable loss" in p.stderr and "every old rank" in p.stderr,
        f"node.sh reports a fatal loss with exit 76: {p.returncode} {p.stderr.strip()[-300:]!r}",
    )
    env["TENPLEX_TOKEN_FILE"] = os.path.join(tmp, "missing")
    p = sbatch_script(sdir, tmp, env, timeout=60)
    check(p.returncode == 2 and "no token file" in p.stderr, f"no token file: exit 2 with a clear error {p.stderr!r}")
