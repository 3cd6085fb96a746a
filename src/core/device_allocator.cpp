// core/device_allocator.cpp — the per-device fast path: best-fit lookup, splitting, freeing and
// coalescing, record_stream, and the public entry points of DeviceAllocator.
#include "core/device_allocator.hpp"

#include <algorithm>

#include "core/constants.hpp"
#include "core/size_policy.hpp"
#include "stitch/errors.hpp"

namespace stitch {

using detail::kMinBlockSize;
using detail::kSmallSize;

namespace {
inline void add(StatArray& stat, bool small, std::int64_t amount) noexcept {
  stat[kAll].increase(amount);
  stat[small ? kSmallPool : kLargePool].increase(amount);
}
inline void sub(StatArray& stat, bool small, std::int64_t amount) noexcept {
  stat[kAll].decrease(amount);
  stat[small ? kSmallPool : kLargePool].decrease(amount);
}
}  // namespace

DeviceAllocator::DeviceAllocator(int device, Backend& backend, const Config& config)
    : device_(device), backend_(backend) {
  set_config(config);
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
  for (Segment* s = segments_; s != nullptr;) {
    Segment* next = s->next;
    delete s;
    s = next;
  }
}

void DeviceAllocator::set_config(const Config& config) {
  {
    std::lock_guard lock(mutex_);
    config_ = config;
    stats_.max_split_size =
        config.max_split_size == Config::kUnlimited ? -1
                                                    : static_cast<std::int64_t>(config.max_split_size);
  }
  set_memory_fraction(config.per_process_memory_fraction);
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
  if (size >= detail::kMaxRequest) raise_oom(size, size);
  if (outstanding_events_ != 0) process_events();
  const std::size_t rounded = detail::round_size(size, config_.roundup_power2_divisions);
  Pool& pool = pool_for(detail::is_small(rounded));
  Block* block = get_free_block(pool, stream, rounded);
  if (block == nullptr) block = allocate_slow(pool, stream, rounded, size);
  block = alloc_found_block(pool, block, rounded, size);
  live_.insert(block->ptr, block);
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
  pool.index.erase(block);
  return block;
}

bool DeviceAllocator::should_split(const Block* block, std::size_t rounded) const noexcept {
  const std::size_t remaining = block->size - rounded;
  if (block->small) return remaining >= kMinBlockSize;
  return rounded < config_.max_split_size && remaining > kSmallSize;
}

void DeviceAllocator::account_inactive(const Block* block, int sign) noexcept {
  if (!block->is_free() || !block->is_split()) return;
  if (sign > 0) {
    add(stats_.inactive_split, block->small, 1);
    add(stats_.inactive_split_bytes, block->small, static_cast<std::int64_t>(block->size));
  } else {
    sub(stats_.inactive_split, block->small, 1);
    sub(stats_.inactive_split_bytes, block->small, static_cast<std::int64_t>(block->size));
  }
}

DeviceAllocator::Block* DeviceAllocator::alloc_found_block(Pool& pool, Block* block,
                                                           std::size_t rounded,
                                                           std::size_t requested) {
  account_inactive(block, -1);
  if (should_split(block, rounded)) {
    // The front becomes the allocation; the tail stays free in the pool.
    Block* rest = blocks_.create(block->ptr + rounded, block->size - rounded, block->stream,
                                 block->segment, block->small);
    rest->prev = block;
    rest->next = block->next;
    if (rest->next != nullptr) rest->next->prev = rest;
    block->next = rest;
    block->size = rounded;
    rest->gc_stamp = pool.calls;
    pool.index.insert(rest);
    account_inactive(rest, +1);
  }
  block->allocated = true;
  block->requested = requested;
  block->oversize = block->size >= config_.max_split_size;
  const auto bytes = static_cast<std::int64_t>(block->size);
  add(stats_.allocation, block->small, 1);
  add(stats_.allocated_bytes, block->small, bytes);
  add(stats_.active, block->small, 1);
  add(stats_.active_bytes, block->small, bytes);
  add(stats_.requested_bytes, block->small, static_cast<std::int64_t>(requested));
  if (block->oversize) stats_.oversize_allocations.increase(1);
  return block;
}

// ---- freeing ------------------------------------------------------------------------------------

FreeStatus DeviceAllocator::free(void* ptr, std::optional<std::size_t> expected_size,
                                 std::optional<stream_t> stream, std::size_t* actual_size) {
  std::lock_guard lock(mutex_);
  Block* block = live_.find(ptr);
  if (block == nullptr) return FreeStatus::not_found;
  if (actual_size != nullptr) *actual_size = block->requested;
  if (expected_size && *expected_size != block->requested) return FreeStatus::wrong_size;
  if (stream && *stream != block->stream &&
      std::find(block->stream_uses.begin(), block->stream_uses.end(), *stream) ==
          block->stream_uses.end()) {
    block->stream_uses.push_back(*stream);  // freed on another stream: that was its last use
  }
  if (!block->stream_uses.empty()) insert_events(block);  // may throw; nothing changed then
  live_.erase(ptr);
  block->allocated = false;
  const auto bytes = static_cast<std::int64_t>(block->size);
  sub(stats_.allocation, block->small, 1);
  sub(stats_.allocated_bytes, block->small, bytes);
  if (block->oversize) stats_.oversize_allocations.decrease(1);
  block->oversize = false;
  if (block->event_count == 0) free_block(block);
  return FreeStatus::freed;
}

DeviceAllocator::Block* DeviceAllocator::merge(Block* dst, Block* src) {
  // `src` is a free neighbour of `dst`; dst absorbs it.
  Pool& pool = pool_for(src->small);
  account_inactive(src, -1);
  pool.index.erase(src);
  if (src == dst->prev) {
    dst->ptr = src->ptr;
    dst->prev = src->prev;
    if (dst->prev != nullptr) {
      dst->prev->next = dst;
    } else {
      dst->segment->head = dst;
    }
  } else {
    dst->next = src->next;
    if (dst->next != nullptr) dst->next->prev = dst;
  }
  dst->size += src->size;
  blocks_.destroy(src);
  return dst;
}

void DeviceAllocator::free_block(Block* block) {
  // The block is neither allocated nor waiting for events: it leaves the active set.
  const auto bytes = static_cast<std::int64_t>(block->size);
  sub(stats_.active, block->small, 1);
  sub(stats_.active_bytes, block->small, bytes);
  sub(stats_.requested_bytes, block->small, static_cast<std::int64_t>(block->requested));
  block->requested = 0;
  block->stream_uses.clear();
  if (block->prev != nullptr && block->prev->in_index) merge(block, block->prev);
  if (block->next != nullptr && block->next->in_index) merge(block, block->next);
  Pool& pool = pool_for(block->small);
  block->gc_stamp = pool.calls;
  pool.index.insert(block);
  account_inactive(block, +1);
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
  return stats_;
}

void DeviceAllocator::reset_peak_stats() {
  std::lock_guard lock(mutex_);
  stats_.reset_peak();
}

void DeviceAllocator::reset_accumulated_stats() {
  std::lock_guard lock(mutex_);
  stats_.reset_accumulated();
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
