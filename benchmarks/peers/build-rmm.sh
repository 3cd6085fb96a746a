#!/bin/bash
# build-rmm.sh — compiles RMM's out-of-line parts that the pool needs, from the rapidsai/rmm
# sources (26.08 tree, patched to the 26.10 wheel's headers: ABI namespace macros and
# cuda::stream_ref in the pool's signatures; see rmm-patched/), against the stub CUDA runtime.
set -euo pipefail
PB="${PB:-$(cd "$(dirname "$0")" && pwd)}"
W=$PB/rmm-dl/whl/librmm/include                       # librmm-cu13 26.10.0 headers (+ CCCL 3.5 in rapids/)
L=$PB/rmm-dl/logger/rapids_logger/include             # rapids-logger 0.3.0
CUH=$(ls -d ${TORCH_VENV:?set TORCH_VENV to a venv with the PyPI torch}/lib/python3*/site-packages | head -1)/nvidia/cu13/include
RMMDEF="-DCCCL_DISABLE_PDL -DTHRUST_DISABLE_ABI_NAMESPACE -DTHRUST_IGNORE_ABI_NAMESPACE_ERROR -DCUB_DISABLE_NAMESPACE_MAGIC -DCUB_IGNORE_NAMESPACE_MAGIC_ERROR"
CXX="g++ -std=c++20 -O3 -DNDEBUG -fno-omit-frame-pointer $RMMDEF -I$W -I$W/rapids -I$L -I$CUH"
mkdir -p $PB/obj/rmm
for f in $PB/rmm-patched/*.cpp; do
  o=$PB/obj/rmm/$(basename ${f%.cpp}).o
  [ $o -nt $f ] || $CXX -c $f -o $o
done
o=$PB/obj/adapter_rmm.o; s=$PB/src
{ [ $o -nt $s/adapter_rmm.cpp ] && [ $o -nt $s/loops.hpp ] && [ $o -nt $s/trace_sizes.hpp ] && [ $o -nt $s/train_step.hpp ]; } || $CXX -c $s/adapter_rmm.cpp -o $o
