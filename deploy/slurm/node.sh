#!/bin/bash
# One node of an elastic tenplex job: starts this node's store daemon, waits until it
# answers, runs the torchrun agent (python -m torch.distributed.run) with train.py
# --elastic, and stops the daemon at the
# end. Run by tenplex-torchrun.sbatch through srun; it needs only environment variables,
# so it also runs by hand on any machine (docs/deploy.md):
#   TENPLEX_TOKEN, STORE_PORT, RDZV_ENDPOINT (host:port), RDZV_ID, RDZV_HOST_NODE (the
#   node name hosting the rendezvous, empty: none of this job), MIN_NODES, MAX_NODES,
#   NPROC, POLICY, TRAIN_ARGS, TENPLEX_REPO; optional NODE_ADDR (the address other
#   nodes reach this one at; default the first of `hostname -I`), TENPLEX (the CLI),
#   PYTHON, MONITOR_INTERVAL [5], MAX_RESTARTS [10], LAST_CALL [5], STORE_ARGS.
set -euo pipefail
: "${TENPLEX_TOKEN:?set TENPLEX_TOKEN (the bearer token of the daemons)}"
: "${RDZV_ENDPOINT:?set RDZV_ENDPOINT=host:port}" "${RDZV_ID:?set RDZV_ID}" "${POLICY:?set POLICY}"
repo=${TENPLEX_REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
tenplex=${TENPLEX:-$repo/build/bin/tenplex}
python=${PYTHON:-$repo/.venv/bin/python}
port=${STORE_PORT:-7480}
addr=${NODE_ADDR:-$(hostname -I | awk '{print $1}')}
export TENPLEX_TOKEN TENPLEX_BIN=$tenplex PYTHONPATH=$repo/python${PYTHONPATH:+:$PYTHONPATH}
# torch 2.x's torchrun shares the rendezvous TCPStore with the workers and then never
# publishes MASTER_ADDR for a later round, so a node joining a running job waits for it
# forever (docs/deploy.md): the opt-out keeps scale-up working.
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
# Other nodes use addr:port; this node's workers reach the same daemon on 127.0.0.1
# (loopback: tensors through shared memory).
export TENPLEX_STORE_URL="http://$addr:$port"
is_host=false
if [ -n "${RDZV_HOST_NODE:-}" ] && [ "$(hostname -s)" = "${RDZV_HOST_NODE%%.*}" ]; then is_host=true; fi

# shellcheck disable=SC2086
"$tenplex" store serve --listen "0.0.0.0:$port" ${STORE_ARGS:-} &
daemon=$!
trap 'kill "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  if curl -sf -H "Authorization: Bearer $TENPLEX_TOKEN" "http://127.0.0.1:$port/v1/health" >/dev/null; then break; fi
  kill -0 "$daemon" 2>/dev/null || { echo "node.sh: error: the store daemon exited" >&2; exit 1; }
  sleep 0.1
done

# shellcheck disable=SC2086
"$python" -m torch.distributed.run --nnodes="${MIN_NODES:-1}:${MAX_NODES:-1}" --nproc_per_node="${NPROC:-1}" \
  --rdzv_backend=c10d --rdzv_endpoint="$RDZV_ENDPOINT" --rdzv_id="$RDZV_ID" \
  --rdzv_conf="is_host=$is_host,last_call_timeout=${LAST_CALL:-5}" \
  --monitor_interval="${MONITOR_INTERVAL:-5}" --max_restarts="${MAX_RESTARTS:-10}" \
  "$repo/examples/gpt/train.py" --elastic "$POLICY" $TRAIN_ARGS
