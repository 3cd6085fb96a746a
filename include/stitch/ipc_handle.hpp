// stitch/ipc_handle.hpp — the text of an IPC handle (stitch_ipc_export, Allocator::export_block)
// and its parts, written and parsed in one place:
//   stitch1:<device>:<offset>:<size>:<share>   the block: its device, its offset in the shared
//                                               memory, its requested size, and the back end's
//                                               text for that memory (Backend::export_memory)
// backend:sim's share is "sim:..." (opaque here); backend:cuda's has three kinds:
//   cuda-ipc:<bytes>:<128 hex digits>          a cuMemAlloc allocation: its CUipcMemHandle
//   cuda-fd:<pid>:<bytes>/<fd>,<bytes>/<fd>...  physical allocations mapped in a row: the file
//                                               descriptors process <pid> exported them as
//   cuda-fabric:<bytes>/<128 hex digits>,...     the same, as CUmemFabricHandles
// <bytes> of a piece is how much of it is mapped (from its start); a cuda-ipc <bytes> of 0 means
// unknown (PyTorch's handles do not carry it). Header-only: libstitch, its CUDA back end and the
// PyTorch layer (which converts to and from PyTorch's binary handles) share it.
#pragma once

#include <array>
#include <charconv>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace stitch::ipc {

// ---- backend:cuda's share --------------------------------------------------------------------

using Bytes64 = std::array<unsigned char, 64>;  ///< a CUipcMemHandle or a CUmemFabricHandle

enum class Kind { legacy, fd, fabric };

struct Piece {
  std::size_t bytes = 0;  ///< mapped from the allocation's start
  int fd = -1;            ///< Kind::fd: a descriptor of the exporting process
  Bytes64 fabric{};       ///< Kind::fabric
};

struct CudaShare {
  Kind kind = Kind::fd;
  long pid = 0;            ///< Kind::fd: the exporting process
  std::size_t bytes = 0;   ///< Kind::legacy: the allocation's size
  Bytes64 legacy{};        ///< Kind::legacy: the CUipcMemHandle
  std::vector<Piece> pieces;  ///< Kind::fd and Kind::fabric, in address order

  /// Bytes the importer maps.
  [[nodiscard]] std::size_t total() const {
    if (kind == Kind::legacy) return bytes;
    std::size_t sum = 0;
    for (const Piece& p : pieces) sum += p.bytes;
    return sum;
  }
};

inline std::string to_hex(const Bytes64& b) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * b.size());
  for (unsigned char c : b) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

inline bool from_hex(std::string_view text, Bytes64* out) {
  if (text.size() != 2 * out->size()) return false;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < out->size(); ++i) {
    const int hi = digit(text[2 * i]), lo = digit(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  return true;
}

inline std::string encode(const CudaShare& s) {
  if (s.kind == Kind::legacy) return "cuda-ipc:" + std::to_string(s.bytes) + ":" + to_hex(s.legacy);
  std::string out = s.kind == Kind::fd ? "cuda-fd:" + std::to_string(s.pid) + ":" : "cuda-fabric:";
  for (std::size_t i = 0; i < s.pieces.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(s.pieces[i].bytes) + "/";
    out += s.kind == Kind::fd ? std::to_string(s.pieces[i].fd) : to_hex(s.pieces[i].fabric);
  }
  return out;
}

namespace detail {
/// Reads an unsigned number up to `stop` (or the end); advances `text` past it and the stop.
template <class T>
bool number(std::string_view& text, char stop, T* out) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  if (ec != std::errc{} || end == text.data()) return false;
  text.remove_prefix(static_cast<std::size_t>(end - text.data()));
  if (stop == '\0') return text.empty();
  if (text.empty() || text.front() != stop) return false;
  text.remove_prefix(1);
  return true;
}
}  // namespace detail

/// The share `text` names; nullopt when it is not text encode() writes.
inline std::optional<CudaShare> decode_cuda(std::string_view text) {
  CudaShare s;
  auto starts = [&](std::string_view prefix) {
    if (text.substr(0, prefix.size()) != prefix) return false;
    text.remove_prefix(prefix.size());
    return true;
  };
  if (starts("cuda-ipc:")) {
    s.kind = Kind::legacy;
    if (!detail::number(text, ':', &s.bytes) || !from_hex(text, &s.legacy)) return std::nullopt;
    return s;
  }
  if (starts("cuda-fd:")) {
    s.kind = Kind::fd;
    if (!detail::number(text, ':', &s.pid) || s.pid <= 0) return std::nullopt;
  } else if (starts("cuda-fabric:")) {
    s.kind = Kind::fabric;
  } else {
    return std::nullopt;
  }
  while (!text.empty()) {
    Piece p;
    if (!detail::number(text, '/', &p.bytes) || p.bytes == 0) return std::nullopt;
    const std::size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    text.remove_prefix(comma == std::string_view::npos ? text.size() : comma + 1);
    if (s.kind == Kind::fd ? !detail::number(item, '\0', &p.fd) : !from_hex(item, &p.fabric)) return std::nullopt;
    s.pieces.push_back(p);
  }
  if (s.pieces.empty()) return std::nullopt;
  return s;
}

// ---- the block's handle ------------------------------------------------------------------------

struct BlockHandle {
  int device = 0;
  std::size_t offset = 0;  ///< where the block lies in the shared memory
  std::size_t size = 0;    ///< the block's requested bytes (0: the whole shared memory)
  std::string share;       ///< the back end's text
};

inline std::string format(const BlockHandle& h) {
  return "stitch1:" + std::to_string(h.device) + ":" + std::to_string(h.offset) + ":" + std::to_string(h.size) +
         ":" + h.share;
}

/// The parts of `text`; nullopt when it is not a handle format() writes.
inline std::optional<BlockHandle> parse(std::string_view text) {
  if (text.substr(0, 8) != "stitch1:") return std::nullopt;
  text.remove_prefix(8);
  BlockHandle h;
  if (!detail::number(text, ':', &h.device) || !detail::number(text, ':', &h.offset) ||
      !detail::number(text, ':', &h.size) || text.empty())
    return std::nullopt;
  h.share = std::string(text);
  return h;
}

}  // namespace stitch::ipc
