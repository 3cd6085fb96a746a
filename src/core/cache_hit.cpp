// core/cache_hit.cpp — the cache hit's plain paths (an allocation or a free that is not a held
// block's pair: best fit, take, file, counted in full) and the pair verdict's decision. Each plain
// path is one frame: the decision and the store's take, take-back and hold are inlined into it.
// Calls remain for filing the previous held block, a new verdict's looks at the index and the
// peaks, a peak's update and the tree's inserts and erases. The plain free's body is
// CacheHit::free_plain_inline (core/cache_hit.hpp), which the entry points' frame after a declined
// pair inlines too (Allocator::deallocate_unhit, free_any_device_unhit).
#include "core/cache_hit.hpp"

#include <algorithm>
#include <mutex>

namespace stitch::detail {

void CacheHit::configure(const Config& config) noexcept {
  max_split_ = config.max_split_size;
  plain_rounding_ = std::all_of(config.roundup_power2_divisions.begin(),
                                config.roundup_power2_divisions.end(),
                                [](std::uint32_t d) { return d <= 1; });
  gc_clock_ = store_.gc_clock_runs();
}

inline CacheHit::Decision CacheHit::decide(StreamShard& shard, BlockPool& pool, Block* held,
                                          std::size_t rounded) noexcept {
  PairVerdict& v = pool.verdict;
  v.held = nullptr;
  Block* rest = held->next;
  // The held block in front of a free one: together the free block M best fit weighs.
  if (rest == nullptr || !rest->is_free()) return Decision::none;
  const std::size_t merged = held->size + rest->size;
  if (rounded > merged) return Decision::elsewhere;
  if (merged >= max_split_) return Decision::none;  // (an oversize block serves no request of the hit)
  // Best fit takes M unless an indexed block of at least the request comes before it.
  std::size_t min_size = kMinBlockSize;
  if (pool.index.size() != 0) min_size = std::max(min_size, store_.best_fit_before(pool, held) + 1);
  if (const Block* p = pool.parked;  // (another block parked: weighed as if indexed)
      p != nullptr && p != rest && (p->size < merged || (p->size == merged && p->ptr < held->ptr)))
    min_size = std::max(min_size, p->size + 1);
  if (rounded < min_size) return Decision::elsewhere;
  const std::size_t fit_min = min_size;
  // The rest is split off (BlockStore::should_split): at least 512 bytes in the small pool and
  // expandable segments, more than 1 MiB in plain large segments.
  const bool flexible = held->small || held->segment->expandable;
  const std::size_t keep = flexible ? kMinBlockSize : kSmallSize + kMinBlockSize;
  if (merged < keep + rounded) return Decision::none;
  std::size_t max_size = merged - keep;
  // No pair may pass a room (HotStats): the take's rises, and the free's rise back to the held
  // state, stay within them, so neither can make a new peak.
  // (Rooms stale since another shard moved the board: no verdict, rather than the other shards'
  // ceilings read from here; the plain path recomputes them only when a rise needs it.)
  if (hot_.board() != shard.stats.seen) return Decision::none;
  std::int64_t slack[kHotCounters];
  hot_.slack(shard.stats, held->small, slack, v.other);
  if (slack[kAllocations] < 1 || slack[kAllocatedBytes] < static_cast<std::int64_t>(kMinBlockSize) ||
      slack[kRequestedBytes] < 1)
    return Decision::none;
  max_size = std::min(max_size, static_cast<std::size_t>(slack[kAllocatedBytes]));
  const bool counts_splits = !held->segment->expandable;
  const bool merged_split = held->prev != nullptr || rest->next != nullptr;
  if (counts_splits) {
    const std::int64_t bytes = slack[kInactiveSplitBytes];
    if (merged_split) {
      if (bytes < 0) return Decision::none;  // (the free rises back to the held state)
    } else {
      // The take makes the rest a new inactive split of merged - size bytes.
      if (slack[kInactiveSplits] < 1 || bytes < 0) return Decision::none;
      if (static_cast<std::size_t>(bytes) < merged)
        min_size = std::max(min_size, merged - static_cast<std::size_t>(bytes));
    }
  }
  if (min_size > max_size) return Decision::none;
  store_.park(pool, rest);  // (the pairs change the rest without the tree)
  v.held = held;
  v.min_size = min_size;
  v.span = max_size - min_size;
  v.max_requested = slack[kRequestedBytes];
  v.merged = merged;
  v.fit_min = fit_min;
  v.split = !counts_splits ? HotStats::PairSplit::none
             : merged_split ? HotStats::PairSplit::shrink
                            : HotStats::PairSplit::fresh;
  return Decision::pair;
}

void* CacheHit::allocate_plain(StreamShard& shard, std::size_t size, std::size_t rounded,
                               stream_t stream) {
  std::lock_guard guard(shard.lock, std::adopt_lock);
  if (closed_.load(std::memory_order_relaxed) != 0 || live_.crowded()) return nullptr;
  if (rounded >= max_split_) return nullptr;
  BlockPool& pool = shard.pool(is_small(rounded));
  // A verdict that still holds for the held block knows where best fit puts a smaller request.
  const bool below = pool.verdict.held == pool.held.block && rounded < pool.verdict.fit_min;
  begin_plain(shard, pool);
  Block* block = nullptr;
  if (Block* held = pool.held.block; held != nullptr) {
    const Decision d = below ? Decision::elsewhere : decide(shard, pool, held, rounded);
    if (d == Decision::pair && fits(pool.verdict, rounded, size))
      return take_pair(shard, pool, held, rounded, size);
    // Taken back where best fit would put the request, else filed before anything else changes.
    if (d != Decision::elsewhere) block = store_.take_held(pool, stream, rounded);
    if (block != nullptr) {
      LiveTable::publish(block->live_slot, block);  // (its key's slot, dormant since its free)
    } else {
      store_.settle(pool);
    }
  }
  if (block == nullptr) {
    Block* fit = store_.find_fit(pool, stream, rounded);
    if (fit == nullptr) return nullptr;
    shard.blocks.reserve(1);  // take() cannot fail (may throw: nothing changed)
    LiveTable::Slot* slot = live_.claim(LiveTable::key_of(fit->ptr));
    if (slot == nullptr) return nullptr;
    if (gc_clock_) store_.tick(pool);  // the lookup counts for the GC clock, as best_fit's
    block = store_.take(pool, fit, rounded);
    block->live_slot = slot;
    LiveTable::publish(slot, block);
  }
  block->requested = size;
  block->oversize = false;
  hot_.hit_allocated(shard.stats, block->small, static_cast<std::int64_t>(block->size),
                     static_cast<std::int64_t>(size));
  ++shard.stats.hits;
  end_plain(shard, pool);
  return block->ptr;
}

CacheHit::Freed CacheHit::free_plain(Block& found, const void* ptr, const std::size_t* expected_size,
                                     const stream_t* stream, std::size_t* actual_size) noexcept {
  return free_plain_inline(found, ptr, expected_size, stream, actual_size);
}

}  // namespace stitch::detail
