// stitch/ipc_handle.hpp — every IPC handle stitch writes or reads, written and parsed in one place
// (stitch_ipc_export, Allocator::export_block / import_block, the back ends, the PyTorch layer):
//   stitch1:<device>:<offset>:<size>:<share>   the block: its device, its offset in the shared
//                                               memory, its requested size, and the back end's
//                                               text for that memory (Backend::export_memory)
// backend:sim's share:
//   sim:<pid>:<fd>:<offset>+<length>,...        pieces of process <pid>'s device memfd <fd>
// backend:cuda's share has three kinds:
//   cuda-ipc:<bytes>:<128 hex digits>          a cuMemAlloc allocation: its CUipcMemHandle
//   cuda-fd:<pid>:<bytes>/<fd>,<bytes>/<fd>...  physical allocations mapped in a row: the file
//                                               descriptors process <pid> exported them as
//   cuda-fabric:<bytes>/<128 hex digits>,...     the same, as CUmemFabricHandles
// <bytes> of a piece is how much of it is mapped (from its start); a cuda-ipc <bytes> of 0 means
// unknown (PyTorch's handles do not carry it; the importer asks the driver either way).
// PyTorch's binary handles ('c', 'e' and stitch's 's', torch_handle / parse_torch) convert to and
// from that text.
//
// A handle comes from another process: every parser here treats it as hostile input. Numbers are
// canonical decimals (digits only: no sign, no leading zero, no overflow), no field is negative,
// sums and products are computed without wrapping, a count is checked against the bytes that hold
// it, and nothing may trail. A refusal returns nullopt and says why in `*why`. Accepted text
// re-encodes to itself (format(parse(t)) == t). Header-only: libstitch, its back ends, the
// PyTorch layer and the fuzz target share it.
#pragma once

#include <array>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace stitch::ipc {

// ---- arithmetic that cannot wrap ---------------------------------------------------------------

/// `a + b` into `*sum`; false (and `*sum` untouched) when it would wrap.
inline bool checked_add(std::size_t a, std::size_t b, std::size_t* sum) noexcept {
  std::size_t s = 0;
  if (__builtin_add_overflow(a, b, &s)) return false;
  *sum = s;
  return true;
}

/// Whether [offset, offset + size) lies within [0, total), computed without wrapping.
inline bool lies_within(std::size_t offset, std::size_t size, std::size_t total) noexcept {
  return offset <= total && size <= total - offset;
}

namespace detail {

inline bool refuse(std::string* why, const std::string& text) {
  if (why != nullptr) *why = text;
  return false;
}

/// A canonical decimal at the start of `text` (digits only, no leading zero but "0" itself) not
/// above `max`; advances past it.
inline bool decimal(std::string_view& text, std::uint64_t max, std::uint64_t* out) {
  std::size_t n = 0;
  while (n < text.size() && text[n] >= '0' && text[n] <= '9') ++n;
  if (n == 0 || (n > 1 && text[0] == '0')) return false;
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + n, v);
  if (ec != std::errc{} || end != text.data() + n || v > max) return false;
  text.remove_prefix(n);
  *out = v;
  return true;
}

/// Field `name` of type T (never negative: a signed T takes 0 .. its maximum), then `stop` (or
/// the end of `text` when `stop` is '\0'); advances past both.
template <class T>
bool field(std::string_view& text, char stop, T* out, const char* name, std::string* why) {
  std::uint64_t v = 0;
  if (!decimal(text, static_cast<std::uint64_t>(std::numeric_limits<T>::max()), &v))
    return refuse(why, std::string(name) + " is not a decimal number from 0 to " +
                           std::to_string(std::numeric_limits<T>::max()));
  if (stop == '\0') {
    if (!text.empty()) return refuse(why, std::string("bytes trail ") + name);
  } else {
    if (text.empty() || text.front() != stop)
      return refuse(why, std::string(name) + " is not followed by '" + stop + "'");
    text.remove_prefix(1);
  }
  *out = static_cast<T>(v);
  return true;
}

