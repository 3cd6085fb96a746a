// core/device_what_if.cpp — what a device hands to the out-of-memory what-if check
// (diagnostics/what_if.hpp): its configuration, its page size and its workload, either the
// recorded history or, when that is incomplete, its layout now (segments, live and free blocks).
#include <fmt/format.h>

#include <algorithm>

#include "core/device_allocator.hpp"
#include "diagnostics/what_if.hpp"

namespace stitch {

namespace {

using Kind = detail::WhatIfEvent::Kind;

std::uintptr_t address_of(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

}  // namespace

std::string DeviceAllocator::history_gap() const {
  if (!recorder_.enabled()) return "recording is off (record_history:True keeps the history)";
  if (recorder_.started_late()) return "recording started while the device already held memory";
  if (recorder_.dropped() != 0)
    return fmt::format("the history's ring buffer wrapped ({} entries dropped; a larger "
                       "max_entries keeps them)", recorder_.dropped());
  if (recorder_.size() > detail::kWhatIfMaxEvents)
    return fmt::format("the history has {} entries, more than the {} the check replays",
                       recorder_.size(), detail::kWhatIfMaxEvents);
  return "";
}

std::shared_ptr<const detail::WhatIfInput> DeviceAllocator::what_if_input(stream_t stream) const {
  auto in = std::make_shared<detail::WhatIfInput>();
  in->config = config_;
  in->stream = address_of(stream);
  try {
    in->virtual_memory = backend_.supports_virtual_memory(device_);
    if (in->virtual_memory) in->granularity = backend_.granularity(device_);
  } catch (const backend_error&) {
    in->virtual_memory = false;
  }
  in->fallback_reason = history_gap();
  if (in->fallback_reason.empty()) {
    in->source = detail::WhatIfSource::history;
    const std::vector<TraceEntry> entries = recorder_.entries(false);
    const auto releases = [](TraceAction a) {
      return a == TraceAction::segment_free || a == TraceAction::segment_unmap;
    };
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const TraceEntry& e = entries[i];
      if (e.action == TraceAction::alloc) {
        in->events.push_back({Kind::alloc, e.addr, e.size, e.stream});
      } else if (e.action == TraceAction::free_completed) {
        in->events.push_back({Kind::free, e.addr, 0, e.stream});
      } else if (e.action == TraceAction::oom) {
        in->events.push_back({Kind::failed, 0, e.size, e.stream});
      } else if (releases(e.action)) {
        // Memory given back (empty_cache, or the OOM ladder before it retries): one release.
        // A run of unmaps followed by a map is stitching moving pages, not a release.
        std::size_t j = i;
        while (j + 1 < entries.size() && releases(entries[j + 1].action)) ++j;
        if (j + 1 == entries.size() || entries[j + 1].action != TraceAction::segment_map)
          in->events.push_back({Kind::release, 0, 0, 0});
        i = j;
      }
    }
    return in;
  }

  // The layout now: each mapped run of each segment, oldest segment first, rebuilt as one
  // allocation of the run's size (large pool: it makes a segment of that size, then is freed)
  // followed by its blocks in address order; the blocks free now are freed at the end.
  in->source = detail::WhatIfSource::live_blocks;
  std::vector<const Segment*> segments;
  std::size_t blocks = 0;
  for (const Segment* s = segments_; s != nullptr; s = s->next) {
    segments.push_back(s);
    for (const Block* b = s->head; b != nullptr; b = b->next) ++blocks;
  }
  if (blocks > detail::kWhatIfMaxEvents) {
    in->not_run = fmt::format("{}, and the device holds {} blocks, more than the {} the check "
                              "replays", in->fallback_reason, blocks, detail::kWhatIfMaxEvents);
    return in;
  }
  std::reverse(segments.begin(), segments.end());  // segments_ is newest first
  std::vector<std::uintptr_t> free_now;
  const auto stream_of = [](const Segment* s) { return address_of(s->stream); };
  for (const Segment* s : segments) {
    for (const Block* b = s->head; b != nullptr;) {
      if (!b->mapped) {
        b = b->next;
        continue;
      }
      const Block* end = b;
      std::size_t run = 0;
      for (; end != nullptr && end->mapped; end = end->next) run += end->size;
      if (!s->small) {
        const std::uintptr_t whole = address_of(b->ptr) | 1;  // no block address is odd
        in->events.push_back({Kind::alloc, whole, run, stream_of(s)});
        in->events.push_back({Kind::free, whole, 0, stream_of(s)});
      }
      for (; b != end; b = b->next) {
        in->events.push_back({Kind::alloc, address_of(b->ptr), b->size, stream_of(s)});
        if (b->is_free()) {
          free_now.push_back(address_of(b->ptr));
          ++in->free_blocks;
        } else {
          ++in->live_blocks;
        }
      }
    }
  }
  for (std::uintptr_t addr : free_now) in->events.push_back({Kind::free, addr, 0, 0});
  return in;
}

}  // namespace stitch
