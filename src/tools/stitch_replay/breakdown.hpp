// tools/stitch_replay/breakdown.hpp — where the reserved-but-not-requested memory lies at the moment a
// replay's reserved memory peaks (stitch-replay --breakdown).
#pragma once

#include <cstddef>
#include <string>

#include "tools/stitch_replay/replayer.hpp"

namespace stitch::replay_cli {

// The command line tool over the replay engine (src/replay): its names are used here as ours.
using namespace stitch::replay;

/// reserved - requested at the peak, split up; the parts add up to `reserved - requested`.
struct PeakBreakdown {
  std::size_t event = 0;      ///< events replayed when reserved last rose to its peak
  std::size_t reserved = 0;   ///< reserved bytes then
  std::size_t requested = 0;  ///< live requested bytes then
  std::size_t rounding = 0;   ///< allocated blocks: size minus requested size
  std::size_t pending = 0;    ///< blocks freed but waiting for other streams' events
  std::size_t plain_free = 0;  ///< free blocks of plain (cudaMalloc) segments
  /// Free bytes of expandable ranges on pages shared with a live block (or with the edge of a
  /// mapped run): memory no page move can take.
  std::size_t partial_pages = 0;
  /// Whole free pages of expandable ranges, of the stream holding the most memory (the main
  /// stream), by pool, and of all other streams.
  std::size_t whole_pages_small = 0;
  std::size_t whole_pages_large = 0;
  std::size_t whole_pages_other_streams = 0;
};

/// Replays `trace` under `options` to the peak of reserved memory (found by `peak`, a replay
/// with the same options) and splits up the excess. Page sizes follow the configuration:
/// 2 MiB (the granule) in the small pool and, with stitching, in the large pool; 20 MiB else.
PeakBreakdown breakdown_at_peak(const DeviceWorkload& trace, const ReplayOptions& options,
                                const ReplayResult& peak);

/// One line: "excess X MiB = rounding ... + ...".
std::string format_breakdown(const PeakBreakdown& b);

}  // namespace stitch::replay_cli
