// core/hot_stats.hpp — the statistics that every allocation and free changes: counted per stream
// shard (core/stream_shard.hpp), so that threads on different streams write none of the same
// memory, and summed on read; and their peaks, which are the device's, kept exact by PeakBoard.
//
// The counters (allocation, allocated, requested and inactive-split blocks and bytes, each per
// pool) live in ShardStats, changed only under the shard's lock. A peak is the largest device-wide
// sum ever reached, so every increase must know whether it makes a new one without reading the
// other shards, which other threads are writing. Each shard publishes a ceiling per counter, at
// or above its value at all times (raised, rarely, when the value passes it), and caches its room:
// min(its own ceiling, the peak - the other shards' ceilings). An increase that stays within the
// room cannot make a new peak, so it costs a comparison; one that passes it reads the other
// shards' values and raises the peak if the sum is above it (PeakBoard::observe). A raised
// ceiling bumps the board's version, and a shard whose cached version is old recomputes its room
// first. So every peak is exact whenever the shards' changes are ordered (one thread, or threads
// that take turns); threads that truly run at once read each other's values as they are at that
// moment (docs/diagnostics.md).
//
// Blocks waiting for events (pending) and the active peaks are counted device-wide, under the
// device lock: while a block is pending the cache hit is closed (core/cache_hit.hpp), so only the
// device lock changes them. active = allocated + pending: a free without events changes the
// allocation counters only, and active's own peaks are tracked only while something is pending.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>

#include "stitch/stats.hpp"

// ThreadSanitizer, which sees no inline assembly (GCC defines the first, Clang has the second).
#if defined(__SANITIZE_THREAD__)
#define STITCH_HOT_STATS_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define STITCH_HOT_STATS_TSAN 1
#endif
#endif
#ifndef STITCH_HOT_STATS_TSAN
#define STITCH_HOT_STATS_TSAN 0
#endif

namespace stitch::detail {

struct StreamShard;

/// The counters a shard keeps.
enum HotCounter : int {
  kAllocations,
  kAllocatedBytes,
  kRequestedBytes,
  kInactiveSplits,
  kInactiveSplitBytes,
  kHotCounters
};
/// A tracked peak: counter `c` in pool `p` (0 small, 1 large) or in both (p = 2).
constexpr int kTracked = kHotCounters * 3;
constexpr int tracked(int c, int p) noexcept { return c * 3 + p; }

/// A counter only its shard's lock holder writes, which other threads read (HotStats::observe):
/// the owner reads it plainly and writes it with a relaxed atomic store, others load it atomically.
class OwnedCounter {
 public:
  [[nodiscard]] std::int64_t get() const noexcept { return v_; }
  void set(std::int64_t v) noexcept { std::atomic_ref<std::int64_t>(v_).store(v, std::memory_order_relaxed); }
  /// set(get() + n) (Sign 1) or set(get() - n) (Sign -1), where the new value is not needed: on
  /// x86-64 one add or subtract to memory, whose store other threads load whole (as a relaxed
  /// atomic store; only the owner writes). ThreadSanitizer builds keep set(), which it sees.
  template <int Sign>
  void add(std::int64_t n) noexcept {
#if defined(__x86_64__) && !STITCH_HOT_STATS_TSAN
    if constexpr (Sign > 0) {
      asm("addq %1, %0" : "+m"(v_) : "er"(n));
    } else {
      asm("subq %1, %0" : "+m"(v_) : "er"(n));
    }
#else
    set(v_ + Sign * n);
#endif
  }
  [[nodiscard]] std::int64_t read() const noexcept {
    return std::atomic_ref<std::int64_t>(const_cast<std::int64_t&>(v_)).load(std::memory_order_relaxed);
  }

