// core/device_what_if.cpp — what a device hands to the out-of-memory what-if check
// (replay/what_if.hpp): its configuration, its page size and the raw material of its workload,
// either the recorded history or, when that is incomplete, its layout now (every mapped run of
// every segment, with its live and free blocks).
#include <fmt/format.h>

#include "core/device_allocator.hpp"
#include "stitch/errors.hpp"

namespace stitch {

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
  in->stream = reinterpret_cast<std::uintptr_t>(stream);
  try {
    in->virtual_memory = backend_.supports_virtual_memory(device_);
    if (in->virtual_memory) in->granularity = backend_.granularity(device_);
  } catch (const backend_error&) {
    in->virtual_memory = false;
  }
  in->fallback_reason = history_gap();
  if (in->fallback_reason.empty()) {
    in->source = detail::WhatIfSource::history;
    in->history = recorder_.entries(false);
    return in;
  }
  in->source = detail::WhatIfSource::live_blocks;
  std::size_t blocks = 0;
  for (const Segment* s = segments_; s != nullptr; s = s->next)
    for (const Block* b = s->head; b != nullptr; b = b->next) ++blocks;
  if (blocks > detail::kWhatIfMaxEvents) {
    in->not_run = fmt::format("{}, and the device holds {} blocks, more than the {} the check "
                              "replays", in->fallback_reason, blocks, detail::kWhatIfMaxEvents);
    return in;
  }
  segments_locked(in->layout, /*oldest_first=*/true);
  return in;
}

}  // namespace stitch
