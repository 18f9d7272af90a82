#!/usr/bin/env bash
# `tenplex simulate` through the real binary (issue 36, docs/scale.md): a prediction in
# text and JSON, and bad scenarios refused with a clear message and a non-zero exit.
set -u
T="$1"
PY=${TENPLEX_PYTHON:?the project interpreter (set by CMake: TENPLEX_PY)}
REPO=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails+1)); }
expect_error() {  # expect_error RC NEEDLE SCENARIO_TEXT
  local rc_want="$1" needle="$2"
  printf '%s' "$3" >"$tmp/s.json"
  "$T" simulate "$tmp/s.json" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ $rc -ne "$rc_want" ] || ! grep -qF -- "$needle" "$tmp/err"; then
    fail "$3 -> rc=$rc, stderr: $(cat "$tmp/err")"
  else
    echo "ok: $(head -1 "$tmp/err")"
  fi
}
seed="$REPO/tests/fuzz/tenplex_sim_scenario_fuzz"
# A prediction: text summary, and JSON whose per-host bytes add up to the plan's.
"$T" simulate "$seed/lost_straggler.json" >"$tmp/out" 2>"$tmp/err" || fail "simulate: $(cat "$tmp/err")"
grep -q "^predicted transform: " "$tmp/out" || fail "no prediction line: $(cat "$tmp/out")"
grep -q "1 lost" "$tmp/out" || fail "the lost host is not named: $(cat "$tmp/out")"
"$T" simulate "$seed/tiny.json" --json -o "$tmp/tiny.json" || fail "simulate --json"
"$PY" - "$tmp/tiny.json" <<'PY' || fail "JSON output"
import json, sys
j = json.load(open(sys.argv[1]))
hosts = j["hosts"]
assert [h["bytes_in"] for h in hosts] == [64, 64], hosts
assert sum(h["bytes_in"] for h in hosts) == j["plan"]["bytes_cross_host"], j["plan"]
p = j["prediction"]
assert p["total_seconds"] > 0 and p["critical_host"] in (0, 1), p
print("ok: --json: per-host bytes, prediction")
PY
# Bad input: exit 2 and the field named; a state no replica survives: the tensor named.
expect_error 2 "scenario is not valid JSON" '{"model": '
expect_error 2 "needs \"from\"" '{"model": "gpt3-125m", "to": {"config": "tp=1"}}'
expect_error 2 "cluster.nic_gbit_s must be > 0" '{"model": "gpt3-125m", "from": {"config": "tp=1"}, "to": {"config": "tp=2"}, "cluster": {"nic_gbit_s": -3}}'
expect_error 2 "to tp=5" '{"model": "gpt3-125m", "from": {"config": "tp=1"}, "to": {"config": "tp=5"}}'
expect_error 2 "16 ranks but the live hosts" '{"model": "gpt3-125m", "from": {"config": "tp=1"}, "to": {"config": "dp=16", "hosts": 1}}'
expect_error 2 "no surviving replica of" '{"model": "gpt3-125m", "from": {"config": "tp=2,pp=2", "gpus_per_host": 2}, "to": {"config": "tp=2", "gpus_per_host": 2}, "cluster": {"lost_hosts": [1]}}'
"$T" simulate "$tmp/none.json" >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "none.json" "$tmp/err" || fail "missing file: $(cat "$tmp/err")"
echo "$((fails == 0 ? 1 : 0)) passed, $fails failed"
[ $fails -eq 0 ]
