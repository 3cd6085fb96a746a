// core/expandable_ranges.hpp — expandable segments: per stream and pool, one large reserved
// virtual range whose pages are mapped on demand (at its end or into holes) instead of allocating
// new segments, and unmapped again when entirely free, under memory pressure or on empty_cache.
// With stitching, the ranges have one-granule page slots: with room they grow in coarse pages
// (PyTorch's), short of memory in fine ones, and (stitch_reuse_pages) the stream's free pages
// elsewhere are moved in before fresh ones are mapped (core/stitcher.hpp).
//
// A range's blocks tile its whole reservation; what has no physical memory is `unmapped` blocks,
// kept in the pool's unmapped set (by stream, then address).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/block_store.hpp"
#include "core/ledger.hpp"
#include "core/page_mapper.hpp"
#include "core/stitcher.hpp"
#include "stitch/config.hpp"

namespace stitch::detail {

class ExpandableRanges {
 public:
  /// All must outlive it.
  ExpandableRanges(const Config& config, BlockStore& store, PageMapper& pages, Ledger& ledger,
                   Stitcher& stitcher) noexcept
      : config_(config), store_(store), pages_(pages), ledger_(ledger), stitcher_(stitcher) {}

  /// The page of expandable ranges: coarse (PyTorch's: 2 MiB small pool, 20 MiB large pool) or
  /// fine (one granule).
  [[nodiscard]] std::size_t page_size(bool small, bool fine);
  /// Stitching only: whether a grow by `bytes` would take reserved memory past stitch_fine_above
  /// of what the device and the memory fraction allow (then growth uses fine pages and page
  /// reuse).
  [[nodiscard]] bool short_of_memory(std::size_t bytes);
  /// New memory for `rounded` bytes of `stream` in `pool`: pages mapped into the stream's range
  /// (a new range when none has room). A free block covering the request, or nullptr when the
  /// device or the memory fraction refuses. `quiet`: no free page moves (a stream may capture).
  Block* grow(BlockPool& pool, stream_t stream, std::size_t rounded, bool quiet);
  /// Unmaps and releases every whole free page, after synchronizing the range's stream, and
  /// gives wholly unmapped ranges back (pages whose unmap or release failed before first); with
  /// `keep`, only until reserved memory is at most `keep` bytes (the last pages taken from a
  /// free block's end, whole handles).
  void release_free_pages(std::size_t keep = 0);
  /// Unmaps and releases every whole free page of `segment` (a range of a graph pool without
  /// uses), after synchronizing its stream, and gives it back once wholly unmapped.
  void release_range(Segment* segment);
  /// A recorded start state: a new range of `stream` and pool with `runs` (address order) mapped
  /// in the recording's coarse pages, and `blocks` (offsets from the range's start) placed in
  /// them allocated, each handed to `activate` as soon as its run is placed. Returns the blocks
  /// (nullptr for a block of a run the device could not map; the runs before it stay).
  std::vector<Block*> seed(BlockPool& pool, stream_t stream, const std::vector<SeedRun>& runs,
                           const std::vector<SeedBlock>& blocks,
                           const std::function<void(Block*, const SeedBlock&)>& activate);

 private:
  /// PyTorch's search over chains of free and unmapped blocks, mapping pages of `unit` bytes into
  /// ranges with slots of `slot` bytes (the same, or one granule for stitching ranges).
  Block* grow_chain(BlockPool& pool, stream_t stream, std::size_t rounded, std::size_t slot,
                    std::size_t unit);
  /// The first unmapped block of `stream` (lowest address first, in ranges of `slot`-byte page
  /// slots) for which `pick(block)` names a block, that block; else the one block of a new
  /// range for `rounded` bytes (nullptr when no address space is left).
  template <typename Pick>
  Block* first_or_new(BlockPool& pool, stream_t stream, std::size_t rounded, std::size_t slot,
                      Pick&& pick);
  /// A new range of `stream` in `pool` of at least `min_bytes`, in page slots of `page` bytes.
  Segment* create(BlockPool& pool, stream_t stream, std::size_t min_bytes, std::size_t page);
  /// Maps the first `bytes` (whole slots) of the unmapped block `target`, in handles of `unit`
  /// bytes and one-slot handles for the rest, and files them free, merged with free neighbours;
  /// nullptr (nothing changed) when the device or the memory fraction cannot give them.
  Block* map_front(Block* target, std::size_t bytes, std::size_t unit);
  /// Unmaps the whole pages inside the free `block` (whole handles), or, with `want`, the fewest
  /// whole handles at the block's end that cover `want` bytes; its partial pages stay mapped as
  /// free blocks of their own.
  void unmap_free_pages(Block* block, std::size_t want = SIZE_MAX);
  /// Returns a wholly unmapped range to the device.
  bool release_if_unmapped(Segment* segment);

  const Config& config_;
  BlockStore& store_;
  PageMapper& pages_;
  Ledger& ledger_;
  Stitcher& stitcher_;
  std::size_t device_total_ = 0;  ///< the device's memory, once short_of_memory asked
};

}  // namespace stitch::detail
