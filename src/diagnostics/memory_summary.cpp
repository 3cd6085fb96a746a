// diagnostics/memory_summary.cpp — the memory_summary() table (see memory_summary.hpp).
#include "diagnostics/memory_summary.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "diagnostics/oom_report.hpp"

namespace stitch::detail {

namespace {

// Python's // on ints (floor division).
std::int64_t floordiv(std::int64_t a, std::int64_t b) {
  std::int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

constexpr int kWidth = 75;

std::string rule(char c) { return std::string(kWidth, c); }

std::string blocks_text(std::size_t n) { return fmt::format("{} block{}", n, n == 1 ? "" : "s"); }

}  // namespace

std::string summary_size(std::int64_t sz, std::int64_t pref_sz) {
  static constexpr const char* kPrefixes[] = {"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"};
  const char* prefix = kPrefixes[0];
  auto pref = static_cast<double>(pref_sz);
  for (std::size_t i = 1; i < std::size(kPrefixes); ++i) {
    if (pref < 768 * 1024) break;
    prefix = kPrefixes[i];
    sz = floordiv(sz, 1024);
    pref /= 1024;
  }
  return fmt::format("{:6d} {}", sz, prefix);
}

std::string summary_count(std::int64_t cnt, std::int64_t pref_cnt) {
  static constexpr const char* kPrefixes[] = {" ", "K", "M"};
  const char* prefix = kPrefixes[0];
  auto pref = static_cast<double>(pref_cnt);
  for (std::size_t i = 1; i < std::size(kPrefixes); ++i) {
    if (pref < 750 * 1000) break;
    prefix = kPrefixes[i];
    cnt = floordiv(cnt, 1000);
    pref /= 1000;
  }
  return fmt::format("{:7d} {} ", cnt, prefix);
}

SummaryExtras summary_extras(const std::vector<SegmentSnapshot>& segments, int device) {
  SummaryExtras x;
  std::map<std::uintptr_t, StreamFree> streams;
  for (const SegmentSnapshot& s : segments) {
    if (s.device != device) continue;
    if (s.sleeping) {  // its pages went back: nothing of it is cached
      ++x.sleeping_segments;
      if (std::find(x.sleeping_tags.begin(), x.sleeping_tags.end(), s.tag) == x.sleeping_tags.end())
        x.sleeping_tags.push_back(s.tag);
      continue;
    }
    ++x.segments;
    for (const BlockSnapshot& b : s.blocks) {
      if (b.state == "inactive") {
        x.free_bytes += b.size;
        ++x.free_blocks;
        x.largest_free_block = std::max(x.largest_free_block, b.size);
        StreamFree& f = streams[s.stream];
        f.stream = s.stream;
        f.bytes += b.size;
        ++f.blocks;
        f.largest = std::max(f.largest, b.size);
      } else if (b.state == "active_pending_free") {
        x.pending_free_bytes += b.size;
        ++x.pending_free_blocks;
      }
    }
  }
  for (auto& [stream, f] : streams) x.per_stream.push_back(f);
  return x;
}

std::string memory_summary(const DeviceStats& stats, int device, const SummaryExtras& extras) {
  using Formatter = std::string (*)(std::int64_t, std::int64_t);
  struct Metric {
    const StatArray DeviceStats::*array;
    const char* name;
    Formatter format;
  };
  static constexpr Metric kMetrics[] = {
      {&DeviceStats::allocated_bytes, "Allocated memory", summary_size},
      {&DeviceStats::active_bytes, "Active memory", summary_size},
      {&DeviceStats::requested_bytes, "Requested memory", summary_size},
      {&DeviceStats::reserved_bytes, "GPU reserved memory", summary_size},
      {&DeviceStats::inactive_split_bytes, "Non-releasable memory", summary_size},
      {&DeviceStats::allocation, "Allocations", summary_count},
      {&DeviceStats::active, "Active allocs", summary_count},
      {&DeviceStats::segment, "GPU reserved segments", summary_count},
      {&DeviceStats::inactive_split, "Non-releasable allocs", summary_count},
  };

  std::vector<std::string> lines;
  lines.push_back(rule('='));
  // PyTorch: " {_:16} PyTorch CUDA memory summary, device ID {device:<17d} "; "stitch" is one
  // character shorter than "PyTorch", so the device field is one wider to keep 75 columns.
  lines.push_back(fmt::format(" {:16} stitch CUDA memory summary, device ID {:<18d} ", "", device));
  lines.push_back(rule('-'));
  lines.push_back(fmt::format("  {:9} CUDA OOMs: {:<12d} | {:6} cudaMalloc retries: {:<8d}  ", "",
                              stats.num_ooms, "", stats.num_alloc_retries));
  lines.push_back(rule('='));
  lines.push_back("        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ");

  auto row = [&](const char* name, const Stat& s, const Stat& pref, Formatter f) {
    lines.push_back(fmt::format(" {:<21} | {} | {} | {} | {} ", name, f(s.current, pref.current),
                                f(s.peak, pref.peak), f(s.allocated, pref.allocated),
                                f(s.freed, pref.freed)));
  };
  for (const Metric& m : kMetrics) {
    lines.push_back(rule('-'));
    const StatArray& a = stats.*(m.array);
    row(m.name, a[kAll], a[kAll], m.format);
    row("      from large pool", a[kLargePool], a[kAll], m.format);
    row("      from small pool", a[kSmallPool], a[kAll], m.format);
  }
  lines.push_back(rule('-'));
  row("Oversize allocations", stats.oversize_allocations, stats.oversize_allocations, summary_count);
  lines.push_back(rule('-'));
  row("Oversize GPU segments", stats.oversize_segments, stats.oversize_segments, summary_count);
  lines.push_back(rule('='));

  // ---- stitch: where the free cached memory is ----
  auto line = [&](std::string_view label, const std::string& value) {
    lines.push_back(fmt::format(" {:<25} | {:<45} ", label, value));
  };
  // What stitch holds: device pages (reserved) and host pages under spilled memory, which hold
  // allocations too; blocks asleep hold no page; a KV pool's pages are reserved but not the
  // cache (docs/kv.md).
  const std::int64_t spilled = stats.spilled_bytes.current;
  const std::int64_t held = stats.reserved_bytes[kAll].current + spilled;
  const std::int64_t on_pages = stats.allocated_bytes[kAll].current - stats.sleeping_bytes.current;
  const std::int64_t unallocated = std::max<std::int64_t>(held - on_pages - stats.kv_bytes.current, 0);
  lines.push_back(fmt::format(" {:<73} ", "stitch: free cached memory and fragmentation"));
  lines.push_back(rule('-'));
  line("Reserved but unallocated",
       held > 0 ? fmt::format("{} ({:.1f}% of {})", format_size(static_cast<std::size_t>(unallocated)),
                              100.0 * static_cast<double>(unallocated) / static_cast<double>(held),
                              spilled > 0 ? "reserved and spilled" : "reserved")
                : format_size(0));
  line("Free cached blocks", fmt::format("{}, {}", blocks_text(extras.free_blocks), format_size(extras.free_bytes)));
  line("Largest free block", format_size(extras.largest_free_block));
  if (extras.free_bytes > 0)
    line("Fragmentation", fmt::format("{:.1f}% of free bytes outside the largest block",
                                      100.0 * static_cast<double>(extras.free_bytes - extras.largest_free_block) /
                                          static_cast<double>(extras.free_bytes)));
  line("Waiting for other streams",
       fmt::format("{}, {}", blocks_text(extras.pending_free_blocks), format_size(extras.pending_free_bytes)));
  for (const StreamFree& f : extras.per_stream) {
    const std::string label = f.stream == 0 ? std::string("Free on default stream")
                                            : fmt::format("Free on stream {:#x}", f.stream);
    line(label, fmt::format("{}, {} (largest {})", blocks_text(f.blocks), format_size(f.bytes),
                            format_size(f.largest)));
  }
  if (stats.kv_bytes.current > 0 || stats.kv_bytes.peak > 0) {
    line("KV pools (pages mapped)",
         fmt::format("{} now, peak {} (in reserved memory)",
                     format_size(static_cast<std::size_t>(stats.kv_bytes.current)),
                     format_size(static_cast<std::size_t>(stats.kv_bytes.peak))));
  }
  for (const KvPoolSnapshot& k : extras.kv_pools) {
    std::string value = fmt::format("{} of {} blocks live, {} mapped{}", k.live_blocks, k.max_blocks,
                                    format_size(k.mapped_bytes), k.asleep ? ", asleep" : "");
    if (value.size() > 45) value = value.substr(0, 42) + "...";
    line(fmt::format("KV pool {} ('{}')", k.id, k.tag.size() > 12 ? k.tag.substr(0, 9) + "..." : k.tag), value);
  }
  if (stats.spilled_bytes.current > 0 || stats.num_spills > 0) {
    line("Spilled (host pages)",
         fmt::format("{} now, peak {}; {} spill{}, {} unspill{}",
                     format_size(static_cast<std::size_t>(stats.spilled_bytes.current)),
                     format_size(static_cast<std::size_t>(stats.spilled_bytes.peak)), stats.num_spills,
                     stats.num_spills == 1 ? "" : "s", stats.num_unspills, stats.num_unspills == 1 ? "" : "s"));
  }
  if (extras.sleeping_segments > 0 || stats.sleeping_bytes.current > 0) {
    std::string tags;
    for (const std::string& t : extras.sleeping_tags) tags += (tags.empty() ? "" : ", ") + t;
    line("Asleep (stitch_sleep)",
         fmt::format("{} live in {} range{}", format_size(static_cast<std::size_t>(stats.sleeping_bytes.current)),
                     extras.sleeping_segments, extras.sleeping_segments == 1 ? "" : "s"));
    if (!tags.empty()) line("Sleeping tags", tags.size() > 45 ? tags.substr(0, 42) + "..." : tags);
  }
  if (stats.backup_file_bytes.current > 0 || stats.backup_file_bytes.peak > 0) {
    line("Backups in files",
         fmt::format("{} now, peak {} (backup_dir)", format_size(static_cast<std::size_t>(stats.backup_file_bytes.current)),
                     format_size(static_cast<std::size_t>(stats.backup_file_bytes.peak))));
  }
  lines.push_back(rule('='));

  std::string out;
  for (const std::string& l : lines) {
    out += '|';
    out += l;
    out += "|\n";
  }
  return out;
}

}  // namespace stitch::detail
