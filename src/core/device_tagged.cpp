// core/device_tagged.cpp — allocations under a region tag: routed to the tag's pools (or a
// route's private pool), refused while the tag is asleep (core/residency.hpp has the rest).
#include <fmt/format.h>

#include "core/constants.hpp"
#include "core/device_allocator.hpp"
#include "core/size_policy.hpp"
#include "stitch/errors.hpp"

namespace stitch {

using detail::BlockState;

DeviceAllocator::Allocation DeviceAllocator::malloc_tagged(std::size_t size, stream_t stream,
                                                           std::uint16_t tag, bool backup) {
  if (!pages_.supported())
    throw backend_error(fmt::format(
        "cannot allocate under region tag '{}' on device {}: tagged memory is mapped in pages "
        "that a sleep gives back, and backend:{} has no virtual-memory API on this device",
        residency_.tag_name(tag), device_, backend_.name()));
  if (size >= detail::kMaxRequest) {
    capture_oom(size, size, size, false, stream);
    return {nullptr, failed_.release()};
  }
  if (events_.outstanding() != 0 || events_.deferred() != 0) poll_events(&stream);
  const std::size_t rounded = detail::round_size(size, config_.roundup_power2_divisions);
  const bool small = detail::is_small(rounded);
  // A route's private pool takes it (a graph's, tagged by the region its capture began in).
  BlockPool& pool = pools_.routing() ? pools_.route(stream, small, store_.pool(small, tag))
                                     : store_.pool(small, tag);
  if (pool.tag == 0) return allocate_from(pool, size, rounded, stream);  // an untagged graph pool
  const Allocation a = malloc_in_tagged_pool(pool, size, rounded, stream);
  if (a.ptr != nullptr && pool.owner == nullptr) live_.find(detail::LiveTable::key_of(a.ptr))->backup = backup;
  return a;
}

DeviceAllocator::Allocation DeviceAllocator::malloc_in_tagged_pool(BlockPool& pool,
                                                                   std::size_t size,
                                                                   std::size_t rounded,
                                                                   stream_t stream) {
  if (residency_.sleeper().asleep(pool.tag))
    throw error(fmt::format(
        "cannot allocate {} bytes under region tag '{}' on device {}: the tag is asleep "
        "(stitch_wake it first)", size, residency_.tag_name(pool.tag), device_));
  residency_.sleeper().note_used(pool.tag);
  const Allocation a = allocate_from(pool, size, rounded, stream);
  // A graph pool's blocks are kept over a sleep as its region asked (the region's own: below).
  if (a.ptr != nullptr)
    live_.find(detail::LiveTable::key_of(a.ptr))->backup = pool.owner != nullptr && pool.owner->backup;
  return a;
}

}  // namespace stitch
