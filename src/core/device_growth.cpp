// core/device_growth.cpp — the per-device slow path: the ladder a request climbs when no cached
// block fits (garbage collection, new memory, releasing oversize segments, stitching, releasing
// everything cached and retrying, compaction, spill), and the release of everything cached.
#include "core/device_allocator.hpp"

#include <cstdint>
#include "core/size_policy.hpp"

namespace stitch {

DeviceAllocator::Block* DeviceAllocator::allocate_slow(BlockPool& pool, stream_t stream,
                                                       std::size_t rounded,
                                                       std::size_t requested) {
  const bool touch = pools_.may_touch_device({stream});
  // Tagged memory always lies in expandable ranges of its own (a sleep unmaps their pages), a
  // tagged graph pool's too; an untagged private pool grows by plain segments of its own.
  const bool private_pool = pool.owner != nullptr && pool.tag == 0;
  const bool ranged = pool.tag != 0 || (config_.expandable_segments && pool.owner == nullptr);
  // What new memory is obtained for the request: the segment size, or the request in pages.
  const std::size_t alloc_size =
      private_pool || !ranged
          ? detail::segment_size(rounded)
          : detail::round_up(rounded, ranges_.page_size(pool.small, ranges_.short_of_memory(rounded)));
  // The device's one source of new memory: a plain segment, or pages of an expandable range.
  auto grow = [&] {
    return ranged ? ranges_.grow(pool, stream, rounded, !touch)
                  : plain_.allocate(pool, stream, alloc_size);
  };
  Block* block = nullptr;
  if (!touch) {
    // A stream may be capturing: new memory only, nothing released, synchronized, unmapped or
    // moved. A private pool grows by plain segments of its own (the segment is the pool's).
    block = private_pool ? plain_.allocate(pool, stream, alloc_size) : grow();
  } else {
    if (ledger_.cap() && config_.garbage_collection_threshold > 0.0) plain_.collect_garbage();
    // stitch_before_grow_mb: large requests reuse the stream's scattered free pages first.
    if (config_.stitching && config_.stitch_before_grow != 0 &&
        rounded >= config_.stitch_before_grow && ranges_.short_of_memory(rounded))
      block = stitcher_.stitch(pool, stream, rounded, true);
    if (block == nullptr) block = grow();
    if (block == nullptr && plain_.release_oversize(stream, rounded)) block = grow();
    // Stitching comes before the last resort below: it reuses the free pages that the last
    // resort would unmap and give back, without a round trip through the device or a sync of
    // every event.
    if (block == nullptr && config_.stitching)
      block = stitcher_.stitch(pool, stream, rounded, false);
    if (block == nullptr) {
      // Last resort: wait for every outstanding event, return every free segment and page, retry.
      release_cached_blocks();
      kv_.release_unused(/*all=*/true);  // every KV pool's unused pages, its reserve too
      ++stats_.num_alloc_retries;
      block = store_.best_fit(pool, stream, rounded);  // a pending block may have become free
      if (block == nullptr) block = grow();
      // Free memory that stays mapped (on pages live blocks share, or freed by the wait) is
      // stitched from.
      if (block == nullptr && config_.stitching)
        block = stitcher_.stitch(pool, stream, rounded, false);
      // stitch_compact: the live granules of partly used coarse pages move to fresh pages at
      // the same addresses, and the pages' free granules go back to the device for this request.
      if (block == nullptr && config_.stitch_compact && compactor_.compact(stream, rounded)) {
        block = grow();
        if (block == nullptr) block = stitcher_.stitch(pool, stream, rounded, false);
      }
      // spill:tags|all: cold live memory moves to host pages at the same addresses, a mapping
      // at a time, until the request fits.
      if (block == nullptr && config_.spill != Config::Spill::off && ranged)
        block = residency_.spill_for_request([&]() -> Block* {
          Block* b = grow();
          if (b == nullptr && config_.stitching) b = stitcher_.stitch(pool, stream, rounded, false);
          return b;
        });
    }
  }
  if (block == nullptr) capture_oom(requested, rounded, alloc_size, pool.small, stream);
  return block;
}

void DeviceAllocator::release_cached_blocks(std::size_t keep) {
  record_deferred_events();
  if (events_.outstanding() != 0) {
    ++stats_.num_sync_all_streams;
    events_.wait_all([this](Block* b) { complete_pending(b); });
  }
  note_hit_rules();
  plain_.release_free(true, keep);
  plain_.release_free(false, keep);
  ranges_.release_free_pages(keep);
  if (keep != 0 && ledger_.reserved() <= keep) return;
  kv_.release_unused(/*all=*/false);  // the KV pools' unused pages beyond their reserves
  if (keep != 0 && ledger_.reserved() <= keep) return;
  release_unused_pools();
}

void DeviceAllocator::release_unused_pools() {
  // A tagged graph pool's ranges: their free pages, then the wholly unmapped ranges.
  for (detail::Segment* s = store_.segments(); s != nullptr;) {
    detail::Segment* next = s->next;
    if (s->private_pool != nullptr && s->expandable && !s->asleep &&
        detail::PrivatePools::unused(s->private_pool))
      ranges_.release_range(s);
    s = next;
  }
  pools_.release_unused([this](Block* b) { plain_.release(b); });
}

}  // namespace stitch
