// tools/stitch_replay/html_report.cpp — the self-contained HTML report.
#include "tools/stitch_replay/html_report.hpp"

#include <fmt/format.h>

namespace stitch::replay_cli {

namespace {

constexpr const char* kStyle = R"(body{font-family:sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}
th:first-child,td:first-child{text-align:left}pre{background:#f6f6f6;padding:.8em;overflow-x:auto}
.no{color:#b00}.yes{color:#070}section{margin-bottom:3em}.plot svg{max-width:100%;height:auto})";

// Checks each plot's bounding box once the page is laid out, and says so in the page.
constexpr const char* kScript = R"(<script>
(function () {
  var plots = document.querySelectorAll('.plot svg');
  var ok = 0;
  plots.forEach(function (svg) {
    var box = svg.getBBox();
    if (box.width > 0 && box.height > 0) ok++;
  });
  document.body.setAttribute('data-plots-rendered', ok + '/' + plots.length);
  var note = document.getElementById('render-check');
  if (note) note.textContent = 'plots rendered: ' + ok + ' of ' + plots.length;
})();
</script>)";

std::string config_text(const std::string& config) {
  return config.empty() ? "(PyTorch defaults)" : config;
}

std::string configs_table(const TraceReport& t) {
  std::string out =
      "<table><tr><th>config</th><th>peak requested</th><th>peak reserved</th><th>reserved / requested</th>"
      "<th>peak unallocated</th><th>min capacity</th><th>cudaMalloc</th><th>maps</th><th>unmaps</th>"
      "<th>est. device ms</th><th>OOMs</th></tr>\n";
  for (std::size_t i = 0; i < t.rows.size(); ++i) {
    const Row& row = t.rows[i];
    const ReplayResult& r = row.result;
    const std::string min = !row.min_capacity_searched ? "-"
                            : row.min_capacity          ? human_size(*row.min_capacity)
                                                        : "does not fit";
    out += fmt::format(
        "<tr><td>{}: {}</td><td>{}</td><td>{}</td><td>{:.3f}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
        "<td>{}</td><td>{:.1f}</td><td>{}</td></tr>\n",
        config_label(i), xml_escape(config_text(r.config)), human_size(r.peak_requested), human_size(r.peak_reserved),
        r.reserved_over_requested(), human_size(r.peak_unallocated), min, r.device_allocs, r.maps, r.unmaps,
        t.costs.estimate_us(r.calls) / 1000.0, r.ooms);
  }
  return out + "</table>\n";
}

std::string breakdown_table(const TraceReport& t) {
  std::string out =
      "<table><tr><th>config</th><th>event</th><th>reserved</th><th>requested</th><th>rounding</th>"
      "<th>pending frees</th><th>plain segments</th><th>partly used pages</th><th>whole free pages "
      "(main stream, small / large)</th><th>other streams</th></tr>\n";
  bool any = false;
  for (std::size_t i = 0; i < t.rows.size(); ++i) {
    if (!t.rows[i].breakdown) continue;
    any = true;
    const PeakBreakdown& b = *t.rows[i].breakdown;
    out += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                       "<td>{} / {}</td><td>{}</td></tr>\n",
                       config_label(i), b.event, human_size(b.reserved), human_size(b.requested),
                       human_size(b.rounding), human_size(b.pending), human_size(b.plain_free),
                       human_size(b.partial_pages), human_size(b.whole_pages_small),
                       human_size(b.whole_pages_large), human_size(b.whole_pages_other_streams));
  }
  return any ? out + "</table>\n" : "";
}

std::string fits_table(const TraceReport& t) {
  if (t.rows.empty() || t.rows.front().fits.empty()) return "";
  std::string out = "<table><tr><th>device</th>";
  for (std::size_t i = 0; i < t.rows.size(); ++i) out += fmt::format("<th>{}</th>", config_label(i));
  out += "</tr>\n";
  for (std::size_t k = 0; k < t.rows.front().fits.size(); ++k) {
    out += fmt::format("<tr><td>{}</td>", human_size(t.rows.front().fits[k].capacity));
    for (const Row& row : t.rows) {
      if (k >= row.fits.size()) {
        out += "<td></td>";
        continue;
      }
      const CapacityOutcome& f = row.fits[k];
      std::string cell = f.fits ? fmt::format("<span class=\"yes\">fits</span>, headroom {}",
                                              human_size(static_cast<std::size_t>(std::max<std::int64_t>(f.headroom(), 0))))
                                : fmt::format("<span class=\"no\">no</span> ({} OOM{}): {}", f.ooms, f.ooms == 1 ? "" : "s",
                                              f.first_oom ? xml_escape(verdict_line(*f.first_oom)) : "");
      if (!f.note.empty()) cell += "<br><em>" + xml_escape(f.note) + "</em>";
      out += "<td style=\"text-align:left\">" + cell + "</td>";
    }
    out += "</tr>\n";
  }
  return out + "</table>\n";
}

std::string explanations(const TraceReport& t) {
  std::string out;
  for (std::size_t i = 0; i < t.rows.size(); ++i) {
    const ReplayResult& r = t.rows[i].result;
    for (std::size_t k = 0; k < r.explanations.size(); ++k) {
      out += fmt::format("<h4>{}: OOM {} of {}</h4>\n<pre>{}</pre>\n", config_label(i), k + 1, r.ooms,
                         xml_escape(format_explanation(r.explanations[k], "")));
    }
  }
  return out;
}

}  // namespace

std::string format_html(const std::vector<TraceReport>& reports) {
  std::string out = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>stitch-replay report</title>"
      "<style>{}</style></head>\n<body>\n<h1>stitch-replay report</h1>\n<p id=\"render-check\"></p>\n",
      kStyle);
  for (const TraceReport& t : reports) {
    out += fmt::format("<section><h2>{} (device {})</h2>\n<pre>{}</pre>\n", xml_escape(t.trace), t.device,
                       xml_escape(format_header(t)));
    out += "<h3>Configurations</h3>\n" + configs_table(t);
    out += "<h3>Requested, reserved and reserved but unallocated</h3>\n<div class=\"plot\">" + format_svg(t) + "</div>\n";
    if (const std::string b = breakdown_table(t); !b.empty()) out += "<h3>Breakdown at the peak</h3>\n" + b;
    if (const std::string f = fits_table(t); !f.empty()) out += "<h3>Fits on which device</h3>\n" + f;
    if (const std::string e = explanations(t); !e.empty()) out += "<h3>Out-of-memory explanations</h3>\n" + e;
    out += "</section>\n";
  }
  out += kScript;
  out += "\n</body></html>\n";
  return out;
}

}  // namespace stitch::replay_cli
