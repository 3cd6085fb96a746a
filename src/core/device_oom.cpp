// core/device_oom.cpp — a request that failed: what the device knew (the facts of the report)
// and what it hands to the out-of-memory what-if check (replay/what_if.hpp): its configuration,
// its page size and the raw material of its workload, either the recorded history or, when that
// is incomplete, its layout now (every mapped run of every segment, with its live and free
// blocks). All captured under the device lock; the check and the report come after it.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "core/device_allocator.hpp"
#include "diagnostics/oom_report.hpp"
#include "stitch/errors.hpp"

namespace stitch {

namespace {

/// Why `history` cannot be replayed as the whole workload ("" when it can).
std::string history_gap(const detail::Recorder& history) {
  if (!history.enabled()) return "recording is off (record_history:True keeps the history)";
  if (history.started_late()) return "recording started while the device already held memory";
  if (history.dropped() != 0)
    return fmt::format("the history's ring buffer wrapped ({} entries dropped; a larger "
                       "max_entries keeps them)", history.dropped());
  if (history.size() > detail::kWhatIfMaxEvents)
    return fmt::format("the history has {} entries, more than the {} the check replays",
                       history.size(), detail::kWhatIfMaxEvents);
  return "";
}

/// The workload's raw material and the device's shape, for a request on `stream` that failed:
/// the recorded history, or, when it is incomplete, every mapped run of every segment.
std::shared_ptr<const detail::WhatIfInput> what_if_input(const Config& config,
                                                         detail::PageMapper& pages,
                                                         const detail::Recorder& history,
                                                         const detail::BlockStore& store,
                                                         int device, stream_t stream) {
  auto in = std::make_shared<detail::WhatIfInput>();
  in->config = config;
  in->stream = reinterpret_cast<std::uintptr_t>(stream);
  try {
    in->virtual_memory = pages.supported();
    if (in->virtual_memory) in->granularity = pages.granularity();
  } catch (const backend_error&) {
    in->virtual_memory = false;
  }
  in->fallback_reason = history_gap(history);
  if (in->fallback_reason.empty()) {
    in->source = detail::WhatIfSource::history;
    in->history = history.entries(false);
    return in;
  }
  in->source = detail::WhatIfSource::live_blocks;
  std::size_t blocks = 0;
  for (const detail::Segment* s = store.segments(); s != nullptr; s = s->next)
    for (const detail::Block* b = s->head; b != nullptr; b = b->next) ++blocks;
  if (blocks > detail::kWhatIfMaxEvents) {
    in->not_run = fmt::format("{}, and the device holds {} blocks, more than the {} the check "
                              "replays", in->fallback_reason, blocks, detail::kWhatIfMaxEvents);
    return in;
  }
  store.snapshot(device, in->layout, /*oldest_first=*/true);
  return in;
}

}  // namespace

void DeviceAllocator::capture_oom(std::size_t requested, std::size_t rounded,
                                  std::size_t alloc_size, bool small, stream_t stream) {
  ++stats_.num_ooms;
  failed_ = std::make_unique<detail::OomCapture>();
  detail::OomCapture* oom = failed_.get();
  detail::OomFacts& f = oom->facts;
  f.device = device_;
  f.requested = requested;
  f.rounded = rounded;
  f.alloc_size = alloc_size;
  try {
    const MemoryInfo info = backend_.memory_info(device_);
    f.device_total = info.total;
    f.device_free = info.free;
  } catch (...) {
    f.device_info_known = false;
  }
  f.allowed = ledger_.cap();
  f.reserved = ledger_.reserved();
  f.allocated = static_cast<std::size_t>(hot_.current(detail::kAllocatedBytes));
  f.largest_free_block = store_.largest_free_block();
  f.expandable = config_.expandable_segments;
  for (const bool pool_small : {true, false}) {
    for (const Block* b : store_.free_blocks(pool_small)) {
      if (pool_small != small) {
        f.free_other_pool += b->size;
      } else if (b->stream != stream) {
        f.free_other_streams += b->size;
      } else {
        f.free_same += b->size;
        ++f.free_blocks_same;
        f.largest_free_same = std::max(f.largest_free_same, b->size);
        const int bucket = b->size < (1u << 20) ? 0 : b->size < (10u << 20) ? 1
                         : b->size < (100u << 20) ? 2 : 3;
        ++f.scatter[static_cast<std::size_t>(bucket)].first;
        f.scatter[static_cast<std::size_t>(bucket)].second += b->size;
      }
    }
  }
  // The five largest live blocks, with their allocation stacks when they were recorded.
  std::vector<const Block*> live;
  live_.for_each([&](detail::LiveTable::Key, const Block* b) { live.push_back(b); });
  const std::size_t top = std::min<std::size_t>(5, live.size());
  std::partial_sort(live.begin(), live.begin() + static_cast<std::ptrdiff_t>(top), live.end(),
                    [](const Block* x, const Block* y) { return x->size > y->size; });
  for (std::size_t i = 0; i < top; ++i) {
    const auto address = reinterpret_cast<std::uintptr_t>(live[i]->ptr);
    f.largest_live.push_back({address, live[i]->size, live[i]->requested,
                              recorder_.alloc_frames(address)});
  }
  // What spill could move now (the OOM report's spill line).
  f.spill = static_cast<int>(config_.spill);
  f.spilled = static_cast<std::size_t>(stats_.spilled_bytes.current);
  f.kv = static_cast<std::size_t>(stats_.kv_bytes.current);
  f.asleep = static_cast<std::size_t>(stats_.sleeping_bytes.current);
  // The live bytes on host pages: allocated, but not in the device's memory.
  for (const detail::Segment* s = store_.segments(); s != nullptr && f.spilled != 0; s = s->next)
    f.live_on_host += detail::Spiller::live_bytes_on_host(*s);
  try {
    // (Ranges of the virtual-memory API only: a device without it has nothing that could move.)
    bool ranged = false;
    for (const detail::Segment* s = store_.segments(); s != nullptr && !ranged; s = s->next) ranged = s->expandable;
    if (ranged) {
      f.spillable_tags = residency_.spillable_bytes(Config::Spill::tags);
      f.spillable_all = residency_.spillable_bytes(Config::Spill::all);
    }
  } catch (...) {  // no spill line
  }
  // The what-if check replays the workload later, outside this lock (Allocator::allocate).
  oom->what_if_enabled = config_.oom_what_if;
  if (detail::what_if_wanted(f, config_.oom_what_if)) {
    try {
      oom->what_if = what_if_input(config_, pages_, recorder_, store_, device_, stream);
    } catch (...) {
      oom->capture_failed = true;
    }
  }
  recorder_.trace(TraceAction::oom, reinterpret_cast<const void*>(f.device_free), alloc_size,
                  stream);
}

}  // namespace stitch
