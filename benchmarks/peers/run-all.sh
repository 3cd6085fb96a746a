#!/bin/bash
# run-all.sh — one command: (prepare RMM once,) build against STITCH_BUILD, run, summarize.
#   STITCH_BUILD=<dir with libstitch.so> STITCH_SRC=<its checkout> ./run-all.sh
# Optional: STITCH_BUILD_B (+ STITCH_SRC_B) adds a second build's C API in the same process;
# RUN_TAG=-x names the outputs out/timed-x.txt ...; ROUNDS (5), TARGET_MS (150), PB_CASES, COUNT=0
# (skip the call-counting run), TRAIN=0 (skip the training loop), TRAIN_STEPS (40), NO_TORCH=1 /
# NO_RMM=1, LOCK (/tmp/stitch-build.lock: every compile
# and every timed run holds it, nothing else does).
set -euo pipefail
PB="$(cd "$(dirname "$0")" && pwd)"
export PB
export TORCH_VENV=${TORCH_VENV:-/work/torchvenv}
export RMM_GIT=${RMM_GIT:-/work/.mirror/rapidsai+rmm/repo}
: "${STITCH_BUILD:?set STITCH_BUILD to a Release build dir of stitch (libstitch.so)}"
: "${STITCH_SRC:?set STITCH_SRC to the source checkout of that build}"
export STITCH_BUILD STITCH_SRC
LOCK=${LOCK:-/tmp/stitch-build.lock}
[ -d $PB/rmm-dl/whl ] && [ -d $PB/rmm-patched ] || $PB/prepare-rmm.sh       # downloads only: no lock
flock $LOCK $PB/build.sh
flock $LOCK $PB/run.sh
python3 $PB/summarize.py $PB/out/timed${RUN_TAG:-}.txt | tee $PB/out/summary${RUN_TAG:-}.md
[ -s $PB/out/train${RUN_TAG:-}.txt ] &&
  python3 $PB/summarize.py --train $PB/out/train${RUN_TAG:-}.txt | tee -a $PB/out/summary${RUN_TAG:-}.md
