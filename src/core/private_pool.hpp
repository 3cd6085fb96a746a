// core/private_pool.hpp — private pools (PyTorch's graph pools, MempoolId_t): memory set apart for
// one CUDA graph or MemPool, and the routes that send allocations to them.
//
// While a route is underway (begin_allocate_to_pool .. end_allocate_to_pool), allocations on the
// streams its filter accepts come from its pool, in segments of their own; no other allocation
// ever gets a block of a private pool, and the device's release paths never touch one. A pool's
// memory goes back to the device once release_pool() has dropped its last use and its blocks are
// free. While any route is underway a stream may be capturing, so the device queries no event,
// waits for nothing and returns no memory (CUDA forbids those on a capturing stream); the events
// of blocks freed then are recorded at the first allocation after the last route has ended, as
// PyTorch does (its route ends before the capture does).
#pragma once

#include <cstddef>
#include <functional>
#include <utility>

#include "core/block_pool.hpp"
#include "stitch/backend.hpp"
#include "stitch/graph_pool.hpp"

namespace stitch::detail {

struct PrivatePool {
  PrivatePool(PoolId pool_id, PoolAllocator<Block*>::Storage* nodes)
      : id(pool_id), small(nodes, true, this), large(nodes, false, this) {}
  PoolId id;
  BlockPool small;
  BlockPool large;
  int use_count = 1;         ///< begin_allocate_to_pool calls not yet released by release_pool
  std::size_t segments = 0;  ///< segments it holds
  BlockPool& pool(bool is_small) noexcept { return is_small ? small : large; }
};

/// One begin_allocate_to_pool call not ended yet.
struct PoolRoute {
  PoolId id;
  StreamFilter filter;  ///< the streams whose allocations it takes
  PrivatePool* pool;
};

}  // namespace stitch::detail
