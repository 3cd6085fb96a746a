// tools/replay/replayer.cpp — drives a stitch::Allocator on a SimBackend with a trace's events.
#include "tools/replay/replayer.hpp"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <map>
#include <memory>
#include <unordered_map>

#include "stitch/allocator.hpp"
#include "stitch/errors.hpp"
#include "stitch/sim_backend.hpp"

namespace stitch::replay {

namespace {

// The simulated device never touches the memory here: pointers are placeholders.
struct Run {
  Run(const DeviceTrace& t, const ReplayOptions& o) : trace(t), options(o) {
    SimBackend::Options so;
    so.capacity = o.capacity;
    sim = std::make_shared<SimBackend>(so);
    const std::string conf = o.config.empty() ? "backend:sim" : "backend:sim," + o.config;
    alloc = std::make_unique<Allocator>(Config::parse(conf), sim);
  }

  stream_t stream_of(std::uintptr_t s) const { return reinterpret_cast<stream_t>(s); }

  void allocate(std::uintptr_t addr, std::size_t size, std::uintptr_t stream) {
    if (size == 0) return;
    try {
      void* p = alloc->allocate(size, stream_of(stream), 0);
      live[addr] = p;
      requested += size;
      sizes[addr] = size;
    } catch (const out_of_memory&) {
      ++ooms;
    }
  }
  void release(std::uintptr_t addr) {
    auto it = live.find(addr);
    if (it == live.end()) return;  // its allocation failed (OOM) or it was never seen
    alloc->deallocate(it->second);
    live.erase(it);
    requested -= sizes[addr];
    sizes.erase(addr);
  }

