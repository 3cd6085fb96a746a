#!/usr/bin/env bash
# scripts/gpu-check.sh OUTDIR — the one-shot GPU check (docs/gpu-check.md).
#
# On a machine with one GPU: builds stitch in Release with the CUDA back end (sm_90) into
# build-gpu, runs the whole ctest suite (CUDA tests included), runs stitch_gpu_bench (stitch vs
# cudaMalloc, cudaMallocAsync and PyTorch's allocator; raw VMM costs; the cost of a stitch, of
# a compaction and of sleep and wake, their own step lines "stitch-cost", "compaction-cost" and
# "sleep-cost", from the same run and JSON; the CUDA tests include a CUDA graph replayed over
# tagged tensors before a sleep and after the wake; the "disk" step backs tagged memory up
# through files of backup_dir and back, against the file system's own bandwidth) and writes
# OUTDIR/report.md next to the raw numbers (gpu_bench*.json) and the logs.
# Meant to finish within 8 minutes on an H200. It goes on past a failing step, records it in the
# report, and exits non-zero at the end if any step failed (1) or no GPU was found (2).
#
#   scripts/gpu-check.sh OUTDIR            run the check
#   scripts/gpu-check.sh --fetch-deps [D]  (on a machine with Debian's package lists) download the
#                                          .deb files of GoogleTest, Google Benchmark and fmt into
#                                          D (default .gpudeps/); the check unpacks them when the
#                                          GPU machine lacks those packages
#
# Environment: STITCH_GPU_BUILD_DIR (default build-gpu), STITCH_GPU_CHECK_BUDGET (seconds for
# the whole check, default 470; 1500 with fewer than 8 CPUs), STITCH_GPU_CHECK_JOBS (default: number of CPUs, at most 16),
# STITCH_GPU_BENCH_MIN_TIME (default 0.1), STITCH_GPU_DEPS (default .gpudeps),
# STITCH_GPU_TORCH_PYTHON (the python3 whose torch the PyTorch peer is built against).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEPS_PACKAGES=(libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian libfmt-dev libfmt9 ninja-build)

usage() {  # the header comment above
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"
}

