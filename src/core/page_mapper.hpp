// core/page_mapper.hpp — the physical pages of expandable ranges: created, mapped, unmapped and
// released through the backend, all or nothing, and what an undo could not undo: stray mappings
// (an unmap that failed while undoing a failed map: the bookkeeping already calls the range
// unmapped) and orphaned handles (a release that failed after an unmap). Both are retried before
// the next map and before memory goes back to the device.
#pragma once

#include <cstddef>
#include <exception>
#include <utility>
#include <vector>

#include "core/block.hpp"
#include "stitch/backend.hpp"

namespace stitch::detail {

class PageMapper {
 public:
  PageMapper(Backend& backend, int device) noexcept : backend_(backend), device_(device) {}
  /// One more try for stray mappings and orphaned handles (errors dropped).
  ~PageMapper();
  PageMapper(const PageMapper&) = delete;
  PageMapper& operator=(const PageMapper&) = delete;

  /// Creates and maps page slots [first, first + count) of `segment`, `per` slots to a handle
  /// (the count % per slots at the end one to a handle): one create and one map per handle.
  /// All or nothing: false when
  /// the device is out of memory, and on a backend error it rethrows; either way every handle
  /// mapped here was unmapped and released again (or filed as stray / orphan).
  bool map(Segment& segment, std::size_t first, std::size_t count, std::size_t per = 1);
  /// Releases the handles of slots [first, last) of `segment` (just unmapped; whole handles;
  /// slots already cleared are skipped) and zeroes them; a handle whose release fails is kept as an orphan. Returns the first
  /// failure (or null).
  std::exception_ptr release(Segment& segment, std::size_t first, std::size_t last) noexcept;
  /// Releases `handle`, or keeps it as an orphan when that fails.
  void release_or_orphan(phys_handle_t handle) noexcept;
  /// Unmaps `bytes` at `va` while undoing; if that fails too, files the range as stray.
  void unmap_or_stray(char* va, std::size_t bytes) noexcept;
  /// Before mapping at [va, va + bytes): unmaps the stray ranges that overlap it, and throws
  /// (keeping them) if one fails again; the other strays get one more try, and stay stray if it
  /// fails (a stray that cannot be unmapped blocks only the addresses it covers).
  void unmap_strays_in(char* va, std::size_t bytes);
  /// One more try for every stray range and orphaned handle; what fails again is kept for later.
  void retry() noexcept;
  [[nodiscard]] const std::vector<phys_handle_t>& orphans() const noexcept { return orphans_; }

 private:
  Backend& backend_;
  const int device_;
  std::vector<phys_handle_t> orphans_;
  std::vector<std::pair<char*, std::size_t>> strays_;
};

}  // namespace stitch::detail
