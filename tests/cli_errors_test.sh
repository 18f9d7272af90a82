#!/usr/bin/env bash
# Bad input to the CLI: a clear message on stderr and exit code 2, never a crash.
set -u
T="$1"
PY=${TENPLEX_PYTHON:?the project interpreter (set by CMake: TENPLEX_PY)}
REPO=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
expect_error() {  # expect_error NEEDLE CMD...
  local needle="$1"; shift
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ $rc -ne 2 ] || ! grep -qF -- "$needle" "$tmp/err"; then
    echo "FAIL: $* -> rc=$rc, stderr: $(cat "$tmp/err")"; fails=$((fails+1))
  else
    echo "ok: $* -> $(head -1 "$tmp/err")"
  fi
}
expect_ok() {
  if ! "$@" >"$tmp/out" 2>"$tmp/err"; then echo "FAIL: $* -> $(cat "$tmp/err")"; fails=$((fails+1)); fi
}
fail() { echo "FAIL: $*"; fails=$((fails+1)); }
# Issue 34 item 9, the small CLI defects.
issue34_cli() {
  local ck="$tmp/i34-ck"
  "$T" ckpt init --model "$tmp/f.json" --config tp=2 --out "$ck" >/dev/null 2>&1 || fail "ckpt init"
  # -q before the subcommand as after it (reshard printed its report with `tenplex -q reshard`).
  "$T" -q reshard --in "$ck" --out "$tmp/i34-r1" --to tp=1 >"$tmp/out" 2>&1 || fail "-q reshard: $(cat "$tmp/out")"
  [ ! -s "$tmp/out" ] || fail "tenplex -q reshard printed: $(cat "$tmp/out")"
  "$T" reshard --in "$ck" --out "$tmp/i34-r2" --to tp=1 -q >"$tmp/out" 2>&1 || fail "reshard -q"
  [ ! -s "$tmp/out" ] || fail "tenplex reshard -q printed: $(cat "$tmp/out")"
  "$T" reshard --in "$ck" --out "$tmp/i34-r3" --to tp=1 2>/dev/null | grep -q "^resharded " || fail "reshard has no report"
  # --max-shard-size takes the 5e9 its help shows and the units of the other size options;
  # export prints a sentence, JSON only with --json.
  "$T" export --to hf "$ck" --out "$tmp/i34-hf" --max-shard-size 5e9 >"$tmp/out" 2>"$tmp/err" || fail "export --max-shard-size 5e9: $(cat "$tmp/err")"
  grep -q "^exported $ck as hf into $tmp/i34-hf: " "$tmp/out" || fail "export sentence: $(cat "$tmp/out")"
  [ -f "$tmp/i34-hf/model.safetensors" ] || fail "5e9: not one file: $(ls "$tmp/i34-hf")"
  "$T" export --to hf "$ck" --out "$tmp/i34-hf4k" --max-shard-size 4KiB --json >"$tmp/out" 2>"$tmp/err" || fail "export 4KiB: $(cat "$tmp/err")"
  "$PY" -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['format']=='hf' and j['out']==sys.argv[2], j" "$tmp/out" "$tmp/i34-hf4k" || fail "export --json: $(cat "$tmp/out")"
  [ -f "$tmp/i34-hf4k/model.safetensors.index.json" ] || fail "4KiB: not sharded: $(ls "$tmp/i34-hf4k")"
  expect_error "--max-shard-size: size '5x'" "$T" export --to hf "$ck" --out "$tmp/i34-bad" --max-shard-size 5x
  # An import from a source without a step records step 0 (a fresh start; --step N sets one),
  # so that training accepts it: examples/gpt/train.py refuses state without a step.
  "$T" import --from hf "$tmp/i34-hf" --model "$tmp/f.json" --config tp=1 --out "$tmp/i34-imp" >"$tmp/out" 2>"$tmp/err" || fail "import: $(cat "$tmp/err")"
  grep -q "^imported hf checkpoint $tmp/i34-hf into $tmp/i34-imp (tp=1,pp=1,dp=1, step 0): " "$tmp/out" || fail "import sentence: $(cat "$tmp/out")"
  grep -q "recorded step 0" "$tmp/err" || fail "import does not say it recorded step 0: $(cat "$tmp/err")"
  "$T" import --from hf "$tmp/i34-hf" --model "$tmp/f.json" --config tp=1 --out "$tmp/i34-imp7" --step 7 --json >"$tmp/out" 2>/dev/null || fail "import --json"
  "$PY" - "$tmp/out" "$tmp/i34-imp" "$tmp/i34-imp7" <<'PY' || fail "import step/JSON"
import json, sys
out = json.load(open(sys.argv[1]))
assert out["format"] == "hf" and out["out"] == sys.argv[3] and out["step"] == 7, out
for d, step, samples in ((sys.argv[2], 0, 0), (sys.argv[3], 7, None)):
    info = json.load(open(d + "/tenplex.json"))
    assert info["step"] == step and info.get("samples_consumed") == samples, (d, info)
PY
  "$PY" "$REPO/examples/gpt/launch.py" --config tp=1 --load-dir "$tmp/i34-imp" --steps 1 --seq-length 8 \
      --global-batch-size 2 --micro-batch-size 1 >"$tmp/out" 2>&1 \
    || fail "training from the imported checkpoint: $(tail -3 "$tmp/out")"
  # A "gpus" schedule entry nothing fits is bad input, exit 2 like every schedule error (was 1).
  echo '[{"step": 0, "gpus": 1, "gpu_memory": "1KiB"}, {"step": 2, "stop": true}]' >"$tmp/i34-sched.json"
  expect_error "entry 0 (1 GPUs): no parallel config" "$T" run --schedule "$tmp/i34-sched.json" --log "$tmp/i34.jsonl" \
    --work-dir "$tmp/i34-w" -- true --model "$tmp/f.json"
}
# Issue 34 findings 2 and 5: `store serve` on a port in use, and on a disk directory.
issue34_serve() {
  "$T" store serve --listen 127.0.0.1:0 --transport none >"$tmp/d1" 2>/dev/null &
  local pid=$! port=""
  for _ in $(seq 100); do
    port=$(sed -n 's|.*serving http://127.0.0.1:\([0-9]*\) .*|\1|p' "$tmp/d1")
    [ -n "$port" ] && break; sleep 0.1
  done
  grep -q "(shm [^,]*, tmpfs, memory limit" "$tmp/d1" || [ ! -d /dev/shm ] || fail "no file system in: $(cat "$tmp/d1")"
  timeout 20 "$T" store serve --listen "127.0.0.1:$port" --transport none >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  { [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -qF "port $port is in use" "$tmp/err"; } \
    || fail "a second daemon on port $port: rc=$rc, stdout: $(cat "$tmp/out"), stderr: $(cat "$tmp/err")"
  kill "$pid"; wait "$pid"
  # A disk directory (a typo in --shm-dir) is refused, and not created; --allow-disk takes it.
  local disk=""
  for d in "$tmp" /var/tmp "$PWD"; do
    case "$(stat -f -c %T "$d" 2>/dev/null)" in tmpfs|ramfs|hugetlbfs|"") ;; *) [ -w "$d" ] && { disk="$d"; break; } ;; esac
  done
  if [ -z "$disk" ]; then echo "skip: no writable disk file system for the --shm-dir check"; return; fi
  local dir; dir=$(mktemp -u "$disk/tenplex-i34-XXXXXX")
  expect_error "--shm-dir $dir/store is on" "$T" store serve --listen 127.0.0.1:0 --transport none --shm-dir "$dir/store"
  grep -qF "not a memory file system (tmpfs, ramfs, hugetlbfs)" "$tmp/err" || fail "refusal: $(cat "$tmp/err")"
  [ ! -e "$dir" ] || fail "the refused --shm-dir was created"
  # tenplex run's embedded store too (--allow-disk as for serve).
  expect_error "--shm-dir $dir/run is on" "$T" run --schedule /dev/null --log "$tmp/run.jsonl" --shm-dir "$dir/run" -- true
  [ ! -e "$dir" ] || fail "tenplex run created the refused --shm-dir"
  "$T" store serve --listen 127.0.0.1:0 --transport none --shm-dir "$dir" --allow-disk >"$tmp/d2" 2>/dev/null &
  pid=$!
  for _ in $(seq 100); do grep -q serving "$tmp/d2" && break; sleep 0.1; done
  grep -qF "(shm $dir, " "$tmp/d2" && grep -qF "on disk by --allow-disk, memory limit" "$tmp/d2" || fail "--allow-disk: $(cat "$tmp/d2")"
  kill "$pid"; wait "$pid"
  rm -rf "$dir"
}
expect_error "unknown model preset 'gpt5'" "$T" layout --model gpt5 --config tp=1
expect_error "g % tp" "$T" layout --model gpt3-125m --config tp=5
expect_error "L % pp" "$T" layout --model gpt3-125m --config pp=5
expect_error "layers= sums to 13" "$T" layout --model gpt3-125m --config pp=2,layers=6+7
expect_error "unknown key 'xp'" "$T" layout --model gpt3-125m --config xp=2
expect_error "tp must be >= 1" "$T" layout --model gpt3-125m --config tp=0
echo '{"num_layers": 1, "tensors": [' > "$tmp/bad.json"
expect_error "not valid JSON" "$T" layout --model "$tmp/bad.json" --config tp=1
expect_error "No such file" "$T" layout --model "$tmp/missing.json" --config tp=1
expect_error "--num-query-groups" "$T" model gpt --num-layers 2 --hidden-size 16 --vocab-size 10 --num-attention-heads 4 --num-query-groups 3
expect_error "--params-dtype" "$T" model gpt --preset gpt3-125m --params-dtype fp8
# A valid model written to a file is read back by layout.
expect_ok "$T" model gpt --num-layers 2 --hidden-size 16 --num-attention-heads 4 --ffn-hidden-size 6 --vocab-size 512 -o "$tmp/f.json"
expect_error "f % tp" "$T" layout --model "$tmp/f.json" --config tp=4
expect_ok "$T" layout --model "$tmp/f.json" --config tp=2,pp=2,dp=2,zero=1 --json
"$T" layout --model "$tmp/f.json" --config tp=2,pp=2,dp=2,zero=1 --json | grep -q '"world_size":8' || { echo "FAIL: world_size"; fails=$((fails+1)); }
# Issue 16 bug 7: without --preset, the size arguments are required (it silently wrote
# a 2-layer model); option help has text and shows defaults.
expect_error "missing --num-layers, --hidden-size, --num-attention-heads, --vocab-size" "$T" model gpt
expect_error "missing --vocab-size" "$T" model gpt --num-layers 2 --hidden-size 16 --num-attention-heads 4
"$T" model gpt --help >"$tmp/help" 2>&1
for needle in "Transformer layers" "required without --preset" "Hidden size" "Vocabulary size" "INT=128" "TEXT=adam" "TEXT=fp32"; do
  grep -qF -- "$needle" "$tmp/help" || { echo "FAIL: model gpt --help lacks '$needle'"; fails=$((fails+1)); }
