// tools/stitch_replay/html_report.hpp — the one page to look at (stitch-replay --html FILE): a
// self-contained HTML file (no network, no server, no script or style from elsewhere) with, per
// trace and device, the per-config table, the requested / reserved / unallocated plot of every
// config on one event axis, the breakdown at the peak, the fits table and the OOM explanations.
// A small script in the page checks that every plot rendered (a non-empty bounding box) and
// writes the count into the page (data-plots-rendered="N/M" on <body>), for a headless browser.
#pragma once

#include <string>
#include <vector>

#include "tools/stitch_replay/report.hpp"

namespace stitch::replay_cli {

std::string format_html(const std::vector<TraceReport>& reports);

}  // namespace stitch::replay_cli
