// api/allocator_ipc.cpp — blocks other processes map: export_block, import_block, close_block
// (the back end shares the pages; the handle adds the device, the block's offset in them and
// its size: stitch/ipc_handle.hpp).
#include <fmt/format.h>

#include <optional>
#include <string>
#include <utility>

#include "core/device_allocator.hpp"
#include "stitch/allocator.hpp"
#include "stitch/errors.hpp"
#include "stitch/ipc_handle.hpp"

namespace stitch {

std::string Allocator::export_block(void* ptr) {
  const std::optional<BlockInfo> info = find(ptr);
  if (!info)
    throw invalid_argument(fmt::format("export of {}: not the start of a live allocation of stitch's",
                                       fmt::ptr(ptr)));
  std::size_t offset = 0;
  std::string shared = backend_->export_memory(info->device, ptr, info->size, &offset);
  if (!checked_device(info->device).pin(ptr, true))
    throw invalid_argument(fmt::format("export of {}: the block was freed meanwhile", fmt::ptr(ptr)));
  return ipc::format({info->device, offset, info->requested, std::move(shared)});
}

void* Allocator::import_block(std::string_view handle, int device) {
  checked_device(device);
  const std::string text(handle);
  const std::optional<ipc::BlockHandle> h = ipc::parse(text);
  if (!h) throw invalid_argument(fmt::format("import of '{}': not a handle stitch_ipc_export wrote", text.substr(0, 80)));
  const std::size_t offset = h->offset, size = h->size;
  std::size_t bytes = 0;
  void* base = backend_->import_memory(device, h->share, &bytes);
  if (offset + size > bytes) {
    backend_->close_imported(device, base, bytes);
    throw invalid_argument(fmt::format("import of '{}': the block lies outside the shared memory", text.substr(0, 80)));
  }
  void* ptr = static_cast<char*>(base) + offset;
  try {
    std::lock_guard lock(imports_mutex_);
    imports_.emplace(ptr, Imported{device, base, bytes});
  } catch (...) {
    backend_->close_imported(device, base, bytes);
    throw;
  }
  return ptr;
}

void Allocator::close_block(void* ptr) {
  Imported found{};
  {
    std::lock_guard lock(imports_mutex_);
    auto it = imports_.find(ptr);
    if (it == imports_.end())
      throw invalid_argument(fmt::format("close of {}: not a block import_block returned (or closed already)",
                                         fmt::ptr(ptr)));
    found = it->second;
    imports_.erase(it);
  }
  backend_->close_imported(found.device, found.base, found.bytes);
}

}  // namespace stitch
