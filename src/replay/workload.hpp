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
    release   ///< the recording allocator gave its free cached memory back here
  };
  Kind kind = Kind::none;
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  std::uintptr_t stream = 0;
};

/// A block that was allocated before the first event (size: the size the program asked for).
struct StartBlock {
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  std::uintptr_t stream = 0;
};

/// A segment the recording allocator already held when the trace started.
struct StartSegment {
  std::uintptr_t addr = 0;
  std::size_t size = 0;
  std::uintptr_t stream = 0;
  bool small = false;  ///< small pool (2 MiB segments of blocks <= 1 MiB)
};

/// Everything one device did.
struct DeviceWorkload {
  int device = 0;
  std::vector<StartBlock> initial;  ///< live at the start, in address order
  std::vector<Event> events;
  /// Segments the recording allocator held before the first event; only used to reproduce the
  /// recorded run (warm start), not when comparing configurations.
  std::vector<StartSegment> cached_segments;
  /// True when the recorded allocator started empty (no live block or segment before the trace).
  bool starts_empty = false;
  /// What the recording allocator held from the driver at its peak. Absent when the trace has
  /// no segment events.
  std::optional<std::size_t> recorded_peak_reserved;
  /// The recording allocator's segment_alloc/segment_map sizes, in order (for fidelity checks).
  std::vector<std::size_t> recorded_segments;
};

/// Peak of the sum of live requested sizes over the workload (initial blocks included).
std::size_t peak_requested(const DeviceWorkload& workload);

}  // namespace stitch::replay
