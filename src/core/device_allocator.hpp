// core/device_allocator.hpp — the caching allocator of one device: it routes each request to the
// cache hit or to the device lock, and orchestrates the core's types under the device lock.
//
// The fast path (a cache hit, core/cache_hit.hpp) takes its stream shard's lock only: best-fit
// lookup, optional split, live-table insert — no heap allocation, no scan, no backend call. The
// concepts around it are types of their own, each in its header:
// - stream_shards.hpp: each stream's share of the device (its lock, pools and statistics);
// - cache_hit.hpp: the allocations and frees served under a shard's lock alone;
// - block_store.hpp: the blocks, segments and pools, and every change of their shape;
// - hot_stats.hpp: the statistics every allocation changes, per shard, and their exact peaks;
// - device_lock.hpp: the device lock (its own and every shard's), for every other path;
// - stream_events.hpp: cross-stream events, recorded, deferred and polled;
// - private_pools.hpp: CUDA graph pools and their routes, and whether the device may be touched;
// - ledger.hpp: what is held from the device, and the memory-fraction cap;
// - plain_segments.hpp: cudaMalloc'd segments; expandable_ranges.hpp: expandable segments;
// - page_mapper.hpp: the only caller of the virtual-memory API;
// - stitcher.hpp: virtual-memory stitching; compactor.hpp: compaction (stitch_compact);
// - residency.hpp (and sleeper.hpp under it): where region-tagged memory lives: sleep, wake, trim;
// - placement.hpp: blocks where a recording had them (replays' start states, exact addresses);
// - reports.hpp: what the device says about itself (statistics, snapshots, the trace observer);
// - pool_routes.hpp: the entry points of private pools (routes, no-split, releases);
// - kv_pools.hpp: the elastic paged KV caches (stitch_kv_*), drawing pages from the same budget.
// Member functions by file: device_allocator.cpp (entry points under the device lock; the cache
// hit is core/cache_hit.*), device_growth.cpp (the out-of-memory ladder), device_oom.cpp (a failed
// request), device_validate.cpp (the cross-checks of validate()), device_tagged.cpp (tagged
// allocations).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <memory>
#include <optional>
#include <vector>

#include "core/block_store.hpp"
#include "core/cache_hit.hpp"
#include "core/compactor.hpp"
#include "core/device_lock.hpp"
#include "core/device_view.hpp"
#include "core/expandable_ranges.hpp"
#include "core/hot_stats.hpp"
#include "core/kv_pools.hpp"
#include "core/ledger.hpp"
#include "core/oom_capture.hpp"
#include "core/page_mapper.hpp"
#include "core/plain_segments.hpp"
#include "core/private_pools.hpp"
#include "core/placement.hpp"
#include "core/pool_routes.hpp"
#include "core/reports.hpp"
#include "core/residency.hpp"
#include "core/stream_shards.hpp"
#include "core/stitcher.hpp"
#include "core/stream_events.hpp"
#include "diagnostics/recorder.hpp"
#include "stitch/backend.hpp"
#include "stitch/block_info.hpp"
#include "stitch/config.hpp"
#include "stitch/private_pool.hpp"
#include "stitch/snapshot.hpp"
#include "stitch/stats.hpp"

