// tools/stitch_replay/replayer.hpp — measures replays (replay/engine.hpp) of a device's workload: what a
// configuration reserved, how fragmented it got and whether it fit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "stitch/config.hpp"
#include "stitch/snapshot.hpp"
#include "replay/workload.hpp"
#include "tools/stitch_replay/cost_model.hpp"
#include "tools/stitch_replay/oom_explain.hpp"

namespace stitch::replay_cli {

// The command line tool over the replay engine (src/replay): its names are used here as ours.
using namespace stitch::replay;

struct ReplayOptions {
  std::string config;                       ///< allocator settings (backend:sim is implied)
  /// Settings as a Config instead of `config` (a fidelity replay's recorded settings).
  std::optional<Config> settings;
  std::size_t capacity = std::size_t{1} << 40;  ///< device size
  /// Called every `progress_every` events with (done, total), e.g. for a progress bar.
  std::function<void(std::size_t, std::size_t)> progress;
  std::size_t progress_every = 10000;
  /// Record the series (requested, reserved, allocated) every `sample_every` events for plots;
  /// 0: no series.
  std::size_t sample_every = 0;
  /// Start with what the recording allocator held, its live blocks in place
  /// (DeviceWorkload::held_segments), to reproduce the recorded run rather than compare
  /// configurations from an empty device.
  bool warm_start = false;
  /// Give cached memory back where the recording did (its empty_cache calls and out-of-memory
  /// ladder, its partial releases): part of reproducing the recorded run.
  bool honour_releases = false;
  /// Try the requests the recording failed again (freed at once when served): part of
  /// reproducing a recorded out-of-memory failure.
  bool retry_failed = false;
  /// Which failed requests get an OomExplanation (ReplayResult::explanations).
  Explain explain = Explain::none;
};

struct Sample {
  std::size_t event = 0;
  std::size_t requested = 0;
  std::size_t reserved = 0;
  std::size_t allocated = 0;
};

struct ReplayResult {
  std::string config;
  std::size_t capacity = 0;
  std::size_t events = 0;
  std::size_t peak_requested = 0;         ///< peak of live requested bytes
  std::size_t peak_reserved = 0;          ///< peak of bytes held from the device
  std::size_t peak_unallocated = 0;       ///< peak of reserved minus allocated
  std::size_t largest_free_at_worst = 0;  ///< largest free block when unallocated peaked
  std::size_t peak_reserved_event = 0;    ///< events replayed when reserved last rose to its peak
  std::int64_t device_allocs = 0;         ///< segment allocations (cudaMalloc)
  std::int64_t device_frees = 0;
  std::int64_t maps = 0;                  ///< page-range maps (expandable segments)
  std::int64_t unmaps = 0;
  std::int64_t stream_syncs = 0;          ///< synchronize_stream calls (page moves, releases)
  std::int64_t compactions = 0;           ///< coarse pages emptied by compaction (stitch_compact)
  std::int64_t compacted_bytes = 0;       ///< the live bytes it copied (the replay moves none)
  std::int64_t device_syncs = 0;          ///< device synchronizations (before compaction)
  std::size_t ooms = 0;                   ///< requests that failed
  /// The event of the first failed request (ReplayOom::kAtStart: at the start); none: no OOM.
  std::optional<std::size_t> first_oom_event;
  std::vector<OomExplanation> explanations;  ///< as ReplayOptions::explain asks
  std::size_t seeded_segments = 0;        ///< warm start: segments and runs made for the start
  CallCounts calls;                       ///< the device calls, for the cost model
  double seconds = 0.0;
  std::vector<std::size_t> segments;      ///< sizes of the segments/maps made, in order
  std::vector<Sample> series;
  [[nodiscard]] double reserved_over_requested() const {
    return peak_requested == 0 ? 0.0
                               : static_cast<double>(peak_reserved) / static_cast<double>(peak_requested);
  }
  [[nodiscard]] double events_per_second() const {
    return seconds > 0 ? static_cast<double>(events) / seconds : 0.0;
  }
};

/// Replays one device's trace. Deterministic: the same trace and options give the same numbers.
ReplayResult replay(const DeviceWorkload& trace, const ReplayOptions& options);

/// The allocator's snapshot after replaying the first `events` events (from the trace's
/// starting state); `requested` receives the live requested bytes then.
Snapshot snapshot_after(const DeviceWorkload& trace, const ReplayOptions& options, std::size_t events,
                        std::size_t& requested);

/// How closely a replay under the recorded settings, from the recorded start, reproduces what the
/// recording allocator held, and, when the recording ran out of memory, whether the replay does
/// too at the same request.
struct Fidelity {
  /// The device it ran on: implied_capacity() when the recording ran out of memory, else none
  /// (an unlimited device).
  std::optional<std::size_t> capacity;
  std::optional<RecordedOom> recorded_oom;        ///< the recording's first failed request
  std::optional<std::size_t> replayed_oom_event;  ///< the replay's first failed request
  /// The replay's first failure is the recording's first, at the same event.
  bool oom_reproduced = false;
  std::size_t replayed_ooms = 0;  ///< failed requests in the replay
  std::size_t recorded_peak_reserved = 0;  ///< the recording's true peak reserved
  std::size_t replayed_peak_reserved = 0;
  double peak_error = 0.0;         ///< |replayed - recorded| / recorded
  double segment_agreement = 0.0;  ///< shared segment sizes / max(count recorded, replayed)
  std::size_t recorded_segments = 0;  ///< segment_alloc / segment_map events of the recording
  std::size_t replayed_segments = 0;  ///< and of the replay (the start's own not counted)
  std::size_t releases = 0;           ///< release events honoured (full and partial)
};
/// Replays under `settings` (the recorded ones, TraceFile::recorded) from the recorded start state
/// (warm start, releases honoured, failed requests tried again), on the device a recorded
/// out-of-memory failure implies, and compares; nullopt without segment events to compare with.
std::optional<Fidelity> fidelity(const DeviceWorkload& trace, const Config& settings);

}  // namespace stitch::replay_cli