done
# Issue 16 bug 8: a pasted Megatron-LM argument block is accepted; --bf16 sets the
# params dtype, --group-query-attention/--num-query-groups the KV groups, --seq-length
# the positions when --max-position-embeddings is not given.
MEG=(--num-layers 2 --hidden-size 64 --num-attention-heads 8 --vocab-size 300
     --seq-length 1024 --micro-batch-size 4 --global-batch-size 8 --lr 0.00015 --min-lr 1.0e-5
     --lr-decay-style cosine --train-iters 500 --weight-decay 1e-2 --clip-grad 1.0 --bf16
     --group-query-attention --num-query-groups 2 --swiglu --untie-embeddings-and-output-weights
     --tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 --sequence-parallel
     --use-distributed-optimizer --data-path 0.5 a_text_document 0.5 b_text_document --split 949,50,1
     --tokenizer-type GPT2BPETokenizer --vocab-file v.json --merge-file m.txt --save-interval 100 --use-flash-attn)
expect_ok "$T" model gpt "${MEG[@]}" -o "$tmp/meg.json"
"$PY" - "$tmp/meg.json" <<'PY' || fails=$((fails+1))
import json, sys
m = json.load(open(sys.argv[1]))
t = {x["path"]: x for x in m["tensors"]}
qkv = t["decoder.layers.0.self_attention.linear_qkv.weight"]
assert qkv["dtype"] == "BF16", qkv["dtype"]
assert qkv["shape"] == [64 + 2 * 2 * 8, 64], qkv["shape"]  # 8 query heads of 8 + 2 KV groups * (k, v)
assert t["embedding.position_embeddings.weight"]["shape"] == [1024, 64]
assert "output_layer.weight" in t  # untied
assert t["decoder.layers.0.mlp.linear_fc1.weight"]["shape"][0] == 2 * 256  # swiglu: two halves
print("ok: Megatron-LM argument block -> bf16, 2 query groups, 1024 positions, untied, swiglu")
PY
# --group-query-attention alone: Megatron's default of one query group.
expect_ok "$T" model gpt --num-layers 1 --hidden-size 32 --num-attention-heads 4 --vocab-size 64 --group-query-attention -o "$tmp/mqa.json"
"$PY" -c "
import json, sys; m = json.load(open('$tmp/mqa.json'))
s = [t['shape'] for t in m['tensors'] if t['path'].endswith('linear_qkv.weight')][0]
sys.exit(0 if s == [32 + 2 * 8, 32] else 1)" || { echo "FAIL: --group-query-attention alone is not one group"; fails=$((fails+1)); }
# Unknown arguments: exit 2, listed in the order given (they were reversed, exit 106/109).
expect_error "unknown argument(s) for \`tenplex model gpt\`: --frobnicate 3 --zap" "$T" model gpt --num-layers 2 --hidden-size 16 --num-attention-heads 4 --vocab-size 10 --frobnicate 3 --zap
expect_error "--num-experts" "$T" model gpt --num-layers 2 --hidden-size 16 --num-attention-heads 4 --vocab-size 10 --num-experts 8
# Every argument error of every command exits 2 with a readable message and a --help pointer.
expect_error "unexpected argument(s): --bogus 1" "$T" layout --model gpt3-125m --config tp=1 --bogus 1
expect_error "see 'tenplex layout --help'" "$T" layout --model gpt3-125m --config tp=1 --bogus 1
expect_error "--config is required" "$T" layout --model gpt3-125m
expect_error "--job is required" "$T" store load --url http://127.0.0.1:1 --dir /tmp
expect_error "Could not convert: --seed" "$T" data batches --index x --seed notanumber --global-batch 8
expect_error "'tenplex store' needs a subcommand: serve, load, save, ls, rm" "$T" store
# Issue 34 item 9: a word that is no subcommand is named (it said "A subcommand is required").
expect_error "unknown subcommand 'lss' of 'tenplex store' (subcommands: serve, load, save, ls, rm)" "$T" store lss
expect_error "unknown subcommand 'bogus' of 'tenplex' (subcommands: model," "$T" bogus
expect_error "not in {ucx,none}" "$T" store serve --transport tcp
issue34_cli  # below
issue34_serve
"$T" --help >/dev/null 2>&1 || { echo "FAIL: tenplex --help exit $?"; fails=$((fails+1)); }
"$T" model gpt --help >/dev/null 2>&1 || { echo "FAIL: model gpt --help exit $?"; fails=$((fails+1)); }
echo "$((fails == 0 ? 1 : 0)) passed, $fails failed"
[ $fails -eq 0 ]
