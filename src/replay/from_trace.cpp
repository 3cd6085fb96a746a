// replay/from_trace.cpp — recorded histories as workloads, and the state at their start.
//
// The rules for the start (docs/fragmentation.md, "The state at the start"): a dump that carries
// a trace was taken while recording was on (PyTorch clears the trace when recording stops), so
// - a block is live at the start when it is active in the dump, the trace never allocated it,
//   and it lies outside every range the trace created (segment_alloc / segment_map), or when
//   the trace frees it without having allocated it;
// - memory is held at the start when it is in the dump and the trace did not create it, or when
//   the trace gives it back without having created it: the dump's segments with the trace's
//   segment events undone, newest first;
// - reserved at the start is the dump's reserved memory minus the trace's net segment events,
//   and the recording's true peak is that plus the running maximum of those events.
#include "replay/from_trace.hpp"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <unordered_map>
#include <unordered_set>

namespace stitch::replay {

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

bool gives_back(TraceAction a) {
  return a == TraceAction::segment_free || a == TraceAction::segment_unmap;
}

bool creates(TraceAction a) {
  return a == TraceAction::segment_alloc || a == TraceAction::segment_map;
}

bool has_free_completed(const std::vector<TraceEntry>& entries) {
  return std::any_of(entries.begin(), entries.end(),
                     [](const TraceEntry& e) { return e.action == TraceAction::free_completed; });
}

using Ranges = std::map<std::uintptr_t, std::uintptr_t>;  // start -> end

bool in_ranges(const Ranges& ranges, std::uintptr_t addr) {
  auto it = ranges.upper_bound(addr);
  return it != ranges.begin() && addr < std::prev(it)->second;
}

// Interval arithmetic on one stream's mapped expandable memory.
void add_range(Ranges& r, std::uintptr_t lo, std::uintptr_t hi) {
  if (lo >= hi) return;
  auto it = r.upper_bound(lo);
  if (it != r.begin() && std::prev(it)->second >= lo) {
    --it;
    lo = it->first;
    hi = std::max(hi, it->second);
    it = r.erase(it);
  }
  while (it != r.end() && it->first <= hi) {
    hi = std::max(hi, it->second);
    it = r.erase(it);
  }
  r[lo] = hi;
}

void remove_range(Ranges& r, std::uintptr_t lo, std::uintptr_t hi) {
  if (lo >= hi) return;
  auto it = r.upper_bound(lo);
  if (it != r.begin() && std::prev(it)->second > lo) --it;
  while (it != r.end() && it->first < hi) {
    const std::uintptr_t a = it->first, b = it->second;
    it = r.erase(it);
    if (a < lo) r[a] = lo;
    if (b > hi) {
      r[hi] = b;
      break;
    }
  }
}

// The memory held at the start: the dump's segments (of this device) with the trace's segment
// events undone, newest first.
std::vector<StartSegment> held_at_start(int device, const std::vector<TraceEntry>& entries,
                                        const std::vector<SegmentSnapshot>& dump) {
  std::map<std::uintptr_t, StartSegment> plain;
  std::map<std::uintptr_t, Ranges> mapped;                      // stream -> expandable runs
  std::map<std::uintptr_t, bool> run_small;                     // known run start -> small pool
  for (const SegmentSnapshot& s : dump) {
    if (s.device != device || s.sleeping) continue;  // a sleeping range holds no device memory
    const bool small = s.segment_type == "small";
    if (s.is_expandable) {
      add_range(mapped[s.stream], s.address, s.address + s.total_size);
      run_small[s.address] = small;
    } else {
      plain[s.address] = StartSegment{s.address, s.total_size, s.stream, small, false};
    }
  }
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    const TraceEntry& e = *it;
    switch (e.action) {
      case TraceAction::segment_alloc: plain.erase(e.addr); break;
      case TraceAction::segment_free:
        if (!plain.count(e.addr))
          plain[e.addr] = StartSegment{e.addr, e.size, e.stream, e.size == 2 * kMiB, false};
        break;
      case TraceAction::segment_map: remove_range(mapped[e.stream], e.addr, e.addr + e.size); break;
      case TraceAction::segment_unmap:
        add_range(mapped[e.stream], e.addr, e.addr + e.size);
        break;
      default: break;
    }
  }
  std::vector<StartSegment> out;
  for (const auto& [addr, s] : plain) out.push_back(s);
  for (const auto& [stream, runs] : mapped) {
    for (const auto& [lo, hi] : runs) {
      // The pool of a run the dump shows; else the page size tells: the large pool maps 20 MiB
      // pages, the small pool 2 MiB ones.
      bool small = (hi - lo) % (20 * kMiB) != 0;
      auto known = run_small.upper_bound(hi - 1);
      if (known != run_small.begin() && std::prev(known)->first >= lo) small = std::prev(known)->second;
      out.push_back(StartSegment{lo, hi - lo, stream, small, true});
    }
  }
  std::sort(out.begin(), out.end(),
            [](const StartSegment& a, const StartSegment& b) { return a.addr < b.addr; });
  return out;
}

