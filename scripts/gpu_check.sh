#!/usr/bin/env bash
# The GPU check of issue 30 (docs/gpu.md): run once on a machine with a GPU, in the repository
# root, without network:   bash scripts/gpu_check.sh OUTDIR
# Steps, each under a time limit (all within GPU_CHECK_BUDGET seconds, default 470); a failing
# step is recorded and the next one runs; the exit status is 1 when any failed:
#   a. env      nvidia-smi (+ topo -m), the GPU's NUMA node, ulimit -l, cores, memory, python,
#               torch, numpy, pybind11, gcc/nvcc/cmake/ninja versions          -> env.txt
#   b. build    the Debian packages of .gpu-deps/ (scripts/gpu_deps.sh on a dev machine)
#               unpacked with dpkg -x into /tmp/tenplex-prefix (never /), their pybind11
#               removed (pip's, for this Python, is used); CMake + Ninja build of _tenplex,
#               the CLI and tenplex_device_test with -DTENPLEX_CUDA=ON; a store round trip
#               (with ldd and the loaded libraries when it fails)             -> build.log
#   c. tests    tenplex_device_test (the engine on the CPU and CUDA backends)  -> tests.log
#   d. benches  bench/device_restore.py, bench/device_commit.py (every step and  -> bench.log,
#               every GPU_CHECK_EVERY steps)  device_restore_<dev>.csv,
#               device_commit_<dev>.csv, device_commit_<dev>_every<N>.csv
#   e. tests    tests/device_test.py, tests/device_run_test.py (--cuda on a GPU: -> tests.log
#               their CUDA parts)
#   f. train    examples/gpt/launch.py --device <dev>, 4 steps                  -> tests.log
#   g. membership tests/membership_gpu_check.py (issue 37: NCCL groups torn down -> tests.log
#               and re-made in-process across worlds, an abort, the state on the GPU kept)
# and summary.txt (every step's result and the benchmark tables): 8 files at most.
# Without a GPU (a dry run) the benches run small in their cpu mode. Environment:
#   GPU_CHECK_PY          interpreter (default python3: the GPU machine's torch venv)
#   GPU_CHECK_BUILD_DIR   CMake build directory (default /tmp/tenplex-build)
#   GPU_CHECK_SKIP_BUILD  1: use GPU_CHECK_BUILD_DIR and python/tenplex's module as they are
#   GPU_CHECK_SIZES       restore sizes in GB (default 1,4,16 on cuda, 0.05,0.2 on cpu)
#   GPU_CHECK_STAGED      the restore's staged variants (THREADSxCHUNK_MB, k for KiB)
#   GPU_CHECK_REGISTERED  the restore's registered variants (the same form)
#   GPU_CHECK_RESTORE_ARGS more arguments of bench/device_restore.py (e.g. --no-peers)
#   GPU_CHECK_COMMIT_STEPS, GPU_CHECK_EVERY  the commit bench's steps and interval
set -euo pipefail
OUT=${1:?usage: scripts/gpu_check.sh OUTDIR}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
PY=$(command -v "${GPU_CHECK_PY:-python3}") || { echo "gpu_check: no ${GPU_CHECK_PY:-python3}" >&2; exit 2; }
export PY B=${GPU_CHECK_BUILD_DIR:-/tmp/tenplex-build}
export PFX=/tmp/tenplex-prefix OUT
export P=$PFX/usr L=$PFX/usr/lib/x86_64-linux-gnu
export PYTHONPATH=$PWD/python PYTHONFAULTHANDLER=1 TENPLEX_PYTHON=$PY TENPLEX_BIN=$B/bin/tenplex
END=$(( $(date +%s) + ${GPU_CHECK_BUDGET:-470} ))
FAILED=()
: > "$OUT/summary.txt"
note() { echo "$*" | tee -a "$OUT/summary.txt"; }
# step NAME LIMIT_S LOG FUNCTION: runs the exported FUNCTION under a time limit (capped by
# what is left of the budget), its output appended to OUT/LOG; records the result.
step() {
  local name=$1 limit=$2 logf=$OUT/$3 fn=$4 left rc=0 t0
  left=$(( END - $(date +%s) - 10 ))
  (( limit > left )) && limit=$left
  if (( limit < 10 )); then note "SKIPPED $name: the time budget is spent"; FAILED+=("$name"); return 0; fi
  echo "=== $name (limit ${limit} s, $(date -u +%T))" >> "$logf"
  t0=$(date +%s)
  timeout -k 10 "$limit" bash -c "set -eo pipefail; $fn" >> "$logf" 2>&1 || rc=$?
  if (( rc == 0 )); then note "ok      $name ($(( $(date +%s) - t0 )) s)"
  else note "FAILED  $name (exit $rc$( (( rc == 124 )) && echo ', timed out'), $(( $(date +%s) - t0 )) s; see $3)"
       FAILED+=("$name"); fi
}
have() { command -v "$1" >/dev/null 2>&1; }

