// tools/stitch_replay/oom_explain.cpp — explains the failed requests of a replay.
#include "tools/stitch_replay/oom_explain.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "diagnostics/snapshot_writer.hpp"  // json_escape

namespace stitch::replay_cli {

namespace {

constexpr std::size_t kLargestLive = 5;

// The report's verdict paragraph (diagnostics/oom_report.cpp), without its "Verdict: " prefix.
std::string verdict_paragraph(const detail::OomFacts& f) {
  const std::string report = detail::format_oom(f);
  const std::string tag = "\nVerdict: ";
  const auto at = report.find(tag);
  if (at == std::string::npos) return "";
  const auto from = at + tag.size();
  const auto end = report.find('\n', from);
  return report.substr(from, end == std::string::npos ? std::string::npos : end - from);
}

std::string json_strings(const std::vector<std::string>& list) {
  std::string out = "[";
  for (std::size_t i = 0; i < list.size(); ++i)
    out += fmt::format("{}\"{}\"", i ? "," : "", detail::json_escape(list[i]));
  return out + "]";
}

// An event number for JSON: null for the start.
std::string json_event(std::size_t event) {
  return event == ReplayOom::kAtStart ? "null" : std::to_string(event);
}

}  // namespace

OomExplanation explain_oom(const Replay& replay, const ReplayOom& oom) {
  OomExplanation e;
  e.event = oom.event;
  e.size = oom.size;
  e.stream = oom.stream;
  e.recorded = oom.recorded;
  if (oom.facts != nullptr) e.facts = *oom.facts;
  e.verdict = detail::to_string(detail::classify_oom(e.facts));
  e.verdict_text = verdict_paragraph(e.facts);
  e.largest_live = replay.largest_live(kLargestLive);
  return e;
}

std::string event_name(std::size_t event) {
  return event == ReplayOom::kAtStart ? "at the start" : fmt::format("at event {}", event + 1);
}

std::string verdict_line(const OomExplanation& e) {
  const detail::OomFacts& f = e.facts;
  return fmt::format("{}: {} on stream {:#x} {} ({} allocated, {} reserved, largest free block {}, "
                     "{} free on the device)",
                     e.verdict, detail::format_size(e.size), e.stream, event_name(e.event),
                     detail::format_size(f.allocated), detail::format_size(f.reserved),
                     detail::format_size(f.largest_free_block), detail::format_size(f.device_free));
}

std::string format_what_if_others(const OomExplanation& e) {
  if (e.what_if.empty()) return "";
  std::vector<std::string> served, failed;
  for (const WhatIfOther& o : e.what_if) {
    const std::string name = fmt::format("{} ({})", o.label, o.config.empty() ? "PyTorch defaults" : o.config);
    if (o.served) {
      served.push_back(name);
    } else if (o.failed_at != SIZE_MAX) {
      failed.push_back(fmt::format("{} fails earlier, {}", name, event_name(o.failed_at)));
    } else {
      failed.push_back(fmt::format("{} fails here too", name));
    }
  }
  std::string out = "What-if (the run's other configs on the same device): ";
  if (!served.empty()) {
    out += fmt::format("{} serve{} this request", fmt::join(served, " and "), served.size() == 1 ? "s" : "");
    if (!failed.empty()) out += "; ";
  }
  out += fmt::format("{}.", fmt::join(failed, "; "));
  return out;
}

std::string format_explanation(const OomExplanation& e, const std::string& in) {
  std::string out = fmt::format("{}Request: {} on stream {:#x}, {}{} (device {}, {} free)\n", in,
                                detail::format_size(e.size), e.stream, event_name(e.event),
                                e.recorded ? ", a request the recording failed too" : "",
                                detail::format_size(e.facts.device_total),
                                detail::format_size(e.facts.device_free));
  out += fmt::format("{}Verdict: {}\n", in, e.verdict_text.empty() ? e.verdict : e.verdict_text);
  if (const std::string w = format_what_if_others(e); !w.empty()) out += in + w + "\n";
  if (!e.largest_live.empty()) {
    out += in + "Largest live blocks:\n";
    for (std::size_t i = 0; i < e.largest_live.size(); ++i) {
      const LiveBlock& b = e.largest_live[i];
      out += fmt::format("{}  {:#x}: {}, allocated {}\n", in, b.addr, detail::format_size(b.size),
                         event_name(b.event));
      if (i < e.live_frames.size())
        for (const std::string& f : e.live_frames[i]) out += fmt::format("{}      {}\n", in, f);
    }
  }
  if (!e.frames.empty()) {
    out += in + "Recorded frames of the request:\n";
    for (const std::string& f : e.frames) out += fmt::format("{}  {}\n", in, f);
  } else {
    out += in + "Recorded frames of the request: none in the trace\n";
  }
  return out;
}

std::string explanation_json(const OomExplanation& e) {
  const detail::OomFacts& f = e.facts;
  std::string out = fmt::format(
      "{{\"event\":{},\"size\":{},\"stream\":{},\"recorded\":{},\"verdict\":\"{}\",\"verdict_text\":\"{}\","
      "\"device_total\":{},\"device_free\":{},\"reserved\":{},\"allocated\":{},\"largest_free_block\":{},"
      "\"free_same_stream\":{},\"free_other_streams\":{},\"frames\":{}",
      json_event(e.event), e.size, e.stream, e.recorded ? "true" : "false", detail::json_escape(e.verdict),
      detail::json_escape(e.verdict_text), f.device_total, f.device_free, f.reserved, f.allocated,
      f.largest_free_block, f.free_same, f.free_other_streams, json_strings(e.frames));
  out += ",\"what_if\":[";
  for (std::size_t i = 0; i < e.what_if.size(); ++i) {
    const WhatIfOther& o = e.what_if[i];
    out += fmt::format("{}{{\"label\":\"{}\",\"config\":\"{}\",\"served\":{},\"failed_earlier_at\":{}}}",
                       i ? "," : "", o.label, detail::json_escape(o.config), o.served ? "true" : "false",
                       o.failed_at == SIZE_MAX ? "null" : json_event(o.failed_at));
  }
  out += "],\"largest_live\":[";
  for (std::size_t i = 0; i < e.largest_live.size(); ++i) {
    const LiveBlock& b = e.largest_live[i];
    out += fmt::format("{}{{\"address\":{},\"size\":{},\"event\":{},\"frames\":{}}}", i ? "," : "", b.addr,
                       b.size, json_event(b.event),
                       json_strings(i < e.live_frames.size() ? e.live_frames[i] : std::vector<std::string>{}));
  }
  return out + "]}";
}

}  // namespace stitch::replay_cli
