// core/stat_update.hpp — updates a statistic for "all" and for the block's pool at once.
#pragma once

#include <cstdint>

#include "stitch/stats.hpp"

namespace stitch::detail {

inline void add(StatArray& stat, bool small, std::int64_t amount) noexcept {
  stat[kAll].increase(amount);
  stat[small ? kSmallPool : kLargePool].increase(amount);
}

inline void sub(StatArray& stat, bool small, std::int64_t amount) noexcept {
  stat[kAll].decrease(amount);
  stat[small ? kSmallPool : kLargePool].decrease(amount);
}

}  // namespace stitch::detail
