// replay/trace_workload.cpp — recorded histories as workloads, and the state at their start.
#include "replay/trace_workload.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <unordered_map>

namespace stitch::replay {

namespace {

bool gives_back(TraceAction a) {
  return a == TraceAction::segment_free || a == TraceAction::segment_unmap;
}

bool has_free_completed(const std::vector<TraceEntry>& entries) {
  return std::any_of(entries.begin(), entries.end(),
                     [](const TraceEntry& e) { return e.action == TraceAction::free_completed; });
}

// Fills initial/starts_empty/recorded_* from the entries and the dump's segments.
void reconstruct(DeviceWorkload& t, const std::vector<TraceEntry>& entries,
                 const std::vector<SegmentSnapshot>& segments) {
  // The recording allocator's own segment events. A segment freed before the trace created it
  // was held at the start; so was every segment of the dump the trace never created.
  std::int64_t reserved = 0, peak = 0;
  bool first_segment_event_is_alloc = true, seen_segment_event = false;
  std::map<std::uintptr_t, std::uintptr_t> traced_ranges;  // start -> end
  std::map<std::uintptr_t, StartSegment> held;             // segments held before the trace
  for (const TraceEntry& e : entries) {
    switch (e.action) {
      case TraceAction::segment_alloc:
      case TraceAction::segment_map:
        seen_segment_event = true;
        reserved += static_cast<std::int64_t>(e.size);
        peak = std::max(peak, reserved);
        t.recorded_segments.push_back(e.size);
        traced_ranges[e.addr] = std::max(traced_ranges[e.addr], e.addr + e.size);
        break;
      case TraceAction::segment_free:
      case TraceAction::segment_unmap: {
        if (!seen_segment_event) first_segment_event_is_alloc = false;
        seen_segment_event = true;
        auto it = traced_ranges.find(e.addr);
        if (it == traced_ranges.end() && !held.count(e.addr))
          held[e.addr] = StartSegment{e.addr, e.size, e.stream, e.size == (std::size_t{2} << 20)};
        reserved -= static_cast<std::int64_t>(e.size);
        break;
      }
      default:
        break;
    }
  }
  // A dump segment the trace allocated from without having created it was held at the start.
  // (Dump segments the trace never touched may have been created after recording stopped.)
  auto in_range = [](const std::map<std::uintptr_t, std::uintptr_t>& ranges, std::uintptr_t addr) {
    auto it = ranges.upper_bound(addr);
    return it != ranges.begin() && addr < std::prev(it)->second;
  };
  std::map<std::uintptr_t, const SegmentSnapshot*> dump;  // start -> segment
  std::map<std::uintptr_t, std::uintptr_t> dump_ranges;
  for (const SegmentSnapshot& s : segments) {
    if (s.device != t.device || s.is_expandable) continue;
    dump[s.address] = &s;
    dump_ranges[s.address] = s.address + s.total_size;
  }
  for (const TraceEntry& e : entries) {
    if (e.action != TraceAction::alloc && e.action != TraceAction::free_requested) continue;
    if (in_range(traced_ranges, e.addr) || !in_range(dump_ranges, e.addr)) continue;
    const SegmentSnapshot& s = *std::prev(dump.upper_bound(e.addr))->second;
    if (!held.count(s.address))
      held[s.address] = StartSegment{s.address, s.total_size, s.stream, s.segment_type == "small"};
  }
  std::size_t held_bytes = 0;
  for (const auto& [addr, seg] : held) {
    t.cached_segments.push_back(seg);
    held_bytes += seg.size;
  }

  // Blocks freed before the trace allocated them were live at the start.
  std::unordered_map<std::uintptr_t, std::size_t> live;  // addr -> size
  std::map<std::uintptr_t, StartBlock> initial;
  const TraceAction release =
      has_free_completed(entries) ? TraceAction::free_completed : TraceAction::free_requested;
  for (const TraceEntry& e : entries) {
    if (e.action == TraceAction::alloc) {
      live[e.addr] = e.size;
    } else if (e.action == release) {
      if (live.erase(e.addr) == 0 && !initial.count(e.addr))
        initial[e.addr] = StartBlock{e.addr, e.size, e.stream};
    }
  }
  // With no such free and no segment released before one was created, the recording allocator
  // started empty: blocks the dump shows but the trace never allocated came after recording
  // stopped. Otherwise recording began mid-run, and those blocks were live all along — unless
  // they lie in memory the trace itself obtained, which cannot predate the trace.
  t.starts_empty = initial.empty() && first_segment_event_is_alloc && held.empty();
  if (!initial.empty() || !first_segment_event_is_alloc) {
    for (const SegmentSnapshot& s : segments) {
      if (s.device != t.device) continue;
      for (const BlockSnapshot& b : s.blocks) {
        if (b.state == "inactive" || b.state == "unmapped") continue;
        if (live.count(b.address) || initial.count(b.address) || in_range(traced_ranges, b.address))
          continue;
        const std::size_t size = b.requested_size != 0 ? b.requested_size : b.size;
        initial[b.address] = StartBlock{b.address, size, s.stream};
      }
    }
  }
  t.initial.clear();
  for (const auto& [addr, block] : initial) t.initial.push_back(block);
  if (seen_segment_event) t.recorded_peak_reserved = held_bytes + static_cast<std::size_t>(peak);
}

}  // namespace

std::vector<Event> events_from_trace(const std::vector<TraceEntry>& all, FreeAt free_at) {
  const TraceAction release = free_at == FreeAt::completed || has_free_completed(all)
                                  ? TraceAction::free_completed
                                  : TraceAction::free_requested;
  std::vector<TraceEntry const*> entries;
  entries.reserve(all.size());
  for (const TraceEntry& e : all)
    if (e.action != TraceAction::snapshot) entries.push_back(&e);
  std::vector<Event> events;
  events.reserve(entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const TraceEntry& e = *entries[i];
    Event out{Event::Kind::none, e.addr, e.size, e.stream};
    if (e.action == TraceAction::alloc) {
      out.kind = Event::Kind::alloc;
    } else if (e.action == release) {
      out.kind = Event::Kind::free;
    } else if (e.action == TraceAction::oom) {
      out.kind = Event::Kind::failed;
    } else if (gives_back(e.action)) {
      // Memory given back (empty_cache, or the OOM ladder before it retries): one release.
      // A run of unmaps followed by a map is stitching moving pages, not a release.
      std::size_t j = i;
      while (j + 1 < entries.size() && gives_back(entries[j + 1]->action)) ++j;
      if (j + 1 == entries.size() || entries[j + 1]->action != TraceAction::segment_map)
        out.kind = Event::Kind::release;
      events.push_back(out);
      for (std::size_t k = i + 1; k <= j; ++k)
        events.push_back(Event{Event::Kind::none, entries[k]->addr, entries[k]->size, entries[k]->stream});
      i = j;
      continue;
    }
    events.push_back(out);
  }
  return events;
}

DeviceWorkload workload_from_trace(int device, const std::vector<TraceEntry>& all,
                                   const std::vector<SegmentSnapshot>& dump) {
  DeviceWorkload t;
  t.device = device;
  t.events = events_from_trace(all);
  std::vector<TraceEntry> entries;  // without snapshot and oom entries, which start nothing
  entries.reserve(all.size());
  for (const TraceEntry& e : all)
    if (e.action != TraceAction::snapshot && e.action != TraceAction::oom) entries.push_back(e);
  reconstruct(t, entries, dump);
  return t;
}

std::vector<DeviceWorkload> workloads_from_snapshot(const Snapshot& snapshot) {
  std::vector<DeviceWorkload> out;
  for (std::size_t d = 0; d < snapshot.device_traces.size(); ++d) {
    const std::vector<TraceEntry>& entries = snapshot.device_traces[d];
    const bool any = std::any_of(entries.begin(), entries.end(), [](const TraceEntry& e) {
      return e.action != TraceAction::snapshot && e.action != TraceAction::oom;
    });
    if (any) out.push_back(workload_from_trace(static_cast<int>(d), entries, snapshot.segments));
  }
  return out;
}

std::size_t peak_requested(const DeviceWorkload& t) {
  std::size_t live = 0, peak = 0;
  std::unordered_map<std::uintptr_t, std::size_t> sizes;
  for (const StartBlock& b : t.initial) {
    sizes[b.addr] = b.size;
    live += b.size;
  }
  peak = live;
  for (const Event& e : t.events) {
    if (e.kind == Event::Kind::alloc) {
      sizes[e.addr] = e.size;
      live += e.size;
      peak = std::max(peak, live);
    } else if (e.kind == Event::Kind::free) {
      auto it = sizes.find(e.addr);
      if (it != sizes.end()) {
        live -= it->second;
        sizes.erase(it);
      }
    }
  }
  return peak;
}

}  // namespace stitch::replay
