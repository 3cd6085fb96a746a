// core/free_index.hpp — a pool's free blocks, ordered by (stream, size, address).
//
// lower_bound on (stream, size, 0) yields the best fit: the smallest free block of at least
// `size` on that stream, lowest address among equals, in O(log n). Tree nodes come from a
// RawPool, so inserts and erases do not touch the heap once the pool is warm.
#pragma once

#include <cstddef>
#include <set>

#include "core/block.hpp"
#include "core/object_pool.hpp"

namespace stitch::detail {

struct FreeKey {
  stream_t stream;
  std::size_t size;
  const char* ptr;
};

struct FreeOrder {
  using is_transparent = void;
  static bool less(stream_t s1, std::size_t z1, const char* p1, stream_t s2, std::size_t z2,
                   const char* p2) noexcept {
    if (s1 != s2) return s1 < s2;
    if (z1 != z2) return z1 < z2;
    return p1 < p2;
  }
  bool operator()(const Block* a, const Block* b) const noexcept {
    return less(a->stream, a->size, a->ptr, b->stream, b->size, b->ptr);
  }
  bool operator()(const Block* a, const FreeKey& k) const noexcept {
    return less(a->stream, a->size, a->ptr, k.stream, k.size, k.ptr);
  }
  bool operator()(const FreeKey& k, const Block* b) const noexcept {
    return less(k.stream, k.size, k.ptr, b->stream, b->size, b->ptr);
  }
};

class FreeIndex {
 public:
  using Set = std::set<Block*, FreeOrder, PoolAllocator<Block*>>;
  using iterator = Set::iterator;

  explicit FreeIndex(PoolAllocator<Block*>::Storage* nodes)
      : set_(FreeOrder{}, PoolAllocator<Block*>(nodes)) {}

  void insert(Block* b) {
    set_.insert(b);
    b->in_index = true;
  }
  void erase(Block* b) noexcept {
    set_.erase(b);
    b->in_index = false;
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
  Set set_;
};

}  // namespace stitch::detail