// The start state and the recording's own figures, from the entries and the dump's segments.
void reconstruct(DeviceWorkload& t, const std::vector<TraceEntry>& entries,
                 const std::vector<SegmentSnapshot>& dump) {
  // The recording allocator's segment events.
  std::int64_t net = 0, peak = 0;
  bool seen_segment_event = false;
  Ranges traced;  // every range the trace created
  std::unordered_set<std::uintptr_t> allocated;
  for (const TraceEntry& e : entries) {
    if (creates(e.action)) {
      seen_segment_event = true;
      net += static_cast<std::int64_t>(e.size);
      peak = std::max(peak, net);
      t.recorded_segments.push_back(e.size);
      traced[e.addr] = std::max(traced[e.addr], e.addr + e.size);
    } else if (gives_back(e.action)) {
      seen_segment_event = true;
      net -= static_cast<std::int64_t>(e.size);
    } else if (e.action == TraceAction::alloc) {
      allocated.insert(e.addr);
    }
  }
  std::int64_t dump_reserved = 0;
  for (const SegmentSnapshot& s : dump)
    if (s.device == t.device) dump_reserved += static_cast<std::int64_t>(s.total_size);
  t.reserved_at_start = static_cast<std::size_t>(std::max<std::int64_t>(dump_reserved - net, 0));
  if (seen_segment_event) t.recorded_peak_reserved = t.reserved_at_start + static_cast<std::size_t>(peak);
  t.held_segments = held_at_start(t.device, entries, dump);

  // Live at the start: blocks freed before the trace allocated them...
  std::unordered_set<std::uintptr_t> live;
  std::map<std::uintptr_t, StartBlock> initial;
  const TraceAction release =
      has_free_completed(entries) ? TraceAction::free_completed : TraceAction::free_requested;
  for (const TraceEntry& e : entries) {
    if (e.action == TraceAction::alloc) {
      live.insert(e.addr);
    } else if (e.action == release) {
      if (live.erase(e.addr) == 0 && !initial.count(e.addr))
        initial[e.addr] = StartBlock{e.addr, e.size, e.stream, 0};
    }
  }
  // ... and blocks active in the dump that the trace never allocated, outside the memory it
  // created.
  for (const SegmentSnapshot& s : dump) {
    if (s.device != t.device) continue;
    for (const BlockSnapshot& b : s.blocks) {
      if (b.state == "inactive" || b.state == "unmapped") continue;
      if (allocated.count(b.address) || initial.count(b.address) || in_ranges(traced, b.address)) continue;
      const std::size_t size = b.requested_size != 0 ? b.requested_size : b.size;
      initial[b.address] = StartBlock{b.address, size, s.stream, b.size};
    }
  }
  t.initial.clear();
  for (const auto& [addr, block] : initial) t.initial.push_back(block);
  t.starts_empty = t.initial.empty() && t.held_segments.empty();
}

// Splits each release (one empty_cache-like event per run of segment_free) into partial
// releases where the recording allocator kept an entirely free plain segment cached through
// the run: it released only some (garbage collection, oversize segments), each replayed as
// release_segment. Needs the start state: which segments were held and which blocks live.
void classify_releases(DeviceWorkload& t, const std::vector<TraceEntry>& entries) {
  struct Seg {
    std::size_t size;
    std::size_t live;
  };
  std::map<std::uintptr_t, Seg> segs;  // the recording's plain segments now
  for (const StartSegment& s : t.held_segments)
    if (!s.expandable) segs[s.addr] = Seg{s.size, 0};
  std::unordered_map<std::uintptr_t, std::uintptr_t> owner;  // live block -> its segment
  auto take = [&](std::uintptr_t addr) {
    auto it = segs.upper_bound(addr);
    if (it == segs.begin()) return;
    --it;
    if (addr >= it->first + it->second.size) return;
    ++it->second.live;
    owner[addr] = it->first;
  };
  auto give = [&](std::uintptr_t addr) {
    auto o = owner.find(addr);
    if (o == owner.end()) return;
    auto it = segs.find(o->second);
    if (it != segs.end() && it->second.live > 0) --it->second.live;
    owner.erase(o);
  };
  for (const StartBlock& b : t.initial) take(b.addr);
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const TraceEntry& e = entries[i];
    if (e.action == TraceAction::segment_alloc) {
      segs[e.addr] = Seg{e.size, 0};
    } else if (e.action == TraceAction::alloc) {
      take(e.addr);
    } else if (t.events[i].kind == Event::Kind::free) {
      give(e.addr);
    }
    if (e.action != TraceAction::segment_free) continue;
    if (t.events[i].kind != Event::Kind::release) {
      segs.erase(e.addr);
      continue;
    }
    std::size_t j = i;
    while (j + 1 < t.events.size() && entries[j + 1].action == TraceAction::segment_free) ++j;
    for (std::size_t k = i; k <= j; ++k) segs.erase(entries[k].addr);
    const bool partial = std::any_of(segs.begin(), segs.end(),
                                     [](const auto& s) { return s.second.live == 0; });
    if (partial)
      for (std::size_t k = i; k <= j; ++k) t.events[k].kind = Event::Kind::release_segment;
    i = j;
  }
}

