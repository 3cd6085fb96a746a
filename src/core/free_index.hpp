// core/free_index.hpp — a pool's free blocks, ordered by (stream, size, address): a red-black
// tree whose links live in the blocks (Block::tree), so filing a block allocates nothing and
// cannot fail.
//
// lower_bound on (stream, size, 0) yields the best fit: the smallest free block of at least
// `size` on that stream, lowest address among equals, in O(log n). A block is its own position,
// so removal needs no search, and shrink()/grow() change a block's size or address in place when
// its order among its neighbours is unchanged (the common case when a split or a merge moves a
// boundary).
#pragma once

#include <cstddef>
#include <iterator>

#include "core/block.hpp"

namespace stitch::detail {

class FreeIndex {
 public:
  /// A bidirectional iterator over the blocks in order; end() is past the last.
  class iterator {
   public:
    using iterator_category = std::bidirectional_iterator_tag;
    using value_type = Block*;
    using difference_type = std::ptrdiff_t;
    using pointer = Block* const*;
    using reference = Block*;
    iterator() = default;
    iterator(const FreeIndex* index, Block* b) noexcept : index_(index), b_(b) {}
    Block* operator*() const noexcept { return b_; }
    iterator& operator++() noexcept {
      b_ = FreeIndex::step(b_, 1);
      return *this;
    }
    iterator& operator--() noexcept {
      b_ = b_ != nullptr ? FreeIndex::step(b_, 0) : FreeIndex::extreme(index_->root_, 1);
      return *this;
    }
    iterator operator++(int) noexcept {
      iterator old = *this;
      ++*this;
      return old;
    }
    bool operator==(const iterator& o) const noexcept { return b_ == o.b_; }

   private:
    const FreeIndex* index_ = nullptr;
    Block* b_ = nullptr;
  };

  FreeIndex() = default;
  FreeIndex(const FreeIndex&) = delete;
  FreeIndex& operator=(const FreeIndex&) = delete;

