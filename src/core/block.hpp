// core/block.hpp — Segment (memory obtained from the device) and Block (a piece of a segment),
// and the one state a block is in (BlockState), with the transitions allowed between states.
//
// A segment's blocks tile it exactly, linked in address order through prev/next. The block
// store (core/block_store.hpp) changes states and asserts every transition.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/assert.hpp"
#include "core/page_table.hpp"
#include "stitch/backend.hpp"

namespace stitch::detail {

struct Segment;
struct Block;
struct PrivatePool;
struct StreamShard;
struct BlockPool;
template <typename V>
struct AtomicSlot;

/// Ordering of free blocks: (stream, size, address). A FreeKey searches without a Block.
struct FreeKey {
  stream_t stream;
  std::size_t size;
  const char* ptr;
};
/// FreeOrder among blocks of one stream (a stream shard's pools): (size, address).
struct SizeOrder {
  static bool less(std::size_t z1, const char* p1, std::size_t z2, const char* p2) noexcept {
    // (size, address) as one 128-bit number: one comparison, no branch on the size.
    __extension__ using Key = unsigned __int128;
    return ((Key{z1} << 64) | reinterpret_cast<std::uintptr_t>(p1)) <
           ((Key{z2} << 64) | reinterpret_cast<std::uintptr_t>(p2));
  }
  inline bool operator()(const Block* a, const Block* b) const noexcept;
  inline bool operator()(const Block* a, const FreeKey& k) const noexcept;
};
struct FreeOrder {
  using is_transparent = void;
  static bool less(stream_t s1, std::size_t z1, const char* p1, stream_t s2, std::size_t z2,
                   const char* p2) noexcept {
    if (s1 != s2) [[unlikely]] return s1 < s2;
    return SizeOrder::less(z1, p1, z2, p2);
  }
  inline bool operator()(const Block* a, const Block* b) const noexcept;
  inline bool operator()(const Block* a, const FreeKey& k) const noexcept;
  inline bool operator()(const FreeKey& k, const Block* b) const noexcept;
};

/// Ordering of unmapped blocks: (stream, address).
struct AddressOrder {
  inline bool operator()(const Block* a, const Block* b) const noexcept;
};

/// Where a block is in its life. Exactly one holds at a time, and each says which set holds the
/// block: the live table, the event queues, a pool's free index or unmapped set.
enum class BlockState : std::uint8_t {
  allocated,  ///< handed to a caller (in the live table)
  /// Freed by the cache hit and not filed yet: its pool's held block (BlockPool::held), free memory
  /// to everyone; taken back, or filed, by the pool's next request, and filed by the device lock.
  held,
  pending,    ///< freed, waiting for `event_count` events on other streams (StreamEvents)
  /// Freed while a stream it was used on may be capturing a graph: its events are recorded
  /// once none is (StreamEvents::record_deferred); then it is pending.
  deferred,
  free,       ///< in its pool's free index, available for reuse
  unmapped,   ///< expandable: address space with no physical memory behind it (unmapped set)
  /// Free memory of a partly used coarse page, mapped a second time into a stitched range that
  /// uses it (Segment::borrows): in no set, unusable here until the range gives it back.
  lent,
};

/// The name of a state, for messages.
constexpr const char* to_string(BlockState s) noexcept {
  switch (s) {
    case BlockState::allocated: return "allocated";
    case BlockState::held: return "held";
    case BlockState::pending: return "pending";
    case BlockState::deferred: return "deferred";
    case BlockState::free: return "free";
    case BlockState::unmapped: return "unmapped";
    case BlockState::lent: return "lent";
  }
  return "?";
}

/// The transitions a block may make (a block is created in any state; it leaves its segment
/// only free or unmapped, when the segment goes).
constexpr bool may_become(BlockState from, BlockState to) noexcept {
  using S = BlockState;
  switch (from) {
    case S::allocated: return to == S::held || to == S::pending || to == S::deferred || to == S::free;
    case S::held: return to == S::allocated || to == S::free;
    case S::pending: return to == S::free;
    case S::deferred: return to == S::pending;
    case S::free: return to == S::allocated || to == S::unmapped || to == S::lent;
    case S::unmapped: return to == S::free;
    case S::lent: return to == S::free;
  }
  return false;
}

struct Block;
/// Moves `block` to the state `to`, along a transition may_become() allows (asserted).
inline void set_state(Block& block, BlockState to) noexcept;

struct Block {
  char* ptr = nullptr;
  std::size_t size = 0;        ///< bytes of the block
  std::size_t requested = 0;   ///< bytes the caller asked for (allocated and pending blocks)
  stream_t stream = nullptr;   ///< stream the block belongs to (its segment's stream)
  Segment* segment = nullptr;
  /// Its stream's shard, whose lock guards it (and whose pool holds the object, so this never
  /// changes: a reader without the lock may follow it, core/cache_hit.hpp).
  StreamShard* shard = nullptr;
  Block* prev = nullptr;       ///< address neighbour in the same segment
  Block* next = nullptr;
  BlockState state;
  bool small = false;          ///< small pool (<= 1 MiB) or large pool
  bool oversize = false;       ///< counted in oversize_allocations while allocated
  int event_count = 0;         ///< pending: the events still outstanding
  int pins = 0;                ///< stitch_pin()s not undone: its memory never moves
  bool backup = false;         ///< tagged, allocated in a region with backup: kept over a sleep
  std::uint64_t gc_stamp = 0;  ///< pool call counter when it was last freed (GC age)
  std::vector<stream_t> stream_uses;  ///< other streams that used it (record_stream)
  /// Its slot in the live table while allocated (AtomicMap: kept there by rebuilds), dormant
  /// after its free, until the address is allocated again.
  AtomicSlot<Block>* live_slot = nullptr;
  /// Free or unmapped: its links in its pool's free index or unmapped set (core/block_tree.hpp).
  struct TreeLinks {
    Block* parent;
    Block* child[2];
    bool red;
  } tree{};

