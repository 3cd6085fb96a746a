// core/block.hpp — Segment (memory obtained from the device) and Block (a piece of a segment).
//
// A segment's blocks tile it exactly, linked in address order through prev/next. A block is in
// one of five states: allocated (handed to a caller), pending (freed by the caller but waiting
// for events on other streams), free (in its pool's FreeIndex, available for reuse) or, in an
// expandable segment only, unmapped (address space with no physical memory behind it, in its
// pool's unmapped set) or lent (free memory of a partly used coarse page, mapped a second time
// into a stitched range that uses it: in no set, unusable here until the range gives it back).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <set>
#include <vector>

#include "core/object_pool.hpp"
#include "core/page_table.hpp"
#include "stitch/backend.hpp"

namespace stitch::detail {

struct Segment;
struct Block;
struct ThreadSlot;
struct PrivatePool;

/// Ordering of free blocks: (stream, size, address). A FreeKey searches without a Block.
struct FreeKey {
  stream_t stream;
  std::size_t size;
  const char* ptr;
};
struct FreeOrder {
  using is_transparent = void;
  static bool less(stream_t s1, std::size_t z1, const char* p1, stream_t s2, std::size_t z2,
                   const char* p2) noexcept {
    if (s1 != s2) return s1 < s2;
    if (z1 != z2) return z1 < z2;
    return p1 < p2;
  }
  inline bool operator()(const Block* a, const Block* b) const noexcept;
  inline bool operator()(const Block* a, const FreeKey& k) const noexcept;
  inline bool operator()(const FreeKey& k, const Block* b) const noexcept;
};
using FreeSet = std::set<Block*, FreeOrder, PoolAllocator<Block*>>;

/// Ordering of unmapped blocks: (stream, address).
struct AddressOrder {
  inline bool operator()(const Block* a, const Block* b) const noexcept;
};
using UnmappedSet = std::set<Block*, AddressOrder>;

struct Block {
  char* ptr = nullptr;
  std::size_t size = 0;        ///< bytes of the block
  std::size_t requested = 0;   ///< bytes the caller asked for (allocated and pending blocks)
  stream_t stream = nullptr;   ///< stream the block belongs to (its segment's stream)
  Segment* segment = nullptr;
  Block* prev = nullptr;       ///< address neighbour in the same segment
  Block* next = nullptr;
  bool allocated = false;
  bool small = false;          ///< small pool (<= 1 MiB) or large pool
  bool in_index = false;       ///< currently in its pool's FreeIndex
  bool oversize = false;       ///< counted in oversize_allocations while allocated
  bool mapped = true;          ///< false: unmapped range of an expandable segment
  bool lent = false;           ///< mapped, and lent to a stitched range (Segment::borrows)
  int event_count = 0;         ///< outstanding events before a pending block becomes free
  std::uint64_t gc_stamp = 0;  ///< pool call counter when it was last freed (GC age)
  std::vector<stream_t> stream_uses;  ///< other streams that used it (record_stream)
  /// The thread slot that holds it (core/thread_slots.hpp): parked there after a free, or
  /// handed out from there; set and cleared under the device lock.
  ThreadSlot* slot = nullptr;
  FreeSet::iterator pos{};     ///< position in the FreeIndex while in_index

  Block(char* p, std::size_t s, stream_t st, Segment* seg, bool is_small) noexcept
      : ptr(p), size(s), stream(st), segment(seg), small(is_small) {}

  [[nodiscard]] bool is_split() const noexcept { return prev != nullptr || next != nullptr; }
  [[nodiscard]] bool is_free() const noexcept {
    return !allocated && event_count == 0 && mapped && !lent;
  }
};

bool FreeOrder::operator()(const Block* a, const Block* b) const noexcept {
  return less(a->stream, a->size, a->ptr, b->stream, b->size, b->ptr);
}
bool FreeOrder::operator()(const Block* a, const FreeKey& k) const noexcept {
  return less(a->stream, a->size, a->ptr, k.stream, k.size, k.ptr);
}
bool FreeOrder::operator()(const FreeKey& k, const Block* b) const noexcept {
  return less(k.stream, k.size, k.ptr, b->stream, b->size, b->ptr);
}
bool AddressOrder::operator()(const Block* a, const Block* b) const noexcept {
  return a->stream != b->stream ? a->stream < b->stream : a->ptr < b->ptr;
}

/// Free memory a stitched range borrowed: the lent block (in another range) and the slots of
/// this range that map the same physical memory a second time.
struct Borrow {
  Block* block;
  std::size_t slot;
  std::size_t count;
};

struct Segment {
  char* base = nullptr;
  std::size_t size = 0;
  stream_t stream = nullptr;
  /// Its stream's epoch (core/thread_slots.hpp): bumped when the stream's free blocks change.
  std::atomic<std::uint64_t>* epoch = nullptr;
  bool small = false;
  bool oversize = false;       ///< counted in oversize_segments
  PrivatePool* private_pool = nullptr;  ///< the private pool it belongs to (core/private_pool.hpp)
  bool expandable = false;     ///< a reserved range whose pages are mapped on demand
  bool stitched = false;       ///< expandable too: a range reserved to fit one request, mapped
                               ///< with pages moved from other ranges (stitcher.cpp)
  /// Expandable: bytes per page slot. A physical handle covers one slot or, for the coarse pages
  /// of a stitching range, several consecutive slots (always mapped and unmapped whole).
  std::size_t page = 0;
  PageTable pages;  ///< expandable: the handle covering each slot
  /// Stitched: the lent blocks whose memory this range maps too (its other slots are its own).
  /// Such a range is never moved from or unmapped in part: it goes back whole, once free.
  std::vector<Borrow> borrows;
  Block* head = nullptr;       ///< lowest-address block
  Segment* prev = nullptr;     ///< device-wide list of segments
  Segment* next = nullptr;
};

}  // namespace stitch::detail
