// core/pool_routes.hpp — the device's entry points of private pools (CUDA graphs and MemPools,
// core/private_pools.hpp): routes begun and ended, a pool's no-split rule, a use released. Each
// takes the device lock and keeps the cache hit closed while a route is underway, over the view
// of the device it is handed (core/device_view.hpp).
#pragma once

#include <cstdint>

#include "core/device_view.hpp"
#include "core/private_pool.hpp"

namespace stitch::detail {

class PoolRoutes {
 public:
  explicit PoolRoutes(const DeviceView& device) noexcept : d_(device) {}
  PoolRoutes(const PoolRoutes&) = delete;
  PoolRoutes& operator=(const PoolRoutes&) = delete;

  /// Routes the allocations on the streams `filter` accepts to private pool `id` (created at the
  /// first call, with region tag `tag` and `backup`; each call is one use) until
  /// end_allocate_to_pool(id).
  void begin_allocate_to_pool(PoolId id, StreamFilter filter, std::uint16_t tag = 0, bool backup = false);
  /// Ends the route to `id` begun last; once no route is left, the events of the blocks freed
  /// meanwhile are recorded at the next allocation (or empty_cache), after the capture itself
  /// has ended. Throws invalid_argument if no route to `id` is underway.
  void end_allocate_to_pool(PoolId id);
  /// Pool `id`'s free blocks serve requests whole from now on (PyTorch's setNoSplit).
  void set_no_split(PoolId id);
  /// Drops one use of pool `id`; at none, its memory goes back to the device as soon as (and
  /// whenever) its blocks are all free and no route is underway. Throws invalid_argument for an
  /// unknown pool.
  void release_pool(PoolId id);

 private:
  const DeviceView& d_;
};

}  // namespace stitch::detail
