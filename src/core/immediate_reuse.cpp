// core/immediate_reuse.cpp — ImmediateReuse: the threads' extents kept, decided, settled, and the
// statistics of the pairs taken from them.
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
  // The owner's request (its pairs flushed, nothing handed out). Its extents of the stream and
  // the device's pool that hold the request are free blocks best fit would weigh: the first of
  // them in best-fit order serves it when it comes before every indexed block too.
  if (&pool != &store_.pool(pool.small)) return nullptr;  // a private pool: never an extent
  std::size_t best = kExtents;
  for (std::size_t x = 0; x < kExtents; ++x) {
    Extent& e = s.extents[x];
    if (e.head == nullptr || e.stream != stream || e.small != pool.small) continue;
    STITCH_ASSERT(!e.out, "take_back: the owner's handed-out blocks were settled first");
    const std::uint64_t now = e.epoch->load(std::memory_order_relaxed);
    if (now != e.seen) {  // the stream's free blocks changed: the extent's verdicts are void
      drop_verdicts(s, x);
      e.seen = now;
    }
    if (e.bytes >= rounded &&
        (best == kExtents || FreeOrder::less(stream, e.bytes, e.head->ptr, stream,
                                             s.extents[best].bytes, s.extents[best].head->ptr)))
      best = x;
  }
  if (best == kExtents) return nullptr;  // none holds it: best fit looks elsewhere
  const std::size_t bucket = verdict_bucket(size);
  std::size_t i = bucket;
  while (i < bucket + 2 && !(s.requested[i] == size && s.extent_of[i] == best && live(s, i))) ++i;
  if (i == bucket + 2) {
    i = live(s, bucket) ? bucket + 1 : bucket;  // a free entry, else the second
    const Verdict v = decide(s, best, i, size, rounded);
    if (v != Verdict::take) {
      // Not taken: an indexed block comes first (its free may well become the extent that
      // serves this size), or the locked path decides on the extent filed back. An extent that
      // gave no pair yet goes back (it would cost every request a decision; kept for nothing,
      // it counts as a miss at the next request).
      if (v == Verdict::refile || !s.extents[best].paired) settle_extent(s, best, true);
      return nullptr;
    }
    // The extent's verdicts in use agree on its shape: split (a tail after the head) or whole.
    Extent& e = s.extents[best];
    const bool split = s.size[i] < e.bytes;
    if (split && e.tail == nullptr) {
      try {
        e.tail = store_.split_extent(e.head, s.size[i]);
      } catch (...) {
        s.requested[i] = 0;  // nothing changed
        throw;
      }
      e.tail->slot = &s;
      e.cur = kNoVerdict;
      drop_verdicts(s, best, false);
    } else if (!split && e.tail != nullptr) {
      e.head->size = e.bytes - e.tail->size;  // (where the border is; join_extent adds it back)
      store_.join_extent(e.head, e.tail);
      e.tail = nullptr;
      e.cur = kNoVerdict;
      drop_verdicts(s, best, true);
    }
  }
  std::lock_guard slot_lock(s.lock);
  return hand_out(s, i);
}

ImmediateReuse::Verdict ImmediateReuse::decide(ThreadSlot& s, std::size_t x, std::size_t i,
                                               std::size_t size, std::size_t rounded) const {
  // Best fit over the stream's indexed free blocks and this extent (the first of the thread's):
  // the extent is taken when no indexed block comes before it, and it may serve.
  const Extent& e = s.extents[x];
  const Block* head = e.head;
  const BlockPool& pool = store_.pool_of(head);
  const auto it = pool.index.lower_bound(FreeKey{e.stream, rounded, nullptr});
  if (it != pool.index.end() &&
      !FreeOrder::less(e.stream, e.bytes, head->ptr, (*it)->stream, (*it)->size, (*it)->ptr))
    return Verdict::elsewhere;
  if (!store_.may_serve(e.bytes, rounded)) return Verdict::refile;
  const bool expandable = head->segment->expandable;
  const bool split = store_.should_split(head->small, expandable, e.bytes, rounded);
  const std::size_t block = split ? rounded : e.bytes;
  if (store_.oversize(block)) return Verdict::refile;  // (counted among oversize allocations)
  // inactive_split: the take's net change, then the filing's, which undoes it (BlockStore::take
  // and BlockStore::file); expandable segments are never inactive split.
  PairEffect effect;
  if (!expandable) {
    const bool was_split = BlockStore::extent_split(head, e.tail != nullptr ? e.tail : head);
    if (split) {
      effect = was_split ? PairEffect{PairEffect::fall_bytes, static_cast<std::int64_t>(rounded)}
                         : PairEffect{PairEffect::rise_split,
                                      static_cast<std::int64_t>(e.bytes - rounded)};
    } else if (was_split) {
      effect = {PairEffect::fall_whole, static_cast<std::int64_t>(e.bytes)};
    }
  }
  for (Extent& y : s.extents)
    if (y.cur == i) y.cur = kNoVerdict;  // (a border set for this entry's last verdict)
  s.requested[i] = size;
  s.extent_of[i] = static_cast<std::uint8_t>(x);
  s.vgen[i] = e.gen;
  s.size[i] = block;
  s.effect[i] = effect;
  s.pair_count[i] = 0;
  return Verdict::take;
}