 private:
  alignas(8) std::int64_t v_ = 0;
};

/// One shard's counters.
struct ShardStats {
  alignas(64) OwnedCounter cur[kHotCounters][2] = {};
  /// The running sum of increases; the sum of decreases follows: allocated - cur + at_reset,
  /// where at_reset is `cur` when the sums were last reset (read under the device lock).
  std::int64_t allocated[kHotCounters][2] = {};
  std::int64_t at_reset[kHotCounters][2] = {};
  std::int64_t hits = 0;  ///< allocations the cache hit served (num_cache_hits)
  /// How far each tracked value may rise before it could make a new peak (PeakBoard).
  std::int64_t room[kTracked] = {};
  std::uint64_t seen = ~std::uint64_t{0};  ///< the board's version `room` was computed at
  /// At or above the tracked values at all times; read by the other shards.
  alignas(64) std::atomic<std::int64_t> ceiling[kTracked] = {};

  [[nodiscard]] std::int64_t value(int k) const noexcept {
    const int c = k / 3;
    const int p = k % 3;
    if (p < 2) return cur[c][p].read();
    return cur[c][0].read() + cur[c][1].read();
  }
};

/// A device-wide counter in the two pools (pending blocks), under the device lock.
struct PoolCounter {
  std::array<std::int64_t, 2> current{};  ///< [0] small pool, [1] large pool
  [[nodiscard]] std::int64_t total() const noexcept { return current[0] + current[1]; }
  void add(bool small, std::int64_t n) noexcept { current[small ? 0 : 1] += n; }
  void sub(bool small, std::int64_t n) noexcept { current[small ? 0 : 1] -= n; }
};

/// The device's hot statistics: the peaks of the shards' counters, the pending counters and the
/// active peaks. `head` is the first shard of the device (StreamShards).
class HotStats {
 public:
  explicit HotStats(const std::atomic<StreamShard*>& head) noexcept : head_(head) {}
  HotStats(const HotStats&) = delete;
  HotStats& operator=(const HotStats&) = delete;

  /// A block of `bytes` became allocated for `requested` bytes (the device lock is held).
  [[gnu::always_inline]] void allocated_block(ShardStats& st, bool small, std::int64_t bytes,
                                              std::int64_t requested) noexcept {
    hit_allocated(st, small, bytes, requested);
    if (pending_.total() != 0) [[unlikely]] note_active(small);
  }
  /// allocated_block() for the cache hit (the shard's lock is held): nothing is pending while
  /// the hit is open, so active's peaks need no look.
  [[gnu::always_inline]] void hit_allocated(ShardStats& st, bool small, std::int64_t bytes,
                                            std::int64_t requested) noexcept {
    if (small) {
      allocated_in<0>(st, bytes, requested);
    } else {
      allocated_in<1>(st, bytes, requested);
    }
  }
  /// The cache hit freed a block of `bytes` that served `requested` bytes (no events: it leaves
  /// the active set at once).
  [[gnu::always_inline]] static void hit_freed(ShardStats& st, bool small, std::int64_t bytes,
                                               std::int64_t requested) noexcept {
    freed_block(st, small, bytes);
    inactive_block(st, small, requested);
  }
  /// A net change of the inactive-split counters by `blocks` and `bytes` (a split or a merge).
  [[gnu::always_inline]] void inactive_change(ShardStats& st, bool small, std::int64_t blocks,
                                              std::int64_t bytes) noexcept {
    if (small) {
      inactive_in<0>(st, blocks, bytes);
    } else {
      inactive_in<1>(st, blocks, bytes);
    }
  }
  /// `st`'s counter `c` in pool `small` fell by n >= 0.
  [[gnu::always_inline]] static void sub(ShardStats& st, int c, bool small, std::int64_t n) noexcept {
    const int p = small ? 0 : 1;
    st.cur[c][p].set(st.cur[c][p].get() - n);
  }
  /// A signed change of counter `c`, peaks included (tests; the store's is inactive_change).
  void change(ShardStats& st, int c, bool small, std::int64_t n) noexcept {
    const int p = small ? 0 : 1;
    st.cur[c][p].set(st.cur[c][p].get() + n);
    if (n > 0) {
      st.allocated[c][p] += n;
      observe(st, c, p);
    }
  }
  /// The caller freed a block.
  [[gnu::always_inline]] static void freed_block(ShardStats& st, bool small, std::int64_t bytes) noexcept {
    sub(st, kAllocations, small, 1);
    sub(st, kAllocatedBytes, small, bytes);
  }
  /// A freed block waits for events (device lock).
  void pending_block(bool small, std::int64_t bytes) noexcept {
    pending_.add(small, 1);
    pending_bytes_.add(small, bytes);
  }
  /// A pending block's last event completed (device lock).
  void pending_done(bool small, std::int64_t bytes) noexcept {
    pending_.sub(small, 1);
    pending_bytes_.sub(small, bytes);
  }
  /// A block left the active set (freed and no longer pending).
  static void inactive_block(ShardStats& st, bool small, std::int64_t requested) noexcept {
    if (requested != 0) sub(st, kRequestedBytes, small, requested);
  }

