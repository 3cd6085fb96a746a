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
  (void)d.snapshot(segments);
  const DeviceStats stats = d.stats();
  return detail::memory_summary(stats, device, detail::summary_extras(segments, device));
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
