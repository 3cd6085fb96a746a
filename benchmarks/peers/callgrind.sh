#!/bin/bash
# callgrind.sh — instructions per pair (noise-free): callgrind's total for N and 2N pairs of one
# allocator and case, subtracted, divided by N. Single-thread cases only (--one runs on the main
# thread). Run it under the shared lock.
set -uo pipefail
PB="${PB:-$(cd "$(dirname "$0")" && pwd)}"
export STITCH_ALLOC_CONF=${STITCH_ALLOC_CONF:-backend:sim,sim_capacity_mb:65536,sim_devices:2}
export STUB_DEVICES=${STUB_DEVICES:-2}
unset STITCH_BUILD_B
N=${N:-20000}
names=("glibc" "stitch C++" "stitch C API" "PyTorch" "RMM pool")   # main.cpp's adapter order
cases=("512 B" "4 KiB" "1 MiB" "8 MiB" "mixed" "mixed, 64 live" "trace, pair" "trace, window 8")
for ci in ${CASES:-0 1 4 6 7}; do
  for ai in 0 1 2 3 4; do
    ir() { valgrind --tool=callgrind --callgrind-out-file=/dev/null $PB/peerbench --one $ai $ci $1 2>&1 | grep -oP 'Collected : \K[0-9]+'; }
    a=$(ir $N); b=$(ir $((2*N)))
    echo "instr | ${cases[$ci]} | ${names[$ai]} | $(( (b - a) / N ))"
  done
done