/// Whether `text` starts with `prefix`; advances past it.
inline bool take(std::string_view& text, std::string_view prefix) {
  if (text.substr(0, prefix.size()) != prefix) return false;
  text.remove_prefix(prefix.size());
  return true;
}

/// A back end's piece list: `text` split at ',' into pieces; false (and why) when there is none
/// or one is empty (",,", or a ',' at either end).
inline bool pieces(std::string_view text, std::vector<std::string_view>* out, std::string* why) {
  for (;;) {
    const std::size_t comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    if (item.empty()) return refuse(why, "the piece list is empty or has an empty piece");
    out->push_back(item);
    if (comma == std::string_view::npos) return true;
    text.remove_prefix(comma + 1);
  }
}

}  // namespace detail

// ---- 64-byte driver handles ----------------------------------------------------------------------

using Bytes64 = std::array<unsigned char, 64>;  ///< a CUipcMemHandle or a CUmemFabricHandle

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

/// 128 lowercase hex digits (as to_hex writes them), nothing else.
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

// ---- the block's handle --------------------------------------------------------------------------

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

/// The parts of `text`; nullopt (and why) when it is not a handle format() writes: the device is
/// a number from 0 to INT_MAX, offset + size does not wrap, and the share is printable ASCII.
/// Whether the block lies within the shared memory is the importer's check (lies_within), once
/// the back end has said how much it maps.
inline std::optional<BlockHandle> parse(std::string_view text, std::string* why = nullptr) {
  if (!detail::take(text, "stitch1:")) {
    detail::refuse(why, "not a handle stitch_ipc_export wrote (it starts with stitch1:)");
    return std::nullopt;
  }
  BlockHandle h;
  std::size_t end = 0;
  if (!detail::field(text, ':', &h.device, "the device", why) || !detail::field(text, ':', &h.offset, "the offset", why) ||
      !detail::field(text, ':', &h.size, "the size", why))
    return std::nullopt;
  if (!checked_add(h.offset, h.size, &end)) {
    detail::refuse(why, "the offset and the size wrap past 2^64");
    return std::nullopt;
  }
  if (text.empty()) {
    detail::refuse(why, "the back end's part is missing");
    return std::nullopt;
  }
  for (char c : text)
    if (c < 0x21 || c > 0x7e) {
      detail::refuse(why, "a byte of the back end's part is not printable ASCII");
      return std::nullopt;
    }
  h.share = std::string(text);
  return h;
}

// ---- backend:sim's share -------------------------------------------------------------------------

struct SimPiece {
  std::size_t offset = 0;  ///< in the exporter's device memfd
  std::size_t length = 0;
};

struct SimShare {
  int pid = 0;  ///< the exporting process
  int fd = 0;   ///< its device memfd, a descriptor of process `pid`
  std::vector<SimPiece> pieces;
  std::size_t total = 0;  ///< the pieces' lengths summed (no wrap: decode_sim checks)
};

inline std::string encode_sim(const SimShare& s) {
  std::string out = "sim:" + std::to_string(s.pid) + ":" + std::to_string(s.fd) + ":";
  for (std::size_t i = 0; i < s.pieces.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(s.pieces[i].offset) + "+" + std::to_string(s.pieces[i].length);
  }
  return out;
}

/// backend:sim's share: a pid from 1, a descriptor from 0, and one or more pieces, each a
/// positive multiple of `page` starting at a multiple of it, whose ends and sum do not wrap.
/// (Whether the pieces lie within the memfd is the importer's check: fstat.)
inline std::optional<SimShare> decode_sim(std::string_view text, std::size_t page, std::string* why = nullptr) {
  SimShare s;
  if (!detail::take(text, "sim:")) {
    detail::refuse(why, "not a handle of backend:sim (it starts with sim:)");
    return std::nullopt;
  }
  if (!detail::field(text, ':', &s.pid, "the pid", why) || !detail::field(text, ':', &s.fd, "the descriptor", why))
    return std::nullopt;
  if (s.pid == 0) {
    detail::refuse(why, "pid 0 is no process");
    return std::nullopt;
  }
  std::vector<std::string_view> list;
  if (!detail::pieces(text, &list, why)) return std::nullopt;
  s.pieces.reserve(list.size());
  for (std::string_view item : list) {
    SimPiece p;
    std::size_t end = 0;
    if (!detail::field(item, '+', &p.offset, "a piece's offset", why) ||
        !detail::field(item, '\0', &p.length, "a piece's length", why))
      return std::nullopt;
    if (p.length == 0 || page == 0 || p.offset % page != 0 || p.length % page != 0) {
      detail::refuse(why, "piece " + std::to_string(p.offset) + "+" + std::to_string(p.length) +
                              " is not whole pages of " + std::to_string(page) + " bytes");
      return std::nullopt;
    }
    if (!checked_add(p.offset, p.length, &end) || !checked_add(s.total, p.length, &s.total)) {
      detail::refuse(why, "the pieces wrap past 2^64");
      return std::nullopt;
    }
    s.pieces.push_back(p);
  }
  return s;
}

