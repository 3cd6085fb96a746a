// replay/from_trace.hpp — turns a recorded history (PyTorch's trace model: a snapshot's
// device_traces, or the recorder's own entries) into a workload, and reconstructs the state at
// the start of the trace from the trace and the segments of the dump.
#pragma once

#include <vector>

#include "replay/workload.hpp"
#include "stitch/snapshot.hpp"

namespace stitch::replay {

/// Which free makes a block reusable.
enum class FreeAt {
  /// free_completed when the trace has any (PyTorch reuses a block then), else free_requested.
  automatic,
  completed  ///< free_completed only
};

/// What a run of segment_free / segment_unmap entries followed by a segment_map means.
enum class Unmaps {
  /// Memory given back, then mapped again: PyTorch's out-of-memory ladder (release_cached_blocks,
  /// then alloc_block) or an empty_cache() before a growth. Every allocator but stitching.
  release,
  /// Possibly stitching moving pages into a new range (a recording made with stitching:True).
  may_move_pages
};

/// The events of one device's trace, in order (snapshot entries are dropped):
/// - alloc -> alloc; the free chosen by `free_at` -> free; oom -> failed;
/// - a run of segment_free / segment_unmap entries -> one release (at its first entry), unless
///   `unmaps` is may_move_pages and a segment_map follows it (stitching moving pages);
/// - every other entry -> none.
std::vector<Event> events_from_trace(const std::vector<TraceEntry>& entries,
                                     FreeAt free_at = FreeAt::automatic,
                                     Unmaps unmaps = Unmaps::may_move_pages);

/// events_from_trace plus the state at the start, reconstructed from the trace and `dump` (the
/// segments of the snapshot the trace came with; all devices, filtered by `device`), and the
/// recording's failed requests (DeviceWorkload::recorded_ooms).
DeviceWorkload workload_from_trace(int device, const std::vector<TraceEntry>& entries,
                                   const std::vector<SegmentSnapshot>& dump,
                                   Unmaps unmaps = Unmaps::release);

/// workload_from_trace for every device of a snapshot with an event to replay; unmaps followed
/// by a map are releases unless stitch recorded the snapshot with stitching:True.
std::vector<DeviceWorkload> workloads_from_snapshot(const Snapshot& snapshot);

}  // namespace stitch::replay
