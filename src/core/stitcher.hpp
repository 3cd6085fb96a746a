// core/stitcher.hpp — virtual-memory stitching (stitching:True): plans which whole free pages of
// expandable ranges to take (the requesting stream's own, fresh ones, other streams', and the
// free part of partly used coarse pages, borrowed) and moves them, all or nothing, into a new
// range for one request (stitch) or into a range that grows (map_reused_pages,
// stitch_reuse_pages). It changes the blocks through the block store, the pages through the page
// mapper, and books both in the ledger; see stitcher.cpp for the policy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "core/block.hpp"
#include "core/block_store.hpp"
#include "core/ledger.hpp"
#include "core/page_mapper.hpp"
#include "stitch/backend.hpp"
#include "stitch/stats.hpp"

namespace stitch::detail {

/// Whole pages [first, first + count) (page indices in its segment) inside a free block.
struct PageRun {
  Block* block;
  std::size_t first;
  std::size_t count;
};

class Stitcher {
 public:
  /// Works on `store`'s blocks, maps with `pages`, books in `ledger` and counts its stitches,
  /// page reuses and borrows in `stats`; all must outlive it.
  Stitcher(BlockStore& store, PageMapper& pages, Ledger& ledger, DeviceStats& stats) noexcept
      : store_(store), pages_(pages), ledger_(ledger), stats_(stats) {}
  Stitcher(const Stitcher&) = delete;
  Stitcher& operator=(const Stitcher&) = delete;

  /// Stitches a range for `rounded` bytes of `stream` in `pool` from free pages of its tag (own
  /// stream, fresh, other streams); with `own_only`, from the stream's own free pages alone.
  /// Returns the range's one free block (in the index); nullptr when the pages are too few.
  Block* stitch(BlockPool& pool, stream_t stream, std::size_t rounded, bool own_only);
  /// Grows `target` (an unmapped block of a one-granule expandable range) by its first `count`
  /// pages, using the stream's whole free pages first and fresh pages for the rest
  /// (stitch_reuse_pages). False when the device or the memory fraction cannot give the fresh
  /// pages; nothing changed then.
  bool map_reused_pages(Block* target, std::size_t count);
  /// The granules such a stitch would find, up to what it needs: whole free pages, fresh pages,
  /// then borrowed ones (at most the shortfall). Plans only: nothing moves.
  [[nodiscard]] std::size_t pages_within_reach(stream_t stream, std::size_t rounded);

 private:
  /// A page moved out of its segment: where it was (its first slot), its physical handle and
  /// the slots it covers.
  struct MovedPage {
    Segment* segment;
    std::size_t index;
    phys_handle_t handle;
    std::size_t slots;
    std::size_t piece = 0;   ///< the handle's slot mapped first (borrowed memory: any)
    Block* lent = nullptr;   ///< borrowed memory: the lent block the mapping belongs to
  };
  /// Free granules of a partly used coarse page: slots [first, first + count) of `segment`, in
  /// one mapping.
  struct Lendable {
    Segment* segment;
    std::size_t first;
    std::size_t count;
  };
  /// What a stitch of `pages` granules for `stream` can take (own_only: the stream's own pages
  /// and borrowed memory alone): steps 1-3 of stitch().
  struct Supply {
    std::vector<PageRun> own;
    std::map<stream_t, std::vector<PageRun>> others;
    std::map<stream_t, std::size_t> other_pages;
    std::size_t own_total = 0, other_total = 0, fresh_limit = 0;
    std::vector<Lendable> borrow;
    std::size_t borrowed = 0;
    [[nodiscard]] std::size_t found() const noexcept { return own_total + fresh_limit + other_total; }
  };
  Supply supply(stream_t stream, std::size_t pages, bool own_only, std::uint16_t tag);
  /// Every run of free granules on coarse pages that live blocks share (of `stream` only with
  /// `own_only`). A borrowed mapping's free part may be borrowed again (a third mapping). None
  /// for tagged memory (`tag` not 0).
  std::vector<Lendable> lendable_runs(stream_t stream, bool own_only, std::uint16_t tag) const;
  /// The whole free pages of one-granule expandable ranges (both pools of region tag `tag`):
  /// `stream`'s own in
  /// `own`, other streams' in `others` (when given). Skips `skip_a` and `skip_b`, and, without
  /// `with_borrowed`, ranges that borrow memory (its second mapping may move to another stitched
  /// range only). Returns the pages found.
  std::size_t free_page_runs(stream_t stream, std::vector<PageRun>& own,
                             std::map<stream_t, std::vector<PageRun>>* others,
                             bool with_borrowed, std::uint16_t tag,
                             const Block* skip_a = nullptr, const Block* skip_b = nullptr);
  /// Unmaps the runs of `plan` where they are (their handles stay alive), appending each page to
  /// `moved` and each stitched segment touched to `sources`. On a failure, maps every page moved
  /// so far back and rethrows.
  void move_out(const std::vector<PageRun>& plan, std::vector<MovedPage>& moved,
                std::vector<Segment*>& sources);
  /// Maps the moved pages, then the fresh ones (one slot each), side by side into `dest` from
  /// slot `first` (one map_run), and enters them in its page table. On a failure maps the moved
  /// pages back where they were, releases the fresh ones and rethrows, or returns false when
  /// the device ran out of memory while mapping.
  [[nodiscard]] bool map_side_by_side(Segment& dest, std::size_t first, const std::vector<MovedPage>& moved,
                        const std::vector<phys_handle_t>& fresh);
  /// Dissolves the stitched segments among `sources` that no longer hold a mapped page.
  void dissolve_emptied(const std::vector<Segment*>& sources) noexcept;
  /// Undo of a move: maps `handle` again at page `index` of `segment` and files it free.
  void map_back(const MovedPage& page) noexcept;
  /// Gives back an unused, wholly unmapped stitching range (or keeps it as an empty stitched
  /// segment when that fails, in `space`: BlockStore::prepare_segment's, taken before the range
  /// was reserved).
  void release_or_keep(BlockPool& pool, stream_t stream, void* va, std::size_t bytes,
                       std::size_t page, std::unique_ptr<Segment>& space) noexcept;

  BlockStore& store_;
  PageMapper& pages_;
  Ledger& ledger_;
  DeviceStats& stats_;
};

}  // namespace stitch::detail