// ---- backend:cuda's share -------------------------------------------------------------------------

enum class Kind { legacy, fd, fabric };

struct Piece {
  std::size_t bytes = 0;  ///< mapped from the allocation's start
  int fd = -1;            ///< Kind::fd: a descriptor of the exporting process
  Bytes64 fabric{};       ///< Kind::fabric
};

struct CudaShare {
  Kind kind = Kind::fd;
  int pid = 0;             ///< Kind::fd: the exporting process
  std::size_t bytes = 0;   ///< Kind::legacy: the allocation's size (0: unknown)
  Bytes64 legacy{};        ///< Kind::legacy: the CUipcMemHandle
  std::vector<Piece> pieces;  ///< Kind::fd and Kind::fabric, in address order

  /// Bytes the importer maps (decode_cuda has checked that the pieces' sum does not wrap).
  [[nodiscard]] std::size_t total() const {
    if (kind == Kind::legacy) return bytes;
    std::size_t sum = 0;
    for (const Piece& p : pieces) sum += p.bytes;
    return sum;
  }
};

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

/// The share `text` names; nullopt (and why) when it is not text encode() writes: a pid from 1,
/// descriptors from 0, one or more pieces of positive size whose sum does not wrap.
inline std::optional<CudaShare> decode_cuda(std::string_view text, std::string* why = nullptr) {
  CudaShare s;
  if (detail::take(text, "cuda-ipc:")) {
    s.kind = Kind::legacy;
    if (!detail::field(text, ':', &s.bytes, "the allocation's size", why)) return std::nullopt;
    if (!from_hex(text, &s.legacy)) {
      detail::refuse(why, "the legacy handle is not 128 lowercase hex digits");
      return std::nullopt;
    }
    return s;
  }
  if (detail::take(text, "cuda-fd:")) {
    s.kind = Kind::fd;
    if (!detail::field(text, ':', &s.pid, "the pid", why)) return std::nullopt;
    if (s.pid == 0) {
      detail::refuse(why, "pid 0 is no process");
      return std::nullopt;
    }
  } else if (detail::take(text, "cuda-fabric:")) {
    s.kind = Kind::fabric;
  } else {
    detail::refuse(why, "not a handle of backend:cuda (cuda-ipc:, cuda-fd: or cuda-fabric:)");
    return std::nullopt;
  }
  std::vector<std::string_view> list;
  if (!detail::pieces(text, &list, why)) return std::nullopt;
  s.pieces.reserve(list.size());
  std::size_t sum = 0;
  for (std::string_view item : list) {
    Piece p;
    if (!detail::field(item, '/', &p.bytes, "a piece's size", why)) return std::nullopt;
    if (p.bytes == 0 || !checked_add(sum, p.bytes, &sum)) {
      detail::refuse(why, "a piece is empty, or the pieces wrap past 2^64");
      return std::nullopt;
    }
    if (s.kind == Kind::fd) {
      if (!detail::field(item, '\0', &p.fd, "a piece's descriptor", why)) return std::nullopt;
    } else if (!from_hex(item, &p.fabric)) {
      detail::refuse(why, "a fabric handle is not 128 lowercase hex digits");
      return std::nullopt;
    }
    s.pieces.push_back(p);
  }
  return s;
}

