// core/device_allocator.cpp — the per-device entry points: the fast path (best fit, split, the
// live table), freeing (events, parking, filing), record_stream, the queries, the private-pool
// routes and the configuration.
#include "core/device_allocator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>

#include "core/assert.hpp"
#include "core/constants.hpp"
#include "core/region_stack.hpp"
#include "core/size_policy.hpp"
#include "stitch/errors.hpp"

namespace stitch {

using detail::BlockState;

DeviceAllocator::DeviceAllocator(int device, Backend& backend, const Config& config)
    : device_(device), backend_(backend) {
  set_config(config, true);
}

DeviceAllocator::~DeviceAllocator() {
  // Return what is cached; blocks still allocated stay with the device (their memory is the
  // caller's). Errors cannot be reported from a destructor, so they are dropped. (Stray mappings
  // and orphaned pages get one more try in pages_'s destructor; the store forgets the blocks.)
  try {
    std::lock_guard lock(mutex_);
    release_cached_blocks();
  } catch (...) {
  }
}

void DeviceAllocator::set_config(const Config& config, bool apply_fraction) {
  if (config.expandable_segments && !pages_.supported())
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
                        /*device_empty=*/store_.segments() == nullptr);
    python_frames_.store(recorder_.python_stacks(), std::memory_order_relaxed);
    note_pairs();
    reuse_.settle_all();  // a pair that began before the change has ended
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

void DeviceAllocator::set_immediate_reuse(bool on, bool backoff) {
  std::lock_guard lock(mutex_);
  reuse_.set_enabled(on);
  reuse_.set_backoff(backoff);
  note_pairs();
  reuse_.settle_all();  // a pair that began before the change has ended
}

// ---- allocation ---------------------------------------------------------------------------------

DeviceAllocator::Allocation DeviceAllocator::malloc_locked(std::size_t size, stream_t stream,
                                                           detail::ThreadSlot* mine) {
  if (size == 0) return {nullptr, nullptr};
  // Python frames for the history are gathered before the lock (they take the GIL).
  const detail::GatheredPythonFrames frames(python_frames_.load(std::memory_order_relaxed));
  detail::UnsettledGuard guard(mutex_);  // malloc and free alone may find the slots unsettled
  if (mine != nullptr) {  // its pairs, and the blocks it holds from its extents, came first
    reuse_.flush(*mine);
    reuse_.settle_handouts(*mine, true);
  }
  // Inside a region of this allocator (then `mine` is null: the thread's slots wait).
  if (const detail::RegionFrame* region = detail::innermost_region(owner_)) [[unlikely]]
    return malloc_tagged(size, stream, region->tag, region->backup);
  if (size >= detail::kMaxRequest) {
    if (mine != nullptr) reuse_.settle(*mine);
    capture_oom(size, size, size, false, stream);
    return {nullptr, failed_.release()};
  }
  // No event is recorded or queried while a route to a private pool is underway: a stream may
  // be capturing. The events deferred meanwhile are recorded here, at the first allocation after
  // the last route (PyTorch ends the route before the capture itself ends).
  if (events_.outstanding() != 0 || events_.deferred() != 0) poll_events(mine, &stream);
  const std::size_t rounded = detail::round_size(size, config_.roundup_power2_divisions);
  const bool small = detail::is_small(rounded);
  BlockPool& pool =
      pools_.routing() ? pools_.route(stream, small, store_.pool(small)) : store_.pool(small);
  if (pool.tag != 0) [[unlikely]] return malloc_in_tagged_pool(pool, mine, size, rounded, stream);
  // Ended threads' extents on this stream are free memory best fit weighs: filed back first (a
  // live thread's are its own, ImmediateReuse::settle_parked_on).
  if (reuse_.shared()) reuse_.settle_parked_on(stream, mine);
  if (mine != nullptr && mine->holds()) {
    if (void* again = reuse_.take_back(*mine, size, rounded, stream, pool)) {
      recorder_.trace(TraceAction::alloc, again, size, stream);
      return {again, nullptr};
    }
  }
  return allocate_from(pool, size, rounded, stream);
}


void DeviceAllocator::poll_events(detail::ThreadSlot* mine, const stream_t* stream) {
  if (stream == nullptr) {
    // A reader: an allocation polls the events too, but a run may end with cross-stream frees
    // and read its statistics long after their streams finished: those blocks are free.
    // Reading never fails for it: when a query fails, the blocks stay pending (the next
    // allocation polls again and reports the error).
    try {
      if (events_.outstanding() == 0 ||
          events_.any_stream([this](stream_t s) { return !pools_.may_touch_device({s}); }))
        return;
      events_.poll([this](Block* b) { complete_pending(b); });
    } catch (...) {
    }
  } else {
    if (!pools_.may_touch_device({*stream})) return;
    if (mine != nullptr) reuse_.settle(*mine);
    record_deferred_events();
    events_.poll([this](Block* b) { complete_pending(b); });
  }
  reuse_.note_events(events_.outstanding() != 0);
}

void DeviceAllocator::record_deferred_events() {
  try {
    events_.record_deferred([this](const Block* b) { return pools_.may_touch_device(b); });
  } catch (...) {  // the blocks recorded before the failure wait for their events
    reuse_.note_events(events_.outstanding() != 0);
    throw;
  }
  reuse_.note_events(events_.outstanding() != 0);
}

void DeviceAllocator::complete_pending(Block* block) {
  hot_.pending_done(block->small, static_cast<std::int64_t>(block->size));
  recorder_.trace(TraceAction::free_completed, block->ptr, block->requested, block->stream);
  store_.file_freed(block);
}

// ---- freeing ------------------------------------------------------------------------------------

FreeStatus DeviceAllocator::free_locked(void* ptr, const std::size_t* expected_size,
                                        const stream_t* stream, std::size_t* actual_size,
                                        detail::ThreadSlot* mine) {
  detail::UnsettledGuard guard(mutex_);
  if (mine != nullptr) {  // its pairs, and the blocks it holds from its extents, came first
    reuse_.flush(*mine);
    reuse_.settle_handouts(*mine, false);
  }
  Block* block = live_.find(ptr);
  if (block == nullptr) return FreeStatus::not_found;
  // A thread's extent: free memory (this is a second free), or a block handed out from it (an
  // ordinary allocation from here on).
  if (block->state == BlockState::parked && reuse_.settle_block(*block)) return FreeStatus::not_found;
  if (actual_size != nullptr) *actual_size = block->requested;
  if (expected_size != nullptr && *expected_size != block->requested)
    return FreeStatus::wrong_size;
  // Asleep: its backup goes (its memory is simply free at the wake).
  if (block->segment->asleep) sleeper_.forget(block);
  if (stream != nullptr && *stream != block->stream &&
      std::find(block->stream_uses.begin(), block->stream_uses.end(), *stream) ==
          block->stream_uses.end()) {
    block->stream_uses.push_back(*stream);  // freed on another stream: that was its last use
  }
  if (!block->stream_uses.empty()) {
    if (pools_.may_touch_device(block)) {
      events_.record(block);  // may throw; nothing changed then
      reuse_.note_events(true);
    } else {
      events_.defer(block);  // a stream may be capturing: recorded when the captures end
    }
  }
  // Without events, the free block this one ends in stays with the calling thread as an extent,
  // where its next allocations on the stream may take blocks of it without the lock. (Not while
  // a region is open: the thread's slots wait, ThreadSlots::find_mine.)
  const bool park = reuse_.may_park(block) && !pools_.routing() && detail::t_open_regions == 0 &&
                    (mine == nullptr || !detail::ImmediateReuse::cold_free(*mine));
  if (park && mine == nullptr) mine = reuse_.mine_or_create();  // may throw: nothing changed
  recorder_.trace(TraceAction::free_requested, block->ptr, block->requested, block->stream);
  live_.erase(block->ptr);
  const bool pending = block->state != BlockState::allocated;
  if (block->oversize) stats_.oversize_allocations.decrease(1);
  block->oversize = false;
  hot_.freed_block(block->small, static_cast<std::int64_t>(block->size), pending);
  if (!pending) {
    recorder_.trace(TraceAction::free_completed, block->ptr, block->requested, block->stream);
    // (Extents next to it are settled by the filing, BlockHolder, and merge with it.)
    Block* free = store_.file_freed(block);
    if (park) reuse_.park(*mine, free);
  }
  return FreeStatus::freed;
}

bool DeviceAllocator::record_stream(void* ptr, stream_t stream) {
  std::lock_guard lock(mutex_);
  Block* block = live_.find(ptr);
  if (block == nullptr || block->state != BlockState::allocated) return false;
  if (stream == block->stream) return true;  // its own stream is ordered already
  if (std::find(block->stream_uses.begin(), block->stream_uses.end(), stream) ==
      block->stream_uses.end())
    block->stream_uses.push_back(stream);
  return true;
}

bool DeviceAllocator::pin(void* ptr, bool on) {
  std::lock_guard lock(mutex_);
  Block* block = live_.find(ptr);
  if (block == nullptr || block->state != BlockState::allocated) return false;
  if (!on && block->pins == 0)
    throw invalid_argument(fmt::format("unpin of {}: the block is not pinned", ptr));
  block->pins += on ? 1 : -1;
  return true;
}

void DeviceAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  if (!pools_.may_touch_device({})) return;  // a stream may capture: nothing waited for or freed
  release_cached_blocks();
}

