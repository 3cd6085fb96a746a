// core/page_table.hpp — the page slots of one expandable range: which physical handle backs
// each slot (0: unmapped) and at which slot of that handle (its piece), and at each mapping's
// first slot how many slots that one map call covers. A mapping covers one slot or, for the
// coarse pages of a stitching range, several consecutive ones (a whole handle). Borrowed memory
// (stitcher.cpp) maps part of another range's coarse page, from its piece on. A slot may map host
// memory (spilled, core/spiller.hpp): then its handle is a one-slot host page.
//
// Cost: a range reserves 1 1/8 of the device, but storage grows only with the highest slot ever
// mapped (doubling, capped at the range): creating a range touches no memory, and a slot beyond
// the storage reads as unmapped. Lookups are O(1); set() is O(slots set) and never allocates.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/assert.hpp"
#include "stitch/backend.hpp"

namespace stitch::detail {

/// Slots [first, first + count) of a range.
struct SlotRun {
  std::size_t first;
  std::size_t count;
};

class PageTable {
 public:
  /// `slots` slots, all unmapped (frees the storage).
  void reset(std::size_t slots) noexcept {
    handles_ = {};
    extents_ = {};
    pieces_ = {};
    host_ = {};
    slots_ = slots;
  }
  [[nodiscard]] std::size_t slots() const noexcept { return slots_; }
  /// Slots with storage: every mapped slot lies below.
  [[nodiscard]] std::size_t stored() const noexcept { return handles_.size(); }

  [[nodiscard]] phys_handle_t handle(std::size_t i) const noexcept {
    return i < handles_.size() ? handles_[i] : 0;
  }
  /// At a mapping's first slot, the slots it covers; 0 elsewhere and where unmapped.
  [[nodiscard]] std::size_t extent(std::size_t i) const noexcept {
    return i < extents_.size() ? extents_[i] : 0;
  }
  /// Which slot of its handle slot `i` is (0 for a one-slot handle and a coarse page's first).
  [[nodiscard]] std::size_t piece(std::size_t i) const noexcept {
    return i < pieces_.size() ? pieces_[i] : 0;
  }

  /// Whether slot `i` maps a host page (spilled).
  [[nodiscard]] bool host(std::size_t i) const noexcept { return i < host_.size() && host_[i] != 0; }
  /// Marks slots [first, first + count) (mapped, with storage) as host pages or device pages.
  void set_host(std::size_t first, std::size_t count, bool host) noexcept {
    STITCH_ASSERT(first + count <= host_.size(), "PageTable::set_host: slots with storage");
    for (std::size_t i = first; i < first + count; ++i) host_[i] = host ? 1 : 0;
  }

  /// Storage for the slots below `end` (at most slots()), so that set() there cannot fail.
  /// Throws std::bad_alloc, changing nothing.
  void make_room(std::size_t end) {
    STITCH_ASSERT(end <= slots_, "PageTable::make_room: inside the range");
    if (end <= handles_.size()) return;
    const std::size_t n = std::min(slots_, std::max(end, 2 * handles_.size()));
    handles_.reserve(n);
    extents_.reserve(n);
    pieces_.reserve(n);
    host_.reserve(n);
    handles_.resize(n, 0);
    extents_.resize(n, 0);
    pieces_.resize(n, 0);
    host_.resize(n, 0);
  }

  /// Slots [first, first + count) mapped by one call to `handle` from its slot `piece` on, or
  /// unmapped when `handle` is 0 (a device page: set_host marks host ones). Mapping needs
  /// make_room(first + count) first; unmapping slots without storage is a no-op.
  void set(std::size_t first, std::size_t count, phys_handle_t handle,
           std::size_t piece = 0) noexcept {
    STITCH_ASSERT(handle == 0 || first + count <= handles_.size(),
                  "PageTable::set: make_room before mapping");
    STITCH_ASSERT(piece + count <= UINT16_MAX, "PageTable::set: at most 65535 slots a handle");
    const std::size_t end = std::min(first + count, handles_.size());
    for (std::size_t i = first; i < end; ++i) {
      handles_[i] = handle;
      extents_[i] = 0;
      pieces_[i] = handle != 0 ? static_cast<std::uint16_t>(piece + (i - first)) : 0;
      host_[i] = 0;
    }
    if (handle != 0) extents_[first] = static_cast<std::uint16_t>(count);
  }

  /// The first slot of the mapping covering slot `i` (mapped).
  [[nodiscard]] std::size_t head_of(std::size_t i) const noexcept {
    while (extent(i) == 0 && i > 0 && handle(i - 1) == handle(i)) --i;
    return i;
  }

  /// [first, last) shrunk to the whole mappings inside it (slots of mapped memory): a mapping
  /// that began before `first` cannot go, so start after it; one that ends after `last` cannot
  /// either, so stop at its first slot.
  void whole_handles(std::size_t& first, std::size_t& last) const noexcept {
    if (first < last && extent(first) == 0) {
      const std::size_t head = head_of(first);
      first = std::min(last, head + extent(head));
    }
    if (first < last) {
      const std::size_t head = head_of(last - 1);
      if (head + extent(head) > last) last = std::max(first, head);
    }
  }

 private:
  std::vector<phys_handle_t> handles_;
  std::vector<std::uint16_t> extents_;
  std::vector<std::uint16_t> pieces_;
  std::vector<std::uint8_t> host_;
  std::size_t slots_ = 0;
};

}  // namespace stitch::detail