namespace stitch {

/// Result of a free attempt on one device.
enum class FreeStatus { freed, not_found, wrong_size };

class DeviceAllocator final : private detail::DeviceUpkeep {
 public:
  DeviceAllocator(int device, Backend& backend, const Config& config);
  ~DeviceAllocator();
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  /// What malloc() returns: the block, or nullptr and, for a request that could not be served,
  /// what the device knew (`failure`, owned by the caller, who reports it after this device's
  /// lock is released; null for 0 bytes). Two registers: the hit path pays nothing for it.
  struct Allocation {
    void* ptr;
    detail::OomCapture* failure;
  };
  /// Allocates `size` bytes for `stream`. Throws backend_error and std::bad_alloc, with nothing
  /// changed. (Inline: the cache hit, a pair first; else malloc_locked.)
  [[gnu::always_inline]] Allocation malloc(std::size_t size, stream_t stream) {
    const detail::CacheHit::Taken t = hits_.take(size, stream);
    if (t.ptr != nullptr) [[likely]] return {t.ptr, nullptr};
    if (t.shard != nullptr)
      if (void* p = hits_.allocate_plain(*t.shard, size, t.rounded, stream)) return {p, nullptr};
    return malloc_locked(size, stream);
  }
  /// malloc() under the device lock (what the cache hit leaves).
  Allocation malloc_locked(std::size_t size, stream_t stream);
  /// Frees `ptr` if this device owns it. `expected_size` (if not null) must equal the requested
  /// size; `stream` (if not null and not the allocation stream) is treated as a last use. The
  /// requested size is stored in `actual_size` when given.
  [[gnu::always_inline]] FreeStatus free(void* ptr, const std::size_t* expected_size,
                                         const stream_t* stream, std::size_t* actual_size = nullptr) {
    const detail::CacheHit::Given g = hits_.give(ptr, expected_size, stream);
    if (g.done) [[likely]] return FreeStatus::freed;
    if (g.found != nullptr) {
      switch (hits_.free_plain(*g.found, ptr, expected_size, stream, actual_size)) {
        case detail::CacheHit::Freed::yes: return FreeStatus::freed;
        case detail::CacheHit::Freed::wrong_size: return FreeStatus::wrong_size;
        case detail::CacheHit::Freed::elsewhere: break;
      }
    }
    return free_locked(ptr, expected_size, stream, actual_size);
  }
  /// free() under the device lock (what the cache hit leaves).
  FreeStatus free_locked(void* ptr, const std::size_t* expected_size, const stream_t* stream,
                         std::size_t* actual_size);
  /// The cache hit (its pairs, inline in the callers, and its plain paths).
  [[nodiscard]] detail::CacheHit& hits() noexcept { return hits_; }
  /// Adds `stream` as a user of the live block at `ptr`; false if this device does not own it.
  bool record_stream(void* ptr, stream_t stream);
  /// Pins (`on`) or unpins the live block at `ptr`: while pinned, the physical memory under it
  /// never moves (compaction leaves its whole mapping alone). Pins count. False if this device
  /// does not own the block; throws invalid_argument for an unpin without a pin.
  bool pin(void* ptr, bool on);
  /// Returns every entirely free segment to the device (waits for outstanding events first).
  void empty_cache();

  // ---- region tags: where their memory lives (core/residency.hpp) --------------------------------
  /// The allocator whose regions (core/region_stack.hpp) tag this device's allocations.
  void set_owner(const void* owner) noexcept { owner_ = owner; }
  /// Sleep, wake, trim, the tags' states and the residency report of this device.
  [[nodiscard]] detail::Residency& residency() noexcept { return residency_; }
  /// Caps reserved memory at `fraction` of the device's capacity (>= 1: no cap).
  void set_memory_fraction(double fraction);
  /// The cap as a fraction of the device's capacity; 1 without a cap.
  [[nodiscard]] double memory_fraction() const;
  /// Applies new tunables (the backend keys are ignored here). The memory fraction is applied
  /// when `apply_fraction` (the key was given) or when it differs from the current setting, so
  /// a fraction set with set_memory_fraction() survives a configure() of other keys.
  void set_config(const Config& config, bool apply_fraction);
  /// The cache hit (core/cache_hit.hpp) on (the default) or off: off, the device lock serves
  /// every request. Results are identical either way; tests and benchmarks compare the two.
  void set_cache_hit(bool on);

  /// The elastic paged KV caches of this device (stitch_kv_*, core/kv_pools.hpp).
  [[nodiscard]] detail::KvPools& kv() noexcept { return kv_; }
  /// Statistics and their resets, snapshots, the trace observer, the largest request.
  [[nodiscard]] detail::Reports& reports() noexcept { return reports_; }
  [[nodiscard]] std::optional<BlockInfo> find(const void* ptr) const;
  /// Throws stitch::error on the first broken invariant (see Allocator::validate): each type
  /// checks its own, and this checks them against each other and the statistics.
  void validate() const;

