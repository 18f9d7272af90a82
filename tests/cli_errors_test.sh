#!/usr/bin/env bash
# Bad input to the CLI: a clear message on stderr and exit code 2, never a crash.
set -u
T="$1"
PY=${TENPLEX_PYTHON:?the project interpreter (set by CMake: TENPLEX_PY)}
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
expect_error "A subcommand is required" "$T" store
expect_error "not in {ucx,none}" "$T" store serve --transport tcp
"$T" --help >/dev/null 2>&1 || { echo "FAIL: tenplex --help exit $?"; fails=$((fails+1)); }
"$T" model gpt --help >/dev/null 2>&1 || { echo "FAIL: model gpt --help exit $?"; fails=$((fails+1)); }
echo "$((fails == 0 ? 1 : 0)) passed, $fails failed"
[ $fails -eq 0 ]
