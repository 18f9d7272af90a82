#!/usr/bin/env bash
# Runs every side-by-side benchmark in one go on this machine and plots the results:
#   bash bench/run_all.sh [--quick]
# Binaries come from $BIN (default build/bin; build it with
#   cmake -S . -B build -G Ninja -DTENPLEX_BENCH=ON && ninja -C build tenplex plan_bench).
# Writes docs/benchmarks/*.csv and *.png and docs/benchmarks/machine.txt. See docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/bin}
OUT=${OUT:-docs/benchmarks}
QUICK=()
if [[ "${1:-}" == "--quick" ]]; then QUICK=(--quick); fi
# UCX 1.22 (the wheel the CLI links) patches code at every process start unless this is set:
# 0.4 s of each CLI call (docs/transport.md, "Which UCX"); scripts/test.sh and demo.sh set it too.
export UCX_MEM_MMAP_HOOK_MODE=${UCX_MEM_MMAP_HOOK_MODE:-reloc}
PY=${TENPLEX_PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
for b in tenplex plan_bench; do
  [[ -x "$BIN/$b" ]] || { echo "run_all: $BIN/$b missing (set BIN= or build it)" >&2; exit 1; }
done
mkdir -p "$OUT"
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p')"
  echo "cores: $(nproc)"
  echo "ram: $(free -g | awk '/^Mem:/{print $2}') GiB"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "mode: ${QUICK[*]:-full}"
} > "$OUT/machine.txt"
cat "$OUT/machine.txt"
start=$(date +%s)
FAILED=()
# A failing benchmark is reported and the others still run (and are plotted).
step() {
  local name=$1; shift
  "$@" || { echo "run_all: $name FAILED (exit $?)" >&2; FAILED+=("$name"); }
}
echo "== 1. planner scaling"
step plan_scaling $PY bench/plan_scaling.py --plan-bench "$BIN/plan_bench" --out "$OUT" "${QUICK[@]}"
echo "== 2. re-partitioning vs torch DCP (peer) and the limits"
step dcp_peer $PY bench/dcp_peer_bench.py --tenplex "$BIN/tenplex" --out "$OUT" "${QUICK[@]}"
echo "== 2b. the same kind of reshard against Megatron-Core dist_checkpointing and DeepSpeed ds_to_universal"
if [[ ${#QUICK[@]} -gt 0 ]]; then
  step mcore_peer $PY bench/mcore_peer_bench.py "$BIN/tenplex" --out "$OUT" --layers 2 --hidden 256 --ffn 704
  step ds_peer $PY bench/ds_peer_bench.py --tenplex "$BIN/tenplex" --out "$OUT" --layers 2
else
  step mcore_peer $PY bench/mcore_peer_bench.py "$BIN/tenplex" --out "$OUT"
  step ds_peer $PY bench/ds_peer_bench.py --tenplex "$BIN/tenplex" --out "$OUT" --reps 2
fi
echo "== 3. distributed transform across store daemons"
if [[ -f bench/cluster_transform_bench.py ]]; then
  step cluster_transform $PY bench/cluster_transform_bench.py --tenplex "$BIN/tenplex" --out "$OUT" "${QUICK[@]}"
else
  echo "bench/cluster_transform_bench.py not present: skipped"
fi
echo "== 4. failure recovery: store commits vs restarting from a disk checkpoint"
step failure_recovery $PY bench/failure_recovery_bench.py --tenplex "$BIN/tenplex" --out "$OUT" "${QUICK[@]}"
echo "== 5. checkpoint import/export (hf, dcp, megatron) against the write limit"
step interop $PY bench/interop_bench.py --tenplex "$BIN/tenplex" --out "$OUT" "${QUICK[@]}"
echo "== 6. config policy: validation against published runs, job completion time under changing GPUs"
step policy_validate $PY bench/policy_validate.py --bin "$BIN/tenplex" --out "$OUT"
if [[ ${#QUICK[@]} -gt 0 ]]; then
  step jct_sim $PY bench/jct_sim.py --bin "$BIN/tenplex" --out "$OUT" --quick
else
  step jct_sim $PY bench/jct_sim.py --bin "$BIN/tenplex" --out "$OUT"
fi
echo "== 7. heterogeneous devices: even vs rebalanced vs FlexTP-style vs ideal"
step hetero $PY bench/hetero_bench.py --tenplex "$BIN/tenplex" --out "$OUT" "${QUICK[@]}"
echo "== 8. GPU-resident state: restore onto the device, commit from it (the cpu backend without a GPU; docs/gpu.md)"
if [[ ${#QUICK[@]} -gt 0 ]]; then
  step device_restore $PY bench/device_restore.py --out "$OUT" --sizes 0.05,0.25
  step device_commit $PY bench/device_commit.py --out "$OUT" --steps 8
else
  step device_restore $PY bench/device_restore.py --out "$OUT"
  step device_commit $PY bench/device_commit.py --out "$OUT"
fi
echo "== plots"
$PY bench/plot_benchmarks.py --dir "$OUT"
echo "run_all: done in $(( $(date +%s) - start )) s; results in $OUT"
if (( ${#FAILED[@]} )); then echo "run_all: failed: ${FAILED[*]}" >&2; exit 1; fi
