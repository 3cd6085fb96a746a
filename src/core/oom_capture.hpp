// core/oom_capture.hpp — what a device hands up when a request fails: the facts of the report
// and, when a what-if check is due (replay/what_if.hpp), the raw material of the workload it
// replays. Captured under the device lock; the check and the report are made after it is
// released, by the caller (Allocator::allocate).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "diagnostics/oom_report.hpp"
#include "stitch/config.hpp"
#include "stitch/snapshot.hpp"

namespace stitch::detail {

/// Most recorded entries the check replays. A longer history is not replayed: the check then
/// starts from the blocks live now (and says so). 100000 is the default max_entries.
inline constexpr std::size_t kWhatIfMaxEvents = 100000;

/// Where the replayed workload comes from.
enum class WhatIfSource {
  history,     ///< the recorded events since the device was empty
  /// The blocks the device holds now (allocated or waiting for streams), each segment rebuilt
  /// in address order with its free blocks between them, which are freed at the end: the
  /// device's layout now, as far as the replayed configuration allows.
  live_blocks
};

/// What the check needs from the failing device.
struct WhatIfInput {
  Config config;                 ///< the device's configuration when the request failed
  std::size_t granularity = std::size_t{2} << 20;  ///< the device's page size
  bool virtual_memory = true;    ///< the device supports expandable segments
  std::uintptr_t stream = 0;     ///< the failing request's stream (its size is in OomFacts)
  WhatIfSource source = WhatIfSource::history;
  std::vector<TraceEntry> history;      ///< history: the recorded entries, oldest first
  /// live_blocks: every mapped run of every segment (as snapshot segments), oldest segment first.
  std::vector<SegmentSnapshot> layout;
  std::string fallback_reason;      ///< why the history was not used (live_blocks only)
  std::string not_run;              ///< set: the check does not run, for this reason
};

/// A failed request, as the device saw it.
struct OomCapture {
  OomFacts facts;
  std::shared_ptr<const WhatIfInput> what_if;  ///< null: no check (see capture_failed)
  bool capture_failed = false;                 ///< a check was due but its input was not captured
  bool what_if_enabled = true;                 ///< oom_what_if was on
};

}  // namespace stitch::detail
