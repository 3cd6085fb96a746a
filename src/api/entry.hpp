// api/entry.hpp — allocate() and deallocate(ptr, bytes, device, stream) on one device, which
// Allocator's entry points and the C API's stitch_malloc and stitch_free inline: the cache hit
// (core/cache_hit.hpp; a pair, else its plain path), so that a hit makes no call from one entry
// into another, then one call for what the hit leaves (Allocator::allocate_unhit: the device
// lock; deallocate_unhit: the plain free, inlined there, then the device lock).
#pragma once

#include <cstddef>

#include "core/cache_hit.hpp"
#include "core/device_allocator.hpp"
#include "stitch/allocator.hpp"

namespace stitch {

/// Allocator::allocate(bytes, stream, d's device). The pair's take waits for no lock another
/// thread holds (that request goes on under the device lock).
[[gnu::always_inline]] inline void* allocate_on(Allocator& a, DeviceAllocator& d, std::size_t bytes,
                                                stream_t stream) {
  const detail::CacheHit::Taken t = d.hits().take<false>(bytes, stream);
  if (t.ptr != nullptr) [[likely]] return t.ptr;
  if (t.shard != nullptr)  // (the take kept its lock)
    if (void* p = d.hits().allocate_plain(*t.shard, bytes, t.rounded, stream)) [[likely]] return p;
  return a.allocate_unhit(d, t.shard != nullptr, bytes, stream);
}

/// Allocator::deallocate(ptr, bytes, home's device, stream), as allocate_on().
[[gnu::always_inline]] inline void deallocate_on(Allocator& a, DeviceAllocator& home, void* ptr,
                                                 std::size_t bytes, stream_t stream) {
  const detail::CacheHit::Given g = home.hits().give<false>(ptr, &bytes, &stream);
  if (g.done) [[likely]] return;
  a.deallocate_unhit(home, g.found, ptr, bytes, stream);  // (g.found: give kept its shard's lock)
}

}  // namespace stitch
