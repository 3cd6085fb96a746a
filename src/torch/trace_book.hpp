// torch/trace_book.hpp — PyTorch's view of stitch's trace: the trackers attached with
// attachAllocatorTraceTracker (ProcessGroupNCCL's registration hook among them) and the history
// recordHistory keeps, with PyTorch's contexts (the frames its context recorder gathers). The
// core shows every event to on_event (Allocator::set_trace_observer) under the device lock, on
// the thread whose request caused it; that thread set the request's context first (Pending).
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "stitch/allocator.hpp"

namespace stitch::torch_native::detail {

namespace cda = c10::CachingDeviceAllocator;

class TraceBook {
 public:
  explicit TraceBook(Allocator& allocator) : allocator_(allocator) {}
  ~TraceBook();
  TraceBook(const TraceBook&) = delete;
  TraceBook& operator=(const TraceBook&) = delete;

  /// recordHistory: on or off, PyTorch's context recorder, the entries kept per device, which
  /// contexts are kept (RecordContext), whether to drop what was recorded, actions not kept.
  void record_history(bool enabled, cda::CreateContextFn recorder, std::size_t max_entries,
                      cda::RecordContext when, bool clear, const std::vector<std::string>& skip);
  [[nodiscard]] bool history_enabled() const;
  void attach_tracker(cda::AllocatorTraceTracker tracker);

  /// The context for an operation that keeps one from `level` on (nullptr when the history
  /// keeps none that early). Gathers outside every lock: the recorder may take the GIL.
  [[nodiscard]] std::shared_ptr<c10::GatheredContext> gather(cda::RecordContext level) const;
  /// Whether an operation of `level` keeps a context (one relaxed load: the hot path's test).
  [[nodiscard]] bool keeps(cda::RecordContext level) const noexcept {
    return when_fast_.load(std::memory_order_relaxed) >= static_cast<int>(level);
  }
  /// The calling thread's context for the events of the request it makes now.
  class Pending {
   public:
    explicit Pending(std::shared_ptr<c10::GatheredContext> context);
    ~Pending();
    Pending(const Pending&) = delete;
    Pending& operator=(const Pending&) = delete;
  };

  /// An event of `device` (from the core, under its lock).
  void on_event(int device, const TraceEntry& entry);
  /// The kept history of `device`, oldest first, times in microseconds since the epoch.
  [[nodiscard]] std::vector<cda::TraceEntry> history(int device) const;
  /// The context of the live block at `addr` (nullptr if none was kept).
  [[nodiscard]] std::shared_ptr<c10::GatheredContext> context_of(std::uintptr_t addr) const;
  /// The context of the request that allocated or mapped the segment at `addr`.
  [[nodiscard]] std::shared_ptr<c10::GatheredContext> segment_context(std::uintptr_t addr) const;

 private:
  /// Observes the core while a tracker is attached or the history is on (outside mu_: the
  /// observer runs under device locks and takes mu_).
  void update_observer();

  Allocator& allocator_;
  std::mutex observer_mu_;  ///< serializes update_observer (never taken by on_event)
  mutable std::mutex mu_;   ///< everything below
  bool enabled_ = false;
  cda::CreateContextFn recorder_ = nullptr;
  cda::RecordContext when_ = cda::RecordContext::NEVER;
  std::size_t max_entries_ = 1;
  std::unordered_set<int> skip_;  ///< cda::TraceEntry::Action values not kept
  std::vector<std::deque<cda::TraceEntry>> history_;  ///< [device]
  std::unordered_map<std::uintptr_t, std::shared_ptr<c10::GatheredContext>> live_;      ///< blocks
  std::unordered_map<std::uintptr_t, std::shared_ptr<c10::GatheredContext>> segments_;  ///< by base
  std::shared_ptr<const std::vector<cda::AllocatorTraceTracker>> trackers_ =
      std::make_shared<const std::vector<cda::AllocatorTraceTracker>>();
  bool observing_ = false;
  std::atomic<int> when_fast_{0};  ///< when_, or NEVER without a recorder
  mutable c10::ApproximateClockToUnixTimeConverter clock_;
};

}  // namespace stitch::torch_native::detail
