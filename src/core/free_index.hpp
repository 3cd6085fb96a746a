// core/free_index.hpp — a pool's free blocks, ordered by (stream, size, address) (a BlockTree,
// core/block_tree.hpp).
//
// lower_bound on (stream, size, 0) yields the best fit: the smallest free block of at least
// `size` on that stream, lowest address among equals, in O(log n). shrink() and grow() change a
// block's size or address in place when its order among its neighbours is unchanged (the common
// case when a split or a merge moves a boundary). A stream shard's index holds one stream's blocks
// and is searched for that stream alone, so its inserts and searches compare (size, address)
// only (SizeOrder): the same order, without a stream compare at each node.
#pragma once

#include <cstddef>

#include "core/assert.hpp"
#include "core/block.hpp"
#include "core/block_tree.hpp"

namespace stitch::detail {

class FreeIndex : public BlockTree<FreeOrder> {
 public:
  /// `one_stream`: it holds the blocks of one stream, and is searched only for that stream.
  explicit FreeIndex(bool one_stream) noexcept : one_stream_(one_stream) {}

  /// Adds `b` (not in the index).
  void insert(Block* b) noexcept {
    STITCH_ASSERT(!one_stream_ || size() == 0 || (*begin())->stream == b->stream,
                  "a one-stream index holds one stream's blocks");
    if (one_stream_) {
      BlockTree::insert<SizeOrder>(b);
    } else {
      BlockTree::insert(b);
    }
  }
  /// The first block not before `key`, or end().
  [[nodiscard]] iterator lower_bound(const FreeKey& key) const noexcept { return {this, bound_of(key)}; }
  /// Gives an indexed block a new address and a smaller size (a split took its front).
  void shrink(Block* b, char* ptr, std::size_t size) noexcept {
    // The new key is smaller than the old one: only the predecessor can be out of order.
    const Block* before = step(b, 0);
    rekey(b, ptr, size, before == nullptr || FreeOrder{}(before, FreeKey{b->stream, size, ptr}));
  }
  /// Gives an indexed block a new address and a larger size (it absorbed a neighbour).
  void grow(Block* b, char* ptr, std::size_t size) noexcept {
    // The new key is larger than the old one: only the successor can be out of order.
    const Block* after = step(b, 1);
    rekey(b, ptr, size, after == nullptr || FreeOrder{}(FreeKey{b->stream, size, ptr}, after));
  }
  /// Smallest block of at least `size` on `stream` (lowest address first), or end().
  [[nodiscard]] iterator best_fit(stream_t stream, std::size_t size) const noexcept {
    Block* b = bound_of(FreeKey{stream, size, nullptr});
    return {this, b != nullptr && b->stream == stream ? b : nullptr};
  }

 private:
  [[nodiscard]] Block* bound_of(const FreeKey& key) const noexcept {
    STITCH_ASSERT(!one_stream_ || size() == 0 || (*begin())->stream == key.stream,
                  "a one-stream index is searched for its own stream");
    return one_stream_ ? bound<SizeOrder>(key) : bound(key);
  }
  void rekey(Block* b, char* ptr, std::size_t size, bool in_order) noexcept {
    if (!in_order) [[unlikely]] {  // a new place in the order
      erase(b);
      b->ptr = ptr;
      b->size = size;
      insert(b);
      return;
    }
    b->ptr = ptr;  // the same place: the key changes in place
    b->size = size;
  }

  const bool one_stream_;
};

}  // namespace stitch::detail
