// tools/replay/report.hpp — prints replay results: a table for people, JSON for machines, and
// an SVG plot of requested / reserved / reserved-but-unallocated over the trace.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tools/replay/replayer.hpp"

namespace stitch::replay {

/// One configuration's results on one device of one trace.
struct Row {
  ReplayResult result;
  std::optional<std::size_t> min_capacity;  ///< when --min-capacity was asked
  bool min_capacity_searched = false;
};

struct TraceReport {
  std::string trace;
  int device = 0;
  std::size_t events = 0;
  std::size_t initial_blocks = 0;
  bool starts_empty = false;
  std::optional<std::size_t> recorded_peak_reserved;
  std::optional<Fidelity> fidelity;  ///< of the PyTorch-default row, when it was run
  std::vector<Row> rows;
};

std::string format_table(const TraceReport& report);
std::string format_json(const std::vector<TraceReport>& reports);
std::string format_svg(const TraceReport& report);
/// "1.50 GiB".
std::string human_size(std::size_t bytes);
/// Parses "80GiB", "512MiB", "40G", "1024" (MiB when no unit). Throws stitch::error.
std::size_t parse_size(const std::string& text);

}  // namespace stitch::replay