// ---- PyTorch's binary handles ----------------------------------------------------------------------
// As PyTorch 2.15's CUDACachingAllocator writes and reads them (SHAREABLE_HANDLE_VERSION 3;
// versions 1 and 2, of earlier releases, are read too): byte 0 the version, byte 1 the type, then
//   'c'  the 64-byte cudaIpcMemHandle_t of the segment's base (a bare 64-byte handle is read as
//        one, as PyTorch does);
//   'e'  ShareHeader {pid_t pid; size_t segment_size; size_t num_handles; int handle_type}
//        (before version 3: without handle_type, file descriptors), then num_handles file
//        descriptors (int, numbers in process `pid`, which the receiver takes with pidfd_getfd)
//        or, for handle_type 2 (FABRIC_HANDLE), 64-byte CUmemFabricHandles; each maps
//        segment_size bytes;
//   's'  stitch's own: the stitch1 text.

namespace torch {

constexpr char kVersion = 3;
constexpr char kMalloc = 'c', kExpandable = 'e', kStitch = 's';
constexpr std::int32_t kPosixFd = 1, kFabric = 2;  // PyTorch's Expandable_Segments_Handle_Type

struct ShareHeader {  // PyTorch's, field for field (x86-64 and aarch64 Linux layout)
  std::int32_t pid;
  std::uint64_t segment_size;
  std::uint64_t num_handles;
  std::int32_t handle_type;
};
static_assert(sizeof(ShareHeader) == 32);
constexpr std::size_t kHeaderV2 = 24;  // versions 1 and 2: no handle_type

/// What getIpcDevPtr maps for a PyTorch handle: the stitch1 text for Allocator::import_block, and
/// how far the block lies from the start of what PyTorch's receiver expects back (0 for 'c' and
/// 'e', the base of the shared memory; the block's offset for 's').
struct Import {
  std::string text;
  std::size_t block_offset = 0;
};

template <class T>
void put(std::string& out, const T& value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

}  // namespace torch

/// PyTorch's handle for the block `text` (Allocator::export_block) names: 'c' for a cudaMalloc'd
/// segment, 'e' for pages that all map the same size, 's' (the text) otherwise and on backend:sim.
inline std::string torch_handle(const std::string& text) {
  using namespace torch;
  const std::optional<BlockHandle> block = parse(text);
  const std::optional<CudaShare> share = block ? decode_cuda(block->share) : std::nullopt;
  std::string out{kVersion};
  if (share && share->kind == Kind::legacy) {
    out += kMalloc;
    out.append(reinterpret_cast<const char*>(share->legacy.data()), share->legacy.size());
    return out;
  }
  bool uniform = share.has_value();
  if (uniform) {
    for (const Piece& p : share->pieces) uniform &= p.bytes == share->pieces.front().bytes;
  }
  if (!uniform) return out + kStitch + text;  // pages of several sizes, or backend:sim
  const bool fabric = share->kind == Kind::fabric;
  ShareHeader header{};
  header.pid = static_cast<std::int32_t>(share->pid);
  header.segment_size = share->pieces.front().bytes;
  header.num_handles = share->pieces.size();
  header.handle_type = fabric ? kFabric : kPosixFd;
  out += kExpandable;
  put(out, header);
  for (const Piece& p : share->pieces) {
    if (fabric) {
      out.append(reinterpret_cast<const char*>(p.fabric.data()), p.fabric.size());
    } else {
      put(out, static_cast<std::int32_t>(p.fd));
    }
  }
  return out;
}

/// The import a PyTorch handle asks for on `device` of this process; nullopt (and why) for a
/// handle of another kind or a malformed one: a version from 1 to 3, a known type, 'c' exactly
/// 64 bytes, 'e' with a pid from 1, a positive segment size, a handle count that is exactly what
/// the bytes after the header hold (a division, never a product), segment_size * num_handles
/// without wrapping and descriptors from 0, 's' a stitch1 handle.
inline std::optional<torch::Import> parse_torch(std::string_view handle, int device, std::string* why = nullptr) {
  using namespace torch;
  const auto fail = [why](const std::string& text) -> std::optional<Import> {
    detail::refuse(why, text);
    return std::nullopt;
  };
  if (device < 0) return fail("device " + std::to_string(device) + " is negative");
  const auto whole = [device](const CudaShare& share) {
    return Import{format({device, 0, 0, encode(share)}), 0};
  };
  CudaShare share;
  if (handle.size() == 64) {  // a bare cudaIpcMemHandle_t (before versioned handles)
    share.kind = Kind::legacy;
    std::memcpy(share.legacy.data(), handle.data(), 64);
    return whole(share);
  }
  if (handle.size() < 2 || handle[0] < 1 || handle[0] > kVersion)
    return fail("not a CUDA IPC handle of a version stitch reads (version " +
                std::to_string(handle.empty() ? -1 : static_cast<int>(handle[0])) + ")");
  const char type = handle[1];
  std::string_view body = handle.substr(2);
  if (type == kStitch) {
    std::string text_why;
    std::optional<BlockHandle> block = parse(body, &text_why);
    if (!block) return fail("a malformed handle of type 's': " + text_why);
    return Import{std::string(body), block->offset};
  }
  if (type == kMalloc) {
    if (body.size() != 64)
      return fail("a malformed CUDA IPC handle of type 'c' (" + std::to_string(body.size()) + " bytes, not 64)");
    share.kind = Kind::legacy;
    std::memcpy(share.legacy.data(), body.data(), 64);
    return whole(share);
  }
  if (type != kExpandable) return fail(std::string("unknown CUDA IPC handle type '") + type + "'");
  ShareHeader header{};
  const std::size_t header_bytes = handle[0] >= 3 ? sizeof header : kHeaderV2;
  if (body.size() < header_bytes)
    return fail("a malformed CUDA IPC handle of type 'e' (" + std::to_string(body.size()) + " bytes, shorter than its header)");
  std::memcpy(&header, body.data(), header_bytes);
  if (header_bytes == kHeaderV2) header.handle_type = kPosixFd;
  if (header.handle_type != kPosixFd && header.handle_type != kFabric)
    return fail("unknown handle type " + std::to_string(header.handle_type) + " in a CUDA IPC handle of type 'e'");
  const bool fabric = header.handle_type == kFabric;
  const std::size_t each = fabric ? 64 : sizeof(std::int32_t);
  const std::size_t left = body.size() - header_bytes;
  if (header.num_handles == 0 || left % each != 0 || header.num_handles != left / each)
    return fail("a malformed CUDA IPC handle of type 'e' (" + std::to_string(header.num_handles) + " handles in " +
                std::to_string(left) + " bytes)");
  std::size_t total = 0;
  if (header.segment_size == 0 || header.segment_size > std::numeric_limits<std::size_t>::max() ||
      __builtin_mul_overflow(static_cast<std::size_t>(header.segment_size), static_cast<std::size_t>(header.num_handles),
                             &total))
    return fail("a CUDA IPC handle of type 'e' whose segment size (" + std::to_string(header.segment_size) +
                ") times its handles is empty or wraps");
  if (!fabric && header.pid <= 0)
    return fail("a CUDA IPC handle of type 'e' from pid " + std::to_string(header.pid));
  share.kind = fabric ? Kind::fabric : Kind::fd;
  share.pid = fabric ? 0 : header.pid;
  share.pieces.reserve(static_cast<std::size_t>(header.num_handles));
  const char* at = body.data() + header_bytes;
  for (std::uint64_t i = 0; i < header.num_handles; ++i, at += each) {
    Piece p;
    p.bytes = static_cast<std::size_t>(header.segment_size);
    if (fabric) {
      std::memcpy(p.fabric.data(), at, 64);
    } else {
      std::int32_t fd = 0;
      std::memcpy(&fd, at, sizeof fd);
      if (fd < 0) return fail("a CUDA IPC handle of type 'e' with descriptor " + std::to_string(fd));
      p.fd = fd;
    }
    share.pieces.push_back(p);
  }
  return whole(share);
}

}  // namespace stitch::ipc
