// core/immediate_reuse.hpp — immediate reuse, per thread: each thread's last free on a device
// waits in the thread's slot (core/thread_slots.hpp), so that its next allocation of the same size
// on the same stream takes it straight back without the device lock.
//
// A training loop (or an inference server's worker) frees a temporary and asks for the same
// size on the same stream again at once. The first such free goes through the device lock,
// which parks the block in the calling thread's slot: still in the live table, counted as
// allocated, in state `parked`. The next allocation of that size decides, under the lock, that
// taking it back is what best fit would do (reusable). From then on the pair (allocate it again,
// free it again) touches only the slot: one uncontended spin lock in a cache line of its own, no
// shared write. So two threads on one device do not take the device lock from each other at all,
// and one thread pays what it paid before.
//
// Why the result is what the device lock would have given:
// - A parked block's predecessor is never free: the block store asks this holder to let go of a
//   parked block that comes to follow a free one (BlockHolder::release), so filing it would not
//   move its start.
// - Whether best fit would return it depends only on its stream's free blocks: every change to
//   them bumps the stream's epoch (BlockStore::free_changed), and a slot whose epoch is old takes
//   the locked path again. Other streams' blocks never serve this stream.
// - The pairs taken in a slot leave every current statistic as it was; their running sums are
//   added when the slot is settled. Every reader settles every slot first (DeviceLock::lock),
//   and so does every path that could use the parked memory (a locked allocation on the same
//   stream, the slow path), so nothing observes a slot's state.
// - No pair runs while the history is recorded, while events are outstanding, while a
//   private-pool route is underway, or with immediate reuse off (allow_pairs, note_events).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>

#include "core/block_store.hpp"
#include "core/hot_stats.hpp"
#include "core/ptr_map.hpp"
#include "core/thread_slots.hpp"
#include "stitch/stats.hpp"

namespace stitch::detail {

/// At most this many frees are filed at once, after parked frees of the thread were not taken
/// back several times in a row, before one parks again (a steady mix of sizes pays the park and
/// settle once in this many pairs; the first miss skips one free, the next two, then four ...).
constexpr std::uint8_t kColdFrees = 16;

class ImmediateReuse final : public BlockHolder {
 public:
  /// Parks and files blocks in `store`, counts in `hot` and `stats` (num_immediate_reuses), and
  /// takes settled blocks out of `live`; all must outlive it. Registers itself as the store's
  /// holder of parked blocks.
  ImmediateReuse(BlockStore& store, HotStats& hot, DeviceStats& stats, PtrMap<Block>& live);
  ImmediateReuse(const ImmediateReuse&) = delete;
  ImmediateReuse& operator=(const ImmediateReuse&) = delete;

  /// The calling thread's slot, or nullptr if it has none yet (no lock).
  [[nodiscard]] ThreadSlot* mine() const noexcept { return slots_.mine(); }
  /// The calling thread's slot, created if needed (under the device lock; may throw).
  ThreadSlot* mine_or_create() { return slots_.mine_or_create(); }

  // ---- the calling thread's own slot, without the device lock ------------------------------------
  /// Its parked block, for `size` bytes on `stream`, when the verdict still holds; else nullptr.
  void* take(ThreadSlot& s, std::size_t size, stream_t stream) noexcept;
  /// Parks again the block it handed out, when that is `ptr` (and the size and stream match):
  /// the free is done (`actual_size` gets the requested size). False: the device lock decides.
  bool free_again(ThreadSlot& s, void* ptr, const std::size_t* expected_size,
                  const stream_t* stream, std::size_t* actual_size) noexcept;

  // ---- under the device lock -------------------------------------------------------------------
  /// Adds the running sums of the slot's pairs so far (its own slot; the block stays).
  void flush(ThreadSlot& s) noexcept;
  /// A locked allocation of `size` bytes (`rounded`) on `stream` from `pool`: the thread's parked
  /// block back when best fit would give it (the verdict is decided here), else nullptr with the
  /// parked free completed.
  void* take_back(ThreadSlot& s, std::size_t size, std::size_t rounded, stream_t stream,
                  BlockPool& pool);
  /// Whether a free of the allocated `block` (no events) may wait in a slot: reuse on, not
  /// oversize, not of a private pool nor tagged (the lock-free take knows no tags), and no free
  /// block in front (the filed block would start
  /// elsewhere, so it could not come back).
  [[nodiscard]] bool may_park(const Block* block) const noexcept {
    return enabled_ && block->state == BlockState::allocated && !block->oversize &&
           (block->prev == nullptr || !block->prev->is_free()) &&
           block->segment->private_pool == nullptr && block->segment->tag == 0;
  }
  /// Whether the owner's free should be filed at once rather than parked (its last parked free
  /// was not taken back lately); counts the free (own slot, under the device lock).
  [[nodiscard]] static bool cold_free(ThreadSlot& s) noexcept {
    if (s.cold == 0) return false;
    --s.cold;
    return true;
  }
  /// Parks the freed `block` in the calling thread's slot `s` (empty). No verdict yet: the next
  /// allocation of its size decides it.
  void park(ThreadSlot& s, Block* block) noexcept;
  /// Settles `s`: a parked free completes (true), a handed-out block becomes an ordinary
  /// allocation (false).
  bool settle(ThreadSlot& s);
  /// Settles every slot: the device lock calls it (core/device_lock.hpp). Settling changes the
  /// representation only, never what any query reports.
  void settle_all();
  /// Settles the other threads' slots whose block is parked on `stream`: a locked allocation on
  /// `stream` then sees their memory free, as it is.
  void settle_parked_on(stream_t stream, const ThreadSlot* except);
  /// More than one thread has a slot.
  [[nodiscard]] bool shared() const noexcept { return slots_.shared(); }

