// tools/stitch_replay/report.cpp — replay output formats.
#include "tools/stitch_replay/report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>

#include "diagnostics/snapshot_writer.hpp"  // json_escape
#include "stitch/errors.hpp"

namespace stitch::replay_cli {

std::string human_size(std::size_t bytes) {
  const auto b = static_cast<double>(bytes);
  if (bytes >= (std::size_t{1} << 30)) return fmt::format("{:.2f} GiB", b / (1 << 30));
  if (bytes >= (std::size_t{1} << 20)) return fmt::format("{:.1f} MiB", b / (1 << 20));
  if (bytes >= 1024) return fmt::format("{:.1f} KiB", b / 1024);
  return fmt::format("{} B", bytes);
}

std::size_t parse_size(const std::string& text) {
  std::size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) throw error(fmt::format("bad size '{}' (examples: 80GiB, 512MiB, 1024)", text));
  const double value = std::stod(text.substr(0, i));
  std::string unit = text.substr(i);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double scale = 0;
  if (unit.empty() || unit == "m" || unit == "mb" || unit == "mib") scale = 1 << 20;
  else if (unit == "g" || unit == "gb" || unit == "gib") scale = 1 << 30;
  else if (unit == "t" || unit == "tb" || unit == "tib") scale = std::ldexp(1.0, 40);
  else if (unit == "k" || unit == "kb" || unit == "kib") scale = 1024;
  else if (unit == "b") scale = 1;
  else throw error(fmt::format("bad size unit in '{}' (use KiB, MiB, GiB or TiB)", text));
  return static_cast<std::size_t>(value * scale);
}

std::string config_label(std::size_t index) {
  std::string label;
  for (std::size_t i = index + 1; i > 0; i = (i - 1) / 26) label.insert(label.begin(), static_cast<char>('A' + (i - 1) % 26));
  return label;
}

TraceReport trace_report(const std::string& trace, const TraceFile& w, const DeviceWorkload& t) {
  TraceReport r;
  r.trace = trace;
  r.device = t.device;
  r.events = t.events.size();
  r.recorded_by = w.recorded_by;
  r.initial_blocks = t.initial.size();
  r.live_at_start = live_at_start(t);
  r.held_segments = t.held_segments.size();
  r.reserved_at_start = t.reserved_at_start;
  r.cached_at_start = cached_at_start(t);
  r.starts_empty = t.starts_empty;
  r.recorded_peak_reserved = t.recorded_peak_reserved;
  r.recorded_settings = w.recorded_settings;
  r.settings_recorded = w.settings_recorded;
  return r;
}

namespace {

std::string config_name(const std::string& config) { return config.empty() ? "(PyTorch defaults)" : config; }

std::string settings_name(const TraceReport& t) {
  std::string s = t.recorded_settings.empty() ? "PyTorch defaults" : t.recorded_settings;
  if (!t.settings_recorded) s += ", assumed: the file does not record them";
  return s;
}

}  // namespace

std::string format_oom_fidelity(const Fidelity& f) {
  const RecordedOom& rec = *f.recorded_oom;
  std::string out = fmt::format(
      "recorded OOM: {} on stream {:#x} failed at event {} with {} held and {} free on the device; "
      "replayed on that device ({}): ",
      human_size(rec.size), rec.stream, rec.event + 1, human_size(rec.reserved), human_size(rec.device_free),
      human_size(f.capacity.value_or(0)));
  if (f.oom_reproduced) {
    out += fmt::format("reproduced, at the same event ({} failed request{} in the replay)", f.replayed_ooms,
                       f.replayed_ooms == 1 ? "" : "s");
  } else if (!f.replayed_oom_event) {
    out += "NOT reproduced: the replay ran without an OOM";
  } else {
    out += fmt::format("NOT reproduced: the replay first failed {}", event_name(*f.replayed_oom_event));
  }
  return out;
}

