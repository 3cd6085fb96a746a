// torch/convert.hpp — stitch's statistics, segments and settings in PyTorch's types
// (DeviceStats, SegmentInfo, AllocatorConfigInfo).
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <vector>

#include "stitch/allocator.hpp"
#include "torch/trace_book.hpp"

namespace stitch::torch_native::detail {

[[nodiscard]] cda::DeviceStats to_torch(const DeviceStats& stats);
/// The segments of `segments` in pool `pool` ({0, 0}: all), blocks with the contexts `book`
/// kept for them. Unmapped parts of expandable ranges are not blocks (as PyTorch shows them).
[[nodiscard]] std::vector<cda::SegmentInfo> to_torch(const std::vector<SegmentSnapshot>& segments,
                                                     c10::MempoolId_t pool, const TraceBook& book);
[[nodiscard]] c10::cuda::CUDACachingAllocator::AllocatorConfigInfo to_torch(const Config& config);

}  // namespace stitch::torch_native::detail
