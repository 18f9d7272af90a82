"""The Python package over the native module: state hand-off through an embedded store
and through a daemon, zero-copy loading, errors as Python exceptions.

Under pytest (issue 32 §4), ctest python_api, TENPLEX_BIN the CLI under test:

    python -m pytest tests/python_api_test.py::test_python_api
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from typing import Any, Callable

import torch
from elastic_run_testing import Checks

import tenplex
from tenplex.testing import free_port


def raises(check: Checks, exc: type[BaseException], fn: Callable[[], Any], what: str) -> None:
    try:
        fn()
    except exc as e:
        check(True, f"{what}: {type(e).__name__}: {e}")
        return
    except Exception as e:  # noqa: BLE001
        check(False, f"{what}: expected {exc.__name__}, got {type(e).__name__}: {e}")
        return
    check(False, f"{what}: no exception")


def state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "decoder.layers.0.mlp.linear_fc1.weight": torch.randn(8, 4, generator=g),
        "embedding.word_embeddings.weight": torch.randn(5, 4, generator=g).to(torch.bfloat16),
        "optimizer.exp_avg.x": torch.randn(3, generator=g).to(torch.float16),
        "counts": torch.arange(7, dtype=torch.int64),
        "empty": torch.zeros(0, 3),
    }


def round_trip(check: Checks, st: Any, label: str) -> int:
    want = {r: state(r) for r in range(3)}
    v = st.begin("job", info={"config": "dp=3", "step": 12, "samples_consumed": 96})
    for r, s in want.items():
        st.save_state("job", v, r, s)
    st.commit("job", v)
    info = st.status("job")
    check(
        info["config"] == "dp=3" and info["step"] == 12 and info["samples_consumed"] == 96 and info["committed"],
        f"{label}: status {info}",
    )
    for r, s in want.items():
        got = st.load_state("job", r)
        check(sorted(got) == sorted(s), f"{label}: rank {r} names")
        for k, t in s.items():
            g = got[k]
            check(
                g.dtype == t.dtype and tuple(g.shape) == tuple(t.shape) and torch.equal(g, t),
                f"{label}: rank {r} {k} equal",
            )
    # Committed versions are immutable.
    raises(
        check, tenplex.Error, lambda: st.save_state("job", v, 0, state(9)), f"{label}: write into a committed version"
    )
    raises(check, tenplex.NotFoundError, lambda: st.load_state("nojob", 0), f"{label}: unknown job")
    # Issue 16 bug 6: a value that is not a tensor is a tenplex error naming key and type
    # (it was AttributeError: 'int' object has no attribute 'detach'), and nothing is written.
    v2 = st.begin("job")
    bad = {"w": torch.ones(2), "step": 7}
    try:
        st.save_state("job", v2, 0, bad)
        check(False, f"{label}: save_state with an int value raised nothing")
    except tenplex.InvalidArgumentError as e:
        check(
            "'step'" in str(e) and "int" in str(e) and "torch.Tensor" in str(e),
            f"{label}: save_state names the key and type: {e}",
        )
    except Exception as e:  # noqa: BLE001
        check(False, f"{label}: save_state with an int value: {type(e).__name__}: {e}")
    check(st._s.list(f"jobs/job/{v2}/") == [], f"{label}: nothing written for a rejected state")
    st.abort("job", v2)
    return v


def admin(check: Checks, st: Any, label: str) -> None:
    """Store.jobs(), versions(), delete() against the store's own view."""
    st.commit("adm", st.begin("adm", info={"config": "tp=1", "step": 1}))
    st.save_state("adm", st.begin("adm", info={"step": 2}), 0, {"w": torch.ones(4)})  # open version 2
    v3 = st.begin("adm", info={"config": "tp=1", "step": 3})
    st.save_state("adm", v3, 0, {"w": torch.ones(4)})
    st.commit("adm", v3, keep_old=True)
    check("adm" in st.jobs() and st.jobs() == sorted(st.jobs()), f"{label}: jobs() lists the job: {st.jobs()}")
    vs = st.versions("adm")
    check(
        [(v["version"], v["committed"], v["current"]) for v in vs]
        == [(1, True, False), (2, False, False), (3, True, True)],
        f"{label}: versions() {[(v['version'], v['committed'], v['current']) for v in vs]}",
    )
    check(vs[2]["info"]["step"] == 3 and vs[2]["bytes"] == 16, f"{label}: version info and bytes {vs[2]}")
    st.delete("adm", 2)
    st.delete("adm", 1)
    check([v["version"] for v in st.versions("adm")] == [3], f"{label}: delete(job, version)")
    raises(check, tenplex.Error, lambda: st.delete("adm", 3), f"{label}: the current version is not deleted alone")
    st.delete("adm")
    check("adm" not in st.jobs(), f"{label}: delete(job) removes it")
    raises(check, tenplex.NotFoundError, lambda: st.versions("adm"), f"{label}: versions of a deleted job")
    # Issue 16 bug 9: aborting the only version (a failed load) leaves no job behind.
    st.abort("gone", st.begin("gone"))
    check("gone" not in st.jobs(), f"{label}: a job whose only version was aborted is not listed")


