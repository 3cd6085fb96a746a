// stitch/private_pool.hpp — the identity of a private pool and the filter of a route to it, as
// PyTorch's CUDA graph pools name them (c10::cuda::MempoolId_t, and the stream filter of
// beginAllocateToPool). See Allocator::begin_allocate_to_pool.
#pragma once

#include <functional>
#include <utility>

#include "stitch/backend.hpp"

namespace stitch {

/// A private pool's id: PyTorch's MempoolId_t, a pair of CaptureId_t (unsigned long long).
using PoolId = std::pair<unsigned long long, unsigned long long>;
/// Which streams' allocations a route to a private pool takes.
using StreamFilter = std::function<bool(stream_t)>;

}  // namespace stitch
