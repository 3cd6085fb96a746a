// core/object_pool.hpp — recycles fixed-size objects so the allocation fast path never calls
// operator new: freed objects go on a free list, new ones are carved from 64-object chunks, which
// stay until the pool goes (so an object's memory stays readable). reserve() makes sure the next
// few create()s cannot throw, so a path that must not fail halfway asks first. Not thread-safe:
// each pool lives under its owner's lock.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <utility>
#include <vector>

namespace stitch::detail {

/// create() constructs a T in recycled storage, destroy() gives it back.
template <typename T>
class ObjectPool {
 public:
  ObjectPool() = default;
  ObjectPool(const ObjectPool&) = delete;
  ObjectPool& operator=(const ObjectPool&) = delete;

  /// The next `n` create()s will not throw for want of memory (std::bad_alloc here instead,
  /// with nothing taken).
  void reserve(std::size_t n) {
    if (n == 1 && free_ != nullptr) [[likely]] return;
    std::size_t have = 0;
    for (Slot* s = free_; s != nullptr && have < n; s = s->next) ++have;
    for (; have < n; have += kChunk) grow();
  }
  template <typename... Args>
  T* create(Args&&... args) {
    if (free_ == nullptr) grow();
    Slot* slot = free_;
    free_ = slot->next;
    return ::new (static_cast<void*>(slot)) T(std::forward<Args>(args)...);
  }
  void destroy(T* t) noexcept {
    t->~T();
    put(reinterpret_cast<Slot*>(t));
  }

 private:
  // At least a pointer's alignment: a free slot holds the free-list link.
  union alignas(alignof(T) > alignof(void*) ? alignof(T) : alignof(void*)) Slot {
    Slot* next;
    unsigned char bytes[sizeof(T)];
  };
  static constexpr std::size_t kChunk = 64;

  void put(Slot* slot) noexcept {
    slot->next = free_;
    free_ = slot;
  }
  void grow() {
    chunks_.push_back(std::make_unique<Slot[]>(kChunk));
    Slot* chunk = chunks_.back().get();
    for (std::size_t i = 0; i < kChunk; ++i) put(&chunk[i]);
  }

  Slot* free_ = nullptr;
  std::vector<std::unique_ptr<Slot[]>> chunks_;
};

}  // namespace stitch::detail
