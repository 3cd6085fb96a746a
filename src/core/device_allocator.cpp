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
    std::lock_guard lock(mutex_);  // settles the deferred free: the new tunables decide from here on
    // per_process_memory_fraction applies when it is set or changed, so a configure() of other
    // keys keeps a fraction set at run time with set_memory_fraction().
    fraction_changed = apply_fraction || !configured_ ||
                       config.per_process_memory_fraction != config_.per_process_memory_fraction;
    configured_ = true;
    config_ = config;
    recorder_.configure(config.record_history, config.max_entries, config.record_stacks,
                        /*device_empty=*/segments_ == nullptr);
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

// ---- allocation ---------------------------------------------------------------------------------

DeviceAllocator::Allocation DeviceAllocator::malloc(std::size_t size, stream_t stream) {
  if (size == 0) return {nullptr, nullptr};
  detail::UnsettledGuard guard(mutex_);  // malloc alone may find the deferred free unsettled
  if (size >= detail::kMaxRequest) {
    mutex_.settle();
    capture_oom(size, size, size, false, stream);
    return {nullptr, failed_.release()};
  }
  if (events_.outstanding() != 0) {
    mutex_.settle();
    events_.poll([this](Block* b) { complete_pending(b); });
  }
  const std::size_t rounded = detail::round_size(size, config_.roundup_power2_divisions);
  const bool small = detail::is_small(rounded);
  Pool& pool = pool_for(small);
  if (mutex_.deferred() != nullptr) {
    if (Block* again = reuse_deferred(pool, stream, rounded, size)) return {again->ptr, nullptr};
    mutex_.settle();
  }
  Block* block = get_free_block(pool, stream, rounded);
  if (block == nullptr) {
    block = allocate_slow(pool, stream, rounded, size);
    if (block == nullptr) return {nullptr, failed_.release()};
  }
  block = take_found_block(pool, block, rounded);
  activate(block, size);
  live_.insert(block->ptr, block);
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
  std::lock_guard lock(mutex_);
  const auto slot = live_.find_slot(ptr);
  if (slot == live_.npos) return FreeStatus::not_found;
  Block* block = live_.value_at(slot);
  if (actual_size != nullptr) *actual_size = block->requested;
  if (expected_size != nullptr && *expected_size != block->requested)
    return FreeStatus::wrong_size;
  if (stream != nullptr && *stream != block->stream &&
      std::find(block->stream_uses.begin(), block->stream_uses.end(), *stream) ==
          block->stream_uses.end()) {
    block->stream_uses.push_back(*stream);  // freed on another stream: that was its last use
  }
  if (!block->stream_uses.empty()) events_.record(block);  // may throw; nothing changed then
  // Without events, the free is completed lazily: the next allocation may take the block
  // straight back (reuse_deferred). With a free neighbour in front, the filed block would start
  // elsewhere, so it could not come back. A deferred block stays in the live table, not
  // allocated, until its free completes.
  const bool defer = block->event_count == 0 && immediate_reuse_ &&
                     (block->prev == nullptr || !block->prev->in_index);
  if (!defer) live_.erase_at(slot);
  trace(TraceAction::free_requested, block->ptr, block->requested, block->stream);
  block->allocated = false;
  if (block->oversize) stats_.oversize_allocations.decrease(1);
  block->oversize = false;
  if (defer) {
    trace(TraceAction::free_completed, block->ptr, block->requested, block->stream);
    mutex_.defer(block);
    return FreeStatus::freed;
  }
  hot_.freed_block(block->small, static_cast<std::int64_t>(block->size), block->event_count != 0);
  if (block->event_count == 0) free_block(block);
  return FreeStatus::freed;
}

void DeviceAllocator::settle_deferred(Block* block) {
  STITCH_ASSERT(!block->allocated && block->event_count == 0 && !block->in_index &&
                    live_.find(block->ptr) == block,
                "a deferred free: not allocated, no events, not filed, still in the live table");
  live_.erase(block->ptr);
  hot_.freed_block(block->small, static_cast<std::int64_t>(block->size), false);
  file_free_block(block);
}

