// api/kv_pool.cpp — stitch::KvPool: the C++ face of a device's KV pool (core/kv_pools.hpp).
#include "stitch/kv_pool.hpp"

#include <fmt/format.h>

#include "core/device_allocator.hpp"
#include "stitch/errors.hpp"

namespace stitch {

KvPool::KvPool(Allocator& allocator, int device, int buffers, std::size_t block_bytes,
               std::size_t max_blocks, std::string_view tag, unsigned flags)
    : allocator_(allocator), device_(device), buffers_(buffers), block_bytes_(block_bytes),
      max_blocks_(max_blocks) {
  if ((flags & ~(Allocator::kRegionBackup | Allocator::kRegionSpill)) != 0)
    throw invalid_argument(fmt::format("stitch_kv_create: unknown flags {:#x} (STITCH_REGION_BACKUP 1, "
                                       "STITCH_REGION_SPILL 2)", flags));
  if (tag.empty()) tag = "kv";
  if (tag.find(',') != std::string_view::npos)
    throw invalid_argument(fmt::format("stitch_kv_create: tag '{}' has a comma", tag));
  DeviceAllocator& d = allocator.device(device);
  const std::uint16_t id = allocator.tag_id(tag, true);
  const std::string name(tag);  // (the name tag_id registered)
  const bool spill = (flags & Allocator::kRegionSpill) != 0;
  for (int k = 0; k < allocator.device_count(); ++k) allocator.device(k).residency().name_tag(id, name);
  id_ = d.kv().create(buffers, block_bytes, max_blocks, id, name, (flags & Allocator::kRegionBackup) != 0, spill);
  // The tag becomes spillable only once the pool exists: a create that failed leaves it as it was.
  if (!spill) return;
  try {
    for (int k = 0; k < allocator.device_count(); ++k) allocator.device(k).residency().name_tag(id, name, true);
  } catch (...) {
    d.kv().destroy(id_);
    throw;
  }
}

KvPool::~KvPool() {
  if (destroyed_) return;
  try {
    destroy();
  } catch (...) {  // live blocks: the pool stays with the device until the allocator goes
  }
}

void* KvPool::buffer(int buffer) const { return allocator_.device(device_).kv().buffer(id_, buffer); }

void KvPool::alloc(std::size_t n, std::int64_t* ids) { allocator_.device(device_).kv().alloc(id_, n, ids); }

std::vector<std::int64_t> KvPool::alloc(std::size_t n) {
  std::vector<std::int64_t> ids(n);
  alloc(n, ids.data());
  return ids;
}

void KvPool::free(const std::int64_t* ids, std::size_t n) { allocator_.device(device_).kv().free(id_, ids, n); }

void KvPool::set_limit(std::size_t bytes) { allocator_.device(device_).kv().set_limit(id_, bytes); }

std::size_t KvPool::available() const { return allocator_.device(device_).kv().available(id_); }

void KvPool::trim() { allocator_.device(device_).kv().trim(id_); }

void KvPool::destroy() {
  if (destroyed_) return;
  allocator_.device(device_).kv().destroy(id_);
  destroyed_ = true;
}

}  // namespace stitch
