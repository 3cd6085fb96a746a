// tools/replay/workload.cpp — turns snapshots and RMM logs into replayable workloads and
// reconstructs the state at the start of a trace.
#include "tools/replay/workload.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <map>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "diagnostics/pickle_reader.hpp"
#include "stitch/errors.hpp"

namespace stitch::replay {

namespace {

// Fills initial/starts_empty/recorded_* from the events and the final segments.
void reconstruct(DeviceTrace& t, const std::vector<SegmentSnapshot>& segments) {
  t.has_free_completed = std::any_of(t.events.begin(), t.events.end(), [](const Event& e) {
    return e.action == TraceAction::free_completed;
  });

  // The recording allocator's own segment events. A segment freed before the trace created it
  // was held at the start; so was every segment of the dump the trace never created.
  std::int64_t reserved = 0, peak = 0;
  bool first_segment_event_is_alloc = true, seen_segment_event = false;
  std::map<std::uintptr_t, std::uintptr_t> traced_ranges;  // start -> end
  std::map<std::uintptr_t, InitialSegment> held;            // segments held before the trace
  for (const Event& e : t.events) {
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
          held[e.addr] = InitialSegment{e.addr, e.size, e.stream, e.size == (std::size_t{2} << 20)};
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
  for (const Event& e : t.events) {
    if (e.action != TraceAction::alloc && e.action != TraceAction::free_requested) continue;
    if (in_range(traced_ranges, e.addr) || !in_range(dump_ranges, e.addr)) continue;
    const SegmentSnapshot& s = *std::prev(dump.upper_bound(e.addr))->second;
    if (!held.count(s.address))
      held[s.address] = InitialSegment{s.address, s.total_size, s.stream, s.segment_type == "small"};
  }
  std::size_t held_bytes = 0;
  for (const auto& [addr, seg] : held) {
    t.cached_segments.push_back(seg);
    held_bytes += seg.size;
  }

  // Blocks freed before the trace allocated them were live at the start.
  std::unordered_map<std::uintptr_t, std::size_t> live;  // addr -> size
  std::map<std::uintptr_t, InitialBlock> initial;
  const TraceAction release =
      t.has_free_completed ? TraceAction::free_completed : TraceAction::free_requested;
  for (const Event& e : t.events) {
    if (e.action == TraceAction::alloc) {
      live[e.addr] = e.size;
    } else if (e.action == release) {
      if (live.erase(e.addr) == 0 && !initial.count(e.addr))
        initial[e.addr] = InitialBlock{e.addr, e.size, e.stream};
    }
  }
  // With no such free and no segment released before one was created, the recording allocator
  // started empty: blocks the dump shows but the trace never allocated came after recording
  // stopped. Otherwise recording began mid-run, and those blocks were live all along — unless
  // they lie in memory the trace itself obtained, which cannot predate the trace.
  t.starts_empty = initial.empty() && first_segment_event_is_alloc && held.empty();
  if (!initial.empty() || !first_segment_event_is_alloc) {
    auto in_traced_range = [&](std::uintptr_t addr) {
      auto it = traced_ranges.upper_bound(addr);
      if (it == traced_ranges.begin()) return false;
      --it;
      return addr < it->second;
    };
    for (const SegmentSnapshot& s : segments) {
      if (s.device != t.device) continue;
      for (const BlockSnapshot& b : s.blocks) {
        if (b.state == "inactive" || b.state == "unmapped") continue;
        if (live.count(b.address) || initial.count(b.address) || in_traced_range(b.address)) continue;
        const std::size_t size = b.requested_size != 0 ? b.requested_size : b.size;
        initial[b.address] = InitialBlock{b.address, size, s.stream};
      }
    }
  }
  t.initial.clear();
  for (const auto& [addr, block] : initial) t.initial.push_back(block);
  if (seen_segment_event) t.recorded_peak_reserved = held_bytes + static_cast<std::size_t>(peak);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw error(fmt::format("{}: cannot open file", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

Workload workload_from_snapshot(const Snapshot& snapshot, std::string name) {
  Workload w;
  w.name = std::move(name);
  for (std::size_t d = 0; d < snapshot.device_traces.size(); ++d) {
    DeviceTrace t;
    t.device = static_cast<int>(d);
    for (const TraceEntry& e : snapshot.device_traces[d]) {
      if (e.action == TraceAction::snapshot || e.action == TraceAction::oom) continue;
      t.events.push_back(Event{e.action, e.addr, e.size, e.stream});
    }
    if (t.events.empty()) continue;
    reconstruct(t, snapshot.segments);
    w.devices.push_back(std::move(t));
  }
  return w;
}

Workload workload_from_rmm_csv(std::string_view text, std::string name) {
  // RMM's logging_resource_adaptor: "Thread,Time,Action,Pointer,Size,Stream", actions
  // allocate / free (and allocate failure, which is skipped). Pointers are hex, sizes decimal.
  Workload w;
  w.name = name;
  DeviceTrace t;
  std::size_t line_no = 0;
  std::size_t pos = 0;
  auto fail = [&](const std::string& why) -> void {
    throw error(fmt::format("{}: line {}: {}", name, line_no, why));
  };
  auto parse_u64 = [&](std::string_view s, int base, const char* what) {
    if (base == 16 && (s.starts_with("0x") || s.starts_with("0X"))) s.remove_prefix(2);
    std::uint64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
    if (ec != std::errc() || p != s.data() + s.size() || s.empty())
      fail(fmt::format("bad {} '{}'", what, s));
    return v;
  };
  bool header_seen = false;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    std::vector<std::string_view> f;
    for (std::size_t start = 0;;) {
      const std::size_t comma = line.find(',', start);
      f.push_back(line.substr(start, comma == std::string_view::npos ? line.size() - start : comma - start));
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    if (!header_seen) {
      if (f.size() < 6 || f[0] != "Thread" || f[2] != "Action" || f[3] != "Pointer")
        fail("expected the header 'Thread,Time,Action,Pointer,Size,Stream'");
      header_seen = true;
      continue;
    }
    if (f.size() < 6) fail(fmt::format("expected 6 fields, got {}", f.size()));
    Event e;
    if (f[2] == "allocate") {
      e.action = TraceAction::alloc;
    } else if (f[2] == "free") {
      e.action = TraceAction::free_requested;
    } else if (f[2] == "allocate failure") {
      continue;
    } else {
      fail(fmt::format("unknown action '{}'", f[2]));
    }
    e.addr = parse_u64(f[3], 16, "pointer");
    e.size = parse_u64(f[4], 10, "size");
    e.stream = parse_u64(f[5], 16, "stream");
    t.events.push_back(e);
  }
  if (!header_seen) throw error(fmt::format("{}: empty file", name));
  if (!t.events.empty()) {
    reconstruct(t, {});
    w.devices.push_back(std::move(t));
  }
  return w;
}

Workload read_workload(const std::string& path) {
  const std::string data = read_file(path);
  const bool csv = path.size() > 4 && path.compare(path.size() - 4, 4, ".csv") == 0;
  if (csv || data.starts_with("Thread,")) return workload_from_rmm_csv(data, path);
  if (!data.empty() && (data[0] == '{' || data[0] == '['))
    throw error(fmt::format("{}: JSON snapshots are not supported by the replay reader; use the "
                            "pickle form", path));
  const detail::PyValue root = detail::read_pickle(data, path);
  return workload_from_snapshot(detail::snapshot_from_pyvalue(root, path), path);
}

std::size_t peak_requested(const DeviceTrace& t) {
  std::size_t live = 0, peak = 0;
  std::unordered_map<std::uintptr_t, std::size_t> sizes;
  for (const InitialBlock& b : t.initial) {
    sizes[b.addr] = b.size;
    live += b.size;
  }
  peak = live;
  const TraceAction release =
      t.has_free_completed ? TraceAction::free_completed : TraceAction::free_requested;
  for (const Event& e : t.events) {
    if (e.action == TraceAction::alloc) {
      sizes[e.addr] = e.size;
      live += e.size;
      peak = std::max(peak, live);
    } else if (e.action == release) {
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
