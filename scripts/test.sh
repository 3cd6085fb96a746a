#!/usr/bin/env bash
# scripts/test.sh — builds stitch with every test and runs them all with ctest.
# (CUDA tests build when the toolkit is present and skip with a message when no GPU is.)
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
jobs=$(nproc)
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-test -j"$jobs"
ctest --test-dir build-test --output-on-failure -j"$jobs" --timeout 900
