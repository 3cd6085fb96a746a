// core/immediate_reuse.hpp — immediate reuse, per thread: the free block a thread's last free
// ended in waits in the thread's slot (core/thread_slots.hpp) as an extent, so that its next
// allocations on the same stream take blocks of it without the device lock, of any size best fit
// would serve from it.
//
// A training step frees a temporary and asks for another at once: the same size, or one of a few
// sizes in turn (activations, gradients, workspace). With the device lock, each such free is
// filed (merged with its free neighbours) and each request takes the front of that merged block,
// split off, so every size of the turn lands at the same address. Immediate reuse does exactly
// that, in the slot:
// - The free completes under the lock as any other (statistics, filing); the free block it ended
//   in, F, then leaves the index into the thread's slot, state `parked`: up to kExtents of them.
//   F is still free memory to everyone: the statistics count it free, and every reader and every
//   other path settles the slot first (DeviceLock::lock), which files F back.
// - A request of the owner, on F's stream, in F's pool, under the lock, decides once whether best
//   fit would take F for it: F is the first of the stream's free blocks in best-fit order for the
//   rounded size, may serve it, and is split at the rounded size or taken whole, as the policy
//   says. The verdict (the block's size and what a pair does to the inactive-split statistics) is
//   remembered for that request size (kVerdicts entries, two per bucket of the size's hash).
// - From then on the owner's requests of those sizes take F's front (split by moving the border
//   between two blocks, `head` and `tail`, that stay linked), and their frees give it back, both
//   in the slot: one uncontended spin lock, no shared write. So two threads on one device do not
//   take the device lock from each other at all.
//
// Why the result is what the device lock would have given:
// - F is never next to a free block: it was filed coalesced, and whoever files a neighbour of it
//   settles the slot first (BlockHolder), so they merge as they would have.
// - Whether best fit would take F depends only on its stream's free blocks in its pool: every
//   change to them bumps the stream's epoch (BlockStore::free_changed), and an extent whose epoch
//   is old decides under the lock again. F's own pairs leave them as they were. Other streams'
//   blocks never serve this stream.
// - The pairs taken in a slot leave every current statistic as it was; their running sums and
//   peaks are added when the slot is flushed or settled (before any other change by its owner:
//   malloc and free flush first and settle a handed-out block first). Every reader settles every
//   slot first, and so does every path that could use the memory (a locked allocation on the
//   same stream, the slow path), so nothing observes a slot's state.
// - No pair runs while the history is recorded, while events are outstanding, while a
//   private-pool route is underway, or with immediate reuse off (allow_pairs, note_events).
//   Tagged memory and private pools keep no extents.
#pragma once

#include <algorithm>
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

/// At most this many frees are filed without keeping an extent, after extents of the thread went
/// without a pair several times in a row (miss()), before one keeps an extent again (lifetimes
/// that outlive the next request pay the detach and settle once in this many frees; the first
/// miss skips one free, the next two, then four ...).
constexpr std::uint8_t kColdFrees = 64;

class ImmediateReuse final : public BlockHolder {
 public:
  /// Keeps extents of `store`, counts in `hot` and `stats` (num_immediate_reuses), and enters
  /// extents in `live`; all must outlive it. Registers itself as the store's holder of parked
  /// blocks.
  ImmediateReuse(BlockStore& store, HotStats& hot, DeviceStats& stats, PtrMap<Block>& live);
  ImmediateReuse(const ImmediateReuse&) = delete;
  ImmediateReuse& operator=(const ImmediateReuse&) = delete;

  /// The calling thread's slot, or nullptr if it has none yet (no lock).
  [[nodiscard]] ThreadSlot* mine() const noexcept { return slots_.mine(); }
  /// The calling thread's slot, created if needed (under the device lock; may throw).
  ThreadSlot* mine_or_create() { return slots_.mine_or_create(); }

