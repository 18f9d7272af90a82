#!/usr/bin/env bash
# Installs the Debian packages tenplex needs to build, test and run (as root), then the
# project's Python environment (.venv/, scripts/setup-venv.sh) from PyPI (not with --no-venv).
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
[ "${1:-}" = "--no-venv" ] || bash "$(dirname "$0")/setup-venv.sh"
