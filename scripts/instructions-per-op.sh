#!/usr/bin/env bash
# scripts/instructions-per-op.sh — instructions per step of benchmarks/capi_ops.cpp's workloads,
# counted by callgrind (deterministic: no timing): the totals for N and 2N steps, subtracted,
# divided by N, so that start-up and warm-up cancel out.
#
#   ./scripts/instructions-per-op.sh BUILD_DIR [MODE...]     (default modes: 0 1 2 3 4 5)
#
# BUILD_DIR holds benchmarks/capi_ops (a Release build: cmake --build BUILD_DIR --target
# capi_ops). Two builds side by side compare a change. Needs valgrind.
set -euo pipefail
build=${1:?usage: instructions-per-op.sh BUILD_DIR [MODE...]}
shift
modes=("$@")
[ ${#modes[@]} -eq 0 ] && modes=(0 1 2 3 4 5)
names=("same-size pair 512 B" "mix 4K/64K/1M/8M" "real trace, 8 live" "mix, 64 live blocks" \
       "real trace, pairs" "random, up to 1000 live")
N=${N:-20000}
count() {
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$build/benchmarks/capi_ops" "$1" "$2" 2>&1 |
    grep -oP 'Collected : \K[0-9]+'
}
for m in "${modes[@]}"; do
  a=$(count "$m" "$N")
  b=$(count "$m" $((2 * N)))
  echo "mode $m (${names[$m]}): $(((b - a) / N)) instructions per step"
done
