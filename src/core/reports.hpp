// core/reports.hpp — what one device says about itself: its statistics and their resets, its
// snapshot and segments, the trace observer, the largest request that would succeed now, and the
// count of invalid frees. The device's entry points for them, each under the device lock, over
// the view of the device it is handed (core/device_view.hpp) and the tags' names (Residency).
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "core/device_view.hpp"
#include "stitch/snapshot.hpp"
#include "stitch/stats.hpp"

namespace stitch::detail {

class Residency;

class Reports {
 public:
  Reports(const DeviceView& device, const Residency& residency) noexcept
      : d_(device), residency_(residency) {}
  Reports(const Reports&) = delete;
  Reports& operator=(const Reports&) = delete;

  /// The statistics, after retiring the cross-stream events that have completed (so a block
  /// whose streams are done counts as free, not active, whether or not an allocation came since).
  [[nodiscard]] DeviceStats stats();
  /// Appends this device's segments to `out` and returns its trace (records a `snapshot`).
  std::vector<TraceEntry> snapshot(std::vector<SegmentSnapshot>& out);
  /// Appends this device's segments to `out` (no trace entry).
  void segments(std::vector<SegmentSnapshot>& out);
  /// Shows every trace event of this device to `observer` from now on (empty: none), under the
  /// device lock (Allocator::set_trace_observer).
  void observe(std::function<void(const TraceEntry&)> observer);
  /// The largest request that would succeed now without freeing live memory: a free block, the
  /// device's room within the cap, or (stitching) the pages a stitch would find.
  [[nodiscard]] std::size_t largest_request();
  void reset_peak_stats();
  void reset_accumulated_stats();
  void count_invalid_free();
  void count_failed_free();

 private:
  const DeviceView& d_;
  const Residency& residency_;
};

}  // namespace stitch::detail
