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
echo "logs: $OUT/elastic.jsonl, $OUT/static.jsonl"
