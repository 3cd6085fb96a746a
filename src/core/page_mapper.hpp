// core/page_mapper.hpp — the physical pages of expandable ranges: created, mapped, unmapped and
// released through the backend, all or nothing, and what an undo could not undo: stray mappings
// (an unmap that failed while undoing a failed map: the bookkeeping already calls the range
// unmapped) and orphaned handles (a release that failed after an unmap). Both are retried before
// the next map and before memory goes back to the device.
//
// Split pages. A coarse page (one handle over several slots) can only move or go back whole, so
// its free part is lost to stitching while one byte of it is in use. When memory runs short the
// stitcher splits it: the device idle, its one mapping is replaced by one mapping per slot (a
// piece) at the same addresses, so the data stays where it was and each free piece can move on
// its own. A piece unmapped for good cannot give its memory back while its handle's other pieces
// are mapped: it is kept as a loose piece (still reserved, in the large pool's count) and is the
// first page handed out for new memory; the handle is released once all its pieces are loose.
#pragma once

#include <cstddef>
#include <exception>
#include <utility>
#include <vector>

#include "core/block.hpp"
#include "core/ledger.hpp"
#include "stitch/backend.hpp"

#include <unordered_map>

namespace stitch::detail {

/// One slot's worth of physical memory: slot `piece` of `handle` (0 for a one-slot handle).
struct Piece {
  phys_handle_t handle = 0;
  std::size_t piece = 0;
};

class PageMapper {
 public:
  PageMapper(Backend& backend, int device, Ledger& ledger) noexcept
      : backend_(backend), device_(device), ledger_(ledger) {}
  /// One more try for stray mappings and orphaned handles (errors dropped).
  ~PageMapper();
  PageMapper(const PageMapper&) = delete;
  PageMapper& operator=(const PageMapper&) = delete;

  /// Creates and maps page slots [first, first + count) of `segment`, `per` slots to a handle
  /// (the count % per slots at the end one to a handle): one create and one map per handle;
  /// one-slot pages are loose pieces first. All or nothing: false when the device is out of
  /// memory, and on a backend error it rethrows; either way every handle mapped here was
  /// unmapped and released again (or filed as stray / orphan, or loose again).
  bool map(Segment& segment, std::size_t first, std::size_t count, std::size_t per = 1);
  /// Releases the handles of slots [first, last) of `segment` (just unmapped; whole mappings)
  /// and zeroes them; a piece of a split page becomes loose, and a handle whose release fails
  /// is kept as an orphan. Returns the first failure (or null).
  std::exception_ptr release(Segment& segment, std::size_t first, std::size_t last) noexcept;

  /// Splits the coarse page mapped at slot `head` of `segment` (a stitching range) into one
  /// mapping per slot, at the same addresses. Nothing may use the page meanwhile: the caller
  /// synchronizes the device first. Returns the map calls made. On a backend error the page is
  /// mapped whole again and the error rethrown; if even that fails, the error says so and the
  /// page's memory is lost to its blocks.
  std::size_t split(Segment& segment, std::size_t head);
  [[nodiscard]] bool is_split(phys_handle_t handle) const noexcept {
    return !split_.empty() && split_.count(handle) != 0;
  }
  /// A one-slot page of `bytes` (the granularity) for new memory: a loose piece if there is
  /// one, else a fresh handle ({0, 0} when the device is out of memory).
  Piece fresh_page(std::size_t bytes);
  /// Loose pieces, which fresh_page hands out before it creates a handle.
  [[nodiscard]] std::size_t loose_pieces() const noexcept { return loose_.size(); }
  /// Gives back a one-slot page that is mapped nowhere (a fresh page not used after all, a
  /// piece that could not be mapped back): a piece becomes loose, a handle is released.
  void give_back(Piece page, std::size_t bytes) noexcept;
  /// Every loose piece (for validate).
  [[nodiscard]] const std::vector<Piece>& loose() const noexcept { return loose_; }
  /// The pieces of a split handle (0 for a handle that is not split).
  [[nodiscard]] std::size_t pieces_of(phys_handle_t handle) const noexcept {
    auto it = split_.find(handle);
    return it == split_.end() ? 0 : it->second.pieces;
  }
  /// Releases `handle`, or keeps it as an orphan when that fails.
  void release_or_orphan(phys_handle_t handle) noexcept;
  /// Unmaps `bytes` at `va` while undoing; if that fails too, files the range as stray.
  void unmap_or_stray(char* va, std::size_t bytes) noexcept;
  /// Retries the unmap of every stray range; throws (keeping the rest) if one fails again.
  void unmap_strays();
  /// Retries the release of every orphaned handle; throws (keeping the rest) if one fails again.
  void release_orphans();
  [[nodiscard]] const std::vector<phys_handle_t>& orphans() const noexcept { return orphans_; }

 private:
  struct SplitPage {
    std::size_t pieces = 0;  ///< slots of the handle
    std::size_t loose = 0;   ///< of them, mapped nowhere
  };
  /// `page` (a piece of a split handle, `bytes` long, just unmapped) is loose from now on; the
  /// handle is released when that was its last mapped piece.
  void make_loose(Piece page, std::size_t bytes) noexcept;

  Backend& backend_;
  const int device_;
  Ledger& ledger_;
  std::unordered_map<phys_handle_t, SplitPage> split_;
  std::vector<Piece> loose_;  ///< capacity kept for every piece of every split handle
  std::size_t split_pieces_ = 0;  ///< pieces of all split handles
  std::size_t piece_bytes_ = 0;   ///< the size of a piece (the granularity)
  std::vector<phys_handle_t> orphans_;
  std::vector<std::pair<char*, std::size_t>> strays_;
};

}  // namespace stitch::detail