void ImmediateReuse::drop_verdicts(ThreadSlot& s, std::size_t x, bool split) noexcept {
  const std::size_t bytes = s.extents[x].bytes;
  for (std::size_t i = 0; i < kVerdicts; ++i)
    if (s.extent_of[i] == x && live(s, i) && (s.size[i] < bytes) == split) s.requested[i] = 0;
}

void ImmediateReuse::park(ThreadSlot& s, Block* free) noexcept {
  // An empty extent, else the next in turn goes back (never next to this block: its neighbours'
  // filing settled it). Settling can throw only where a filing allocates an index node; then no
  // extent is kept.
  std::size_t x = 0;
  while (x < kExtents && s.extents[x].head != nullptr) ++x;
  try {
    if (x == kExtents) {
      x = s.next_extent;
      s.next_extent = static_cast<std::uint8_t>((x + 1) % kExtents);
      settle_extent(s, x, true);  // (an extent without a pair was kept for nothing)
    }
    live_.insert(free->ptr, free);  // (the free just erased its block: no growth)
  } catch (...) {
    return;
  }
  store_.detach(free);
  free->slot = &s;
  ++free->segment->stream_reuse->extents;
  std::lock_guard lock(s.lock);
  Extent& e = s.extents[x];
  e.head = free;
  e.tail = nullptr;
  e.bytes = free->size;
  e.stream = free->stream;
  e.small = free->small;
  e.epoch = free->segment->epoch;
  e.seen = e.epoch->load(std::memory_order_relaxed);
  e.out = false;
  e.paired = false;
  e.cur = kNoVerdict;
}

bool ImmediateReuse::settle_extent(ThreadSlot& s, std::size_t x, bool judge) {
  Extent& e = s.extents[x];
  Block* head = nullptr;
  Block* tail = nullptr;
  bool out = false;
  std::size_t bytes = 0;
  {
    std::lock_guard lock(s.lock);
    head = e.head;
    if (head == nullptr) return false;
    if (s.pairs != 0) apply_all_pairs(s);
    tail = e.tail;
    out = e.out;
    bytes = e.bytes;
    if (out) --s.outs[e.small ? 0 : 1];
    if (judge && !e.paired) s.wasted = true;
    drop_verdicts(s, x);
    e.head = nullptr;
    e.tail = nullptr;
    e.out = false;
  }
  head->slot = nullptr;
  if (tail != nullptr) tail->slot = nullptr;
  --head->segment->stream_reuse->extents;
  if (out) {
    // Handed out: what a take of the free extent would have left, an ordinary allocation.
    store_.settle_extent_handout(head, tail, bytes);
    ++store_.pool_of(head).calls;  // (the best fit that took it)
    ++stats_.num_immediate_reuses;
    hot_.allocated_block(head->small, static_cast<std::int64_t>(head->size),
                         static_cast<std::int64_t>(head->requested));
    return false;
  }
  // Free: filed back as one block, merging with a free neighbour (BlockHolder::release).
  if (tail != nullptr) {
    head->size = bytes - tail->size;
    store_.join_extent(head, tail);
  }
  head->requested = 0;
  live_.erase(head->ptr);
  store_.refile_extent(head);
  return true;
}

bool ImmediateReuse::settle(ThreadSlot& s) {
  bool any_free = false;
  for (std::size_t x = 0; x < kExtents; ++x) any_free = settle_extent(s, x) || any_free;
  return any_free;
}

