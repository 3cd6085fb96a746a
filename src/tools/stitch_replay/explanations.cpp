// tools/stitch_replay/explanations.cpp — the what-if over the other configurations, and frames.
#include "tools/stitch_replay/explanations.hpp"

#include <algorithm>
#include <set>

#include "tools/stitch_replay/trace_frames.hpp"

namespace stitch::replay_cli {

namespace {

constexpr std::size_t kMostFrames = 6;

// The frames worth printing: those with a file:line (the Python code, where the snapshot recorded
// it; C++ frames carry no line), innermost first; without any, the innermost few.
std::vector<std::string> code_frames(const std::vector<std::string>& frames) {
  std::vector<std::string> out;
  for (const std::string& f : frames) {
    const auto colon = f.rfind(':');
    const bool line = colon != std::string::npos && f.size() > colon + 2 && f.back() == ')' &&
                      f.find_first_not_of("0123456789", colon + 1) == f.size() - 1;
    if (line && out.size() < kMostFrames) out.push_back(f);
  }
  if (out.empty())
    out.assign(frames.begin(), frames.begin() + static_cast<std::ptrdiff_t>(std::min(frames.size(), kMostFrames)));
  return out;
}

// Event a comes before event b (the start before every event).
bool before(std::size_t a, std::size_t b) {
  if (a == ReplayOom::kAtStart) return b != ReplayOom::kAtStart;
  return b != ReplayOom::kAtStart && a < b;
}

}  // namespace

void complete_explanations(TraceReport& t, const std::string& path) {
  std::set<std::size_t> wanted;
  for (std::size_t j = 0; j < t.rows.size(); ++j) {
    for (OomExplanation& e : t.rows[j].result.explanations) {
      e.what_if.clear();
      for (std::size_t k = 0; k < t.rows.size(); ++k) {
        if (k == j) continue;
        const ReplayResult& other = t.rows[k].result;
        WhatIfOther o;
        o.label = config_label(k);
        o.config = other.config;
        const std::optional<std::size_t> first = other.first_oom_event;
        o.served = !first || before(e.event, *first);
        if (first && before(*first, e.event)) o.failed_at = *first;
        e.what_if.push_back(o);
      }
      if (e.event != ReplayOom::kAtStart) wanted.insert(e.event);
      for (const LiveBlock& b : e.largest_live)
        if (b.event != ReplayOom::kAtStart) wanted.insert(b.event);
    }
  }
  const auto frames = frames_of_events(path, t.device, wanted);
  auto frames_at = [&](std::size_t event) {
    auto it = frames.find(event);
    return it == frames.end() ? std::vector<std::string>{} : code_frames(it->second);
  };
  for (Row& row : t.rows) {
    for (OomExplanation& e : row.result.explanations) {
      e.frames = frames_at(e.event);
      e.live_frames.clear();
      for (const LiveBlock& b : e.largest_live) e.live_frames.push_back(frames_at(b.event));
    }
  }
}

}  // namespace stitch::replay_cli
