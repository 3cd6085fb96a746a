// core/compactor.hpp — compaction (stitch_compact:True): when even the last stitch cannot serve a
// request, the live granules of partly used coarse pages are copied into fresh one-granule pages
// mapped at the same addresses (PageMapper::remap), so each such page's free granules become free
// device memory for the stitch, and every pointer stays valid.
//
// Which pages, and in what order: the coarse pages (one handle over several granule slots) of
// ranges made with stitching that hold both live and free granules (a granule any block other
// than a free one touches is live), best first by granules freed per granule copied, as long as
// the device (and the memory fraction) can give the fresh pages for the live ones (else the best
// page's live data is staged through host memory, its own release making the room); and no more
// than the stitch needs. Never moved: a page with a pinned block (stitch_pin), a page with a lent
// block (its free start is mapped a second time into a stitched range), and a second mapping of
// borrowed memory. The device is synchronized first (and, with peer_access, every device), once
// per request. The caller makes sure that no stream captures and no private-pool route is
// underway, and relies on the rule that no other host thread launches work on stitch memory of
// this device while an allocation runs (docs/stitching.md, "Compaction").
#pragma once

#include <cstddef>
#include <vector>

#include "core/block_store.hpp"
#include "core/ledger.hpp"
#include "core/page_mapper.hpp"
#include "core/stitcher.hpp"
#include "stitch/config.hpp"
#include "stitch/stats.hpp"

namespace stitch::detail {

class Compactor {
 public:
  /// All must outlive it.
  Compactor(const Config& config, BlockStore& store, PageMapper& pages, Ledger& ledger,
            Stitcher& stitcher, DeviceStats& stats) noexcept
      : config_(config), store_(store), pages_(pages), ledger_(ledger), stitcher_(stitcher),
        stats_(stats) {}

  /// A coarse page that may be emptied: its whole mapping, the runs of live granules kept (the
  /// rest is freed) and their counts.
  struct Candidate {
    Mapping mapping;
    std::vector<SlotRun> keep;
    std::size_t live = 0;  ///< granules copied
    std::size_t free = 0;  ///< granules freed
  };
  /// The pages that may be emptied now, best first: most granules freed per granule copied (a
  /// wholly free page first), then the most freed, then address order.
  [[nodiscard]] std::vector<Candidate> candidates() const;
  /// Empties pages, best first, until a stitch of `rounded` bytes for `stream` would find enough
  /// memory. True when it emptied a page and the stitch would now find enough; false when it
  /// could not (then the pages emptied so far stay emptied, which is a consistent state). A
  /// backend error before a page's old mapping goes is caught: that page is as it was, and the
  /// request fails with the out-of-memory report.
  bool compact(stream_t stream, std::size_t rounded);

 private:
  /// Remaps `c` (`stage`: through host memory) and books it; false when the device cannot give
  /// the fresh pages (nothing changed). Throws backend_error (nothing changed).
  bool empty(const Candidate& c, bool stage);

  const Config& config_;
  BlockStore& store_;
  PageMapper& pages_;
  Ledger& ledger_;
  Stitcher& stitcher_;
  DeviceStats& stats_;
};

}  // namespace stitch::detail
