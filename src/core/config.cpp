// core/config.cpp — parses STITCH_ALLOC_CONF / stitch_configure strings (PyTorch's syntax:
// `key:value,key:value`, lists in brackets, spaces ignored) into a Config.
#include "stitch/config.hpp"

#include <fmt/format.h>

#include <bit>
#include <charconv>
#include <cmath>
#include <string>
#include <vector>

#include "stitch/errors.hpp"

namespace stitch {

namespace {

constexpr const char* kKeys =
    "backend, sim_capacity_mb, sim_devices, max_split_size_mb, max_non_split_rounding_mb, "
    "roundup_power2_divisions, garbage_collection_threshold, expandable_segments, stitching, "
    "stitch_before_grow_mb, stitch_reuse_pages, per_process_memory_fraction, on_invalid_free, record_history, max_entries, record_stacks, "
    "oom_snapshot, oom_what_if";

[[noreturn]] void bad_value(std::string_view key, std::string_view value, std::string_view accepted) {
  throw config_error(fmt::format("stitch config: bad value '{}' for {} (accepted: {})", value, key,
                                 accepted));
}

// Splits on ',' ':' '[' ']' keeping brackets as tokens; drops spaces.
std::vector<std::string> tokenize(std::string_view conf) {
  std::vector<std::string> tokens;
  std::string cur;
  auto flush = [&] {
    if (!cur.empty()) tokens.push_back(std::move(cur));
    cur.clear();
  };
  for (char c : conf) {
    if (c == ' ' || c == '\t' || c == '\n') continue;
    if (c == ',' || c == ':' || c == '[' || c == ']') {
      flush();
      tokens.emplace_back(1, c);
    } else {
      cur.push_back(c);
    }
  }
  flush();
  return tokens;
}

std::uint64_t parse_uint(std::string_view key, std::string_view v, std::string_view accepted) {
  std::uint64_t out = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || p != v.data() + v.size()) bad_value(key, v, accepted);
  return out;
}

double parse_double(std::string_view key, std::string_view v, std::string_view accepted) {
  std::string s(v);
  char* end = nullptr;
  const double out = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(out)) bad_value(key, v, accepted);
  return out;
}

bool parse_bool(std::string_view key, std::string_view v) {
  if (v == "True") return true;
  if (v == "False") return false;
  bad_value(key, v, "True or False");
}

class Parser {
 public:
  explicit Parser(std::vector<std::string> tokens) : t_(std::move(tokens)) {}
  [[nodiscard]] bool done() const { return i_ >= t_.size(); }
  const std::string& peek() const {
    static const std::string kEnd;
    return done() ? kEnd : t_[i_];
  }
  std::string next(std::string_view what) {
    if (done()) throw config_error(fmt::format("stitch config: expected {} at the end", what));
    return t_[i_++];
  }
  void expect(std::string_view tok, std::string_view after) {
    const std::string got = next(fmt::format("'{}' after {}", tok, after));
    if (got != tok)
      throw config_error(fmt::format("stitch config: expected '{}' after {}, got '{}'", tok, after, got));
  }

 private:
  std::vector<std::string> t_;
  std::size_t i_ = 0;
};

