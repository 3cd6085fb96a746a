// core/spiller.hpp — spill and unspill of one device's expandable ranges: the live memory of a
// range moves to host pages mapped at the same addresses (PageMapper::remap with host pages made
// first), and back to fresh device pages; the free device pages of a spilled range go back to
// the device, and a host page a free leaves wholly free goes back to the host at once.
//
// What moves: whole mappings that hold live data, one host page per slot, in ranges whose page is
// a multiple of the host page size (else the range does not spill). Never moved: a range asleep,
// a graph pool's, a stitched range with borrowed memory, a mapping with a pinned or exported block
// or a lent block, and borrowed memory. A host slot always lies under a live block (its free
// returns it), so compaction, stitching and the release of free pages never meet one.
//
// The caller (core/residency.hpp) holds the device lock, has synchronized the device (and its
// peers) and checked that no graph is being captured.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/block_store.hpp"
#include "core/expandable_ranges.hpp"
#include "core/ledger.hpp"
#include "core/page_mapper.hpp"
#include "stitch/config.hpp"
#include "stitch/stats.hpp"

namespace stitch::detail {

class Spiller {
 public:
  /// All must outlive it.
  Spiller(const Config& config, int device, BlockStore& store, PageMapper& pages, Ledger& ledger,
          DeviceStats& stats, ExpandableRanges& ranges) noexcept
      : config_(config), device_(device), store_(store), pages_(pages), ledger_(ledger),
        stats_(stats), ranges_(ranges) {}

  /// One whole device mapping with live data, and the slots of it that live blocks touch.
  struct Move {
    Mapping mapping;
    std::vector<SlotRun> keep;
    std::size_t kept = 0;  ///< slots in keep
  };

  /// The back end's host page size, 0 where it has no host pages (asked once).
  [[nodiscard]] std::size_t host_granularity();
  /// Whether `s` may spill: an awake expandable range outside graph pools, with no borrowed
  /// memory, whose page the host page size divides.
  [[nodiscard]] bool may_spill(const Segment& s);
  /// The mappings of `s` that a spill would move, in address order (none where may_spill fails).
  [[nodiscard]] std::vector<Move> moves(Segment& s);
  /// Host bytes a plan takes.
  [[nodiscard]] static std::size_t host_bytes(const std::vector<Move>& plan) noexcept;
  /// Host bytes spill_limit_mb still allows (SIZE_MAX without a cap).
  [[nodiscard]] std::size_t room() const noexcept;
  /// For the out-of-memory rung, after its device synchronization: whether every stream the
  /// live blocks of `s` use (the range's own, and those record_stream added) has nothing queued
  /// since (PageMapper::stream_idle, asked now: no wait). A stream with work means another host
  /// thread launched on it meanwhile, so its memory is not provably idle and stays. `busy`
  /// remembers the streams found busy during one rung.
  [[nodiscard]] bool idle_since_sync(const Segment& s, std::vector<stream_t>& busy);

  /// Moves `plan` to host pages, all or nothing: every host page is made first (out_of_memory
  /// when the host or spill_limit_mb refuses, nothing changed); a backend error while moving
  /// brings the mappings moved so far back (backend_error). Then the free device pages of the
  /// ranges touched go back to the device. Counts one spill.
  void spill(const std::vector<Move>& plan);
  /// Brings the host pages of `s` back to fresh device pages, slot by slot, while the device
  /// (and the memory fraction) has room: true when none is left on the host. Throws
  /// backend_error (the slot being moved as it was).
  bool unspill(Segment& s);
  /// After a free in the spilled range `s`: the host pages wholly under free blocks are unmapped
  /// and released (after the range's stream is synchronized: its kernels may use them still).
  void release_freed(Segment& s);
  /// Bytes of host pages under `s`.
  [[nodiscard]] static std::size_t spilled_bytes(const Segment& s) noexcept {
    return static_cast<std::size_t>(s.spilled) * s.page;
  }
  /// Bytes of live blocks (neither free, unmapped nor lent) on the host pages of `s`: allocated,
  /// but not in the device's memory (the out-of-memory report's device accounting).
  [[nodiscard]] static std::size_t live_bytes_on_host(const Segment& s) noexcept;

 private:
  /// Books a done remap of `m` to the host (or back, `to_host` false) in the ledger, the page
  /// table and the store (the free slots of a mapping leave their free blocks).
  void book(const Move& m, bool to_host) noexcept;
  /// Host slot `i` of `s` back on a fresh device page; false when the device (or the memory
  /// fraction) has no room. Throws backend_error, the slot as it was.
  bool unspill_slot(Segment& s, std::size_t i);

  const Config& config_;
  const int device_;
  BlockStore& store_;
  PageMapper& pages_;
  Ledger& ledger_;
  DeviceStats& stats_;
  ExpandableRanges& ranges_;
  std::size_t host_granularity_ = SIZE_MAX;  ///< SIZE_MAX: not asked yet
};

}  // namespace stitch::detail