  // ---- the calling thread's own slot, without the device lock ------------------------------------
  /// A block of one of its extents for `size` bytes on `stream`, when a verdict still holds;
  /// else nullptr.
  void* take(ThreadSlot& s, std::size_t size, stream_t stream) noexcept;
  /// Takes back the block an extent handed out, when that is `ptr` (and the size and stream
  /// match): the free is done (`actual_size` gets the requested size). False: the device lock
  /// decides.
  bool free_again(ThreadSlot& s, void* ptr, const std::size_t* expected_size,
                  const stream_t* stream, std::size_t* actual_size) noexcept;

  // ---- under the device lock -------------------------------------------------------------------
  /// Adds the running sums of the slot's pairs so far (its own slot; the extents stay).
  void flush(ThreadSlot& s) noexcept;
  /// The owner's blocks handed out from its extents become ordinary allocations (before its
  /// locked request or free changes any statistic). At a request (`request`), an extent settled
  /// since without a pair taken from it is a miss (miss(), ThreadSlot::wasted).
  void settle_handouts(ThreadSlot& s, bool request);
  /// A locked allocation of `size` bytes (`rounded`) on `stream` from `pool`: a block of the
  /// thread's first extent that holds it, when best fit would give it (the verdict is decided
  /// here), else nullptr, with that extent filed back when the locked path must decide on it or
  /// it gave no pair yet.
  void* take_back(ThreadSlot& s, std::size_t size, std::size_t rounded, stream_t stream,
                  BlockPool& pool);
  /// Whether a free of the allocated `block` (no events) may keep the free block it ends in as
  /// an extent: reuse on, not oversize, not of a private pool nor tagged (the lock-free take
  /// knows no tags).
  [[nodiscard]] bool may_park(const Block* block) const noexcept {
    return enabled_ && block->state == BlockState::allocated && !block->oversize &&
           block->segment->private_pool == nullptr && block->segment->tag == 0;
  }
  /// Extents did not serve the owner: its next frees keep none, one after a first miss, then
  /// two, four ... up to kColdFrees after misses in a row (own slot, under the device lock).
  void miss(ThreadSlot& s) const noexcept {
    if (!backoff_) return;
    s.backoff = s.backoff == 0 ? 1 : static_cast<std::uint8_t>(std::min(2 * s.backoff, int{kColdFrees}));
    s.cold = s.backoff;
  }
  /// Whether the owner's free should not keep an extent (its extents went without pairs lately);
  /// counts the free (own slot, under the device lock).
  [[nodiscard]] static bool cold_free(ThreadSlot& s) noexcept {
    if (s.cold == 0) return false;
    --s.cold;
    return true;
  }
  /// The free block `free` (just filed) becomes an extent of the calling thread (the oldest filed
  /// back when it keeps kExtents). No verdict yet: the next request of its pool decides.
  void park(ThreadSlot& s, Block* free) noexcept;
  /// Settles `s`'s extents: files back free ones, turns handed-out blocks into ordinary
  /// allocations. Returns whether any extent was free (not handed out).
  bool settle(ThreadSlot& s);
  /// Settles the extent that holds the parked `block`; returns whether it was free (`block` is
  /// then no allocation), false when `block` was handed out (now an ordinary allocation).
  bool settle_block(Block& block);
  /// Settles every slot: the device lock calls it (core/device_lock.hpp). Settling changes the
  /// representation only, never what any query reports.
  void settle_all();
  /// Whether another live thread (not the caller) keeps an extent on `stream` in the small or
  /// large pool that could hold `rounded` bytes.
  [[nodiscard]] bool others_hold(stream_t stream, bool small, std::size_t rounded);
  /// settle_all() for the slow path of a request of `rounded` bytes on `stream` in the small or
  /// large pool: returns whether an extent that could hold it was filed back (another live
  /// thread's: the caller's own were weighed by take_back).
  bool settle_all_for(stream_t stream, bool small, std::size_t rounded);
  /// Settles the extents on `stream` of threads that have ended: a locked allocation on `stream`
  /// then sees their memory free, as it is. (A live thread's extents are its own: see the header
  /// comment; the slow path settles every extent before it asks for new memory.)
  void settle_parked_on(stream_t stream, const ThreadSlot* except);
  /// More than one thread has a slot.
  [[nodiscard]] bool shared() const noexcept { return slots_.shared(); }

