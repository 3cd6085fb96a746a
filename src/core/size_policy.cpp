// core/size_policy.cpp — request rounding (512 B multiples and power-of-two divisions).
#include "core/size_policy.hpp"

#include <bit>

namespace stitch::detail {

std::size_t round_to_division(std::size_t size, std::size_t divisions) noexcept {
  if (std::has_single_bit(size)) return size;
  const std::size_t floor = std::bit_floor(size);
  const std::size_t step = floor / divisions;
  if (step == 0) return floor * 2;
  return (size + step - 1) / step * step;
}

}  // namespace stitch::detail
