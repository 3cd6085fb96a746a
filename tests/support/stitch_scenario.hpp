// tests/support/stitch_scenario.hpp — the adversarial case of virtual-memory stitching
// (docs/stitching.md), built the same way on every backend: under a memory cap, blocks of
// 1.5..4.5 granules fill the device until the cap stops the allocator; every other block is then
// freed and the cap lowered to what is reserved, so that not one fresh page is left and only
// moving free pages can serve a request larger than any hole.
//
// Used by tests/stitching_scenario_test.cpp (simulated device: the expectations, checked on every
// test run), tests/cuda/cuda_stitching_test.cu (a GPU, with kernels) and
// benchmarks/gpu/stitch_cost.cpp (the time a stitch takes). Header only, C++17 (nvcc reads it).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/errors.hpp"

namespace stitch::test {

/// The settings of the scenario, after "backend:<name>,". stitch_reuse_pages:False: a grow may
/// not take the stream's free pages, so the pressure path (a stitched range, num_stitches) is
/// what serves a large request; stitch_fine_above:0: fine pages from the first byte, so that the
/// holes are pages stitching can move.
inline constexpr const char* kScenarioConf =
    "expandable_segments:True,stitching:True,stitch_reuse_pages:False,stitch_fine_above:0";

inline std::size_t round_down(std::size_t n, std::size_t unit) { return n / unit * unit; }
inline std::size_t round_up(std::size_t n, std::size_t unit) { return (n + unit - 1) / unit * unit; }

/// Bytes of whole pages of `unit` that a block of `n` bytes contains wherever it starts: at
/// least (n/unit - 1) pages, at most n/unit pages.
inline std::size_t whole_pages_at_least(std::size_t n, std::size_t unit) {
  return n / unit >= 1 ? (n / unit - 1) * unit : 0;
}
inline std::size_t whole_pages_at_most(std::size_t n, std::size_t unit) { return round_down(n, unit); }

/// The cap of the scenario: `at_most`, or a quarter of the device's free memory when that is
/// less, in whole granules.
inline std::size_t scenario_cap(std::size_t device_free, std::size_t granule,
                                std::size_t at_most = std::size_t{2} << 30) {
  return round_down(std::min(at_most, device_free / 4), granule);
}

/// Caps reserved memory at `bytes` (set_memory_fraction of the backend's total memory).
inline void cap_reserved(Allocator& alloc, std::size_t bytes, int device = 0) {
  const double total = static_cast<double>(alloc.backend().memory_info(device).total);
  alloc.set_memory_fraction(std::min(1.0, static_cast<double>(bytes) / total), device);
}

/// The largest free ("inactive") block of the allocator's snapshot.
inline std::size_t largest_free_block(const Allocator& alloc) {
  std::size_t largest = 0;
  for (const SegmentSnapshot& s : alloc.snapshot().segments)
    for (const BlockSnapshot& b : s.blocks)
      if (b.state == "inactive") largest = std::max<std::size_t>(largest, b.size);
  return largest;
}

inline std::size_t reserved_now(const Allocator& alloc, int device = 0) {
  const auto v = alloc.stat(device, "reserved_bytes.all.current");
  return v ? static_cast<std::size_t>(*v) : 0;
}

/// The size of block `i`: 1.5..4.5 granules plus a few odd bytes (as in tests/stitching_test.cpp).
inline std::size_t scenario_block_size(std::uint32_t i, std::size_t granule) {
  return (3 + (i * 5) % 7) * (granule / 2) + (i % 3) * 4096 + 512;
}

struct ScenarioBlock {
  void* ptr = nullptr;
  std::size_t size = 0;
  std::uint32_t index = 0;  // allocation order
};

struct Fragmentation {
  std::vector<ScenarioBlock> kept;   // even positions, still allocated
  std::vector<ScenarioBlock> freed;  // odd positions, given to free_block
  std::size_t largest = 0;           // the largest block (a hole is at most about twice that)
  std::size_t reserved_at_cap = 0;   // when the cap stopped the allocator
  std::size_t cap_after = 0;         // the lowered cap: reserved once every other block is freed
  /// Bytes of whole granules inside the freed blocks, wherever they lie (a lower bound).
  std::size_t freed_pages_at_least(std::size_t granule) const {
    std::size_t n = 0;
    for (const ScenarioBlock& b : freed) n += whole_pages_at_least(b.size, granule);
    return n;
  }
};

/// Builds the scenario on `stream` under a cap of `cap` bytes. `on_alloc(const ScenarioBlock&)`
/// runs after each allocation (a test fills the block); `free_block(k, const ScenarioBlock&)`
/// frees the k-th freed block (deallocate, or record_stream first). At most `max_blocks` blocks.
template <class OnAlloc, class FreeBlock>
Fragmentation fragment(Allocator& alloc, stream_t stream, std::size_t granule, std::size_t cap,
                       OnAlloc&& on_alloc, FreeBlock&& free_block, int device = 0,
                       std::uint32_t max_blocks = 100000) {
  Fragmentation f;
  cap_reserved(alloc, cap, device);
  std::vector<ScenarioBlock> all;
  for (std::uint32_t i = 0; i < max_blocks; ++i) {
    const std::size_t n = scenario_block_size(i, granule);
    void* p = nullptr;
    try {
      p = alloc.allocate(n, stream, device);
    } catch (const out_of_memory&) {
      break;
    }
    all.push_back({p, n, i});
    on_alloc(all.back());
    f.largest = std::max(f.largest, n);
  }
  f.reserved_at_cap = reserved_now(alloc, device);
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (i % 2 == 0) {
      f.kept.push_back(all[i]);
    } else {
      f.freed.push_back(all[i]);
      free_block(f.freed.size() - 1, f.freed.back());
    }
  }
  f.cap_after = reserved_now(alloc, device);
  cap_reserved(alloc, f.cap_after, device);
  return f;
}

}  // namespace stitch::test
