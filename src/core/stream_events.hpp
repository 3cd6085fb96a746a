// core/stream_events.hpp — cross-stream safety. A block that was used on other streams than its
// own (record_stream, or a free on another stream) gets one event per extra stream when it is
// freed (it is pending), and becomes free only once all of them have completed. Events come from
// a pool and are queued per stream; the queues are polled on allocation (and by the readers) only
// while some event is outstanding, so a block that never crossed streams costs nothing here.
// While a stream the block used may be capturing a graph, recording its events would put them in
// the graph: they are deferred (the block is `deferred`) and recorded once no capture is
// underway (record_deferred).
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
  /// Blocks whose events are deferred.
  [[nodiscard]] std::size_t deferred() const noexcept { return deferred_.size(); }
  /// Records one event on each of `block`'s stream_uses (the block is allocated or deferred, and
  /// becomes pending). All or nothing: when the backend fails, the events go back to the pool and
  /// it rethrows, the block as it was.
  void record(Block* block);
  /// Defers the events of the allocated `block` (it becomes deferred). May throw, changing
  /// nothing.
  void defer(Block* block);
  /// Records the deferred blocks' events where `may_record(block)` says that none of its streams
  /// captures any more; the others stay deferred. On a backend failure the block and those after
  /// it stay deferred, and it rethrows.
  template <typename MayRecord>
  void record_deferred(MayRecord&& may_record) {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < deferred_.size(); ++i) {
      Block* block = deferred_[i];
      if (!may_record(block)) {
        deferred_[kept++] = block;
        continue;
      }
      try {
        record(block);
      } catch (...) {
        for (std::size_t j = i; j < deferred_.size(); ++j) deferred_[kept++] = deferred_[j];
        deferred_.resize(kept);
        throw;
      }
    }
    deferred_.resize(kept);
  }
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
  /// Whether `pred(stream)` holds for a stream with events outstanding.
  template <typename Pred>
  [[nodiscard]] bool any_stream(Pred&& pred) const {
    for (const auto& [stream, queue] : pending_)
      if (!queue.empty() && pred(stream)) return true;
    return false;
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
  /// Checks its counts against a recount of the blocks: `pending_events` events that pending
  /// blocks wait for, `deferred_blocks` deferred blocks. Throws stitch::error.
  void validate(int device, std::size_t pending_events, std::size_t deferred_blocks) const;

 private:
  using Queue = std::deque<std::pair<event_t, Block*>>;
  /// Takes the completed front `event` off `queue`; at `block`'s last one, `done(block)` files
  /// it. All or nothing: when the host has no memory (for the pool's entry, or for `done`, which
  /// must change nothing when it throws), the event stays queued and the block pending, and the
  /// next poll retires it. (Its count drops before `done`: a filed block may merge away.)
  template <typename Done>
  void retire(Queue& queue, event_t event, Block* block, Done& done) {
    if (pool_.size() == pool_.capacity()) pool_.reserve(2 * pool_.size() + 8);  // may throw
    if (--block->event_count == 0) {
      try {
        done(block);
      } catch (...) {
        ++block->event_count;
        throw;
      }
    }
    queue.pop_front();
    pool_.push_back(event);
    --outstanding_;
  }
  event_t get_event();

  Backend& backend_;
  const int device_;
  std::unordered_map<stream_t, Queue> pending_;
  std::size_t outstanding_ = 0;
  std::vector<event_t> pool_;
  std::vector<Block*> deferred_;  ///< blocks whose events wait for the captures to end
};

}  // namespace stitch::detail
