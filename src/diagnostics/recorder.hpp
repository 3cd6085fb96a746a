// diagnostics/recorder.hpp — the allocation history: a bounded ring buffer of trace entries
// (PyTorch's action names), off by default. When off, the allocator pays one predictable branch
// per operation; when on, an entry costs a clock read and, with stacks, one backtrace() call
// and/or a walk of the Python frames (docs/diagnostics.md has the measured costs).
// An observer (Allocator::set_trace_observer: PyTorch's trace trackers) sees every event as it
// happens, whether or not the history is kept.
// Not thread-safe: each device's recorder lives under its device lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "diagnostics/python_frames.hpp"
#include "stitch/backend.hpp"
#include "stitch/snapshot.hpp"

namespace stitch::detail {

class Recorder {
 public:
  static constexpr int kMaxFrames = 24;

  [[nodiscard]] bool enabled() const noexcept { return capacity_ != 0; }
  /// Events are kept or observed: every operation must report them (the cache hit is closed).
  [[nodiscard]] bool active() const noexcept { return capacity_ != 0 || observed_; }
  /// Calls `observer` with every event from now on (without frames), under the device lock;
  /// an empty function stops it. What it throws is ignored.
  void observe(std::function<void(const TraceEntry&)> observer) {
    observer_ = std::move(observer);
    observed_ = static_cast<bool>(observer_);
  }
  /// Entries take Python frames: allocations gather them first (GatheredPythonFrames).
  [[nodiscard]] bool python_stacks() const noexcept { return enabled() && python_stacks_; }
  /// Turns recording on with room for `max_entries` (0 turns it off and clears the history).
  /// `device_empty`: the device holds no memory now, so a history started here is complete
  /// (see complete()).
  /// `stacks`: native frames per entry; `python_stacks`: the Python frames the allocating thread
  /// gathered before the device lock (diagnostics/python_frames.hpp).
  void configure(bool enabled, std::size_t max_entries, bool stacks, bool python_stacks = false,
                 bool device_empty = false);
  /// Appends one entry, overwriting the oldest when full, and shows it to the observer.
  void record(TraceAction action, const void* addr, std::size_t size, stream_t stream);
  /// record(), when recording or observing is on (one predictable branch when both are off).
  void trace(TraceAction action, const void* addr, std::size_t size, stream_t stream) {
    if (active()) record(action, addr, size, stream);
  }
  /// The history, oldest first, with stacks symbolized (`with_frames`) or without stacks.
  [[nodiscard]] std::vector<TraceEntry> entries(bool with_frames = true) const;
  [[nodiscard]] std::size_t size() const noexcept { return count_; }
  /// Entries lost so far: overwritten when the ring buffer wrapped, or cut when it shrank.
  [[nodiscard]] std::uint64_t dropped() const noexcept { return dropped_; }
  /// Recording started while the device held no memory and nothing was lost since: replaying
  /// the history from an empty device rebuilds what the device holds.
  [[nodiscard]] bool complete() const noexcept { return enabled() && from_empty_ && dropped_ == 0; }
  /// Recording started while the device held memory (complete() is false for that reason).
  [[nodiscard]] bool started_late() const noexcept { return enabled() && !from_empty_; }
  /// The symbolized stack of the newest `alloc` entry at `addr` (empty if none was recorded).
  [[nodiscard]] std::vector<std::string> alloc_frames(std::uintptr_t addr) const;

 private:
  struct Raw {
    TraceAction action;
    std::uintptr_t addr;
    std::size_t size;
    std::uintptr_t stream;
    std::int64_t time_us;
    int frames;
    /// Native return addresses, then Python frames (PythonFrames words), innermost first.
    void* stack[kMaxFrames];
  };
  /// `r`'s frame `f` as "function (file)" or "function (file:line)".
  [[nodiscard]] std::string describe(const Raw& r, int f) const;
  std::vector<Raw> ring_;
  std::size_t capacity_ = 0;
  std::size_t next_ = 0;
  std::size_t count_ = 0;
  std::uint64_t dropped_ = 0;
  bool from_empty_ = false;
  bool stacks_ = false;
  bool python_stacks_ = false;
  bool observed_ = false;
  std::function<void(const TraceEntry&)> observer_;
};

}  // namespace stitch::detail
