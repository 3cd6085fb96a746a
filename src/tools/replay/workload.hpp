// tools/replay/workload.hpp — the workloads of trace files: PyTorch snapshots, stitch snapshots
// and RMM logs, read into the replay's workload model (replay/workload.hpp).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "replay/trace_workload.hpp"
#include "replay/workload.hpp"
#include "stitch/snapshot.hpp"

namespace stitch::replay {

/// A trace file's workload.
struct Workload {
  std::string name;
  std::vector<DeviceWorkload> devices;  ///< devices with at least one event
};

/// Builds a workload from a snapshot (PyTorch's or stitch's), reconstructing the starting state
/// from frees of blocks the trace never allocated and from blocks still allocated at the dump
/// that the trace never allocated.
Workload workload_from_snapshot(const Snapshot& snapshot, std::string name);

/// Reads a file: a snapshot pickle (PyTorch's or stitch's) or an RMM logging_resource_adaptor
/// CSV (Thread,Time,Action,Pointer,Size,Stream); a JSON snapshot is refused with a message that
/// asks for the pickle form (stitch writes JSON snapshots but has no JSON reader). Throws stitch::error
/// naming the file (and the offset or line) for unreadable or malformed input.
Workload read_workload(const std::string& path);

/// Parses RMM CSV text (tools/formats/rmm_csv.hpp). `name` prefixes errors ("NAME: line N: ...").
Workload workload_from_rmm_csv(std::string_view text, std::string name);

}  // namespace stitch::replay
