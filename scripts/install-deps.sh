#!/usr/bin/env bash
# Installs the Debian packages tenplex needs to build, test and run (as root), then the
# project's Python environment (.venv/, scripts/setup-venv.sh) from PyPI (not with --no-venv;
# the data plane's UCX wheel goes into .venv either way, below).
set -euo pipefail
PKGS=(cmake ninja-build g++ clang pkg-config git
      libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev libcli11-dev
      libspdlog-dev libfmt-dev libxxhash-dev libcpp-httplib-dev libucx-dev
      libfuse3-dev fuse3 libssl-dev pybind11-dev python3-dev python3-venv libclang-rt-14-dev clang-format universal-ctags iproute2 curl
      slurmctld slurmd slurm-client munge etcd-server etcd-client)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The data plane's UCX: the libucx wheel pinned in requirements.lock, into .venv even with
# --no-venv, before CMake runs (cmake/ucx.cmake links it). Debian 12's libucx (1.13.1, its
# headers above serve TENPLEX_UCX=system) aborts the store daemon on an assertion when a
# data-plane client dies mid-wireup (docs/reliability.md).
ROOT=$(cd "$(dirname "$0")/.." && pwd)
UCX_PIN=$(grep '^libucx-cu12==' "$ROOT/requirements.lock")
bash "$ROOT/scripts/setup-venv.sh" --create
UCX_HAVE=$("$ROOT/.venv/bin/python" -c 'import importlib.metadata as m; print(m.version("libucx-cu12"))' \
  2>/dev/null || true)
if [ "libucx-cu12==$UCX_HAVE" != "$UCX_PIN" ]; then
  echo "installing $UCX_PIN into .venv"
  "$ROOT/.venv/bin/python" -m pip install -q --no-input --no-deps "$UCX_PIN"
fi
[ "${1:-}" = "--no-venv" ] || bash "$ROOT/scripts/setup-venv.sh"
