#!/usr/bin/env bash
# Makes the project's one Python environment at .venv/ (Debian's python3 + venv) and
# installs the pinned packages of requirements.lock from PyPI: torch 2.x, numpy,
# matplotlib, safetensors, transformers, megatron-core, deepspeed, pytest. Idempotent: a venv
# whose installed lock equals requirements.lock is left as it is (a few ms).
#   setup-venv.sh            make the venv if needed and install the lock
#   setup-venv.sh --create   only make the (empty) venv: CMake can configure against it
#                            while the packages install (scripts/demo.sh)
# Top-level packages (pip freeze of these gives requirements.lock):
#   torch numpy matplotlib safetensors transformers megatron-core deepspeed pytest pyyaml
#   ruff (the Python linter and formatter scripts/test.sh runs, pyproject.toml)
#   python-etcd (the etcd client of torchrun's etcd-v2 rendezvous, docs/deploy.md)
#   kubernetes-validate (the Kubernetes API schemas, bundled, that tests/k8s_schema_test.py
#   checks deploy/k8s/ against)
#   torchft (pytorch/torchft, what bench/torchft_bench.py compares in-process membership with)
#   libucx-cu12 (UCX of the data plane, linked by CMake: cmake/ucx.cmake; install-deps.sh
#   installs it before the rest)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
STAMP=$VENV/.tenplex-lock
if [ ! -x $VENV/bin/python ]; then
  echo "setup-venv: creating $VENV"
  /usr/bin/python3 -m venv $VENV
fi
# The checkout's package in development mode: a .pth file puts python/ (tenplex and its
# native module, which CMake builds into python/tenplex) on the venv's path, so scripts,
# examples and benchmarks import tenplex without editing sys.path. A wheel for other
# environments: pyproject.toml/setup.py (docs/install.md).
SITE=$($VENV/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$PWD/python" >"$SITE/tenplex-checkout.pth"
[ "${1:-}" = "--create" ] && exit 0
cmp -s requirements.lock "$STAMP" && exit 0
echo "setup-venv: installing requirements.lock into $VENV (torch and its CUDA libraries: ~3 GB, 2-3 min)"
t0=$(date +%s)
# deepspeed ships an sdist whose setup.py imports torch: built after torch is in, with
# no build isolation and none of its CUDA ops (DS_BUILD_OPS=0; it runs on CPU here).
grep -v '^deepspeed==' requirements.lock >$VENV/.requirements-1.txt
$VENV/bin/python -m pip install -q --no-input -r $VENV/.requirements-1.txt
DS_BUILD_OPS=0 $VENV/bin/python -m pip install -q --no-input --no-deps --no-build-isolation \
  "$(grep '^deepspeed==' requirements.lock)"
cp requirements.lock "$STAMP"
echo "setup-venv: done in $(( $(date +%s) - t0 )) s"
