// core/cache_hit.hpp — the cache hit: an allocation that best fit serves from its stream's free
// blocks, and a free that needs no event, each under its stream shard's lock alone
// (core/stream_shard.hpp). Everything else takes the device lock (core/device_lock.hpp).
//
// The cache hit does exactly what the device lock's path does for the same request (best fit in
// the stream's pool, take and split; the live table; the statistics; file and coalesce): a block
// of a stream is only ever changed under that stream's lock, and the device lock holds every
// shard's. So the layout and every statistic depend only on the order in which requests take a
// stream's lock, never on which thread made them, and requests on different streams touch
// disjoint blocks, whatever order they run in.
//
// A request leaves the cache hit for the device lock, with nothing changed, when:
// - the hit is closed (set_closed(): the history is recorded, a private-pool route is underway,
//   events are outstanding or deferred, or a test turned it off);
// - allocating: 0 bytes or too many, a region is open on the thread (core/region_stack.hpp), the
//   stream has no shard yet, the rounded size is oversize (max_split_size), best fit finds no
//   block, or the live table is crowded;
// - freeing: the pointer is not found without the lock, or the block is oversize, was used on
//   another stream, is freed on another stream, is asleep or in a range with spilled pages, or belongs to a tag's or a private pool.
// The process must also be the one the allocator was created in (core/fork_guard.hpp); the
// device lock then refuses with an error.
//
// The live table (core/atomic_map.hpp) is read without a lock: a block found there is checked
// under its shard's lock (allocated, at that address) before anything uses it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "core/atomic_map.hpp"
#include "core/block_store.hpp"
#include "core/constants.hpp"
#include "core/fork_guard.hpp"
#include "core/hot_stats.hpp"
#include "core/region_stack.hpp"
#include "core/size_policy.hpp"
#include "core/stream_shards.hpp"
#include "stitch/config.hpp"

namespace stitch::detail {

/// The live allocations of a device: block address -> Block (each block knows its slot).
using LiveTable = AtomicMap<Block>;
/// LiveTable's placement callback: a rebuild moved `block` to `slot`.
inline void live_slot_moved(Block* block, AtomicSlot<Block>* slot) noexcept { block->live_slot = slot; }

class CacheHit {
 public:
  /// Why the cache hit is closed (any bit set): the device lock serves every request.
  enum Closed : std::uint32_t { kRecording = 1, kRouting = 2, kEvents = 4, kOff = 8 };
  /// What a free in the cache hit did.
  enum class Freed { yes, wrong_size, elsewhere };

  CacheHit(const Config& config, StreamShards& shards, BlockStore& store, HotStats& hot,
           LiveTable& live, std::uint64_t generation) noexcept
      : config_(config), shards_(shards), store_(store), hot_(hot), live_(live),
        generation_(generation) {}
  CacheHit(const CacheHit&) = delete;
  CacheHit& operator=(const CacheHit&) = delete;

  /// Sets whether the hit is closed for `why` (under the device lock: no hit is running).
  void set_closed(Closed why, bool closed) noexcept {
    const std::uint32_t now = closed_.load(std::memory_order_relaxed);
    closed_.store(closed ? now | why : now & ~static_cast<std::uint32_t>(why), std::memory_order_relaxed);
  }

