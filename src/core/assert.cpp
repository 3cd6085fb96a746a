// core/assert.cpp — what a failed STITCH_ASSERT does.
#include "core/assert.hpp"

#include <cstdio>
#include <cstdlib>

namespace stitch::detail {

void assertion_failed(const char* condition, const char* what, const char* file, int line) noexcept {
  std::fprintf(stderr, "stitch: invariant broken at %s:%d: %s (%s)\n", file, line, what, condition);
  std::abort();
}

}  // namespace stitch::detail
