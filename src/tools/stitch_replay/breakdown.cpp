// tools/stitch_replay/breakdown.cpp — splits up reserved-minus-requested at a replay's peak of reserved
// memory: rounding, pending frees, plain segments, partly used pages, whole free pages.
#include "tools/stitch_replay/breakdown.hpp"

#include <fmt/format.h>

#include <map>

#include "stitch/config.hpp"

namespace stitch::replay_cli {

namespace {
constexpr std::size_t kMiB = std::size_t{1} << 20;
}  // namespace

PeakBreakdown breakdown_at_peak(const DeviceWorkload& trace, const ReplayOptions& options,
                                const ReplayResult& peak) {
  PeakBreakdown b;
  b.event = peak.peak_reserved_event;
  const Snapshot snap = snapshot_after(trace, options, b.event, b.requested);
  const Config config =
      Config::parse(options.config.empty() ? "backend:sim" : "backend:sim," + options.config);
  // The main stream: the one holding the most reserved memory.
  std::map<std::uintptr_t, std::size_t> by_stream;
  for (const SegmentSnapshot& s : snap.segments) by_stream[s.stream] += s.total_size;
  std::uintptr_t main_stream = 0;
  std::size_t most = 0;
  for (const auto& [stream, bytes] : by_stream) {
    if (bytes > most) {
      most = bytes;
      main_stream = stream;
    }
  }
  for (const SegmentSnapshot& s : snap.segments) {
    b.reserved += s.total_size;
    const bool small = s.segment_type == "small";
    // A snapshot segment of an expandable range is one mapped run: it starts on a page boundary.
    const std::size_t page = small || config.stitching ? 2 * kMiB : 20 * kMiB;
    for (const BlockSnapshot& block : s.blocks) {
      if (block.state == "active_allocated") {
        b.rounding += block.size - block.requested_size;
      } else if (block.state == "active_pending_free") {
        b.pending += block.size;
      } else if (!s.is_expandable) {
        b.plain_free += block.size;
      } else {
        const std::size_t offset = block.address - s.address;
        const std::size_t first = (offset + page - 1) / page * page;
        const std::size_t last = (offset + block.size) / page * page;
        const std::size_t whole = last > first ? last - first : 0;
        b.partial_pages += block.size - whole;
        if (s.stream != main_stream) {
          b.whole_pages_other_streams += whole;
        } else if (small) {
          b.whole_pages_small += whole;
        } else {
          b.whole_pages_large += whole;
        }
      }
    }
  }
  return b;
}

std::string format_breakdown(const PeakBreakdown& b) {
  auto mib = [](std::size_t bytes) { return static_cast<double>(bytes) / kMiB; };
  return fmt::format(
      "at event {}: reserved {:.0f} MiB, requested {:.0f} MiB, excess {:.0f} MiB = rounding {:.0f}"
      " + pending {:.0f} + plain segments {:.0f} + partly used pages {:.0f} + whole free pages"
      " (main stream: small {:.0f}, large {:.0f}; other streams {:.0f})",
      b.event, mib(b.reserved), mib(b.requested), mib(b.reserved - b.requested), mib(b.rounding),
      mib(b.pending), mib(b.plain_free), mib(b.partial_pages), mib(b.whole_pages_small),
      mib(b.whole_pages_large), mib(b.whole_pages_other_streams));
}

}  // namespace stitch::replay_cli
