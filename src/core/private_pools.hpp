// core/private_pools.hpp — a device's private pools (PyTorch's CUDA graph pools and MemPools) and
// the routes that send allocations to them, and the one answer to "may the device be touched
// now?".
//
// While a route is underway (begin .. end), allocations on the streams its filter accepts come
// from its pool, in plain segments of their own; no other allocation ever gets a block of a
// private pool, and the device's release paths never touch one. A pool's memory goes back to the
// device once its last use is released and its blocks are free. While any route is underway a
// stream may be capturing a graph, so the device queries no event, waits for nothing and returns
// no memory (CUDA forbids those on a capturing stream); the events of blocks freed then are
// recorded at the first allocation after the last route has ended, as PyTorch does (its route
// ends before the capture does). Without a route, the back end is asked whether the streams
// concerned capture (a capture stitch was not told about). may_touch_device() is that rule.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <map>
#include <memory>
#include <vector>

#include "core/block_store.hpp"
#include "core/private_pool.hpp"
#include "stitch/backend.hpp"
#include "stitch/private_pool.hpp"

namespace stitch::detail {

class PrivatePools {
 public:
  /// Asks `backend` about `device`'s streams.
  PrivatePools(Backend& backend, int device) noexcept : backend_(backend), device_(device) {}

  /// Routes the allocations on the streams `filter` accepts to pool `id` (created at its first
  /// route, with region tag `tag` and `backup`; each begin is one use) until end(id). Throws
  /// invalid_argument for an empty filter.
  void begin(PoolId id, StreamFilter filter, std::uint16_t tag = 0, bool backup = false);
  /// Ends the route to `id` begun last. Throws invalid_argument if none is underway.
  void end(PoolId id);
  /// Drops one use of pool `id`. True when no route is underway any more, so that the unused
  /// pools' memory may go back now. Throws invalid_argument for an unknown pool.
  bool release(PoolId id);
  /// Pool `id`'s free blocks serve requests whole from now on (PyTorch's setNoSplit). Throws
  /// invalid_argument for a pool not in use.
  void set_no_split(PoolId id);
  /// Whether a route is underway.
  [[nodiscard]] bool routing() const noexcept { return !routes_.empty(); }
  /// Whether `pool` (a private pool's) is without uses: its memory may go back.
  [[nodiscard]] static bool unused(const PrivatePool* pool) noexcept { return pool->use_count == 0; }
  /// The pool an allocation of `small` size on `stream` comes from: the newest route's that
  /// accepts the stream, else `device_pool`.
  BlockPool& route(stream_t stream, bool small, BlockPool& device_pool);

  /// May the device be touched now for work on `streams`: events queried or recorded, streams
  /// synchronized, memory returned, unmapped or moved? Not while a route is underway, nor while
  /// the back end says one of them captures a graph.
  [[nodiscard]] bool may_touch_device(std::initializer_list<stream_t> streams) {
    if (!routes_.empty()) return false;
    for (stream_t s : streams)
      if (backend_.is_capturing(device_, s)) return false;
    return true;
  }
  /// may_touch_device for `block`'s stream and every stream it was used on.
  [[nodiscard]] bool may_touch_device(const Block* block);

  /// Returns the entirely free plain segments of the pools without uses (through
  /// `release_segment(block)`; a tagged pool's expandable ranges are the caller's to release
  /// first), and forgets such a pool once it holds none. No route may be underway.
  template <typename Release>
  void release_unused(Release&& release_segment) {
    for (auto it = pools_.begin(); it != pools_.end();) {
      PrivatePool& p = *it->second;
      if (p.use_count == 0) {
        std::vector<Block*> whole;
        for (BlockPool* pool : {&p.small, &p.large})
          for (Block* b : pool->index)
            if (!b->is_split() && !b->segment->expandable) whole.push_back(b);
        for (Block* b : whole) release_segment(b);
      }
      if (p.use_count == 0 && p.segments == 0) {
        it = pools_.erase(it);
      } else {
        ++it;
      }
    }
  }

  /// Checks the pools against the store's recount (their segments, their free blocks). Throws
  /// stitch::error.
  void validate(const StoreCount& count) const;

 private:
  Backend& backend_;
  const int device_;
  std::map<PoolId, std::unique_ptr<PrivatePool>> pools_;
  std::vector<PoolRoute> routes_;  ///< underway, oldest first
};

}  // namespace stitch::detail
