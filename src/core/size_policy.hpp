// core/size_policy.hpp — how a request is rounded, which pool serves it, how big a new segment is.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "core/constants.hpp"

namespace stitch::detail {

/// Rounds `size` up to a multiple of 512 B or, when `divisions` for its interval is > 1, to the
/// next of `divisions` equal steps between two powers of two (roundup_power2_divisions).
std::size_t round_size(std::size_t size, const std::array<std::uint32_t, 16>& divisions) noexcept;

/// Small pool (true) for rounded sizes up to 1 MiB.
inline bool is_small(std::size_t rounded) noexcept { return rounded <= kSmallSize; }

/// Size of the segment to allocate when no cached block fits `rounded`.
inline std::size_t segment_size(std::size_t rounded) noexcept {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

/// Index of the roundup_power2_divisions interval for `size`: log2(size) - 20, clamped to [0,15].
int division_interval(std::size_t size) noexcept;

}  // namespace stitch::detail