  // BlockHolder: the store files a neighbour of a parked block.
  void file_if_freed(Block& block) override { settle_block(block); }
  void release(Block& block) override { settle_block(block); }

  // ---- when pairs may run without the lock ------------------------------------------------------
  /// Immediate reuse on or off (on by default). Results are identical either way; tests compare.
  void set_enabled(bool on) noexcept { enabled_ = on; }
  /// Misses make the owner's next frees keep no extent (on by default; see miss()).
  void set_backoff(bool on) noexcept { backoff_ = on; }
  [[nodiscard]] bool enabled() const noexcept { return enabled_; }
  /// Whether nothing else forbids unlocked pairs (no recording, no private-pool route).
  void allow_pairs(bool allowed) noexcept {
    fast_ok_.store(enabled_ && allowed, std::memory_order_relaxed);
    publish_take();
  }
  /// Whether events are outstanding (the locked path polls them first).
  void note_events(bool outstanding) noexcept {
    events_pending_.store(outstanding, std::memory_order_relaxed);
    publish_take();
  }

 private:
  /// What best fit does with a request for which extent `x` comes first among the thread's.
  enum class Verdict { take, elsewhere, refile };
  /// Whether best fit would take extent `x` of `s` for `rounded` bytes now; on `take`, writes
  /// the verdict (the block it hands out, what a pair does to inactive split) into entry `i`.
  /// `elsewhere`: an indexed block comes first; `refile`: the extent comes first but the
  /// locked path must decide (it may not serve, or the block would be oversize).
  [[nodiscard]] Verdict decide(ThreadSlot& s, std::size_t x, std::size_t i, std::size_t size,
                               std::size_t rounded) const;
  /// Settles extent `x` of `s` (see settle_block); with `judge`, for its owner's workload (a
  /// handed-out block its owner's next request finds, an extent a newer one replaces): if no
  /// pair came back from it, keeping it was wasted (ThreadSlot::wasted).
  bool settle_extent(ThreadSlot& s, std::size_t x, bool judge = false);
  /// Adds the slot's pairs (its lock held).
  void apply_all_pairs(ThreadSlot& s) noexcept;
  /// Adds `times` pairs of verdict `i`: the statistics of each allocation and free in one.
  void apply_pairs(const ThreadSlot& s, std::size_t i, std::uint64_t times) noexcept;
  /// Whether extent `e` lies on `stream` in the small or large pool and could hold `rounded`
  /// bytes (under the device lock).
  static bool holds(const Extent& e, stream_t stream, bool small, std::size_t rounded) noexcept {
    return e.head != nullptr && e.stream == stream && e.small == small && e.bytes >= rounded;
  }
  /// Whether verdict entry `i` is live (its extent's generation).
  static bool live(const ThreadSlot& s, std::size_t i) noexcept {
    return s.requested[i] != 0 && s.vgen[i] == s.extents[s.extent_of[i]].gen;
  }
  /// Forgets the verdicts of extent `x`: all (a new generation), or those that split it
  /// (`split`) or take it whole.
  static void drop_verdicts(ThreadSlot& s, std::size_t x) noexcept { ++s.extents[x].gen; }
  static void drop_verdicts(ThreadSlot& s, std::size_t x, bool split) noexcept;
  /// Hands out verdict `i`'s block of its extent (the owner, its slot's lock held).
  static void* hand_out(ThreadSlot& s, std::size_t i) noexcept {
    Extent& e = s.extents[s.extent_of[i]];
    Block* h = e.head;
    if (e.cur != i) {  // (the same request again finds the border where it was)
      h->size = s.size[i];
      h->requested = s.requested[i];
      if (e.tail != nullptr) {
        e.tail->ptr = h->ptr + s.size[i];
        e.tail->size = e.bytes - s.size[i];
      }
      e.cur = static_cast<std::uint8_t>(i);
    }
    e.out = true;
    ++s.outs[e.small ? 0 : 1];
    s.last_verdict = static_cast<std::uint8_t>(i);
    s.last_out = s.extent_of[i];
    return h->ptr;
  }

