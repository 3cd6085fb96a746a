# scripts/sanitizers.sh — sourced by sanitize-smoke.sh and soak.sh: builds stitch with clang under
# AddressSanitizer + UndefinedBehaviorSanitizer (library, whole test suite, libFuzzer targets)
# and under ThreadSanitizer (the concurrency stress), and runs them. Any sanitizer report, fuzzer
# crash or test failure fails the caller (set -euo pipefail there).

san_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
san_jobs=$(nproc)
((san_jobs > 2)) && san_jobs=2  # the CI machines and the shared development box have 2 cores
san_launcher=()
command -v ccache >/dev/null 2>&1 &&
  san_launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# -O1 with line tables: a third of RelWithDebInfo's build time, stack traces still have lines.
san_common=(-DCMAKE_BUILD_TYPE=None -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
  "${san_launcher[@]}" -DSTITCH_WITH_CUDA=OFF -DSTITCH_WITH_TORCH=OFF -DSTITCH_BUILD_BENCHMARKS=OFF -DSTITCH_BUILD_EXAMPLES=OFF)
san_flags="-O1 -gline-tables-only -fno-sanitize-recover=all"
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1"
export TSAN_OPTIONS="halt_on_error=1:abort_on_error=1:second_deadlock_stack=1"
san_fuzzers=(fuzz_config:config fuzz_pickle:pickle fuzz_rmm_csv:rmm_csv fuzz_capi_ops:capi_ops fuzz_ipc_handles:ipc_handles)

san_say() { printf '\n=== %s [%d s]: %s\n' "$(basename "$0")" "$SECONDS" "$*"; }

# Builds the library, stitch_tests, c_api_program and the fuzzers under ASan + UBSan in $1.
san_build_asan() {
  local dir=$1
  san_say "building with AddressSanitizer + UndefinedBehaviorSanitizer in $dir"
  cmake -S "$san_root" -B "$dir" "${san_common[@]}" -DSTITCH_SANITIZE=address,undefined \
    -DSTITCH_BUILD_FUZZERS=ON "-DCMAKE_C_FLAGS=$san_flags" "-DCMAKE_CXX_FLAGS=$san_flags" >/dev/null
  cmake --build "$dir" -j"$san_jobs"
}

# Runs the whole test suite from $1 (not the fuzz smoke tests, nor the tests labelled
# python-loads-libstitch: python3 does not load the ASan runtime that libstitch.so then needs).
san_run_tests() {
  local dir=$1
  san_say "test suite under AddressSanitizer + UndefinedBehaviorSanitizer"
  ctest --test-dir "$dir" --output-on-failure -j"$san_jobs" --timeout 900 -LE 'fuzz-smoke|python-loads-libstitch'
}

# Runs every fuzzer from $1 for $2 seconds over its seed corpus (new inputs go to $1/corpus, not
# into fuzz/), on one core, and prints libFuzzer's figures and those of fuzz_capi_ops and
# fuzz_ipc_handles.
san_run_fuzzers() {
  local dir=$1 seconds=$2 pair name corpus log
  for pair in "${san_fuzzers[@]}"; do
    name=${pair%%:*}
    corpus=${pair#*:}
    mkdir -p "$dir/corpus/$corpus" "$dir/artifacts"
    log="$dir/$name.log"
    san_say "$name for ${seconds}s"
    if ! "$dir/fuzz/$name" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=60 -print_final_stats=1 \
      -artifact_prefix="$dir/artifacts/$name-" "$dir/corpus/$corpus" "$san_root/fuzz/corpus/$corpus" >"$log" 2>&1; then
      tail -n 60 "$log"
      echo "$name FAILED (log: $log, input in $dir/artifacts/)" >&2
      return 1
    fi
    grep -E '^(stat::number_of_executed_units|stat::new_units_added|stat::peak_rss_mb|fuzz_capi_ops:|fuzz_ipc_handles:)' "$log" || true
  done
}

# Builds the concurrency stress and the thread-exit frees under ThreadSanitizer in $1 (and, with
# $2 = all, the test suite too).
san_build_tsan() {
  local dir=$1 targets=(concurrency_stress thread_exit_frees)
  [ "${2:-}" = all ] && targets+=(stitch_tests)
  san_say "building ${targets[*]} with ThreadSanitizer in $dir"
  cmake -S "$san_root" -B "$dir" "${san_common[@]}" -DSTITCH_SANITIZE=thread \
    "-DCMAKE_C_FLAGS=$san_flags" "-DCMAKE_CXX_FLAGS=$san_flags" >/dev/null
  cmake --build "$dir" -j"$san_jobs" --target "${targets[@]}"
}

# Runs the stress from $1 for $2 seconds per configuration (three configurations), then frees
# from thread-exit destructors while threads come and go, $3 rounds (20).
san_run_tsan() {
  local dir=$1 seconds=$2
  san_say "concurrency stress under ThreadSanitizer, ${seconds}s per configuration"
  "$dir/tests/concurrency_stress" --threads 8 --seconds "$seconds"
  san_say "frees from thread-exit destructors under ThreadSanitizer, ${3:-20} rounds"
  "$dir/tests/thread_exit_frees" "${3:-20}"
}

# Runs the test suite's threaded tests from $1 (built with san_build_tsan DIR all) under
# ThreadSanitizer: threads on their own streams at once, threads taking turns, the randomized
# stress and the C API torture.
san_run_tsan_tests() {
  local dir=$1
  san_say "threaded tests under ThreadSanitizer"
  "$dir/tests/stitch_tests" --gtest_brief=1 \
    --gtest_filter='*CacheHitThreads*:*ThreadIndependence*:*Randomized*:*StatsExact*:*Concurren*:*Thread*'
}
