#!/bin/bash
# build.sh — builds the stub CUDA runtime (two variants) and the peerbench binary against
# STITCH_BUILD (libstitch.so) and STITCH_SRC/include. Objects that do not depend on stitch
# (glibc, torch, RMM adapters) are rebuilt only when their sources change, so a rebuild for another
# stitch build compiles two small files and links. Run it under the shared lock on a shared machine.
set -euo pipefail
PB="${PB:-$(cd "$(dirname "$0")" && pwd)}"
: "${TORCH_VENV:?set TORCH_VENV to a venv with the PyPI torch}"
SP=$(ls -d $TORCH_VENV/lib/python3*/site-packages | head -1)   # any python3.x venv
TORCH=$SP/torch
CUH=$SP/nvidia/cu13/include   # CUDA 13.x headers (torch's)
STITCH_BUILD=${STITCH_BUILD:?set STITCH_BUILD to a Release build of stitch}
STITCH_INC=${STITCH_SRC:?set STITCH_SRC to the stitch checkout}/include
RMM=${RMM:-1}
# newer(o, deps...): true when o is missing or older than a dependency
stale() { local o=$1; shift; [ -e "$o" ] || return 0; for d in "$@"; do [ "$d" -nt "$o" ] && return 0; done; return 1; }
cd $PB/stub
grep -oP 'COUNT\(\K[A-Za-z0-9_]+' cudart_stub.c | sort -u | sed 's/.*/X(&)/' > stub_fns.def
mkdir -p fast count
for v in fast count; do
  extra=""; [ $v = count ] && extra=-DSTUB_COUNT
  stale $v/libcudart.so.13 cudart_stub.c || continue
  gcc -O2 -fPIC -shared -std=c11 -ftls-model=initial-exec -fvisibility=hidden $extra -I$CUH cudart_stub.c \
      -Wl,--version-script=libcudart.map -Wl,-soname,libcudart.so.13 -o $v/libcudart.so.13 -lpthread
  ln -sf libcudart.so.13 $v/libcudart.so
done
cd $PB/src
mkdir -p ../obj
CXX="g++ -std=c++20 -O3 -DNDEBUG -fno-omit-frame-pointer"
H="loops.hpp trace_sizes.hpp train_step.hpp"
stale ../obj/adapter_glibc.o adapter_glibc.cpp $H && $CXX -c adapter_glibc.cpp -o ../obj/adapter_glibc.o
# stitch-dependent: always rebuilt (cheap), so a new STITCH_SRC's headers are used
$CXX -c -I$STITCH_INC adapter_stitch.cpp -o ../obj/adapter_stitch.o
stale ../obj/adapter_stitch_b.o adapter_stitch_b.cpp $H && $CXX -c adapter_stitch_b.cpp -o ../obj/adapter_stitch_b.o
stale ../obj/adapter_torch.o adapter_torch.cpp $H && \
  $CXX -c -D_GLIBCXX_USE_CXX11_ABI=1 -I$TORCH/include -I$CUH adapter_torch.cpp -o ../obj/adapter_torch.o
stale ../obj/main.o main.cpp $H && $CXX -c main.cpp -o ../obj/main.o
OBJS="../obj/main.o ../obj/adapter_glibc.o ../obj/adapter_stitch.o ../obj/adapter_stitch_b.o ../obj/adapter_torch.o"
LIBS=""
if [ "$RMM" = 1 ]; then
  bash $PB/build-rmm.sh
  OBJS="$OBJS ../obj/adapter_rmm.o ../obj/rmm/*.o"
  LIBS="-L$PB/rmm-dl/logger/rapids_logger/lib64 -lrapids_logger"
fi
# the stub comes first on the link line, so it is the first libcudart.so.13 loaded; libc10_cuda and
# libstitch then bind to it by soname. RUNPATH (new dtags) lets LD_LIBRARY_PATH=stub/count win.
g++ -o ../peerbench $OBJS -Wl,--no-as-needed -Wl,--enable-new-dtags \
    -L$PB/stub/fast -lcudart \
    -L$TORCH/lib -lc10_cuda -lc10 \
    -L$STITCH_BUILD -lstitch $LIBS \
    -Wl,-rpath,$PB/stub/fast:$TORCH/lib:$STITCH_BUILD:$PB/rmm-dl/logger/rapids_logger/lib64 -ldl -lpthread
echo built $PB/peerbench against $STITCH_BUILD/libstitch.so
# profiling helper: PyTorch's pair alone (perf record -g ./torch_only 5000000); TORCH_ONLY=1
if [ "${TORCH_ONLY:-0}" = 1 ]; then
  cd $PB && g++ -std=c++20 -O2 -D_GLIBCXX_USE_CXX11_ABI=1 -I$TORCH/include -I$CUH src/torch_only.cpp -o torch_only \
      -Wl,--no-as-needed -Wl,--enable-new-dtags -L$PB/stub/fast -lcudart -L$TORCH/lib -lc10_cuda -lc10 \
      -Wl,-rpath,$PB/stub/fast:$TORCH/lib
fi
