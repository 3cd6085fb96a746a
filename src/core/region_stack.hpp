// core/region_stack.hpp — the regions open on each thread (Allocator::begin_region): a stack of
// frames, innermost last, shared by every allocator of the process (each frame names its owner),
// and its depth, which the cache hit reads (one load): while a region is open the thread's
// allocations take the device lock, which routes them (core/cache_hit.hpp). When the thread ends,
// its regions end with it: the depth drops to 0 before the stack is destroyed, so an allocation
// from a later thread-exit destructor is an untagged one.
#pragma once

#include <cstdint>
#include <vector>

namespace stitch::detail {

struct RegionFrame {
  const void* owner;  ///< the Allocator that opened it
  std::uint16_t tag;
  bool backup;
};

/// This thread's open regions, innermost last.
struct RegionStack {
  std::vector<RegionFrame> frames;
  ~RegionStack();
};
extern thread_local RegionStack t_regions;
/// t_regions.size(), one load through the initial-exec TLS model (no __tls_get_addr; 4 bytes of
/// the static TLS space that a library loaded with dlopen may use).
extern constinit thread_local int t_open_regions __attribute__((tls_model("initial-exec")));

/// The calling thread's innermost region of `owner`, or nullptr.
inline const RegionFrame* innermost_region(const void* owner) noexcept {
  if (t_open_regions == 0) return nullptr;
  for (auto it = t_regions.frames.rbegin(); it != t_regions.frames.rend(); ++it)
    if (it->owner == owner) return &*it;
  return nullptr;
}

}  // namespace stitch::detail
