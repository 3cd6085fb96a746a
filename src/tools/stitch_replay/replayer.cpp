// tools/stitch_replay/replayer.cpp — measures replays of a device's workload (replay/engine.hpp).
#include "tools/stitch_replay/replayer.hpp"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <map>

#include "replay/device_size.hpp"
#include "replay/engine.hpp"
#include "stitch/sim_backend.hpp"

namespace stitch::replay_cli {

namespace {

// The engine's setup for `options` (the simulated device never touches the memory here).
Setup setup_of(const ReplayOptions& o, std::size_t history = 0) {
  Setup s;
  s.config = o.settings ? *o.settings : Config::parse(o.config.empty() ? "backend:sim" : "backend:sim," + o.config);
  if (history != 0) {
    s.config.record_history = true;
    s.config.max_entries = history;
  }
  s.capacity = o.capacity;
  s.warm_start = o.warm_start;
  s.honour_releases = o.honour_releases;
  s.retry_failed = o.retry_failed;
  return s;
}

std::size_t largest_free(const Replay& run) {
  std::size_t largest = 0;
  for (const SegmentSnapshot& s : run.snapshot().segments)
    for (const BlockSnapshot& b : s.blocks)
      if (b.state == "inactive") largest = std::max(largest, b.size);
  return largest;
}

}  // namespace

ReplayResult replay(const DeviceWorkload& trace, const ReplayOptions& options) {
  ReplayResult r;
  r.config = options.config;
  r.capacity = options.capacity;
  r.events = trace.events.size();
  std::size_t worst_event = 0;
  const auto start = std::chrono::steady_clock::now();
  {
    Setup setup = setup_of(options, 2 * trace.events.size() + 16);
    setup.on_oom = [&](const Replay& run, const ReplayOom& oom) {
      if (!r.first_oom_event) r.first_oom_event = oom.event;
      if (options.explain == Explain::all || (options.explain == Explain::first && r.explanations.empty()))
        r.explanations.push_back(explain_oom(run, oom));
    };
    Replay run(trace, setup);
    run.run(SIZE_MAX, [&](std::size_t i) {
      const DeviceStats s = run.stats();
      const auto reserved = static_cast<std::size_t>(s.reserved_bytes[kAll].current);
      const auto allocated = static_cast<std::size_t>(s.allocated_bytes[kAll].current);
      r.peak_requested = std::max(r.peak_requested, run.requested());
      if (reserved > r.peak_reserved) {
        r.peak_reserved = reserved;
        r.peak_reserved_event = i + 1;
      }
      if (reserved - allocated > r.peak_unallocated) {
        r.peak_unallocated = reserved - allocated;
        worst_event = i + 1;
      }
      if (options.sample_every != 0 && i % options.sample_every == 0)
        r.series.push_back(Sample{i, run.requested(), reserved, allocated});
      if (options.progress && i % options.progress_every == 0) options.progress(i, r.events);
    });
    const DeviceStats s = run.stats();
    r.peak_reserved = std::max(r.peak_reserved, static_cast<std::size_t>(s.reserved_bytes[kAll].peak));
    const SimBackend& sim = run.sim();
    r.maps = static_cast<std::int64_t>(sim.call_count(SimCall::map));
    r.unmaps = static_cast<std::int64_t>(sim.call_count(SimCall::unmap));
    r.stream_syncs = static_cast<std::int64_t>(sim.call_count(SimCall::synchronize_stream));
    r.compactions = s.num_compactions;
    r.compacted_bytes = s.compacted_bytes;
    r.device_syncs = static_cast<std::int64_t>(sim.call_count(SimCall::synchronize_device));
    r.device_allocs = static_cast<std::int64_t>(sim.call_count(SimCall::allocate));
    r.device_frees = static_cast<std::int64_t>(sim.call_count(SimCall::deallocate));
    r.ooms = run.failures() + run.failed_retries();
    r.seeded_segments = run.seeded();
    r.calls = CallCounts::of(sim);
    const Snapshot history = run.snapshot();
    for (const TraceEntry& e : history.device_traces[0])
      if (e.action == TraceAction::segment_alloc || e.action == TraceAction::segment_map)
        r.segments.push_back(e.size);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (options.progress) options.progress(r.events, r.events);
  // Second pass to the worst moment, to see how the free memory was split up then.
  if (r.peak_unallocated > 0) {
    Replay run(trace, setup_of(options));
    run.run(worst_event);
    r.largest_free_at_worst = largest_free(run);
  }
  return r;
}

Snapshot snapshot_after(const DeviceWorkload& trace, const ReplayOptions& options, std::size_t events,
                        std::size_t& requested) {
  Replay run(trace, setup_of(options));
  run.run(events);
  requested = run.requested();
  return run.snapshot();
}

std::optional<Fidelity> fidelity(const DeviceWorkload& trace, const Config& settings) {
  if (!trace.recorded_peak_reserved || *trace.recorded_peak_reserved == 0) return std::nullopt;
  ReplayOptions o;
  o.settings = settings;
  o.warm_start = true;
  o.honour_releases = true;
  o.retry_failed = true;
  Fidelity f;
  f.capacity = implied_capacity(trace);
  if (f.capacity) o.capacity = *f.capacity;
  const ReplayResult r = replay(trace, o);
  if (!trace.recorded_ooms.empty()) f.recorded_oom = trace.recorded_ooms.front();
  f.replayed_oom_event = r.first_oom_event;
  f.replayed_ooms = r.ooms;
  f.oom_reproduced = f.recorded_oom && r.first_oom_event == f.recorded_oom->event;
  f.recorded_peak_reserved = *trace.recorded_peak_reserved;
  f.replayed_peak_reserved = r.peak_reserved;
  const double rec = static_cast<double>(f.recorded_peak_reserved);
  f.peak_error = std::abs(static_cast<double>(r.peak_reserved) - rec) / rec;
  for (const Event& e : trace.events)
    if (e.kind == Event::Kind::release || e.kind == Event::Kind::release_segment) ++f.releases;
  // Segments created during the trace (the warm start's own come first: skip them).
  std::map<std::size_t, long> counts;
  for (std::size_t s : trace.recorded_segments) ++counts[s];
  long shared = 0;
  const std::size_t skip = std::min(r.segments.size(), r.seeded_segments);
  for (std::size_t i = skip; i < r.segments.size(); ++i) {
    auto it = counts.find(r.segments[i]);
    if (it != counts.end() && it->second > 0) {
      --it->second;
      ++shared;
    }
  }
  f.recorded_segments = trace.recorded_segments.size();
  f.replayed_segments = r.segments.size() - skip;
  const auto denom = std::max(f.recorded_segments, f.replayed_segments);
  f.segment_agreement = denom == 0 ? 1.0 : static_cast<double>(shared) / static_cast<double>(denom);
  return f;
}

}  // namespace stitch::replay_cli
