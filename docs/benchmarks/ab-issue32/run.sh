#!/bin/bash
# Alternated A/B of the quick cluster-transform benchmark: old (6ba429d, Debian UCX 1.13, no hook setting:
# that UCX hangs at start with reloc) and new (HEAD, UCX 1.22 wheel, reloc as run_all.sh sets it).
for i in 1 2 3; do
  echo "== round $i old $(date -u +%T)"
  (cd /tmp/wt-old && env -u UCX_MEM_MMAP_HOOK_MODE PYTHONPATH=/tmp/wt-old/python TENPLEX_PYTHON=/work/main/.venv/bin/python \
     /work/main/.venv/bin/python bench/cluster_transform_bench.py --tenplex build/bin/tenplex --out /tmp/ab/old$i --quick > /tmp/ab/old$i.log 2>&1)
  echo "   rc $?"
  echo "== round $i new $(date -u +%T)"
  (cd /work/main && UCX_MEM_MMAP_HOOK_MODE=reloc .venv/bin/python bench/cluster_transform_bench.py --tenplex build/bin/tenplex --out /tmp/ab/new$i --quick > /tmp/ab/new$i.log 2>&1)
  echo "   rc $?"
done
echo "== done $(date -u +%T)"
