// tests/support/compaction_scenario.hpp — compaction's worst case (docs/stitching.md
// "Compaction"), built the same way on every backend: under a memory cap, pairs of blocks fill
// the coarse pages of stitching ranges exactly, a 1.5-granule block at the start of every page and
// the rest of the page in a second block; the second blocks are freed and the cap set to what is
// then reserved plus `room`. The free granules after a live block can neither move nor be
// borrowed (a handle maps from its start only), so a request for every granule no live block
// touches is served by compaction alone: with `room` 0 the first page is staged through host
// memory, with a coarse page of room fresh device pages take the live data.
//
// Used by tests/compaction_test.cpp (simulated device: the expectations, checked on every test
// run), tests/cuda/cuda_compaction_test.cu (a GPU, with kernels writing and checking the live
// blocks) and benchmarks/gpu/compaction_cost.cpp (what compaction costs). Header only, C++17
// (nvcc reads it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/errors.hpp"
#include "support/stitch_scenario.hpp"

namespace stitch::test {

/// The settings of the scenario, after "backend:<name>,".
inline constexpr const char* kCompactionConf =
    "expandable_segments:True,stitching:True,stitch_compact:True";

/// The large pool's coarse page (PyTorch's 20 MiB, in whole granules).
inline std::size_t coarse_page(std::size_t granule) {
  return round_up(std::size_t{20} << 20, granule);
}

struct CoarsePages {
  std::vector<ScenarioBlock> live;  ///< one at the start of every coarse page, still allocated
  std::size_t freed = 0;            ///< blocks freed (the rest of each page)
  std::size_t granule = 0;
  std::size_t cap = 0;              ///< the cap afterwards: reserved + room
  /// Granules that some live block touches.
  [[nodiscard]] std::size_t live_granules() const {
    std::set<std::uintptr_t> touched;
    for (const ScenarioBlock& b : live) {
      const auto a = reinterpret_cast<std::uintptr_t>(b.ptr);
      for (std::uintptr_t g = a / granule; g <= (a + b.size - 1) / granule; ++g) touched.insert(g);
    }
    return touched.size();
  }
  /// Bytes of every granule under the cap that no live block touches: what the promise says one
  /// request may have.
  [[nodiscard]] std::size_t free_of_live() const {
    const std::size_t all = cap / granule, touched = live_granules();
    return all > touched ? (all - touched) * granule : 0;
  }
  /// Bytes of the live blocks' granules (what compaction copies at most).
  [[nodiscard]] std::size_t live_bytes() const { return live_granules() * granule; }
};

/// Builds the scenario on `stream` under a cap of `cap` bytes (whole granules); afterwards the
/// cap is what is reserved plus `room`. `on_alloc(const ScenarioBlock&)` runs after each kept
/// block's allocation (a test fills it). At most `max_pages` coarse pages.
template <class OnAlloc>
CoarsePages fill_coarse_pages(Allocator& alloc, stream_t stream, std::size_t granule,
                              std::size_t cap, std::size_t room, OnAlloc&& on_alloc, int device = 0,
                              std::uint32_t max_pages = 100000) {
  CoarsePages f;
  f.granule = granule;
  const std::size_t head = granule + granule / 2;
  const std::size_t tail = coarse_page(granule) - head;
  cap_reserved(alloc, cap, device);
  std::vector<void*> tails;
  for (std::uint32_t i = 0; i < max_pages; ++i) {
    void* a = nullptr;
    try {
      a = alloc.allocate(head, stream, device);
    } catch (const out_of_memory&) {
      break;
    }
    f.live.push_back({a, head, i});
    on_alloc(f.live.back());
    try {
      tails.push_back(alloc.allocate(tail, stream, device));
    } catch (const out_of_memory&) {
      break;  // the last head stays: no free page is left under the cap
    }
  }
  for (void* b : tails) alloc.deallocate(b);
  f.freed = tails.size();
  f.cap = reserved_now(alloc, device) + room;
  cap_reserved(alloc, f.cap, device);
  return f;
}

}  // namespace stitch::test
