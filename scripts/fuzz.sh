#!/usr/bin/env bash
# Builds the libFuzzer targets (every src/tenplex/<module>/*_fuzz.cc) with clang into
# build-fuzz/ (or $TENPLEX_FUZZ_BUILD) and runs each for a bounded time from its seed corpus
# tests/fuzz/<target>/. Usage: scripts/fuzz.sh [SECONDS_PER_TARGET (default 20)].
# A finding (crash, sanitizer report, failed property) fails the script and leaves the
# input in build-fuzz/artifacts/. Without clang it prints why and succeeds.
# The mutation seed is fixed (TENPLEX_FUZZ_SEED, default 1) and a target stops after
# TENPLEX_FUZZ_RUNS inputs (default 200000) or the time, whichever comes first, so a CI run
# covers a prefix of what a complete local run of the same seed covered. Search further
# with other seeds and more runs locally.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
B=${TENPLEX_FUZZ_BUILD:-build-fuzz}  # build directory
if ! command -v clang++ >/dev/null 2>&1; then
  echo "== fuzzing skipped: clang++ is not installed (scripts/install-deps.sh installs it)"
  exit 0
fi
# A build directory already configured with TENPLEX_FUZZ (scripts/test.sh's sanitized build,
# which also runs the unit tests) is used as it is; otherwise configure one.
if ! grep -qx 'TENPLEX_FUZZ:BOOL=ON' "$B/CMakeCache.txt" 2>/dev/null; then
  cmake -S . -B "$B" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTENPLEX_FUZZ=ON -DTENPLEX_BENCH=OFF -DTENPLEX_PYTHON=OFF >/dev/null
fi
. scripts/ninja_targets.sh
targets=$(ninja_targets "$B" fuzz)
if [ -z "$targets" ]; then
  echo "== fuzzing: no *_fuzz.cc targets"
  exit 0
fi
ninja -C "$B" $targets
mkdir -p $B/artifacts
# fuzz_one TARGET: runs it from its corpus and seeds, writes its summary to $B/TARGET.summary
# (targets run TENPLEX_FUZZ_JOBS at a time, default the core count), fails on a finding.
fuzz_one() {
  local t=$1 corpus=$B/corpus/$1 log=$B/$1.log rc
  mkdir -p "$corpus"
  local seeds=()
  [ -d "tests/fuzz/$t" ] && seeds=("tests/fuzz/$t")
  set +e
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "$B/bin/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -seed="${TENPLEX_FUZZ_SEED:-1}" -runs="${TENPLEX_FUZZ_RUNS:-200000}" -artifact_prefix=$B/artifacts/"$t"- -print_final_stats=1 "$corpus" "${seeds[@]}" >"$log" 2>&1
  rc=$?
  set -e
  # The summary goes to a file, printed after every job ended: jobs never interleave.
  if [ $rc -ne 0 ]; then
    { tail -60 "$log"; echo "== fuzz target $t failed (exit $rc); the input is in $B/artifacts/"; } >"$B/$t.summary"
    return 1
  fi
  { echo "== fuzzed $t for ${secs}s"; grep -E "^#[0-9]+ +DONE|^stat::number_of_executed_units" "$log" || true; } >"$B/$t.summary"
}
export -f fuzz_one
export B secs
for t in $targets; do rm -f "$B/$t.summary"; done
rc=0
printf '%s\n' $targets | xargs -P "${TENPLEX_FUZZ_JOBS:-$(nproc)}" -I{} bash -c 'set -euo pipefail; fuzz_one {}' || rc=$?
for t in $targets; do cat "$B/$t.summary" 2>/dev/null || echo "== fuzz target $t: no summary"; done
if [ $rc -ne 0 ]; then
  echo "== fuzzing found something (above)"
  exit 1
fi
