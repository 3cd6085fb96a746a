// core/block_pool.hpp — BlockPool: the free blocks of one size class (small <= 1 MiB, or large)
// of one owner, the device's default pool, a region tag's (core/sleeper.hpp) or a private (graph)
// pool, best fit by FreeIndex.
#pragma once

#include <cstdint>

#include "core/block.hpp"
#include "core/free_index.hpp"
#include "core/object_pool.hpp"

namespace stitch::detail {

struct PrivatePool;

struct BlockPool {
  BlockPool(PoolAllocator<Block*>::Storage* nodes, bool is_small, PrivatePool* of = nullptr,
            std::uint16_t tag_id = 0)
      : index(nodes), small(is_small), owner(of), tag(tag_id) {}
  FreeIndex index;
  UnmappedSet unmapped;  ///< expandable segments' unmapped ranges
  bool small;
  /// The private pool it is part of (its new segments belong to it); nullptr for the device's.
  PrivatePool* owner;
  /// The region tag of its memory (0: untagged). A tagged pool's segments are expandable ranges
  /// of their own: pages never cross tags, so that a sleep frees what it unmaps.
  std::uint16_t tag;
  std::uint64_t calls = 0;  ///< best-fit lookups (BlockStore::best_fit): the GC clock
};

}  // namespace stitch::detail
