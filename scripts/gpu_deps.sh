#!/usr/bin/env bash
# Downloads the Debian packages that scripts/gpu_check.sh unpacks into a private prefix on a
# GPU machine without network (docs/gpu.md): the C++ build dependencies of the native module,
# the CLI and the device tests, with the runtime libraries they link. Run on a developer
# machine (Debian 12, apt reaches its mirrors); the packages land in .gpu-deps/ (ignored by
# git), which travels with the working tree to the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS=(libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian nlohmann-json3-dev
      libcli11-dev libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libxxhash-dev libxxhash0
      libcpp-httplib-dev libcpp-httplib0.11 libucx-dev libucx0 libfuse3-dev libfuse3-3
      libssl-dev libssl3 pkgconf pkgconf-bin libpkgconf3 libnuma1 libibverbs1
      librdmacm1 libnl-3-200 libnl-route-3-200 libbrotli1 libbrotli-dev zlib1g-dev)
mkdir -p .gpu-deps
rm -f .gpu-deps/*.deb
# apt-get download writes into the current directory; _apt cannot write to a root-owned
# folder, which apt reports as a warning only.
(cd .gpu-deps && apt-get download "${PKGS[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
n=$(ls .gpu-deps/*.deb | wc -l)
[ "$n" -eq "${#PKGS[@]}" ] || { echo "gpu_deps: got $n of ${#PKGS[@]} packages" >&2; exit 1; }
echo "gpu_deps: ${n} packages, $(du -sh .gpu-deps | cut -f1) in .gpu-deps/"
