// api/region_stack.hpp — the regions open on each thread (Allocator::begin_region): a stack of
// frames, innermost last, shared by every allocator of the process (each frame names its own),
// and the count every allocation reads first.
#pragma once

#include <cstdint>
#include <vector>

namespace stitch {
class Allocator;
namespace detail {

struct RegionFrame {
  const Allocator* owner;
  std::uint16_t tag;
  bool backup;
};

/// This thread's open regions, innermost last.
extern thread_local std::vector<RegionFrame> t_regions;
/// t_regions.size(): the one thing an untagged allocation reads, a single load through the
/// initial-exec TLS model (no __tls_get_addr; 4 bytes of the static TLS space that a library
/// loaded with dlopen may use).
extern thread_local int t_open_regions __attribute__((tls_model("initial-exec")));

}  // namespace detail
}  // namespace stitch
