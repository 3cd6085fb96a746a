// core/immediate_reuse.cpp — ImmediateReuse: the threads' slots taken, parked, settled, and the
// best-fit verdict on taking a parked block back.
#include "core/immediate_reuse.hpp"

#include <algorithm>

#include <mutex>

#include "core/assert.hpp"
#include "core/size_policy.hpp"

namespace stitch::detail {

ImmediateReuse::ImmediateReuse(BlockStore& store, HotStats& hot, DeviceStats& stats,
                               PtrMap<Block>& live)
    : store_(store), hot_(hot), stats_(stats), live_(live) {
  store_.set_holder(this);
}

// ---- under the device lock ------------------------------------------------------------------------

void* ImmediateReuse::take_back(ThreadSlot& s, std::size_t size, std::size_t rounded,
                                stream_t stream, BlockPool& pool) {
  // This thread's parked free, taken back here when best fit would give it (as the slot would
  // have, had its verdict been current), else completed first, as the free it is.
  Block* parked = s.block;
  if (parked == nullptr) return nullptr;
  const bool is_parked = s.parked;  // own slot: only this thread changes it unlocked
  if (is_parked && parked->stream == stream && parked->size == rounded &&
      parked->small == pool.small && &pool == &store_.pool_of(parked)) {
    if (const std::optional<PairEffect> effect = reuse_effect(parked, rounded)) {
      std::lock_guard slot_lock(s.lock);  // (its pairs were flushed before)
      // This pair's statistics at once: it may ask for other bytes than the last.
      hot_.reallocated_block(parked->small, static_cast<std::int64_t>(parked->size),
                             static_cast<std::int64_t>(parked->requested),
                             static_cast<std::int64_t>(size));
      parked->requested = size;
      ++pool.calls;
      ++stats_.num_immediate_reuses;
      apply_inactive(parked, *effect, 1);
      s.parked = false;
      s.backoff = 0;       // taken back: frees park again at once after a miss
      s.effect = *effect;  // the pairs from here on move the statistics this way
      s.reusable = true;   // `size` rounds to the block's size: checked just now
      s.seen = s.epoch->load(std::memory_order_relaxed);
      return parked->ptr;
    }
  }
  if (is_parked) {
    settle(s);  // (a handed-out block stays where it is)
    // Not taken back: the next frees file at once, more of them after each miss in a row.
    s.backoff = s.backoff == 0 ? 1 : static_cast<std::uint8_t>(std::min(2 * s.backoff, int{kColdFrees}));
    s.cold = s.backoff;
  }
  return nullptr;
}

void ImmediateReuse::park(ThreadSlot& s, Block* block) noexcept {
  // No verdict yet: the next allocation of its size takes the locked path once, which decides
  // it (most frees are not followed by their own size, and deciding costs a lookup).
  std::lock_guard lock(s.lock);
  set_state(*block, BlockState::parked);
  s.block = block;
  s.parked = true;
  s.reusable = false;
  s.effect = PairEffect{};
  s.epoch = block->segment->epoch;
  // A block of the stream is free now: the other slots' verdicts on the stream are void (this
  // one's is decided with it free).
  BlockStore::free_changed(block->segment);
  s.seen = s.epoch->load(std::memory_order_relaxed);
  s.pairs = 0;
  s.parked_stream.store(block->stream, std::memory_order_relaxed);
  block->slot = &s;
}

bool ImmediateReuse::settle(ThreadSlot& s) {
  Block* b = nullptr;
  bool parked = false;
  {
    std::lock_guard lock(s.lock);
    b = s.block;
    if (b == nullptr) return false;
    if (s.pairs != 0) apply_pairs(b, s.effect, s.pairs);
    parked = s.parked;
    s.pairs = 0;
    s.parked = false;
    s.block = nullptr;
    s.parked_stream.store(nullptr, std::memory_order_relaxed);
    b->slot = nullptr;
  }
  if (!parked) {  // handed out: an ordinary allocation now
    set_state(*b, BlockState::allocated);
    return false;
  }
  // The parked free completes: its statistics and its filing (no trace: free() recorded it).
  live_.erase(b->ptr);
  hot_.freed_block(b->small, static_cast<std::int64_t>(b->size), false);
  store_.file_freed(b);
  return true;
}

void ImmediateReuse::settle_all() {
  slots_.for_each([this](ThreadSlot& s) { settle(s); });
}

void ImmediateReuse::file_if_freed(Block& block) {
  ThreadSlot& s = *block.slot;
  s.lock.lock();
  const bool parked = s.parked;
  s.lock.unlock();
  // (Its owner cannot park it meanwhile without the device lock: a handed-out block is parked
  // again only while it is still in its slot, and whoever files a block before it detaches it.)
  if (parked) settle(s);
}

void ImmediateReuse::release(Block& block) { settle(*block.slot); }

void ImmediateReuse::settle_parked_on(stream_t stream, const ThreadSlot* except) {
  slots_.for_each([&](ThreadSlot& s) {
    if (&s != except && s.parked_stream.load(std::memory_order_relaxed) == stream &&
        s.block != nullptr)
      file_if_freed(*s.block);
  });
}

std::optional<PairEffect> ImmediateReuse::reuse_effect(const Block* block,
                                                       std::size_t rounded) const {
  // Filing the block would merge it with its free successor, if any (its predecessor is not
  // free: free() checked, and the store keeps it so). A request for its requested bytes would
  // then get this block back exactly when that rounds to the block's size, the filed block is
  // the best fit, may serve the request, and is split (merged) or taken whole (alone) at the
  // block's own size.
  if (rounded != block->size || is_small(rounded) != block->small) return std::nullopt;
  const BlockPool& pool = store_.pool_of(block);
  STITCH_ASSERT(block->prev == nullptr || !block->prev->is_free(),
                "reuse_effect: the block's predecessor is not free");
  const Block* next = block->next != nullptr && block->next->is_free() ? block->next : nullptr;
  const std::size_t filed = block->size + (next != nullptr ? next->size : 0);
  const bool expandable = block->segment->expandable;
  if (!store_.may_serve(filed, rounded)) return std::nullopt;
  if (next != nullptr && !store_.should_split(block->small, expandable, filed, rounded))
    return std::nullopt;
  auto it = pool.index.lower_bound(FreeKey{block->stream, rounded, nullptr});
  if (it != pool.index.end() && *it == next) ++it;  // `next` is part of the filed block
  if (it != pool.index.end() &&
      !FreeOrder::less(block->stream, filed, block->ptr, (*it)->stream, (*it)->size, (*it)->ptr))
    return std::nullopt;
  // inactive_split: the filing's net change followed by the take's (see BlockStore::file and
  // BlockStore::take), which undoes it.
  PairEffect e;
  if (!expandable) {
    if (next != nullptr) {
      if (block->prev != nullptr || next->next != nullptr) {  // the merged block is split
        e = {PairEffect::split_bytes, static_cast<std::int64_t>(block->size)};
      } else {
        e = {PairEffect::merged_whole, static_cast<std::int64_t>(next->size)};
      }
    } else if (block->is_split()) {
      e = {PairEffect::split, static_cast<std::int64_t>(block->size)};
    }
  }
  return e;
}

void ImmediateReuse::apply_pairs(const Block* block, const PairEffect& e,
                                 std::uint64_t times) noexcept {
  // Taken back `times` times: the statistics of each completed free and allocation in one.
  // The filing would stamp the filed block's GC age, but no one reads it: the taken block is
  // allocated again and its free successor stays split (GC ages only whole free segments)
  // until its next merge, which stamps it anew.
  const bool small = block->small;
  const auto n = static_cast<std::int64_t>(times);
  if (n == 0) return;
  store_.pool_of(block).calls += times;  // as best_fit counts
  hot_.reallocated_blocks(small, static_cast<std::int64_t>(block->size),
                          static_cast<std::int64_t>(block->requested), n);
  apply_inactive(block, e, n);
  stats_.num_immediate_reuses += n;
}

void ImmediateReuse::apply_inactive(const Block* block, const PairEffect& e,
                                    std::int64_t n) noexcept {
  const bool small = block->small;
  switch (e.kind) {
    case PairEffect::split_bytes:
      hot_.inactive_split_bytes.rise_and_fall(small, e.bytes, n);
      break;
    case PairEffect::merged_whole:
      hot_.inactive_split.fall_and_rise(small, n);
      hot_.inactive_split_bytes.fall_and_rise(small, e.bytes * n);
      break;
    case PairEffect::split:
      hot_.inactive_split.rise_and_fall(small, 1, n);
      hot_.inactive_split_bytes.rise_and_fall(small, e.bytes, n);
      break;
    case PairEffect::none:
      break;
  }
}

}  // namespace stitch::detail
