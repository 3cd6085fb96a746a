// tools/replay/workload.hpp — a replayable allocation trace: per device, the blocks live when the
// trace starts and the ordered events, read from PyTorch snapshots, stitch snapshots or RMM logs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "stitch/snapshot.hpp"

namespace stitch::replay {

/// One allocator event of the trace (sizes are the sizes the program asked for).
struct Event {
  TraceAction action = TraceAction::alloc;
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  std::uintptr_t stream = 0;
};

/// A block that was allocated before the first event.
struct InitialBlock {
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  std::uintptr_t stream = 0;
};

/// A segment the recording allocator already held when the trace started.
struct InitialSegment {
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  std::uintptr_t stream = 0;
  bool small = false;  ///< small pool (2 MiB segments of blocks <= 1 MiB)
};

/// Everything one device did.
struct DeviceTrace {
  int device = 0;
  std::vector<InitialBlock> initial;  ///< live at the start, in address order
  std::vector<Event> events;
  /// Segments the recording allocator held before the first event (known from segment_free
  /// events of segments the trace never created and from the dump's segments); only used to
  /// reproduce the recorded run (warm start), not when comparing configurations.
  std::vector<InitialSegment> cached_segments;
  /// True when the recorded allocator started empty (no live block or segment before the trace).
  bool starts_empty = false;
  /// What the recording allocator held from the driver at its peak: the segments it started
  /// with plus the running sum of its segment_alloc/segment_map minus segment_free/
  /// segment_unmap. Absent when the trace has no segment events.
  std::optional<std::size_t> recorded_peak_reserved;
  /// The recording allocator's segment_alloc/segment_map sizes, in order (for fidelity checks).
  std::vector<std::size_t> recorded_segments;
  /// True when free_completed events exist (blocks are reusable at free_completed, not before).
  bool has_free_completed = false;
};

struct Workload {
  std::string name;
  std::vector<DeviceTrace> devices;  ///< devices with at least one event
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

/// Parses RMM CSV text. `name` prefixes errors ("NAME: line N: ...").
Workload workload_from_rmm_csv(std::string_view text, std::string name);

/// Peak of the sum of live requested sizes over the trace (initial blocks included).
std::size_t peak_requested(const DeviceTrace& trace);

}  // namespace stitch::replay
