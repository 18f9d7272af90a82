"""Operating tenplex (issue 16): `store ls/rm` against a daemon and a cluster, a failed
load leaves no job, `--json` and `-q/-v`, progress lines only on a terminal, the
canonical safetensors header of the Python writer, and installing into a prefix.

Under pytest (issue 32 §4): python -m pytest tests/ops_test.py::test_PART, PART in: store,
output, install (ctest ops_PART), with TENPLEX_BIN (the CLI under test) and, for install,
TENPLEX_BUILD_DIR (its CMake build, default the checkout's build/) in the environment.
"""

import json
import os
import pty
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TENPLEX = os.environ.get("TENPLEX_BIN", "")
sys.path.insert(0, os.path.join(ROOT, "tests"))
from daemons import Daemon, check, run_cli  # noqa: E402


def run(*args, expect_ok=True):
    return run_cli(TENPLEX, *args, expect_ok=expect_ok)


def ls(*args):
    return json.loads(run("store", "ls", "--json", *args).stdout)


def small_checkpoint(tmp, config="tp=2,pp=2", seed=3):
    model = os.path.join(tmp, "m.json")
    if not os.path.exists(model):
        run(
            "model",
            "gpt",
            "--num-layers",
            "2",
            "--hidden-size",
            "16",
            "--num-attention-heads",
            "4",
            "--vocab-size",
            "64",
            "--max-position-embeddings",
            "8",
            "-o",
            model,
        )
    ck = os.path.join(tmp, f"ck-{config.replace(',', '_').replace('=', '')}-{seed}")
    if not os.path.exists(ck):
        run("ckpt", "init", "--model", model, "--config", config, "--out", ck, "--seed", str(seed))
    return ck


