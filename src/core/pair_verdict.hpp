// core/pair_verdict.hpp — PairVerdict: what the cache hit decided, once, about the pairs of a
// pool's held block — its front taken by the stream's next request and given back by that
// block's free, the training loop's temporaries — so that each such pair repeats no check.
//
// A held block H in front of the pool's parked block (both free memory: together one free block
// M of `merged` bytes) serves a request of r bytes, in best-fit order, when no indexed block of
// at least r bytes comes before M, M may serve r and the rest is split off: r lies in
// [min_size, min_size + span]. Taking H's front and giving it back change the statistics by
// amounts that depend only on r, the requested bytes and whether M is split; the verdict also
// bounds r and the requested bytes by the shard's room under every peak (HotStats::slack), so no
// pair can make a new peak and none looks at the peaks. The verdict holds until a change to its
// pool other than a pair voids it (`held` cleared: the cache hit's plain paths, the device lock,
// StreamShard::touch), while the board of peaks (HotStats::board) is unchanged, and while the
// other pool of its shard counts no more than `other` (the device-wide rooms assumed it: a plain
// change there that passes it voids the verdict). While one pair is taken (the shard's `taken`
// block), the other pool's pairs wait, for the same reason.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/hot_stats.hpp"

namespace stitch::detail {

struct Block;

struct PairVerdict {
  const Block* held = nullptr;   ///< the held block it was decided for (nullptr: none)
  std::size_t min_size = 0;      ///< the rounded sizes a pair may take: [min_size, min_size + span]
  std::size_t span = 0;
  std::int64_t max_requested = 0;  ///< the requested bytes a pair may count
  std::size_t merged = 0;        ///< bytes of M, the held block and the parked one after it
  /// The smallest rounded size best fit serves from M (min_size before the statistics' bounds):
  /// while the verdict holds, a smaller request goes to an indexed block.
  std::size_t fit_min = 0;
  /// What a take does to the inactive-split counters (the pair's free undoes it).
  HotStats::PairSplit split = HotStats::PairSplit::none;
  /// The other pool's counters when it was decided: the rooms it leaves assume no more there.
  std::int64_t other[kHotCounters] = {};
};

}  // namespace stitch::detail
