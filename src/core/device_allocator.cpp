// core/device_allocator.cpp — the per-device entry points under the device lock: allocation past
// the cache hit (best fit, split, the live table), freeing (events, filing), record_stream, the
// queries, the private-pool routes and the configuration.
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
  // A sleep's unmap that failed stays reserved until the page mapper's retry unmaps it.
  pages_.on_unbooked([this](bool small, const char* va, std::size_t bytes) { ledger_.stray_unmapped(small, va, bytes); });
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
  if (config.spill != Config::Spill::off && pages_.host_granularity() == 0)
    throw config_error(fmt::format(
        "spill:{} needs host pages the device maps, which backend:{} does not support on device {} "
        "(backend:cuda needs CUDA 12.2+ and a driver that creates CU_MEM_LOCATION_TYPE_HOST_NUMA "
        "memory)", config.spill == Config::Spill::tags ? "tags" : "all", backend_.name(), device_));
  bool fraction_changed = false;
  {
    std::lock_guard lock(mutex_);  // no cache hit runs: the new tunables decide from here on
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
    hits_.configure(config_);
    note_hit_rules();
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

void DeviceAllocator::set_cache_hit(bool on) {
  std::lock_guard lock(mutex_);
  hits_.set_closed(detail::CacheHit::kOff, !on);
}

// ---- allocation ---------------------------------------------------------------------------------

DeviceAllocator::Allocation DeviceAllocator::malloc_locked(std::size_t size, stream_t stream) {
  if (size == 0) return {nullptr, nullptr};
  // Python frames for the history are gathered before the lock (they take the GIL).
  const detail::GatheredPythonFrames frames(python_frames_.load(std::memory_order_relaxed));
  std::lock_guard lock(mutex_);
  // A crowded live table sends the cache hit here: rebuilt, it serves it again (may throw:
  // nothing changed).
  if (live_.crowded()) live_.rebuild();
  // Inside a region of this allocator.
  if (const detail::RegionFrame* region = detail::innermost_region(owner_)) [[unlikely]]
    return malloc_tagged(size, stream, region->tag, region->backup);
  if (size >= detail::kMaxRequest) {
    capture_oom(size, size, size, false, stream);
    return {nullptr, failed_.release()};
  }
  // No event is recorded or queried while a route to a private pool is underway: a stream may
  // be capturing. The events deferred meanwhile are recorded here, at the first allocation after
  // the last route (PyTorch ends the route before the capture itself ends).
  if (events_.outstanding() != 0 || events_.deferred() != 0) poll_events(&stream);
  const std::size_t rounded = detail::round_size(size, config_.roundup_power2_divisions);
  const bool small = detail::is_small(rounded);
  BlockPool& device_pool = store_.pool(stream, small);  // (the stream's shard, made at its first use)
  BlockPool& pool = pools_.routing() ? pools_.route(stream, small, device_pool) : device_pool;
  if (pool.tag != 0) [[unlikely]] return malloc_in_tagged_pool(pool, size, rounded, stream);
  return allocate_from(pool, size, rounded, stream);
}


void DeviceAllocator::poll_events(const stream_t* stream) {
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
    record_deferred_events();
    events_.poll([this](Block* b) { complete_pending(b); });
  }
  note_hit_rules();
}

void DeviceAllocator::record_deferred_events() {
  try {
    events_.record_deferred([this](const Block* b) { return pools_.may_touch_device(b); });
  } catch (...) {  // the blocks recorded before the failure wait for their events
    note_hit_rules();
    throw;
  }
  note_hit_rules();
}

void DeviceAllocator::complete_pending(Block* block) {
  hot_.pending_done(block->small, static_cast<std::int64_t>(block->size));
  recorder_.trace(TraceAction::free_completed, block->ptr, block->requested, block->stream);
  detail::Segment* segment = block->segment;
  store_.file_freed(block);
  if (segment->spilled != 0) residency_.release_freed(*segment);  // host pages it left go back
}

// ---- freeing ------------------------------------------------------------------------------------

