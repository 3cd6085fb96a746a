// core/thread_slots.hpp — immediate reuse, per thread: each thread's last free on a device,
// kept in the thread's slot so that its next allocation of the same size on the same stream
// takes it straight back without the device lock.
//
// A training loop (or an inference server's worker) frees a temporary and asks for the same
// size on the same stream again at once. The first such free goes through the device lock,
// which checks that taking the block back is what best fit would do (reusable) and parks the
// block in the calling thread's slot: still in the live table, counted as allocated. From then
// on the pair (allocate it again, free it again) touches only the slot: one uncontended spin
// lock in a cache line of its own, no shared write. So two threads on one device do not take
// the device lock from each other at all, and one thread pays what it paid before.
//
// Why the result is what the device lock would have given (DeviceAllocator::settle_slot and
// the callers of bump()):
// - A parked block's predecessor is never free (insert_free detaches a slot block whose
//   predecessor becomes free), so filing it would not move its start.
// - Whether best fit would return it depends only on its stream's free blocks: every change
//   to them under the device lock bumps the stream's epoch, and a slot whose epoch is old
//   takes the locked path again. Other streams' blocks never serve this stream.
// - The pairs taken in a slot leave every current statistic as it was; their running sums are
//   added when the slot is settled. Every reader settles every slot first (DeviceLock::lock),
//   and so does every path that could use the parked memory (a locked allocation on the same
//   stream, the slow path), so nothing observes a slot's state.
// - No pair runs while the history is recorded, while events are outstanding, or with
//   immediate reuse off (DeviceAllocator::fast_ok_).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/spin_lock.hpp"
#include "stitch/backend.hpp"

namespace stitch::detail {

struct Block;

/// What one pair (a parked block taken back) does to the inactive-split statistics: it files
/// the block (merged with a free successor, maybe) and takes it again, which cancels out but
/// moves the running sums (DeviceAllocator::reuse_effect and apply_pairs).
struct PairEffect {
  enum Kind : std::uint8_t { none, split_bytes, merged_whole, split } kind = none;
  std::int64_t bytes = 0;
};

/// One thread's immediate-reuse state on one device.
struct alignas(64) ThreadSlot {
  // The owner's cache line: taken on every pair.
  SpinLock lock;
  Block* block = nullptr;  ///< the parked block (free, `parked`) or the one handed out from it
  bool parked = false;     ///< the block is freed and waits here
  bool reusable = false;   ///< taking it back is what best fit would do (while `seen` is current)
  std::uint64_t seen = 0;  ///< its stream's epoch when `reusable` was decided
  const std::atomic<std::uint64_t>* epoch = nullptr;  ///< that stream's epoch
  std::uint64_t pairs = 0;  ///< pairs taken here since the last settle (their sums are added then)
  PairEffect effect;        ///< what each of those pairs does to the inactive-split statistics
  // Read by other threads under the device lock (a cache line of its own, rarely written).
  alignas(64) std::atomic<stream_t> parked_stream{nullptr};  ///< the parked block's stream
};

/// The slots of one device, and the per-stream epochs of its free blocks.
class ThreadSlots {
 public:
  ThreadSlots();
  ThreadSlots(const ThreadSlots&) = delete;
  ThreadSlots& operator=(const ThreadSlots&) = delete;

  /// The calling thread's slot, or nullptr if it has none yet. No lock; two thread-local loads.
  [[nodiscard]] ThreadSlot* mine() const noexcept {
    const Cached& c = cached_;
    if (c.owner == id_) [[likely]] return c.slot;
    return find_mine();
  }
  /// The calling thread's slot, created if needed (under the device lock).
  ThreadSlot* mine_or_create();
  /// Every slot (under the device lock).
  template <class F>
  void for_each(F&& f) {
    for (const auto& s : slots_) f(*s);
  }
  /// More than one thread has a slot (the locked paths then look at the others).
  [[nodiscard]] bool shared() const noexcept { return slots_.size() > 1; }

  /// The epoch of `stream`'s free blocks (created on first use; under the device lock).
  std::atomic<std::uint64_t>* epoch(stream_t stream);

 private:
  struct Cached {
    std::uint64_t owner = 0;
    ThreadSlot* slot = nullptr;
  };
  ThreadSlot* find_mine() const noexcept;

  const std::uint64_t id_;  ///< unique per ThreadSlots ever made: a thread's cache never aliases
  std::vector<std::shared_ptr<ThreadSlot>> slots_;
  std::unordered_map<stream_t, std::unique_ptr<std::atomic<std::uint64_t>>> epochs_;
  static thread_local Cached cached_;
};

}  // namespace stitch::detail
