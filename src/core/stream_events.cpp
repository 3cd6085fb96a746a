// core/stream_events.cpp — StreamEvents: recording a freed block's events, and the event pool.
#include "core/stream_events.hpp"

#include "core/assert.hpp"
#include "core/undo.hpp"

namespace stitch::detail {

StreamEvents::~StreamEvents() {
  for (event_t e : pool_) {
    try {
      backend_.destroy_event(device_, e);
    } catch (...) {
    }
  }
}

event_t StreamEvents::get_event() {
  if (!pool_.empty()) {
    event_t e = pool_.back();
    pool_.pop_back();
    return e;
  }
  return backend_.create_event(device_);
}

void StreamEvents::record(Block* block) {
  const std::size_t n = block->stream_uses.size();
  std::vector<event_t> recorded;
  recorded.reserve(n);
  pool_.reserve(pool_.size() + n);  // (the undo below cannot fail)
  // On a failure (the device's, or the host's memory for a queue) the queued entries leave their
  // queues and the events taken go back to the pool: recorded ones complete on their own and are
  // safe to reuse. Nothing changed then.
  std::size_t queued = 0;
  Undo undo([&] {
    for (std::size_t i = queued; i-- > 0;) pending_.find(block->stream_uses[i])->second.pop_back();
    pool_.insert(pool_.end(), recorded.begin(), recorded.end());
  });
  for (stream_t s : block->stream_uses) {
    auto& queue = pending_[s];
    recorded.push_back(get_event());
    backend_.record_event(device_, recorded.back(), s);
    queue.emplace_back(recorded.back(), block);
    ++queued;
  }
  undo.done();
  block->event_count += static_cast<int>(n);
  outstanding_ += n;
  set_state(*block, BlockState::pending);
}

void StreamEvents::defer(Block* block) {
  deferred_.push_back(block);  // may throw: nothing changed
  set_state(*block, BlockState::deferred);
}

void StreamEvents::validate(int device, std::size_t pending_events,
                            std::size_t deferred_blocks) const {
  auto broken = [device](const char* what) { invariant_broken(device, what); };
  if (pending_events != outstanding_) broken("pending event count is wrong");
  if (deferred_blocks != deferred_.size()) broken("a deferred block is not in the deferred list");
  for (const Block* b : deferred_)
    if (b->state != BlockState::deferred) broken("a block whose events are deferred is not deferred");
}

}  // namespace stitch::detail
