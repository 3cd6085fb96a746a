// core/stream_events.hpp — cross-stream safety. A block that was used on other streams than its
// own (record_stream, or a free on another stream) gets one event per extra stream when it is
// freed, and becomes free only once all of them have completed. Events come from a pool and are
// queued per stream; the queues are polled on allocation only while some event is outstanding,
// so a block that never crossed streams costs nothing here.
#pragma once

#include <cstddef>
#include <deque>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/block.hpp"
#include "stitch/backend.hpp"

namespace stitch::detail {

class StreamEvents {
 public:
  StreamEvents(Backend& backend, int device) noexcept : backend_(backend), device_(device) {}
  /// Destroys the pooled events (errors dropped: nothing can report them).
  ~StreamEvents();
  StreamEvents(const StreamEvents&) = delete;
  StreamEvents& operator=(const StreamEvents&) = delete;

  /// Events recorded and not yet seen completed.
  [[nodiscard]] std::size_t outstanding() const noexcept { return outstanding_; }
  /// Whether `pred(stream)` holds for a stream with events outstanding.
  template <typename Pred>
  [[nodiscard]] bool any_stream(Pred&& pred) const {
    for (const auto& [stream, queue] : pending_)
      if (!queue.empty() && pred(stream)) return true;
    return false;
  }
  /// Records one event on each of `block`'s stream_uses and counts them in its event_count.
  /// All or nothing: when the backend fails, the events go back to the pool and it rethrows.
  void record(Block* block);
  /// Takes every completed event off its stream's queue (each queue stops at its first
  /// incomplete event) and calls `done(block)` for each block whose last event completed.
  template <typename Done>
  void poll(Done&& done) {
    for (auto& [stream, queue] : pending_) {
      while (!queue.empty()) {
        auto [event, block] = queue.front();
        if (!backend_.query_event(device_, event)) break;
        retire(queue, event, block, done);
      }
    }
  }
  /// Waits for every outstanding event, calling `done` as poll() does. False when none was
  /// outstanding (nothing waited for).
  template <typename Done>
  bool wait_all(Done&& done) {
    if (outstanding_ == 0) return false;
    for (auto& [stream, queue] : pending_) {
      while (!queue.empty()) {
        auto [event, block] = queue.front();
        backend_.synchronize_event(device_, event);
        retire(queue, event, block, done);
      }
    }
    return true;
  }

 private:
  using Queue = std::deque<std::pair<event_t, Block*>>;
  template <typename Done>
  void retire(Queue& queue, event_t event, Block* block, Done& done) {
    queue.pop_front();
    pool_.push_back(event);
    --outstanding_;
    if (--block->event_count == 0) done(block);
  }
  event_t get_event();

  Backend& backend_;
  const int device_;
  std::unordered_map<stream_t, Queue> pending_;
  std::size_t outstanding_ = 0;
  std::vector<event_t> pool_;
};

}  // namespace stitch::detail
