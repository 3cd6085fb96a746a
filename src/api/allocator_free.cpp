// api/allocator_free.cpp — Allocator::deallocate_unhit: a sized free (stitch_free,
// deallocate(ptr, bytes, device, stream)) the cache hit's pair declined, on the hit's plain path,
// inlined (CacheHit::free_plain_inline: one frame past the entry point), else the device lock.
// A unit of its own: beside the other inlined copy (free_any_device_unhit, api/allocator.cpp) the
// compiler kept the store's filing out of line in both, which cost each free more than the frame
// this saves (docs/benchmarks.md).
#include "stitch/allocator.hpp"

#include "core/cache_hit.hpp"
#include "core/device_allocator.hpp"

namespace stitch {

void Allocator::deallocate_unhit(DeviceAllocator& home, detail::Block* found, void* ptr,
                                 std::size_t bytes, stream_t stream) {
  if (found != nullptr &&
      home.hits().free_plain_inline(*found, ptr, &bytes, &stream, nullptr) == detail::CacheHit::Freed::yes)
    [[likely]] return;
  // As allocate_unhit(); the device lock also says why a free is refused.
  std::size_t actual = 0;
  const FreeStatus status = found != nullptr ? home.free_locked(ptr, &bytes, &stream, &actual)
                                             : home.free(ptr, &bytes, &stream, &actual);
  if (status != FreeStatus::freed) [[unlikely]]
    reject_sized_free(home, status == FreeStatus::wrong_size, ptr, bytes, home.device(), actual);
}

}  // namespace stitch
