// replay/what_if.cpp — the out-of-memory what-if check: its workload, the replays on a fresh
// simulated device, the choice of configurations, and the report paragraph.
#include "replay/what_if.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <exception>
#include <utility>

#include "replay/engine.hpp"
#include "replay/from_trace.hpp"

namespace stitch::replay {

namespace {

using detail::OomFacts;
using detail::WhatIfInput;
using detail::WhatIfSource;

// The simulated device: the failing device's total less what other users hold. The memory
// fraction stays a separate cap, as on the real device.
std::size_t sim_capacity(const OomFacts& f) {
  std::size_t others = 0;
  (void)detail::usable_bytes(f, &others);
  return f.device_total - others;
}

// The layout now, segment by segment (oldest first): each mapped run allocated at its full size
// (large pool: it makes a segment of that size, then is freed), then its blocks in address
// order; the blocks free now are freed at the end.
void layout_events(const std::vector<SegmentSnapshot>& layout, std::vector<Event>& events,
                   std::size_t& live_blocks, std::size_t& free_blocks) {
  std::vector<std::uintptr_t> free_now;
  for (const SegmentSnapshot& run : layout) {
    if (run.segment_type != "small") {
      const std::uintptr_t whole = run.address | 1;  // no block address is odd
      events.push_back({Event::Kind::alloc, whole, run.total_size, run.stream});
      events.push_back({Event::Kind::free, whole, 0, run.stream});
    }
    for (const BlockSnapshot& b : run.blocks) {
      events.push_back({Event::Kind::alloc, b.address, b.size, run.stream});
      if (b.state == "inactive") {
        free_now.push_back(b.address);
        ++free_blocks;
      } else {
        ++live_blocks;
      }
    }
  }
  for (std::uintptr_t addr : free_now) events.push_back({Event::Kind::free, addr, 0, 0});
}

}  // namespace

DeviceWorkload what_if_workload(const WhatIfInput& input, std::size_t* live_blocks,
                                std::size_t* free_blocks) {
  DeviceWorkload w;
  std::size_t live = 0, free = 0;
  if (input.source == WhatIfSource::history) {
    w.events = events_from_trace(input.history, FreeAt::completed);
    std::erase_if(w.events, [](const Event& e) { return e.kind == Event::Kind::none; });
  } else {
    layout_events(input.layout, w.events, live, free);
  }
  if (live_blocks != nullptr) *live_blocks = live;
  if (free_blocks != nullptr) *free_blocks = free;
  return w;
}

std::vector<std::string> what_if_changes(const Config& config) {
  std::vector<std::string> changes;
  if (!config.expandable_segments) changes.emplace_back("expandable_segments:True");
  if (!config.stitching) changes.emplace_back("expandable_segments:True,stitching:True");
  if (!config.stitch_compact)
    changes.emplace_back("expandable_segments:True,stitching:True,stitch_compact:True");
  return changes;
}

WhatIfOutcome replay_what_if(const OomFacts& facts, const WhatIfInput& input,
                             const DeviceWorkload& workload, const std::string& change) {
  Setup setup;
  setup.config = Config::parse(change, input.config);
  setup.config.record_history = false;
  setup.capacity = sim_capacity(facts);
  setup.granularity = input.granularity;
  setup.config.per_process_memory_fraction =
      facts.allowed && *facts.allowed < setup.capacity
          ? static_cast<double>(*facts.allowed) / static_cast<double>(setup.capacity)
          : 1.0;
  setup.retry_failed = true;
  setup.honour_releases = true;
  Replay replay(workload, setup);
  replay.start();

  WhatIfOutcome outcome;
  outcome.change = change;
  for (std::size_t i = 0; i < workload.events.size(); ++i) {
    if (!replay.step(workload.events[i])) {
      outcome.failed_at = i;
      return outcome;
    }
  }
  outcome.served = replay.try_allocate(facts.requested, input.stream);
  outcome.copied = static_cast<std::size_t>(replay.stats().compacted_bytes);
  return outcome;
}

WhatIfResult check_what_if(const OomFacts& facts, const WhatIfInput& input) {
  WhatIfResult r;
  r.source = input.source;
  const DeviceWorkload workload = what_if_workload(input, &r.live_blocks, &r.free_blocks);
  r.events = workload.events.size();
  r.capacity = sim_capacity(facts);
  r.allowed = facts.allowed;
  r.fallback_reason = input.fallback_reason;
  r.current = replay_what_if(facts, input, workload, "");
  const bool reproduced = !r.current.served && r.current.failed_at == SIZE_MAX;
  if (!reproduced || !input.virtual_memory) return r;
  for (const std::string& change : what_if_changes(input.config))
    r.candidates.push_back(replay_what_if(facts, input, workload, change));
  return r;
}

std::string format_what_if(const WhatIfResult& r) {
  std::string how;
  if (r.source == WhatIfSource::history) {
    how = fmt::format("replayed {} recorded event{}", r.events, r.events == 1 ? "" : "s");
  } else {
    how = fmt::format("rebuilt the device's {} live and {} free block{} segment by segment",
                      r.live_blocks, r.free_blocks, r.free_blocks == 1 ? "" : "s");
  }
  how += fmt::format(" on a simulated {} device", detail::format_size(r.capacity));
  if (r.allowed && *r.allowed < r.capacity)
    how += fmt::format(" ({} allowed)", detail::format_size(*r.allowed));
  std::string out = "What-if: ";
  if (r.current.served || r.current.failed_at != SIZE_MAX) {
    out += fmt::format(
        "not conclusive: with the current configuration the same replay ({}) {}, so it does not "
        "reproduce this failure; no configuration is named.",
        how, r.current.served ? "served the request"
                              : fmt::format("failed earlier, at event {}", r.current.failed_at + 1));
  } else {
    std::vector<std::string> served;
    std::vector<std::string> failed;
    for (const WhatIfOutcome& c : r.candidates) {
      if (c.served) {
        served.push_back(c.copied == 0 ? c.change
                                       : fmt::format("{} (compaction copying {} of live data)",
                                                     c.change, detail::format_size(c.copied)));
      } else if (c.failed_at != SIZE_MAX) {
        failed.push_back(fmt::format("{} (fails earlier, at event {})", c.change, c.failed_at + 1));
      } else {
        failed.push_back(c.change);
      }
    }
    if (r.candidates.empty()) {
      out += fmt::format("no configuration change to check (expandable segments, stitching and "
                         "compaction are on, or the device lacks the virtual-memory API they "
                         "need); checked: {}, the request fails as here.", how);
    } else if (served.empty()) {
      out += fmt::format("no configuration change serves this request (checked {}: {}; the "
                         "request fails with each).", fmt::join(failed, " and "), how);
    } else {
      out += fmt::format("{} would have served this request (checked: {}; the current "
                         "configuration fails the same replay).",
                         fmt::join(served, " or "), how);
      if (!failed.empty())
        out += fmt::format(" {} would not.", fmt::join(failed, " and "));
    }
  }
  if (r.source == WhatIfSource::live_blocks)
    out += fmt::format(" The history was not replayed: {}.", r.fallback_reason);
  return out;
}

std::string what_if_not_run(const OomFacts& f, bool enabled, bool capture_failed) {
  if (f.requested >= detail::kAbsurdRequest) return "";
  if (!enabled) return "What-if: off (oom_what_if:False); no other configuration was checked.";
  if (!f.device_info_known)
    return "What-if: not run: the device did not report its memory, so it cannot be simulated.";
  if (f.spilled > 0)
    return fmt::format("What-if: not run: {} is on host pages (spill), which the replay does not "
                       "model.",
                       detail::format_size(f.spilled));
  if (detail::provably_too_big(f)) {
    if (detail::classify_oom(f) == detail::OomVerdict::too_much_live_data) return "";  // the verdict says it
    return "What-if: no configuration change serves this request: what is live plus the request "
           "exceed what this allocator can use.";
  }
  if (capture_failed) return "What-if: not run: the workload could not be captured.";
  return "";
}

std::string oom_message(const detail::OomCapture& capture) noexcept {
  try {
    const OomFacts& facts = capture.facts;
    const WhatIfInput* input = capture.what_if.get();
    std::string paragraph;
    if (input == nullptr) {
      paragraph = what_if_not_run(facts, capture.what_if_enabled, capture.capture_failed);
    } else if (!input->not_run.empty()) {
      paragraph = "What-if: not run: " + input->not_run + ".";
    } else {
      try {
        paragraph = format_what_if(check_what_if(facts, *input));
      } catch (const std::exception& failure) {
        paragraph = fmt::format("What-if: not run: the replay failed: {}", failure.what());
      }
    }
    return detail::format_oom(facts, paragraph);
  } catch (...) {
  }
  try {
    return detail::format_oom(capture.facts, "What-if: not run (the check could not be completed).");
  } catch (...) {
    return "";
  }
}

}  // namespace stitch::replay
