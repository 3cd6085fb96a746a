// torch/ipc_handles.cpp — PyTorch's CUDA IPC handle formats, as PyTorch 2.15's
// CUDACachingAllocator writes and reads them (SHAREABLE_HANDLE_VERSION 3; version 2, of earlier
// releases, is read too): byte 0 the version, byte 1 the type, then
//   'c'  the 64-byte cudaIpcMemHandle_t of the segment's base (a bare 64-byte handle is read as
//        one, as PyTorch does);
//   'e'  ShareHeader {pid_t pid; size_t segment_size; size_t num_handles; int handle_type}
//        (version 2: without handle_type, file descriptors), then num_handles file descriptors
//        (int, numbers in process `pid`, which the receiver takes with pidfd_getfd) or, for
//        handle_type 2 (FABRIC_HANDLE), 64-byte CUmemFabricHandles; each maps segment_size bytes.
#include "torch/ipc_handles.hpp"

#include <c10/util/Exception.h>

#include <cstdint>
#include <cstring>
#include <optional>

#include "stitch/ipc_handle.hpp"

namespace stitch::torch_native::detail {
namespace {

constexpr char kVersion = 3;
constexpr char kMalloc = 'c', kExpandable = 'e', kStitch = 's';
constexpr int kPosixFd = 1, kFabric = 2;  // PyTorch's Expandable_Segments_Handle_Type

struct ShareHeader {  // PyTorch's, field for field (x86-64 and aarch64 Linux layout)
  std::int32_t pid;
  std::uint64_t segment_size;
  std::uint64_t num_handles;
  std::int32_t handle_type;
};
static_assert(sizeof(ShareHeader) == 32);
constexpr std::size_t kHeaderV2 = 24;  // version 2: no handle_type

template <class T>
void put(std::string& out, const T& value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

}  // namespace

std::string torch_handle(const std::string& text) {
  const std::optional<ipc::BlockHandle> block = ipc::parse(text);
  const std::optional<ipc::CudaShare> share = block ? ipc::decode_cuda(block->share) : std::nullopt;
  std::string out{kVersion};
  if (share && share->kind == ipc::Kind::legacy) {
    out += kMalloc;
    out.append(reinterpret_cast<const char*>(share->legacy.data()), share->legacy.size());
    return out;
  }
  bool uniform = share.has_value();
  if (uniform) {
    for (const ipc::Piece& p : share->pieces) uniform &= p.bytes == share->pieces.front().bytes;
  }
  if (!uniform) return out + kStitch + text;  // pages of several sizes, or backend:sim
  const bool fabric = share->kind == ipc::Kind::fabric;
  ShareHeader header{};
  header.pid = static_cast<std::int32_t>(share->pid);
  header.segment_size = share->pieces.front().bytes;
  header.num_handles = share->pieces.size();
  header.handle_type = fabric ? kFabric : kPosixFd;
  out += kExpandable;
  put(out, header);
  for (const ipc::Piece& p : share->pieces) {
    if (fabric) {
      out.append(reinterpret_cast<const char*>(p.fabric.data()), p.fabric.size());
    } else {
      put(out, static_cast<std::int32_t>(p.fd));
    }
  }
  return out;
}

Import stitch_import(const std::string& handle, int device) {
  const auto whole = [device](ipc::CudaShare share) {
    return Import{ipc::format({device, 0, 0, ipc::encode(share)}), 0};
  };
  ipc::CudaShare share;
  if (handle.size() == 64) {  // a bare cudaIpcMemHandle_t (before versioned handles)
    share.kind = ipc::Kind::legacy;
    std::memcpy(share.legacy.data(), handle.data(), 64);
    return whole(share);
  }
  TORCH_CHECK(handle.size() >= 2 && handle[0] >= 1 && handle[0] <= kVersion,
              "stitch: not a CUDA IPC handle of a version stitch reads (version ",
              handle.empty() ? -1 : static_cast<int>(handle[0]), ")");
  const char type = handle[1];
  const char* body = handle.data() + 2;
  const std::size_t left = handle.size() - 2;
  if (type == kStitch) {
    const std::string text = handle.substr(2);
    const std::optional<ipc::BlockHandle> block = ipc::parse(text);
    TORCH_CHECK(block.has_value(), "stitch: malformed IPC handle");
    return Import{text, block->offset};
  }
  if (type == kMalloc) {
    TORCH_CHECK(left == 64, "stitch: malformed CUDA IPC handle of type 'c' (", left, " bytes)");
    share.kind = ipc::Kind::legacy;
    std::memcpy(share.legacy.data(), body, 64);
    return whole(share);
  }
  TORCH_CHECK(type == kExpandable, "stitch: unknown CUDA IPC handle type '", type, "'");
  ShareHeader header{};
  const std::size_t header_bytes = handle[0] >= 3 ? sizeof header : kHeaderV2;
  TORCH_CHECK(left >= header_bytes, "stitch: malformed CUDA IPC handle of type 'e'");
  std::memcpy(&header, body, header_bytes);
  if (header_bytes == kHeaderV2) header.handle_type = kPosixFd;
  TORCH_CHECK(header.handle_type == kPosixFd || header.handle_type == kFabric,
              "stitch: unknown handle type ", header.handle_type, " in a CUDA IPC handle of type 'e'");
  const bool fabric = header.handle_type == kFabric;
  const std::size_t each = fabric ? 64 : sizeof(std::int32_t);
  TORCH_CHECK(header.num_handles > 0 && header.segment_size > 0 &&
                  left - header_bytes == header.num_handles * each,
              "stitch: malformed CUDA IPC handle of type 'e' (", header.num_handles, " handles in ",
              left - header_bytes, " bytes)");
  share.kind = fabric ? ipc::Kind::fabric : ipc::Kind::fd;
  share.pid = header.pid;
  const char* at = body + header_bytes;
  for (std::uint64_t i = 0; i < header.num_handles; ++i, at += each) {
    ipc::Piece p;
    p.bytes = header.segment_size;
    if (fabric) {
      std::memcpy(p.fabric.data(), at, 64);
    } else {
      std::int32_t fd = 0;
      std::memcpy(&fd, at, sizeof fd);
      p.fd = fd;
    }
    share.pieces.push_back(p);
  }
  return whole(share);
}

}  // namespace stitch::torch_native::detail
