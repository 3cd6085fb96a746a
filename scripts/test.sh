#!/usr/bin/env bash
# scripts/test.sh — builds stitch with every test and runs them all with ctest, then the sanitizer
# and fuzz smoke run (scripts/sanitize-smoke.sh: the suite under ASan + UBSan, each fuzzer for
# 20 s, the concurrency stress under TSan); STITCH_SKIP_SANITIZERS=1 skips that part.
# (CUDA tests build when the toolkit is present and skip with a message when no GPU is.)
# libstitch_torch and its tests build against the PyPI torch in a virtual environment outside the
# clone, made once and reused (STITCH_TORCH_VENV names one; default ~/.cache/stitch/torch-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
jobs=$(nproc)
torch_venv=${STITCH_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/stitch/torch-venv}
./scripts/torch-venv.sh "$torch_venv"
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSTITCH_WITH_TORCH=ON -DPython3_EXECUTABLE="$torch_venv/bin/python" >/dev/null
cmake --build build-test -j"$jobs"
ctest --test-dir build-test --output-on-failure -j"$jobs" --timeout 900
if [ "${STITCH_SKIP_SANITIZERS:-0}" != 1 ]; then
  ./scripts/sanitize-smoke.sh
fi
