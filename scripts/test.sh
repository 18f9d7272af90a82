#!/usr/bin/env bash
# The whole test suite: installs dependencies, checks sizes, the module map and the Python
# and C++ formatting, builds the release tree and runs its integration tests with ctest,
# then builds the unit tests with AddressSanitizer and UndefinedBehaviorSanitizer (clang),
# runs them, and fuzzes the parsers from the same build.
set -euo pipefail
cd "$(dirname "$0")/.."
# The wheel's UCX (cmake/ucx.cmake) installs its memory hooks by patching code ("bistro")
# when a process loads it: ~0.4 s of system time per process start (`tenplex --version`
# 0.41 s), which hundreds of CLI and test processes pay. Patching relocation tables gives
# the same memory events in 0.01 s (docs/transport.md, "UCX").
export UCX_MEM_MMAP_HOOK_MODE=${UCX_MEM_MMAP_HOOK_MODE:-reloc}
# stage WHAT: prints the time since the start beside WHAT (CI gives the whole run 90 min).
stage() { echo "== [$((SECONDS / 60))m$((SECONDS % 60))s] $*"; }
bash scripts/install-deps.sh
stage "dependencies installed"
# Cheap checks first (seconds; mypy 1-3 min with a cold cache): sizes and the module map
# (docs/structure.md), Python lint and format (ruff, pyproject.toml), the package's types
# (mypy, pyproject.toml), C++ format.
.venv/bin/python scripts/check_structure.py
RUFF_PATHS=(python tests scripts examples bench setup.py)
.venv/bin/ruff check -q "${RUFF_PATHS[@]}"
.venv/bin/ruff format -q --check "${RUFF_PATHS[@]}"
echo "== ruff: Python lint and format clean"
# Types of the package (mypy, pinned in requirements.lock, configured in pyproject.toml).
.venv/bin/python -m mypy
echo "== mypy: the package's types check"
stage "structure, ruff and mypy checked"
bash scripts/format.sh
stage "format checked"
# The release tree without the unit tests (TENPLEX_UNIT_TESTS, CMakeLists.txt): they are
# built and run in the sanitized tree below. ctest here runs the integration tests.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTENPLEX_UNIT_TESTS=OFF >/dev/null
bash scripts/build.sh
stage "built"
ctest --test-dir build --output-on-failure -j2 --timeout 600
stage "integration tests passed"
# One sanitized build serves the unit tests (all of them: label "unit") and the fuzz
# targets: clang, ASan+UBSan, the libFuzzer instrumentation (TENPLEX_FUZZ), -O0 with
# assertions on, warnings are errors
# (clang's, besides g++'s above). Two builds (g++ ASan, clang fuzz -O2) took ~29 min of
# CI's 90 on 2 cores. -O0: half the compile time of -O1 (cli/run.cc 15.6 s vs 29 s of
# CPU), but the compute-heavy modules' tests ran ~3x longer (20 min for all unit tests),
# so those modules stay at -O1 (TENPLEX_SANITIZE_O1, cmake/tenplex.cmake). Without clang:
# g++ ASan, no fuzzing.
SAN=build-san
if command -v clang++ >/dev/null 2>&1; then
  cmake -S . -B $SAN -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O0 -g1" -DCMAKE_C_FLAGS_DEBUG="-O0 -g1" \
    -DTENPLEX_SANITIZE=ON -DTENPLEX_FUZZ=ON -DTENPLEX_SANITIZE_O1="policy;ptc;plan;transform" \
    -DTENPLEX_BENCH=OFF -DTENPLEX_PYTHON=OFF >/dev/null
else
  cmake -S . -B $SAN -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTENPLEX_SANITIZE=ON -DTENPLEX_BENCH=OFF \
    -DTENPLEX_PYTHON=OFF >/dev/null
fi
# Only the unit tests and fuzz targets (with their libraries and the transport's peer
# process): not the CLI, which no unit test runs (~20% of this build).
. scripts/ninja_targets.sh
ninja -C $SAN $(ninja_targets $SAN 'test\|fuzz')
stage "sanitized build (unit tests, fuzz targets) built"
# Not the reloc hook mode here: its patched relocations fight ASan's interceptors (the UCX
# tests abort under ASan with it, pass with UCX's default).
env -u UCX_MEM_MMAP_HOOK_MODE ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir $SAN --output-on-failure -j2 -L unit --timeout 900
stage "unit tests passed under ASan+UBSan"
echo "== fuzzing the parsers (libFuzzer, 20 s per target; skipped without clang)"
TENPLEX_FUZZ_BUILD=$SAN bash scripts/fuzz.sh 20
stage "fuzzing found nothing"
