// core/hot_stats.hpp — the statistics that every allocation and free changes, kept in a form
// that costs the fast path fewer memory updates than DeviceStats, and expanded into DeviceStats
// on read (HotStats::expand).
//
// Two identities do the saving:
// - "all" is the sum of the two pools in current, allocated and freed; only its peak is tracked
//   (on each increase), so a decrease touches one pool and nothing else;
// - active = allocated + pending (blocks freed by the caller that still wait for events on other
//   streams). A free without events changes the allocation counters only; active's current,
//   allocated and freed follow from them, and only its peak is tracked, on allocation.
// Not thread-safe: it lives under its device's lock.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "stitch/stats.hpp"

namespace stitch::detail {

/// One statistic for the two pools, with the peak of their sum.
struct PoolCounter {
  std::array<Stat, 2> pool{};  ///< [0] small pool, [1] large pool
  std::int64_t all_peak = 0;

  [[nodiscard]] std::int64_t current() const noexcept { return pool[0].current + pool[1].current; }
  [[gnu::always_inline]] void add(bool small, std::int64_t n) noexcept {
    pool[small ? 0 : 1].increase(n);
    const std::int64_t total = current();
    if (total > all_peak) all_peak = total;
  }
  [[gnu::always_inline]] void sub(bool small, std::int64_t n) noexcept {
    pool[small ? 0 : 1].decrease(n);
  }
  /// The value rose by `n` and fell back (a free and re-allocation that cancelled out, see
  /// ImmediateReuse::apply_pairs): running sums and peaks as if both steps were applied.
  [[gnu::always_inline]] void rise_and_fall(bool small, std::int64_t n) noexcept {
    Stat& s = pool[small ? 0 : 1];
    s.allocated += n;
    s.freed += n;
    if (s.current + n > s.peak) s.peak = s.current + n;
    if (current() + n > all_peak) all_peak = current() + n;
  }
  /// The value fell by `n` and rose back: the running sums move, the peaks cannot.
  [[gnu::always_inline]] void fall_and_rise(bool small, std::int64_t n) noexcept {
    Stat& s = pool[small ? 0 : 1];
    s.allocated += n;
    s.freed += n;
  }
  /// `times` rises by `n` that each fell back at once: the sums move `times` over, the peaks
  /// as for one.
  void rise_and_fall(bool small, std::int64_t n, std::int64_t times) noexcept {
    if (times <= 0) return;
    rise_and_fall(small, n);
    Stat& s = pool[small ? 0 : 1];
    s.allocated += n * (times - 1);
    s.freed += n * (times - 1);
  }
  void reset_peak() noexcept {
    for (Stat& s : pool) s.reset_peak();
    all_peak = current();
  }
  void reset_accumulated() noexcept {
    for (Stat& s : pool) s.reset_accumulated();
  }
  /// The PyTorch view: all, small pool, large pool.
  void expand(StatArray& out) const noexcept {
    out[kSmallPool] = pool[0];
    out[kLargePool] = pool[1];
    out[kAll] = Stat{current(), all_peak, pool[0].allocated + pool[1].allocated,
                     pool[0].freed + pool[1].freed};
  }
};

/// A statistic that is the sum of an allocation counter and a pending counter (active, or
/// active_bytes): only its peaks are stored. While nothing is pending it equals the allocation
/// counter, whose own peak then covers it, so note() is needed only while something is pending
/// (HotStats::allocated_block checks that).
struct ActiveCounter {
  std::array<std::int64_t, 2> peak{};
  std::int64_t all_peak = 0;
  /// Pending amounts when the running sums were last reset: active's freed count restarts there.
  std::array<std::int64_t, 2> pending_at_reset{};

