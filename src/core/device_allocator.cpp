// core/device_allocator.cpp — the per-device fast path: best-fit lookup, splitting, freeing and
// coalescing, immediate reuse of the last free, record_stream, and the public entry points of
// DeviceAllocator.
#include "core/device_allocator.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/assert.hpp"
#include "core/constants.hpp"
#include "core/size_policy.hpp"
#include "stitch/errors.hpp"

namespace stitch {


using detail::kMinBlockSize;
using detail::kSmallSize;

DeviceAllocator::DeviceAllocator(int device, Backend& backend, const Config& config)
    : device_(device), backend_(backend) {
  set_config(config, true);
}

DeviceAllocator::~DeviceAllocator() {
  // Return what is cached; blocks still allocated stay with the device (their memory is the
  // caller's). Errors cannot be reported from a destructor, so they are dropped.
  try {
    std::lock_guard lock(mutex_);
    release_cached_blocks();
  } catch (...) {
  }
  // (Stray mappings and orphaned pages get one more try in pages_'s destructor.)
  for (Segment* s = segments_; s != nullptr;) {
    Segment* next = s->next;
    for (Block* b = s->head; b != nullptr;) {
      Block* following = b->next;
      blocks_.destroy(b);
      b = following;
    }
    delete s;
    s = next;
  }
}

void DeviceAllocator::set_config(const Config& config, bool apply_fraction) {
  if (config.expandable_segments && !backend_.supports_virtual_memory(device_))
    throw config_error(fmt::format(
        "expandable_segments:True needs the virtual-memory API, which backend:{} does not "
        "support on device {}", backend_.name(), device_));
  if (config.stitching && !config.expandable_segments)
    throw config_error("stitching:True requires expandable_segments:True");
  bool fraction_changed = false;
  {
    std::lock_guard lock(mutex_);  // settles the slots: the new tunables decide from here on
    // per_process_memory_fraction applies when it is set or changed, so a configure() of other
    // keys keeps a fraction set at run time with set_memory_fraction().
    fraction_changed = apply_fraction || !configured_ ||
                       config.per_process_memory_fraction != config_.per_process_memory_fraction;
    configured_ = true;
    config_ = config;
    recorder_.configure(config.record_history, config.max_entries, config.record_stacks,
                        config.record_python_stacks,
                        /*device_empty=*/segments_ == nullptr);
    python_frames_.store(recorder_.python_stacks(), std::memory_order_relaxed);
    note_fast_ok();
    settle_slots();  // a pair that began before the change has ended
    stats_.max_split_size =
        config.max_split_size == Config::kUnlimited ? -1
                                                    : static_cast<std::int64_t>(config.max_split_size);
  }
  if (fraction_changed) set_memory_fraction(config.per_process_memory_fraction);
}

void DeviceAllocator::set_memory_fraction(double fraction) {
  if (!(fraction >= 0.0 && fraction <= 1.0))
    throw invalid_argument("memory fraction must be in [0, 1], got " + std::to_string(fraction));
  std::optional<std::size_t> allowed;
  if (fraction < 1.0) {
    const double total = static_cast<double>(backend_.total_memory(device_));
    allowed = static_cast<std::size_t>(fraction * total + 0.5);
  }
  std::lock_guard lock(mutex_);
  ledger_.set_cap(allowed);
}

double DeviceAllocator::memory_fraction() const {
  std::optional<std::size_t> cap;
  {
    std::lock_guard lock(mutex_);
    cap = ledger_.cap();
  }
  if (!cap) return 1.0;
  return static_cast<double>(*cap) / static_cast<double>(backend_.total_memory(device_));
}

// ---- allocation ---------------------------------------------------------------------------------

DeviceAllocator::Allocation DeviceAllocator::malloc(std::size_t size, stream_t stream) {
  if (size == 0) return {nullptr, nullptr};
  detail::ThreadSlot* mine = slots_.mine();
  if (mine != nullptr) {
    if (void* again = take_parked(*mine, size, stream)) return {again, nullptr};  // no lock
  }
  // Python frames for the history are gathered before the lock (they take the GIL).
  const detail::GatheredPythonFrames frames(python_frames_.load(std::memory_order_relaxed));
  detail::UnsettledGuard guard(mutex_);  // malloc and free alone may find the slots unsettled
  if (mine != nullptr) flush_pairs(*mine);  // its pairs came before this request
  if (size >= detail::kMaxRequest) {
    if (mine != nullptr) settle_slot(*mine);
    capture_oom(size, size, size, false, stream);
    return {nullptr, failed_.release()};
  }
  // No event is recorded or queried while a route to a private pool is underway: a stream may
  // be capturing. The events deferred meanwhile are recorded here, at the first allocation after
  // the last route (PyTorch ends the route before the capture itself ends).
  if ((events_.outstanding() != 0 || !deferred_.empty()) && routes_.empty() &&
      !backend_.is_capturing(device_, stream)) {
    if (mine != nullptr) settle_slot(*mine);
    record_deferred_events();
    events_.poll([this](Block* b) { complete_pending(b); });
    note_events();
  }
  const std::size_t rounded = detail::round_size(size, config_.roundup_power2_divisions);
  const bool small = detail::is_small(rounded);
  Pool& pool = routes_.empty() ? pool_for(small) : routed_pool(stream, small);
  if (mine != nullptr && mine->block != nullptr) {
    // This thread's parked free, taken back here when best fit would give it (as the slot
    // would have, had its verdict been current), else completed first, as the free it is.
    Block* parked = mine->block;
    const bool is_parked = mine->parked;  // own slot: only this thread changes it unlocked
    if (is_parked && parked->stream == stream && parked->size == rounded &&
        parked->small == small && &pool == &pool_of(parked)) {
      if (const std::optional<PairEffect> effect = reuse_effect(parked, rounded)) {
        std::lock_guard slot_lock(mine->lock);  // (its pairs were flushed above)
        // This pair's statistics at once: it may ask for other bytes than the last.
        hot_.reallocated_block(small, static_cast<std::int64_t>(parked->size),
                               static_cast<std::int64_t>(parked->requested),
                               static_cast<std::int64_t>(size));
        parked->requested = size;
        ++pool.calls;
        ++stats_.num_immediate_reuses;
        apply_inactive(parked, *effect, 1);
        mine->parked = false;
        mine->effect = *effect;  // the pairs from here on move the statistics this way
        mine->reusable = true;  // `size` rounds to the block's size: checked just now
        mine->seen = mine->epoch->load(std::memory_order_relaxed);
        trace(TraceAction::alloc, parked->ptr, size, stream);
        return {parked->ptr, nullptr};
      }
    }
    if (is_parked) settle_slot(*mine);  // (a handed-out block stays where it is)
  }
  if (slots_.shared()) settle_parked_on(stream, mine);
  Block* block = get_free_block(pool, stream, rounded);
  if (block == nullptr) {
    block = routes_.empty() && !backend_.is_capturing(device_, stream)
                ? allocate_slow(pool, stream, rounded, size)
                : allocate_quiet(pool, stream, rounded, size);
    if (block == nullptr) return {nullptr, failed_.release()};
  }
  block = take_found_block(pool, block, rounded);
  activate(block, size);
  live_.insert(block->ptr, block);
  bump(block->segment);
  trace(TraceAction::alloc, block->ptr, size, stream);
  return {block->ptr, nullptr};
}

DeviceAllocator::Block* DeviceAllocator::get_free_block(Pool& pool, stream_t stream,
                                                        std::size_t rounded) {
  ++pool.calls;
  auto it = pool.index.best_fit(stream, rounded);
  if (it == pool.index.end()) return nullptr;
  Block* block = *it;
  // Oversize blocks (>= max_split_size) are never split: they serve only requests of at least
  // max_split_size, and only within max_non_split_rounding of their size.
  if (!may_serve(block->size, rounded)) return nullptr;
  return block;  // still in the index: take_found_block takes it out
}

bool DeviceAllocator::should_split(bool small, bool expandable, std::size_t block_size,
                                   std::size_t rounded) const noexcept {
  const std::size_t remaining = block_size - rounded;
  if (small || expandable) return remaining >= kMinBlockSize;
  return rounded < config_.max_split_size && remaining > kSmallSize;
}

DeviceAllocator::Block* DeviceAllocator::take_found_block(Pool& pool, Block* block,
                                                          std::size_t rounded) {
  STITCH_ASSERT(block->in_index && block->is_free() && block->size >= rounded,
                "take_found_block: a free, indexed block that holds the request");
  if (should_split(block, rounded)) {
    // A new block takes the front; `block` keeps the tail and stays in the index, re-keyed in
    // place (no tree rebalancing when its order is unchanged). An already split free block
    // shrinks; an unsplit one becomes a split remainder.
    const bool was_split = block->is_split();
    Block* front = link_new_front(block, rounded);
    pool.index.shrink(block, block->ptr + rounded, block->size - rounded);
    if (was_split) {
      account_inactive_change(block, 0, -static_cast<std::int64_t>(rounded));
    } else {
      account_inactive_change(block, 1, static_cast<std::int64_t>(block->size));
    }
    return front;
  }
  account_inactive(block, -1);
  pool.index.erase(block);
  return block;
}

void DeviceAllocator::mark_allocated(Block* block, std::size_t requested) noexcept {
  block->allocated = true;
  block->requested = requested;
  block->oversize = block->size >= config_.max_split_size;
  if (block->oversize) stats_.oversize_allocations.increase(1);
}

void DeviceAllocator::activate(Block* block, std::size_t requested) noexcept {
  mark_allocated(block, requested);
  hot_.allocated_block(block->small, static_cast<std::int64_t>(block->size),
                       static_cast<std::int64_t>(requested));
}

void DeviceAllocator::activate_slow(Block* block, std::size_t requested) noexcept {
  activate(block, requested);
}

// ---- freeing ------------------------------------------------------------------------------------

FreeStatus DeviceAllocator::free(void* ptr, const std::size_t* expected_size,
                                 const stream_t* stream, std::size_t* actual_size) {
  detail::ThreadSlot* mine = slots_.mine();
  if (mine != nullptr && park_again(*mine, ptr, expected_size, stream, actual_size))
    return FreeStatus::freed;
  detail::UnsettledGuard guard(mutex_);
  if (mine != nullptr) flush_pairs(*mine);  // its pairs came first
  Block* block = live_.find(ptr);
  if (block == nullptr) return FreeStatus::not_found;
  // A block of a thread's slot: parked there (this is a second free of it), or handed out
  // from there (an ordinary allocation from here on).
  if (block->slot != nullptr && settle_slot(*block->slot)) return FreeStatus::not_found;
  if (actual_size != nullptr) *actual_size = block->requested;
  if (expected_size != nullptr && *expected_size != block->requested)
    return FreeStatus::wrong_size;
  if (stream != nullptr && *stream != block->stream &&
      std::find(block->stream_uses.begin(), block->stream_uses.end(), *stream) ==
          block->stream_uses.end()) {
    block->stream_uses.push_back(*stream);  // freed on another stream: that was its last use
  }
  if (!block->stream_uses.empty()) {
    if (routes_.empty() && !uses_capturing_stream(block)) {
      events_.record(block);  // may throw; nothing changed then
      note_events();
    } else {
      defer_events(block);  // a stream may be capturing: recorded when the routes end
    }
  }
  // This thread's last free completes first (as any other request sees it completed), and so
  // do frees parked next to this block in other threads' slots (they decide how it files).
  if (mine != nullptr && mine->block != nullptr) settle_slot(*mine);
  for (Block* neighbour : {block->prev, block->next})
    if (neighbour != nullptr && neighbour->slot != nullptr) settle_if_parked(*neighbour->slot);
  // Without events, the free is completed lazily: the block waits in the calling thread's slot,
  // where its next allocation of the same size on the same stream may take it straight back.
  // With a free neighbour in front, the filed block would start elsewhere, so it could not
  // come back. A parked block stays in the live table, allocated, until its free completes.
  const bool defer = block->event_count == 0 && immediate_reuse_ && !block->oversize &&
                     (block->prev == nullptr || !block->prev->in_index) && routes_.empty() &&
                     block->segment->private_pool == nullptr;
  if (defer && mine == nullptr) mine = slots_.mine_or_create();  // may throw: nothing changed
  trace(TraceAction::free_requested, block->ptr, block->requested, block->stream);
  if (defer) {
    trace(TraceAction::free_completed, block->ptr, block->requested, block->stream);
    park(*mine, block);
    return FreeStatus::freed;
  }
  live_.erase(block->ptr);  // (settling above may have moved the entries of the live table)
  block->allocated = false;
  if (block->oversize) stats_.oversize_allocations.decrease(1);
  block->oversize = false;
  hot_.freed_block(block->small, static_cast<std::int64_t>(block->size), block->event_count != 0);
  const Segment* segment = block->segment;
  if (block->event_count == 0) free_block(block);
  bump(segment);
  return FreeStatus::freed;
}

// ---- immediate reuse: the threads' slots (core/thread_slots.hpp) ----------------------------------

void* DeviceAllocator::take_parked(detail::ThreadSlot& s, std::size_t size,
                                   stream_t stream) noexcept {
  s.lock.lock();
  Block* b = s.block;
  void* out = nullptr;
  if (b != nullptr && s.parked && s.reusable && b->requested == size && b->stream == stream &&
      fast_ok_.load(std::memory_order_relaxed) &&
      !events_pending_.load(std::memory_order_relaxed) &&
      s.epoch->load(std::memory_order_acquire) == s.seen) {
    s.parked = false;
    ++s.pairs;
    out = b->ptr;
  }
  s.lock.unlock();
  return out;
}

bool DeviceAllocator::park_again(detail::ThreadSlot& s, void* ptr,
                                 const std::size_t* expected_size, const stream_t* stream,
                                 std::size_t* actual_size) noexcept {
  s.lock.lock();
  Block* b = s.block;
  const bool again = b != nullptr && !s.parked && b->ptr == ptr &&
                     (expected_size == nullptr || *expected_size == b->requested) &&
                     (stream == nullptr || *stream == b->stream) &&
                     fast_ok_.load(std::memory_order_relaxed);
  if (again) {
    if (actual_size != nullptr) *actual_size = b->requested;
    s.parked = true;
  }
  s.lock.unlock();
  return again;
}

void DeviceAllocator::park(detail::ThreadSlot& s, Block* block) {
  // No verdict yet: the next allocation of its size takes the locked path once, which decides
  // it (most frees are not followed by their own size, and deciding costs a lookup).
  std::lock_guard lock(s.lock);
  s.block = block;
  s.parked = true;
  s.reusable = false;
  s.effect = PairEffect{};
  s.epoch = block->segment->epoch;
  // A block of the stream is free now: the other slots' verdicts on the stream are void (this
  // one's was decided with it free).
  bump(block->segment);
  s.seen = s.epoch->load(std::memory_order_relaxed);
  s.pairs = 0;
  s.parked_stream.store(block->stream, std::memory_order_relaxed);
  block->slot = &s;
}

bool DeviceAllocator::settle_slot(detail::ThreadSlot& s) {
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
  if (!parked) return false;  // handed out: an ordinary allocation now
  // The parked free completes: its statistics and its filing (no trace: free() recorded it).
  live_.erase(b->ptr);
  b->allocated = false;
  hot_.freed_block(b->small, static_cast<std::int64_t>(b->size), false);
  const Segment* segment = b->segment;
  file_free_block(b);
  bump(segment);
  return true;
}

void DeviceAllocator::flush_pairs(detail::ThreadSlot& s) noexcept {
  // The calling thread's own slot, under the device lock: only this thread changes `pairs`
  // without the device lock, so reading it needs no slot lock.
  if (s.pairs == 0) return;
  std::lock_guard lock(s.lock);
  if (s.block != nullptr) apply_pairs(s.block, s.effect, s.pairs);
  s.pairs = 0;
}

void DeviceAllocator::settle_slots() {
  slots_.for_each([this](detail::ThreadSlot& s) { settle_slot(s); });
}

void DeviceAllocator::settle_if_parked(detail::ThreadSlot& s) {
  s.lock.lock();
  const bool parked = s.parked;
  s.lock.unlock();
  // (Its owner cannot park it meanwhile without the device lock: a handed-out block is parked
  // again only while it is still in its slot, and whoever files a block before it detaches it.)
  if (parked) settle_slot(s);
}

void DeviceAllocator::settle_parked_on(stream_t stream, const detail::ThreadSlot* except) {
  slots_.for_each([&](detail::ThreadSlot& s) {
    if (&s != except && s.parked_stream.load(std::memory_order_relaxed) == stream)
      settle_if_parked(s);
  });
}

std::optional<DeviceAllocator::PairEffect> DeviceAllocator::reuse_effect(const Block* block,
                                                                       std::size_t rounded) const {
  // Filing the block would merge it with its free successor, if any (its predecessor is not
  // free: free() checked, and insert_free keeps it so). A request for its requested bytes would
  // then get this block back exactly when that rounds to the block's size, the filed block is
  // the best fit, may serve the request, and is split (merged) or taken whole (alone) at the
  // block's own size.
  if (rounded != block->size || detail::is_small(rounded) != block->small) return std::nullopt;
  const Pool& pool = pool_of_const(block);
  STITCH_ASSERT(block->prev == nullptr || !block->prev->in_index,
                "reuse_effect: the block's predecessor is not free");
  const Block* next = block->next != nullptr && block->next->in_index ? block->next : nullptr;
  const std::size_t filed = block->size + (next != nullptr ? next->size : 0);
  const bool expandable = block->segment->expandable;
  if (!may_serve(filed, rounded)) return std::nullopt;
  if (next != nullptr && !should_split(block->small, expandable, filed, rounded)) return std::nullopt;
  auto it = pool.index.lower_bound(detail::FreeKey{block->stream, rounded, nullptr});
  if (it != pool.index.end() && *it == next) ++it;  // `next` is part of the filed block
  if (it != pool.index.end() &&
      !detail::FreeOrder::less(block->stream, filed, block->ptr, (*it)->stream, (*it)->size,
                               (*it)->ptr))
    return std::nullopt;
  // inactive_split: the filing's net change followed by the take's (see insert_free and
  // take_found_block), which undoes it.
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

void DeviceAllocator::apply_pairs(const Block* block, const PairEffect& e,
                                  std::uint64_t times) noexcept {
  // Taken back `times` times: the statistics of each completed free and allocation in one.
  // The filing would stamp the filed block's GC age, but no one reads it: the taken block is
  // allocated again and its free successor stays split (GC ages only whole free segments)
  // until its next merge, which stamps it anew.
  const bool small = block->small;
  const auto n = static_cast<std::int64_t>(times);
  if (n == 0) return;
  pool_of(block).calls += times;  // as get_free_block counts
  hot_.reallocated_blocks(small, static_cast<std::int64_t>(block->size),
                          static_cast<std::int64_t>(block->requested), n);
  apply_inactive(block, e, n);
  stats_.num_immediate_reuses += n;
}

void DeviceAllocator::apply_inactive(const Block* block, const PairEffect& e,
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

void DeviceAllocator::free_block(Block* block) {
  // The block is neither allocated nor waiting for events: it leaves the active set.
  trace(TraceAction::free_completed, block->ptr, block->requested, block->stream);
  file_free_block(block);
}

void DeviceAllocator::file_free_block(Block* block) {
  hot_.inactive_block(block->small, static_cast<std::int64_t>(block->requested));
  block->requested = 0;
  block->stream_uses.clear();
  insert_free(pool_of(block), block);
}

void DeviceAllocator::complete_pending(Block* block) {
  hot_.pending_done(block->small, static_cast<std::int64_t>(block->size));
  const Segment* segment = block->segment;
  free_block(block);
  bump(segment);
}


DeviceAllocator::Block* DeviceAllocator::insert_free(Pool& pool, Block* block) {
  // Files a free (mapped) block, coalescing it with free neighbours. A free neighbour survives,
  // re-keyed in place, and `block` is recycled, so the common case needs no tree insert.
  STITCH_ASSERT(block->mapped && !block->allocated && block->event_count == 0 && !block->in_index,
                "insert_free: a mapped block, neither allocated, pending nor filed");
  // A block parked in a thread's slot before this one is free: filed first, so that they merge.
  if (block->prev != nullptr && block->prev->slot != nullptr) settle_if_parked(*block->prev->slot);
  // The inactive_split statistics change once, by the net effect (as PyTorch's free_block):
  // each merged neighbour (a free block in a split segment) leaves, the survivor joins.
  Block* prev = block->prev != nullptr && block->prev->in_index ? block->prev : nullptr;
  Block* next = block->next != nullptr && block->next->in_index ? block->next : nullptr;
  std::int64_t inactive_blocks = -static_cast<std::int64_t>((prev != nullptr) + (next != nullptr));
  std::int64_t inactive_bytes = -static_cast<std::int64_t>((prev != nullptr ? prev->size : 0) +
                                                           (next != nullptr ? next->size : 0));
  Block* survivor = block;
  if (prev != nullptr) {
    std::size_t size = prev->size + block->size;
    if (next != nullptr) {
      size += next->size;
      pool.index.erase(next);
    }
    Block* after = next != nullptr ? next->next : block->next;
    prev->next = after;
    if (after != nullptr) after->prev = prev;
    if (next != nullptr) blocks_.destroy(next);
    blocks_.destroy(block);
    pool.index.grow(prev, prev->ptr, size);
    survivor = prev;
  } else if (next != nullptr) {
    next->prev = block->prev;
    if (block->prev != nullptr) {
      block->prev->next = next;
    } else {
      next->segment->head = next;
    }
    char* ptr = block->ptr;
    const std::size_t size = block->size + next->size;
    blocks_.destroy(block);
    pool.index.grow(next, ptr, size);
    survivor = next;
  } else {
    pool.index.insert(block);
  }
  survivor->gc_stamp = pool.calls;
  if (survivor->is_split()) {
    inactive_blocks += 1;
    inactive_bytes += static_cast<std::int64_t>(survivor->size);
  }
  account_inactive_change(survivor, inactive_blocks, inactive_bytes);
  // A thread slot's block never follows a free block (thread_slots.hpp): the one after this
  // one leaves its slot (parked, it is filed now and merges here; handed out, it becomes an
  // ordinary allocation).
  if (survivor->next != nullptr && survivor->next->slot != nullptr)
    settle_slot(*survivor->next->slot);  // `survivor` stays, grown if they merged
  return survivor;
}

void DeviceAllocator::set_immediate_reuse(bool on) {
  std::lock_guard lock(mutex_);
  immediate_reuse_ = on;
  note_fast_ok();
  settle_slots();  // a pair that began before the change has ended
}

bool DeviceAllocator::record_stream(void* ptr, stream_t stream) {
  std::lock_guard lock(mutex_);
  Block* block = live_.find(ptr);
  if (block == nullptr || !block->allocated) return false;
  if (stream == block->stream) return true;  // its own stream is ordered already
  if (std::find(block->stream_uses.begin(), block->stream_uses.end(), stream) ==
      block->stream_uses.end())
    block->stream_uses.push_back(stream);
  return true;
}

// ---- queries ------------------------------------------------------------------------------------

DeviceStats DeviceAllocator::stats() {
  std::lock_guard lock(mutex_);
  retire_completed_events();
  return stats_locked();
}

void DeviceAllocator::retire_completed_events() {
  // An allocation polls the events too, but a run may end with cross-stream frees and read its
  // statistics long after their streams finished: those blocks are free, not active.
  if (events_.outstanding() == 0 || !routes_.empty()) return;
  if (events_.any_stream([this](stream_t s) { return backend_.is_capturing(device_, s); })) return;
  events_.poll([this](Block* b) { complete_pending(b); });
  note_events();
}

DeviceStats DeviceAllocator::stats_locked() const noexcept {
  DeviceStats out = stats_;
  hot_.expand(out);
  return out;
}

void DeviceAllocator::reset_peak_stats() {
  std::lock_guard lock(mutex_);
  stats_.reset_peak();
  hot_.reset_peak();
}

void DeviceAllocator::reset_accumulated_stats() {
  std::lock_guard lock(mutex_);
  stats_.reset_accumulated();
  hot_.reset_accumulated();
}

void DeviceAllocator::count_invalid_free() {
  std::lock_guard lock(mutex_);
  ++stats_.num_invalid_frees;
}

std::optional<BlockInfo> DeviceAllocator::find(const void* ptr) const {
  std::lock_guard lock(mutex_);
  const Block* block = live_.find(ptr);
  if (block == nullptr || !block->allocated) return std::nullopt;
  return BlockInfo{device_, block->requested, block->size, block->stream};
}

void DeviceAllocator::validate() const {
  std::lock_guard lock(mutex_);
  validate_locked();
}

void DeviceAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  if (!routes_.empty()) return;  // a stream may be capturing: nothing is waited for or freed
  release_cached_blocks();
}

}  // namespace stitch
