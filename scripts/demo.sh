#!/usr/bin/env bash
# The main job: installs dependencies, builds what the demo runs (the CLI and the Python
# module; scripts/test.sh builds the rest), and runs an elastic GPT training job whose
# parallelism changes while it runs (grow, change TP and PP, shrink, lose a worker), next
# to a static run of the same steps, and prints the comparison. The fast path first
# (`--warm`: workers stay alive across changes), the cold path (every change restarts the
# workers) beside it, then the same job with its state in two store daemons.
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
stamp() { echo "[demo $(( $(date +%s) - T0 )) s] $*"; }
OUT=${TENPLEX_DEMO_DIR:-out/demo}
rm -rf "$OUT" && mkdir -p "$OUT"
bash scripts/install-deps.sh --no-venv
stamp "Debian packages installed"
# The Python packages (torch from PyPI, ~3 GB) download while the C++ compiles.
bash scripts/setup-venv.sh --create
bash scripts/setup-venv.sh >"$OUT/setup-venv.log" 2>&1 &
VENV_PID=$!
export UCX_MEM_MMAP_HOOK_MODE=${UCX_MEM_MMAP_HOOK_MODE:-reloc}  # UCX start-up: docs/transport.md
bash scripts/build.sh tenplex _tenplex >"$OUT/build.log" 2>&1 || { tail -n 30 "$OUT/build.log"; exit 1; }
stamp "built build/bin/tenplex and the Python module"
wait "$VENV_PID" || { cat "$OUT/setup-venv.log"; exit 1; }
stamp "Python environment .venv/ ready ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"

T=build/bin/tenplex
$T model gpt --num-layers 4 --hidden-size 64 --num-attention-heads 4 --vocab-size 256 \
  --max-position-embeddings 64 -o "$OUT/model.json"
TRAIN=(.venv/bin/python examples/gpt/train.py --model "$OUT/model.json")
SCHEDULE=examples/schedules/demo.json
echo "== static run: tp=1 for 20 steps"
$T run --quiet --schedule examples/schedules/static.json --log "$OUT/static.jsonl" \
  --work-dir "$OUT/static" -- "${TRAIN[@]}"
stamp "static run done"
echo "== elastic run, warm workers (the fast path): $(tr -d '\n ' < $SCHEDULE)"
$T run --warm --schedule $SCHEDULE --log "$OUT/elastic-warm.jsonl" --work-dir "$OUT/elastic-warm" \
  --baseline "$OUT/static.jsonl" -- "${TRAIN[@]}"
stamp "warm elastic run done"
echo "== the same elastic run, cold (every change restarts the workers), for comparison"
$T run --schedule $SCHEDULE --log "$OUT/elastic.jsonl" --work-dir "$OUT/elastic" \
  --baseline "$OUT/static.jsonl" -- "${TRAIN[@]}"
stamp "cold elastic run done"
# The same elastic job with its state in two store daemons (2 GPUs per host): every
# reconfiguration is a distributed transform between them over UCX, and the workers
# commit their state into the daemons after every step, so the killed worker costs
# no finished step.
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
URLS=()
for h in 0 1; do
  $T store serve --listen 127.0.0.1:0 >"$OUT/daemon$h.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do grep -q "serving http" "$OUT/daemon$h.log" && break; sleep 0.1; done
  URLS+=("$(grep -o 'http://127.0.0.1:[0-9]*' "$OUT/daemon$h.log")")
done
printf '{"hosts": ["%s", "%s"], "gpus_per_host": 2}\n' "${URLS[0]}" "${URLS[1]}" >"$OUT/cluster.json"
echo "== elastic run across 2 store daemons: tenplex run --cluster $OUT/cluster.json --commit-every 1"
$T run --cluster "$OUT/cluster.json" --schedule $SCHEDULE --log "$OUT/elastic-cluster.jsonl" \
  --work-dir "$OUT/elastic-cluster" --commit-every 1 --baseline "$OUT/static.jsonl" -- "${TRAIN[@]}"
stamp "cluster elastic run done"
echo "logs: $OUT/elastic-warm.jsonl, $OUT/elastic.jsonl, $OUT/elastic-cluster.jsonl, $OUT/static.jsonl"
