// core/reports.cpp — Reports: what one device says about itself (core/reports.hpp).
#include "core/reports.hpp"

#include <algorithm>
#include <mutex>
#include <utility>

#include "core/constants.hpp"
#include "core/block_store.hpp"
#include "core/device_lock.hpp"
#include "core/hot_stats.hpp"
#include "core/ledger.hpp"
#include "core/page_mapper.hpp"
#include "core/residency.hpp"
#include "core/stitcher.hpp"
#include "diagnostics/recorder.hpp"

namespace stitch::detail {

DeviceStats Reports::stats() {
  std::lock_guard lock(d_.lock);
  d_.upkeep.poll_events(nullptr);
  return d_.upkeep.stats_locked();
}

std::vector<TraceEntry> Reports::snapshot(std::vector<SegmentSnapshot>& out) {
  std::lock_guard lock(d_.lock);
  d_.upkeep.poll_events(nullptr);  // blocks whose streams are done are shown free
  d_.recorder.trace(TraceAction::snapshot, nullptr, 0, nullptr);
  const std::size_t from = out.size();
  d_.store.snapshot(d_.device, out, /*oldest_first=*/false, &residency_.tag_names());
  residency_.sleeper().annotate(out, from);  // where the sleeping blocks' backups lie
  return d_.recorder.entries();
}

void Reports::segments(std::vector<SegmentSnapshot>& out) {
  std::lock_guard lock(d_.lock);
  d_.upkeep.poll_events(nullptr);
  d_.store.snapshot(d_.device, out, /*oldest_first=*/false, &residency_.tag_names());
}

void Reports::observe(std::function<void(const TraceEntry&)> observer) {
  std::lock_guard lock(d_.lock);
  d_.recorder.observe(std::move(observer));
  d_.upkeep.note_hit_rules();
}

std::size_t Reports::largest_request() {
  std::lock_guard lock(d_.lock);
  d_.upkeep.poll_events(nullptr);  // blocks whose streams are done are free
  std::size_t best = d_.store.largest_free_block();
  const MemoryInfo info = d_.backend.memory_info(d_.device);
  // Plain segments round to 2 MiB; expandable ranges map whole pages.
  const std::size_t page = d_.config.expandable_segments ? d_.pages.granularity() : kRoundLarge;
  const std::size_t room = std::min(info.free, d_.ledger.room()) / page * page;
  best = std::max(best, room);
  if (d_.config.stitching) {
    const std::size_t all = round_up(info.total, page);
    best = std::max(best, d_.stitcher.pages_within_reach(nullptr, all) * page);
  }
  return best;
}

void Reports::reset_peak_stats() {
  std::lock_guard lock(d_.lock);
  d_.stats.reset_peak();
  d_.hot.reset_peak();
}

void Reports::reset_accumulated_stats() {
  std::lock_guard lock(d_.lock);
  d_.stats.reset_accumulated();
  d_.hot.reset_accumulated();
}

void Reports::count_invalid_free() {
  std::lock_guard lock(d_.lock);
  ++d_.stats.num_invalid_frees;
}

void Reports::count_failed_free() {
  std::lock_guard lock(d_.lock);
  ++d_.stats.num_failed_frees;
}

}  // namespace stitch::detail
