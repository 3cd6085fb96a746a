// diagnostics/oom_report.cpp — builds the out-of-memory message.
#include "diagnostics/oom_report.hpp"

#include <fmt/format.h>

namespace stitch::detail {

std::string format_size(std::size_t bytes) {
  if (bytes <= 1024) return fmt::format("{} bytes", bytes);
  const auto b = static_cast<double>(bytes);
  if (bytes <= 1048576) return fmt::format("{:.2f} KiB", b / 1024.0);
  if (bytes <= 1073741824) return fmt::format("{:.2f} MiB", b / 1048576.0);
  return fmt::format("{:.2f} GiB", b / 1073741824.0);
}

std::string format_oom(const OomFacts& f) {
  std::string out;
  if (f.requested >= (std::size_t{1} << 60)) {
    return fmt::format("CUDA out of memory. Tried to allocate more than 1EB memory (asked for {} "
                       "bytes on device {}).",
                       f.requested, f.device);
  }
  out = fmt::format("CUDA out of memory. Tried to allocate {}", format_size(f.alloc_size));
  if (f.alloc_size != f.requested) out += fmt::format(" (request of {})", format_size(f.requested));
  out += ". ";
  if (f.device_info_known) {
    out += fmt::format("GPU {} has a total capacity of {} of which {} is free. ", f.device,
                       format_size(f.device_total), format_size(f.device_free));
  } else {
    out += fmt::format("GPU {} did not report its memory. ", f.device);
  }
  if (f.allowed) out += fmt::format("{} allowed; ", format_size(*f.allowed));
  const std::size_t unallocated = f.reserved > f.allocated ? f.reserved - f.allocated : 0;
  out += fmt::format(
      "Of the allocated memory {} is allocated by stitch, and {} is reserved by stitch but "
      "unallocated. The largest free cached block is {}.",
      format_size(f.allocated), format_size(unallocated), format_size(f.largest_free_block));
  if (unallocated > 0 && unallocated >= f.requested && f.largest_free_block < f.requested &&
      !f.expandable) {
    out += " Enough memory is reserved but not in one piece (fragmentation): try setting "
           "STITCH_ALLOC_CONF=expandable_segments:True.";
  }
  return out;
}

}  // namespace stitch::detail
