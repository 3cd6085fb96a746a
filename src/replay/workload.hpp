// replay/workload.hpp — the one workload model of every replay (stitch-replay and the
// out-of-memory what-if check): per device, the state at the start and the ordered events.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace stitch::replay {

/// One step of a workload. Events keep the positions of the trace they came from: an entry that
/// asks nothing of a replay (a segment event, the free_requested of a block completed later)
/// stays as a `none` event, so event numbers in reports are trace positions.
struct Event {
  enum class Kind : std::uint8_t {
    none,     ///< recorded, nothing to replay
    alloc,    ///< allocate `size` bytes on `stream`; `addr` names the block for its free
    free,     ///< the block allocated as `addr` becomes reusable
    failed,   ///< a request that failed in the recording (`size`: what it tried to obtain)
    /// The recording allocator gave back all its free cached memory here (empty_cache, or its
    /// out-of-memory ladder before a retry).
    release,
    /// It gave back one entirely free cached segment of `size` bytes on `stream` (garbage
    /// collection, or the release of oversize segments): a partial release.
    release_segment
  };
  Kind kind = Kind::none;
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  std::uintptr_t stream = 0;
};

/// A block that was allocated before the first event.
struct StartBlock {
  std::uintptr_t addr = 0;
  std::size_t size = 0;        ///< the size the program asked for
  std::uintptr_t stream = 0;
  std::size_t block_size = 0;  ///< the block's size when the dump shows it (0: unknown)
};

/// Memory the recording allocator already held from the device when the trace started: a
/// segment, or a mapped run of an expandable segment.
struct StartSegment {
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  std::uintptr_t stream = 0;
  bool small = false;       ///< small pool (2 MiB segments or pages, blocks <= 1 MiB)
  bool expandable = false;  ///< a mapped run of an expandable segment
};

/// A request that failed in the recording (its `oom` entry): what the device reported then.
struct RecordedOom {
  std::size_t event = 0;        ///< its position in DeviceWorkload::events (a `failed` event)
  std::size_t size = 0;         ///< the request, as the recording allocator rounded it
  std::uintptr_t stream = 0;
  std::size_t device_free = 0;  ///< free on the device then (cudaMemGetInfo), after the ladder
  /// What the recording allocator held then: reserved at the start plus the trace's segment
  /// events before the entry (the out-of-memory ladder's releases included).
  std::size_t reserved = 0;
};

/// Everything one device did.
struct DeviceWorkload {
  int device = 0;
  std::vector<StartBlock> initial;  ///< live at the start, in address order
  std::vector<Event> events;
  /// What the recording allocator held before the first event, in address order; used to
  /// reproduce the recorded run (warm start), not when comparing configurations.
  std::vector<StartSegment> held_segments;
  /// True when the recorded allocator started empty (no live block or segment before the trace).
  bool starts_empty = false;
  /// What the recording allocator held from the driver at the start: the dump's segments minus
  /// the trace's net segment events.
  std::size_t reserved_at_start = 0;
  /// What it held at its peak: reserved_at_start plus the running maximum of the trace's segment
  /// events (PyTorch's true peak reserved). Absent when the trace has no segment events.
  std::optional<std::size_t> recorded_peak_reserved;
  /// The recording allocator's segment_alloc/segment_map sizes, in order (for fidelity checks).
  std::vector<std::size_t> recorded_segments;
  /// The requests that failed in the recording, in order (empty when it never ran out).
  std::vector<RecordedOom> recorded_ooms;
};

/// Peak of the sum of live requested sizes over the workload (initial blocks included).
std::size_t peak_requested(const DeviceWorkload& workload);

/// Bytes the program had live at the start (the initial blocks' requested sizes).
std::size_t live_at_start(const DeviceWorkload& workload);

/// Bytes the recording allocator held at the start but had not handed out: reserved_at_start
/// minus the initial blocks' sizes (rounded to 512 bytes where the dump does not show them).
std::size_t cached_at_start(const DeviceWorkload& workload);

}  // namespace stitch::replay