std::string format_fits(const TraceReport& t) {
  const bool any = std::any_of(t.rows.begin(), t.rows.end(), [](const Row& r) { return !r.fits.empty(); });
  if (!any) return "";
  std::string out = "  fits (no OOM on a device of that size; headroom = size - peak reserved):\n";
  const std::size_t sizes = t.rows.front().fits.size();
  for (std::size_t k = 0; k < sizes; ++k) {
    for (std::size_t i = 0; i < t.rows.size(); ++i) {
      if (k >= t.rows[i].fits.size()) continue;
      const CapacityOutcome& f = t.rows[i].fits[k];
      out += fmt::format("    {:>10}  {:<3} ", human_size(f.capacity), config_label(i));
      if (f.fits) {
        out += fmt::format("fits      headroom {}", human_size(static_cast<std::size_t>(std::max<std::int64_t>(f.headroom(), 0))));
      } else {
        out += fmt::format("no ({} OOM{}) {}", f.ooms, f.ooms == 1 ? "" : "s",
                           f.first_oom ? verdict_line(*f.first_oom) : std::string());
      }
      if (!f.note.empty()) out += " [" + f.note + "]";
      out += "\n";
    }
  }
  return out;
}

std::string format_header(const TraceReport& t) {
  std::string out = fmt::format("{} (device {}): {} events, recorded by {}\n", t.trace, t.device,
                                t.events, t.recorded_by);
  if (t.starts_empty) {
    out += "  start: empty (no block live, nothing held)\n";
  } else {
    out += fmt::format("  start: {} live in {} block{}; {} held in {} segment{}, {} of it cached\n",
                       human_size(t.live_at_start), t.initial_blocks, t.initial_blocks == 1 ? "" : "s",
                       human_size(t.reserved_at_start), t.held_segments, t.held_segments == 1 ? "" : "s",
                       human_size(t.cached_at_start));
  }
  out += fmt::format("  peak reserved by the recording ({}): {}\n", t.recorded_by,
                     t.recorded_peak_reserved ? human_size(*t.recorded_peak_reserved) : "—");
  if (t.fidelity)
    out += fmt::format("  fidelity (recorded settings: {}; from the recorded start, {} release{} "
                       "honoured): peak reserved {} vs recorded {} ({:+.2f}%), segment sizes agree "
                       "{:.1f}% ({} recorded, {} replayed)\n",
                       settings_name(t), t.fidelity->releases, t.fidelity->releases == 1 ? "" : "s",
                       human_size(t.fidelity->replayed_peak_reserved),
                       human_size(t.fidelity->recorded_peak_reserved),
                       100.0 * (static_cast<double>(t.fidelity->replayed_peak_reserved) /
                                    static_cast<double>(t.fidelity->recorded_peak_reserved) - 1.0),
                       100.0 * t.fidelity->segment_agreement, t.fidelity->recorded_segments,
                       t.fidelity->replayed_segments);
  if (t.fidelity && t.fidelity->recorded_oom) out += "  " + format_oom_fidelity(*t.fidelity) + "\n";
  return out;
}

