// diagnostics/what_if.cpp — the out-of-memory what-if check: the replay on a fresh simulated
// device, the choice of configurations, and the report paragraph.
#include "diagnostics/what_if.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <exception>
#include <unordered_map>
#include <utility>

#include "stitch/allocator.hpp"
#include "stitch/sim_backend.hpp"

namespace stitch::detail {

namespace {

constexpr std::size_t kAbsurdRequest = std::size_t{1} << 60;  // format_oom's "more than 1EB"

// The request can be served by no configuration: what is live plus the request already exceed
// what this allocator may use.
bool provably_too_big(const OomFacts& f) {
  std::size_t others = 0;
  return f.allocated + f.rounded > usable_bytes(f, &others);
}

// The simulated device: the failing device's total less what other users hold. The memory
// fraction stays a separate cap, as on the real device.
std::size_t sim_capacity(const OomFacts& f) {
  std::size_t others = 0;
  (void)usable_bytes(f, &others);
  return f.device_total - others;
}

stream_t as_stream(std::uintptr_t s) { return reinterpret_cast<stream_t>(s); }

// allocate(), with out_of_memory turned into nullptr.
void* try_allocate(Allocator& a, std::size_t size, std::uintptr_t stream) {
  try {
    return a.allocate(size, as_stream(stream), 0);
  } catch (const out_of_memory&) {
    return nullptr;
  }
}

}  // namespace

bool what_if_wanted(const OomFacts& f, const Config& config) {
  return config.oom_what_if && f.device_info_known && f.requested < kAbsurdRequest &&
         !provably_too_big(f);
}

std::vector<std::string> what_if_changes(const Config& config) {
  std::vector<std::string> changes;
  if (!config.expandable_segments) changes.emplace_back("expandable_segments:True");
  if (!config.stitching) changes.emplace_back("expandable_segments:True,stitching:True");
  return changes;
}

WhatIfOutcome replay_what_if(const OomFacts& facts, const WhatIfInput& input,
                             const std::string& change) {
  Config config = Config::parse(change, input.config);
  config.backend = BackendKind::sim;
  config.record_history = false;
  config.record_stacks = false;
  config.oom_snapshot.clear();
  config.oom_what_if = false;  // the replay's own OOMs are expected: no check of the check
  SimBackend::Options options;
  options.capacity = sim_capacity(facts);
  options.granularity = input.granularity;
  config.per_process_memory_fraction =
      facts.allowed && *facts.allowed < options.capacity
          ? static_cast<double>(*facts.allowed) / static_cast<double>(options.capacity)
          : 1.0;
  auto sim = std::make_shared<SimBackend>(options);
  Allocator replay(config, sim);

  WhatIfOutcome outcome;
  outcome.change = change;
  std::unordered_map<std::uintptr_t, void*> live;  // recorded address -> replayed block
  live.reserve(input.events.size());
  for (std::size_t i = 0; i < input.events.size(); ++i) {
    const WhatIfEvent& e = input.events[i];
    switch (e.kind) {
      case WhatIfEvent::Kind::alloc: {
        void* p = try_allocate(replay, e.size, e.stream);
        if (p == nullptr) {
          outcome.failed_at = i;
          return outcome;
        }
        live[e.addr] = p;
        break;
      }
      case WhatIfEvent::Kind::free: {
        const auto it = live.find(e.addr);
        if (it == live.end()) break;  // allocated before the history: nothing to free
        replay.deallocate(it->second);
        live.erase(it);
        break;
      }
      case WhatIfEvent::Kind::failed:
        if (void* p = try_allocate(replay, e.size, e.stream)) replay.deallocate(p);
        break;
      case WhatIfEvent::Kind::release:
        replay.empty_cache();
        break;
    }
  }
  outcome.served = try_allocate(replay, facts.requested, input.stream) != nullptr;
  return outcome;
}

WhatIfResult check_what_if(const OomFacts& facts, const WhatIfInput& input) {
  WhatIfResult r;
  r.source = input.source;
  r.events = input.events.size();
  r.live_blocks = input.live_blocks;
  r.free_blocks = input.free_blocks;
  r.capacity = sim_capacity(facts);
  r.allowed = facts.allowed;
  r.fallback_reason = input.fallback_reason;
  r.current = replay_what_if(facts, input, "");
  const bool reproduced = !r.current.served && r.current.failed_at == SIZE_MAX;
  if (!reproduced || !input.virtual_memory) return r;
  for (const std::string& change : what_if_changes(input.config))
    r.candidates.push_back(replay_what_if(facts, input, change));
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
  how += fmt::format(" on a simulated {} device", format_size(r.capacity));
  if (r.allowed && *r.allowed < r.capacity) how += fmt::format(" ({} allowed)", format_size(*r.allowed));
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
        served.push_back(c.change);
      } else if (c.failed_at != SIZE_MAX) {
        failed.push_back(fmt::format("{} (fails earlier, at event {})", c.change, c.failed_at + 1));
      } else {
        failed.push_back(c.change);
      }
    }
    if (r.candidates.empty()) {
      out += fmt::format("no configuration change to check (expandable segments and stitching "
                         "are on, or the device lacks the virtual-memory API they need); "
                         "checked: {}, the request fails as here.", how);
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

std::string what_if_not_run(const OomFacts& f, const Config& config, bool capture_failed) {
  if (f.requested >= kAbsurdRequest) return "";
  if (!config.oom_what_if) return "What-if: off (oom_what_if:False); no other configuration was checked.";
  if (!f.device_info_known)
    return "What-if: not run: the device did not report its memory, so it cannot be simulated.";
  if (provably_too_big(f)) {
    if (classify_oom(f) == OomVerdict::too_much_live_data) return "";  // the verdict says it
    return "What-if: no configuration change serves this request: what is live plus the request "
           "exceed what this allocator can use.";
  }
  if (capture_failed) return "What-if: not run: the workload could not be captured.";
  return "";
}

PendingOom::PendingOom(OomFacts facts, std::shared_ptr<const WhatIfInput> input)
    : out_of_memory(format_oom(facts, "What-if: not run (the check could not be completed).")),
      facts_(std::make_shared<const OomFacts>(std::move(facts))),
      input_(std::move(input)) {}

void throw_oom(OomFacts facts, const Config& config, std::shared_ptr<const WhatIfInput> input,
               bool capture_failed) {
  if (input && !input->not_run.empty())
    throw out_of_memory(format_oom(facts, "What-if: not run: " + input->not_run + "."));
  if (input) throw PendingOom(std::move(facts), std::move(input));
  throw out_of_memory(format_oom(facts, what_if_not_run(facts, config, capture_failed)));
}

std::string complete_oom_report(const out_of_memory& e) noexcept {
  const auto* pending = dynamic_cast<const PendingOom*>(&e);
  if (pending == nullptr) return "";
  try {
    std::string paragraph;
    try {
      paragraph = format_what_if(check_what_if(pending->facts(), pending->input()));
    } catch (const std::exception& failure) {
      paragraph = fmt::format("What-if: not run: the replay failed: {}", failure.what());
    }
    return format_oom(pending->facts(), paragraph);
  } catch (...) {
    return "";
  }
}

}  // namespace stitch::detail