  // BlockHolder: the store files a neighbour of a parked block.
  void file_if_freed(Block& block) override;
  void release(Block& block) override;

  // ---- when pairs may run without the lock ------------------------------------------------------
  /// Immediate reuse on or off (on by default). Results are identical either way; tests compare.
  void set_enabled(bool on) noexcept { enabled_ = on; }
  [[nodiscard]] bool enabled() const noexcept { return enabled_; }
  /// Whether nothing else forbids unlocked pairs (no recording, no private-pool route).
  void allow_pairs(bool allowed) noexcept {
    fast_ok_.store(enabled_ && allowed, std::memory_order_relaxed);
  }
  /// Whether events are outstanding (the locked path polls them first).
  void note_events(bool outstanding) noexcept {
    events_pending_.store(outstanding, std::memory_order_relaxed);
  }

 private:
  /// Whether a request of `rounded` bytes on its stream, right after filing the parked `block`,
  /// would get this very block back and leave everything else as it is (the best fit of the
  /// filed block, merged with a free successor); and how the pair moves the inactive-split
  /// statistics.
  [[nodiscard]] std::optional<PairEffect> reuse_effect(const Block* block,
                                                       std::size_t rounded) const;
  /// Adds `times` pairs of `block` with effect `e`: the statistics of each completed free and
  /// allocation in one.
  void apply_pairs(const Block* block, const PairEffect& e, std::uint64_t times) noexcept;
  void apply_inactive(const Block* block, const PairEffect& e, std::int64_t n) noexcept;

  BlockStore& store_;
  HotStats& hot_;
  DeviceStats& stats_;
  PtrMap<Block>& live_;
  ThreadSlots slots_;
  bool enabled_ = true;
  std::atomic<bool> fast_ok_{true};          ///< see allow_pairs
  std::atomic<bool> events_pending_{false};  ///< see note_events
};

// ---- the pair's path, inline ---------------------------------------------------------------------

inline void* ImmediateReuse::take(ThreadSlot& s, std::size_t size, stream_t stream) noexcept {
  s.lock.lock();
  Block* b = s.block;
  void* out = nullptr;
  if (b != nullptr && s.parked && s.reusable && b->requested == size && b->stream == stream &&
      fast_ok_.load(std::memory_order_relaxed) &&
      !events_pending_.load(std::memory_order_relaxed) &&
      s.epoch->load(std::memory_order_acquire) == s.seen) {
    s.parked = false;
    ++s.pairs;
    out = b->ptr;
  }
  s.lock.unlock();
  return out;
}

inline bool ImmediateReuse::free_again(ThreadSlot& s, void* ptr, const std::size_t* expected_size,
                                const stream_t* stream, std::size_t* actual_size) noexcept {
  s.lock.lock();
  Block* b = s.block;
  const bool again = b != nullptr && !s.parked && b->ptr == ptr &&
                     (expected_size == nullptr || *expected_size == b->requested) &&
                     (stream == nullptr || *stream == b->stream) &&
                     fast_ok_.load(std::memory_order_relaxed);
  if (again) {
    if (actual_size != nullptr) *actual_size = b->requested;
    s.parked = true;
  }
  s.lock.unlock();
  return again;
}

inline void ImmediateReuse::flush(ThreadSlot& s) noexcept {
  // The calling thread's own slot, under the device lock: only this thread changes `pairs`
  // without the device lock, so reading it needs no slot lock.
  if (s.pairs == 0) return;
  std::lock_guard lock(s.lock);
  if (s.block != nullptr) apply_pairs(s.block, s.effect, s.pairs);
  s.pairs = 0;
}

}  // namespace stitch::detail