fetch_deps() {
  local dir=${1:-$ROOT/.gpudeps}
  mkdir -p "$dir" || exit 1
  echo "gpu-check: downloading ${DEPS_PACKAGES[*]} into $dir"
  if ! (cd "$dir" && apt-get download "${DEPS_PACKAGES[@]}"); then
    echo "gpu-check: apt-get download failed (run apt-get update first?)" >&2
    exit 1
  fi
  local exclude
  exclude=$(git -C "$ROOT" rev-parse --git-path info/exclude 2>/dev/null) || exclude=""
  if [ -n "$exclude" ] && [ "$dir" = "$ROOT/.gpudeps" ] && ! grep -qx '/.gpudeps/' "$exclude" 2>/dev/null; then
    case "$exclude" in /*) ;; *) exclude=$ROOT/$exclude ;; esac
    mkdir -p "$(dirname "$exclude")" && echo '/.gpudeps/' >>"$exclude" &&
      echo "gpu-check: added /.gpudeps/ to $exclude (local to this checkout, not committed)"
  fi
  ls -l "$dir"
  echo "gpu-check: carry .gpudeps to the GPU machine (device tool: carry [\".gpudeps\"])"
}

case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  --fetch-deps) fetch_deps "${2:-}"; exit $? ;;
  "") usage >&2; exit 64 ;;
esac
[ $# -eq 1 ] || { usage >&2; exit 64; }

mkdir -p "$1" || { echo "gpu-check: cannot create $1" >&2; exit 1; }
OUT=$(cd "$1" && pwd)
cd "$ROOT" || exit 1

BUILD=${STITCH_GPU_BUILD_DIR:-$ROOT/build-gpu}
MIN_TIME=${STITCH_GPU_BENCH_MIN_TIME:-0.1}
DEPS_DIR=${STITCH_GPU_DEPS:-$ROOT/.gpudeps}
cpus=$(nproc 2>/dev/null || echo 4)
JOBS=${STITCH_GPU_CHECK_JOBS:-$((cpus < 16 ? cpus : 16))}
# 8 minutes is the target on a GPU machine (16 CPUs); a small machine only builds slower.
if [ "$cpus" -ge 8 ]; then default_budget=470; else default_budget=1500; fi
BUDGET=${STITCH_GPU_CHECK_BUDGET:-$default_budget}
START=$SECONDS
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
STEPS=$WORK/steps.tsv
: >"$STEPS"
BUILD_LOG=$OUT/build.log
CTEST_LOG=$OUT/ctest.log
BENCH_LOG=$OUT/bench.log
SMI=$WORK/nvidia-smi.txt  # copied into report.md, not a file of its own
TRAIN_LOG=$WORK/train.log  # the PyTorch example's runs, then the deliberate OOM: appended to bench.log
BENCH=$BUILD/benchmarks/gpu/stitch_gpu_bench
# Only what this run writes is in OUTDIR afterwards: at most 8 files (report.md, three
# gpu_bench*.json, costs.json, three logs), what the device tool brings back.
rm -f "$OUT"/report.md "$OUT"/gpu_bench*.json "$OUT"/costs.json "$BUILD_LOG" "$CTEST_LOG" "$BENCH_LOG" \
  "$OUT"/train.log "$OUT"/nvidia-smi.txt "$OUT"/oom.log

failures=0
say() { echo "gpu-check [$((SECONDS - START))s]: $*"; }
# record STEP STATUS SECONDS DETAIL — STATUS ok|skipped count as fine, anything else as a failure.
record() {
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$(printf '%s' "$4" | tr '\t\n' '  ')" >>"$STEPS"
  case "$2" in ok|skipped) ;; *) failures=$((failures + 1)) ;; esac
  say "$1: $2${4:+ ($4)}"
}
remaining() { echo $((BUDGET - (SECONDS - START))); }
# cost_status STEP FLAG: records STEP from `gpu_report.py FLAG JSON...` ('STATUS<TAB>DETAIL').
cost_status() {
  local st=""
  [ ${#bench_json[@]} -gt 0 ] && [ -n "$PYTHON" ] &&
    st=$(timeout 30 "$PYTHON" "$ROOT/scripts/gpu_report.py" "$2" "${bench_json[@]}" 2>&1)
  case "$st" in
    ok$'\t'*|failed$'\t'*) record "$1" "${st%%$'\t'*}" 0 "${st#*$'\t'}" ;;
    *) record "$1" failed 0 "no status (no benchmark JSON or python3): $(echo "$st" | tail -1)" ;;
  esac
}
# limit WANTED RESERVE: WANTED seconds, or less so that RESERVE seconds stay for later steps.
limit() {
  local r=$(($(remaining) - $2))
  [ "$r" -lt "$1" ] && echo $((r > 10 ? r : 10)) || echo "$1"
}
status_of_rc() { case "$1" in 0) echo ok ;; 124|137) echo timeout ;; *) echo failed ;; esac; }
# record_result STEP LOG T0 RC: records STEP (a test program's step that began at T0 and ended
# with RC) with the JSON of its "RESULT STEP {...}" line in LOG as the detail, or as skipped when
# it skipped itself without one.
record_result() {
  local result skipped
  result=$(grep -m1 "^RESULT $1 " "$2" | sed "s/^RESULT $1 //")
  skipped=$(grep -m1 -o -i 'skipped.*' "$2" | head -c 200)
  if [ "$4" -eq 0 ] && [ -z "$result" ] && [ -n "$skipped" ]; then
    record "$1" skipped $((SECONDS - $3)) "$skipped"
  else
    record "$1" "$(status_of_rc "$4")" $((SECONDS - $3)) "${result:-no RESULT line (rc=$4); see spill.log}"
  fi
}

say "stitch GPU check: output in $OUT, build in $BUILD, budget ${BUDGET}s, $JOBS jobs"

# ---- 1. the GPU, as the driver sees it --------------------------------------------------------
t0=$SECONDS
if command -v nvidia-smi >/dev/null 2>&1; then
  timeout 60 nvidia-smi >"$SMI" 2>&1
  rc=$?
  { echo; timeout 30 nvidia-smi -L; } >>"$SMI" 2>&1
  record nvidia-smi "$(status_of_rc $rc)" $((SECONDS - t0)) "$(grep -m1 '^GPU 0' "$SMI" || echo "rc=$rc")"
else
  echo "nvidia-smi: not found" >"$SMI"
  record nvidia-smi failed 0 "nvidia-smi not found"
fi

# ---- 2. tools and dependencies ------------------------------------------------------------------
NVCC=$(command -v nvcc || true)
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
keep_going=(-k)
[ ${#GEN[@]} -gt 0 ] && keep_going=(-k 0)
PYTHON=$(command -v python3 || true)
TORCH_PYTHON=${STITCH_GPU_TORCH_PYTHON:-$PYTHON}
{
  echo "== tools"
  echo "cmake: $(command -v cmake) $(cmake --version 2>/dev/null | head -1)"
  echo "c++: $(command -v c++) $(c++ --version 2>/dev/null | head -1)"
  echo "nvcc: ${NVCC:-not found} $("${NVCC:-false}" --version 2>/dev/null | tail -1)"
  echo "generator: ${GEN[*]:-default}; python3: ${PYTHON:-not found}"
} >>"$BUILD_LOG" 2>&1

# Debian packages carried in $DEPS_DIR, unpacked on first need into $BUILD/_deps.
DEPS_ARGS=()
deps_available() { compgen -G "$DEPS_DIR/*.deb" >/dev/null; }
unpack_deps() {
  local root=$BUILD/_deps deb
  rm -rf "$root" && mkdir -p "$root" || return 1
  for deb in "$DEPS_DIR"/*.deb; do
    if command -v dpkg >/dev/null 2>&1; then
      dpkg -x "$deb" "$root" || return 1
    else
      (cd "$WORK" && rm -f data.tar.* && ar x "$deb" && tar -xf data.tar.* -C "$root") || return 1
    fi
  done
  DEPS_ARGS=(-DCMAKE_PREFIX_PATH="$root/usr")
  # ninja (ninja-build), which torch.utils.cpp_extension needs to build the native backend.
  [ -x "$root/usr/bin/ninja" ] && export PATH="$root/usr/bin:$PATH"
  local d
  for pkg in GTest benchmark fmt; do
    d=$(find "$root/usr" -type d -path "*/cmake/$pkg" 2>/dev/null | head -1)
    [ -n "$d" ] && DEPS_ARGS+=("-D${pkg}_DIR=$d")
  done
  echo "== unpacked $(ls "$DEPS_DIR"/*.deb | wc -l) packages from $DEPS_DIR: ${DEPS_ARGS[*]}" >>"$BUILD_LOG"
}

