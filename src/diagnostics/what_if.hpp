// diagnostics/what_if.hpp — the out-of-memory what-if check: replays the failing device's
// workload on a fresh simulated device under other configurations (expandable segments,
// stitching) and names in the report only those that served the request.
//
// The device allocator captures the workload under its lock (DeviceAllocator::what_if_input) and
// throws a PendingOom; Allocator::allocate runs the check after the device lock is released
// (complete_oom_report) and throws the finished report. The replay drives its own Allocator on
// its own SimBackend, so it takes no lock of the failing allocator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "diagnostics/oom_report.hpp"
#include "stitch/config.hpp"
#include "stitch/errors.hpp"

namespace stitch::detail {

/// Most recorded entries the check replays. A longer history is not replayed: the check then
/// starts from the blocks live now (and says so). 100000 is the default max_entries.
inline constexpr std::size_t kWhatIfMaxEvents = 100000;

/// One step of the workload to replay.
struct WhatIfEvent {
  enum class Kind : std::uint8_t {
    alloc,  ///< allocate `size` bytes on `stream`; `addr` names the block for its free
    free,   ///< free the block allocated as `addr`
    failed,  ///< an earlier request that failed: tried again, freed at once if served
    release  ///< memory was given back to the device here: empty_cache()
  };
  Kind kind = Kind::alloc;
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  std::uintptr_t stream = 0;
};

/// Where the replayed workload came from.
enum class WhatIfSource {
  history,     ///< the recorded events since the device was empty
  /// The blocks the device holds now (allocated or waiting for streams), each segment rebuilt
  /// in address order with its free blocks between them, which are freed at the end: the
  /// device's layout now, as far as the replayed configuration allows.
  live_blocks
};

/// What the check needs from the failing device, captured under its lock.
struct WhatIfInput {
  Config config;                 ///< the device's configuration when the request failed
  std::size_t granularity = std::size_t{2} << 20;  ///< the device's page size
  bool virtual_memory = true;    ///< the device supports expandable segments
  std::uintptr_t stream = 0;     ///< the failing request's stream (its size is in OomFacts)
  WhatIfSource source = WhatIfSource::history;
  std::vector<WhatIfEvent> events;  ///< history: in order; live blocks: allocs in address order
  std::size_t live_blocks = 0;      ///< live_blocks: blocks held now (allocated or pending)
  std::size_t free_blocks = 0;      ///< live_blocks: free blocks between them, recreated
  std::string fallback_reason;      ///< why the history was not used (live_blocks only)
  std::string not_run;              ///< set: the check does not run, for this reason
};

/// How one configuration fared in the replay.
struct WhatIfOutcome {
  std::string change;  ///< the keys added to the device's configuration ("" for none)
  bool served = false;  ///< the failing request was served
  /// The workload failed before the request, at this event (SIZE_MAX: it did not).
  std::size_t failed_at = SIZE_MAX;
};

/// The result of a check.
struct WhatIfResult {
  WhatIfSource source = WhatIfSource::history;
  std::size_t events = 0;     ///< workload events replayed before the request
  std::size_t live_blocks = 0;  ///< live_blocks: see WhatIfInput
  std::size_t free_blocks = 0;
  std::size_t capacity = 0;   ///< the simulated device's size
  std::optional<std::size_t> allowed;  ///< the memory-fraction cap applied on it
  std::string fallback_reason;
  WhatIfOutcome current;      ///< the device's own configuration, replayed the same way
  std::vector<WhatIfOutcome> candidates;
};

/// Whether an OOM with these facts gets a what-if check: switched on, the device's memory known,
/// and the request not provably too big for any configuration (live data plus the request
/// within what the allocator may use).
bool what_if_wanted(const OomFacts& facts, const Config& config);

/// The changes to `config` worth checking, as configuration strings: expandable_segments:True
/// and expandable_segments:True,stitching:True, less what is already on.
std::vector<std::string> what_if_changes(const Config& config);

/// Replays `input`'s workload and then the failing request on a fresh simulated device with the
/// capacity the failing allocator could use, under `config` plus `change`. Throws what the
/// replay throws (a backend_error of the simulator, bad_alloc).
WhatIfOutcome replay_what_if(const OomFacts& facts, const WhatIfInput& input,
                             const std::string& change);

/// Runs the replay for the device's configuration and for each of what_if_changes().
WhatIfResult check_what_if(const OomFacts& facts, const WhatIfInput& input);

/// The report's what-if paragraph for a finished check.
std::string format_what_if(const WhatIfResult& result);

/// The report's what-if paragraph when no check runs ("" where the verdict says it all).
std::string what_if_not_run(const OomFacts& facts, const Config& config, bool capture_failed);

/// The out_of_memory a device throws when a what-if check is due. what() is the report without
/// the check (what the caller gets if the check cannot be completed).
class PendingOom : public out_of_memory {
 public:
  PendingOom(OomFacts facts, std::shared_ptr<const WhatIfInput> input);
  [[nodiscard]] const OomFacts& facts() const noexcept { return *facts_; }
  [[nodiscard]] const WhatIfInput& input() const noexcept { return *input_; }

 private:
  std::shared_ptr<const OomFacts> facts_;  // shared: exception objects are copied
  std::shared_ptr<const WhatIfInput> input_;
};

/// Throws the report for `facts`: a PendingOom when `input` is set, otherwise an out_of_memory
/// whose what-if paragraph says why no check ran (`capture_failed`: capturing the input failed).
[[noreturn]] void throw_oom(OomFacts facts, const Config& config,
                            std::shared_ptr<const WhatIfInput> input, bool capture_failed);

/// For a PendingOom: runs the check and returns the full report (with the reason in it if the
/// replay failed). "" for any other out_of_memory, or if even the report could not be written:
/// the caller then rethrows `e` as it is. Never throws.
std::string complete_oom_report(const out_of_memory& e) noexcept;

}  // namespace stitch::detail