void parse_divisions(Parser& p, Config& c) {
  constexpr std::string_view key = "roundup_power2_divisions";
  constexpr std::string_view accepted =
      "a power of two (or 0), or a list [MB:divisions,...,>:divisions] with power-of-two MB keys";
  auto divisions = [&](std::string_view v) {
    const auto d = parse_uint(key, v, accepted);
    if (d != 0 && !std::has_single_bit(d)) bad_value(key, v, accepted);
    if (d > 1024) bad_value(key, v, accepted);
    return static_cast<std::uint32_t>(d);
  };
  if (p.peek() != "[") {
    c.roundup_power2_divisions.fill(divisions(p.next("a value for roundup_power2_divisions")));
    return;
  }
  p.next("[");
  int last = -1;
  while (true) {
    const std::string k = p.next("a list entry");
    p.expect(":", fmt::format("'{}' in {}", k, key));
    const std::uint32_t d = divisions(p.next("divisions"));
    if (k == ">") {
      for (int i = last + 1; i < 16; ++i) c.roundup_power2_divisions[static_cast<size_t>(i)] = d;
      last = 15;
    } else {
      const auto mb = parse_uint(key, k, accepted);
      if (mb == 0 || !std::has_single_bit(mb)) bad_value(key, k, accepted);
      const int index = static_cast<int>(std::bit_width(mb)) - 1;  // interval [mb, 2 mb) MiB
      if (index > 15 || index <= last) bad_value(key, k, accepted);
      // Sizes below this key not covered by an earlier entry take this entry's value too.
      for (int i = last + 1; i <= index; ++i) c.roundup_power2_divisions[static_cast<size_t>(i)] = d;
      last = index;
    }
    const std::string sep = p.next("',' or ']'");
    if (sep == "]") break;
    if (sep != ",") throw config_error(fmt::format("stitch config: expected ',' or ']' in {}, got '{}'", key, sep));
  }
}

}  // namespace

const char* to_string(BackendKind kind) noexcept {
  return kind == BackendKind::sim ? "sim" : "cuda";
}

Config Config::parse(std::string_view conf, const Config& base) {
  Config c = base;
  Parser p(tokenize(conf));
  while (!p.done()) {
    const std::string key = p.next("a key");
    if (key == ",") continue;
    p.expect(":", fmt::format("key '{}'", key));
    if (key == "roundup_power2_divisions") {
      parse_divisions(p, c);
    } else {
      const std::string v = p.next(fmt::format("a value for '{}'", key));
      if (key == "backend") {
        if (v == "cuda") c.backend = BackendKind::cuda;
        else if (v == "sim") c.backend = BackendKind::sim;
        else bad_value(key, v, "cuda or sim");
      } else if (key == "sim_capacity_mb") {
        const auto mb = parse_uint(key, v, "an integer number of MiB >= 1");
        if (mb < 1 || mb > (std::uint64_t{1} << 30)) bad_value(key, v, "an integer number of MiB >= 1");
        c.sim_capacity_mb = mb;
      } else if (key == "sim_devices") {
        const auto n = parse_uint(key, v, "an integer from 1 to 64");
        if (n < 1 || n > 64) bad_value(key, v, "an integer from 1 to 64");
        c.sim_devices = static_cast<int>(n);
      } else if (key == "max_split_size_mb") {
        const auto mb = parse_uint(key, v, "an integer >= 20");
        if (mb < 20 || mb > (std::uint64_t{1} << 40)) bad_value(key, v, "an integer >= 20");
        c.max_split_size = mb << 20;
      } else if (key == "max_non_split_rounding_mb") {
        const auto mb = parse_uint(key, v, "an integer >= 20");
        if (mb < 20 || mb > (std::uint64_t{1} << 40)) bad_value(key, v, "an integer >= 20");
        c.max_non_split_rounding = mb << 20;
      } else if (key == "garbage_collection_threshold") {
        const double t = parse_double(key, v, "a number strictly between 0 and 1");
        if (!(t > 0.0 && t < 1.0)) bad_value(key, v, "a number strictly between 0 and 1");
        c.garbage_collection_threshold = t;
      } else if (key == "expandable_segments") {
        c.expandable_segments = parse_bool(key, v);
      } else if (key == "stitching") {
        c.stitching = parse_bool(key, v);
      } else if (key == "stitch_before_grow_mb") {
        const auto mb = parse_uint(key, v, "an integer number of MiB (0: off)");
        if (mb > (std::uint64_t{1} << 40)) bad_value(key, v, "an integer number of MiB (0: off)");
        c.stitch_before_grow = mb << 20;
      } else if (key == "stitch_reuse_pages") {
        c.stitch_reuse_pages = parse_bool(key, v);
      } else if (key == "per_process_memory_fraction") {
        const double f = parse_double(key, v, "a number in [0, 1]");
        if (!(f >= 0.0 && f <= 1.0)) bad_value(key, v, "a number in [0, 1]");
        c.per_process_memory_fraction = f;
      } else if (key == "record_history") {
        c.record_history = parse_bool(key, v);
      } else if (key == "record_stacks") {
        c.record_stacks = parse_bool(key, v);
      } else if (key == "max_entries") {
        const auto n = parse_uint(key, v, "an integer from 1 to 2^32");
        if (n < 1 || n > (std::uint64_t{1} << 32)) bad_value(key, v, "an integer from 1 to 2^32");
        c.max_entries = n;
      } else if (key == "oom_snapshot") {
        c.oom_snapshot = v;
      } else if (key == "oom_what_if") {
        c.oom_what_if = parse_bool(key, v);
      } else if (key == "on_invalid_free") {
        if (v == "error") c.on_invalid_free = InvalidFreePolicy::error;
        else if (v == "abort") c.on_invalid_free = InvalidFreePolicy::abort;
        else bad_value(key, v, "error or abort");
      } else {
        throw config_error(fmt::format("stitch config: unknown key '{}' (accepted keys: {})", key, kKeys));
      }
    }
    if (!p.done()) {
      const std::string sep = p.next("','");
      if (sep != ",")
        throw config_error(fmt::format("stitch config: expected ',' after the value of '{}', got '{}'", key, sep));
    }
  }
  if (c.stitching && !c.expandable_segments)
    throw config_error(
        "stitch config: stitching:True requires expandable_segments:True (stitching remaps the "
        "pages of expandable segments)");
  if (!conf.empty()) c.source = std::string(conf);
  return c;
}

