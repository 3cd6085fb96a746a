// core/constants.hpp — the size constants of the caching policy (PyTorch's values).
#pragma once

#include <cstddef>

namespace stitch::detail {

inline constexpr std::size_t kMiB = std::size_t{1} << 20;
inline constexpr std::size_t kMinBlockSize = 512;      ///< every block is a multiple of this
inline constexpr std::size_t kSmallSize = 1 * kMiB;    ///< rounded sizes up to this: small pool
inline constexpr std::size_t kSmallBuffer = 2 * kMiB;  ///< small-pool segment size
inline constexpr std::size_t kLargeBuffer = 20 * kMiB; ///< segment size for 1-10 MiB requests
inline constexpr std::size_t kMinLargeAlloc = 10 * kMiB;  ///< from here: a dedicated segment
inline constexpr std::size_t kRoundLarge = 2 * kMiB;   ///< dedicated segments round up to this
inline constexpr std::size_t kMaxRequest = std::size_t{1} << 60;  ///< 1 EiB: refused outright

/// `n` rounded up to a multiple of `unit`.
constexpr std::size_t round_up(std::size_t n, std::size_t unit) noexcept {
  return (n + unit - 1) / unit * unit;
}

}  // namespace stitch::detail
