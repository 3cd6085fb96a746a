// diagnostics/oom_report.cpp — classifies an out-of-memory failure and writes its report.
#include "diagnostics/oom_report.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace stitch::detail {

const char* to_string(OomVerdict verdict) noexcept {
  switch (verdict) {
    case OomVerdict::too_much_live_data: return "live data exceeds the device";
    case OomVerdict::fragmentation: return "fragmentation";
    case OomVerdict::held_elsewhere: return "memory held elsewhere";
    case OomVerdict::device_full: return "device full";
  }
  return "unknown";
}

std::string format_size(std::size_t bytes) {
  if (bytes <= 1024) return fmt::format("{} bytes", bytes);
  const auto b = static_cast<double>(bytes);
  if (bytes <= 1048576) return fmt::format("{:.2f} KiB", b / 1024.0);
  if (bytes <= 1073741824) return fmt::format("{:.2f} MiB", b / 1048576.0);
  return fmt::format("{:.2f} GiB", b / 1073741824.0);
}

std::size_t usable_bytes(const OomFacts& f, std::size_t* others) {
  const std::size_t used_by_device = f.device_total > f.device_free ? f.device_total - f.device_free : 0;
  *others = used_by_device > f.reserved ? used_by_device - f.reserved : 0;
  std::size_t limit = f.device_total - *others;
  if (f.allowed) limit = std::min(limit, *f.allowed);
  return limit;
}

bool provably_too_big(const OomFacts& f) {
  std::size_t others = 0;
  return f.allocated + f.rounded > usable_bytes(f, &others);
}

bool what_if_wanted(const OomFacts& f, bool enabled) {
  // (Spilled memory: the replay has no host pages to model it with; what_if_not_run says so.)
  return enabled && f.device_info_known && f.requested < kAbsurdRequest && f.spilled == 0 &&
         !provably_too_big(f);
}

namespace {

// Room the device (within the cap) still gives this allocator.
std::size_t headroom(const OomFacts& f) {
  std::size_t others = 0;
  const std::size_t limit = usable_bytes(f, &others);
  return limit > f.reserved ? limit - f.reserved : 0;
}

}  // namespace

OomVerdict classify_oom(const OomFacts& f) {
  if (!f.device_info_known) return OomVerdict::device_full;
  std::size_t others = 0;
  const std::size_t limit = usable_bytes(f, &others);
  const std::size_t live = device_live(f);
  if (live + f.rounded > limit) {
    // Even a perfect allocator could not fit it here; but if other processes hold the memory
    // that would make the difference, say so instead.
    if (others > 0 && live + f.rounded <= f.device_total &&
        (!f.allowed || live + f.rounded <= *f.allowed))
      return OomVerdict::held_elsewhere;
    return OomVerdict::too_much_live_data;
  }
  const std::size_t room = headroom(f);
  if (f.free_same + room >= f.rounded) return OomVerdict::fragmentation;
  if (f.free_same + room + f.free_other_streams + f.free_other_pool >= f.rounded)
    return OomVerdict::held_elsewhere;
  return OomVerdict::device_full;
}