  // ---- a held block's pairs (core/pair_verdict.hpp; the shard's lock is held) -------------------
  /// The board's version: a shard's rooms hold while it equals the shard's `seen`.
  [[nodiscard]] std::uint64_t board() const noexcept { return version_.load(std::memory_order_relaxed); }
  /// How far each counter of `st` in pool `small` may rise before the rise could make a new peak
  /// of the pool's or the device's (room - value, the smaller of the two; negative when past), by
  /// rooms that hold while the board is unchanged (board() == st.seen).
  /// `other`: the other pool's values.
  void slack(ShardStats& st, bool small, std::int64_t (&out)[kHotCounters],
             std::int64_t (&other)[kHotCounters]) noexcept;
  /// Whether every counter of `st` in pool `small` is at most `limit`.
  [[nodiscard]] static bool within(const ShardStats& st, bool small,
                                   const std::int64_t (&limit)[kHotCounters]) noexcept {
    const int p = small ? 0 : 1;
    int over = 0;
    for (int c = 0; c < kHotCounters; ++c) over |= static_cast<int>(st.cur[c][p].get() > limit[c]);
    return over == 0;
  }
  /// What a pair's take does to the inactive-split counters (core/pair_verdict.hpp).
  enum class PairSplit : std::uint8_t {
    none,    ///< nothing: an expandable segment
    fresh,   ///< the rest becomes a new split block: (+1, merged - bytes)
    shrink,  ///< the free block, already split, shrinks: (0, -bytes)
  };
  /// A pair's take (Sign +1) in pool P (0 small, 1 large): a block of `bytes` allocated for
  /// `requested`, the inactive-split counters changed as `split` says, with no look at the peaks
  /// (the pair's verdict ruled out a new one); or (Sign -1) the pair's free, which undoes it.
  template <int P, int Sign>
  [[gnu::always_inline]] static void pair(ShardStats& st, std::int64_t bytes, std::int64_t requested,
                                          PairSplit split, std::int64_t merged) noexcept {
    move<P, Sign>(st, kAllocations, 1);
    move<P, Sign>(st, kAllocatedBytes, bytes);
    move<P, Sign>(st, kRequestedBytes, requested);
    if (split == PairSplit::fresh) {
      move<P, Sign>(st, kInactiveSplits, 1);
      move<P, Sign>(st, kInactiveSplitBytes, merged - bytes);
    } else if (split == PairSplit::shrink) {
      move<P, -Sign>(st, kInactiveSplitBytes, bytes);
    }
  }

  // ---- under the device lock (every shard's lock held) ------------------------------------------
  /// The device-wide current value of counter `c` (both pools).
  [[nodiscard]] std::int64_t current(int c) const noexcept;
  /// Fills the fast path's statistics of `out` (allocation, allocated, requested, active and
  /// inactive split), summing the shards.
  void expand(DeviceStats& out) const noexcept;
  void reset_peak() noexcept;
  void reset_accumulated() noexcept;