# ---- 3. configure (fallbacks: carried dependencies, then no PyTorch peer) -------------------------
TORCH_MODE=AUTO
configure() {  # configure LIMIT: uses TORCH_MODE and DEPS_ARGS; keeps an existing build (incremental)
  echo "== configure (torch peer $TORCH_MODE${DEPS_ARGS[*]:+, carried dependencies})" >>"$BUILD_LOG"
  local args=(-S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DSTITCH_WITH_CUDA=ON
              -DCMAKE_CUDA_ARCHITECTURES=90 -DSTITCH_BENCH_TORCH="$TORCH_MODE"
              -DCMAKE_POLICY_VERSION_MINIMUM=3.5 "${DEPS_ARGS[@]}")
  [ -n "$NVCC" ] && args+=(-DCMAKE_CUDA_COMPILER="$NVCC" -DCUDAToolkit_ROOT="$(dirname "$(dirname "$NVCC")")")
  [ -n "$TORCH_PYTHON" ] && args+=(-DSTITCH_BENCH_PYTHON="$TORCH_PYTHON")
  timeout --kill-after=10 "$1" cmake "${args[@]}" >>"$BUILD_LOG" 2>&1
}
t0=$SECONDS
configured=no
detail=""
# A build directory left by another generator cannot be reused.
want_gen=${GEN[1]:-Unix Makefiles}
if [ -f "$BUILD/CMakeCache.txt" ] &&
   ! grep -qx "CMAKE_GENERATOR:INTERNAL=$want_gen" "$BUILD/CMakeCache.txt"; then
  rm -rf "$BUILD/CMakeCache.txt" "$BUILD/CMakeFiles"
fi
configure "$(limit 240 300)"
rc=$?
if [ $rc -ne 0 ] && deps_available; then
  say "configure failed (rc=$rc); retrying with the dependencies carried in $DEPS_DIR"
  if unpack_deps; then
    configure "$(limit 240 300)"
    rc=$?
    detail="carried dependencies"
  else
    echo "== unpacking $DEPS_DIR failed" >>"$BUILD_LOG"
  fi
