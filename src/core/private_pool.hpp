// core/private_pool.hpp — one private pool (PyTorch's graph pool or MemPool, keyed by its
// MempoolId_t): its two block pools, the segments it holds and its uses, and one route to it
// (core/private_pools.hpp has the pools of a device and their routes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>

#include "core/block_pool.hpp"
#include "stitch/backend.hpp"
#include "stitch/private_pool.hpp"

namespace stitch::detail {

struct PrivatePool {
  explicit PrivatePool(PoolId pool_id, std::uint16_t tag_id = 0, bool keep = false)
      : id(pool_id), small(true, this, tag_id), large(false, this, tag_id),
        tag(tag_id), backup(keep) {}
  PoolId id;
  BlockPool small;
  BlockPool large;
  /// The region tag of the thread that created it (0: none): its memory lies in expandable
  /// ranges of that tag and sleeps with it; `backup`: its live blocks are kept over a sleep.
  std::uint16_t tag;
  bool backup;
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
