// core/device_view.hpp — DeviceView: what the collaborators of DeviceAllocator (Residency,
// Reports, PoolRoutes, Placement, KvPools) are handed of their device, and all they may reach:
// the device lock, the parts (each owns its own state and keeps its own invariants), and through
// DeviceUpkeep the device's few operations that span the parts. The view is made once, with the
// device; a collaborator takes `lock` before it touches anything else. Nothing else of
// DeviceAllocator is reachable: not the cache hit, the live table's writers, the failure in
// progress or the configuration's setters.
#pragma once

#include <cstddef>

#include "core/atomic_map.hpp"
#include "stitch/backend.hpp"
#include "stitch/config.hpp"
#include "stitch/stats.hpp"

namespace stitch::detail {

struct Block;
class BlockStore;
class DeviceLock;
class ExpandableRanges;
class HotStats;
class Ledger;
class PageMapper;
class PlainSegments;
class PrivatePools;
class Recorder;
class Stitcher;
class StreamEvents;

/// The device's operations that span its parts, for its collaborators (each under the device
/// lock). DeviceAllocator implements them.
class DeviceUpkeep {
 public:
  /// Retires the completed cross-stream events, when the device may be touched: for an
  /// allocation on `*stream`, or for a reader (`stream` null).
  virtual void poll_events(const stream_t* stream) = 0;
  /// Records the deferred events of the blocks none of whose streams captures any more.
  virtual void record_deferred_events() = 0;
  /// A pending block's last event completed: it becomes free.
  virtual void complete_pending(Block* block) = 0;
  /// Opens or closes the cache hit by the rules (recording, routes, events).
  virtual void note_hit_rules() noexcept = 0;
  /// Waits for every outstanding event and returns every free segment and page to the device
  /// (`keep`: stops once reserved memory is at most that many bytes; 0: all).
  virtual void release_cached_blocks(std::size_t keep) = 0;
  /// Returns the memory of the private pools without uses whose blocks are all free.
  virtual void release_unused_pools() = 0;
  /// The device's statistics, the cache hit's counters summed in.
  [[nodiscard]] virtual DeviceStats stats_locked() const noexcept = 0;
  /// Marks the allocated `block` as serving a request of `requested` bytes and counts it.
  virtual void activate(Block* block, std::size_t requested) noexcept = 0;

 protected:
  ~DeviceUpkeep() = default;
};

struct DeviceView {
  int device;
  Backend& backend;
  const Config& config;
  DeviceStats& stats;    ///< every statistic but the cache hit's (hot)
  Recorder& recorder;
  Ledger& ledger;
  HotStats& hot;
  BlockStore& store;
  AtomicMap<Block>& live;  ///< the live table (LiveTable)
  DeviceLock& lock;
  PageMapper& pages;
  StreamEvents& events;
  PrivatePools& pools;
  PlainSegments& plain;
  ExpandableRanges& ranges;
  Stitcher& stitcher;
  DeviceUpkeep& upkeep;
};

}  // namespace stitch::detail