env_info() {
  echo "date: $(date -u '+%F %T UTC'); commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  if have nvidia-smi; then
    nvidia-smi || true; nvidia-smi topo -m || true
    nvidia-smi --query-gpu=name,pci.bus_id,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max \
      --format=csv || true
    for bus in $(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader); do
      bus=$(echo "${bus: -12}" | tr 'A-F' 'a-f')
      echo "GPU $bus NUMA node: $(cat "/sys/bus/pci/devices/$bus/numa_node" 2>/dev/null || echo unknown)"
    done
  else echo "nvidia-smi: not found (no GPU driver here)"; fi
  echo "ulimit -l: $(ulimit -l)"; echo "nproc: $(nproc)"; free -g; df -h /dev/shm /tmp
  lscpu | grep -Ei 'model name|numa' || true
  "$PY" -VV
  "$PY" -c 'import torch; c = torch.cuda.is_available(); print("torch", torch.__version__, "cuda", torch.version.cuda,
    "available", c, torch.cuda.get_device_name(0) if c else "")' || true
  "$PY" -c 'import numpy; print("numpy", numpy.__version__)' || echo "numpy: MISSING (tenplex.store needs it)"
  "$PY" -c 'import pybind11; print("pybind11", pybind11.__version__, pybind11.get_cmake_dir())' ||
    echo "pybind11: missing"
  for t in gcc nvcc cmake ninja; do echo "--- $t"; "$t" --version 2>&1 | head -4 || true; done
}
deps() {
  rm -rf "$PFX"
  if ! ls .gpu-deps/*.deb >/dev/null 2>&1; then echo "no .gpu-deps/*.deb: the system's packages"; return 0; fi
  mkdir -p "$PFX"
  local debs=(.gpu-deps/*.deb)
  for d in "${debs[@]}"; do dpkg -x "$d" "$PFX"; done
  # Debian's pybind11 (2.10) predates Python 3.12: pip's, of this Python, is used.
  rm -rf "$P/include/pybind11" "$P/lib/cmake/pybind11" "$P/share/cmake/pybind11" "$L/cmake/pybind11" \
    "$P/share/pkgconfig/pybind11.pc"
  # The image's own libssl.so.3/libcrypto.so.3 (Debian's removed after the first GPU run's
  # crashes; that alone did not stop them, see RT below).
  rm -f "$L"/libssl.so* "$L"/libcrypto.so*  # their .pc files stay: cpp-httplib.pc requires openssl
  rm -rf "$L/engines-3" "$L/ossl-modules"
  echo "unpacked ${#debs[@]} packages into $PFX"
  if ls .gpu-deps/*.whl >/dev/null 2>&1 && ! "$PY" -c 'import numpy' 2>/dev/null; then
    "$PY" -m pip install --no-index --no-deps --target "$PFX/py" .gpu-deps/*.whl || echo "pip: wheels not installed"
  fi
}
build() {
  local prefix=() pb
  pb=$("$PY" -m pybind11 --cmakedir)
  if [[ -d $P ]]; then prefix=(-DCMAKE_PREFIX_PATH="$pb;$P" -DPKG_CONFIG_EXECUTABLE="$P/bin/pkgconf")
  else prefix=(-DCMAKE_PREFIX_PATH="$pb"); fi
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTENPLEX_PY="$PY" "${prefix[@]}" \
    -DTENPLEX_BENCH=OFF -DTENPLEX_WERROR=OFF -DTENPLEX_CUDA=ON
  grep -E '^(pybind11_DIR|Python3_EXECUTABLE|CUDAToolkit_NVCC_EXECUTABLE)' "$B/CMakeCache.txt" || true
  ninja -C "$B" _tenplex tenplex
  ninja -C "$B" tenplex_device_test
}
smoke() {
  # tenplex before torch, as examples/gpt/launch.py imports them; then the HTTP client
  "$PY" -c 'import tenplex, hashlib, ssl, torch; print("import order tenplex, torch: ok")' || return 1
  if "$PY" -c 'import torch, tenplex
from tenplex import _tenplex
try:
    _tenplex.Store.connect("http://127.0.0.1:9", "")
except _tenplex.Error as e:
    print("client: refused as expected:", type(e).__name__)
st = tenplex.attach(); v = st.begin("j"); t = torch.arange(1000.0)
st.save_state("j", v, 0, {"t": t}); st.commit("j", v)
assert torch.equal(st.load_state("j", 0)["t"], t), "bytes differ"
print("round trip ok; cuda_built", _tenplex.cuda_built())
if torch.cuda.is_available():
    e = _tenplex.CopyEngine(backend="cuda"); print("engine:", e.backend, e.description)
    assert torch.equal(st.load_state("j", 0, device="cuda")["t"].cpu(), t), "device bytes differ"
    print("load_state onto cuda ok")'; then return 0; fi
  echo "--- the round trip failed: ldd of the module"
  ldd python/tenplex/_tenplex*.so || true
  echo "--- libraries a python that imports the module maps"
  "$PY" -c 'from tenplex import _tenplex; print(open("/proc/self/maps").read())' 2>&1 |
    grep -oE '/[^ ]*(libstdc\+\+|libgcc_s|libssl|libcrypto|libpython|libfmt|libspdlog|_tenplex)[^ ]*' | sort -u || true
  LD_DEBUG=libs "$PY" -c 'from tenplex import _tenplex' 2>&1 |
    grep -E 'calling init|find library=lib(stdc|ssl|crypto)' | head -40 || true
  return 1
}
cxx_tests() {
  [[ -x $B/bin/tenplex_device_test ]] || { echo "no $B/bin/tenplex_device_test"; return 1; }
  "$B/bin/tenplex_device_test"
}
py_tests() {  # on a GPU only the CUDA parts: CI runs the rest on every commit; fails when either file does
  local f rc=0
  for f in tests/device_test.py tests/device_run_test.py; do
    [[ -f $f ]] || { echo "$f absent: skipped"; continue; }
    if [[ $DEV == cuda ]]; then "$PY" "$f" --cuda || rc=1; else "$PY" "$f" || rc=1; fi
  done
  return $rc
}
restore_bench() {
  "$PY" bench/device_restore.py --device "$DEV" --sizes "$SIZES" --staged-variants "$STAGED" \
    --registered-variants "${GPU_CHECK_REGISTERED:-}" \
    --budget-s 6 --out "$OUT" ${GPU_CHECK_RESTORE_ARGS:-}
}
commit_bench() {  # every step, and every GPU_CHECK_EVERY steps (default 4)
  "$PY" bench/device_commit.py --device "$DEV" --out "$OUT" --steps "$COMMIT_STEPS"
  "$PY" bench/device_commit.py --device "$DEV" --out "$OUT" --steps "$COMMIT_STEPS" --every "${GPU_CHECK_EVERY:-4}" \
    --variants baseline,async,async-api
}
membership() {  # issue 37: NCCL groups re-made in one process across worlds, the GPU state kept
  if [[ $DEV == cuda ]]; then "$PY" tests/membership_gpu_check.py; else "$PY" tests/membership_gpu_check.py --cpu; fi
}
train() {
  grep -q -- '"--device"' examples/gpt/train.py || { echo "train.py has no --device: skipped"; return 0; }
  "$B/bin/tenplex" model gpt -o /tmp/gpu-check-model.json --num-layers 2 --hidden-size 64 \
    --num-attention-heads 4 --vocab-size 250 --max-position-embeddings 64
  "$PY" examples/gpt/launch.py --config tp=2 --model /tmp/gpu-check-model.json --steps 4 --seq-length 32 \
    --global-batch-size 4 --micro-batch-size 2 --timeout 120 --device "$DEV" --log /tmp/gpu-check-train.jsonl
  cat /tmp/gpu-check-train.jsonl; rm -f /tmp/gpu-check-train.jsonl
}
export -f env_info deps build smoke cxx_tests py_tests restore_bench commit_bench membership train have

step env 60 env.txt env_info
step deps 60 build.log deps
if [[ -d $P ]]; then  # the recipe that built on the GPU machine
  export CPATH=$P/include LIBRARY_PATH=$L
  export PKG_CONFIG_LIBDIR=$L/pkgconfig:$P/share/pkgconfig PKG_CONFIG_SYSROOT_DIR=$PFX
  # At run time only the libraries this image lacks come from the prefix (a folder of
  # links, RT): the whole prefix on LD_LIBRARY_PATH also put Debian's rdma-core, numa, nl
  # and OpenSSL in front of the image's own for torch and python, in the runs whose
  # processes crashed (free(): invalid pointer importing torch after tenplex; a segfault
  # in a Job's HTTP client; cause not established: our module loads no UCX, and the
  # pybind11 of torch and ours keep separate internals). pkgconf needs its library too.
  RT=$PFX/runtime; mkdir -p "$RT"
  for f in "$L"/lib{ucp,uct,ucs,ucm,spdlog,fmt,cpp-httplib,xxhash,fuse3,brotli,benchmark,pkgconf}*.so.*; do
    [[ -e $f ]] && ln -sf "$f" "$RT/"
  done
  export LD_LIBRARY_PATH=$RT${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} UCX_MODULE_DIR=$L/ucx
  [[ -d $PFX/py ]] && export PYTHONPATH=$PYTHONPATH:$PFX/py
fi
if [[ ${GPU_CHECK_SKIP_BUILD:-0} == 1 ]]; then note "skipped build: GPU_CHECK_SKIP_BUILD=1 ($B as it is)"
else step build 300 build.log build; fi
step smoke 60 build.log smoke
if "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  export DEV=cuda SIZES=${GPU_CHECK_SIZES:-1,4,16} COMMIT_STEPS=${GPU_CHECK_COMMIT_STEPS:-30} STAGED=${GPU_CHECK_STAGED:-8x16,12x32}
else
  export DEV=cpu SIZES=${GPU_CHECK_SIZES:-0.05,0.2} COMMIT_STEPS=8 STAGED=2x4
  note "torch sees no CUDA device: the benches and the training run on the cpu"
fi
# The figures first (the engine's C++ tests are quick), then the Python device tests.
step cxx_tests 60 tests.log cxx_tests
step device_restore 150 bench.log restore_bench
step device_commit 150 bench.log commit_bench
step py_tests 150 tests.log py_tests
step train 45 tests.log train
step membership 45 tests.log membership
# The benchmark tables, and every log cut to its last 4 MiB.
awk '/^(restore onto|commit every)/{p=1} /^\[device_(restore|commit)\] wrote/{p=0} p' "$OUT/bench.log" \
  >> "$OUT/summary.txt" 2>/dev/null || true
for f in "$OUT"/*.log "$OUT"/env.txt; do
  if [[ -f $f ]] && (( $(stat -c %s "$f") > 4194304 )); then tail -c 4194304 "$f" > "$f.tmp"; mv "$f.tmp" "$f"; fi
done
if (( ${#FAILED[@]} )); then note "gpu_check: FAILED: ${FAILED[*]}"; exit 1; fi
note "gpu_check: all steps passed"