namespace {
/// Adds `stream` to the streams that used `block` (not its own, which is ordered already).
void add_stream_use(detail::Block& block, stream_t stream) {
  if (stream != block.stream &&
      std::find(block.stream_uses.begin(), block.stream_uses.end(), stream) == block.stream_uses.end())
    block.stream_uses.push_back(stream);
}
/// Pins (`on`) or unpins `block`.
void add_pin(detail::Block& block, bool on) {
  if (!on && block.pins == 0)
    throw invalid_argument(fmt::format("unpin of {}: the block is not pinned", fmt::ptr(block.ptr)));
  block.pins += on ? 1 : -1;
}
}  // namespace

FreeStatus DeviceAllocator::free_locked(void* ptr, const std::size_t* expected_size,
                                        const stream_t* stream, std::size_t* actual_size) {
  std::lock_guard lock(mutex_);
  Block* block = live_.find(detail::LiveTable::key_of(ptr));  // (exact under the device lock)
  if (block == nullptr) return FreeStatus::not_found;
  if (actual_size != nullptr) *actual_size = block->requested;
  if (expected_size != nullptr && *expected_size != block->requested)
    return FreeStatus::wrong_size;
  if (stream != nullptr) add_stream_use(*block, *stream);  // freed on another stream: its last use
  // Asleep: its backup goes (its memory is simply free at the wake).
  if (block->segment->asleep) residency_.sleeper().forget(block);
  if (!block->stream_uses.empty()) {
    if (pools_.may_touch_device(block)) {
      events_.record(block);  // may throw; nothing changed then
    } else {
      events_.defer(block);  // a stream may be capturing: recorded when the captures end
    }
    note_hit_rules();  // (closed while events are outstanding or deferred)
  }
  recorder_.trace(TraceAction::free_requested, block->ptr, block->requested, block->stream);
  detail::LiveTable::publish(block->live_slot, nullptr);  // (its key's slot stays, dormant)
  const bool pending = block->state != BlockState::allocated;
  if (block->oversize) stats_.oversize_allocations.decrease(1);
  block->oversize = false;
  detail::HotStats::freed_block(block->shard->stats, block->small, static_cast<std::int64_t>(block->size));
  if (pending) {
    hot_.pending_block(block->small, static_cast<std::int64_t>(block->size));
  } else {
    recorder_.trace(TraceAction::free_completed, block->ptr, block->requested, block->stream);
    detail::Segment* segment = block->segment;
    store_.file_freed(block);
    // A spilled range's host pages the free left wholly free go back to the host now.
    if (segment->spilled != 0) residency_.release_freed(*segment);
  }
  return FreeStatus::freed;
}


bool DeviceAllocator::record_stream(void* ptr, stream_t stream) {
  // Under the block's shard lock when it is found that way, else under the device lock.
  if (hits_.with_live(ptr, [&](Block& b) { add_stream_use(b, stream); })) return true;
  std::lock_guard lock(mutex_);
  Block* block = live_.find(detail::LiveTable::key_of(ptr));
  if (block == nullptr || block->state != BlockState::allocated) return false;
  add_stream_use(*block, stream);
  return true;
}

bool DeviceAllocator::pin(void* ptr, bool on) {
  if (hits_.with_live(ptr, [&](Block& b) { add_pin(b, on); })) return true;
  std::lock_guard lock(mutex_);
  Block* block = live_.find(detail::LiveTable::key_of(ptr));
  if (block == nullptr || block->state != BlockState::allocated) return false;
  add_pin(*block, on);
  return true;
}

void DeviceAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  if (!pools_.may_touch_device({})) return;  // a stream may capture: nothing waited for or freed
  release_cached_blocks();
  residency_.unspill_with_room();  // spilled memory comes back while the device has room
}

// ---- queries ------------------------------------------------------------------------------------

DeviceStats DeviceAllocator::stats_locked() const noexcept {
  DeviceStats out = stats_;
  hot_.expand(out);
  return out;
}

std::optional<BlockInfo> DeviceAllocator::find(const void* ptr) const {
  std::optional<BlockInfo> out;
  auto read = [&](const Block& b) { out = BlockInfo{device_, b.requested, b.size, b.stream}; };
  if (hits_.with_live(ptr, read)) return out;
  std::lock_guard lock(mutex_);
  const Block* block = live_.find(detail::LiveTable::key_of(ptr));
  if (block != nullptr && block->state == BlockState::allocated) read(*block);
  return out;
}

}  // namespace stitch
