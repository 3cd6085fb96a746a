// core/stream_shard.hpp — StreamShard: one stream's share of a device, under a lock of its own.
//
// A block never serves another stream than its segment's, so a stream's free blocks are a pool of
// their own: the shard holds them (its two block pools, small and large, with their free indexes
// and unmapped sets), the Block objects of its segments, and its share of the hot
// statistics (core/hot_stats.hpp). The cache hit (core/cache_hit.hpp) takes only this lock, so
// threads on different streams never meet, and threads on one stream are ordered by it exactly as
// the device lock would order them. Everything else takes the device lock, which holds every
// shard's lock too (core/device_lock.hpp). A shard lives as long as its device allocator.
#pragma once

#include <atomic>

#include "core/block.hpp"
#include "core/block_pool.hpp"
#include "core/hot_stats.hpp"
#include "core/object_pool.hpp"
#include "core/spin_lock.hpp"

namespace stitch::detail {

struct StreamShard {
  explicit StreamShard(stream_t s, std::atomic<std::uint64_t>* clocks) noexcept
      : stream(s), small(true, nullptr, 0, &clocks[0]), large(false, nullptr, 0, &clocks[1]) {}
  StreamShard(const StreamShard&) = delete;
  StreamShard& operator=(const StreamShard&) = delete;

  BlockPool& pool(bool is_small) noexcept { return is_small ? small : large; }

  alignas(64) SpinLock lock;
  alignas(64) const stream_t stream;
  ObjectPool<Block> blocks;              ///< the Block objects of the stream's segments
  BlockPool small, large;                ///< the stream's blocks of the device's pools
  ShardStats stats;
  /// The block a pair took, until its free (at most one per shard: core/pair_verdict.hpp), or
  /// nullptr.
  Block* taken = nullptr;

  /// A change outside the pairs, to anything of the shard: no pair verdict holds, and the taken
  /// block's free is a plain one.
  void touch() noexcept {
    small.verdict.held = nullptr;
    large.verdict.held = nullptr;
    taken = nullptr;
  }
  /// The next shard in stream order (StreamShards); set under the device lock, read without.
  std::atomic<StreamShard*> next{nullptr};
};

}  // namespace stitch::detail
