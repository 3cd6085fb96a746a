// tools/stitch_replay/trace_file.cpp — reads trace files into workloads.
#include "tools/stitch_replay/trace_file.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <utility>
#include <vector>
#include <sstream>

#include "config/keys.hpp"
#include "stitch/errors.hpp"
#include "tools/formats/pickle_reader.hpp"
#include "tools/formats/rmm_csv.hpp"

namespace stitch::replay_cli {

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw error(fmt::format("{}: cannot open file", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The items of a PYTORCH_CUDA_ALLOC_CONF string ("key:value" at top level; lists in brackets).
std::vector<std::pair<std::string, std::string>> conf_items(std::string_view conf) {
  std::vector<std::pair<std::string, std::string>> items;
  std::string cur;
  int depth = 0;
  auto flush = [&] {
    const auto colon = cur.find(':');
    if (colon != std::string::npos) items.emplace_back(cur.substr(0, colon), cur.substr(colon + 1));
    cur.clear();
  };
  for (char c : conf) {
    if (c == ' ' || c == '\t' || c == '\n') continue;
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth <= 0) {
      flush();
    } else {
      cur += c;
    }
  }
  flush();
  return items;
}

}  // namespace

Config recorded_settings(const Snapshot& snapshot, bool* known) {
  if (known != nullptr) *known = false;
  Config c;
  c.backend = BackendKind::sim;
  if (!snapshot.stitch_version.empty() && !snapshot.stitch_config.empty()) {
    try {
      Config stitch = Config::parse(snapshot.stitch_config, c);
      stitch.backend = BackendKind::sim;
      if (known != nullptr) *known = true;
      return stitch;
    } catch (const error&) {  // a generator's description, not a configuration
    }
  }
  if (!snapshot.has_settings) return c;
  if (known != nullptr) *known = true;
  // The string first, for what the structured fields do not say; keys of PyTorch's that stitch
  // does not have (backend, pinned memory, ...) and values it does not accept are left out.
  static constexpr std::string_view kShared[] = {"max_non_split_rounding_mb", "expandable_segments",
                                                 "max_split_size_mb", "roundup_power2_divisions",
                                                 "garbage_collection_threshold"};
  for (const auto& [key, value] : conf_items(snapshot.settings)) {
    if (std::find(std::begin(kShared), std::end(kShared), key) == std::end(kShared)) continue;
    try {
      c = Config::parse(key + ":" + value, c);
    } catch (const error&) {
    }
  }
  // The structured fields are what the allocator applied.
  c.expandable_segments = snapshot.expandable_segments;
  c.stitching = false;
  c.max_split_size = snapshot.max_split_size;
  c.garbage_collection_threshold = snapshot.garbage_collection_threshold > 0.0 &&
                                           snapshot.garbage_collection_threshold < 1.0
                                       ? snapshot.garbage_collection_threshold
                                       : 0.0;
  if (!snapshot.roundup_power2_divisions.empty()) {
    c.roundup_power2_divisions.fill(0);
    for (std::size_t i = 0; i < snapshot.roundup_power2_divisions.size() && i < 16; ++i)
      c.roundup_power2_divisions[i] = snapshot.roundup_power2_divisions[i];
  }
  c.source.clear();
  return c;
}

std::string settings_difference(const Config& config) {
  static constexpr std::string_view kTunables[] = {
      "max_split_size_mb", "max_non_split_rounding_mb", "roundup_power2_divisions",
      "garbage_collection_threshold", "expandable_segments", "stitching", "stitch_before_grow_mb",
      "stitch_reuse_pages", "stitch_fine_above", "per_process_memory_fraction"};
  // The defaults, with stitching as `config` has it: keys that apply only with stitching are
  // compared with their own defaults.
  Config defaults;
  defaults.expandable_segments = config.expandable_segments;
  defaults.stitching = config.stitching;
  std::string out;
  for (const detail::KeySpec& key : detail::config_keys()) {
    if (std::find(std::begin(kTunables), std::end(kTunables), key.name) == std::end(kTunables)) continue;
    const std::string value = key.print(config);
    if (value.empty()) continue;
    const bool toggle = key.name == "expandable_segments" || key.name == "stitching";
    if (!toggle && value == key.print(defaults)) continue;
    if (toggle && value == key.print(Config{})) continue;
    if (!out.empty()) out += ',';
    out += std::string(key.name) + ":" + value;
  }
  return out;
}

TraceFile trace_file_from_snapshot(const Snapshot& snapshot, std::string name) {
  TraceFile w;
  w.name = std::move(name);
  w.devices = workloads_from_snapshot(snapshot);
  if (snapshot.stitch_version.starts_with("tracegen")) {
    w.recorded_by = "stitch-tracegen (generated)";
  } else if (!snapshot.stitch_version.empty()) {
    w.recorded_by = "stitch " + snapshot.stitch_version;
  }
  w.recorded = recorded_settings(snapshot, &w.settings_recorded);
  w.recorded_settings = settings_difference(w.recorded);
  return w;
}

TraceFile trace_file_from_rmm_csv(std::string_view text, std::string name) {
  Snapshot snapshot = formats::snapshot_from_rmm_csv(text, name);
  TraceFile w = trace_file_from_snapshot(snapshot, std::move(name));
  w.recorded_by = "RMM log";
  return w;
}

TraceFile read_trace_file(const std::string& path) {
  const std::string data = read_file(path);
  const bool csv = path.size() > 4 && path.compare(path.size() - 4, 4, ".csv") == 0;
  if (csv || data.starts_with("Thread,")) return trace_file_from_rmm_csv(data, path);
  if (!data.empty() && (data[0] == '{' || data[0] == '['))
    throw error(fmt::format("{}: JSON snapshots are not supported by the replay reader; use the "
                            "pickle form", path));
  // Stack frames are most of a real snapshot and no replay reads them.
  formats::PickleLimits limits;
  limits.skip_keys = {"frames"};
  const detail::PyValue root = formats::read_pickle(data, path, limits);
  formats::SnapshotReadOptions options;
  options.frames = false;
  return trace_file_from_snapshot(formats::snapshot_from_pyvalue(root, path, options), path);
}

}  // namespace stitch::replay_cli
