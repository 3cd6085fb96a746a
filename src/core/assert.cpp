// core/assert.cpp — what a failed STITCH_ASSERT and a failed validate() check do.
#include "core/assert.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>

#include "stitch/errors.hpp"

namespace stitch::detail {

void assertion_failed(const char* condition, const char* what, const char* file, int line) noexcept {
  std::fprintf(stderr, "stitch: invariant broken at %s:%d: %s (%s)\n", file, line, what, condition);
  std::abort();
}

void invariant_broken(int device, std::string_view what) {
  throw error(fmt::format("stitch invariant broken on device {}: {}", device, what));
}

}  // namespace stitch::detail
