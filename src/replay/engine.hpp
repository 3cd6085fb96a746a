// replay/engine.hpp — the one replay loop: drives a fresh device allocator on its own simulated
// device with a workload's events. stitch-replay measures its runs with it, and the
// out-of-memory what-if check replays a failing device's workload with it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "replay/workload.hpp"
#include "stitch/config.hpp"
#include "stitch/snapshot.hpp"
#include "stitch/stats.hpp"

namespace stitch {
class DeviceAllocator;
class SimBackend;
namespace detail {
struct OomFacts;
}
}  // namespace stitch

namespace stitch::replay {

class Replay;

/// A request that failed in a replay, as its observer (Setup::on_oom) sees it.
struct ReplayOom {
  /// The event it belongs to: an alloc, or a `failed` event tried again; kAtStart for a block
  /// live at the start.
  std::size_t event = 0;
  static constexpr std::size_t kAtStart = SIZE_MAX;
  std::size_t size = 0;
  std::uintptr_t stream = 0;
  bool recorded = false;  ///< a `failed` event: the recording failed it too
  const detail::OomFacts* facts = nullptr;  ///< the allocator's facts, valid during the call
};

/// A block live in a replay, as the workload names it.
struct LiveBlock {
  std::uintptr_t addr = 0;  ///< its address in the workload
  std::size_t size = 0;     ///< requested bytes
  std::size_t event = ReplayOom::kAtStart;  ///< the alloc event that made it (kAtStart: initial)
};

/// How a workload is replayed.
struct Setup {
  /// The allocator's settings. The backend keys are ignored (the device is simulated), and so
  /// are oom_snapshot, record_stacks and oom_what_if (a replay checks nothing of its own OOMs).
  Config config;
  std::size_t capacity = std::size_t{1} << 40;     ///< the simulated device's size
  std::size_t granularity = std::size_t{2} << 20;  ///< its page size
  /// Start with what the recording allocator held (DeviceWorkload::held_segments), with the
  /// blocks live at the start where the recording had them, to reproduce the recorded run;
  /// otherwise the initial blocks are allocated from an empty device, to compare configurations
  /// on equal terms.
  bool warm_start = false;
  bool retry_failed = false;     ///< `failed` events: the request is tried again (freed if served)
  /// `release` events: empty_cache(); `release_segment`: one free segment of that size goes.
  bool honour_releases = false;
  /// Called for each request that fails (after the allocator's whole out-of-memory ladder).
  std::function<void(const Replay&, const ReplayOom&)> on_oom;
};

/// One replay in progress. Deterministic: the same workload and setup give the same run.
class Replay {
 public:
  Replay(const DeviceWorkload& workload, const Setup& setup);
  ~Replay();
  Replay(const Replay&) = delete;
  Replay& operator=(const Replay&) = delete;

  /// Builds the state at the start: the held segments and their blocks (warm start), then the
  /// initial blocks not placed in them.
  void start();
  /// Replays `e`; false when it is an allocation that failed (counted in failures()).
  bool step(const Event& e);
  /// start(), then events [0, stop) (all of them when stop is past the end), calling `each(i)`
  /// after event i.
  template <typename Each>
  void run(std::size_t stop, Each&& each) {
    start();
    const std::size_t n = stop < workload_.events.size() ? stop : workload_.events.size();
    for (std::size_t i = 0; i < n; ++i) {
      step(workload_.events[i]);
      each(i);
    }
  }
  void run(std::size_t stop = SIZE_MAX) {
    run(stop, [](std::size_t) {});
  }
  /// Allocates `size` bytes on `stream` outside the workload; false on out of memory.
  bool try_allocate(std::size_t size, std::uintptr_t stream);

  [[nodiscard]] std::size_t requested() const noexcept { return requested_; }  ///< live bytes asked for
  [[nodiscard]] std::size_t failures() const noexcept { return failures_; }  ///< failed allocations
  /// `failed` events tried again (retry_failed) that failed again.
  [[nodiscard]] std::size_t failed_retries() const noexcept { return failed_retries_; }
  /// Events replayed so far (step() calls).
  [[nodiscard]] std::size_t position() const noexcept { return position_; }
  /// The `n` largest live blocks (by requested size), largest first.
  [[nodiscard]] std::vector<LiveBlock> largest_live(std::size_t n) const;
  /// Segments (plain) and mapped runs (expandable) start() created for the held segments.
  [[nodiscard]] std::size_t seeded() const noexcept { return seeded_; }
  [[nodiscard]] DeviceStats stats() const;
  /// The replayed device's segments (and its history, when the setup records it).
  [[nodiscard]] Snapshot snapshot() const;
  [[nodiscard]] const SimBackend& sim() const noexcept { return *sim_; }
  [[nodiscard]] DeviceAllocator& device() noexcept { return *device_; }

 private:
  void* allocate(std::size_t size, std::uintptr_t stream, bool recorded = false);
  void allocate_block(std::uintptr_t addr, std::size_t size, std::uintptr_t stream);
  void free_block(std::uintptr_t addr);
  /// Places the held segments with their initial blocks; returns the blocks placed.
  std::vector<bool> seed_held();

  const DeviceWorkload& workload_;
  Setup setup_;
  std::shared_ptr<SimBackend> sim_;
  std::unique_ptr<DeviceAllocator> device_;
  struct Live {
    void* ptr;
    std::size_t size;
    std::size_t event;
  };
  std::unordered_map<std::uintptr_t, Live> live_;  ///< recorded address -> replayed block
  std::size_t requested_ = 0;
  std::size_t failures_ = 0;
  std::size_t failed_retries_ = 0;
  std::size_t position_ = 0;
  bool started_ = false;  ///< start() is over: allocations belong to events
  std::size_t seeded_ = 0;
};

}  // namespace stitch::replay
