#!/usr/bin/env bash
# Bad input to the CLI: a clear message on stderr and exit code 2, never a crash.
set -u
T="$1"
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
expect_error "--num-query-groups" "$T" model gpt --num-attention-heads 4 --num-query-groups 3
expect_error "--params-dtype" "$T" model gpt --params-dtype fp8
# A valid model written to a file is read back by layout.
expect_ok "$T" model gpt --num-layers 2 --hidden-size 16 --num-attention-heads 4 --ffn-hidden-size 6 -o "$tmp/f.json"
expect_error "f % tp" "$T" layout --model "$tmp/f.json" --config tp=4
expect_ok "$T" layout --model "$tmp/f.json" --config tp=2,pp=2,dp=2,zero=1 --json
"$T" layout --model "$tmp/f.json" --config tp=2,pp=2,dp=2,zero=1 --json | grep -q '"world_size":8' || { echo "FAIL: world_size"; fails=$((fails+1)); }
echo "$((fails == 0 ? 1 : 0)) passed, $fails failed"
[ $fails -eq 0 ]