  Block(char* p, std::size_t s, stream_t st, Segment* seg, StreamShard* sh, bool is_small,
        BlockState initial) noexcept
      : ptr(p), size(s), stream(st), segment(seg), shard(sh), state(initial), small(is_small) {}

  [[nodiscard]] bool is_split() const noexcept { return prev != nullptr || next != nullptr; }
  [[nodiscard]] bool is_free() const noexcept { return state == BlockState::free; }
  [[nodiscard]] bool is_mapped() const noexcept { return state != BlockState::unmapped; }
  /// Allocated or pending: counted in the active statistics, with its requested bytes.
  [[nodiscard]] bool is_active() const noexcept {
    return state == BlockState::allocated || state == BlockState::pending ||
           state == BlockState::deferred;
  }
};

void set_state(Block& block, BlockState to) noexcept {
  STITCH_ASSERT(may_become(block.state, to), "a block state transition block.hpp allows");
  block.state = to;
}

bool SizeOrder::operator()(const Block* a, const Block* b) const noexcept {
  return less(a->size, a->ptr, b->size, b->ptr);
}
bool SizeOrder::operator()(const Block* a, const FreeKey& k) const noexcept {
  return less(a->size, a->ptr, k.size, k.ptr);
}
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
  StreamShard* shard = nullptr;  ///< its stream's (the Block objects of its blocks are there)
  BlockPool* pool = nullptr;     ///< the pool its free blocks are filed in (BlockStore::pool_of)
  bool small = false;
  bool oversize = false;       ///< counted in oversize_segments
  PrivatePool* private_pool = nullptr;  ///< the private pool it belongs to (core/private_pool.hpp)
  bool expandable = false;     ///< a reserved range whose pages are mapped on demand
  bool stitched = false;       ///< expandable too: a range reserved to fit one request, mapped
                               ///< with pages moved from other ranges (stitcher.cpp)
  std::uint16_t tag = 0;       ///< the region tag of its pool (0: untagged)
  /// Asleep (core/sleeper.hpp): its pages are unmapped and given back, its blocks keep their
  /// addresses and states. Nothing but a wake maps, moves, unmaps or releases anything in it.
  bool asleep = false;
  /// Slots mapping host pages (spilled, core/spiller.hpp): frees in it take the device lock,
  /// which gives back the host pages they leave wholly free.
  std::uint32_t spilled = 0;
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

  /// An expandable range with nothing mapped: one unmapped block over all of it.
  [[nodiscard]] bool wholly_unmapped() const noexcept {
    return head->state == BlockState::unmapped && head->next == nullptr;
  }
  /// The block that holds `at` (an address of this range). Walks the blocks: for the paths that
  /// move pages, never for a cache hit.
  [[nodiscard]] Block* block_at(const char* at) const noexcept {
    Block* b = head;
    while (b != nullptr && !(b->ptr <= at && at < b->ptr + b->size)) b = b->next;
    return b;
  }
  /// Whether slot `slot` starts memory this range borrowed (mapped here a second time).
  [[nodiscard]] bool borrowed_at(std::size_t slot) const noexcept {
    for (const Borrow& b : borrows)
      if (b.slot == slot) return true;
    return false;
  }
  /// What slot_marks() says of a page slot.
  static constexpr std::uint8_t kSlotLive = 1, kSlotFrozen = 2;
  /// Per page slot (expandable): kSlotLive where a block other than a free or unmapped one
  /// touches it, with kSlotFrozen where that block is lent or pinned (exported: its memory stays
  /// where it is). For the paths that move pages (compaction, spill), never for a cache hit.
  [[nodiscard]] std::vector<std::uint8_t> slot_marks() const {
    std::vector<std::uint8_t> mark(pages.stored(), 0);
    for (const Block* b = head; b != nullptr; b = b->next) {
      if (b->state == BlockState::free || b->state == BlockState::unmapped) continue;
      const auto offset = static_cast<std::size_t>(b->ptr - base);
      const std::size_t first = offset / page;
      const std::size_t last = std::min((offset + b->size - 1) / page + 1, mark.size());
      const std::uint8_t m = b->state == BlockState::lent || b->pins > 0 ? kSlotLive | kSlotFrozen
                                                                          : kSlotLive;
      for (std::size_t i = first; i < last; ++i) mark[i] |= m;
    }
    return mark;
  }
};

}  // namespace stitch::detail
