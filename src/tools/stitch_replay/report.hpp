// tools/stitch_replay/report.hpp — prints replay results: a table for people, JSON for machines, and
// an SVG plot of requested / reserved / reserved-but-unallocated over the trace.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tools/stitch_replay/breakdown.hpp"
#include "tools/stitch_replay/fits.hpp"
#include "tools/stitch_replay/replayer.hpp"
#include "tools/stitch_replay/trace_file.hpp"

namespace stitch::replay_cli {

// The command line tool over the replay engine (src/replay): its names are used here as ours.
using namespace stitch::replay;

/// One configuration's results on one device of one trace.
struct Row {
  ReplayResult result;
  std::optional<std::size_t> min_capacity;  ///< when --min-capacity was asked
  bool min_capacity_searched = false;
  /// --fits: the outcome on each size, and whether the bisection's answer disagrees with one.
  std::vector<CapacityOutcome> fits;
  std::string min_capacity_note;
  std::optional<PeakBreakdown> breakdown;  ///< --html: where the excess lies at the peak
};

struct TraceReport {
  std::string trace;
  int device = 0;
  std::size_t events = 0;
  std::string recorded_by = "PyTorch";  ///< TraceFile::recorded_by
  // The start (DeviceWorkload): blocks live, memory held and the part of it not handed out.
  std::size_t initial_blocks = 0;
  std::size_t live_at_start = 0;
  std::size_t held_segments = 0;
  std::size_t reserved_at_start = 0;
  std::size_t cached_at_start = 0;
  bool starts_empty = false;
  /// The recording's true peak reserved; absent without segment events (shown as "—").
  std::optional<std::size_t> recorded_peak_reserved;
  std::string recorded_settings;    ///< TraceFile::recorded_settings ("" = PyTorch's defaults)
  bool settings_recorded = false;   ///< the file gave them (else PyTorch's defaults are assumed)
  std::optional<Fidelity> fidelity;  ///< the replay under the recorded settings, when it was run
  std::vector<Row> rows;
  CostModel costs = CostModel::published();  ///< prices the rows' device calls
  bool explain_all = false;  ///< --explain-all: every OOM explained, in oom_reports
};

/// Builds a trace's report header from its workload.
TraceReport trace_report(const std::string& trace, const TraceFile& workload, const DeviceWorkload& device);

/// The label of the `index`-th config of a report ("A", "B", ..., "Z", "AA", ...); the tables
/// use labels and a legend, so no config string is cut short.
std::string config_label(std::size_t index);

std::string format_table(const TraceReport& report);
/// The lines of format_table() before the configurations: the trace, its start, the recording's
/// peak and the fidelity replay.
std::string format_header(const TraceReport& report);
/// The fits table (--fits): per size and config, fits with its headroom or the first OOM's verdict.
std::string format_fits(const TraceReport& report);
/// The fidelity line of a recording that ran out of memory: where, and whether the replay did too.
std::string format_oom_fidelity(const Fidelity& fidelity);
std::string format_json(const std::vector<TraceReport>& reports);
std::string format_svg(const TraceReport& report);
/// `s` as XML/HTML character data (and attribute values): trace paths and config strings are free text.
std::string xml_escape(std::string_view s);
/// "1.50 GiB".
std::string human_size(std::size_t bytes);
/// Parses "80GiB", "512MiB", "40G", "1024" (MiB when no unit). Throws stitch::error.
std::size_t parse_size(const std::string& text);

}  // namespace stitch::replay_cli
