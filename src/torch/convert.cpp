// torch/convert.cpp — stitch's statistics, segments and settings in PyTorch's types.
#include "torch/convert.hpp"

#include <cstdint>
#include <limits>

namespace stitch::torch_native::detail {

namespace {
void copy(const Stat& from, c10::CachingAllocator::Stat& to) {
  to.current = from.current;
  to.peak = from.peak;
  to.allocated = from.allocated;
  to.freed = from.freed;
}
void copy(const StatArray& from, c10::CachingAllocator::StatArray& to) {
  for (std::size_t i = 0; i < from.size(); ++i) copy(from[i], to[i]);
}
}  // namespace

cda::DeviceStats to_torch(const DeviceStats& s) {
  cda::DeviceStats t;
  copy(s.allocation, t.allocation);
  copy(s.segment, t.segment);
  copy(s.active, t.active);
  copy(s.inactive_split, t.inactive_split);
  copy(s.allocated_bytes, t.allocated_bytes);
  copy(s.reserved_bytes, t.reserved_bytes);
  copy(s.active_bytes, t.active_bytes);
  copy(s.inactive_split_bytes, t.inactive_split_bytes);
  copy(s.requested_bytes, t.requested_bytes);
  copy(s.oversize_allocations, t.oversize_allocations);
  copy(s.oversize_segments, t.oversize_segments);
  t.num_alloc_retries = s.num_alloc_retries;
  t.num_ooms = s.num_ooms;
  t.num_sync_all_streams = s.num_sync_all_streams;
  t.num_device_alloc = s.num_device_alloc;
  t.num_device_free = s.num_device_free;
  t.max_split_size = s.max_split_size;
  return t;
}

std::vector<cda::SegmentInfo> to_torch(const std::vector<SegmentSnapshot>& segments,
                                       c10::MempoolId_t pool, const TraceBook& book) {
  const bool all = pool == c10::MempoolId_t{0, 0};
  std::vector<cda::SegmentInfo> out;
  for (const SegmentSnapshot& s : segments) {
    if (!all && s.pool_id != pool) continue;
    cda::SegmentInfo& t = out.emplace_back();
    t.device = static_cast<c10::DeviceIndex>(s.device);
    t.address = s.address;
    t.total_size = s.total_size;
    t.requested_size = s.requested_size;
    t.allocated_size = s.allocated_size;
    t.active_size = s.active_size;
    t.stream = reinterpret_cast<void*>(s.stream);
    t.is_large = s.segment_type == "large";
    t.is_expandable = s.is_expandable;
    t.owner_private_pool_id = s.pool_id;
    for (const BlockSnapshot& b : s.blocks) {
      if (b.state == "unmapped") continue;
      cda::BlockInfo& bi = t.blocks.emplace_back();
      bi.size = b.size;
      bi.requested_size = b.requested_size;
      bi.allocated = b.state == "active_allocated";
      bi.active = bi.allocated || b.state == "active_pending_free";
      if (bi.active) bi.context_when_allocated = book.context_of(b.address);
    }
    t.context_when_allocated = book.segment_context(s.address);
  }
  return out;
}

c10::cuda::CUDACachingAllocator::AllocatorConfigInfo to_torch(const Config& c) {
  c10::cuda::CUDACachingAllocator::AllocatorConfigInfo m{};
  m.garbage_collection_threshold = c.garbage_collection_threshold;
  m.max_split_size = c.max_split_size;
  m.pinned_num_register_threads = 1;
  m.expandable_segments = c.expandable_segments;
  m.release_lock_on_malloc = false;
  m.pinned_use_host_register = false;
  m.graph_capture_record_stream_reuse = false;
  m.last_allocator_settings = c.source;
  m.roundup_power2_divisions.assign(c.roundup_power2_divisions.begin(), c.roundup_power2_divisions.end());
  m.max_round_threshold = std::numeric_limits<std::size_t>::max();
  m.max_cached_size = std::numeric_limits<std::size_t>::max();
  return m;
}

}  // namespace stitch::torch_native::detail
