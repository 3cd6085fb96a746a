// benchmarks/gpu/sleep_cost.hpp — the sleep_cost/* benchmarks of stitch_gpu_bench (the pinned host
// copy bandwidth, and the time to sleep and wake 1, 10 and 50 GiB of tagged memory with and
// without backup; see sleep_cost.cpp).
#pragma once

#include <cuda_runtime_api.h>

namespace stitch_bench {

/// Registers sleep_cost/pinned_copy/{d2h,h2d} and sleep_cost/{sleep,wake}/<N>GiB/{backup,nobackup}
/// for N = 1, 10, 50, run on device 0 (`stream`: the pinned copies' stream).
void register_sleep_cost(cudaStream_t stream);

}  // namespace stitch_bench