fi
if [ $rc -ne 0 ]; then
  say "configure failed (rc=$rc); retrying without the PyTorch peer"
  TORCH_MODE=OFF
  configure "$(limit 120 270)"
  rc=$?
  detail="${detail:+$detail, }PyTorch peer off after a failed configure"
fi
[ $rc -eq 0 ] && configured=yes
torch_line=$(grep -h "stitch: stitch_gpu_bench with" "$BUILD_LOG" | tail -1 | sed 's/^-- stitch: //')
if [ $rc -ne 0 ] && ! deps_available; then
  detail="${detail:+$detail; }no carried dependencies in $DEPS_DIR (see docs/gpu-check.md)"
fi
record configure "$(status_of_rc $rc)" $((SECONDS - t0)) "${detail:+$detail; }${torch_line:-see build.log}"

torch_built() { grep -q "built against torch" "$BUILD/benchmarks/gpu/gpu_bench_config.h" 2>/dev/null; }
# build LIMIT: the GPU binaries first (so they exist even if the rest runs out of time), then all.
build() {
  timeout --kill-after=10 "$1" bash -c 'cmake --build "$1" -j"$2" --target stitch_gpu_bench stitch_cuda_tests;
    cmake --build "$1" -j"$2"' build "$BUILD" "$JOBS" >>"$BUILD_LOG" 2>&1
}

# ---- 4. build (fallbacks: no PyTorch peer, then build what builds) --------------------------------
t0=$SECONDS
if [ $configured = yes ]; then
  echo "== build" >>"$BUILD_LOG"
  build "$(limit 360 180)"
  rc=$?
  detail=""
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && torch_built; then
    say "build failed (rc=$rc); rebuilding without the PyTorch peer"
    TORCH_MODE=OFF
    if configure "$(limit 120 240)"; then
      echo "== build (PyTorch peer off)" >>"$BUILD_LOG"
      build "$(limit 300 180)"
      rc=$?
    fi
    detail="PyTorch peer off after a failed build"
  fi
  if [ $rc -ne 0 ] && [ $rc -ne 124 ]; then
    echo "== build what builds (keep going)" >>"$BUILD_LOG"
    timeout --kill-after=10 "$(limit 240 170)" cmake --build "$BUILD" -j"$JOBS" -- "${keep_going[@]}" >>"$BUILD_LOG" 2>&1
    detail="${detail:+$detail; }kept going past errors: $(grep -c -E 'error:|Error [0-9]|FAILED:' "$BUILD_LOG") error lines in build.log"
  fi
  record build "$(status_of_rc $rc)" $((SECONDS - t0)) "$detail"
else
  record build skipped 0 "not configured"
fi

# ---- 5. is there a device? (cudaGetDeviceCount, through the bench binary) ------------------------
have_gpu=no
no_gpu_reason=""
if [ -x "$BENCH" ]; then
  dc=$(timeout 120 "$BENCH" --stitch_device_check 2>&1)
  rc=$?
  echo "== device check: $dc (rc=$rc)" >>"$BUILD_LOG"
  case $rc in
    0) have_gpu=yes ;;
    2) no_gpu_reason=$(echo "$dc" | grep -m1 '^no CUDA device' | sed 's/^no CUDA device: //') ;;
    *) no_gpu_reason="stitch_gpu_bench --stitch_device_check failed (rc=$rc): $(echo "$dc" | tail -1)" ;;
  esac
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  have_gpu=yes  # the bench binary did not build; nvidia-smi sees a GPU
else
  no_gpu_reason="no stitch_gpu_bench to ask cudaGetDeviceCount, and nvidia-smi lists no GPU"
fi
if [ $have_gpu = yes ]; then
  record gpu ok 0 "$(echo "${dc:-nvidia-smi lists a GPU}" | head -1)"
else
  record gpu "no-gpu" 0 "$no_gpu_reason"
fi

