// core/ledger.hpp — what a device holds from its backend, booked in one place: the segments and
// mapped pages it obtains and gives back (the segment, reserved_bytes, oversize_segments and
// device-call statistics, and their segment_* entries in the history), memory lent between the
// pools, host pages mapped in its ranges (spilled), and the memory-fraction cap they must stay
// under. Every change of what the device holds
// is counted and traced by the same call, so neither can be forgotten.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "core/block.hpp"
#include "core/stat_update.hpp"
#include "diagnostics/recorder.hpp"
#include "stitch/stats.hpp"

namespace stitch::detail {

class Ledger {
 public:
  /// Books into `stats` (the device's slow-path statistics) and `history`, which must outlive the
  /// ledger.
  Ledger(DeviceStats& stats, Recorder& history) noexcept : stats_(stats), history_(history) {}

  /// Bytes held from the device now.
  [[nodiscard]] std::size_t reserved() const noexcept {
    return static_cast<std::size_t>(stats_.reserved_bytes[kAll].current);
  }
  /// The memory-fraction cap on reserved bytes (nullopt: none).
  [[nodiscard]] const std::optional<std::size_t>& cap() const noexcept { return cap_; }
  void set_cap(std::optional<std::size_t> cap) noexcept { cap_ = cap; }
  /// Whether `bytes` more stay within the cap.
  [[nodiscard]] bool fits(std::size_t bytes) const noexcept {
    return !cap_ || reserved() + bytes <= *cap_;
  }
  /// Bytes the cap still allows (SIZE_MAX without a cap).
  [[nodiscard]] std::size_t room() const noexcept {
    if (!cap_) return SIZE_MAX;
    return reserved() < *cap_ ? *cap_ - reserved() : 0;
  }

  /// A plain segment was allocated (oversize: at least max_split_size).
  void segment_allocated(const Segment& s) noexcept {
    ++stats_.num_device_alloc;
    add(stats_.segment, s.small, 1);
    add(stats_.reserved_bytes, s.small, static_cast<std::int64_t>(s.size));
    if (s.oversize) stats_.oversize_segments.increase(1);
    history_.trace(TraceAction::segment_alloc, s.base, s.size, s.stream);
  }
  void segment_freed(const Segment& s) noexcept {
    history_.trace(TraceAction::segment_free, s.base, s.size, s.stream);
    ++stats_.num_device_free;
    sub(stats_.segment, s.small, 1);
    sub(stats_.reserved_bytes, s.small, static_cast<std::int64_t>(s.size));
    if (s.oversize) stats_.oversize_segments.decrease(1);
  }
  /// `bytes` at `at` of `s` were mapped, in one call; `held` of them are new to the device (the
  /// rest is borrowed memory, held already).
  void mapped(const Segment& s, const char* at, std::size_t bytes, std::size_t held) noexcept {
    history_.trace(TraceAction::segment_map, at, bytes, s.stream);
    ++stats_.num_device_alloc;
    add(stats_.reserved_bytes, s.small, static_cast<std::int64_t>(held));
  }
  void mapped(const Segment& s, const char* at, std::size_t bytes) noexcept {
    mapped(s, at, bytes, bytes);
  }
  /// `bytes` at `at` of `s` were unmapped, in one call (borrowed memory among them is booked back
  /// where it lies with returned()).
  void unmapped(const Segment& s, const char* at, std::size_t bytes) noexcept {
    history_.trace(TraceAction::segment_unmap, at, bytes, s.stream);
    ++stats_.num_device_free;
    sub(stats_.reserved_bytes, s.small, static_cast<std::int64_t>(bytes));
  }
  /// A stray range (a sleep's unmap that failed) of the small or large pool was unmapped at last
  /// by a retry: it leaves reserved memory now.
  void stray_unmapped(bool small, const char* at, std::size_t bytes) noexcept {
    history_.trace(TraceAction::segment_unmap, at, bytes, nullptr);
    ++stats_.num_device_free;
    sub(stats_.reserved_bytes, small, static_cast<std::int64_t>(bytes));
  }
  /// `bytes` of host pages were mapped at `at` (a spill): they count in spilled_bytes, and the
  /// device memory they replace left with unmapped(). No device call.
  void host_mapped(const char* at, std::size_t bytes) noexcept {
    (void)at;
    stats_.spilled_bytes.increase(static_cast<std::int64_t>(bytes));
  }
  /// `bytes` of host pages at `at` were unmapped (an unspill, a free, a sleep).
  void host_unmapped(const char* at, std::size_t bytes) noexcept {
    (void)at;
    stats_.spilled_bytes.decrease(static_cast<std::int64_t>(bytes));
  }
  /// `bytes` of a KV pool's pages (core/kv_pools.hpp) were mapped at `at` (over its buffers):
  /// device memory stitch holds, counted in the large pool's reserved_bytes and in kv_bytes.
  void kv_mapped(const char* at, std::size_t bytes) noexcept {
    (void)at;
    ++stats_.num_device_alloc;
    add(stats_.reserved_bytes, false, static_cast<std::int64_t>(bytes));
    stats_.kv_bytes.increase(static_cast<std::int64_t>(bytes));
  }
  void kv_unmapped(const char* at, std::size_t bytes) noexcept {
    (void)at;
    ++stats_.num_device_free;
    sub(stats_.reserved_bytes, false, static_cast<std::int64_t>(bytes));
    stats_.kv_bytes.decrease(static_cast<std::int64_t>(bytes));
  }
  /// A free block's memory is lent to a stitched range of the pool `to_small` (mapped there a
  /// second time): it counts there from now on, and where it lies it looks unmapped. No call.
  void lent(const Block& b, bool to_small) noexcept {
    history_.trace(TraceAction::segment_unmap, b.ptr, b.size, b.stream);
    held(b.small, -static_cast<std::int64_t>(b.size));
    held(to_small, static_cast<std::int64_t>(b.size));
  }
  /// A lent block's second mapping was unmapped (booked there by unmapped()): its memory counts
  /// where it lies again. No call.
  void returned(const Block& b) noexcept {
    held(b.small, static_cast<std::int64_t>(b.size));
    history_.trace(TraceAction::segment_map, b.ptr, b.size, b.stream);
  }

 private:
  void held(bool small, std::int64_t bytes) noexcept {
    if (bytes >= 0) {
      add(stats_.reserved_bytes, small, bytes);
    } else {
      sub(stats_.reserved_bytes, small, -bytes);
    }
  }

  DeviceStats& stats_;
  Recorder& history_;
  std::optional<std::size_t> cap_;
};

}  // namespace stitch::detail