  const DeviceTrace& trace;
  const ReplayOptions& options;
  std::shared_ptr<SimBackend> sim;
  std::unique_ptr<Allocator> alloc;
  std::unordered_map<std::uintptr_t, void*> live;
  std::unordered_map<std::uintptr_t, std::size_t> sizes;
  std::size_t requested = 0;
  std::size_t ooms = 0;
};

std::size_t largest_free(const Allocator& a) {
  std::size_t largest = 0;
  for (const SegmentSnapshot& s : a.snapshot().segments)
    for (const BlockSnapshot& b : s.blocks)
      if (b.state == "inactive") largest = std::max(largest, b.size);
  return largest;
}

// Replays events [0, stop) (all when stop == SIZE_MAX); calls `each` after every event.
template <typename Each>
void drive(Run& run, std::size_t stop, Each&& each) {
  const DeviceTrace& t = run.trace;
  if (run.options.warm_start) {
    // Create the segments the recording allocator held, then free them: they stay cached.
    std::vector<void*> held;
    for (const InitialSegment& s : t.cached_segments) {
      // 1 MiB lands in the small pool's 2 MiB segments; larger sizes get their own segment.
      const std::size_t size = s.small ? (std::size_t{1} << 20) : s.size;
      try {
        held.push_back(run.alloc->allocate(size, run.stream_of(s.stream), 0));
      } catch (const out_of_memory&) {
        ++run.ooms;
      }
    }
    for (void* p : held) run.alloc->deallocate(p);
  }
  for (const InitialBlock& b : t.initial) run.allocate(b.addr, b.size, b.stream);
  const TraceAction release =
      t.has_free_completed ? TraceAction::free_completed : TraceAction::free_requested;
  const std::size_t n = std::min(stop, t.events.size());
  for (std::size_t i = 0; i < n; ++i) {
    const Event& e = t.events[i];
    if (e.action == TraceAction::alloc) {
      run.allocate(e.addr, e.size, e.stream);
    } else if (e.action == release) {
      run.release(e.addr);
    }
    each(i);
  }
}

}  // namespace

ReplayResult replay(const DeviceTrace& trace, const ReplayOptions& options) {
  ReplayResult r;
  r.config = options.config;
  r.capacity = options.capacity;
  r.events = trace.events.size();
  std::size_t worst_event = 0;
  const auto start = std::chrono::steady_clock::now();
  {
    ReplayOptions with_history = options;
    with_history.config += std::string(options.config.empty() ? "" : ",") +
                           "record_history:True,max_entries:" +
                           std::to_string(2 * trace.events.size() + 16);
    Run run(trace, with_history);
    r.peak_requested = run.requested;
    drive(run, SIZE_MAX, [&](std::size_t i) {
      const DeviceStats s = run.alloc->stats(0);
      const auto reserved = static_cast<std::size_t>(s.reserved_bytes[kAll].current);
      const auto allocated = static_cast<std::size_t>(s.allocated_bytes[kAll].current);
      r.peak_requested = std::max(r.peak_requested, run.requested);
      if (reserved > r.peak_reserved) {
        r.peak_reserved = reserved;
        r.peak_reserved_event = i + 1;
      }
      if (reserved - allocated > r.peak_unallocated) {
        r.peak_unallocated = reserved - allocated;
        worst_event = i + 1;
      }
      if (options.sample_every != 0 && i % options.sample_every == 0)
        r.series.push_back(Sample{i, run.requested, reserved, allocated});
      if (options.progress && i % options.progress_every == 0) options.progress(i, r.events);
    });
    const DeviceStats s = run.alloc->stats(0);
    r.peak_reserved = std::max(r.peak_reserved, static_cast<std::size_t>(s.reserved_bytes[kAll].peak));
    r.maps = static_cast<std::int64_t>(run.sim->call_count(SimCall::map));
    r.unmaps = static_cast<std::int64_t>(run.sim->call_count(SimCall::unmap));
    r.stream_syncs = static_cast<std::int64_t>(run.sim->call_count(SimCall::synchronize_stream));
    r.device_allocs = static_cast<std::int64_t>(run.sim->call_count(SimCall::allocate));
    r.device_frees = static_cast<std::int64_t>(run.sim->call_count(SimCall::deallocate));
    r.ooms = run.ooms;
    const Snapshot history = run.alloc->snapshot();
    for (const TraceEntry& e : history.device_traces[0])
      if (e.action == TraceAction::segment_alloc || e.action == TraceAction::segment_map)
        r.segments.push_back(e.size);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (options.progress) options.progress(r.events, r.events);
  // Second pass to the worst moment, to see how the free memory was split up then.
  if (r.peak_unallocated > 0) {
    Run run(trace, options);
    drive(run, worst_event, [](std::size_t) {});
    r.largest_free_at_worst = largest_free(*run.alloc);
  }
  return r;
}

Snapshot snapshot_after(const DeviceTrace& trace, const ReplayOptions& options, std::size_t events,
                        std::size_t& requested) {
  Run run(trace, options);
  drive(run, events, [](std::size_t) {});
  requested = run.requested;
  return run.alloc->snapshot();
}

std::optional<std::size_t> min_capacity(const DeviceTrace& trace, const std::string& config,
                                        std::size_t upper, std::size_t step) {
  auto fits = [&](std::size_t capacity) {
    ReplayOptions o;
    o.config = config;
    o.capacity = capacity;
    // A cheap single pass: only OOMs matter here.
    Run run(trace, o);
    drive(run, SIZE_MAX, [](std::size_t) {});
    return run.ooms == 0;
  };
  upper = (upper + step - 1) / step * step;
  if (!fits(upper)) return std::nullopt;
  std::size_t lo = std::max<std::size_t>(peak_requested(trace) / step, 1) - 1;  // fails (or 0)
  std::size_t hi = upper / step;                                                  // fits
  while (hi - lo > 1) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (fits(mid * step)) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return hi * step;
}

std::optional<Fidelity> fidelity(const DeviceTrace& trace) {
  if (!trace.recorded_peak_reserved || *trace.recorded_peak_reserved == 0) return std::nullopt;
  ReplayOptions o;
  o.warm_start = true;
  const ReplayResult r = replay(trace, o);
  Fidelity f;
  f.recorded_peak_reserved = *trace.recorded_peak_reserved;
  f.replayed_peak_reserved = r.peak_reserved;
  const double rec = static_cast<double>(f.recorded_peak_reserved);
  f.peak_error = std::abs(static_cast<double>(r.peak_reserved) - rec) / rec;
  // Segments created during the trace (the warm start's own come first: skip them).
  std::map<std::size_t, long> counts;
  for (std::size_t s : trace.recorded_segments) ++counts[s];
  long shared = 0;
  const std::size_t skip = std::min(r.segments.size(), trace.cached_segments.size());
  for (std::size_t i = skip; i < r.segments.size(); ++i) {
    auto it = counts.find(r.segments[i]);
    if (it != counts.end() && it->second > 0) {
      --it->second;
      ++shared;
    }
  }
  const auto denom = std::max(trace.recorded_segments.size(), r.segments.size() - skip);
  f.segment_agreement = denom == 0 ? 1.0 : static_cast<double>(shared) / static_cast<double>(denom);
  return f;
}

}  // namespace stitch::replay