# ---- 6. the whole test suite ----------------------------------------------------------------------
t0=$SECONDS
if [ -f "$BUILD/CTestTestfile.cmake" ]; then
  timeout --kill-after=15 "$(limit 240 130)" \
    ctest --test-dir "$BUILD" --output-on-failure -j"$JOBS" --timeout 300 >"$CTEST_LOG" 2>&1
  rc=$?
  summary=$(grep -E '^[0-9]+% tests passed' "$CTEST_LOG" | tail -1)
  skipped=$(grep -c '(Skipped)' "$CTEST_LOG")
  record ctest "$(status_of_rc $rc)" $((SECONDS - t0)) "${summary:-no summary (rc=$rc)}; $skipped skipped"
else
  echo "ctest: not run (nothing configured)" >"$CTEST_LOG"
  record ctest skipped 0 "nothing configured"
fi

# ---- 7. the benchmarks ----------------------------------------------------------------------------
t0=$SECONDS
bench_json=()
if [ ! -x "$BENCH" ]; then
  record bench failed 0 "stitch_gpu_bench was not built"
elif [ $have_gpu = no ]; then
  timeout 60 "$BENCH" --benchmark_min_time="$MIN_TIME" --benchmark_out="$OUT/gpu_bench.json" \
    --benchmark_out_format=json >"$BENCH_LOG" 2>&1
  rc=$?
  [ -s "$OUT/gpu_bench.json" ] && bench_json+=("$OUT/gpu_bench.json")
  if [ $rc -eq 0 ]; then
    record bench skipped $((SECONDS - t0)) "$(head -1 "$BENCH_LOG")"
    record stitch-cost skipped 0 "needs a GPU"
    record compaction-cost skipped 0 "needs a GPU"
    record sleep-cost skipped 0 "needs a GPU"
  else
    record bench "$(status_of_rc $rc)" $((SECONDS - t0)) "rc=$rc without a GPU (expected 0)"
  fi
else
  echo "== stitch_gpu_bench --benchmark_min_time=$MIN_TIME" >"$BENCH_LOG"
  timeout --kill-after=15 "$(limit 300 60)" "$BENCH" --benchmark_min_time="$MIN_TIME" \
    --benchmark_out="$OUT/gpu_bench.json" --benchmark_out_format=json >>"$BENCH_LOG" 2>&1
  rc=$?
  [ -s "$OUT/gpu_bench.json" ] && bench_json+=("$OUT/gpu_bench.json")
  errors=$(grep -c '"error_occurred": true' "$OUT/gpu_bench.json" 2>/dev/null)
  record bench "$(status_of_rc $rc)" $((SECONDS - t0)) "rc=$rc; ${errors:-0} benchmark(s) reported errors"
  if [ $rc -ne 0 ] && torch_built && [ "$(remaining)" -gt 90 ]; then
    # A crash in the PyTorch peer must not cost the other numbers: again, without it.
    t0=$SECONDS
    echo "== retry without the PyTorch peer" >>"$BENCH_LOG"
    timeout --kill-after=15 "$(limit 240 40)" "$BENCH" --benchmark_min_time="$MIN_TIME" \
      --benchmark_filter=-/torch --benchmark_out="$OUT/gpu_bench_retry.json" \
      --benchmark_out_format=json >>"$BENCH_LOG" 2>&1
    rc=$?
    [ -s "$OUT/gpu_bench_retry.json" ] && bench_json+=("$OUT/gpu_bench_retry.json")
    record bench-retry "$(status_of_rc $rc)" $((SECONDS - t0)) "without the PyTorch peer"
  elif torch_built && [ "$(remaining)" -gt 90 ]; then
    # PyTorch with expandable segments: its settings are read once per process, so a second run.
    t0=$SECONDS
    echo "== PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (torch_expandable only)" >>"$BENCH_LOG"
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout --kill-after=15 "$(limit 150 40)" \
      "$BENCH" --benchmark_min_time="$MIN_TIME" --benchmark_filter='^(pair|mixed|changing)/torch_expandable/' \
      --benchmark_out="$OUT/gpu_bench_torch_expandable.json" --benchmark_out_format=json >>"$BENCH_LOG" 2>&1
    rc=$?
    [ -s "$OUT/gpu_bench_torch_expandable.json" ] && bench_json+=("$OUT/gpu_bench_torch_expandable.json")
    record bench-torch-expandable "$(status_of_rc $rc)" $((SECONDS - t0)) "PyTorch with expandable_segments:True"
  fi
  # The stitch_cost/*, compaction_cost/* and sleep_cost/* benchmarks (benchmarks/gpu/
  # stitch_cost.cpp, compaction_cost.cpp, sleep_cost.cpp) ran above, in the same binary with fixed
  # iteration counts: a line each, from the JSON (the cost of a stitch; compaction's copy
  # bandwidth and its time per GiB; sleep and wake of 1, 10 and 50 GiB, the backups against the
  # pinned host copy bandwidth of the same run).
  cost_status stitch-cost --stitch-cost-status
  cost_status compaction-cost --compaction-cost-status
  cost_status sleep-cost --sleep-cost-status
