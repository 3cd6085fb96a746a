// core/device_lock.hpp — the device lock: the device's own lock and then every stream shard's
// (core/stream_shards.hpp), in stream order. Whoever holds it owns the whole device: every block,
// segment, pool and statistic, with no cache hit running (a hit holds one shard's lock only,
// core/cache_hit.hpp). Every path but the cache hit takes it: growth and the out-of-memory ladder,
// events, stitching, compaction, sleep, the queries and the configuration.
//
// It refuses, with stitch::error and before touching any lock, in a child process that fork()
// made after the allocator was created: a lock another thread of the parent held is held forever
// in the child, CUDA cannot be used in a forked child, and the simulated device's memory is
// shared with the parent (core/fork_guard.hpp).
#pragma once

#include <cstdint>

#include "core/block_store.hpp"
#include "core/fork_guard.hpp"
#include "core/spin_lock.hpp"
#include "core/stream_shards.hpp"

namespace stitch::detail {

class DeviceLock {
 public:
  DeviceLock(StreamShards& shards, BlockStore& store) noexcept
      : shards_(shards), store_(store), generation_(fork_generation()) {}
  DeviceLock(const DeviceLock&) = delete;
  DeviceLock& operator=(const DeviceLock&) = delete;

  /// Takes the device's lock and every shard's, and files the cache hit's held blocks and
  /// indexes its parked ones (BlockStore::settle_all). Throws stitch::error in a forked child,
  /// with nothing held.
  void lock() {
    refuse_after_fork(generation_);
    spin_.lock();
    shards_.lock_all();
    store_.settle_all();
  }
  void unlock() noexcept {
    shards_.unlock_all();
    spin_.unlock();
  }
  /// The fork generation the allocator was created in (the cache hit checks it too).
  [[nodiscard]] std::uint64_t generation() const noexcept { return generation_; }

 private:
  SpinLock spin_;
  StreamShards& shards_;
  BlockStore& store_;
  const std::uint64_t generation_;
};

}  // namespace stitch::detail
