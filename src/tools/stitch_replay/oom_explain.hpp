// tools/stitch_replay/oom_explain.hpp — why a replay ran out of memory: the report of a request
// that failed on a limited device (stitch-replay --capacity / --fits), with what the live OOM
// report has: the request and its stream, the verdict with its numbers, the what-if over the
// run's other configurations, the largest live blocks and the recorded frames of the request.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "diagnostics/oom_report.hpp"
#include "replay/engine.hpp"

namespace stitch::replay_cli {

// The command line tool over the replay engine (src/replay): its names are used here as ours.
using namespace stitch::replay;

/// How another configuration of the run fared with the same request (same trace, same device).
struct WhatIfOther {
  std::string label;   ///< its label in the report ("B")
  std::string config;
  bool served = false;  ///< it replayed to this event and served the request
  /// It failed earlier, at this event (SIZE_MAX: it did not); ReplayOom::kAtStart: at the start.
  std::size_t failed_at = SIZE_MAX;
};

/// One failed request of a replay, explained.
struct OomExplanation {
  std::size_t event = 0;  ///< ReplayOom::event
  std::size_t size = 0;   ///< bytes asked for
  std::uintptr_t stream = 0;
  bool recorded = false;  ///< the recording failed it too (a `failed` event tried again)
  detail::OomFacts facts;  ///< the allocator's own facts (largest_live: replayed addresses)
  std::string verdict;       ///< "fragmentation", "device full", ...
  std::string verdict_text;  ///< the report's verdict paragraph, with its numbers
  std::vector<LiveBlock> largest_live;  ///< in the workload's addresses and events
  /// The request's recorded frames with a file:line (the Python code), innermost first, at most
  /// six; the innermost few when none has a line.
  std::vector<std::string> frames;
  std::vector<std::vector<std::string>> live_frames;  ///< the same for each largest live block
  std::vector<WhatIfOther> what_if;     ///< filled once every configuration has run
};

/// How many failures a replay explains.
enum class Explain { none, first, all };

/// The explanation of `oom` in `replay` (called from Setup::on_oom); no frames, no what-if yet.
OomExplanation explain_oom(const Replay& replay, const ReplayOom& oom);

/// "at event 1,234" / "at the start" (events numbered from 1, as the reports print them).
std::string event_name(std::size_t event);

/// The verdict in one line: "fragmentation: 3.2 GiB free in 40 blocks ... largest 1.1 GiB".
std::string verdict_line(const OomExplanation& e);

/// The what-if over the other configurations, in one sentence ("" when there is none).
std::string format_what_if_others(const OomExplanation& e);

/// The whole explanation, as text, indented by `indent`.
std::string format_explanation(const OomExplanation& e, const std::string& indent);

/// The explanation as a JSON object.
std::string explanation_json(const OomExplanation& e);

}  // namespace stitch::replay_cli