  [[nodiscard]] int device() const noexcept { return device_; }

  // ---- private pools: CUDA graphs and MemPools (core/pool_routes.hpp, core/private_pools.hpp) -----
  /// Routes begun and ended, a pool's no-split rule, a use released.
  [[nodiscard]] detail::PoolRoutes& pool_routes() noexcept { return pool_routes_; }

  // ---- blocks where a recording had them (core/placement.hpp) -----------------------------------
  using SeedBlock = detail::SeedBlock;
  using SeedRun = detail::SeedRun;
  /// A recorded start state, releases as the recording made them, and blocks at an exact address.
  [[nodiscard]] detail::Placement& placement() noexcept { return placement_; }

 private:
  using Block = detail::Block;
  using BlockPool = detail::BlockPool;

  /// Marks the allocated `block` as serving a request of `requested` bytes and counts it.
  [[gnu::always_inline]] inline void activate(Block* block, std::size_t requested) noexcept override;
  /// malloc() from the tagged `pool` (a region tag's, or a tagged graph pool's): refused while the
  /// tag is asleep.
  Allocation malloc_in_tagged_pool(BlockPool& pool, std::size_t size, std::size_t rounded,
                                   stream_t stream);
  /// malloc() (locked) inside a region: memory of region tag `tag`, kept over a sleep when
  /// `backup`. Throws error while the tag is asleep here, and backend_error where the device has
  /// no virtual-memory API. An allocation a private-pool route takes is the pool's.
  Allocation malloc_tagged(std::size_t size, stream_t stream, std::uint16_t tag, bool backup);
  /// Best fit in `pool`, else the out-of-memory ladder; the block activated and entered live.
  [[gnu::always_inline]] inline Allocation allocate_from(BlockPool& pool, std::size_t size,
                                                         std::size_t rounded, stream_t stream);
  /// A pending block's last event completed: it becomes free.
  void complete_pending(Block* block) override;
  /// Retires the completed events, when the device may be touched: for an allocation on
  /// `*stream` (also recording the deferred events), or for a reader (`stream` null: only when
  /// no stream with events outstanding captures).
  void poll_events(const stream_t* stream) override;
  /// Records the deferred events of the blocks none of whose streams captures any more.
  void record_deferred_events() override;
  /// Closes the cache hit while the history is recorded, a private-pool route is underway or
  /// events are outstanding or deferred, and opens it when none is.
  void note_hit_rules() noexcept override {
    hits_.set_closed(detail::CacheHit::kRecording, recorder_.active());
    hits_.set_closed(detail::CacheHit::kRouting, pools_.routing());
    hits_.set_closed(detail::CacheHit::kEvents, events_.outstanding() != 0 || events_.deferred() != 0);
  }
  /// DeviceStats with the fast path's counters expanded in (the lock is held).
  [[nodiscard]] DeviceStats stats_locked() const noexcept override;

  // the out-of-memory ladder (device_growth.cpp)
  /// New memory for a request the cache cannot serve, through the out-of-memory ladder; nullptr
  /// with the failure captured in failed_ when even the last resort fails. While the device may
  /// not be touched (a route is underway or the stream captures) only new memory is asked for:
  /// nothing is released, synchronized, unmapped or moved, and a private pool grows by plain
  /// segments of its own.
  Block* allocate_slow(BlockPool& pool, stream_t stream, std::size_t rounded, std::size_t requested);
  /// Waits for every outstanding event and returns every free segment and page to the device,
  /// and the memory of the private pools without uses; with `keep`, stops once reserved memory
  /// is at most `keep` bytes.
  void release_cached_blocks(std::size_t keep = 0) override;
  /// Returns the memory of the private pools without uses whose blocks are all free.
  void release_unused_pools() override;

