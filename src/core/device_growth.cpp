// core/device_growth.cpp — the per-device slow path: the ladder a request climbs when no cached
// block fits (garbage collection, new memory, releasing oversize segments, stitching, releasing
// everything cached and retrying), its one source of new memory (a plain segment, or pages of an
// expandable range), and returning plain segments to the device.
#include <algorithm>
#include <vector>

#include "core/assert.hpp"
#include "core/device_allocator.hpp"
#include "core/size_policy.hpp"
#include "diagnostics/oom_report.hpp"
#include "stitch/errors.hpp"

namespace stitch {

DeviceAllocator::Block* DeviceAllocator::allocate_slow(Pool& pool, stream_t stream,
                                                       std::size_t rounded,
                                                       std::size_t requested) {
  // Memory parked in the threads' slots is free memory: completed before growing (the slow
  // path may release, move or reuse any free block).
  settle_slots();
  const std::size_t alloc_size = growth_size(pool.small, rounded);
  auto grow = [&] { return this->grow(pool, stream, rounded, alloc_size); };
  if (ledger_.cap() && config_.garbage_collection_threshold > 0.0) garbage_collect();
  Block* block = nullptr;
  // stitch_before_grow_mb: large requests reuse the stream's scattered free pages first.
  if (config_.stitching && config_.stitch_before_grow != 0 && rounded >= config_.stitch_before_grow &&
      short_of_memory(rounded))
    block = stitcher_.stitch(pool.small, stream, rounded, true);
  if (block == nullptr) block = grow();
  if (block == nullptr && release_available_cached_blocks(stream, rounded)) block = grow();
  // Stitching comes before the last resort below: it reuses the free pages that the last resort
  // would unmap and give back, without a round trip through the device or a sync of every event.
  if (block == nullptr && config_.stitching) block = stitcher_.stitch(pool.small, stream, rounded, false);
  if (block == nullptr) {
    // Last resort: wait for every outstanding event, return every free segment and page, retry.
    release_cached_blocks();
    ++stats_.num_alloc_retries;
    block = get_free_block(pool, stream, rounded);  // a pending block may have become free
    if (block == nullptr) block = grow();
    // Free memory that stays mapped (on pages live blocks share, or freed by the wait) is
    // stitched from.
    if (block == nullptr && config_.stitching)
      block = stitcher_.stitch(pool.small, stream, rounded, false);
  }
  if (block == nullptr) capture_oom(requested, rounded, alloc_size, pool.small, stream);
  return block;
}

std::size_t DeviceAllocator::growth_size(bool small, std::size_t rounded) {
  if (!config_.expandable_segments) return detail::segment_size(rounded);
  return detail::round_up(rounded, page_size(small, short_of_memory(rounded)));
}

DeviceAllocator::Block* DeviceAllocator::grow(Pool& pool, stream_t stream, std::size_t rounded,
                                              std::size_t alloc_size) {
  // New memory comes from a new segment or, with expandable segments, from mapping more pages.
  return config_.expandable_segments ? grow_expandable(pool, stream, rounded)
                                     : alloc_segment(pool, stream, alloc_size);
}

DeviceAllocator::Block* DeviceAllocator::link_new_segment(Pool& pool, stream_t stream, char* base,
                                                          std::size_t size) {
  auto* segment = new Segment;
  segment->base = base;
  segment->size = size;
  segment->stream = stream;
  segment->epoch = slots_.epoch(stream);
  segment->small = pool.small;
  segment->private_pool = pool.owner;
  if (pool.owner != nullptr) ++pool.owner->segments;
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
  STITCH_ASSERT(block->in_index && !block->is_split() && !block->segment->expandable,
                "release_segment: a free, indexed block over a whole plain segment");
  Segment* segment = block->segment;
  backend_.deallocate(device_, segment->base, segment->size);  // throws: nothing changed
  trace(TraceAction::segment_free, segment->base, segment->size, segment->stream);
  pool_of(block).index.erase(block);
  ledger_.segment_freed(segment->small, segment->size, segment->oversize);
  if (segment->private_pool != nullptr) --segment->private_pool->segments;
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
  record_deferred_events();
  if (events_.outstanding() != 0) {
    ++stats_.num_sync_all_streams;
    events_.wait_all([this](Block* b) { complete_pending(b); });
    note_events();
  }
  std::vector<Block*> whole;
  for (Pool* pool : {&small_, &large_})
    for (Block* b : pool->index)
      if (!b->is_split() && !b->segment->expandable) whole.push_back(b);
  for (Block* b : whole) release_segment(b);
  release_expandable_pages();
  release_private_pools();
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

}  // namespace stitch
