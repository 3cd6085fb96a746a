#!/usr/bin/env bash
# scripts/fragmentation-bench.sh — the fragmentation benchmark, in one command.
#
#   ./scripts/fragmentation-bench.sh [CONFIG...]
#
# Builds stitch-replay (Release, in build-release/), replays every trace — the generated ones of
# traces/ and, when present, the real PyTorch traces of $STITCH_SHARED_TRACES (default
# ../shared/traces, relative to the repository) — under PyTorch's defaults (""),
# "expandable_segments:True" and every CONFIG given (STITCH_ALLOC_CONF syntax, e.g.
# "max_split_size_mb:128"), with --min-capacity, and writes docs/fragmentation.md with a table
# per trace plus a few SVG plots in docs/plots/, the fits and OOM explanation examples (one real trace
# replayed with --fits and --capacity), and the totals table of docs/benchmarks.md. Deterministic: the same traces and configs give
# the same files. Takes well under a minute once built.
set -euo pipefail
cd "$(dirname "$0")/.."

shared=${STITCH_SHARED_TRACES:-../shared/traces}
build=build-release
# Plots for a few traces only (keeps the repository small): a generated one per kind of
# fragmentation and the real full training step.
plot_traces=(transformer-varlen multistream moe cs336-ctx128-fullstep)

configs=("" "expandable_segments:True" "$@")

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DSTITCH_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target stitch-replay >/dev/null

traces=(traces/*.pickle)
if [ -d "$shared" ]; then
  traces+=("$shared"/*.pickle)
else
  echo "fragmentation-bench: no real traces in $shared (set STITCH_SHARED_TRACES); generated traces only" >&2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p docs/plots
rm -f docs/plots/*.svg

config_args=()
for c in "${configs[@]}"; do config_args+=(--config "$c"); done

jsons=()
i=0
for t in "${traces[@]}"; do
  name=$(basename "$t" .pickle)
  args=(--no-progress --min-capacity --json "${config_args[@]}")
  for p in "${plot_traces[@]}"; do
    if [ "$p" = "$name" ]; then args+=(--plot "docs/plots/$name.svg"); fi
  done
  echo "fragmentation-bench: $t" >&2
  out=$(printf '%s/%03d.json' "$work" "$i")
  "./$build/stitch-replay" "${args[@]}" "$t" >"$out"
  jsons+=("$out")
  i=$((i + 1))
done

# The real examples of the fits table and of an OOM explanation: a real full training step on a
# device a little too small for it (a generated trace when the real ones are absent).
example_trace=traces/transformer-varlen.pickle
example_capacity=9GiB
if [ -f "$shared/cs336-ctx128-fullstep.pickle" ]; then
  example_trace="$shared/cs336-ctx128-fullstep.pickle"
  example_capacity=50GiB
fi
echo "fragmentation-bench: example $example_trace" >&2
"./$build/stitch-replay" --no-progress --fits --capacity "$example_capacity" "$example_trace" >"$work/example.txt"
example_command="stitch-replay --fits --capacity $example_capacity $(basename "$example_trace")"

command="./scripts/fragmentation-bench.sh"
for c in "$@"; do command+=" '$c'"; done
python3 scripts/fragmentation_report.py --out docs/fragmentation.md --plots docs/plots --totals docs/benchmarks.md \
  --readme traces/README.md --readme "$shared/README.md" --command "$command" \
  --example "$work/example.txt" --example-command "$example_command" "${jsons[@]}"
echo "fragmentation-bench: wrote docs/fragmentation.md and docs/plots/ ($(ls docs/plots | wc -l) plots)" >&2
