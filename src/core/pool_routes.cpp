// core/pool_routes.cpp — PoolRoutes: the device's entry points of private pools
// (core/pool_routes.hpp).
#include "core/pool_routes.hpp"

#include <fmt/format.h>

#include <mutex>
#include <utility>

#include "core/device_lock.hpp"
#include "core/page_mapper.hpp"
#include "core/private_pools.hpp"
#include "stitch/errors.hpp"

namespace stitch::detail {

void PoolRoutes::begin_allocate_to_pool(PoolId id, StreamFilter filter, std::uint16_t tag,
                                             bool backup) {
  if (tag != 0 && !d_.pages.supported())
    throw backend_error(fmt::format(
        "a graph pool begun in a region is tagged: its memory is mapped in pages, and backend:{} "
        "has no virtual-memory API on device {}", d_.backend.name(), d_.device));
  std::lock_guard lock(d_.lock);
  d_.pools.begin(id, std::move(filter), tag, backup);
  d_.upkeep.note_hit_rules();  // no cache hit while a route is underway
}

void PoolRoutes::end_allocate_to_pool(PoolId id) {
  std::lock_guard lock(d_.lock);
  d_.pools.end(id);
  // The deferred events wait for the next allocation: the capture has not ended yet.
  d_.upkeep.note_hit_rules();
}

void PoolRoutes::set_no_split(PoolId id) {
  std::lock_guard lock(d_.lock);
  d_.pools.set_no_split(id);
}

void PoolRoutes::release_pool(PoolId id) {
  std::lock_guard lock(d_.lock);
  if (d_.pools.release(id)) d_.upkeep.release_unused_pools();
}

}  // namespace stitch::detail