fi

# ---- 7a. spill: kernels on spilled blocks, spill/unspill bandwidth against pinned copies, a matmul
# over spilled weights (tests/cuda/cuda_spill_test.cu; the RESULT line goes into the report) --------
SPILL_TESTS="$BUILD/tests/cuda/stitch_cuda_tests"
if [ $have_gpu = yes ] && [ -x "$SPILL_TESTS" ] && [ "$(remaining)" -gt 60 ]; then
  t0=$SECONDS
  timeout --kill-after=10 "$(limit 120 40)" "$SPILL_TESTS" --gtest_filter='CudaSpill.*:CudaKv.*' >"$OUT/spill.log" 2>&1
  rc=$?
  record_result spill "$OUT/spill.log" $t0 $rc
  # The KV pools' kernels and alloc/free latency ran in the same binary (tests/cuda/cuda_kv_test.cu).
  kv_result=$(grep -m1 '^RESULT kv ' "$OUT/spill.log" | sed 's/^RESULT kv //')
  kv_failed=$(grep -c '^\[  FAILED  \] CudaKv\.' "$OUT/spill.log")
  record kv "$([ "$kv_failed" -eq 0 ] && [ -n "$kv_result" ] && echo ok || echo failed)" 0 "${kv_result:-no RESULT line; see spill.log}"
else
  record spill skipped 0 "needs a GPU and stitch_cuda_tests"
  record kv skipped 0 "needs a GPU and stitch_cuda_tests"
fi

# ---- 7a'. sleep's disk tier: tagged GPU memory backed up through files and back, every byte
# counted by a kernel, against the file system's own bandwidth and host-only backups in the same
# run (tests/cuda/cuda_disk_test.cu; its RESULT line goes into the report) --------------------------
if [ $have_gpu = yes ] && [ -x "$SPILL_TESTS" ] && [ "$(remaining)" -gt 60 ]; then
  t0=$SECONDS
  mkdir -p "$WORK/disk"
  echo "== disk tier (CudaDisk.*)" >>"$OUT/spill.log"
  STITCH_GPU_DISK_DIR=${STITCH_GPU_DISK_DIR:-$WORK/disk} timeout --kill-after=10 "$(limit 120 40)" \
    "$SPILL_TESTS" --gtest_filter='CudaDisk.*' >"$WORK/disk.log" 2>&1
  rc=$?
  cat "$WORK/disk.log" >>"$OUT/spill.log"
  record_result disk "$WORK/disk.log" $t0 $rc
else
  record disk skipped 0 "needs a GPU and stitch_cuda_tests"
fi

