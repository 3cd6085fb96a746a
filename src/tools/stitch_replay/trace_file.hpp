// tools/stitch_replay/trace_file.hpp — the workloads of trace files: PyTorch snapshots, stitch snapshots
// and RMM logs, read into the replay's workload model (replay/workload.hpp).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "replay/from_trace.hpp"
#include "replay/workload.hpp"
#include "stitch/config.hpp"
#include "stitch/snapshot.hpp"

namespace stitch::replay_cli {

// The command line tool over the replay engine (src/replay): its names are used here as ours.
using namespace stitch::replay;

/// A trace file's workload.
struct TraceFile {
  std::string name;
  std::vector<DeviceWorkload> devices;  ///< devices with at least one event
  /// Who recorded it: "PyTorch", "stitch <version>" (a stitch snapshot) or "RMM log".
  std::string recorded_by = "PyTorch";
  /// The settings the recording ran with (recorded_settings()); a fidelity replay uses them.
  Config recorded;
  /// Those settings as the keys that differ from PyTorch's defaults ("" for none), and whether
  /// the file said (allocator_settings, or stitch's own configuration) or they are assumed.
  std::string recorded_settings;
  bool settings_recorded = false;
};

/// The settings a snapshot was recorded with: stitch's configuration for a stitch snapshot;
/// otherwise allocator_settings (expandable_segments, max_split_size, roundup_power2_divisions,
/// garbage_collection_threshold, and from PYTORCH_CUDA_ALLOC_CONF the keys stitch shares with
/// PyTorch that those fields do not give, such as max_non_split_rounding_mb); PyTorch's defaults
/// when the snapshot has neither. `known` (when not null) says whether the snapshot gave them.
Config recorded_settings(const Snapshot& snapshot, bool* known = nullptr);

/// The keys of `config`'s tunables that differ from PyTorch's defaults, as a configuration
/// string ("" when it is PyTorch's defaults); the diagnostics keys are left out.
std::string settings_difference(const Config& config);

/// Builds a workload from a snapshot (PyTorch's or stitch's), reconstructing the starting state
/// from frees of blocks the trace never allocated and from blocks still allocated at the dump
/// that the trace never allocated.
TraceFile trace_file_from_snapshot(const Snapshot& snapshot, std::string name);

/// Reads a file: a snapshot pickle (PyTorch's or stitch's) or an RMM logging_resource_adaptor
/// CSV (Thread,Time,Action,Pointer,Size,Stream); a JSON snapshot is refused with a message that
/// asks for the pickle form (stitch writes JSON snapshots but has no JSON reader). Throws stitch::error
/// naming the file (and the offset or line) for unreadable or malformed input.
TraceFile read_trace_file(const std::string& path);

/// Parses RMM CSV text (tools/formats/rmm_csv.hpp). `name` prefixes errors ("NAME: line N: ...").
TraceFile trace_file_from_rmm_csv(std::string_view text, std::string name);

}  // namespace stitch::replay_cli