  /// Allocates `size` bytes for `stream` from the stream's free blocks; nullptr: the device lock
  /// decides (nothing changed). Throws std::bad_alloc with nothing changed.
  void* allocate(std::size_t size, stream_t stream) {
    if (size - 1 >= kMaxRequest - 1 || t_open_regions != 0 ||
        g_fork_generation.load(std::memory_order_relaxed) != generation_)
      return nullptr;
    StreamShard* shard = shards_.find(stream);
    if (shard == nullptr) return nullptr;
    std::lock_guard guard(shard->lock);
    if (closed_.load(std::memory_order_relaxed) != 0 || live_.crowded()) return nullptr;
    const std::size_t rounded = round_size(size, config_.roundup_power2_divisions);
    if (rounded >= config_.max_split_size) return nullptr;
    const bool small = is_small(rounded);
    BlockPool& pool = shard->pool(small);
    // The stream's last free, taken back where best fit would put the request (BlockPool::held),
    // else filed before anything else changes.
    if (pool.held.block != nullptr) {
      if (Block* block = store_.take_held(pool, stream, rounded)) {
        LiveTable::publish(block->live_slot, block);  // (its key's slot, dormant since its free)
        return served(*shard, block, size);
      }
      store_.settle(pool);
    }
    Block* fit = store_.find_fit(pool, stream, rounded);
    if (fit == nullptr) return nullptr;
    shard->blocks.reserve(1);  // take() cannot fail (may throw: nothing changed)
    LiveTable::Slot* slot = live_.claim(LiveTable::key_of(fit->ptr));
    if (slot == nullptr) return nullptr;
    store_.tick(pool);  // the lookup counts for the GC clock, as best_fit's
    Block* block = store_.take(pool, fit, rounded);
    block->live_slot = slot;
    LiveTable::publish(slot, block);
    return served(*shard, block, size);
  }

  /// Frees `ptr` as DeviceAllocator::free does, if the cache hit may. Throws std::bad_alloc with
  /// nothing changed.
  Freed free(void* ptr, const std::size_t* expected_size, const stream_t* stream,
             std::size_t* actual_size) {
    if (g_fork_generation.load(std::memory_order_relaxed) != generation_) return Freed::elsewhere;
    Block* block = live_.find(LiveTable::key_of(ptr));
    if (block == nullptr) return Freed::elsewhere;
    StreamShard* shard = block->shard;
    std::lock_guard guard(shard->lock);
    if (block->state != BlockState::allocated || block->ptr != ptr) return Freed::elsewhere;
    if (actual_size != nullptr) *actual_size = block->requested;
    if (expected_size != nullptr && *expected_size != block->requested) return Freed::wrong_size;
    BlockPool& pool = shard->pool(block->small);
    if (closed_.load(std::memory_order_relaxed) != 0 || block->oversize ||
        !block->stream_uses.empty() || (stream != nullptr && *stream != block->stream) ||
        block->segment->pool != &pool || block->segment->asleep || block->segment->spilled != 0)
      return Freed::elsewhere;
    // The stream's last free is filed first (may throw: nothing changed).
    if (pool.held.block != nullptr) store_.settle(pool);
    LiveTable::publish(block->live_slot, nullptr);
    HotStats::freed_block(shard->stats, block->small, static_cast<std::int64_t>(block->size));
    HotStats::inactive_block(shard->stats, block->small, static_cast<std::int64_t>(block->requested));
    block->requested = 0;
    block->pins = 0;  // a pin lasts until the free
    store_.file_or_hold(pool, block);  // (the stream's last free now)
    return Freed::yes;
  }

  /// Calls fn(block) on the live block at `ptr` under its shard's lock. False, fn not called,
  /// when it is not found that way (the device lock looks again).
  template <typename Fn>
  bool with_live(const void* ptr, Fn&& fn) const {
    if (g_fork_generation.load(std::memory_order_relaxed) != generation_) return false;
    Block* block = live_.find(LiveTable::key_of(ptr));
    if (block == nullptr) return false;
    std::lock_guard guard(block->shard->lock);
    if (block->state != BlockState::allocated || block->ptr != ptr) return false;
    fn(*block);
    return true;
  }

 private:
  /// The cache hit's allocation `block` for `size` bytes: counted, its pointer returned.
  [[gnu::always_inline]] void* served(StreamShard& shard, Block* block, std::size_t size) noexcept {
    block->requested = size;
    block->oversize = false;
    hot_.allocated_block(shard.stats, block->small, static_cast<std::int64_t>(block->size),
                         static_cast<std::int64_t>(size));
    ++shard.stats.hits;
    return block->ptr;
  }

  const Config& config_;
  StreamShards& shards_;
  BlockStore& store_;
  HotStats& hot_;
  LiveTable& live_;
  const std::uint64_t generation_;  ///< the fork generation of the allocator (DeviceLock's)
  std::atomic<std::uint32_t> closed_{0};
};

}  // namespace stitch::detail