// ---- private pools ------------------------------------------------------------------------------

void DeviceAllocator::begin_allocate_to_pool(PoolId id, StreamFilter filter, std::uint16_t tag,
                                             bool backup) {
  if (tag != 0 && !pages_.supported())
    throw backend_error(fmt::format(
        "a graph pool begun in a region is tagged: its memory is mapped in pages, and backend:{} "
        "has no virtual-memory API on device {}", backend_.name(), device_));
  std::lock_guard lock(mutex_);  // settles the threads' extents
  pools_.begin(id, std::move(filter), tag, backup);
  note_pairs();  // no unlocked reuse while a route is underway
}

void DeviceAllocator::end_allocate_to_pool(PoolId id) {
  std::lock_guard lock(mutex_);
  pools_.end(id);
  // The deferred events wait for the next allocation: the capture has not ended yet.
  note_pairs();
}

void DeviceAllocator::release_pool(PoolId id) {
  std::lock_guard lock(mutex_);
  if (pools_.release(id)) release_unused_pools();
}

// ---- queries ------------------------------------------------------------------------------------

DeviceStats DeviceAllocator::stats() {
  std::lock_guard lock(mutex_);
  poll_events(nullptr, nullptr);
  return stats_locked();
}

DeviceStats DeviceAllocator::stats_locked() const noexcept {
  DeviceStats out = stats_;
  hot_.expand(out);
  return out;
}

std::vector<TraceEntry> DeviceAllocator::snapshot(std::vector<SegmentSnapshot>& out) {
  std::lock_guard lock(mutex_);
  poll_events(nullptr, nullptr);  // blocks whose streams are done are shown free
  recorder_.trace(TraceAction::snapshot, nullptr, 0, nullptr);
  store_.snapshot(device_, out, /*oldest_first=*/false, &tag_names_);
  return recorder_.entries();
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
  if (block == nullptr || block->state != BlockState::allocated) return std::nullopt;
  return BlockInfo{device_, block->requested, block->size, block->stream};
}

}  // namespace stitch
