// stitch/block_info.hpp — what stitch knows about one live allocation (Allocator::find).
#pragma once

#include <cstddef>

#include "stitch/backend.hpp"

namespace stitch {

/// A live allocation: its device, the bytes asked for, the block's size and its stream.
struct BlockInfo {
  int device = -1;
  std::size_t requested = 0;  ///< bytes asked for
  std::size_t size = 0;       ///< bytes of the block (after rounding)
  stream_t stream = nullptr;  ///< allocation stream
};

}  // namespace stitch
