// tools/stitch_replay/explanations.hpp — completes the out-of-memory explanations of a trace's
// report once every configuration has run: the what-if over the run's other configurations
// (each replayed on the same device: did it serve the request, or fail first?) and the recorded
// frames of each failed request and of the largest live blocks.
#pragma once

#include <string>

#include "tools/stitch_replay/report.hpp"

namespace stitch::replay_cli {

/// Fills each explanation's what_if and frames (the frames read from `path` again).
void complete_explanations(TraceReport& report, const std::string& path);

}  // namespace stitch::replay_cli