 private:
  /// Counter `c` of pool P rose by n > 0: its new value (and the running sum).
  template <int P>
  [[gnu::always_inline]] static std::int64_t rise(ShardStats& st, int c, std::int64_t n) noexcept {
    const std::int64_t v = st.cur[c][P].get() + n;
    st.cur[c][P].set(v);
    st.allocated[c][P] += n;
    return v;
  }
  /// Whether counter `c` of pool P at `v` passes a room: its pool's, or (with the other pool's
  /// value) the device's.
  /// (An int, so that several tests combine without branches: `|`, not `||`.)
  template <int P>
  [[gnu::always_inline]] static int passes(const ShardStats& st, int c, std::int64_t v) noexcept {
    return static_cast<int>(v > st.room[tracked(c, P)]) |
           static_cast<int>(v + st.cur[c][1 - P].get() > st.room[tracked(c, 2)]);
  }
  template <int P>
  [[gnu::always_inline]] void allocated_in(ShardStats& st, std::int64_t bytes,
                                           std::int64_t requested) noexcept {
    const std::int64_t a = rise<P>(st, kAllocations, 1);
    const std::int64_t b = rise<P>(st, kAllocatedBytes, bytes);
    const std::int64_t r = rise<P>(st, kRequestedBytes, requested);
    // One test for the six peaks the three counters may pass (and the board's version).
    if (passes<P>(st, kAllocations, a) | passes<P>(st, kAllocatedBytes, b) |
        passes<P>(st, kRequestedBytes, r) |
        static_cast<int>(version_.load(std::memory_order_relaxed) != st.seen)) [[unlikely]] {
      for (int c : {kAllocations, kAllocatedBytes, kRequestedBytes}) observe(st, c, P);
    }
  }
  template <int P>
  [[gnu::always_inline]] void inactive_in(ShardStats& st, std::int64_t blocks,
                                          std::int64_t bytes) noexcept {
    int maybe_peak = 0;
    if (blocks > 0) {
      maybe_peak = passes<P>(st, kInactiveSplits, rise<P>(st, kInactiveSplits, blocks));
    } else if (blocks < 0) {
      st.cur[kInactiveSplits][P].set(st.cur[kInactiveSplits][P].get() + blocks);
    }
    if (bytes > 0) {
      maybe_peak |= passes<P>(st, kInactiveSplitBytes, rise<P>(st, kInactiveSplitBytes, bytes));
    } else if (bytes < 0) {
      st.cur[kInactiveSplitBytes][P].set(st.cur[kInactiveSplitBytes][P].get() + bytes);
    }
    if ((blocks > 0 || bytes > 0) &&
        (maybe_peak || version_.load(std::memory_order_relaxed) != st.seen)) [[unlikely]] {
      observe(st, kInactiveSplits, P);
      observe(st, kInactiveSplitBytes, P);
    }
  }
  /// Counter `c` of pool P rises (Sign +1, its running sum too) or falls by n >= 0.
  template <int P, int Sign>
  [[gnu::always_inline]] static void move(ShardStats& st, int c, std::int64_t n) noexcept {
    st.cur[c][P].template add<Sign>(n);
    if constexpr (Sign > 0) st.allocated[c][P] += n;
  }
  /// The slow half of a rise: a room passed, or the board changed since the rooms were computed.
  void observe(ShardStats& st, int c, int p) noexcept;
  /// Recomputes every room of `st` from the board.
  void refresh(ShardStats& st) noexcept;
  /// The active peaks, after an allocation while blocks are pending.
  void note_active(bool small) noexcept;

  const std::atomic<StreamShard*>& head_;
  /// The device's peaks of the tracked values, and the version of the shards' ceilings.
  std::atomic<std::int64_t> peak_[kTracked] = {};
  alignas(64) std::atomic<std::uint64_t> version_{0};
  alignas(64) PoolCounter pending_, pending_bytes_;
  /// active = allocated + pending: its peaks while something is pending ([small, large, all]).
  std::int64_t active_peak_[3] = {}, active_bytes_peak_[3] = {};
  /// Pending amounts when the running sums were last reset: active's freed count restarts there.
  std::array<std::int64_t, 2> pending_at_reset_{}, pending_bytes_at_reset_{};
};

}  // namespace stitch::detail
