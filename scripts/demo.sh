#!/usr/bin/env bash
# scripts/demo.sh — sets up a fresh machine, builds stitch (Release) and runs the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DSTITCH_BUILD_TESTS=OFF >/dev/null
cmake --build build-release -j"$(nproc)" --target stitch_demo
./build-release/examples/stitch_demo "$@"
