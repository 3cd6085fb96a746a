#!/usr/bin/env bash
# scripts/demo.sh — sets up a fresh machine, builds stitch (Release) and runs the demo, then
# replays a bundled trace (traces/) under PyTorch's defaults and expandable segments side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DSTITCH_BUILD_TESTS=OFF >/dev/null
cmake --build build-release -j"$(nproc)" --target stitch_demo stitch-replay stitch-tracegen stitch stitch_static  # what `cmake --install build-release` installs, too
./build-release/examples/stitch_demo "$@"
echo
echo "Replaying traces/transformer-varlen.pickle (GPT training, a new sequence length every step):"
./build-release/stitch-replay --no-progress traces/transformer-varlen.pickle
