// core/block_pool.hpp — BlockPool: the free blocks of one size class (small <= 1 MiB, or large)
// of one owner, the device's default pool or a private (graph) pool, best fit by FreeIndex.
#pragma once

#include <cstdint>

#include "core/block.hpp"
#include "core/free_index.hpp"
#include "core/object_pool.hpp"

namespace stitch::detail {

struct PrivatePool;

struct BlockPool {
  BlockPool(PoolAllocator<Block*>::Storage* nodes, bool is_small, PrivatePool* of = nullptr)
      : index(nodes), small(is_small), owner(of) {}
  FreeIndex index;
  UnmappedSet unmapped;  ///< expandable segments' unmapped ranges
  bool small;
  /// The private pool it is part of (its new segments belong to it); nullptr for the device's.
  PrivatePool* owner;
  std::uint64_t calls = 0;  ///< best-fit lookups (BlockStore::best_fit): the GC clock
};

}  // namespace stitch::detail
