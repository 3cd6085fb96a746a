// core/plain_segments.hpp — plain segments (cudaMalloc memory): the device's source of new memory
// without expandable segments, and every way such a segment goes back: one that is entirely
// free, cached oversize segments for a request (max_split_size), the oldest under
// garbage_collection_threshold, and all of them at the last resort or empty_cache.
#pragma once

#include <cstddef>

#include "core/block_store.hpp"
#include "core/ledger.hpp"
#include "stitch/backend.hpp"
#include "stitch/config.hpp"

namespace stitch::detail {

class PlainSegments {
 public:
  /// `config`, `store` and `ledger` must outlive it.
  PlainSegments(Backend& backend, int device, const Config& config, BlockStore& store,
                Ledger& ledger) noexcept
      : backend_(backend), device_(device), config_(config), store_(store), ledger_(ledger) {}

  /// A new segment of `bytes` in `pool` for `stream`: its one block, free; nullptr when the
  /// device or the memory fraction refuses. Throws backend_error for other failures.
  Block* allocate(BlockPool& pool, stream_t stream, std::size_t bytes);
  /// Returns the segment of `block` (free, over the whole plain segment) to the device. Throws,
  /// changing nothing.
  void release(Block* block);
  /// Returns every entirely free segment of the device's small or large pool (every stream's) to
  /// the device; with `keep`, stops as soon as reserved memory is at most `keep` bytes.
  void release_free(bool small, std::size_t keep = 0);
  /// Only with max_split_size: frees cached oversize segments of `stream` for a request of
  /// `rounded` bytes (one big enough, or the largest ones until they add up). False if none.
  bool release_oversize(stream_t stream, std::size_t rounded);
  /// garbage_collection_threshold: once reserved memory passes threshold x the memory fraction,
  /// frees unsplit large-pool segments that have sat unused longer than average, oldest first.
  void collect_garbage();
  /// The entirely free segment of exactly `bytes` on `stream` with the lowest address goes back
  /// (as a recording allocator's garbage collection did); false if there is none.
  bool release_one(stream_t stream, std::size_t bytes);

 private:
  /// A (free) block that is a whole plain segment, which may go back to the device.
  static bool whole_plain(const Block* b) noexcept {
    return !b->is_split() && !b->segment->expandable;
  }
  Backend& backend_;
  const int device_;
  const Config& config_;
  BlockStore& store_;
  Ledger& ledger_;
};

}  // namespace stitch::detail
