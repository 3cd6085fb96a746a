// core/block_tree.hpp — BlockTree: an ordered set of blocks, a red-black tree whose links live
// in the blocks themselves (Block::tree), so adding a block allocates nothing and cannot fail, and
// a block is its own position (removal needs no search). A block is in at most one tree at a
// time: its pool's free index (core/free_index.hpp) while free, its pool's unmapped set while
// unmapped. `Order` compares two blocks, or a block and a key, and must be a strict total order
// on the blocks of one tree.
#pragma once

#include <cstddef>
#include <iterator>

#include "core/block.hpp"

namespace stitch::detail {

template <typename Order>
class BlockTree {
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
    iterator(const BlockTree* tree, Block* b) noexcept : tree_(tree), b_(b) {}
    Block* operator*() const noexcept { return b_; }
    iterator& operator++() noexcept {
      b_ = BlockTree::step(b_, 1);
      return *this;
    }
    iterator& operator--() noexcept {
      b_ = b_ != nullptr ? BlockTree::step(b_, 0) : BlockTree::extreme(tree_->root_, 1);
      return *this;
    }
    iterator operator++(int) noexcept {
      iterator old = *this;
      ++*this;
      return old;
    }
    bool operator==(const iterator& o) const noexcept { return b_ == o.b_; }

   private:
    const BlockTree* tree_ = nullptr;
    Block* b_ = nullptr;
  };

  BlockTree() = default;
  BlockTree(const BlockTree&) = delete;
  BlockTree& operator=(const BlockTree&) = delete;

  /// Adds `b` (not in the tree). `O`: an order that agrees with `Order` on the tree's blocks.
  template <typename O = Order>
  void insert(Block* b) noexcept {
    Block* parent = nullptr;
    Block** link = &root_;
    while (*link != nullptr) {
      parent = *link;
      link = &parent->tree.child[O{}(parent, b) ? 1 : 0];
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
  /// Takes `b` (in the tree) out.
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
  /// The first block not before `key`, or end().
  template <typename Key>
  [[nodiscard]] iterator lower_bound(const Key& key) const noexcept { return {this, bound(key)}; }
  [[nodiscard]] iterator begin() const noexcept { return {this, extreme(root_, 0)}; }
  [[nodiscard]] iterator end() const noexcept { return {this, nullptr}; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// Whether `b` is in this tree (validate()).
  [[nodiscard]] bool contains(const Block* b) const noexcept { return bound(b) == b; }

 protected:
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
  /// The first block not before `key`, or nullptr (`O` as insert()'s).
  template <typename O = Order, typename Key>
  [[nodiscard]] Block* bound(const Key& key) const noexcept {
    Block* found = nullptr;
    for (Block* b = root_; b != nullptr;) {
      const bool right = O{}(b, key);
      found = right ? found : b;
      b = b->tree.child[right ? 1 : 0];
    }
    return found;
  }

 private:
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

  Block* root_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace stitch::detail
