// core/ptr_map.hpp — the live-allocation table: pointer -> Block, an open-addressing hash map
// with linear probing and backward-shift deletion. Lookups, inserts and erases touch a few
// adjacent slots and never allocate; the table only grows (doubling) when it is half full.
// Not thread-safe: it lives under its device's lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace stitch::detail {

template <typename V>
class PtrMap {
 public:
  PtrMap() : slots_(kInitial), mask_(kInitial - 1) {}

  static constexpr std::size_t npos = ~std::size_t{0};

  [[nodiscard]] std::size_t size() const noexcept { return size_; }

  V* find(const void* key) const noexcept {
    const std::size_t slot = find_slot(key);
    return slot == npos ? nullptr : slots_[slot].value;
  }

  /// Inserts key -> value; the key must not be present and must not be null.
  void insert(const void* key, V* value) {
    if ((size_ + 1) * 2 > mask_ + 1) rehash((mask_ + 1) * 2);
    place(key, value);
    ++size_;
  }

  /// The slot holding `key`, or npos; valid until the next insert or erase.
  [[nodiscard]] std::size_t find_slot(const void* key) const noexcept {
    const std::size_t mask = mask_;
    for (std::size_t i = hash(key) & mask;; i = (i + 1) & mask) {
      if (slots_[i].key == key) return i;
      if (slots_[i].key == nullptr) return npos;
    }
  }
  [[nodiscard]] V* value_at(std::size_t slot) const noexcept { return slots_[slot].value; }

  /// Removes `key` and returns its value, or nullptr if absent.
  V* erase(const void* key) noexcept {
    const std::size_t slot = find_slot(key);
    if (slot == npos) return nullptr;
    V* value = slots_[slot].value;
    erase_at(slot);
    return value;
  }

  /// Removes the entry in `slot` (from find_slot).
  void erase_at(std::size_t i) noexcept {
    const std::size_t mask = mask_;
    // Backward-shift: pull later entries of the probe run into the hole.
    std::size_t hole = i;
    for (std::size_t j = (i + 1) & mask; slots_[j].key != nullptr; j = (j + 1) & mask) {
      const std::size_t home = hash(slots_[j].key) & mask;
      // Move j into the hole if its home is not cyclically within (hole, j].
      const bool movable = (j > hole) ? (home <= hole || home > j) : (home <= hole && home > j);
      if (movable) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = Slot{};
    --size_;
  }

  template <typename Fn>
  void for_each(Fn&& fn) const {
    for (const Slot& s : slots_)
      if (s.key != nullptr) fn(s.key, s.value);
  }

 private:
  struct Slot {
    const void* key = nullptr;
    V* value = nullptr;
  };
  static constexpr std::size_t kInitial = 1024;

  static std::size_t hash(const void* key) noexcept {
    // Pointers are 512-byte aligned: mix the bits so neighbouring blocks spread out.
    auto x = reinterpret_cast<std::uintptr_t>(key);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return static_cast<std::size_t>(x);
  }

  void place(const void* key, V* value) noexcept {
    const std::size_t mask = mask_;
    std::size_t i = hash(key) & mask;
    while (slots_[i].key != nullptr) i = (i + 1) & mask;
    slots_[i] = Slot{key, value};
  }

  void rehash(std::size_t capacity) {
    std::vector<Slot> old(capacity);
    old.swap(slots_);
    mask_ = capacity - 1;
    for (const Slot& s : old)
      if (s.key != nullptr) place(s.key, s.value);
  }

  std::vector<Slot> slots_;
  std::size_t mask_;  ///< slots_.size() - 1 (a power of two minus one)
  std::size_t size_ = 0;
};

}  // namespace stitch::detail
