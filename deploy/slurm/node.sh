#!/bin/bash
# One node of an elastic tenplex job: starts this node's store daemon (state in a
# --shm-dir under /dev/shm, kept across daemon restarts), waits until it answers, runs
# the torchrun agent (python -m torch.distributed.run) with examples/gpt/train.py
# --elastic, and stops the daemon at the end. tenplex-torchrun.sbatch runs it through
# srun; it needs only environment variables, so it also runs by hand on any machine
# (docs/deploy.md, "node.sh by hand").
#
# Required:
#   TENPLEX_TOKEN   the daemons' bearer token (the same on every node; e.g.
#                   TENPLEX_TOKEN=$(cat ~/.tenplex/token))
#   RDZV_ENDPOINT   host:port of the c10d rendezvous, or of the etcd server (its client
#                   URL's) with RDZV_BACKEND=etcd-v2 (the same on every node)
#   RDZV_ID         the rendezvous id (the same on every node of one job)
#   POLICY          the policy: a JSON file or text mapping world sizes to configs
#   TRAIN_ARGS      train.py's arguments after --elastic POLICY, e.g.
#                   "--job gpt --model gpt.json --steps 1000 --commit-every 100"
# Optional [default]:
#   RDZV_BACKEND [c10d]  c10d: the rendezvous is served by one node's agent, the job ends
#                   with that node; etcd-v2: by an etcd server (`etcd --enable-v2`) on a
#                   machine the job does not lose (or a 3-member etcd cluster): any node
#                   may die (docs/deploy.md; needs python-etcd in PYTHON's environment)
#   RDZV_HOST_NODE  (c10d only) the short host name of the node hosting the rendezvous: that node
#                   gets is_host=true, every other one is_host=false; set but empty: no
#                   node of this job hosts it (a joining job) [unset: torchrun decides
#                   from RDZV_ENDPOINT's host, which must then name this machine]
#   MIN_NODES [1], MAX_NODES [1], NPROC [1] (workers per node, one per GPU)
#   STORE_PORT [7480]  the daemon's port (every node to every node)
#   NODE_ADDR [the first address of `hostname -I`]  where other nodes reach this one
#   SHM_DIR [/dev/shm/tenplex-USER-STORE_PORT]  the daemon's state
#   STORE_ARGS []   more `tenplex store serve` arguments (e.g. --memory-limit 64G)
#   TENPLEX_REPO [this script's checkout]  where examples/gpt/train.py is
#   TENPLEX [TENPLEX_REPO/build/bin/tenplex, else tenplex on PATH]  the CLI
#   PYTHON [TENPLEX_REPO/.venv/bin/python, else python3]  the environment with torch
#   MONITOR_INTERVAL [1], LAST_CALL [5]  torchrun's monitor tick and the rendezvous'
#                   last call (seconds; torchrun's own 30 s last call doubles recovery)
#   KEEP_ALIVE_INTERVAL [5], KEEP_ALIVE_MAX_ATTEMPT [3]  (c10d only) a node silent for
#                   their product in seconds leaves the rendezvous: what a lost node costs
#                   before the survivors restart (torchrun's defaults; lower on a quiet network)
#   MAX_RESTARTS [10]
#   TENPLEX_FATAL_FILE [a temp file, removed at the end]  where a worker records an
#                   unrecoverable loss (tenplex.elastic)
# Exit status: torchrun's (0: the job finished on this node), or 76 (tenplex.elastic's
# FATAL_EXIT_STATUS) when a worker of this node stopped the job on an unrecoverable loss
# (its message is printed again at the end); a failure names its reason.
set -euo pipefail
need="(docs/deploy.md, \"node.sh by hand\"; the header of $0 lists every variable)"
: "${TENPLEX_TOKEN:?set TENPLEX_TOKEN, the bearer token of the daemons $need}"
: "${RDZV_ENDPOINT:?set RDZV_ENDPOINT=host:port of the rendezvous $need}"
: "${RDZV_ID:?set RDZV_ID, the rendezvous id $need}"
: "${POLICY:?set POLICY, the policy file or text $need}"
: "${TRAIN_ARGS:?set TRAIN_ARGS, train.py arguments such as --job gpt --model gpt.json --steps 1000 $need}"
repo=${TENPLEX_REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
tenplex=${TENPLEX:-$repo/build/bin/tenplex}
[ -x "$tenplex" ] || tenplex=$(command -v tenplex) || {
  echo "node.sh: error: no tenplex CLI at $repo/build/bin/tenplex or on PATH (set TENPLEX)" >&2
  exit 2
}
python=${PYTHON:-$repo/.venv/bin/python}
[ -x "$python" ] || python=python3
port=${STORE_PORT:-7480}
addr=${NODE_ADDR:-$(hostname -I | awk '{print $1}')}
shm_dir=${SHM_DIR:-/dev/shm/tenplex-$(id -un)-$port}
export TENPLEX_TOKEN TENPLEX_BIN=$tenplex PYTHONPATH=$repo/python${PYTHONPATH:+:$PYTHONPATH}
# torch 2.x's torchrun shares the rendezvous TCPStore with the workers and then never
# publishes MASTER_ADDR for a later round, so a node joining a running job waits for it
# forever (docs/deploy.md): the opt-out keeps scale-up working.
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
# UCX 1.22 (the data plane's wheel) patches code for its memory hooks at every process
# start (~0.4 s); patching relocations gives the same events at once (docs/transport.md).
export UCX_MEM_MMAP_HOOK_MODE=${UCX_MEM_MMAP_HOOK_MODE:-reloc}
# Other nodes use addr:port; this node's workers reach the same daemon on 127.0.0.1
# (loopback: tensors through shared memory).
export TENPLEX_STORE_URL="http://$addr:$port"
backend=${RDZV_BACKEND:-c10d}
case "$backend" in
  c10d | etcd-v2) ;;
  *) echo "node.sh: error: RDZV_BACKEND=$backend is not a rendezvous this script runs: c10d or etcd-v2 $need" >&2
     exit 2 ;;