  /// Files `b` (the block store marks it free).
  void insert(Block* b) noexcept {
    Block* parent = nullptr;
    Block** link = &root_;
    while (*link != nullptr) {
      parent = *link;
      link = &parent->tree.child[FreeOrder{}(parent, b) ? 1 : 0];
    }
    b->tree = Block::TreeLinks{parent, {nullptr, nullptr}, true};
    *link = b;
    ++size_;
    // Red under a red parent: recolour up the tree while the uncle is red, then rotate once or
    // twice.
    while ((parent = b->tree.parent) != nullptr && parent->tree.red) {
      Block* grand = parent->tree.parent;  // (a red node is never the root)
      const int side = grand->tree.child[1] == parent ? 1 : 0;
      Block* uncle = grand->tree.child[1 - side];
      if (uncle != nullptr && uncle->tree.red) {
        parent->tree.red = false;
        uncle->tree.red = false;
        grand->tree.red = true;
        b = grand;
        continue;
      }
      if (parent->tree.child[1 - side] == b) {  // the inner grandchild: first made the outer one
        rotate_up(b);
        parent = b;
      }
      parent->tree.red = false;
      grand->tree.red = true;
      rotate_up(parent);
      break;
    }
    root_->tree.red = false;
  }
  void erase(Block* b) noexcept {
    // `b` leaves its place: to its only child, or to its successor (which leaves its own place
    // to its right child). `gap` is what fills the place a node left, under `gap_parent`.
    Block* gap;
    Block* gap_parent;
    bool removed_red;
    if (b->tree.child[0] == nullptr || b->tree.child[1] == nullptr) {
      gap = b->tree.child[b->tree.child[0] == nullptr ? 1 : 0];
      gap_parent = b->tree.parent;
      removed_red = b->tree.red;
      link_of(b) = gap;
      if (gap != nullptr) gap->tree.parent = gap_parent;
    } else {
      Block* next = extreme(b->tree.child[1], 0);
      removed_red = next->tree.red;
      gap = next->tree.child[1];
      if (next->tree.parent == b) {
        gap_parent = next;
      } else {
        gap_parent = next->tree.parent;
        gap_parent->tree.child[0] = gap;
        if (gap != nullptr) gap->tree.parent = gap_parent;
        next->tree.child[1] = b->tree.child[1];
        next->tree.child[1]->tree.parent = next;
      }
      link_of(b) = next;
      next->tree.parent = b->tree.parent;
      next->tree.child[0] = b->tree.child[0];
      next->tree.child[0]->tree.parent = next;
      next->tree.red = b->tree.red;
    }
    --size_;
    if (!removed_red) rebalance_after_erase(gap, gap_parent);
  }
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
    Block* b = bound(FreeKey{stream, size, nullptr});
    return {this, b != nullptr && b->stream == stream ? b : nullptr};
  }
  /// The first block not before `key`, or end().
  [[nodiscard]] iterator lower_bound(const FreeKey& key) const noexcept { return {this, bound(key)}; }
  [[nodiscard]] iterator begin() const noexcept { return {this, extreme(root_, 0)}; }
  [[nodiscard]] iterator end() const noexcept { return {this, nullptr}; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// Whether `b` is filed here (validate()).
  [[nodiscard]] bool contains(const Block* b) const noexcept {
    return bound(FreeKey{b->stream, b->size, b->ptr}) == b;
  }

 private:
  /// The first block of the subtree at `b` (dir 0) or its last (dir 1); nullptr when empty.
  static Block* extreme(Block* b, int dir) noexcept {
    if (b != nullptr)
      while (b->tree.child[dir] != nullptr) b = b->tree.child[dir];
    return b;
  }
  /// The block after `b` in the order (dir 1) or before it (dir 0); nullptr at the end.
  static Block* step(Block* b, int dir) noexcept {
    if (b->tree.child[dir] != nullptr) return extreme(b->tree.child[dir], 1 - dir);
    Block* p = b->tree.parent;
    while (p != nullptr && p->tree.child[dir] == b) {
      b = p;
      p = p->tree.parent;
    }
    return p;
  }
  [[nodiscard]] Block* bound(const FreeKey& key) const noexcept {
    Block* found = nullptr;
    for (Block* b = root_; b != nullptr;) {
      if (FreeOrder{}(b, key)) {
        b = b->tree.child[1];
      } else {
        found = b;
        b = b->tree.child[0];
      }
    }
    return found;
  }
  /// The link that points at `b`: its parent's child or the root.
  Block*& link_of(const Block* b) noexcept {
    Block* p = b->tree.parent;
    return p == nullptr ? root_ : p->tree.child[p->tree.child[1] == b ? 1 : 0];
  }
  /// `b` takes its parent's place, the parent becoming its child (the order is unchanged).
  void rotate_up(Block* b) noexcept {
    Block* p = b->tree.parent;
    const int dir = p->tree.child[1] == b ? 1 : 0;
    Block* moved = b->tree.child[1 - dir];
    link_of(p) = b;
    b->tree.parent = p->tree.parent;
    p->tree.child[dir] = moved;
    if (moved != nullptr) moved->tree.parent = p;
    b->tree.child[1 - dir] = p;
    p->tree.parent = b;
  }
  /// A black node left the place `gap` (maybe null) fills under `parent`: the paths through it
  /// are one black short, made good by recolouring and at most three rotations.
  void rebalance_after_erase(Block* gap, Block* parent) noexcept {
    while (gap != root_ && (gap == nullptr || !gap->tree.red)) {
      // (When `gap` is null its sibling is not: that side held the removed black node's match.)
      const int side = parent->tree.child[0] == gap ? 0 : 1;
      Block* sibling = parent->tree.child[1 - side];
      if (sibling->tree.red) {
        sibling->tree.red = false;
        parent->tree.red = true;
        rotate_up(sibling);
        sibling = parent->tree.child[1 - side];
      }
      Block* near = sibling->tree.child[side];
      Block* far = sibling->tree.child[1 - side];
      if ((near == nullptr || !near->tree.red) && (far == nullptr || !far->tree.red)) {
        sibling->tree.red = true;
        gap = parent;
        parent = gap->tree.parent;
        continue;
      }
      if (far == nullptr || !far->tree.red) {  // the near child red: made the far one
        near->tree.red = false;
        sibling->tree.red = true;
        rotate_up(near);
        far = sibling;
        sibling = near;
      }
      sibling->tree.red = parent->tree.red;
      parent->tree.red = false;
      far->tree.red = false;
      rotate_up(sibling);
      gap = root_;
    }
    if (gap != nullptr) gap->tree.red = false;
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

  Block* root_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace stitch::detail
