#!/bin/bash
# run.sh — the counting run (CUDA calls per pair) and the timed run (ROUNDS interleaved rounds).
# Outputs out/env$RUN_TAG.txt, out/calls$RUN_TAG.txt, out/timed$RUN_TAG.txt.
set -euo pipefail
PB="${PB:-$(cd "$(dirname "$0")" && pwd)}"
mkdir -p $PB/out
# mix_bench's configuration: two simulated devices (the 2-device case), 64 GiB each
export STITCH_ALLOC_CONF=${STITCH_ALLOC_CONF:-backend:sim,sim_capacity_mb:65536,sim_devices:2}
export STUB_DEVICES=${STUB_DEVICES:-2}   # the stub CUDA runtime shows PyTorch and RMM two devices too
desc() { echo "$(git -C $1 rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C $1 diff --quiet HEAD 2>/dev/null || echo '+uncommitted')"; }
{
  echo "# $(date -u +%FT%TZ) $(uname -r)"; lscpu | grep -E "Model name|^CPU\(s\)"; uptime
  echo "# torch $(${TORCH_VENV:?set TORCH_VENV to a venv with the PyPI torch}/bin/python -c 'import torch;print(torch.__version__)' 2>/dev/null)," \
       "RMM headers $(cat $PB/rmm-dl/whl/librmm/VERSION) ($(cat $PB/rmm-dl/whl/librmm/GIT_COMMIT))"
  echo "# stitch A: $(desc ${STITCH_SRC:?set STITCH_SRC to the stitch checkout}) $STITCH_SRC, ${STITCH_BUILD:?set STITCH_BUILD}/libstitch.so $(stat -c %y $STITCH_BUILD/libstitch.so)"
  [ -n "${STITCH_BUILD_B:-}" ] && echo "# stitch B (C API): $( [ -n "${STITCH_SRC_B:-}" ] && desc $STITCH_SRC_B) ${STITCH_SRC_B:-} $STITCH_BUILD_B/libstitch.so $(stat -c %y $STITCH_BUILD_B/libstitch.so)"
  echo "# STITCH_ALLOC_CONF=$STITCH_ALLOC_CONF STUB_DEVICES=$STUB_DEVICES ROUNDS=${ROUNDS:-5} TARGET_MS=${TARGET_MS:-150} PB_CASES=${PB_CASES:-all}"
} > $PB/out/env${RUN_TAG:-}.txt
if [ "${COUNT:-1}" = 1 ]; then
  STUB_VERBOSE=1 LD_LIBRARY_PATH=$PB/stub/count $PB/peerbench > $PB/out/calls${RUN_TAG:-}.txt 2>&1
fi
$PB/peerbench ${ROUNDS:-5} ${TARGET_MS:-150} > $PB/out/timed${RUN_TAG:-}.txt 2>&1
# The forward/backward training loop (src/train_step.hpp), backward on the main thread and on its
# own: one process per (stitch configuration, seed, threads), every allocator in it; the peers only
# with stitch's defaults (their settings do not change), RMM's pool from empty (PB_RMM_INITIAL_MB=0)
# so that its pool size is what the loop needed. TRAIN=0 skips it; TRAIN_STEPS (40).
if [ "${TRAIN:-1}" = 1 ]; then
  : > $PB/out/train${RUN_TAG:-}.txt
  for conf in "" expandable_segments:True expandable_segments:True,stitching:True \
              expandable_segments:True,stitching:True,stitch_compact:True; do
    peers=""; [ -n "$conf" ] && peers="NO_TORCH=1 NO_RMM=1"
    for seed in 1 2; do
      for threads in 1 2; do
        env $peers STITCH_ALLOC_CONF="$STITCH_ALLOC_CONF${conf:+,$conf}" PB_RMM_INITIAL_MB=0 \
            $PB/peerbench --train $threads ${TRAIN_STEPS:-40} $seed 2>/dev/null |
          sed "s/^train |/train | ${conf:-defaults} |/" >> $PB/out/train${RUN_TAG:-}.txt
      done
    done
  done
fi
uptime >> $PB/out/env${RUN_TAG:-}.txt
