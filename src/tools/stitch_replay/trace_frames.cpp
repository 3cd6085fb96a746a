// tools/stitch_replay/trace_frames.cpp — frames of a few events, read from the file again.
#include "tools/stitch_replay/trace_frames.hpp"

#include <exception>

#include "tools/formats/pickle_reader.hpp"

namespace stitch::replay_cli {

std::map<std::size_t, std::vector<std::string>> frames_of_events(const std::string& path, int device,
                                                                 const std::set<std::size_t>& events) {
  std::map<std::size_t, std::vector<std::string>> out;
  if (events.empty() || path.ends_with(".csv")) return out;
  try {
    const Snapshot snap = formats::read_snapshot_file(path);
    if (device < 0 || static_cast<std::size_t>(device) >= snap.device_traces.size()) return out;
    std::size_t position = 0;  // as DeviceWorkload::events counts: snapshot entries are not events
    for (const TraceEntry& e : snap.device_traces[static_cast<std::size_t>(device)]) {
      if (e.action == TraceAction::snapshot) continue;
      if (events.count(position) != 0 && !e.frames.empty()) out[position] = e.frames;
      ++position;
    }
  } catch (const std::exception&) {  // not a pickle (an RMM log), or too big to read again
    out.clear();
  }
  return out;
}

}  // namespace stitch::replay_cli
