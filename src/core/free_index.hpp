// core/free_index.hpp — a pool's free blocks, ordered by (stream, size, address).
//
// lower_bound on (stream, size, 0) yields the best fit: the smallest free block of at least
// `size` on that stream, lowest address among equals, in O(log n). Each block remembers its
// tree position, so removal needs no search, and shrink()/grow() change a block's size or address in
// place when its order among its neighbours is unchanged (the common case when a split or a
// merge moves a boundary), touching no other node. Tree nodes come from a RawPool, so nothing
// here touches the heap once the pool is warm.
#pragma once

#include <cstddef>
#include <iterator>

#include "core/block.hpp"
#include "core/object_pool.hpp"

namespace stitch::detail {

class FreeIndex {
 public:
  using iterator = FreeSet::iterator;

  explicit FreeIndex(PoolAllocator<Block*>::Storage* nodes)
      : set_(FreeOrder{}, PoolAllocator<Block*>(nodes)) {}

  /// The next insert() will not throw for want of a node (std::bad_alloc here instead).
  void reserve() { set_.get_allocator().storage_->reserve(1); }
  /// Files `b` (the block store marks it free).
  void insert(Block* b) { b->pos = set_.insert(b).first; }
  void erase(Block* b) noexcept { set_.erase(b->pos); }
  /// Gives an indexed block a new address and a smaller size (a split took its front).
  void shrink(Block* b, char* ptr, std::size_t size) {
    // The new key is smaller than the old one: only the predecessor can be out of order.
    const bool in_order = b->pos == set_.begin() || FreeOrder{}(*std::prev(b->pos), FreeKey{b->stream, size, ptr});
    rekey(b, ptr, size, in_order);
  }
  /// Gives an indexed block a new address and a larger size (it absorbed a neighbour).
  void grow(Block* b, char* ptr, std::size_t size) {
    // The new key is larger than the old one: only the successor can be out of order.
    const auto next = std::next(b->pos);
    const bool in_order = next == set_.end() || FreeOrder{}(FreeKey{b->stream, size, ptr}, *next);
    rekey(b, ptr, size, in_order);
  }
  /// Smallest block of at least `size` on `stream` (lowest address first), or end().
  [[nodiscard]] iterator best_fit(stream_t stream, std::size_t size) const {
    auto it = set_.lower_bound(FreeKey{stream, size, nullptr});
    if (it != set_.end() && (*it)->stream != stream) return set_.end();
    return it;
  }
  [[nodiscard]] iterator lower_bound(const FreeKey& key) const { return set_.lower_bound(key); }
  [[nodiscard]] iterator begin() const noexcept { return set_.begin(); }
  [[nodiscard]] iterator end() const noexcept { return set_.end(); }
  [[nodiscard]] std::size_t size() const noexcept { return set_.size(); }
  [[nodiscard]] bool contains(Block* b) const { return set_.find(b) != set_.end(); }

 private:
  [[gnu::always_inline]] void rekey(Block* b, char* ptr, std::size_t size, bool in_order) {
    if (in_order) [[likely]] {  // same place in the order: the key changes in place
      b->ptr = ptr;
      b->size = size;
      return;
    }
    reposition(b, ptr, size);
  }
  /// The node moves to the new key's place (no allocation: the node is reused).
  [[gnu::noinline]] void reposition(Block* b, char* ptr, std::size_t size) {
    auto node = set_.extract(b->pos);
    b->ptr = ptr;
    b->size = size;
    b->pos = set_.insert(std::move(node)).position;
  }

  FreeSet set_;
};

}  // namespace stitch::detail
