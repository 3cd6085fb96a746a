// benchmarks/gpu/compaction_cost.hpp — the compaction_cost/* benchmarks of stitch_gpu_bench (the
// device's copy bandwidth, compaction's copies and a whole compaction with its driver calls; see
// compaction_cost.cpp).
#pragma once

#include <cuda_runtime_api.h>

namespace stitch_bench {

/// Registers compaction_cost/{device_copy,to_host,from_host}/<S>MiB and
/// compaction_cost/{compact,copies}/<room|full>, run on `stream` on device 0.
void register_compaction_cost(cudaStream_t stream);

}  // namespace stitch_bench