std::string format_table(const TraceReport& t) {
  std::string out = format_header(t);
  for (std::size_t i = 0; i < t.rows.size(); ++i)
    out += fmt::format("  {} = {}\n", config_label(i), config_name(t.rows[i].result.config));
  out += fmt::format("  est. ms: device time of the calls at {} costs (docs/fragmentation.md)\n",
                     t.costs.source);
  const bool min_cap = std::any_of(t.rows.begin(), t.rows.end(),
                                   [](const Row& r) { return r.min_capacity_searched; });
  out += fmt::format("  {:<6} {:>11} {:>11} {:>8} {:>11} {:>11} {:>7} {:>7} {:>7} {:>7} {:>7} {:>9} {:>5} {:>9}",
                     "config", "peak req", "peak rsv", "rsv/req", "peak unalc", "lfree@worst",
                     "allocs", "frees", "maps", "unmaps", "syncs", "est. ms", "OOMs", "events/s");
  if (min_cap) out += fmt::format(" {:>12}", "min capacity");
  out += "\n";
  for (std::size_t i = 0; i < t.rows.size(); ++i) {
    const Row& row = t.rows[i];
    const ReplayResult& r = row.result;
    out += fmt::format("  {:<6} {:>11} {:>11} {:>8.3f} {:>11} {:>11} {:>7} {:>7} {:>7} {:>7} {:>7} {:>9.1f} {:>5} {:>9.0f}",
                       config_label(i), human_size(r.peak_requested), human_size(r.peak_reserved),
                       r.reserved_over_requested(), human_size(r.peak_unallocated),
                       human_size(r.largest_free_at_worst), r.device_allocs, r.device_frees, r.maps,
                       r.unmaps, r.stream_syncs,
                       t.costs.estimate_us(r.calls) / 1000.0, r.ooms,
                       r.events_per_second());
    if (min_cap)
      out += fmt::format(" {:>12}", !row.min_capacity_searched ? "-"
                                    : row.min_capacity ? human_size(*row.min_capacity)
                                                       : "does not fit");
    out += "\n";
  }
  for (std::size_t i = 0; i < t.rows.size(); ++i)
    if (!t.rows[i].min_capacity_note.empty())
      out += fmt::format("  {}: min capacity {} {}: OOM is not monotone in capacity here\n", config_label(i),
                         t.rows[i].min_capacity ? human_size(*t.rows[i].min_capacity) : "-",
                         t.rows[i].min_capacity_note);
  out += format_fits(t);
  for (std::size_t i = 0; i < t.rows.size(); ++i) {
    const ReplayResult& r = t.rows[i].result;
    if (r.explanations.empty()) continue;
    if (t.explain_all) {
      for (std::size_t k = 0; k < r.explanations.size(); ++k) {
        out += fmt::format("  {}: OOM {} of {}:\n", config_label(i), k + 1, r.ooms);
        out += format_explanation(r.explanations[k], "    ");
      }
    } else {
      out += fmt::format("  {}: first OOM of {}{}:\n", config_label(i), r.ooms,
                         r.ooms > 1 ? " (--explain-all explains every one)" : "");
      out += format_explanation(r.explanations.front(), "    ");
    }
  }
  return out;
}

