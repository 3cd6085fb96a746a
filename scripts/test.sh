#!/usr/bin/env bash
# scripts/test.sh — builds stitch with every test and runs them all with ctest, then the sanitizer
# and fuzz smoke run (scripts/sanitize-smoke.sh: the suite under ASan + UBSan, each fuzzer for
# 20 s, the concurrency stress under TSan); STITCH_SKIP_SANITIZERS=1 skips that part.
# (CUDA tests build when the toolkit is present and skip with a message when no GPU is.)
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
jobs=$(nproc)
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-test -j"$jobs"
ctest --test-dir build-test --output-on-failure -j"$jobs" --timeout 900
if [ "${STITCH_SKIP_SANITIZERS:-0}" != 1 ]; then
  ./scripts/sanitize-smoke.sh
fi
