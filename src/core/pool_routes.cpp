// core/pool_routes.cpp — PoolRoutes: the device's entry points of private pools
// (core/pool_routes.hpp).
#include "core/pool_routes.hpp"

#include <fmt/format.h>

#include <mutex>
#include <utility>

#include "core/device_allocator.hpp"
#include "stitch/errors.hpp"

namespace stitch::detail {

void PoolRoutes::begin_allocate_to_pool(PoolId id, StreamFilter filter, std::uint16_t tag,
                                             bool backup) {
  if (tag != 0 && !d_.pages_.supported())
    throw backend_error(fmt::format(
        "a graph pool begun in a region is tagged: its memory is mapped in pages, and backend:{} "
        "has no virtual-memory API on device {}", d_.backend_.name(), d_.device_));
  std::lock_guard lock(d_.mutex_);
  d_.pools_.begin(id, std::move(filter), tag, backup);
  d_.note_hit_rules();  // no cache hit while a route is underway
}

void PoolRoutes::end_allocate_to_pool(PoolId id) {
  std::lock_guard lock(d_.mutex_);
  d_.pools_.end(id);
  // The deferred events wait for the next allocation: the capture has not ended yet.
  d_.note_hit_rules();
}

void PoolRoutes::set_no_split(PoolId id) {
  std::lock_guard lock(d_.mutex_);
  d_.pools_.set_no_split(id);
}

void PoolRoutes::release_pool(PoolId id) {
  std::lock_guard lock(d_.mutex_);
  if (d_.pools_.release(id)) d_.release_unused_pools();
}

}  // namespace stitch::detail