DeviceAllocator::Block* DeviceAllocator::reuse_deferred(Pool& pool, stream_t stream,
                                                        std::size_t rounded,
                                                        std::size_t requested) {
  // Completing the free would file the block merged with its free successor, if any (its
  // predecessor is not free: free() checked, and nothing has changed since). The request
  // would then get this block back exactly when the filed block is the best fit, may serve
  // the request, and is split (merged) or taken whole (alone) at the block's own size.
  Block* block = mutex_.deferred();
  if (block->stream != stream || block->size != rounded || block->small != pool.small)
    return nullptr;
  STITCH_ASSERT(block->prev == nullptr || !block->prev->in_index,
                "reuse_deferred: the deferred block's predecessor is not free");
  Block* next = block->next != nullptr && block->next->in_index ? block->next : nullptr;
  const std::size_t filed = block->size + (next != nullptr ? next->size : 0);
  const bool expandable = block->segment->expandable;
  if (!may_serve(filed, rounded)) return nullptr;
  if (next != nullptr && !should_split(block->small, expandable, filed, rounded)) return nullptr;
  auto it = pool.index.lower_bound(detail::FreeKey{stream, rounded, nullptr});
  if (it != pool.index.end() && *it == next) ++it;  // `next` is part of the filed block
  if (it != pool.index.end() &&
      !detail::FreeOrder::less(stream, filed, block->ptr, (*it)->stream, (*it)->size, (*it)->ptr))
    return nullptr;

  // Taken back: the statistics of the completed free and the allocation in one.
  // The filing would stamp the filed block's GC age, but no one reads it: the taken block is
  // allocated again and its free successor stays split (GC ages only whole free segments) until
  // its next merge, which stamps it anew.
  ++pool.calls;  // as get_free_block counts
  const bool small = block->small;
  hot_.reallocated_block(small, static_cast<std::int64_t>(block->size),
                         static_cast<std::int64_t>(block->requested),
                         static_cast<std::int64_t>(requested));
  if (!expandable) {
    // inactive_split: the filing's net change followed by the take's (see insert_free and
    // take_found_block), which undoes it.
    if (next != nullptr) {
      if (block->prev != nullptr || next->next != nullptr) {  // the merged block is split
        hot_.inactive_split_bytes.rise_and_fall(small, static_cast<std::int64_t>(block->size));
      } else {
        hot_.inactive_split.fall_and_rise(small, 1);
        hot_.inactive_split_bytes.fall_and_rise(small, static_cast<std::int64_t>(next->size));
      }
    } else if (block->is_split()) {
      hot_.inactive_split.rise_and_fall(small, 1);
      hot_.inactive_split_bytes.rise_and_fall(small, static_cast<std::int64_t>(block->size));
    }
  }
  (void)mutex_.take_deferred();
  ++stats_.num_immediate_reuses;
  mark_allocated(block, requested);  // still in the live table
  trace(TraceAction::alloc, block->ptr, requested, stream);
  return block;
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
  insert_free(pool_for(block->small), block);
}

void DeviceAllocator::complete_pending(Block* block) {
  hot_.pending_done(block->small, static_cast<std::int64_t>(block->size));
  free_block(block);
}


DeviceAllocator::Block* DeviceAllocator::insert_free(Pool& pool, Block* block) {
  // Files a free (mapped) block, coalescing it with free neighbours. A free neighbour survives,
  // re-keyed in place, and `block` is recycled, so the common case needs no tree insert.
  STITCH_ASSERT(block->mapped && !block->allocated && block->event_count == 0 && !block->in_index,
                "insert_free: a mapped block, neither allocated, pending nor filed");
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
  return survivor;
}

void DeviceAllocator::set_immediate_reuse(bool on) {
  std::lock_guard lock(mutex_);
  immediate_reuse_ = on;
}

bool DeviceAllocator::record_stream(void* ptr, stream_t stream) {
  std::lock_guard lock(mutex_);
  Block* block = live_.find(ptr);
  if (block == nullptr || !block->allocated) return false;  // (or the deferred free)
  if (stream == block->stream) return true;  // its own stream is ordered already
  if (std::find(block->stream_uses.begin(), block->stream_uses.end(), stream) ==
      block->stream_uses.end())
    block->stream_uses.push_back(stream);
  return true;
}

// ---- queries ------------------------------------------------------------------------------------

DeviceStats DeviceAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_locked();
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
  if (block == nullptr || !block->allocated) return std::nullopt;  // (or the deferred free)
  return BlockInfo{device_, block->requested, block->size, block->stream};
}

void DeviceAllocator::validate() const {
  std::lock_guard lock(mutex_);
  validate_locked();
}

void DeviceAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  release_cached_blocks();
}

}  // namespace stitch