// The entries a workload is built from: no snapshot entries (events_from_trace's positions).
std::vector<TraceEntry> replayable(const std::vector<TraceEntry>& all) {
  std::vector<TraceEntry> entries;
  entries.reserve(all.size());
  for (const TraceEntry& e : all)
    if (e.action != TraceAction::snapshot) entries.push_back(e);
  return entries;
}

std::vector<Event> events_of(const std::vector<TraceEntry>& entries, FreeAt free_at, Unmaps unmaps) {
  const TraceAction release = free_at == FreeAt::completed || has_free_completed(entries)
                                  ? TraceAction::free_completed
                                  : TraceAction::free_requested;
  std::vector<Event> events;
  events.reserve(entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const TraceEntry& e = entries[i];
    Event out{Event::Kind::none, e.addr, e.size, e.stream};
    if (e.action == TraceAction::alloc) {
      out.kind = Event::Kind::alloc;
    } else if (e.action == release) {
      out.kind = Event::Kind::free;
    } else if (e.action == TraceAction::oom) {
      out.kind = Event::Kind::failed;
    } else if (gives_back(e.action)) {
      // Memory given back (empty_cache, or the OOM ladder before it retries): one release.
      // With stitching, a run of unmaps followed by a map may be pages moving, not a release.
      std::size_t j = i;
      while (j + 1 < entries.size() && gives_back(entries[j + 1].action)) ++j;
      if (unmaps == Unmaps::release || j + 1 == entries.size() ||
          entries[j + 1].action != TraceAction::segment_map)
        out.kind = Event::Kind::release;
      events.push_back(out);
      for (std::size_t k = i + 1; k <= j; ++k)
        events.push_back(Event{Event::Kind::none, entries[k].addr, entries[k].size, entries[k].stream});
      i = j;
      continue;
    }
    events.push_back(out);
  }
  return events;
}

// The failed requests: each oom entry with what the recording held then (its segment events
// before the entry, from reserved_at_start).
std::vector<RecordedOom> recorded_ooms(const DeviceWorkload& t, const std::vector<TraceEntry>& entries) {
  std::vector<RecordedOom> out;
  std::int64_t held = static_cast<std::int64_t>(t.reserved_at_start);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const TraceEntry& e = entries[i];
    if (creates(e.action)) held += static_cast<std::int64_t>(e.size);
    if (gives_back(e.action)) held -= static_cast<std::int64_t>(e.size);
    if (e.action == TraceAction::oom)
      out.push_back(RecordedOom{i, e.size, e.stream, e.addr, static_cast<std::size_t>(std::max<std::int64_t>(held, 0))});
  }
  return out;
}

}  // namespace

std::vector<Event> events_from_trace(const std::vector<TraceEntry>& all, FreeAt free_at, Unmaps unmaps) {
  return events_of(replayable(all), free_at, unmaps);
}

DeviceWorkload workload_from_trace(int device, const std::vector<TraceEntry>& all,
                                   const std::vector<SegmentSnapshot>& dump, Unmaps unmaps) {
  DeviceWorkload t;
  t.device = device;
  const std::vector<TraceEntry> entries = replayable(all);
  t.events = events_of(entries, FreeAt::automatic, unmaps);
  std::vector<TraceEntry> acting;  // without oom entries, which start nothing
  acting.reserve(entries.size());
  for (const TraceEntry& e : entries)
    if (e.action != TraceAction::oom) acting.push_back(e);
  reconstruct(t, acting, dump);
  classify_releases(t, entries);
  t.recorded_ooms = recorded_ooms(t, entries);
  return t;
}

std::vector<DeviceWorkload> workloads_from_snapshot(const Snapshot& snapshot) {
  const bool stitching = !snapshot.stitch_version.empty() &&
                         snapshot.stitch_config.find("stitching:True") != std::string::npos;
  const Unmaps unmaps = stitching ? Unmaps::may_move_pages : Unmaps::release;
  std::vector<DeviceWorkload> out;
  for (std::size_t d = 0; d < snapshot.device_traces.size(); ++d) {
    const std::vector<TraceEntry>& entries = snapshot.device_traces[d];
    const bool any = std::any_of(entries.begin(), entries.end(), [](const TraceEntry& e) {
      return e.action != TraceAction::snapshot && e.action != TraceAction::oom;
    });
    if (any) out.push_back(workload_from_trace(static_cast<int>(d), entries, snapshot.segments, unmaps));
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

std::size_t live_at_start(const DeviceWorkload& t) {
  std::size_t bytes = 0;
  for (const StartBlock& b : t.initial) bytes += b.size;
  return bytes;
}

std::size_t cached_at_start(const DeviceWorkload& t) {
  std::size_t blocks = 0;
  for (const StartBlock& b : t.initial)
    blocks += b.block_size != 0 ? b.block_size : (b.size + 511) / 512 * 512;
  return t.reserved_at_start > blocks ? t.reserved_at_start - blocks : 0;
}

}  // namespace stitch::replay
