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
// Two kinds of hit. A pair (core/pair_verdict.hpp): the request takes the front of the free block
// the pool's held block (its last free) ends in, and that block's free gives it back, both under
// a verdict decided once for the held block, so neither looks at the index or the peaks. Every
// other hit (allocate_plain, free_plain) does best fit, takes, files and counts in full, and
// voids its pool's verdict (and the other pool's, when its counters pass what that one assumed).
//
// A request leaves the cache hit for the device lock, with nothing changed, when:
// - the hit is closed (set_closed(): the history is recorded, a private-pool route is underway,
//   events are outstanding or deferred, or a test turned it off);
// - allocating: 0 bytes or too many, a region is open on the thread (core/region_stack.hpp), the
//   stream has no shard yet, the rounded size is oversize (max_split_size), best fit finds no
//   block, or the live table is crowded;
// - freeing: the pointer is not found without the lock, or the block is oversize, was used on
//   another stream, is freed on another stream, is asleep or in a range with spilled pages, or
//   belongs to a tag's or a private pool.
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
  /// The tunables the hit reads, copied from `config` (under the device lock: no hit is running).
  void configure(const Config& config) noexcept;

  /// What take() did: the pair's pointer, or (nullptr) the stream's shard, whose lock it kept
  /// for allocate_plain(), and the request's rounded size, or neither (no lock held: the device
  /// lock decides).
  struct Taken {
    void* ptr;
    StreamShard* shard;
    std::size_t rounded;
  };
  /// A pair's take (core/pair_verdict.hpp) of `size` bytes for `stream`. Without `kWait`, a
  /// shard lock another thread holds is not waited for: neither pointer (the caller's full path
  /// waits), so that the pair calls nothing.
  template <bool kWait = true>
  [[gnu::always_inline]] Taken take(std::size_t size, stream_t stream) noexcept {
    if (size - 1 >= kMaxRequest - 1 || t_open_regions != 0 ||
        g_fork_generation.load(std::memory_order_relaxed) != generation_)
      return {nullptr, nullptr, 0};
    StreamShard* shard = shards_.find(stream);
    if (shard == nullptr) return {nullptr, nullptr, 0};
    if constexpr (kWait) {
      shard->lock.lock();
    } else if (!shard->lock.try_lock()) {
      return {nullptr, nullptr, 0};
    }
    const std::size_t rounded = plain_rounding_ ? round_up(size, kMinBlockSize)
                                                : round_size(size, config_.roundup_power2_divisions);
    BlockPool& pool = shard->pool(is_small(rounded));
    // The held block under its standing verdict (nothing can close the hit or make the request
    // oversize without voiding it: both change under the device lock, which does).
    if (Block* held = pool.held.block; held != nullptr && pool.verdict.held == held &&
        shard->taken == nullptr && fits(pool.verdict, rounded, size) &&
        hot_.board() == shard->stats.seen) [[likely]] {
      void* p = take_pair(*shard, pool, held, rounded, size);
      shard->lock.unlock();
      return {p, nullptr, rounded};
    }
    return {nullptr, shard, rounded};
  }
  /// An allocation of `size` bytes (`rounded`, take()'s) for `stream` that is not a pair's take
  /// (take() kept the lock of `shard`, `stream`'s; released here): a verdict decided for the
  /// held block, and its pair taken, or the held block taken back (take_held) or best fit in the
  /// pool's index (the held block filed first), counted in full. nullptr when the hit is closed,
  /// the request oversize, best fit finds no block or the live table has no room: the device
  /// lock decides (nothing changed). Throws std::bad_alloc with nothing changed.
  [[gnu::noinline]] void* allocate_plain(StreamShard& shard, std::size_t size, std::size_t rounded,
                                         stream_t stream);

  /// What give() did: `done`, or not and the live block found for the pointer, whose shard's
  /// lock it kept for free_plain() (nullptr: no lock held, the device lock looks).
  struct Given {
    Block* found;
    bool done;
  };
  /// A pair's free of `ptr` (`expected_size`, if not null, must be the requested size; `stream`,
  /// if not null, the block's own). Without `kWait`, as take().
  template <bool kWait = true>
  [[gnu::always_inline]] Given give(void* ptr, const std::size_t* expected_size,
                                    const stream_t* stream) noexcept {
    if (g_fork_generation.load(std::memory_order_relaxed) != generation_) return {nullptr, false};
    Block* block = live_.find(LiveTable::key_of(ptr));
    if (block == nullptr) return {nullptr, false};
    StreamShard* shard = block->shard;
    if constexpr (kWait) {
      shard->lock.lock();
    } else if (!shard->lock.try_lock()) {
      return {nullptr, false};
    }
    // The shard's taken block (allocated), freed as asked, under its standing verdict.
    const std::size_t requested = block->requested;
    if (block == shard->taken && block->ptr == ptr &&
        (expected_size == nullptr || *expected_size == requested) &&
        (stream == nullptr || *stream == block->stream)) [[likely]] {
      if (BlockPool& pool = shard->pool(block->small);
          pool.verdict.held == block && hot_.board() == shard->stats.seen) [[likely]] {
        give_pair(*shard, pool, block, requested);
        shard->lock.unlock();
        return {nullptr, true};
      }
    }
    return {block, false};
  }
  /// A free of `ptr` that is not a pair's, as DeviceAllocator::free would do it, if the cache
  /// hit may (give() kept the lock of `found`'s shard; released here): checked, held
  /// (BlockStore::file_or_hold) and counted in full, or refused with nothing changed (wrong
  /// size; elsewhere: the device lock looks).
  [[gnu::noinline]] Freed free_plain(Block& found, const void* ptr, const std::size_t* expected_size,
                                     const stream_t* stream, std::size_t* actual_size) noexcept;
  /// free_plain() inlined into its caller: the entry points' frame for a free the pair declined
  /// (api/allocator_free.cpp, api/allocator.cpp), one frame past the entry point, not two.
  [[gnu::always_inline]] Freed free_plain_inline(Block& found, const void* ptr,
                                                 const std::size_t* expected_size,
                                                 const stream_t* stream, std::size_t* actual_size) noexcept;

  /// Calls fn(block) on the live block at `ptr` under its shard's lock. False, fn not called,
  /// when it is not found that way (the device lock looks again).
  template <typename Fn>
  bool with_live(const void* ptr, Fn&& fn) const {
    if (g_fork_generation.load(std::memory_order_relaxed) != generation_) return false;
    Block* block = live_.find(LiveTable::key_of(ptr));
    if (block == nullptr) return false;
    std::lock_guard guard(block->shard->lock);
    if (block->state != BlockState::allocated || block->ptr != ptr) return false;
    block->shard->touch();  // (fn may change the block and its pool's pairs)
    fn(*block);
    return true;
  }

 private:
  /// Whether a pair under `v` serves a request of `size` bytes rounded to `rounded`.
  [[gnu::always_inline]] static bool fits(const PairVerdict& v, std::size_t rounded,
                                          std::size_t size) noexcept {
    return rounded - v.min_size <= v.span &&
           static_cast<std::int64_t>(size) <= v.max_requested;
  }
  /// A pair's take: the front of the free block `held` ends in (held, then the parked block) for
  /// `size` bytes rounded to `rounded`, as BlockStore::take_held and the statistics would make it.
  [[gnu::always_inline]] void* take_pair(StreamShard& shard, BlockPool& pool, Block* held,
                                         std::size_t rounded, std::size_t size) noexcept {
    const PairVerdict& v = pool.verdict;
    Block* rest = held->next;  // (the parked block)
    if (gc_clock_) store_.tick(pool);  // one best-fit lookup
    rest->ptr = held->ptr + rounded;
    rest->size = v.merged - rounded;
    rest->gc_stamp = pool.held.stamp;  // (the free block's stamp, which the rest keeps)
    held->size = rounded;
    pool.held = BlockPool::Held{};
    set_state(*held, BlockState::allocated);
    held->requested = size;
    held->oversize = false;
    LiveTable::publish(held->live_slot, held);  // (its key's slot, dormant since its free)
    const auto bytes = static_cast<std::int64_t>(rounded);
    const auto asked = static_cast<std::int64_t>(size);
    if (held->small) {
      HotStats::pair<0, 1>(shard.stats, bytes, asked, v.split, static_cast<std::int64_t>(v.merged));
    } else {
      HotStats::pair<1, 1>(shard.stats, bytes, asked, v.split, static_cast<std::int64_t>(v.merged));
    }
    ++shard.stats.hits;
    shard.taken = held;
    if (held->ptr == nullptr) __builtin_unreachable();  // (a block's address: the caller tests none)
    return held->ptr;
  }
  /// A pair's free: `block`, the shard's taken block, held again in front of the parked block,
  /// as BlockStore::file_or_hold and the statistics would make it.
  [[gnu::always_inline]] void give_pair(StreamShard& shard, BlockPool& pool, Block* block,
                                        std::size_t requested) noexcept {
    const PairVerdict& v = pool.verdict;
    LiveTable::publish(block->live_slot, nullptr);
    const auto bytes = static_cast<std::int64_t>(block->size);
    const auto asked = static_cast<std::int64_t>(requested);
    if (block->small) {
      HotStats::pair<0, -1>(shard.stats, bytes, asked, v.split, static_cast<std::int64_t>(v.merged));
    } else {
      HotStats::pair<1, -1>(shard.stats, bytes, asked, v.split, static_cast<std::int64_t>(v.merged));
    }
    block->requested = 0;
    block->pins = 0;  // a pin lasts until the free
    pool.held = BlockPool::Held{block, pool.clock->load(std::memory_order_relaxed)};
    set_state(*block, BlockState::held);
    shard.taken = nullptr;
  }
  /// What decide() found for a request of `rounded` bytes.
  enum class Decision {
    pair,       ///< a verdict stands (the request may still not fit it)
    elsewhere,  ///< the held block's free block does not serve the request (best fit: the index)
    none,       ///< no verdict: BlockStore::take_held decides
  };
  /// Decides the pool's verdict for its held block `held` (core/pair_verdict.hpp), or none,
  /// looking at a request of `rounded` bytes first.
  [[gnu::always_inline]] Decision decide(StreamShard& shard, BlockPool& pool, Block* held,
                                         std::size_t rounded) noexcept;
  /// A plain path is about to change `pool`: its verdict is void, and the shard's taken block's
  /// free will be a plain one.
  static void begin_plain(StreamShard& shard, BlockPool& pool) noexcept {
    pool.verdict.held = nullptr;
    shard.taken = nullptr;
  }
  /// A plain path changed `pool`'s counters: the other pool's verdict stands only if they stay
  /// within what it assumed.
  static void end_plain(StreamShard& shard, const BlockPool& pool) noexcept {
    BlockPool& other = shard.pool(!pool.small);
    if (other.verdict.held != nullptr && !HotStats::within(shard.stats, pool.small, other.verdict.other))
      other.verdict.held = nullptr;
  }

  const Config& config_;
  StreamShards& shards_;
  BlockStore& store_;
  HotStats& hot_;
  LiveTable& live_;
  const std::uint64_t generation_;  ///< the fork generation of the allocator (DeviceLock's)
  std::atomic<std::uint32_t> closed_{0};
  std::size_t max_split_ = 0;   ///< config_.max_split_size (configure())
  bool plain_rounding_ = true;  ///< no roundup_power2_divisions: sizes round to 512 B
  bool gc_clock_ = false;       ///< BlockStore::gc_clock_runs()
};