std::string Config::to_string() const {
  std::string divisions = "[";
  for (std::size_t i = 0; i < roundup_power2_divisions.size(); ++i) {
    if (i != 0) divisions += ",";
    if (i == roundup_power2_divisions.size() - 1) {
      divisions += fmt::format(">:{}", roundup_power2_divisions[i]);
    } else {
      divisions += fmt::format("{}:{}", std::size_t{1} << i, roundup_power2_divisions[i]);
    }
  }
  divisions += "]";
  std::string out = fmt::format("backend:{},sim_capacity_mb:{},sim_devices:{}", stitch::to_string(backend),
                                sim_capacity_mb, sim_devices);
  if (max_split_size != kUnlimited) out += fmt::format(",max_split_size_mb:{}", max_split_size >> 20);
  out += fmt::format(",max_non_split_rounding_mb:{}", max_non_split_rounding >> 20);
  out += ",roundup_power2_divisions:" + divisions;
  if (garbage_collection_threshold > 0)
    out += fmt::format(",garbage_collection_threshold:{}", garbage_collection_threshold);
  out += fmt::format(",expandable_segments:{}", expandable_segments ? "True" : "False");
  out += fmt::format(",stitching:{}", stitching ? "True" : "False");
  if (stitch_before_grow != 0) out += fmt::format(",stitch_before_grow_mb:{}", stitch_before_grow >> 20);
  if (stitching) out += fmt::format(",stitch_reuse_pages:{}", stitch_reuse_pages ? "True" : "False");
  out += fmt::format(",per_process_memory_fraction:{}", per_process_memory_fraction);
  out += fmt::format(",on_invalid_free:{}", on_invalid_free == InvalidFreePolicy::abort ? "abort" : "error");
  out += fmt::format(",record_history:{},max_entries:{},record_stacks:{}",
                     record_history ? "True" : "False", max_entries, record_stacks ? "True" : "False");
  if (!oom_snapshot.empty()) out += ",oom_snapshot:" + oom_snapshot;
  out += fmt::format(",oom_what_if:{}", oom_what_if ? "True" : "False");
  return out;
}

}  // namespace stitch
