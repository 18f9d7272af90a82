#!/bin/bash
# bench/run_all.sh --quick's steps (not 3, run alternated apart; not 6, model outputs), each run on the old
# tree (6ba429d) and the new (HEAD) back to back, the first side alternating from step to step.
PY=/work/main/.venv/bin/python
steps=(
 'plan_scaling|$PY bench/plan_scaling.py --plan-bench build/bin/plan_bench --out $OUT --quick'
 'dcp_peer|$PY bench/dcp_peer_bench.py --tenplex build/bin/tenplex --out $OUT --quick'
 'mcore_peer|$PY bench/mcore_peer_bench.py build/bin/tenplex --out $OUT --layers 2 --hidden 256 --ffn 704'
 'ds_peer|$PY bench/ds_peer_bench.py --tenplex build/bin/tenplex --out $OUT --layers 2'
 'failure_recovery|$PY bench/failure_recovery_bench.py --tenplex build/bin/tenplex --out $OUT --quick'
 'interop|$PY bench/interop_bench.py --tenplex build/bin/tenplex --out $OUT --quick'
 'hetero|$PY bench/hetero_bench.py --tenplex build/bin/tenplex --out $OUT --quick'
 'device_restore|$PY bench/device_restore.py --out $OUT --sizes 0.05,0.25'
 'device_commit|$PY bench/device_commit.py --out $OUT --steps 8'
)
side() {  # side old|new name cmd
  local s=$1 name=$2 cmd=$3 t0=$(date +%s)
  if [[ $s == old ]]; then
    (cd /tmp/wt-old && OUT=/tmp/ab/all-old PY=$PY env -u UCX_MEM_MMAP_HOOK_MODE PYTHONPATH=/tmp/wt-old/python \
       TENPLEX_PYTHON=$PY bash -c "$cmd" > /tmp/ab/all-old-$name.log 2>&1)
  else
    (cd /work/main && OUT=/tmp/ab/all-new PY=$PY UCX_MEM_MMAP_HOOK_MODE=reloc bash -c "$cmd" > /tmp/ab/all-new-$name.log 2>&1)
  fi
  echo "   $s $name rc $? $(( $(date +%s) - t0 )) s"
}
mkdir -p /tmp/ab/all-old /tmp/ab/all-new
i=0
for st in "${steps[@]}"; do
  name=${st%%|*}; cmd=${st#*|}
  echo "== $name $(date -u +%T)"
  if (( i % 2 == 0 )); then side old $name "$cmd"; side new $name "$cmd"; else side new $name "$cmd"; side old $name "$cmd"; fi
  i=$((i+1))
done
echo "== done $(date -u +%T)"