std::string format_json(const std::vector<TraceReport>& reports) {
  std::string out = "[";
  for (std::size_t i = 0; i < reports.size(); ++i) {
    const TraceReport& t = reports[i];
    out += fmt::format("{}{{\"trace\":\"{}\",\"device\":{},\"events\":{},\"recorded_by\":\"{}\","
                       "\"initial_blocks\":{},\"live_at_start\":{},\"held_segments\":{},"
                       "\"reserved_at_start\":{},\"cached_at_start\":{},\"starts_empty\":{}",
                       i ? "," : "", detail::json_escape(t.trace), t.device, t.events,
                       detail::json_escape(t.recorded_by), t.initial_blocks, t.live_at_start,
                       t.held_segments, t.reserved_at_start, t.cached_at_start,
                       t.starts_empty ? "true" : "false");
    if (t.recorded_peak_reserved) {
      out += fmt::format(",\"recorded_peak_reserved\":{}", *t.recorded_peak_reserved);
    } else {
      out += ",\"recorded_peak_reserved\":null";
    }
    out += fmt::format(",\"recorded_settings\":\"{}\",\"settings_recorded\":{},\"cost_model\":\"{}\"",
                       detail::json_escape(t.recorded_settings), t.settings_recorded ? "true" : "false",
                       detail::json_escape(t.costs.source));
    out += ",\"call_costs\":{";
    for (std::size_t c = 0; c < kCostCalls; ++c)
      out += fmt::format("{}\"{}\":{{\"per_call_us\":{},\"per_mib_us\":{}}}", c ? "," : "",
                         cost_name(static_cast<CostCall>(c)), t.costs.costs[c].per_call_us,
                         t.costs.costs[c].per_mib_us);
    out += "}";
    if (t.fidelity)
      out += fmt::format(",\"fidelity\":{{\"recorded_peak_reserved\":{},\"replayed_peak_reserved\":{},"
                         "\"peak_error\":{:.6f},\"segment_agreement\":{:.6f},\"recorded_segments\":{},"
                         "\"replayed_segments\":{},\"releases\":{},\"config\":\"{}\"}}",
                         t.fidelity->recorded_peak_reserved, t.fidelity->replayed_peak_reserved,
                         t.fidelity->peak_error, t.fidelity->segment_agreement,
                         t.fidelity->recorded_segments, t.fidelity->replayed_segments,
                         t.fidelity->releases, detail::json_escape(t.recorded_settings));
    if (t.fidelity && t.fidelity->recorded_oom) {
      const Fidelity& f = *t.fidelity;
      out.pop_back();  // the fidelity object goes on
      out += fmt::format(",\"capacity\":{},\"recorded_oom\":{{\"event\":{},\"size\":{},\"stream\":{},"
                         "\"device_free\":{},\"reserved\":{}}},\"replayed_oom_event\":{},"
                         "\"oom_reproduced\":{},\"replayed_ooms\":{}}}",
                         f.capacity.value_or(0), f.recorded_oom->event, f.recorded_oom->size,
                         f.recorded_oom->stream, f.recorded_oom->device_free, f.recorded_oom->reserved,
                         !f.replayed_oom_event || *f.replayed_oom_event == ReplayOom::kAtStart
                             ? std::string("null")
                             : std::to_string(*f.replayed_oom_event),
                         f.oom_reproduced ? "true" : "false", f.replayed_ooms);
    }
    out += ",\"configs\":[";
    for (std::size_t j = 0; j < t.rows.size(); ++j) {
      const ReplayResult& r = t.rows[j].result;
      out += fmt::format("{}{{\"label\":\"{}\",\"config\":\"{}\",\"capacity\":{},\"peak_requested\":{},"
                         "\"peak_reserved\":{},\"reserved_over_requested\":{:.6f},\"peak_unallocated\":{},"
                         "\"largest_free_at_worst\":{},\"device_allocs\":{},\"device_frees\":{},"
                         "\"maps\":{},\"unmaps\":{},\"stream_syncs\":{},\"compactions\":{},"
                         "\"compacted_bytes\":{},\"device_syncs\":{},\"ooms\":{},"
                         "\"events_per_second\":{:.0f}",
                         j ? "," : "", config_label(j), detail::json_escape(r.config), r.capacity,
                         r.peak_requested, r.peak_reserved, r.reserved_over_requested(), r.peak_unallocated,
                         r.largest_free_at_worst, r.device_allocs, r.device_frees, r.maps, r.unmaps,
                         r.stream_syncs, r.compactions, r.compacted_bytes, r.device_syncs, r.ooms,
                         r.events_per_second());
      out += fmt::format(",\"estimated_device_us\":{:.1f},\"calls\":{{", t.costs.estimate_us(r.calls));
      for (std::size_t c = 0; c < kCostCalls; ++c)
        out += fmt::format("{}\"{}\":{}", c ? "," : "", cost_name(static_cast<CostCall>(c)), r.calls.calls[c]);
      out += "}";
      if (!r.explanations.empty()) {
        out += ",\"first_oom\":" + explanation_json(r.explanations.front());
        if (t.explain_all) {
          out += ",\"oom_reports\":[";
          for (std::size_t k = 0; k < r.explanations.size(); ++k)
            out += (k ? "," : "") + explanation_json(r.explanations[k]);
          out += "]";
        }
      }
      if (!t.rows[j].fits.empty()) {
        out += ",\"fits\":[";
        for (std::size_t k = 0; k < t.rows[j].fits.size(); ++k) {
          const CapacityOutcome& f = t.rows[j].fits[k];
          out += fmt::format("{}{{\"capacity\":{},\"fits\":{},\"headroom\":{},\"peak_reserved\":{},\"ooms\":{}",
                             k ? "," : "", f.capacity, f.fits ? "true" : "false", f.headroom(), f.peak_reserved,
                             f.ooms);
          if (f.first_oom)
            out += fmt::format(",\"verdict\":\"{}\",\"first_oom\":\"{}\"", detail::json_escape(f.first_oom->verdict),
                               detail::json_escape(verdict_line(*f.first_oom)));
          if (!f.note.empty()) out += fmt::format(",\"note\":\"{}\"", detail::json_escape(f.note));
          out += "}";
        }
        out += "]";
        if (!t.rows[j].min_capacity_note.empty())
          out += fmt::format(",\"min_capacity_note\":\"{}\"", detail::json_escape(t.rows[j].min_capacity_note));
      }
      if (t.rows[j].min_capacity_searched) {
        if (t.rows[j].min_capacity) {
          out += fmt::format(",\"min_capacity\":{}", *t.rows[j].min_capacity);
        } else {
          out += ",\"min_capacity\":null";
        }
      }
      out += "}";
    }
    out += "]}";
  }
  out += "]\n";
  return out;
}

