// core/device_allocator.cpp — the per-device fast path: best-fit lookup, splitting, freeing and
// coalescing, record_stream, and the public entry points of DeviceAllocator.
#include "core/device_allocator.hpp"
#include "core/stat_update.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/constants.hpp"
#include "core/size_policy.hpp"
#include "stitch/errors.hpp"

namespace stitch {

using detail::add;
using detail::sub;

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
  for (event_t e : event_pool_) {
    try {
      backend_.destroy_event(device_, e);
    } catch (...) {
    }
  }
  // Stray mappings and physical pages whose release failed earlier get one more try.
  for (const auto& [va, bytes] : stray_mappings_) {
    try {
      backend_.unmap(device_, va, bytes);
    } catch (...) {
    }
  }
  for (phys_handle_t h : orphan_handles_) {
    try {
      backend_.release_physical(device_, h);
    } catch (...) {
    }
  }
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
    std::lock_guard lock(mutex_);
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
    const double total = static_cast<double>(backend_.memory_info(device_).total);
    allowed = static_cast<std::size_t>(fraction * total + 0.5);
  }
  std::lock_guard lock(mutex_);
  allowed_ = allowed;
}

// ---- allocation ---------------------------------------------------------------------------------

void* DeviceAllocator::malloc(std::size_t size, stream_t stream) {
  if (size == 0) return nullptr;
  std::unique_lock lock(mutex_);
  if (size >= detail::kMaxRequest) raise_oom(size, size, size, false, stream);
  if (outstanding_events_ != 0) process_events();
  const std::size_t rounded = detail::round_size(size, config_.roundup_power2_divisions);
  const bool small = detail::is_small(rounded);
  Pool& pool = pool_for(small);
  Block* block = get_free_block(pool, stream, rounded);
  if (block == nullptr) block = allocate_slow(pool, stream, rounded, size);
  block = take_found_block(pool, block, rounded);
  activate(block, size);
  live_.insert(block->ptr, block);
  trace(TraceAction::alloc, block->ptr, size, stream);
  return block->ptr;
}

DeviceAllocator::Block* DeviceAllocator::get_free_block(Pool& pool, stream_t stream,
                                                        std::size_t rounded) {
  ++pool.calls;
  auto it = pool.index.best_fit(stream, rounded);
  if (it == pool.index.end()) return nullptr;
  Block* block = *it;
  // Oversize blocks (>= max_split_size) are never split: they serve only requests of at least
  // max_split_size, and only within max_non_split_rounding of their size.
  const std::size_t max_split = config_.max_split_size;
  if (rounded < max_split && block->size >= max_split) return nullptr;
  if (rounded >= max_split && block->size >= rounded + config_.max_non_split_rounding)
    return nullptr;
  return block;  // still in the index: take_found_block takes it out
}

bool DeviceAllocator::should_split(const Block* block, std::size_t rounded) const noexcept {
  const std::size_t remaining = block->size - rounded;
  if (block->small || block->segment->expandable) return remaining >= kMinBlockSize;
  return rounded < config_.max_split_size && remaining > kSmallSize;
}

DeviceAllocator::Block* DeviceAllocator::take_found_block(Pool& pool, Block* block,
                                                          std::size_t rounded) {
  // `block` is free and in the index.
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

void DeviceAllocator::activate(Block* block, std::size_t requested) noexcept {
  block->allocated = true;
  block->requested = requested;
  block->oversize = block->size >= config_.max_split_size;
  hot_.allocated_block(block->small, static_cast<std::int64_t>(block->size),
                       static_cast<std::int64_t>(requested));
  if (block->oversize) stats_.oversize_allocations.increase(1);
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
  if (!block->stream_uses.empty()) insert_events(block);  // may throw; nothing changed then
  live_.erase_at(slot);
  trace(TraceAction::free_requested, block->ptr, block->requested, block->stream);
  block->allocated = false;
  hot_.freed_block(block->small, static_cast<std::int64_t>(block->size), block->event_count != 0);
  if (block->oversize) stats_.oversize_allocations.decrease(1);
  block->oversize = false;
  if (block->event_count == 0) free_block(block);
  return FreeStatus::freed;
}

void DeviceAllocator::free_block(Block* block) {
  // The block is neither allocated nor waiting for events: it leaves the active set.
  trace(TraceAction::free_completed, block->ptr, block->requested, block->stream);
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

bool DeviceAllocator::record_stream(void* ptr, stream_t stream) {
  std::lock_guard lock(mutex_);
  Block* block = live_.find(ptr);
  if (block == nullptr) return false;
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

std::optional<Allocator::BlockInfo> DeviceAllocator::find(const void* ptr) const {
  std::lock_guard lock(mutex_);
  const Block* block = live_.find(ptr);
  if (block == nullptr) return std::nullopt;
  return Allocator::BlockInfo{device_, block->requested, block->size, block->stream};
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
