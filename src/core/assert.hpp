// core/assert.hpp — STITCH_ASSERT: invariants of the core checked in builds without NDEBUG (the
// sanitizer and fuzz builds of scripts/sanitizers.sh, Debug builds) and compiled out of release
// builds. A broken invariant prints what broke and where, then aborts. The validate() methods'
// checks, on in every build, throw through invariant_broken() instead.
#pragma once

#include <string_view>

#if defined(NDEBUG) && !defined(STITCH_ASSERTIONS)
#define STITCH_ASSERT(cond, what) ((void)0)
#else
#define STITCH_ASSERT(cond, what) \
  ((cond) ? (void)0 : ::stitch::detail::assertion_failed(#cond, what, __FILE__, __LINE__))
#endif

namespace stitch::detail {

[[noreturn]] void assertion_failed(const char* condition, const char* what, const char* file,
                                   int line) noexcept;
/// A validate() check failed on `device`: throws stitch::error "stitch invariant broken on
/// device N: what".
[[noreturn]] void invariant_broken(int device, std::string_view what);

}  // namespace stitch::detail
