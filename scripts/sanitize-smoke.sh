#!/usr/bin/env bash
# scripts/sanitize-smoke.sh — the sanitizer and fuzz smoke run of the default CI, called at the
# end of scripts/test.sh (STITCH_SKIP_SANITIZERS=1 skips it there): the whole test suite under
# AddressSanitizer + UndefinedBehaviorSanitizer, every libFuzzer target for
# STITCH_FUZZ_SMOKE_SECONDS (20) over its seed corpus, and under ThreadSanitizer the concurrency
# stress for STITCH_TSAN_SMOKE_SECONDS (10) per configuration and 20 rounds of frees from
# thread-exit destructors while threads come and go. Builds in
# build-asan-smoke/ and build-tsan/. Needs clang and libclang-rt (scripts/setup.sh installs them).
# Longer runs: scripts/soak.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/sanitizers.sh
start=$SECONDS
san_build_asan build-asan-smoke
san_run_tests build-asan-smoke
san_run_fuzzers build-asan-smoke "${STITCH_FUZZ_SMOKE_SECONDS:-20}"
san_build_tsan build-tsan
san_run_tsan build-tsan "${STITCH_TSAN_SMOKE_SECONDS:-10}"
san_say "passed in $((SECONDS - start)) s"
