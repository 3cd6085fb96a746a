// tests/support/live_ranges.hpp — the address ranges of the allocations a test holds, to check
// that the allocator never hands out memory that overlaps a live allocation. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>

namespace stitch::test {

class LiveRanges {
 public:
  /// Adds [ptr, ptr + size); false (and nothing added) if it overlaps a range already held.
  bool add(const void* ptr, std::size_t size) {
    const auto p = reinterpret_cast<std::uintptr_t>(ptr);
    auto next = ranges_.lower_bound(p);
    if (next != ranges_.end() && next->first < p + size) return false;
    if (next != ranges_.begin() && std::prev(next)->first + std::prev(next)->second > p) return false;
    ranges_.emplace_hint(next, p, size);
    return true;
  }
  void remove(const void* ptr) { ranges_.erase(reinterpret_cast<std::uintptr_t>(ptr)); }
  /// True if `ptr` is the start of a range held.
  [[nodiscard]] bool starts(const void* ptr) const {
    return ranges_.count(reinterpret_cast<std::uintptr_t>(ptr)) != 0;
  }
  void clear() { ranges_.clear(); }

 private:
  std::map<std::uintptr_t, std::size_t> ranges_;
};

}  // namespace stitch::test
