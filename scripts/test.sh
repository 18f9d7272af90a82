#!/usr/bin/env bash
# The whole test suite: installs dependencies, checks sizes, the module map and the Python
# and C++ formatting, builds, runs every test (unit and
# integration) with ctest, then builds the unit tests with AddressSanitizer and
# UndefinedBehaviorSanitizer and runs them too.
set -euo pipefail
cd "$(dirname "$0")/.."
# The wheel's UCX (cmake/ucx.cmake) installs its memory hooks by patching code ("bistro")
# when a process loads it: ~0.4 s of system time per process start (`tenplex --version`
# 0.41 s), which hundreds of CLI and test processes pay. Patching relocation tables gives
# the same memory events in 0.01 s (docs/transport.md, "UCX").
export UCX_MEM_MMAP_HOOK_MODE=${UCX_MEM_MMAP_HOOK_MODE:-reloc}
bash scripts/install-deps.sh
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
bash scripts/format.sh
bash scripts/build.sh
ctest --test-dir build --output-on-failure -j2 --timeout 600
echo "== unit tests under ASan+UBSan"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTENPLEX_SANITIZE=ON -DTENPLEX_BENCH=OFF -DTENPLEX_PYTHON=OFF >/dev/null
ninja -C build-asan
# Not the reloc hook mode here: its patched relocations fight ASan's interceptors (the UCX
# tests abort under ASan with it, pass with UCX's default).
env -u UCX_MEM_MMAP_HOOK_MODE ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j2 -L unit --timeout 900
echo "== fuzzing the parsers (libFuzzer, 20 s per target; skipped without clang)"
bash scripts/fuzz.sh 20
