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

namespace {
/// The live block `ptr` starts, for export_block and export_size.
BlockInfo exported_block(const std::optional<BlockInfo>& info, void* ptr) {
  if (!info)
    throw invalid_argument(fmt::format("export of {}: not the start of a live allocation of stitch's",
                                       fmt::ptr(ptr)));
  return *info;
}
}  // namespace

std::string Allocator::export_block(void* ptr, std::size_t max_chars) {
  const BlockInfo info = exported_block(find(ptr), ptr);
  std::size_t offset = 0;
  std::string shared = backend_->export_memory(info.device, ptr, info.size, &offset);
  std::string handle = ipc::format({info.device, offset, info.requested, std::move(shared)});
  // The length is checked before the pin: a handle that does not fit leaves the block free to move.
  if (handle.size() >= max_chars)
    throw invalid_argument(fmt::format("export of {}: the handle needs {} bytes (with its NUL), the buffer has {}",
                                       fmt::ptr(ptr), handle.size() + 1, max_chars));
  if (!checked_device(info.device).pin(ptr, true))
    throw invalid_argument(fmt::format("export of {}: the block was freed meanwhile", fmt::ptr(ptr)));
  return handle;
}

std::size_t Allocator::export_size(void* ptr) {
  const BlockInfo info = exported_block(find(ptr), ptr);
  std::size_t offset = 0;
  const std::size_t shared = backend_->export_size(info.device, ptr, info.size, &offset);
  return ipc::format({info.device, offset, info.requested, std::string()}).size() + shared;
}

void* Allocator::import_block(std::string_view handle, int device) {
  checked_device(device);
  const std::string text(handle.substr(0, 80));
  std::string why;
  const std::optional<ipc::BlockHandle> h = ipc::parse(handle, &why);
  if (!h) throw invalid_argument(fmt::format("import of '{}': not a handle stitch_ipc_export wrote: {}", text, why));
  std::size_t bytes = 0;
  void* base = backend_->import_memory(device, h->share, &bytes);
  // Hostile input: the block must lie within what the back end mapped, computed without wrapping.
  auto refuse = [&](const std::string& reason) {
    backend_->close_imported(device, base, bytes);
    throw invalid_argument(fmt::format("import of '{}': {}", text, reason));
  };
  if (!ipc::lies_within(h->offset, h->size, bytes))
    refuse(fmt::format("the block ({} bytes at offset {}) lies outside the {} bytes shared", h->size, h->offset, bytes));
  void* ptr = static_cast<char*>(base) + h->offset;
  bool clash = false;
  try {
    std::lock_guard lock(imports_mutex_);
    auto [it, fresh] = imports_.try_emplace(ptr, Imported{device, base, bytes, 1});
    if (!fresh) {
      // The same memory mapped at the same address again (the driver counts a legacy handle's
      // opens): each import needs its own close.
      clash = it->second.device != device || it->second.base != base || it->second.bytes != bytes;
      if (!clash) ++it->second.opens;
    }
  } catch (...) {
    backend_->close_imported(device, base, bytes);
    throw;
  }
  if (clash) refuse("the back end mapped it over another import");
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
    if (--it->second.opens == 0) imports_.erase(it);
  }
  backend_->close_imported(found.device, found.base, found.bytes);
}

}  // namespace stitch
