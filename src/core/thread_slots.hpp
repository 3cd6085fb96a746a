// core/thread_slots.hpp — the data of immediate reuse (core/immediate_reuse.hpp): each thread's
// slot on a device (the block it parked there, the verdict on taking it back, the pairs taken
// since), and the device's registry of slots, with each thread's lookup of its own.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/spin_lock.hpp"
#include "stitch/backend.hpp"

namespace stitch::detail {

struct Block;

/// What one pair (a parked block taken back) does to the inactive-split statistics: it files
/// the block (merged with a free successor, maybe) and takes it again, which cancels out but
/// moves the running sums (ImmediateReuse::reuse_effect and apply_pairs).
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
  /// The owner's next frees that are filed at once instead of parked: set when a parked free was
  /// not taken back (the owner's next request was another size or stream: a mix of sizes, where
  /// parking costs a settle per pair and saves nothing), counted down by each such free, so that
  /// a return to same-size pairs is noticed again (ImmediateReuse::cold_free). Owner-only (set
  /// and counted down under the device lock, read without it): while it is not 0 the slot holds
  /// no block, so the owner skips the slot's lock-free take and free.
  std::uint8_t cold = 0;
  /// What `cold` is set to at the next miss: doubled by each miss in a row (1, 2, 4 ... up to
  /// kColdFrees), back to 0 when a parked free is taken back.
  std::uint8_t backoff = 0;
  PairEffect effect;        ///< what each of those pairs does to the inactive-split statistics
  // Read by other threads under the device lock (a cache line of its own, rarely written).
  alignas(64) std::atomic<stream_t> parked_stream{nullptr};  ///< the parked block's stream
};

/// The slots of one device.
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
  /// Empties the calling thread's cache of its slot (a region opens: ThreadSlots::find_mine).
  static void forget_mine() noexcept { cached_ = Cached{}; }
  /// More than one thread has a slot (the locked paths then look at the others).
  [[nodiscard]] bool shared() const noexcept { return slots_.size() > 1; }

 private:
  struct Cached {
    std::uint64_t owner = 0;
    ThreadSlot* slot = nullptr;
  };
  ThreadSlot* find_mine() const noexcept;

  const std::uint64_t id_;  ///< unique per ThreadSlots ever made: a thread's cache never aliases
  std::vector<std::shared_ptr<ThreadSlot>> slots_;
  static thread_local Cached cached_;
};

}  // namespace stitch::detail
