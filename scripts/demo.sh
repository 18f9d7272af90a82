#!/usr/bin/env bash
# The main job: installs dependencies, builds, and runs an elastic GPT training job
# whose parallelism changes while it runs (grow, change TP and PP, shrink, lose a
# worker), next to a static run of the same steps, and prints the comparison.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh >/dev/null
T=build/bin/tenplex
OUT=${TENPLEX_DEMO_DIR:-out/demo}
rm -rf "$OUT" && mkdir -p "$OUT"
$T model gpt --num-layers 4 --hidden-size 64 --num-attention-heads 4 --vocab-size 256 \
  --max-position-embeddings 64 -o "$OUT/model.json"
TRAIN=(/usr/bin/python3 examples/gpt/train.py --model "$OUT/model.json")
echo "== static run: tp=1 for 20 steps"
$T run --quiet --schedule examples/schedules/static.json --log "$OUT/static.jsonl" \
  --work-dir "$OUT/static" -- "${TRAIN[@]}"
echo "== elastic run: $(tr -d '\n ' < examples/schedules/demo.json)"
$T run --schedule examples/schedules/demo.json --log "$OUT/elastic.jsonl" --work-dir "$OUT/elastic" \
  --baseline "$OUT/static.jsonl" -- "${TRAIN[@]}"
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
$T run --cluster "$OUT/cluster.json" --schedule examples/schedules/demo.json --log "$OUT/elastic-cluster.jsonl" \
  --work-dir "$OUT/elastic-cluster" --commit-every 1 --baseline "$OUT/static.jsonl" -- "${TRAIN[@]}"
echo "logs: $OUT/elastic.jsonl, $OUT/elastic-cluster.jsonl, $OUT/static.jsonl"
