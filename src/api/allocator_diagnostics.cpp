// api/allocator_diagnostics.cpp — Allocator::dump_snapshot, memory_summary, record_history and
// the oom_snapshot hook.
#include <fmt/format.h>

#include <cstdio>
#include <exception>

#include "core/device_allocator.hpp"
#include "diagnostics/memory_summary.hpp"
#include "diagnostics/snapshot_writer.hpp"
#include "stitch/allocator.hpp"
#include "stitch/errors.hpp"

namespace stitch {

namespace {
detail::SnapshotMeta meta_of(const Allocator& a) {
  detail::SnapshotMeta meta;
  meta.backend = a.backend().name();
  meta.config = a.config().to_string();
  meta.device_count = a.device_count();
  return meta;
}
}  // namespace

void Allocator::dump_snapshot(const std::string& path) const {
  detail::write_snapshot_file(snapshot(), path, meta_of(*this));
}

std::string Allocator::memory_summary(int device) const {
  DeviceAllocator& d = checked_device(device);
  // The segments come from the device's snapshot (it also returns the trace, unused here, and
  // records a `snapshot` entry when recording is on). Statistics and segments are read under
  // two separate lock acquisitions, so under concurrent use they may differ by a few operations.
  std::vector<SegmentSnapshot> segments;
  (void)d.reports().snapshot(segments);
  const DeviceStats stats = d.reports().stats();
  detail::SummaryExtras extras = detail::summary_extras(segments, device);
  for (const int id : d.kv().ids()) {
    const detail::KvPoolInfo k = d.kv().info(id);
    extras.kv_pools.push_back(KvPoolSnapshot{device, k.id, k.tag, k.buffers, k.block_bytes, k.max_blocks, k.page,
                                             k.live_blocks, k.mapped_bytes, k.used_bytes, k.asleep});
  }
  return detail::memory_summary(stats, device, extras);
}

void Allocator::record_history(bool enabled, std::size_t max_entries) {
  std::string conf = fmt::format("record_history:{}", enabled ? "True" : "False");
  if (max_entries != 0) conf += fmt::format(",max_entries:{}", max_entries);
  configure(conf);  // the recorder's switches stay out of Config::source
}

namespace detail {

void on_out_of_memory(const Allocator& allocator) noexcept {
  try {
    const std::string path = allocator.config().oom_snapshot;
    if (path.empty()) return;
    allocator.dump_snapshot(path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stitch: oom_snapshot: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "stitch: oom_snapshot: unknown error\n");
  }
}

}  // namespace detail
}  // namespace stitch

namespace stitch {

void Allocator::set_trace_observer(std::function<void(int device, const TraceEntry& entry)> observer) {
  for (int d = 0; d < device_count_; ++d) {
    std::function<void(const TraceEntry&)> one;
    if (observer) one = [observer, d](const TraceEntry& e) { observer(d, e); };
    devices_[static_cast<std::size_t>(d)]->reports().observe(std::move(one));
  }
}

std::size_t Allocator::largest_request(int device) const {
  return checked_device(device).reports().largest_request();
}

std::vector<SegmentSnapshot> Allocator::segments(int device) const {
  std::vector<SegmentSnapshot> out;
  if (device >= 0) {
    checked_device(device).reports().segments(out);
  } else {
    for (int d = 0; d < device_count_; ++d) devices_[static_cast<std::size_t>(d)]->reports().segments(out);
  }
  return out;
}

std::optional<std::pair<void*, std::size_t>> Allocator::segment_of(const void* ptr) const {
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  for (const SegmentSnapshot& s : segments())
    if (p >= s.address && p < s.address + s.total_size)
      return std::make_pair(reinterpret_cast<void*>(s.address), s.total_size);
  return std::nullopt;
}

}  // namespace stitch
