// core/device_allocator_slow.cpp — the per-device slow path: new segments, the out-of-memory
// ladder (garbage collection, releasing oversize and then all cached segments, retry), returning
// memory to the device, and cross-stream events.
#include <algorithm>
#include <vector>

#include "core/device_allocator.hpp"
#include "core/stat_update.hpp"
#include "core/size_policy.hpp"
#include "diagnostics/oom_report.hpp"
#include "stitch/errors.hpp"

namespace stitch {

using detail::add;
using detail::sub;

DeviceAllocator::Block* DeviceAllocator::allocate_slow(Pool& pool, stream_t stream,
                                                       std::size_t rounded,
                                                       std::size_t requested) {
  // New memory comes from a new segment or, with expandable segments, from mapping more pages.
  const bool expandable = config_.expandable_segments;
  const std::size_t page = expandable ? page_size(pool.small) : 0;
  const std::size_t alloc_size =
      expandable ? (rounded + page - 1) / page * page : detail::segment_size(rounded);
  auto grow = [&] {
    return expandable ? grow_expandable(pool, stream, rounded)
                      : alloc_segment(pool, stream, alloc_size);
  };
  if (ledger_.cap() && config_.garbage_collection_threshold > 0.0) garbage_collect();
  Block* block = nullptr;
  // stitch_before_grow_mb: large requests reuse the stream's scattered free pages first.
  if (config_.stitching && config_.stitch_before_grow != 0 && rounded >= config_.stitch_before_grow)
    block = stitch_pages(pool, stream, rounded, true);
  if (block == nullptr) block = grow();
  if (block == nullptr && release_available_cached_blocks(stream, rounded)) block = grow();
  // Stitching comes before the last resort below: it reuses the free pages that the last resort
  // would unmap and give back, without a round trip through the device or a sync of every event.
  if (block == nullptr && config_.stitching) block = stitch_pages(pool, stream, rounded, false);
  if (block == nullptr) {
    // Last resort: wait for every outstanding event, return every free segment and page, retry.
    release_cached_blocks();
    ++stats_.num_alloc_retries;
    block = get_free_block(pool, stream, rounded);  // a pending block may have become free
    if (block == nullptr) block = grow();
  }
  if (block == nullptr) capture_oom(requested, rounded, alloc_size, pool.small, stream);
  return block;
}

DeviceAllocator::Block* DeviceAllocator::link_new_segment(Pool& pool, stream_t stream, char* base,
                                                          std::size_t size) {
  auto* segment = new Segment;
  segment->base = base;
  segment->size = size;
  segment->stream = stream;
  segment->small = pool.small;
  segment->next = segments_;
  if (segments_ != nullptr) segments_->prev = segment;
  segments_ = segment;
  Block* block = blocks_.create(base, size, stream, segment, pool.small);
  segment->head = block;
  return block;
}

DeviceAllocator::Block* DeviceAllocator::alloc_segment(Pool& pool, stream_t stream,
                                                       std::size_t bytes) {
  if (!ledger_.fits(bytes)) return nullptr;
  void* ptr = backend_.allocate(device_, bytes);  // throws backend_error for non-OOM failures
  if (ptr == nullptr) return nullptr;
  Block* block = link_new_segment(pool, stream, static_cast<char*>(ptr), bytes);
  Segment* segment = block->segment;
  segment->oversize = bytes >= config_.max_split_size;
  ledger_.segment_allocated(pool.small, bytes, segment->oversize);
  pool.index.insert(block);  // free until alloc_found_block takes it
  trace(TraceAction::segment_alloc, ptr, bytes, stream);
  return block;
}

void DeviceAllocator::release_segment(Block* block) {
  // `block` is free, in its index, and spans its whole segment.
  Segment* segment = block->segment;
  backend_.deallocate(device_, segment->base, segment->size);  // throws: nothing changed
  trace(TraceAction::segment_free, segment->base, segment->size, segment->stream);
  pool_for(block->small).index.erase(block);
  ledger_.segment_freed(segment->small, segment->size, segment->oversize);
  unlink_segment(segment, block);
}

void DeviceAllocator::unlink_segment(Segment* segment, Block* head) noexcept {
  if (segment->prev != nullptr) segment->prev->next = segment->next;
  if (segment->next != nullptr) segment->next->prev = segment->prev;
  if (segments_ == segment) segments_ = segment->next;
  blocks_.destroy(head);
  delete segment;
}

bool DeviceAllocator::release_cached_blocks() {
  if (events_.outstanding() != 0) {
    ++stats_.num_sync_all_streams;
    events_.wait_all([this](Block* b) { complete_pending(b); });
  }
  std::vector<Block*> whole;
  for (Pool* pool : {&small_, &large_})
    for (Block* b : pool->index)
      if (!b->is_split() && !b->segment->expandable) whole.push_back(b);
  for (Block* b : whole) release_segment(b);
  release_expandable_pages();
  return true;
}

bool DeviceAllocator::release_available_cached_blocks(stream_t stream, std::size_t rounded) {
  // Only with max_split_size set: free cached oversize segments of this stream, one big enough
  // or, failing that, the largest ones until they add up to the request.
  const std::size_t max_split = config_.max_split_size;
  if (max_split == Config::kUnlimited) return false;
  const std::size_t want = std::max(rounded, max_split);
  auto& index = large_.index;
  auto it = index.lower_bound(detail::FreeKey{stream, want, nullptr});
  if (it != index.end() && (*it)->stream == stream && !(*it)->is_split() &&
      !(*it)->segment->expandable) {
    release_segment(*it);
    return true;
  }
  std::vector<Block*> victims;
  std::size_t total = 0;
  while (it != index.begin() && total < want) {
    --it;
    Block* b = *it;
    if (b->stream != stream || b->size < max_split) break;
    if (b->is_split() || b->segment->expandable) continue;
    victims.push_back(b);
    total += b->size;
  }
  if (total < want) return false;
  for (Block* b : victims) release_segment(b);
  return true;
}

void DeviceAllocator::garbage_collect() {
  // PyTorch's garbage_collection_threshold: once reserved memory passes threshold x allowed,
  // free unsplit large-pool segments that have sat unused longer than average, oldest first.
  const auto reserved = static_cast<double>(ledger_.reserved());
  const double limit = config_.garbage_collection_threshold * static_cast<double>(*ledger_.cap());
  if (reserved <= limit) return;
  const double target = reserved - limit;
  double reclaimed = 0;
  std::vector<Block*> candidates;
  for (Block* b : large_.index)
    if (!b->is_split() && !b->segment->expandable) candidates.push_back(b);
  while (reclaimed < target && !candidates.empty()) {
    double total_age = 0;
    for (Block* b : candidates) total_age += static_cast<double>(large_.calls - b->gc_stamp);
    const double mean_age = total_age / static_cast<double>(candidates.size());
    std::vector<Block*> keep;
    bool freed = false;
    for (Block* b : candidates) {
      if (reclaimed < target && static_cast<double>(large_.calls - b->gc_stamp) >= mean_age) {
        reclaimed += static_cast<double>(b->size);
        release_segment(b);
        freed = true;
      } else {
        keep.push_back(b);
      }
    }
    if (!freed) break;
    candidates.swap(keep);
  }
}

// ---- out of memory ----------------------------------------------------------------------------

std::size_t DeviceAllocator::largest_free_block() const {
  std::size_t largest = 0;
  for (const Pool* pool : {&small_, &large_})
    for (const Block* b : pool->index) largest = std::max(largest, b->size);
  return largest;
}

void DeviceAllocator::capture_oom(std::size_t requested, std::size_t rounded,
                                  std::size_t alloc_size, bool small, stream_t stream) {
  ++stats_.num_ooms;
  failed_ = std::make_unique<detail::OomCapture>();
  detail::OomCapture* oom = failed_.get();
  detail::OomFacts& f = oom->facts;
  f.device = device_;
  f.requested = requested;
  f.rounded = rounded;
  f.alloc_size = alloc_size;
  try {
    const MemoryInfo info = backend_.memory_info(device_);
    f.device_total = info.total;
    f.device_free = info.free;
  } catch (...) {
    f.device_info_known = false;
  }
  f.allowed = ledger_.cap();
  f.reserved = ledger_.reserved();
  f.allocated = static_cast<std::size_t>(hot_.allocated_bytes.current());
  f.largest_free_block = largest_free_block();
  f.expandable = config_.expandable_segments;
  for (const Pool* pool : {&small_, &large_}) {
    for (const Block* b : pool->index) {
      if (pool->small != small) {
        f.free_other_pool += b->size;
      } else if (b->stream != stream) {
        f.free_other_streams += b->size;
      } else {
        f.free_same += b->size;
        ++f.free_blocks_same;
        f.largest_free_same = std::max(f.largest_free_same, b->size);
        const int bucket = b->size < (1u << 20) ? 0 : b->size < (10u << 20) ? 1
                         : b->size < (100u << 20) ? 2 : 3;
        ++f.scatter[static_cast<std::size_t>(bucket)].first;
        f.scatter[static_cast<std::size_t>(bucket)].second += b->size;
      }
    }
  }
  // The five largest live blocks, with their allocation stacks when they were recorded.
  std::vector<const Block*> live;
  live_.for_each([&](const void*, const Block* b) { live.push_back(b); });
  const std::size_t top = std::min<std::size_t>(5, live.size());
  std::partial_sort(live.begin(), live.begin() + static_cast<std::ptrdiff_t>(top), live.end(),
                    [](const Block* x, const Block* y) { return x->size > y->size; });
  for (std::size_t i = 0; i < top; ++i) {
    const auto address = reinterpret_cast<std::uintptr_t>(live[i]->ptr);
    f.largest_live.push_back({address, live[i]->size, live[i]->requested,
                              recorder_.alloc_frames(address)});
  }
  // The what-if check replays the workload later, outside this lock (Allocator::allocate).
  oom->what_if_enabled = config_.oom_what_if;
  if (detail::what_if_wanted(f, config_.oom_what_if)) {
    try {
      oom->what_if = what_if_input(stream);
    } catch (...) {
      oom->capture_failed = true;
    }
  }
  trace(TraceAction::oom, reinterpret_cast<const void*>(f.device_free), alloc_size, stream);
}

}  // namespace stitch
