#!/usr/bin/env bash
# The whole test suite: installs dependencies, checks the C++ formatting, builds, runs every test (unit and
# integration) with ctest, then builds the unit tests with AddressSanitizer and
# UndefinedBehaviorSanitizer and runs them too.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/format.sh
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j2 --timeout 600
echo "== unit tests under ASan+UBSan"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTENPLEX_SANITIZE=ON -DTENPLEX_BENCH=OFF -DTENPLEX_PYTHON=OFF >/dev/null
ninja -C build-asan
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j2 -L unit --timeout 900
echo "== fuzzing the parsers (libFuzzer, 20 s per target; skipped without clang)"
bash scripts/fuzz.sh 20