inline CacheHit::Freed CacheHit::free_plain_inline(Block& found, const void* ptr,
                                                   const std::size_t* expected_size,
                                                   const stream_t* stream,
                                                   std::size_t* actual_size) noexcept {
  Block* block = &found;
  StreamShard& shard = *block->shard;
  std::lock_guard guard(shard.lock, std::adopt_lock);
  if (block->state != BlockState::allocated || block->ptr != ptr) return Freed::elsewhere;
  if (actual_size != nullptr) *actual_size = block->requested;
  if (expected_size != nullptr && *expected_size != block->requested) return Freed::wrong_size;
  BlockPool& pool = shard.pool(block->small);
  const Segment* segment = block->segment;
  if (closed_.load(std::memory_order_relaxed) != 0 || block->oversize ||
      !block->stream_uses.empty() || (stream != nullptr && *stream != block->stream) ||
      segment->pool != &pool || segment->asleep || segment->spilled != 0)
    return Freed::elsewhere;
  begin_plain(shard, pool);
  // The stream's last free is filed first.
  if (pool.held.block != nullptr) store_.settle(pool);
  LiveTable::publish(block->live_slot, nullptr);
  HotStats::hit_freed(shard.stats, block->small, static_cast<std::int64_t>(block->size),
                      static_cast<std::int64_t>(block->requested));
  block->requested = 0;
  block->pins = 0;  // a pin lasts until the free
  store_.file_or_hold(pool, block);  // (the stream's last free now)
  end_plain(shard, pool);
  return Freed::yes;
}

}  // namespace stitch::detail