def test_store(tmp):
    # ---- one daemon
    d = Daemon(TENPLEX)
    try:
        url = ["--url", d.url]
        check(ls(*url) == {"jobs": []}, "empty store")
        ck = small_checkpoint(tmp)
        run("store", "load", *url, "--job", "a", "--dir", ck)
        run("store", "load", *url, "--job", "a", "--dir", ck)
        run("store", "load", *url, "--job", "b", "--dir", small_checkpoint(tmp, "dp=2"))
        jobs = ls(*url)["jobs"]
        check([j["job"] for j in jobs] == ["a", "b"], jobs)
        a = jobs[0]
        truth = d.get("/v1/jobs/a")
        check(a["current"] == truth["current"] == 2 and a["versions"] == len(truth["versions"]), (a, truth))
        cur = d.get("/v1/jobs/a/versions/current")
        check(a["bytes"] == cur["bytes"] and a["config"] == "tp=2,pp=2,dp=1", (a, cur))
        text = run("store", "ls", *url).stdout
        check("a " in text and "tp=2,pp=2,dp=1" in text and "b " in text, text)
        d.call("POST", "/v1/jobs/a/versions")  # an open version 3 beside the current 2
        versions = ls(*url, "a")
        check([v["version"] for v in versions["versions"]] == [2, 3] and versions["current"] == 2, versions)
        # rm of the current version alone is refused (exit 2), nothing removed.
        p = run("store", "rm", *url, "a", "--version", "2", expect_ok=False)
        check(p.returncode == 2 and "current version" in p.stderr, p.stderr)
        out = json.loads(run("store", "rm", *url, "a", "--version", "3", "--json").stdout)
        # Issue 34 item 9: "hosts" is the list of URLs (it was a count), as in store ls.
        check(out["version"] == 3 and out["hosts"] == [d.url], out)
        check([v["version"] for v in d.get("/v1/jobs/a")["versions"]] == [2], "version 1 removed")
        print(run("store", "rm", *url, "b").stdout.strip())
        check([j["job"] for j in d.get("/v1/jobs")["jobs"]] == ["a"], "job b removed")
        p = run("store", "rm", *url, "nope", expect_ok=False)
        check(p.returncode == 2 and "not in the store" in p.stderr, p.stderr)
        p = run("store", "ls", *url, "nope", expect_ok=False)
        check(p.returncode == 2, p.stderr)
    finally:
        d.stop()

    # ---- issue 16 bug 9: a load that fails on the memory limit leaves no job listed
    # with "current": null.
    proc = subprocess.Popen(
        [TENPLEX, "store", "serve", "--listen", "127.0.0.1:0", "--memory-limit", "4K"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        url = line.split("serving ")[1].split(" ")[0]
        p = run("store", "load", "--url", url, "--job", "big", "--dir", small_checkpoint(tmp), expect_ok=False)
        check("memory limit" in p.stderr, p.stderr)
        check(ls("--url", url) == {"jobs": []}, f"failed load left a job: {ls('--url', url)}")
    finally:
        proc.terminate()
        proc.wait(20)

    # ---- a cluster of 3 daemons, one of which dies
    daemons = [Daemon(TENPLEX) for _ in range(3)]
    try:
        cluster = os.path.join(tmp, "cluster.json")
        with open(cluster, "w") as f:
            json.dump({"hosts": [x.url for x in daemons], "gpus_per_host": 2}, f)
        ck = small_checkpoint(tmp, "tp=2,pp=2,dp=1")
        run("store", "load", "--cluster", cluster, "--job", "c", "--dir", ck)  # ranks 0-3 on hosts 0, 1
        # --json on the cluster load and save: one result object, the hosts actually used.
        out = json.loads(run("store", "load", "--cluster", cluster, "--job", "c", "--dir", ck, "--json").stdout)
        total = sum(x.get("/v1/jobs/c/versions/current")["bytes"] for x in daemons[:2])
        check(
            out["version"] == 2
            and out["ranks"] == 4
            and out["hosts"] == [x.url for x in daemons[:2]]
            and out["bytes"] == total
            and out["lost_hosts"] == []
            and out["job"] == "c",
            (out, total),
        )
        saved = os.path.join(tmp, "cluster-saved")
        out = json.loads(run("store", "save", "--cluster", cluster, "--job", "c", "--out", saved, "--json").stdout)
        check(
            out["version"] == 2
            and out["ranks"] == 4
            and out["bytes"] == total
            and sorted(out["hosts"]) == sorted(x.url for x in daemons[:2])
            and out["rebuilt_ranks"] == 0,
            out,
        )
        for name in sorted(os.listdir(ck)):
            if name.endswith(".safetensors"):
                check(
                    open(os.path.join(ck, name), "rb").read() == open(os.path.join(saved, name), "rb").read(),
                    f"cluster save --json: {name} as loaded",
                )
        # `tenplex transform`: a progress line (bytes, rate) on a terminal, none with -q or --quiet.
        run("store", "load", "--cluster", cluster, "--job", "t", "--dir", ck, "-q")
        rc, out, term = on_tty([TENPLEX, "transform", "--cluster", cluster, "--job", "t", "--to", "tp=1,pp=2"])
        check(rc == 0 and "transform" in term and "MB/s" in term, f"transform: no progress on a terminal: {term!r}")
        for args in (
            [TENPLEX, "-q", "transform", "--cluster", cluster, "--job", "t", "--to", "tp=2,pp=2"],
            [TENPLEX, "transform", "--cluster", cluster, "--job", "t", "--to", "tp=1,pp=2", "--quiet"],
        ):
            rc, out, term = on_tty(args)
            check(rc == 0 and "MB/s" not in term, f"{args[1:3]}: progress despite quiet: {term!r}")
        p = run("transform", "--cluster", cluster, "--job", "t", "--to", "tp=2,pp=2")
        check("MB/s" not in p.stderr and "\r" not in p.stderr, f"transform: progress in a pipe: {p.stderr!r}")
        run("store", "rm", "--cluster", cluster, "t")
        got = ls("--cluster", cluster)["jobs"]
        check(len(got) == 1 and got[0]["job"] == "c" and got[0]["current"] == 2, got)
        check(
            got[0]["bytes"] == total and len(got[0]["hosts"]) == 2, (got, total)
        )  # load uses only the hosts that get ranks
        for x in daemons:
            x.call("POST", "/v1/jobs/c/versions?version=3")
        run("store", "rm", "--cluster", cluster, "c", "--version", "3")
        for x in daemons[:2]:
            check([v["version"] for v in x.get("/v1/jobs/c")["versions"]] == [2], "cluster rm --version")
        daemons[2].kill()
        got = ls("--cluster", cluster)
        check(
            got["jobs"][0]["current"] == 2
            and len(got["unreachable"]) == 1
            and got["unreachable"][0]["host"] == daemons[2].url,
            got,
        )
        p = run("store", "rm", "--cluster", cluster, "c", expect_ok=False)
        check("did not answer" in p.stderr and "nothing removed" in p.stderr, p.stderr)
        check(daemons[0].get("/v1/jobs/c")["current"] == 2, "rm with a dead host removed nothing")
        with open(cluster, "w") as f:
            json.dump({"hosts": [x.url for x in daemons[:2]], "gpus_per_host": 2}, f)
        out = json.loads(run("store", "rm", "--cluster", cluster, "c", "--json").stdout)
        check(out["hosts"] == [x.url for x in daemons[:2]], out)
        check(all(x.get("/v1/jobs")["jobs"] == [] for x in daemons[:2]), "cluster rm")
    finally:
        for x in daemons:
            x.stop()
    print("ops store: ok")


def on_tty(args, env=None):
    """Runs args with stderr on a pseudo terminal; returns (rc, stdout, terminal text)."""
    master, slave = pty.openpty()
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    out = p.stdout.read()
    p.wait(120)
    os.close(master)
    return p.returncode, out.decode(), b"".join(chunks).decode(errors="replace")


def test_output(tmp):
    ck = small_checkpoint(tmp)
    # --json on the commands that print results.
    out = json.loads(run("reshard", "--in", ck, "--to", "tp=1,pp=2", "--out", os.path.join(tmp, "r1"), "--json").stdout)
    check(out["to"] == "tp=1,pp=2,dp=1" and out["bytes_written"] > 0, out)
    out = json.loads(run("ckpt", "verify", "--in", ck, "--seed", "3", "--json").stdout)
    check(out["ok"] is True and out["in"] == ck, out)
    out = json.loads(
        run(
            "ckpt",
            "init",
            "--model",
            os.path.join(tmp, "m.json"),
            "--config",
            "dp=2",
            "--out",
            os.path.join(tmp, "i2"),
            "--json",
        ).stdout
    )
    check(out["ranks"] == 2 and out["bytes"] > 0, out)
    src = os.path.join(tmp, "d.jsonl")
    with open(src, "w") as f:
        for i in range(20):
            f.write(json.dumps({"text": f"sample {i}"}) + "\n")
    out = json.loads(
        run("data", "index", "--input", src, "--format", "jsonl", "-o", os.path.join(tmp, "idx"), "--json").stdout
    )
    check(out["num_samples"] == 20 and out["format"] == "jsonl", out)
    d = Daemon(TENPLEX)
    try:
        out = json.loads(run("store", "load", "--url", d.url, "--job", "j", "--dir", ck, "--json").stdout)
        check(out["version"] == 1 and out["bytes"] == d.get("/v1/jobs/j/versions/1")["bytes"], out)
        out = json.loads(
            run("store", "save", "--url", d.url, "--job", "j", "--out", os.path.join(tmp, "s"), "--json").stdout
        )
        check(out["version"] == 1 and out["tensors"] > 0, out)
        # Progress: a line with bytes and a rate on a terminal; none in a pipe or with -q.
        rc, _, term = on_tty([TENPLEX, "store", "save", "--url", d.url, "--job", "j", "--out", os.path.join(tmp, "s2")])
        check(rc == 0 and "MB/s" in term and "B" in term, f"no progress on a terminal: {term!r}")
        rc, _, term = on_tty(
            [TENPLEX, "-q", "store", "save", "--url", d.url, "--job", "j", "--out", os.path.join(tmp, "s3")]
        )
        check(rc == 0 and "MB/s" not in term, f"progress despite -q: {term!r}")
        p = run("store", "save", "--url", d.url, "--job", "j", "--out", os.path.join(tmp, "s4"))
        check("MB/s" not in p.stderr and "\r" not in p.stderr, f"progress in a pipe: {p.stderr!r}")
        rc, _, term = on_tty([TENPLEX, "reshard", "--in", ck, "--to", "tp=1", "--out", os.path.join(tmp, "r2")])
        check(rc == 0 and "MB/s" in term, f"reshard: no progress on a terminal: {term!r}")
        # -q silences the summary line of load, -v adds notes (the ignored Megatron args).
        p = run("store", "load", "--url", d.url, "--job", "j", "--dir", ck, "-q")
        check(p.stdout == "" and p.stderr == "", (p.stdout, p.stderr))
        p = run(
            "-v",
            "model",
            "gpt",
            "--num-layers",
            "1",
            "--hidden-size",
            "8",
            "--num-attention-heads",
            "2",
            "--vocab-size",
            "8",
            "--lr",
            "0.1",
            "-o",
            os.path.join(tmp, "v.json"),
        )
        check("ignoring the training argument --lr 0.1" in p.stderr, p.stderr)
        p = run(
            "model",
            "gpt",
            "--num-layers",
            "1",
            "--hidden-size",
            "8",
            "--num-attention-heads",
            "2",
            "--vocab-size",
            "8",
            "--lr",
            "0.1",
            "-o",
            os.path.join(tmp, "v.json"),
        )
        check(p.stderr == "", p.stderr)
    finally:
        d.stop()
    # The Python writer's safetensors header is the canonical one (issue 16 bug 9): a
    # rank file of the C++ writer read and written back by python/tenplex is
    # byte-identical (keys sorted, compact, padded).
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from tenplex import safetensors

    for name in sorted(os.listdir(ck)):
        if not name.endswith(".safetensors"):
            continue
        path = os.path.join(ck, name)
        tensors, meta = safetensors.load(path, with_metadata=True)
        order = [e[0] for e in safetensors.read_header(path)[0]]  # data order
        out = os.path.join(tmp, "py-" + name)
        safetensors.save(out, [(n, tensors[n]) for n in order], meta or None)
        check(open(out, "rb").read() == open(path, "rb").read(), f"{name}: Python writer bytes differ from C++")
    print("ops output: ok")


def test_install(tmp):
    build = os.environ.get("TENPLEX_BUILD_DIR", os.path.join(ROOT, "build"))
    prefix = os.path.join(tmp, "prefix")
    subprocess.run(["cmake", "--install", build, "--prefix", prefix], check=True, capture_output=True)
    binary = os.path.join(prefix, "bin", "tenplex")
    check(os.access(binary, os.X_OK), "binary installed")
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    check("tenplex" in out, out)
    site = [
        os.path.dirname(p)
        for p in subprocess.run(
            ["find", prefix, "-path", "*/tenplex/__init__.py"], capture_output=True, text=True
        ).stdout.split()
    ]
    check(len(site) == 1, site)
    code = (
        "import tenplex, torch, json; st = tenplex.attach(); v = st.begin('j'); "
        "st.save_state('j', v, 0, {'w': torch.ones(3)}); st.commit('j', v); "
        "print(json.dumps({'file': tenplex.__file__, 'w': st.load_state('j', 0)['w'].tolist(), "
        "'layout': json.loads(tenplex.layout_json('gpt3-125m', 'tp=2'))['world_size']}))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # cmake --install: on sys.path for /usr and /usr/local; here via PYTHONPATH (a temp prefix).
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp,
        env=dict(env, PYTHONPATH=os.path.dirname(site[0])),
    )
    check(r.returncode == 0, r.stderr)
    got = json.loads(r.stdout)
    check(got["file"].startswith(prefix) and got["w"] == [1.0, 1.0, 1.0] and got["layout"] == 2, got)
    # pip from the checkout (the venv's pip and setuptools, no network, no build isolation).
    target = os.path.join(tmp, "pip-target")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            target,
            ROOT,
        ],
        capture_output=True,
        text=True,
        cwd=tmp,
        env=dict(os.environ, TENPLEX_BUILD_DIR=build),
    )  # the CLI of this build
    check(r.returncode == 0, r.stdout + r.stderr)
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp, env=dict(env, PYTHONPATH=target)
    )
    check(r.returncode == 0, r.stderr)
    got = json.loads(r.stdout)
    check(got["file"].startswith(target) and got["w"] == [1.0, 1.0, 1.0], got)
    print("ops install: ok (cmake --install and pip install --target, imported outside the checkout)")


@pytest.fixture
def tmp(request: pytest.FixtureRequest) -> Iterator[str]:
    d = tempfile.mkdtemp(prefix=f"tenplex-{request.node.name}-")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(autouse=True)
def _cli_under_test(tenplex: str) -> None:
    """The module's helpers call TENPLEX: the tenplex fixture's (tests/conftest.py)."""
    global TENPLEX
    TENPLEX = tenplex


if __name__ == "__main__":
    sys.exit(pytest.main([os.path.abspath(__file__), "-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
