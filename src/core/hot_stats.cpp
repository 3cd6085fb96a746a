// core/hot_stats.cpp — HotStats: the slow half of a peak's check (a room passed: the other shards'
// values summed), the rooms recomputed, and the expansion into DeviceStats.
#include "core/hot_stats.hpp"

#include "core/stream_shard.hpp"

namespace stitch::detail {

namespace {

template <typename Fn>
void for_each_shard(const std::atomic<StreamShard*>& head, Fn&& fn) {  // (fn may change a shard's ceilings)
  for (StreamShard* s = head.load(std::memory_order_acquire); s != nullptr;
       s = s->next.load(std::memory_order_acquire))
    fn(s->stats);
}

StatArray& field(DeviceStats& out, int c) noexcept {
  switch (c) {
    case kAllocations: return out.allocation;
    case kAllocatedBytes: return out.allocated_bytes;
    case kRequestedBytes: return out.requested_bytes;
    case kInactiveSplits: return out.inactive_split;
    default: return out.inactive_split_bytes;
  }
}

}  // namespace

void HotStats::observe(ShardStats& st, int c, int p) noexcept {
  if (version_.load(std::memory_order_acquire) != st.seen) refresh(st);
  for (const int k : {tracked(c, p), tracked(c, 2)}) {
    const std::int64_t v = st.value(k);
    if (v > st.ceiling[k].load(std::memory_order_relaxed)) {
      // The other shards' rooms assumed this shard stays under its ceiling: they recompute.
      st.ceiling[k].store(v, std::memory_order_release);
      const std::uint64_t old = version_.fetch_add(1, std::memory_order_acq_rel);
      if (old == st.seen) st.seen = old + 1;  // (else another shard's change is still to see)
    }
    if (v <= st.room[k]) continue;
    // Could be a new peak: the sum of every shard's value decides. The other shards' ceilings
    // come down to their values on the way (they stay at or above them: a shard raises its own
    // when it passes it, and a lowered one makes its owner recompute its room, by the version),
    // so that a shard that held much once does not keep the others' rooms at nothing.
    std::int64_t total = 0, others = 0;
    bool lowered = false;
    for_each_shard(head_, [&](ShardStats& o) {
      if (&o == &st) {
        total += v;
        return;
      }
      const std::int64_t value = o.value(k);
      total += value;
      std::int64_t c = o.ceiling[k].load(std::memory_order_acquire);
      if (c > value && o.ceiling[k].compare_exchange_strong(c, value, std::memory_order_acq_rel)) {
        c = value;
        lowered = true;
      }
      others += c;
    });
    if (lowered) {  // (this shard's rooms stay valid: a lower ceiling only makes them larger)
      const std::uint64_t old = version_.fetch_add(1, std::memory_order_acq_rel);
      if (old == st.seen) st.seen = old + 1;
    }
    std::int64_t peak = peak_[k].load(std::memory_order_relaxed);
    while (total > peak &&
           !peak_[k].compare_exchange_weak(peak, total, std::memory_order_relaxed)) {
    }
    if (total > peak) peak = total;
    st.room[k] = std::min(st.ceiling[k].load(std::memory_order_relaxed), peak - others);
  }
}

void HotStats::refresh(ShardStats& st) noexcept {
  st.seen = version_.load(std::memory_order_acquire);
  std::int64_t others[kTracked] = {};
  for_each_shard(head_, [&](const ShardStats& o) {
    if (&o == &st) return;
    for (int k = 0; k < kTracked; ++k) others[k] += o.ceiling[k].load(std::memory_order_acquire);
  });
  for (int k = 0; k < kTracked; ++k)
    st.room[k] = std::min(st.ceiling[k].load(std::memory_order_relaxed),
                          peak_[k].load(std::memory_order_relaxed) - others[k]);
}

void HotStats::slack(ShardStats& st, bool small, std::int64_t (&out)[kHotCounters],
                     std::int64_t (&other)[kHotCounters]) noexcept {
  const int p = small ? 0 : 1;
  for (int c = 0; c < kHotCounters; ++c) {
    const std::int64_t v = st.cur[c][p].get();
    other[c] = st.cur[c][1 - p].get();
    out[c] = std::min(st.room[tracked(c, p)] - v, st.room[tracked(c, 2)] - v - other[c]);
  }
}

std::int64_t HotStats::current(int c) const noexcept {
  std::int64_t n = 0;
  for_each_shard(head_, [&](const ShardStats& o) { n += o.value(tracked(c, 2)); });
  return n;
}

void HotStats::note_active(bool small) noexcept {
  const int p = small ? 0 : 1;
  std::int64_t blocks = pending_.current[static_cast<std::size_t>(p)];
  std::int64_t bytes = pending_bytes_.current[static_cast<std::size_t>(p)];
  for_each_shard(head_, [&](const ShardStats& o) {
    blocks += o.value(tracked(kAllocations, p));
    bytes += o.value(tracked(kAllocatedBytes, p));
  });
  active_peak_[p] = std::max(active_peak_[p], blocks);
  active_bytes_peak_[p] = std::max(active_bytes_peak_[p], bytes);
  active_peak_[2] = std::max(active_peak_[2], current(kAllocations) + pending_.total());
  active_bytes_peak_[2] =
      std::max(active_bytes_peak_[2], current(kAllocatedBytes) + pending_bytes_.total());
}

void HotStats::expand(DeviceStats& out) const noexcept {
  for (int c = 0; c < kHotCounters; ++c) {
    Stat pools[2] = {};
    for_each_shard(head_, [&](const ShardStats& o) {
      for (int p = 0; p < 2; ++p) {
        pools[p].current += o.cur[c][p].read();
        pools[p].allocated += o.allocated[c][p];
        pools[p].freed += o.allocated[c][p] - o.cur[c][p].read() + o.at_reset[c][p];
      }
    });
    StatArray& a = field(out, c);
    for (int p = 0; p < 2; ++p) {
      pools[p].peak = peak_[tracked(c, p)].load(std::memory_order_relaxed);
      a[p == 0 ? kSmallPool : kLargePool] = pools[p];
    }
    a[kAll] = Stat{pools[0].current + pools[1].current,
                   peak_[tracked(c, 2)].load(std::memory_order_relaxed),
                   pools[0].allocated + pools[1].allocated, pools[0].freed + pools[1].freed};
  }
  // active = allocated + pending: every allocation entered active; a block left it when freed,
  // unless it is still pending.
  auto active = [&](const StatArray& allocated, const PoolCounter& pending,
                    const std::int64_t (&peak)[3], const std::array<std::int64_t, 2>& at_reset,
                    StatArray& dst) {
    Stat all{0, std::max(peak[2], allocated[kAll].peak), 0, 0};
    for (int p = 0; p < 2; ++p) {
      const Stat& a = allocated[p == 0 ? kSmallPool : kLargePool];
      const std::int64_t waiting = pending.current[static_cast<std::size_t>(p)];
      const Stat s{a.current + waiting, std::max(peak[p], a.peak), a.allocated,
                   a.freed - waiting + at_reset[static_cast<std::size_t>(p)]};
      dst[p == 0 ? kSmallPool : kLargePool] = s;
      all.current += s.current;
      all.allocated += s.allocated;
      all.freed += s.freed;
    }
    dst[kAll] = all;
  };
  out.num_cache_hits = 0;
  for_each_shard(head_, [&](const ShardStats& o) { out.num_cache_hits += o.hits; });
  active(out.allocation, pending_, active_peak_, pending_at_reset_, out.active);
  active(out.allocated_bytes, pending_bytes_, active_bytes_peak_, pending_bytes_at_reset_,
         out.active_bytes);
}

void HotStats::reset_peak() noexcept {
  for (int k = 0; k < kTracked; ++k) {
    std::int64_t total = 0;
    for_each_shard(head_, [&](ShardStats& o) {
      const std::int64_t v = o.value(k);
      total += v;
      o.ceiling[k].store(v, std::memory_order_relaxed);
    });
    peak_[k].store(total, std::memory_order_relaxed);
  }
  version_.fetch_add(1, std::memory_order_acq_rel);
  for (int p = 0; p < 2; ++p) {
    active_peak_[p] = 0;
    active_bytes_peak_[p] = 0;
    for_each_shard(head_, [&](const ShardStats& o) {
      active_peak_[p] += o.value(tracked(kAllocations, p));
      active_bytes_peak_[p] += o.value(tracked(kAllocatedBytes, p));
    });
    active_peak_[p] += pending_.current[static_cast<std::size_t>(p)];
    active_bytes_peak_[p] += pending_bytes_.current[static_cast<std::size_t>(p)];
  }
  active_peak_[2] = current(kAllocations) + pending_.total();
  active_bytes_peak_[2] = current(kAllocatedBytes) + pending_bytes_.total();
}

void HotStats::reset_accumulated() noexcept {
  for_each_shard(head_, [](ShardStats& o) {
    for (int c = 0; c < kHotCounters; ++c)
      for (int p = 0; p < 2; ++p) {
        o.allocated[c][p] = 0;
        o.at_reset[c][p] = o.cur[c][p].read();
      }
    o.hits = 0;
  });
  pending_at_reset_ = pending_.current;
  pending_bytes_at_reset_ = pending_bytes_.current;
}

}  // namespace stitch::detail
