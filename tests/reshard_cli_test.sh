#!/usr/bin/env bash
# `tenplex plan`, `tenplex ckpt init|verify` and `tenplex reshard` through the real
# binary: round trips A -> B -> A are byte-identical (every rank file and tenplex.json),
# every element of every intermediate checkpoint equals its synthetic value, and bad
# inputs (missing rank file, wrong shape or dtype, mismatched --model/--from, truncated
# file) fail with a clear message, exit code 2 and no output directory left behind.
set -u
T="$1"
PY=${TENPLEX_PYTHON:?the project interpreter (set by CMake: TENPLEX_PY)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails+1)); }
expect_ok() {
  if ! "$@" >"$tmp/out" 2>"$tmp/err"; then fail "$* -> $(cat "$tmp/err")"; else echo "ok: $*"; fi
}
no_output() {  # no_output DIR: neither DIR nor any staging directory beside it exists
  if [ -e "$1" ] || compgen -G "$1.partial-*" >/dev/null; then fail "output $1 (or its staging dir) left behind"; fi
}
expect_error() {  # expect_error NEEDLE CMD... (the command writes --out "$tmp/OUT")
  local needle="$1"; shift
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ $rc -ne 2 ] || ! grep -qF -- "$needle" "$tmp/err"; then
    fail "$* -> rc=$rc, stderr: $(cat "$tmp/err")"
  else
    echo "ok: $* -> $(head -1 "$tmp/err")"
  fi
  no_output "$tmp/OUT"
}
same_dirs() {  # same_dirs A B: identical file lists and bytes
  if ! diff <(ls "$1") <(ls "$2") >/dev/null; then fail "$1 and $2 hold different files"; return; fi
  for f in "$1"/*; do cmp -s "$f" "$2/$(basename "$f")" || fail "$(basename "$f") differs between $1 and $2"; done
  echo "ok: $2 is byte-identical to $1"
}

M="$tmp/m.json"
expect_ok "$T" model gpt --num-layers 4 --hidden-size 16 --num-attention-heads 4 --num-query-groups 2 \
  --ffn-hidden-size 24 --vocab-size 101 --make-vocab-size-divisible-by 8 --max-position-embeddings 8 \
  --swiglu --params-dtype bf16 -o "$M"

# Plans: JSON per spec section 8, cross-host bytes at the lower bound.
"$T" plan --model "$M" --from tp=2,pp=2,dp=2 --to tp=2,pp=1,dp=3,zero=1 --gpus-per-host 2 --json >"$tmp/plan.json" \
  || fail "plan --json"
"$PY" - "$tmp/plan.json" <<'PY' || fail "plan JSON"
import json, sys
p = json.load(open(sys.argv[1]))
s = p["stats"]
keys = ["tensor", "global", "src_rank", "src_tensor", "src", "dst_rank", "dst_tensor", "dst", "src_layout"]
assert p["ops"] and all(all(k in op for k in keys) for op in p["ops"]), "op fields"
assert any(op["src_layout"] == "new" for op in p["ops"]), "host dedup ops"
assert s["bytes_cross_host"] == s["cross_host_lower_bound"] > 0, s
assert s["bytes_in_place"] + s["bytes_host_local"] + s["bytes_cross_host"] == s["bytes_total"], s
assert s["ops"] == len(p["ops"]), s
print("ok: plan JSON", {k: s[k] for k in ["bytes_total", "bytes_cross_host", "cross_host_lower_bound", "ops"]})
PY
"$T" plan --model "$M" --from tp=2,pp=2,dp=2 --to tp=2,pp=1,dp=3 --gpus-per-host 2 >"$tmp/summary" || fail "plan"
grep -q "lower bound .*met" "$tmp/summary" && grep -q "busiest host" "$tmp/summary" || fail "plan summary: $(cat "$tmp/summary")"

expect_error "--gpus-per-host must be at least 1" "$T" plan --model "$M" --from tp=2 --to tp=1 --gpus-per-host 0
expect_error "--to tp=4,pp=1,dp=1: tp=4 does not divide" "$T" plan --model "$M" --from tp=2 --to tp=4
expect_error "--from: config: unknown key 'xp'" "$T" plan --model "$M" --from xp=2 --to tp=1
expect_error "unknown model preset" "$T" plan --model gpt5 --from tp=1 --to tp=2

# Round trips through several layouts, content checked at every step.
expect_ok "$T" ckpt init --model "$M" --config tp=2,pp=2,dp=2 --out "$tmp/A" --seed 42
expect_ok "$T" ckpt verify --in "$tmp/A"
for B in "tp=2,pp=1,dp=1,zero=1" "tp=1,pp=3,layers=2+1+1,dp=3,zero=1" "tp=2,pp=4,dp=1"; do
  rm -rf "$tmp/B" "$tmp/A2"
  expect_ok "$T" reshard --in "$tmp/A" --to "$B" --out "$tmp/B" --model "$M" --from tp=2,pp=2,dp=2
  expect_ok "$T" ckpt verify --in "$tmp/B"
  expect_ok "$T" reshard --in "$tmp/B" --to tp=2,pp=2,dp=2 --out "$tmp/A2"
  same_dirs "$tmp/A" "$tmp/A2"
done

# Spec §9 uneven splits through the CLI: layout shapes, a plan at the lower bound,
# uneven -> even -> uneven reshards byte-identical with every element checked, errors.
U="tp=2,tp_weights=2+1,pp=2,dp=2,dp_weights=3+1"
"$T" layout --model "$M" --config "$U" --json >"$tmp/ulayout.json" || fail "layout $U"
"$T" plan --model "$M" --from "$U" --to tp=2,pp=1,dp=3,zero=1 --gpus-per-host 2 --json >"$tmp/uplan.json" \
  || fail "plan from $U"
"$PY" - "$tmp/ulayout.json" "$tmp/uplan.json" <<'PY' || fail "uneven layout/plan JSON"
import json, sys
l, p = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert l["config"] == "tp=2,pp=2,dp=2,tp_weights=2+1,dp_weights=3+1", l["config"]
shape = {(r["rank"], t["name"]): t["shape"] for r in l["ranks"] for t in r["tensors"]}
# f = 24 rows per SwiGLU block over 2+1: 16 + 8; 2 query groups of (4/2 + 2) * 4 = 16
# rows: 1 + 1; vocabulary Vp = 112 = 14 units of 8 rows: 9 + 5.
want = {(0, "decoder.layers.0.mlp.linear_fc1.weight"): [32, 16], (1, "decoder.layers.0.mlp.linear_fc1.weight"): [16, 16],
        (1, "decoder.layers.0.self_attention.linear_qkv.weight"): [16, 16],
        (0, "embedding.word_embeddings.weight"): [72, 16], (1, "embedding.word_embeddings.weight"): [40, 16]}
for k, v in want.items():
    assert shape[k] == v, (k, shape[k], v)
s = p["stats"]
assert s["bytes_cross_host"] == s["cross_host_lower_bound"] > 0, s
print("ok: uneven layout shapes and plan at the lower bound", s["bytes_cross_host"])
PY
expect_ok "$T" ckpt init --model "$M" --config "$U" --out "$tmp/U" --seed 7
expect_ok "$T" ckpt verify --in "$tmp/U"
for B in "tp=2,pp=2,dp=2" "tp=2,tp_weights=1+2,dp=2,zero=1"; do
  rm -rf "$tmp/UB" "$tmp/U2"
  expect_ok "$T" reshard --in "$tmp/U" --to "$B" --out "$tmp/UB" --model "$M" --from "$U"
  expect_ok "$T" ckpt verify --in "$tmp/UB"
  expect_ok "$T" reshard --in "$tmp/UB" --to "$U" --out "$tmp/U2"
  same_dirs "$tmp/U" "$tmp/U2"
done
expect_error "gives tp rank 1 no query groups of decoder.layers.0.self_attention.linear_qkv.weight" \
  "$T" layout --model "$M" --config tp=2,tp_weights=3+1
expect_error "tp_weights= lists 3 weights but tp=2" "$T" plan --model "$M" --from tp=2,tp_weights=1+1+1 --to tp=1
expect_error "tp rank" "$T" reshard --in "$tmp/U" --to tp=2,tp_weights=9+1 --out "$tmp/OUT"

# Bad inputs.
O=(--to tp=2,pp=1 --out "$tmp/OUT")
expect_error "does not match the checkpoint's model" "$T" reshard --in "$tmp/A" "${O[@]}" --model gpt3-125m
expect_error "is in config tp=2,pp=2,dp=2, not tp=2,pp=1,dp=1" "$T" reshard --in "$tmp/A" "${O[@]}" --from tp=2
expect_error "g % tp" "$T" reshard --in "$tmp/A" --to tp=4 --out "$tmp/OUT"
cp -r "$tmp/A" "$tmp/missing" && rm "$tmp/missing/rank-00005.safetensors"
expect_error "lacks rank-00005.safetensors" "$T" reshard --in "$tmp/missing" "${O[@]}"
# A rank file of a model with other shapes, then with another dtype.
"$T" model gpt --num-layers 4 --hidden-size 32 --num-attention-heads 4 --num-query-groups 2 --ffn-hidden-size 24 \
  --vocab-size 101 --make-vocab-size-divisible-by 8 --max-position-embeddings 8 --swiglu --params-dtype bf16 -o "$tmp/m32.json"
"$T" model gpt --num-layers 4 --hidden-size 16 --num-attention-heads 4 --num-query-groups 2 --ffn-hidden-size 24 \
  --vocab-size 101 --make-vocab-size-divisible-by 8 --max-position-embeddings 8 --swiglu -o "$tmp/mf32.json"
for other in m32 mf32; do
  expect_ok "$T" ckpt init --model "$tmp/$other.json" --config tp=2,pp=2,dp=2 --out "$tmp/$other"
  cp -r "$tmp/A" "$tmp/bad-$other" && cp "$tmp/$other/rank-00002.safetensors" "$tmp/bad-$other/"
  expect_error "but the layout needs" "$T" reshard --in "$tmp/bad-$other" "${O[@]}"
  expect_error "but the layout needs" "$T" reshard --in "$tmp/bad-$other" "${O[@]}" --no-verify
done
cp -r "$tmp/A" "$tmp/trunc" && truncate -s -64 "$tmp/trunc/rank-00001.safetensors"
expect_error "rank-00001.safetensors: safetensors" "$T" reshard --in "$tmp/trunc" "${O[@]}"
expect_error "rank-00001.safetensors: safetensors" "$T" reshard --in "$tmp/trunc" "${O[@]}" --no-verify
# A flipped byte in the data: only the checksum sees it.
cp -r "$tmp/A" "$tmp/flip"
f="$tmp/flip/rank-00004.safetensors"
printf '\x7f' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") - 3 )) conv=notrunc status=none
expect_error "does not match the recorded" "$T" reshard --in "$tmp/flip" "${O[@]}"
expect_error "does not match the recorded" "$T" ckpt verify --in "$tmp/flip"
expect_error "tenplex.json is missing" "$T" reshard --in "$tmp/nothing" "${O[@]}"
mkdir "$tmp/full" && touch "$tmp/full/x"
"$T" reshard --in "$tmp/A" --to tp=2 --out "$tmp/full" >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "already exists" "$tmp/err" && [ -e "$tmp/full/x" ] || fail "existing output: $(cat "$tmp/err")"
echo "$((fails == 0 ? 1 : 0)) passed, $fails failed"
[ $fails -eq 0 ]
