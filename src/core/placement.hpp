// core/placement.hpp — blocks put where a recording had them: for replays, a recorded start state
// (plain segments and expandable ranges with their live blocks) and the release of one cached
// segment, as a recording allocator's garbage collection or oversize release did; for PyTorch, a
// block at an exact address (allocateWithAddress, cudagraph trees' checkpoints). The device's
// entry points for them, each under the device lock, over the view of the device it is handed
// (core/device_view.hpp).
#pragma once

#include <cstddef>
#include <vector>

#include "core/block.hpp"
#include "core/block_store.hpp"
#include "core/device_view.hpp"
#include "stitch/backend.hpp"

namespace stitch::detail {

class Placement {
 public:
  explicit Placement(const DeviceView& device) noexcept : d_(device) {}
  Placement(const Placement&) = delete;
  Placement& operator=(const Placement&) = delete;

  /// A plain segment of `bytes` in the small or large pool of `stream`, with `blocks` (address
  /// order, inside it, not overlapping) allocated and the rest free, as if the blocks had been
  /// allocated and their neighbours freed. Returns the blocks' pointers in order; empty when
  /// the device cannot give the segment (nothing changed then).
  std::vector<void*> seed_segment(stream_t stream, bool small, std::size_t bytes,
                                  const std::vector<SeedBlock>& blocks);
  /// A new expandable range of `stream` and pool with `runs` (address order) mapped and
  /// `blocks` allocated in them. Returns the blocks' pointers in order (nullptr for a block of a
  /// run the device could not map; the runs before it stay).
  std::vector<void*> seed_expandable(stream_t stream, bool small, const std::vector<SeedRun>& runs,
                                     const std::vector<SeedBlock>& blocks);
  /// A block of `block_bytes` serving `requested` bytes at exactly `addr` for `stream`, cut from
  /// the free block of `stream` that holds it (PyTorch's allocateWithAddress, and a cudagraph
  /// tree's checkpoint restored); nullptr, with nothing changed, when no such free block holds
  /// all of it.
  void* allocate_at(void* addr, std::size_t block_bytes, std::size_t requested, stream_t stream);
  /// Returns one entirely free plain segment of exactly `bytes` on `stream` to the device (the
  /// one with the lowest address); false if there is none.
  bool release_free_segment(stream_t stream, std::size_t bytes);
  /// The page size of expandable ranges in the small or large pool.
  [[nodiscard]] std::size_t expandable_page(bool small);

 private:
  /// A placed block becomes live.
  void seeded(Block* block, const SeedBlock& seed);

  const DeviceView& d_;
};

}  // namespace stitch::detail