# ---- 7b. PyTorch end to end: the example trains with each allocator; a deliberate OOM ---------------
# Same seeds and --deterministic: the losses must match the native allocator's. Each run is a fresh
# process (an allocator can only be installed before CUDA initialises).
if [ $have_gpu = yes ] && [ -n "$PYTHON" ] && "$PYTHON" -c "import torch; assert torch.cuda.is_available()" >/dev/null 2>&1 \
   && [ "$(remaining)" -gt 60 ]; then
  t0=$SECONDS
  : >"$TRAIN_LOG"
  train_rc=0
  for mode in native stitch stitch-expandable stitching; do
    args=(--allocator "$mode" --steps 30 --deterministic)
    if [ "$mode" = stitching ]; then
      args=(--allocator stitch --stitch-conf "expandable_segments:True,stitching:True" --steps 30 --deterministic)
    fi
    echo "== $mode" >>"$TRAIN_LOG"
    STITCH_LIBRARY="$BUILD/libstitch.so" PYTHONPATH="$ROOT/python" timeout --kill-after=10 "$(limit 60 20)" \
      "$PYTHON" "$ROOT/examples/train_transformer.py" "${args[@]}" >>"$TRAIN_LOG" 2>&1 || train_rc=1
  done
  # The losses of every run must equal the native allocator's.
  losses=$(grep '^RESULT ' "$TRAIN_LOG" | sed 's/^RESULT //' | "$PYTHON" -c 'import json,sys; print(" ".join(str(json.loads(l)["final_loss"]) for l in sys.stdin))')
  same=$(echo "$losses" | tr ' ' '\n' | sort -u | wc -l)
  [ "$(grep -c '^RESULT ' "$TRAIN_LOG")" -eq 4 ] && [ "$same" -eq 1 ] || train_rc=1
  record train-example "$(status_of_rc $train_rc)" $((SECONDS - t0)) "final losses: ${losses:-none}; see bench.log"

  t0=$SECONDS
  # A deliberate out-of-memory inside PyTorch must raise a Python exception carrying the report.
  STITCH_LIBRARY="$BUILD/libstitch.so" PYTHONPATH="$ROOT/python" timeout 60 "$PYTHON" - >"$WORK/oom.log" 2>&1 <<'PY'
import torch, stitch.torch as st
st.enable("per_process_memory_fraction:0.05")
try:
    with st.raise_torch_oom():
        x = torch.empty(int(torch.cuda.get_device_properties(0).total_memory * 0.5), dtype=torch.uint8, device="cuda")
    print("NO EXCEPTION")
    raise SystemExit(1)
except Exception as e:  # torch.OutOfMemoryError when raise_torch_oom translates it
    print(type(e).__name__)
    print(e)
    raise SystemExit(0 if "out of memory" in str(e) else 1)
PY
  rc=$?
  { echo; echo "=== deliberate out of memory inside PyTorch (rc=$rc)"; cat "$WORK/oom.log"; } >>"$TRAIN_LOG"
  record oom-in-pytorch "$(status_of_rc $rc)" $((SECONDS - t0)) "$(head -1 "$WORK/oom.log") (see bench.log)"

  # CUDA graphs (captured, replayed; torch.compile reduce-overhead) and PyTorch's memory API
  # through stitch's private pools: the results must equal the native allocator's.
  t0=$SECONDS
  : >"$WORK/graphs.log"
  graphs_rc=0
  for mode in native stitch; do
    STITCH_LIBRARY="$BUILD/libstitch.so" PYTHONPATH="$ROOT/python" timeout --kill-after=10 "$(limit 120 30)" \
      "$PYTHON" "$ROOT/scripts/gpu_torch_graphs.py" "$mode" >>"$WORK/graphs.log" 2>&1 || graphs_rc=1
  done
  graph_results=$(grep '^RESULT ' "$WORK/graphs.log" | sed 's/^RESULT //' | "$PYTHON" -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin]
keys = ("graph_sums", "compiled_sum")
same = len(rows) == 2 and all(rows[0][k] == rows[1][k] for k in keys)
api = all(r["allocated_ok"] and r["snapshot_segments"] for r in rows)
print(("same" if same else "DIFFERENT") + " results; memory API " + ("ok" if api else "WRONG") + ": " + json.dumps(rows))
' 2>&1)
  case "$graph_results" in "same results; memory API ok"*) ;; *) graphs_rc=1 ;; esac
  { echo; echo "=== CUDA graphs and the memory API (rc=$graphs_rc)"; cat "$WORK/graphs.log"; } >>"$TRAIN_LOG"
  record graphs-in-pytorch "$(status_of_rc $graphs_rc)" $((SECONDS - t0)) "$(echo "$graph_results" | head -c 300)"

  # The native backend (libstitch_torch, built here by stitch.torch with cpp_extension): cuDNN's
  # benchmark mode, torch.compile reduce-overhead over a diverging path, torch.OutOfMemoryError,
  # NCCL's registration hook; each result must equal PyTorch's allocator's.
  t0=$SECONDS
  : >"$WORK/native.log"
  native_rc=0
  for case in cudnn compile oom nccl ipc ipc_exp; do
    for mode in native stitch; do
      STITCH_LIBRARY="$BUILD/libstitch.so" PYTHONPATH="$ROOT/python" STITCH_NATIVE_CACHE="$WORK/native-cache" \
        timeout --kill-after=10 "$(limit 150 30)" "$PYTHON" "$ROOT/scripts/gpu_torch_native.py" "$mode" "$case" \
        >>"$WORK/native.log" 2>&1 || native_rc=1
    done
  done
  native_results=$(grep '^RESULT ' "$WORK/native.log" | sed 's/^RESULT //' | "$PYTHON" -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin]