  /// After an increase of `allocated` in the pool `small` (pending never grows active).
  void note(const PoolCounter& allocated, const PoolCounter& pending, bool small) noexcept {
    const int p = small ? 0 : 1;
    const std::int64_t here = allocated.pool[p].current + pending.pool[p].current;
    if (here > peak[p]) peak[p] = here;
    const std::int64_t total = allocated.current() + pending.current();
    if (total > all_peak) all_peak = total;
  }
  void reset_peak(const PoolCounter& allocated, const PoolCounter& pending) noexcept {
    for (int p = 0; p < 2; ++p) peak[p] = allocated.pool[p].current + pending.pool[p].current;
    all_peak = allocated.current() + pending.current();
  }
  void reset_accumulated(const PoolCounter& pending) noexcept {
    for (int p = 0; p < 2; ++p) pending_at_reset[p] = pending.pool[p].current;
  }
  void expand(const PoolCounter& allocated, const PoolCounter& pending,
              StatArray& out) const noexcept {
    Stat all{0, std::max(all_peak, allocated.all_peak), 0, 0};
    for (int p = 0; p < 2; ++p) {
      const Stat& a = allocated.pool[p];
      const std::int64_t waiting = pending.pool[p].current;
      // Every allocation entered active; a block left it when freed, unless still pending.
      const Stat s{a.current + waiting, std::max(peak[p], a.peak), a.allocated,
                   a.freed - waiting + pending_at_reset[p]};
      out[p == 0 ? kSmallPool : kLargePool] = s;
      all.current += s.current;
      all.allocated += s.allocated;
      all.freed += s.freed;
    }
    out[kAll] = all;
  }
};

/// The fast path's statistics of one device.
struct HotStats {
  PoolCounter allocation, allocated_bytes, requested_bytes, inactive_split, inactive_split_bytes;
  PoolCounter pending, pending_bytes;  ///< freed blocks waiting for events (not reported)
  ActiveCounter active, active_bytes;

  /// A block of `bytes` became allocated for `requested` bytes.
  void allocated_block(bool small, std::int64_t bytes, std::int64_t requested) noexcept {
    allocation.add(small, 1);
    allocated_bytes.add(small, bytes);
    requested_bytes.add(small, requested);
    if (pending.current() != 0) {
      active.note(allocation, pending, small);
      active_bytes.note(allocated_bytes, pending_bytes, small);
    }
  }
  /// The caller freed a block; it waits for events when `pending_events`.
  void freed_block(bool small, std::int64_t bytes, bool pending_events) noexcept {
    allocation.sub(small, 1);
    allocated_bytes.sub(small, bytes);
    if (pending_events) {
      pending.add(small, 1);
      pending_bytes.add(small, bytes);
    }
  }
  /// A pending block's last event completed.
  void pending_done(bool small, std::int64_t bytes) noexcept {
    pending.sub(small, 1);
    pending_bytes.sub(small, bytes);
  }
  /// A block left the active set (freed and no longer pending).
  void inactive_block(bool small, std::int64_t requested) noexcept {
    requested_bytes.sub(small, requested);
  }

  void expand(DeviceStats& out) const noexcept {
    allocation.expand(out.allocation);
    allocated_bytes.expand(out.allocated_bytes);
    requested_bytes.expand(out.requested_bytes);
    inactive_split.expand(out.inactive_split);
    inactive_split_bytes.expand(out.inactive_split_bytes);
    active.expand(allocation, pending, out.active);
    active_bytes.expand(allocated_bytes, pending_bytes, out.active_bytes);
  }
  void reset_peak() noexcept {
    for (PoolCounter* c : {&allocation, &allocated_bytes, &requested_bytes, &inactive_split,
                           &inactive_split_bytes, &pending, &pending_bytes})
      c->reset_peak();
    active.reset_peak(allocation, pending);
    active_bytes.reset_peak(allocated_bytes, pending_bytes);
  }
  void reset_accumulated() noexcept {
    for (PoolCounter* c : {&allocation, &allocated_bytes, &requested_bytes, &inactive_split,
                           &inactive_split_bytes, &pending, &pending_bytes})
      c->reset_accumulated();
    active.reset_accumulated(pending);
    active_bytes.reset_accumulated(pending_bytes);
  }
};

}  // namespace stitch::detail
