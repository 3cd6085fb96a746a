// core/stream_shards.hpp — StreamShards: the stream shards of one device (core/stream_shard.hpp):
// found by stream without a lock, created under the device lock, listed in stream order, and
// locked all at once by the device lock (core/device_lock.hpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/atomic_map.hpp"
#include "core/stream_shard.hpp"

namespace stitch::detail {

class StreamShards {
 public:
  StreamShards() = default;
  StreamShards(const StreamShards&) = delete;
  StreamShards& operator=(const StreamShards&) = delete;

  /// `stream`'s shard, or nullptr before its first use. No lock. The first shard made (most
  /// programs use one stream) is found without the table.
  [[nodiscard]] StreamShard* find(stream_t stream) const noexcept {
    StreamShard* s = oldest_.load(std::memory_order_acquire);
    if (s != nullptr && s->stream == stream) [[likely]] return s;
    return table_.find(AtomicMap<StreamShard>::key_of(stream));
  }
  /// `stream`'s shard, created at its first use (under the device lock: a new shard is locked
  /// like every other until the device lock is released). Throws std::bad_alloc, nothing changed.
  StreamShard& get(stream_t stream);
  /// The first shard in stream order (then StreamShard::next); nullptr when there is none.
  [[nodiscard]] StreamShard* first() const noexcept { return head_.load(std::memory_order_acquire); }
  /// The list's head, for readers that walk it without the device lock (HotStats).
  [[nodiscard]] const std::atomic<StreamShard*>& head() const noexcept { return head_; }
  /// The garbage-collection clocks of the device's pools, [small, large] (BlockPool::clock).
  [[nodiscard]] std::atomic<std::uint64_t>* clocks() noexcept { return clocks_; }

  /// Takes every shard's lock (the device lock holds its own first; it then settles the shards'
  /// held and parked blocks, BlockStore::settle_all).
  void lock_all() noexcept;
  void unlock_all() noexcept;

 private:
  AtomicMap<StreamShard> table_{64};
  std::atomic<StreamShard*> head_{nullptr};
  std::atomic<StreamShard*> oldest_{nullptr};  ///< the first shard made (set once)
  std::vector<std::unique_ptr<StreamShard>> owned_;
  std::atomic<std::uint64_t> clocks_[2] = {};
  bool all_locked_ = false;  ///< inside lock_all() .. unlock_all(): a new shard starts locked
};

}  // namespace stitch::detail
