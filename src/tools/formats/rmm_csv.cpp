// tools/formats/rmm_csv.cpp — the RMM logging_resource_adaptor CSV reader.
#include "tools/formats/rmm_csv.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cstdint>
#include <string>
#include <vector>

#include "stitch/errors.hpp"

namespace stitch::formats {

Snapshot snapshot_from_rmm_csv(std::string_view text, std::string_view name) {
  // RMM's logging_resource_adaptor: "Thread,Time,Action,Pointer,Size,Stream", actions
  // allocate / free (and allocate failure, which is skipped). Pointers are hex, sizes decimal.
  Snapshot snap;
  std::vector<TraceEntry> entries;
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
    TraceEntry e;
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
    entries.push_back(std::move(e));
  }
  if (!header_seen) throw error(fmt::format("{}: empty file", name));
  snap.device_traces.push_back(std::move(entries));
  return snap;
}

}  // namespace stitch::formats
