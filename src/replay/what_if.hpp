// replay/what_if.hpp — the out-of-memory what-if check: replays the failing device's workload
// (replay/engine.hpp) on a fresh simulated device under other configurations (expandable
// segments, stitching) and names in the report only those that served the request.
//
// The device allocator captures the workload's raw material under its lock (core/oom_capture.hpp)
// and returns it with the failure; Allocator::allocate runs the check after the device lock is
// released (oom_message) and throws the finished report. The replay drives its own allocator on
// its own SimBackend, so it takes no lock of the failing allocator.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "core/oom_capture.hpp"
#include "replay/workload.hpp"

namespace stitch::replay {

/// How one configuration fared in the replay.
struct WhatIfOutcome {
  std::string change;  ///< the keys added to the device's configuration ("" for none)
  bool served = false;  ///< the failing request was served
  /// The workload failed before the request, at this event (SIZE_MAX: it did not).
  std::size_t failed_at = SIZE_MAX;
  std::size_t copied = 0;  ///< live bytes compaction copied in the replay (stitch_compact)
};

/// The result of a check.
struct WhatIfResult {
  detail::WhatIfSource source = detail::WhatIfSource::history;
  std::size_t events = 0;     ///< workload events replayed before the request
  std::size_t live_blocks = 0;  ///< live_blocks: blocks held now (allocated or pending)
  std::size_t free_blocks = 0;  ///< live_blocks: free blocks between them, recreated
  std::size_t capacity = 0;   ///< the simulated device's size
  std::optional<std::size_t> allowed;  ///< the memory-fraction cap applied on it
  std::string fallback_reason;
  WhatIfOutcome current;      ///< the device's own configuration, replayed the same way
  std::vector<WhatIfOutcome> candidates;
};

/// The workload the check replays:
/// - history: each `alloc`, each free at its `free_completed`, earlier failed requests (`oom`
///   entries, tried again), and an empty_cache() where memory was given back (events_from_trace);
/// - live blocks: each mapped run allocated once at its full size (large pool) and freed, then
///   its blocks, live and free, in address order; at the end the blocks free now are freed.
/// Only events that act are kept. `live_blocks` and `free_blocks` receive the layout's counts.
DeviceWorkload what_if_workload(const detail::WhatIfInput& input, std::size_t* live_blocks = nullptr,
                                std::size_t* free_blocks = nullptr);

/// The changes to `config` worth checking, as configuration strings: expandable_segments:True
/// and expandable_segments:True,stitching:True, less what is already on.
std::vector<std::string> what_if_changes(const Config& config);

/// Replays `workload` and then the failing request on a fresh simulated device with the
/// capacity the failing allocator could use, under `input.config` plus `change`. Throws what the
/// replay throws (a backend_error of the simulator, bad_alloc).
WhatIfOutcome replay_what_if(const detail::OomFacts& facts, const detail::WhatIfInput& input,
                             const DeviceWorkload& workload, const std::string& change);

/// Runs the replay for the device's configuration and for each of what_if_changes().
WhatIfResult check_what_if(const detail::OomFacts& facts, const detail::WhatIfInput& input);

/// The report's what-if paragraph for a finished check.
std::string format_what_if(const WhatIfResult& result);

/// The report's what-if paragraph when no check runs ("" where the verdict says it all).
/// `enabled`: oom_what_if; `capture_failed`: a check was due but its input was not captured.
std::string what_if_not_run(const detail::OomFacts& facts, bool enabled, bool capture_failed);

/// The whole out-of-memory report for a failure: the facts, and the what-if paragraph — the
/// check is run here when the capture carries its input (with the reason in the report if the
/// replay failed, or without the check if the check itself could not be completed). "" only if
/// even the report could not be written. Never throws.
std::string oom_message(const detail::OomCapture& capture) noexcept;

}  // namespace stitch::replay
