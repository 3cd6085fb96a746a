// core/stream_shards.cpp — StreamShards: a shard created and linked in stream order, and every
// shard locked and released.
#include "core/stream_shards.hpp"

namespace stitch::detail {

StreamShard& StreamShards::get(stream_t stream) {
  if (StreamShard* s = find(stream)) return *s;
  owned_.reserve(owned_.size() + 1);
  auto shard = std::make_unique<StreamShard>(stream, clocks_);
  using Map = AtomicMap<StreamShard>;
  const Map::Key key = Map::key_of(stream);
  Map::Slot* slot = table_.claim_excluding_writers(key);  // (may throw: nothing changed)
  StreamShard* s = shard.get();
  if (all_locked_) s->lock.lock();
  // Linked in stream order before it is published: a reader that finds it may walk from it.
  std::atomic<StreamShard*>* link = &head_;
  for (StreamShard* cur = head_.load(std::memory_order_relaxed);
       cur != nullptr && cur->stream < stream; cur = cur->next.load(std::memory_order_relaxed))
    link = &cur->next;
  s->next.store(link->load(std::memory_order_relaxed), std::memory_order_relaxed);
  link->store(s, std::memory_order_release);
  Map::publish(slot, s);
  if (owned_.empty()) oldest_.store(s, std::memory_order_release);
  owned_.push_back(std::move(shard));
  return *s;
}

void StreamShards::lock_all() noexcept {
  for (StreamShard* s = first(); s != nullptr; s = s->next.load(std::memory_order_relaxed)) {
    s->lock.lock();
    s->touch();  // the device lock may change anything
  }
  all_locked_ = true;
}

void StreamShards::unlock_all() noexcept {
  all_locked_ = false;
  for (StreamShard* s = first(); s != nullptr; s = s->next.load(std::memory_order_relaxed))
    s->lock.unlock();
}

}  // namespace stitch::detail