  /// Counts a failed request and captures its facts (and a what-if check's input) in failed_
  /// (device_oom.cpp).
  void capture_oom(std::size_t requested, std::size_t rounded, std::size_t alloc_size, bool small,
                   stream_t stream);

  const int device_;
  Backend& backend_;
  Config config_;
  bool configured_ = false;  ///< set_config() ran once

  DeviceStats stats_;       ///< every statistic except the fast path's (hot_)
  detail::Recorder recorder_;
  detail::Ledger ledger_{stats_, recorder_};  ///< what is held from the device, and the cap
  detail::StreamShards shards_;
  /// allocation, active, requested and inactive-split counters (per shard) and their peaks
  detail::HotStats hot_{shards_.head()};
  detail::BlockStore store_{config_, shards_, hot_};
  detail::LiveTable live_{1024, detail::live_slot_moved};  ///< the live allocations
  mutable detail::DeviceLock mutex_{shards_, store_};
  detail::CacheHit hits_{config_, shards_, store_, hot_, live_, mutex_.generation()};
  detail::PageMapper pages_{backend_, device_};
  detail::StreamEvents events_{backend_, device_};
  detail::PrivatePools pools_{backend_, device_};
  detail::PlainSegments plain_{backend_, device_, config_, store_, ledger_};
  detail::Stitcher stitcher_{store_, pages_, ledger_, stats_};
  detail::ExpandableRanges ranges_{config_, store_, pages_, ledger_, stitcher_};
  detail::Compactor compactor_{config_, store_, pages_, ledger_, stitcher_, stats_};
  /// What the collaborators below reach of the device (core/device_view.hpp).
  const detail::DeviceView view_{device_, backend_, config_, stats_, recorder_, ledger_, hot_, store_,
                                 live_,   mutex_,   pages_,  events_, pools_,   plain_,  ranges_,
                                 stitcher_, *this};
  detail::Residency residency_{view_, kv_};  ///< the tags: sleep, wake, trim, spill
  detail::Placement placement_{view_};       ///< recorded start states, exact addresses
  detail::Reports reports_{view_, residency_};  ///< statistics, snapshots, the observer
  detail::PoolRoutes pool_routes_{view_};    ///< private pools' routes
  detail::KvPools kv_{view_, residency_};    ///< the KV pools
  const void* owner_ = nullptr;          ///< the Allocator whose regions tag (set_owner)
  std::atomic<bool> python_frames_{false};  ///< the history takes Python frames
  /// The failure of the request in progress, until malloc hands it to its caller.
  std::unique_ptr<detail::OomCapture> failed_;
};

DeviceAllocator::Allocation DeviceAllocator::allocate_from(BlockPool& pool, std::size_t size,
                                                           std::size_t rounded, stream_t stream) {
  Block* block = store_.best_fit(pool, stream, rounded);
  if (block == nullptr) {
    block = allocate_slow(pool, stream, rounded, size);
    if (block == nullptr) return {nullptr, failed_.release()};
  }
  // The live table's slot first: nothing changes if it cannot be had (std::bad_alloc), and a
  // slot claimed for a take that throws stays as it was left, empty (AtomicMap::claim).
  detail::LiveTable::Slot* slot = live_.claim_excluding_writers(detail::LiveTable::key_of(block->ptr));
  block = store_.take(pool, block, rounded);
  block->live_slot = slot;
  detail::LiveTable::publish(slot, block);
  activate(block, size);
  recorder_.trace(TraceAction::alloc, block->ptr, size, stream);
  return {block->ptr, nullptr};
}

void DeviceAllocator::activate(Block* block, std::size_t requested) noexcept {
  block->requested = requested;
  block->oversize = block->size >= config_.max_split_size;
  if (block->oversize) stats_.oversize_allocations.increase(1);
  hot_.allocated_block(block->shard->stats, block->small, static_cast<std::int64_t>(block->size),
                       static_cast<std::int64_t>(requested));
}

}  // namespace stitch