std::string xml_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string format_svg(const TraceReport& t) {
  // One panel: requested, reserved and reserved-but-unallocated of every config over the events.
  constexpr int kW = 900, kH = 420, kL = 70, kR = 20, kT = 30, kB = 40;
  std::size_t max_y = 1, max_x = 1;
  for (const Row& row : t.rows)
    for (const Sample& s : row.result.series) {
      max_y = std::max({max_y, s.reserved, s.requested});
      max_x = std::max(max_x, s.event);
    }
  auto x = [&](std::size_t e) { return kL + (kW - kL - kR) * static_cast<double>(e) / static_cast<double>(max_x); };
  auto y = [&](std::size_t v) { return kH - kB - (kH - kT - kB) * static_cast<double>(v) / static_cast<double>(max_y); };
  static const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{}\" y=\"18\">{} (device {}): solid = reserved, dashed = reserved but unallocated, "
      "grey = requested</text>\n",
      kW, kH, kL, xml_escape(t.trace), t.device);
  out += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n", kL, kH - kB, kW - kR, kH - kB);
  out += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n", kL, kT, kL, kH - kB);
  for (int i = 0; i <= 4; ++i) {
    const std::size_t v = max_y / 4 * static_cast<std::size_t>(i);
    out += fmt::format("<text x=\"4\" y=\"{:.1f}\">{}</text>\n", y(v) + 4, human_size(v));
  }
  out += fmt::format("<text x=\"{}\" y=\"{}\">event</text>\n", kW / 2, kH - 8);
  auto polyline = [&](const std::vector<Sample>& s, auto value, const char* colour, const char* extra) {
    std::string pts;
    for (const Sample& p : s) pts += fmt::format("{:.1f},{:.1f} ", x(p.event), y(value(p)));
    return fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" {} points=\"{}\"/>\n",
                       colour, extra, pts);
  };
  if (!t.rows.empty())
    out += polyline(t.rows[0].result.series, [](const Sample& p) { return p.requested; }, "#888888", "");
  for (std::size_t i = 0; i < t.rows.size(); ++i) {
    const char* colour = kColours[i % 6];
    const auto& s = t.rows[i].result.series;
    out += polyline(s, [](const Sample& p) { return p.reserved; }, colour, "");
    out += polyline(s, [](const Sample& p) { return p.reserved - p.allocated; }, colour,
                    "stroke-dasharray=\"4 3\"");
    const std::string name = config_label(i) + " = " + config_name(t.rows[i].result.config);
    out += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"{}\">{}</text>\n", kL + 10,
                       kT + 16 * (static_cast<int>(i) + 1), colour, xml_escape(name));
  }
  out += "</svg>\n";
  return out;
}

}  // namespace stitch::replay_cli