by = {}
for r in rows:
    by.setdefault(r["case"], {})[r["allocator"]] = r
bad = []
for case, pair in sorted(by.items()):
    a, b = pair.get("native"), pair.get("stitch")
    if a is None or b is None: bad.append(case + ": missing run"); continue
    side = b.get("backend", b.get("stitch_side_backend"))
    if side != "native" or a.get("stitch_side_backend", "native") != "native":
        bad.append(case + ": stitch ran on " + str(side) + "/" + str(a.get("stitch_side_backend")))
    keys = [k for k in a if k not in ("allocator",)]
    diff = [k for k in keys if a[k] != b.get(k)]
    if diff: bad.append(case + ": differs in " + ",".join(diff))
if len(by) < 6: bad.append("cases run: " + ",".join(sorted(by)))
print(("ok " if not bad else "FAILED ") + "; ".join(bad) + " " + json.dumps(by)[:200])
' 2>&1)
  case "$native_results" in "ok "*) ;; *) native_rc=1 ;; esac
  { echo; echo "=== native PyTorch backend (rc=$native_rc)"; cat "$WORK/native.log"; } >>"$TRAIN_LOG"
  record native-backend "$(status_of_rc $native_rc)" $((SECONDS - t0)) "$(echo "$native_results" | head -c 300)"
else
  record train-example skipped 0 "needs a GPU and python3 with CUDA torch"
fi

# ---- 8. the report --------------------------------------------------------------------------------
total=$((SECONDS - START))
if [ $total -le 480 ]; then
  printf '%s\t%s\t%s\t%s\n' total ok "$total" "budget ${BUDGET}s, $cpus CPUs" >>"$STEPS"
elif [ "$cpus" -ge 8 ]; then
  printf '%s\t%s\t%s\t%s\n' total over-8-minutes "$total" "budget ${BUDGET}s, $cpus CPUs" >>"$STEPS"
  failures=$((failures + 1))
else
  printf '%s\t%s\t%s\t%s\n' total ok "$total" "over 8 minutes, but only $cpus CPUs (budget ${BUDGET}s)" >>"$STEPS"
fi
[ -s "$TRAIN_LOG" ] && { echo; echo "== the PyTorch example (train step)"; cat "$TRAIN_LOG"; } >>"$BENCH_LOG"
report_args=(--out "$OUT/report.md" --steps "$STEPS" --ctest-log "$CTEST_LOG" --nvidia-smi "$SMI"
  --costs-out "$OUT/costs.json")
[ ${#bench_json[@]} -gt 0 ] && report_args+=(--bench-json "${bench_json[@]}")
[ $have_gpu = no ] && report_args+=(--no-gpu "${no_gpu_reason:-unknown reason}")
if [ -n "$PYTHON" ] && timeout 60 "$PYTHON" "$ROOT/scripts/gpu_report.py" "${report_args[@]}"; then
  :
else
  failures=$((failures + 1))
  {
    echo "# stitch GPU check"
    echo
    echo "The report generator (scripts/gpu_report.py) failed or python3 is missing; the steps:"
    echo
    echo '```'
    cat "$STEPS"
    echo '```'
    [ $have_gpu = no ] && echo && echo "**No GPU found: ${no_gpu_reason}.**"
  } >"$OUT/report.md"
fi
cp "$STEPS" "$BUILD/gpu-check-steps.tsv" 2>/dev/null

echo
column -t -s $'\t' "$STEPS" 2>/dev/null || cat "$STEPS"
echo
say "report: $OUT/report.md"
if [ $have_gpu = no ]; then
  say "NO GPU FOUND: ${no_gpu_reason}. Built and ran what works without one; exiting 2, as expected on a machine without a GPU."
  exit 2
fi
if [ $failures -ne 0 ]; then
  say "FAILED: $failures step(s) failed (see the report)"
  exit 1
fi
say "passed in ${total}s"
exit 0