bool ImmediateReuse::settle_block(Block& block) {
  ThreadSlot& s = *block.slot;
  for (std::size_t x = 0; x < kExtents; ++x)
    if (s.extents[x].head == &block || s.extents[x].tail == &block) return settle_extent(s, x, true);
  STITCH_ASSERT(false, "settle_block: a parked block is in its slot's extents");
  return false;
}

void ImmediateReuse::settle_all() {
  slots_.for_each([this](ThreadSlot& s) { settle(s); });
}

bool ImmediateReuse::others_hold(stream_t stream, bool small, std::size_t rounded) {
  const ThreadSlot* mine = slots_.mine();
  bool found = false;
  slots_.for_each([&](ThreadSlot& s) {
    if (&s == mine || s.orphaned.load(std::memory_order_acquire)) return;
    for (const Extent& e : s.extents) found = found || holds(e, stream, small, rounded);
  });
  return found;
}

bool ImmediateReuse::settle_all_for(stream_t stream, bool small, std::size_t rounded) {
  bool fits = false;
  slots_.for_each([&](ThreadSlot& s) {
    for (std::size_t x = 0; x < kExtents; ++x) {
      fits = fits || holds(s.extents[x], stream, small, rounded);
      settle_extent(s, x);
    }
  });
  return fits;
}

void ImmediateReuse::settle_parked_on(stream_t stream, const ThreadSlot* except) {
  // Only when other threads have extents on the stream (the slots are not looked at for every
  // request).
  if (stream != cached_stream_ || cached_reuse_ == nullptr) {
    cached_reuse_ = store_.stream_reuse(stream);
    cached_stream_ = stream;
  }
  std::uint32_t own = 0;
  if (except != nullptr)
    for (const Extent& e : except->extents) own += e.head != nullptr && e.stream == stream;
  if (cached_reuse_->extents == own) return;
  slots_.for_each([&](ThreadSlot& s) {
    if (&s == except || !s.orphaned.load(std::memory_order_acquire)) return;
    for (std::size_t x = 0; x < kExtents; ++x)
      if (s.extents[x].head != nullptr && s.extents[x].stream == stream) settle_extent(s, x);
  });
}

void ImmediateReuse::apply_all_pairs(ThreadSlot& s) noexcept {
  bool stamp[kExtents] = {};
  for (std::size_t i = 0; i < kVerdicts; ++i) {
    if (s.pair_count[i] != 0) {
      apply_pairs(s, i, s.pair_count[i]);
      s.pair_count[i] = 0;
      stamp[s.extent_of[i]] = true;
    }
  }
  // The last pair's free filed the extent at the pool's clock now (its GC age). A pair came
  // back: the extent earned its keep, and the owner's misses in a row are over.
  for (std::size_t x = 0; x < kExtents; ++x) {
    if (stamp[x]) {
      s.extents[x].head->gc_stamp = store_.pool_of(s.extents[x].head).calls;
      s.extents[x].paired = true;
      s.backoff = 0;
    }
  }
  s.pairs = 0;
}

void ImmediateReuse::apply_pairs(const ThreadSlot& s, std::size_t i, std::uint64_t times) noexcept {
  // Each pair: an allocation of the block (a best fit, the GC clock's tick) and its free.
  const Block* head = s.extents[s.extent_of[i]].head;
  const bool small = head->small;
  const auto n = static_cast<std::int64_t>(times);
  store_.pool_of(head).calls += times;
  hot_.allocation.rise_and_fall(small, 1, n);
  hot_.allocated_bytes.rise_and_fall(small, static_cast<std::int64_t>(s.size[i]), n);
  hot_.requested_bytes.rise_and_fall(small, static_cast<std::int64_t>(s.requested[i]), n);
  const PairEffect& effect = s.effect[i];
  switch (effect.kind) {
    case PairEffect::fall_bytes:
      hot_.inactive_split_bytes.fall_and_rise(small, effect.bytes * n);
      break;
    case PairEffect::rise_split:
      hot_.inactive_split.rise_and_fall(small, 1, n);
      hot_.inactive_split_bytes.rise_and_fall(small, effect.bytes, n);
      break;
    case PairEffect::fall_whole:
      hot_.inactive_split.fall_and_rise(small, n);
      hot_.inactive_split_bytes.fall_and_rise(small, effect.bytes * n);
      break;
    case PairEffect::none:
      break;
  }
  stats_.num_immediate_reuses += n;
}

}  // namespace stitch::detail
