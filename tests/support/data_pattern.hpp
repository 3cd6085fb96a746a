// tests/support/data_pattern.hpp — the data pattern that stress tests, the concurrency stress and
// the C API fuzzer write into every allocation and check before freeing it: a seeded word at
// chosen offsets, so that a block handed out twice or overwritten by a neighbour is noticed.
//
// Blocks up to 4 KiB: every word. Larger ones: the first and last 64 bytes plus one word every
// 4 KiB, thinned out for blocks above 256 KiB to about 64 words spread evenly over the block
// (touching every page of every large block would make the runs page-fault bound).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace stitch::test {

constexpr std::size_t kPatternKiB = std::size_t{1} << 10;

inline std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

/// Calls fn(offset) for every 8-byte word of a `size`-byte block that carries the pattern.
template <typename Fn>
void pattern_offsets(std::size_t size, Fn&& fn) {
  const std::size_t words = size / 8;
  if (size <= 4 * kPatternKiB) {
    for (std::size_t w = 0; w < words; ++w) fn(w * 8);
    return;
  }
  const std::size_t end = words * 8;
  const std::size_t page = 4 * kPatternKiB;
  const std::size_t stride = size <= 256 * kPatternKiB ? page : (size / 64 + page - 1) / page * page;
  for (std::size_t off = 0; off < 64; off += 8) fn(off);                  // first 64 B
  for (std::size_t off = stride; off + 64 + 8 <= end; off += stride) fn(off);
  for (std::size_t off = end - 64; off < end; off += 8) fn(off);          // last 64 B
}

inline void write_pattern(void* p, std::size_t size, std::uint64_t seed) {
  auto* base = static_cast<unsigned char*>(p);
  pattern_offsets(size, [&](std::size_t off) {
    const std::uint64_t v = mix(seed + off);
    std::memcpy(base + off, &v, 8);
  });
}

inline bool pattern_intact(const void* p, std::size_t size, std::uint64_t seed) {
  const auto* base = static_cast<const unsigned char*>(p);
  bool ok = true;
  pattern_offsets(size, [&](std::size_t off) {
    std::uint64_t v;
    std::memcpy(&v, base + off, 8);
    ok = ok && v == mix(seed + off);
  });
  return ok;
}

}  // namespace stitch::test