esac
conf="last_call_timeout=${LAST_CALL:-5}"
if [ "$backend" = c10d ] && [ -n "${RDZV_HOST_NODE+set}" ]; then
  is_host=false
  if [ -n "$RDZV_HOST_NODE" ] && [ "$(hostname -s)" = "${RDZV_HOST_NODE%%.*}" ]; then is_host=true; fi
  conf="is_host=$is_host,$conf"
fi
if [ "$backend" = c10d ]; then
  conf="$conf,keep_alive_interval=${KEEP_ALIVE_INTERVAL:-5},keep_alive_max_attempt=${KEEP_ALIVE_MAX_ATTEMPT:-3}"
fi

mkdir -p "$shm_dir"
# shellcheck disable=SC2086
"$tenplex" store serve --listen "0.0.0.0:$port" --shm-dir "$shm_dir" ${STORE_ARGS:-} &
daemon=$!
trap 'kill "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  if "$tenplex" store ls --url "http://127.0.0.1:$port" >/dev/null 2>&1; then break; fi
  kill -0 "$daemon" 2>/dev/null || { echo "node.sh: error: the store daemon exited (see its message above)" >&2; exit 1; }
  sleep 0.1
done

# A worker that meets an unrecoverable loss writes its message here and stops the agent
# (tenplex.elastic, FATAL_EXIT_STATUS): reported below, with that status.
given_fatal=${TENPLEX_FATAL_FILE:-}
fatal_file=${given_fatal:-$(mktemp -u "${TMPDIR:-/tmp}/tenplex-fatal-XXXXXX")}
export TENPLEX_FATAL_FILE=$fatal_file
rc=0
# shellcheck disable=SC2086
"$python" -m torch.distributed.run --nnodes="${MIN_NODES:-1}:${MAX_NODES:-1}" --nproc_per_node="${NPROC:-1}" \
  --rdzv_backend="$backend" --rdzv_endpoint="$RDZV_ENDPOINT" --rdzv_id="$RDZV_ID" --rdzv_conf="$conf" \
  --monitor_interval="${MONITOR_INTERVAL:-1}" --max_restarts="${MAX_RESTARTS:-10}" \
  "$repo/examples/gpt/train.py" --elastic "$POLICY" $TRAIN_ARGS || rc=$?
if [ -s "$fatal_file" ]; then
  rc=76  # tenplex.elastic.FATAL_EXIT_STATUS
  echo "node.sh: the job stopped for good on an unrecoverable loss (exit status $rc; restarting" \
    "it does not help): $(cat "$fatal_file")" >&2
  [ -n "$given_fatal" ] || rm -f "$fatal_file"
elif [ "$rc" -ne 0 ]; then
  echo "node.sh: torchrun exited with status $rc on $(hostname -s); the committed state stays in" \
    "the daemons (tenplex store ls --cluster ...): see docs/deploy.md, \"Limits\"" >&2
fi
exit "$rc"
