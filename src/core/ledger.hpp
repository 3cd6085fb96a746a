// core/ledger.hpp — what a device holds from its backend, booked in one place: the segments and
// mapped pages it obtains and gives back (the segment, reserved_bytes, oversize_segments and
// device-call statistics), memory lent between the pools, and the memory-fraction cap they must
// stay under.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "core/stat_update.hpp"
#include "stitch/stats.hpp"

namespace stitch::detail {

class Ledger {
 public:
  /// Books into `stats` (the device's slow-path statistics), which must outlive the ledger.
  explicit Ledger(DeviceStats& stats) noexcept : stats_(stats) {}

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

  /// A plain segment of `bytes` was allocated (oversize: at least max_split_size).
  void segment_allocated(bool small, std::size_t bytes, bool oversize) noexcept {
    ++stats_.num_device_alloc;
    add(stats_.segment, small, 1);
    add(stats_.reserved_bytes, small, static_cast<std::int64_t>(bytes));
    if (oversize) stats_.oversize_segments.increase(1);
  }
  void segment_freed(bool small, std::size_t bytes, bool oversize) noexcept {
    ++stats_.num_device_free;
    sub(stats_.segment, small, 1);
    sub(stats_.reserved_bytes, small, static_cast<std::int64_t>(bytes));
    if (oversize) stats_.oversize_segments.decrease(1);
  }
  /// `bytes` of pages were mapped into (or unmapped from) an expandable range, in one call.
  void mapped(bool small, std::size_t bytes) noexcept {
    ++stats_.num_device_alloc;
    add(stats_.reserved_bytes, small, static_cast<std::int64_t>(bytes));
  }
  void unmapped(bool small, std::size_t bytes) noexcept {
    ++stats_.num_device_free;
    sub(stats_.reserved_bytes, small, static_cast<std::int64_t>(bytes));
  }
  /// `bytes` of memory mapped all along now count in (or no longer count in) a pool: memory lent
  /// to a stitched range, or given back. No device call.
  void held(bool small, std::int64_t bytes) noexcept {
    if (bytes >= 0) {
      add(stats_.reserved_bytes, small, bytes);
    } else {
      sub(stats_.reserved_bytes, small, -bytes);
    }
  }
  void lent(bool from_small, bool to_small, std::size_t bytes) noexcept {
    held(from_small, -static_cast<std::int64_t>(bytes));
    held(to_small, static_cast<std::int64_t>(bytes));
  }

 private:
  DeviceStats& stats_;
  std::optional<std::size_t> cap_;
};

}  // namespace stitch::detail
