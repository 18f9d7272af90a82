#!/usr/bin/env bash
# Configures and builds tenplex into build/ (release with debug info): every target, or
# only the named ones (scripts/demo.sh: tenplex _tenplex).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C build "$@"