def test_python_api(tenplex: str, repo: str) -> None:
    check = Checks()
    python_api(check, tenplex, repo)
    check.finish()


def python_api(check: Checks, tenplex_bin: str, repo: str) -> None:
    """The embedded store, zero copy, the native helpers, the import without torch, a daemon."""
    st = tenplex.attach()
    check(st.local, "embedded store is local")
    round_trip(check, st, "embedded")
    admin(check, st, "embedded")
    # Zero copy: the loaded tensor maps the store's file; writing to it copies on write.
    t = st.load_state("job", 1)["decoder.layers.0.mlp.linear_fc1.weight"]
    with open("/proc/self/maps") as f:
        maps = f.read()
    check("rank-00001/decoder.layers.0.mlp.linear_fc1.weight" in maps, "loaded tensor maps the store's shm file")
    t.add_(1)
    check(
        torch.equal(
            st.load_state("job", 1)["decoder.layers.0.mlp.linear_fc1.weight"],
            state(1)["decoder.layers.0.mlp.linear_fc1.weight"],
        ),
        "writes to a loaded tensor do not reach the store",
    )
    raises(check, ValueError, lambda: tenplex.parse_config("tp=0"), "bad config is a ValueError")
    raises(check, ValueError, lambda: tenplex.layout_json("gpt3-125m", "tp=5"), "impossible layout is a ValueError")
    lay = json.loads(tenplex.layout_json("gpt3-125m", "tp=2,pp=2"))
    check(lay["world_size"] == 4, "layout_json gives the spec's JSON")

    # Issue 16 bug 6: without torch, `tenplex.attach` says which module is missing and
    # which interpreter to use (it was "module 'tenplex' has no attribute 'attach'").
    code = (
        "import sys; sys.modules['torch'] = None; import tenplex\n"
        "try:\n    tenplex.attach()\nexcept ImportError as e:\n    print(e)\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.path.join(repo, "python")),
    )
    check(
        p.returncode == 0 and "'torch'" in p.stdout and ".venv/bin/python" in p.stdout,
        f"import without torch names the module and the interpreter: {p.stdout.strip()} {p.stderr.strip()}",
    )

    # A daemon on this machine, through the same API.
    port = free_port()
    d = subprocess.Popen(
        [tenplex_bin, "store", "serve", "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/v1/list/", timeout=1)
                break
            except Exception:  # noqa: BLE001
                time.sleep(0.1)
        ds = tenplex.attach(url=url)
        round_trip(check, ds, "daemon")
        admin(check, ds, "daemon")
    finally:
        d.terminate()
        d.wait(timeout=20)