  BlockStore& store_;
  HotStats& hot_;
  DeviceStats& stats_;
  PtrMap<Block>& live_;
  ThreadSlots slots_;
  bool enabled_ = true;
  bool backoff_ = true;  ///< see set_backoff
  /// The last stream settle_parked_on looked up, and what the store keeps for it.
  stream_t cached_stream_ = nullptr;
  StreamReuse* cached_reuse_ = nullptr;
  std::atomic<bool> fast_ok_{true};          ///< see allow_pairs
  std::atomic<bool> events_pending_{false};  ///< see note_events
  std::atomic<bool> take_ok_{true};          ///< fast_ok_ and no events: what take() reads
  /// (Under the device lock, after either changes.)
  void publish_take() noexcept {
    take_ok_.store(fast_ok_.load(std::memory_order_relaxed) &&
                       !events_pending_.load(std::memory_order_relaxed),
                   std::memory_order_relaxed);
  }
};

// ---- the pair's path, inline ---------------------------------------------------------------------

inline void* ImmediateReuse::take(ThreadSlot& s, std::size_t size, stream_t stream) noexcept {
  s.lock.lock();
  void* out = nullptr;
  if (take_ok_.load(std::memory_order_relaxed)) {
    // The last verdict first (the same size again), then the size's bucket.
    std::size_t i = s.last_verdict;
    if (s.requested[i] != size) {
      i = verdict_bucket(size);
      if (s.requested[i] != size) ++i;
    }
    if (s.requested[i] == size) {
      const Extent& e = s.extents[s.extent_of[i]];
      // (While a block of the pool is handed out, its free rest would change best fit.)
      if (s.vgen[i] == e.gen && e.stream == stream && s.outs[e.small ? 0 : 1] == 0 &&
          e.epoch->load(std::memory_order_acquire) == e.seen)
        out = hand_out(s, i);
    }
  }
  s.lock.unlock();
  return out;
}

inline bool ImmediateReuse::free_again(ThreadSlot& s, void* ptr, const std::size_t* expected_size,
                                       const stream_t* stream, std::size_t* actual_size) noexcept {
  s.lock.lock();
  // The extent of the last block handed out first (the pair's own), then the others.
  Extent* e = &s.extents[s.last_out];
  if (!e->out || e->head->ptr != ptr) {
    e = nullptr;
    if (s.outs[0] + s.outs[1] != 0) {  // (another one is handed out)
      for (Extent& x : s.extents) {
        if (x.out && x.head->ptr == ptr) {
          e = &x;
          break;
        }
      }
    }
  }
  const bool again = e != nullptr &&
                     (expected_size == nullptr || *expected_size == e->head->requested) &&
                     (stream == nullptr || *stream == e->stream) &&
                     fast_ok_.load(std::memory_order_relaxed);
  if (again) {
    if (actual_size != nullptr) *actual_size = e->head->requested;
    e->out = false;
    --s.outs[e->small ? 0 : 1];
    ++s.pair_count[e->cur];
    ++s.pairs;
  }
  s.lock.unlock();
  return again;
}

inline void ImmediateReuse::flush(ThreadSlot& s) noexcept {
  // The calling thread's own slot, under the device lock: only this thread changes `pairs`
  // without the device lock, so reading it needs no slot lock.
  if (s.pairs == 0) return;
  std::lock_guard lock(s.lock);
  apply_all_pairs(s);
}

inline void ImmediateReuse::settle_handouts(ThreadSlot& s, bool request) {
  // Own slot: `outs` changes only by this thread (or under the device lock, which it holds).
  if (s.outs[0] != 0 || s.outs[1] != 0) {
    for (std::size_t x = 0; x < kExtents; ++x)
      if (s.extents[x].out) settle_extent(s, x, true);
  }
  if (request) {
    if (s.wasted) miss(s);
    s.wasted = false;
  }
}

}  // namespace stitch::detail
