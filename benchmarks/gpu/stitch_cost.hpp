// benchmarks/gpu/stitch_cost.hpp — the stitch_cost/* benchmarks of stitch_gpu_bench (what a stitch
// costs against cudaMalloc and an expandable-segment grow; see stitch_cost.cpp).
#pragma once

#include <cuda_runtime_api.h>

namespace stitch_bench {

/// Registers stitch_cost/{stitch,grow,cudaMalloc}/<N>pages, run on `stream` on device 0.
void register_stitch_cost(cudaStream_t stream);

}  // namespace stitch_bench
