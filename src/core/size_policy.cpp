// core/size_policy.cpp — request rounding (512 B multiples and power-of-two divisions).
#include "core/size_policy.hpp"

#include <bit>

namespace stitch::detail {

int division_interval(std::size_t size) noexcept {
  if (size < kMiB) return 0;
  const int log2 = static_cast<int>(std::bit_width(size)) - 1;
  const int index = log2 - 20;
  return index > 15 ? 15 : index;
}

namespace {
std::size_t round_to_division(std::size_t size, std::size_t divisions) noexcept {
  if (std::has_single_bit(size)) return size;
  const std::size_t floor = std::bit_floor(size);
  const std::size_t step = floor / divisions;
  if (step == 0) return floor * 2;
  return (size + step - 1) / step * step;
}
}  // namespace

std::size_t round_size(std::size_t size, const std::array<std::uint32_t, 16>& divisions) noexcept {
  if (size < kMinBlockSize) return kMinBlockSize;
  const std::size_t d = divisions[static_cast<std::size_t>(division_interval(size))];
  if (d > 1 && size > kMinBlockSize * d) return round_to_division(size, d);
  return (size + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

}  // namespace stitch::detail
