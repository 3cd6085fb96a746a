// core/object_pool.hpp — recycles fixed-size objects so the allocation fast path never calls
// operator new: freed objects go on a free list, new ones are carved from 64-object chunks, which
// stay until the pool goes (so an object's memory stays readable). reserve() makes sure the next
// few get()s cannot throw, so a path that must not fail halfway asks first. Not thread-safe: each
// pool lives under its owner's lock.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <vector>

namespace stitch::detail {

/// Raw storage for objects of `Size` bytes, `Align` aligned.
template <std::size_t Size, std::size_t Align>
class RawPool {
 public:
  RawPool() = default;
  RawPool(const RawPool&) = delete;
  RawPool& operator=(const RawPool&) = delete;

  /// The next `n` get()s will not throw (std::bad_alloc here instead, with nothing taken).
  void reserve(std::size_t n) {
    if (n == 1 && free_ != nullptr) [[likely]] return;
    std::size_t have = 0;
    for (Slot* s = free_; s != nullptr && have < n; s = s->next) ++have;
    for (; have < n; have += kChunk) grow();
  }
  void* get() {
    if (free_ == nullptr) grow();
    Slot* slot = free_;
    free_ = slot->next;
    return slot;
  }
  void put(void* p) noexcept {
    Slot* slot = static_cast<Slot*>(p);
    slot->next = free_;
    free_ = slot;
  }

 private:
  // At least a pointer's alignment: a free slot holds the free-list link.
  union alignas(Align > alignof(void*) ? Align : alignof(void*)) Slot {
    Slot* next;
    unsigned char bytes[Size];
  };
  static constexpr std::size_t kChunk = 64;

  void grow() {
    chunks_.push_back(std::make_unique<Slot[]>(kChunk));
    Slot* chunk = chunks_.back().get();
    for (std::size_t i = 0; i < kChunk; ++i) put(&chunk[i]);
  }

  Slot* free_ = nullptr;
  std::vector<std::unique_ptr<Slot[]>> chunks_;
};

/// Typed pool: create() constructs a T in recycled storage, destroy() gives it back.
template <typename T>
class ObjectPool {
 public:
  /// The next `n` create()s will not throw for want of memory.
  void reserve(std::size_t n) { raw_.reserve(n); }
  template <typename... Args>
  T* create(Args&&... args) {
    void* p = raw_.get();
    return ::new (p) T(std::forward<Args>(args)...);
  }
  void destroy(T* t) noexcept {
    t->~T();
    raw_.put(t);
  }

 private:
  RawPool<sizeof(T), alignof(T)> raw_;
};

/// A std::allocator replacement for node-based containers (std::set) that draws single nodes
/// from a shared RawPool. Only n == 1 allocations are pooled; anything else uses operator new.
template <typename T>
class PoolAllocator {
 public:
  using value_type = T;
  static constexpr std::size_t kNodeBytes = 64;
  using Storage = RawPool<kNodeBytes, alignof(std::max_align_t)>;

  explicit PoolAllocator(Storage* storage) noexcept : storage_(storage) {}
  template <typename U>
  PoolAllocator(const PoolAllocator<U>& other) noexcept : storage_(other.storage_) {}  // NOLINT

  T* allocate(std::size_t n) {
    if (n == 1 && sizeof(T) <= kNodeBytes) return static_cast<T*>(storage_->get());
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (n == 1 && sizeof(T) <= kNodeBytes) {
      storage_->put(p);
    } else {
      ::operator delete(p);
    }
  }
  template <typename U>
  bool operator==(const PoolAllocator<U>& o) const noexcept { return storage_ == o.storage_; }

  Storage* storage_;
};

}  // namespace stitch::detail