std::string format_oom(const OomFacts& f, const std::string& what_if) {
  if (f.requested >= kAbsurdRequest) {
    return fmt::format("CUDA out of memory. Tried to allocate more than 1EB memory (asked for {} "
                       "bytes on device {}).",
                       f.requested, f.device);
  }
  std::string out = fmt::format("CUDA out of memory. Tried to allocate {}", format_size(f.alloc_size));
  if (f.alloc_size != f.requested) out += fmt::format(" (request of {})", format_size(f.requested));
  out += ". ";
  if (f.device_info_known) {
    out += fmt::format("GPU {} has a total capacity of {} of which {} is free. ", f.device,
                       format_size(f.device_total), format_size(f.device_free));
  } else {
    out += fmt::format("GPU {} did not report its memory. ", f.device);
  }
  if (f.allowed) out += fmt::format("The memory fraction allows {}. ", format_size(*f.allowed));
  // Reserved is device memory: less the KV pools' pages and the allocations on the device.
  const std::size_t on_device = device_live(f);
  const std::size_t unallocated = f.reserved > on_device ? f.reserved - on_device : 0;
  out += fmt::format(
      "Of the allocated memory {} is allocated by stitch, and {} is reserved by stitch but "
      "unallocated. The largest free cached block is {}.",
      format_size(f.allocated), format_size(unallocated), format_size(f.largest_free_block));
  const bool elsewhere = f.live_on_host > 0 || f.asleep > 0 || f.kv > 0;
  if (elsewhere) {
    out += fmt::format(" Live on the device: {}", format_size(on_device));
    const char* sep = " (";
    if (f.live_on_host > 0) {
      out += fmt::format("{}{} of the allocations is on host pages", sep, format_size(f.live_on_host));
      sep = "; ";
    }
    if (f.asleep > 0) {
      out += fmt::format("{}{} of the allocations is asleep", sep, format_size(f.asleep));
      sep = "; ";
    }
    if (f.kv > 0) out += fmt::format("{}with {} of KV pools' pages", sep, format_size(f.kv));
    out += ").";
  }

  const OomVerdict verdict = classify_oom(f);
  std::size_t others = 0;
  const std::size_t limit = f.device_info_known ? usable_bytes(f, &others) : 0;
  // Whether moving live memory to host pages would have made room (spill:tags, spill:all).
  const std::size_t room = f.device_info_known ? headroom(f) : 0;
  const char* spill_fix = f.spill == 0 && room + f.spillable_tags >= f.alloc_size ? "spill:tags"
                          : f.spill < 2 && room + f.spillable_all >= f.alloc_size ? "spill:all"
                                                                                   : nullptr;
  out += fmt::format("\nVerdict: {}. ", to_string(verdict));
  switch (verdict) {
    case OomVerdict::too_much_live_data:
      out += fmt::format(
          "Live {} ({}) plus this request ({}) exceed the {} this allocator can use: {}",
          elsewhere ? "memory on the device" : "allocations",
          format_size(on_device), format_size(f.rounded), format_size(limit),
          spill_fix != nullptr ? "the device alone cannot fit it; reduce what is live (batch size, "
                                 "activation checkpointing, offloading), or let cold memory move to "
                                 "host pages (below)."
                               : "no allocator setting can fit it; reduce what is live (batch size, "
                                 "activation checkpointing, offloading).");
      break;
    case OomVerdict::fragmentation: {
      out += fmt::format(
          "{} is free in {} cached block{} on this stream (plus {} the device can still give), "
          "enough for the request, but the largest free block is {}. Free blocks by size:",
          format_size(f.free_same), f.free_blocks_same, f.free_blocks_same == 1 ? "" : "s",
          format_size(headroom(f)), format_size(f.largest_free_same));
      static const char* kBuckets[4] = {"< 1 MiB", "1-10 MiB", "10-100 MiB", ">= 100 MiB"};
      const char* sep = " ";
      for (std::size_t i = 0; i < 4; ++i) {
        if (f.scatter[i].first == 0) continue;
        out += fmt::format("{}{} of {} ({})", sep, f.scatter[i].first, kBuckets[i],
                           format_size(f.scatter[i].second));
        sep = ", ";
      }
      out += ".";
      if (f.expandable)
        out += " Expandable segments are on: the free pieces are pinned between live blocks.";
      break;
    }
    case OomVerdict::held_elsewhere:
      if (others > 0) out += fmt::format("Other users of the device hold {}. ", format_size(others));
      if (f.free_other_streams > 0)
        out += fmt::format("{} is cached free on other streams; it is reused only by those "
                           "streams (allocate on one stream, or free and empty_cache). ",
                           format_size(f.free_other_streams));
      if (f.free_other_pool > 0)
        out += fmt::format("{} is cached free in the {} pool. ", format_size(f.free_other_pool),
                           f.rounded <= (std::size_t{1} << 20) ? "large" : "small");
      break;
    case OomVerdict::device_full:
      out += "The device has no room left for this request.";
      break;
  }
  if (spill_fix != nullptr) {
    out += fmt::format(
        "\nSpill: {} would have served it: {} of live memory could move to host pages under the "
        "same addresses (kernels keep using it, over the bus; docs/spill.md){}.",
        spill_fix, format_size(spill_fix[6] == 't' ? f.spillable_tags : f.spillable_all),
        f.expandable ? "" : "; spill needs expandable_segments:True");
  } else if (f.spill != 0) {
    out += fmt::format("\nSpill: spill:{} is on and {} is on host pages; what more could move ({}) "
                       "did not make room (the host budget, spill_limit_mb, or pinned memory "
                       "stopped it).",
                       f.spill == 1 ? "tags" : "all", format_size(f.spilled),
                       format_size(f.spill == 1 ? f.spillable_tags : f.spillable_all));
  }
  if (!what_if.empty()) out += "\n" + what_if;
  if (!f.largest_live.empty()) {
    out += "\nLargest live blocks:";
    for (const LiveBlockFact& b : f.largest_live) {
      out += fmt::format("\n  {:#x}: {} (requested {})", b.address, format_size(b.size),
                         format_size(b.requested));
      for (const std::string& frame : b.frames) out += "\n      " + frame;
    }
  }
  return out;
}

}  // namespace stitch::detail
