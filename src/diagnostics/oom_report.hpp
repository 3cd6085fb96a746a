// diagnostics/oom_report.hpp — the out-of-memory message, in PyTorch's shape plus stitch's facts.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace stitch::detail {

/// What the allocator knew when a request failed.
struct OomFacts {
  int device = 0;
  std::size_t requested = 0;       ///< bytes the caller asked for
  std::size_t alloc_size = 0;      ///< bytes the allocator tried to get from the device
  bool device_info_known = true;
  std::size_t device_total = 0;
  std::size_t device_free = 0;
  std::optional<std::size_t> allowed;  ///< memory-fraction cap, if any
  std::size_t reserved = 0;        ///< held by this allocator
  std::size_t allocated = 0;       ///< handed out by this allocator
  std::size_t largest_free_block = 0;
  bool expandable = false;         ///< expandable segments already on
};

/// "1.50 GiB", "512 bytes": PyTorch's format_size.
std::string format_size(std::size_t bytes);

/// The full report: PyTorch's first line, then stitch's largest free block and advice.
std::string format_oom(const OomFacts& facts);

}  // namespace stitch::detail
