// core/reports.cpp — Reports: what one device says about itself (core/reports.hpp).
#include "core/reports.hpp"

#include <algorithm>
#include <mutex>
#include <utility>

#include "core/constants.hpp"
#include "core/device_allocator.hpp"

namespace stitch::detail {

DeviceStats Reports::stats() {
  std::lock_guard lock(d_.mutex_);
  d_.poll_events(nullptr);
  return d_.stats_locked();
}

std::vector<TraceEntry> Reports::snapshot(std::vector<SegmentSnapshot>& out) {
  std::lock_guard lock(d_.mutex_);
  d_.poll_events(nullptr);  // blocks whose streams are done are shown free
  d_.recorder_.trace(TraceAction::snapshot, nullptr, 0, nullptr);
  const std::size_t from = out.size();
  d_.store_.snapshot(d_.device_, out, /*oldest_first=*/false, &d_.residency_.tag_names());
  d_.residency_.sleeper().annotate(out, from);  // where the sleeping blocks' backups lie
  return d_.recorder_.entries();
}

void Reports::segments(std::vector<SegmentSnapshot>& out) {
  std::lock_guard lock(d_.mutex_);
  d_.poll_events(nullptr);
  d_.store_.snapshot(d_.device_, out, /*oldest_first=*/false, &d_.residency_.tag_names());
}

void Reports::observe(std::function<void(const TraceEntry&)> observer) {
  std::lock_guard lock(d_.mutex_);
  d_.recorder_.observe(std::move(observer));
  d_.note_hit_rules();
}

std::size_t Reports::largest_request() {
  std::lock_guard lock(d_.mutex_);
  d_.poll_events(nullptr);  // blocks whose streams are done are free
  std::size_t best = d_.store_.largest_free_block();
  const MemoryInfo info = d_.backend_.memory_info(d_.device_);
  // Plain segments round to 2 MiB; expandable ranges map whole pages.
  const std::size_t page = d_.config_.expandable_segments ? d_.pages_.granularity() : kRoundLarge;
  const std::size_t room = std::min(info.free, d_.ledger_.room()) / page * page;
  best = std::max(best, room);
  if (d_.config_.stitching) {
    const std::size_t all = round_up(info.total, page);
    best = std::max(best, d_.stitcher_.pages_within_reach(nullptr, all) * page);
  }
  return best;
}

void Reports::reset_peak_stats() {
  std::lock_guard lock(d_.mutex_);
  d_.stats_.reset_peak();
  d_.hot_.reset_peak();
}

void Reports::reset_accumulated_stats() {
  std::lock_guard lock(d_.mutex_);
  d_.stats_.reset_accumulated();
  d_.hot_.reset_accumulated();
}

void Reports::count_invalid_free() {
  std::lock_guard lock(d_.mutex_);
  ++d_.stats_.num_invalid_frees;
}

void Reports::count_failed_free() {
  std::lock_guard lock(d_.mutex_);
  ++d_.stats_.num_failed_frees;
}

}  // namespace stitch::detail
