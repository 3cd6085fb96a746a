// core/size_policy.hpp — how a request is rounded, which pool serves it, how big a new segment is.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "core/constants.hpp"

namespace stitch::detail {


/// Index of the roundup_power2_divisions interval for `size`: log2(size) - 20, clamped to [0,15].
inline int division_interval(std::size_t size) noexcept {
  if (size < kMiB) return 0;
  const int index = static_cast<int>(std::bit_width(size)) - 1 - 20;
  return index > 15 ? 15 : index;
}

/// Rounds up to the next of `divisions` equal steps between two powers of two.
std::size_t round_to_division(std::size_t size, std::size_t divisions) noexcept;

/// Rounds `size` up to a multiple of 512 B or, when `divisions` for its interval is > 1, to the
/// next of `divisions` equal steps between two powers of two (roundup_power2_divisions).
inline std::size_t round_size(std::size_t size,
                              const std::array<std::uint32_t, 16>& divisions) noexcept {
  if (size < kMinBlockSize) return kMinBlockSize;
  const std::size_t d = divisions[static_cast<std::size_t>(division_interval(size))];
  if (d > 1 && size > kMinBlockSize * d) return round_to_division(size, d);
  return (size + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

/// Small pool (true) for rounded sizes up to 1 MiB.
inline bool is_small(std::size_t rounded) noexcept { return rounded <= kSmallSize; }

/// Size of the segment to allocate when no cached block fits `rounded`.
inline std::size_t segment_size(std::size_t rounded) noexcept {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

}  // namespace stitch::detail
