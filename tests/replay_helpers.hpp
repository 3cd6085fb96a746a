// tests/replay_helpers.hpp — what the replay tests share: a trace entry in one line, and a
// generated pattern's workload.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "stitch/snapshot.hpp"
#include "tools/stitch_replay/trace_file.hpp"
#include "tools/tracegen/tracegen.hpp"

namespace replay_helpers {

inline stitch::TraceEntry ev(stitch::TraceAction a, std::uintptr_t addr, std::size_t size, std::uintptr_t stream = 0) {
  stitch::TraceEntry e;
  e.action = a;
  e.addr = addr;
  e.size = size;
  e.stream = stream;
  return e;
}

/// `pattern`'s workload for `steps` steps (stitch-tracegen's program, read as a trace file).
inline stitch::replay_cli::DeviceWorkload generated(const std::string& pattern, std::size_t steps,
                                                    std::uint64_t seed = 1) {
  stitch::tracegen::Options o;
  o.steps = steps;
  stitch::replay_cli::TraceFile w =
      stitch::replay_cli::trace_file_from_snapshot(stitch::tracegen::generate(pattern, seed, o), pattern);
  return std::move(w.devices.at(0));
}

}  // namespace replay_helpers
