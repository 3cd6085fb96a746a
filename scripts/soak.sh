#!/usr/bin/env bash
# scripts/soak.sh [MINUTES] — the opt-in long reliability run (default 10 minutes per part): the
# whole test suite under AddressSanitizer + UndefinedBehaviorSanitizer, then every libFuzzer
# target for MINUTES each (one core), then under ThreadSanitizer the concurrency stress for
# MINUTES (split over its three configurations), frees from thread-exit destructors (MINUTES x 10
# rounds) and the test suite's threaded tests (about 11 minutes on 2 cores). Prints the figures
# docs/reliability.md quotes.
# Builds in build-asan-soak/ and build-tsan-soak/ (so that a soak can run beside the CI run); the
# fuzzers' new inputs accumulate in build-asan-soak/corpus/.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-10}
if ! [[ $minutes =~ ^[0-9]+$ ]] || ((minutes < 1)); then
  echo "usage: scripts/soak.sh [MINUTES]  (a whole number >= 1)" >&2
  exit 2
fi
source scripts/sanitizers.sh
start=$SECONDS
san_build_asan build-asan-soak
san_run_tests build-asan-soak
san_run_fuzzers build-asan-soak $((minutes * 60))
san_build_tsan build-tsan-soak all
san_run_tsan build-tsan-soak $((minutes * 20)) $((minutes * 10))
san_run_tsan_tests build-tsan-soak
san_say "soak of ${minutes} minutes per part passed in $((SECONDS - start)) s"
