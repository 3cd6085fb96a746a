// tools/stitch_replay/trace_frames.hpp — the recorded stack frames of a few events of a trace file.
// A replay reads snapshots without their frames (they are most of a real snapshot and no replay
// needs them); an out-of-memory explanation names the code behind a request, so the file is read
// again, with frames, only when a report asks for them.
#pragma once

#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace stitch::replay_cli {

/// The frames ("name (file:line)", innermost first) of the events at `events` (positions in the
/// device's DeviceWorkload::events) of device `device` of the snapshot pickle `path`. Events
/// without frames are left out; an RMM log, or a file that cannot be read again, gives none.
std::map<std::size_t, std::vector<std::string>> frames_of_events(const std::string& path, int device,
                                                                 const std::set<std::size_t>& events);

}  // namespace stitch::replay_cli
