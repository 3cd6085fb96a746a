// config/config.cpp — parses STITCH_ALLOC_CONF / stitch_configure strings (PyTorch's syntax:
// `key:value,key:value`, lists in brackets, spaces ignored) into a Config, and prints one back;
// both driven by the key table.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "config/keys.hpp"
#include "stitch/config.hpp"
#include "stitch/errors.hpp"

namespace stitch {

namespace detail {

[[noreturn]] void bad_value(std::string_view key, std::string_view value, std::string_view accepted) {
  throw config_error(fmt::format("stitch config: bad value '{}' for {} (accepted: {})", value, key,
                                 accepted));
}

/// Keys whose value is a path: raw text up to the next ',' (':', brackets and spaces inside
/// are kept; spaces around it are dropped).
bool path_key(std::string_view key) { return key == "backup_dir"; }

// Splits on ',' ':' '[' ']' keeping brackets as tokens; drops spaces. A path key's value is one
// token, as written (path_key).
std::vector<std::string> tokenize(std::string_view conf) {
  std::vector<std::string> tokens;
  std::string cur;
  auto flush = [&] {
    if (!cur.empty()) tokens.push_back(std::move(cur));
    cur.clear();
  };
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n'; };
  for (std::size_t i = 0; i < conf.size(); ++i) {
    const char c = conf[i];
    if (space(c)) continue;
    if (c == ':' && path_key(cur) && (tokens.empty() || tokens.back() == ",")) {
      flush();
      tokens.emplace_back(1, c);
      std::size_t end = conf.find(',', i + 1);
      if (end == std::string_view::npos) end = conf.size();
      std::size_t b = i + 1, e = end;
      while (b < e && space(conf[b])) ++b;
      while (e > b && space(conf[e - 1])) --e;
      tokens.emplace_back(conf.substr(b, e - b));  // (empty: refused by the key's parser)
      i = end - 1;
      continue;
    }
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

class ConfigParser {
 public:
  explicit ConfigParser(std::vector<std::string> tokens) : t_(std::move(tokens)) {}
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
  /// The one token of a plain key's value.
  std::string value(const KeySpec& key) { return next(fmt::format("a value for '{}'", key.name)); }

 private:
  std::vector<std::string> t_;
  std::size_t i_ = 0;
};

namespace {

std::uint64_t parse_uint(const KeySpec& key, std::string_view v) {
  std::uint64_t out = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || p != v.data() + v.size()) bad_value(key.name, v, key.accepted);
  return out;
}

// An unsigned value in [lo, hi].
std::uint64_t uint_in(ConfigParser& p, const KeySpec& key, std::uint64_t lo, std::uint64_t hi) {
  const std::string v = p.value(key);
  const std::uint64_t n = parse_uint(key, v);
  if (n < lo || n > hi) bad_value(key.name, v, key.accepted);
  return n;
}

double parse_double(const KeySpec& key, const std::string& s) {
  char* end = nullptr;
  const double out = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(out)) bad_value(key.name, s, key.accepted);
  return out;
}

bool parse_bool(ConfigParser& p, const KeySpec& key) {
  const std::string v = p.value(key);
  if (v == "True") return true;
  if (v == "False") return false;
  bad_value(key.name, v, key.accepted);
}

const char* py_bool(bool b) { return b ? "True" : "False"; }

void parse_divisions(ConfigParser& p, Config& c, const KeySpec& key) {
  auto divisions = [&](std::string_view v) {
    const auto d = parse_uint(key, v);
    if (d != 0 && !std::has_single_bit(d)) bad_value(key.name, v, key.accepted);
    if (d > 1024) bad_value(key.name, v, key.accepted);
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
    p.expect(":", fmt::format("'{}' in {}", k, key.name));
    const std::uint32_t d = divisions(p.next("divisions"));
    if (k == ">") {
      for (int i = last + 1; i < 16; ++i) c.roundup_power2_divisions[static_cast<size_t>(i)] = d;
      last = 15;
    } else {
      const auto mb = parse_uint(key, k);
      if (mb == 0 || !std::has_single_bit(mb)) bad_value(key.name, k, key.accepted);
      const int index = static_cast<int>(std::bit_width(mb)) - 1;  // interval [mb, 2 mb) MiB
      if (index > 15 || index <= last) bad_value(key.name, k, key.accepted);
      // Sizes below this key not covered by an earlier entry take this entry's value too.
      for (int i = last + 1; i <= index; ++i) c.roundup_power2_divisions[static_cast<size_t>(i)] = d;
      last = index;
    }
    const std::string sep = p.next("',' or ']'");
    if (sep == "]") break;
    if (sep != ",")
      throw config_error(fmt::format("stitch config: expected ',' or ']' in {}, got '{}'", key.name, sep));
  }
}

std::string print_divisions(const Config& c) {
  std::string divisions = "[";
  for (std::size_t i = 0; i < c.roundup_power2_divisions.size(); ++i) {
    if (i != 0) divisions += ",";
    if (i == c.roundup_power2_divisions.size() - 1) {
      divisions += fmt::format(">:{}", c.roundup_power2_divisions[i]);
    } else {
      divisions += fmt::format("{}:{}", std::size_t{1} << i, c.roundup_power2_divisions[i]);
    }
  }
  return divisions + "]";
}

constexpr std::uint64_t kMaxMiB = std::uint64_t{1} << 40;

constexpr KeySpec kKeys[] = {
    {"backend", true, "cuda or sim",
     [](ConfigParser& p, Config& c, const KeySpec& k) {
       const std::string v = p.value(k);
       if (v == "cuda") c.backend = BackendKind::cuda;
       else if (v == "sim") c.backend = BackendKind::sim;
       else bad_value(k.name, v, k.accepted);
     },
     [](const Config& c) { return std::string(to_string(c.backend)); }},
    {"sim_capacity_mb", true, "an integer number of MiB >= 1",
     [](ConfigParser& p, Config& c, const KeySpec& k) {
       c.sim_capacity_mb = uint_in(p, k, 1, std::uint64_t{1} << 30);
     },
     [](const Config& c) { return std::to_string(c.sim_capacity_mb); }},
    {"peer_access", true, "True or False",
     [](ConfigParser& p, Config& c, const KeySpec& k) { c.peer_access = parse_bool(p, k); },
     [](const Config& c) { return c.peer_access ? std::string("True") : std::string(); }},
    {"sim_host_mb", true, "an integer number of MiB >= 0 (0: no bound)",
     [](ConfigParser& p, Config& c, const KeySpec& k) { c.sim_host_mb = uint_in(p, k, 0, std::uint64_t{1} << 30); },
     [](const Config& c) { return c.sim_host_mb == 0 ? std::string() : std::to_string(c.sim_host_mb); }},
    {"ipc", true, "True or False",
     [](ConfigParser& p, Config& c, const KeySpec& k) { c.ipc = parse_bool(p, k); },
     [](const Config& c) { return c.ipc ? std::string() : std::string("False"); }},
    {"sim_devices", true, "an integer from 1 to 64",
     [](ConfigParser& p, Config& c, const KeySpec& k) { c.sim_devices = static_cast<int>(uint_in(p, k, 1, 64)); },
     [](const Config& c) { return std::to_string(c.sim_devices); }},
    {"max_split_size_mb", false, "an integer >= 20",
     [](ConfigParser& p, Config& c, const KeySpec& k) { c.max_split_size = uint_in(p, k, 20, kMaxMiB) << 20; },
     [](const Config& c) {
       return c.max_split_size == Config::kUnlimited ? std::string() : std::to_string(c.max_split_size >> 20);
     }},
    {"max_non_split_rounding_mb", false, "an integer >= 20",
     [](ConfigParser& p, Config& c, const KeySpec& k) {
       c.max_non_split_rounding = uint_in(p, k, 20, kMaxMiB) << 20;
     },
     [](const Config& c) { return std::to_string(c.max_non_split_rounding >> 20); }},
    {"roundup_power2_divisions", false,
     "a power of two (or 0), or a list [MB:divisions,...,>:divisions] with power-of-two MB keys",
     parse_divisions, print_divisions},
    {"garbage_collection_threshold", false, "a number strictly between 0 and 1",
     [](ConfigParser& p, Config& c, const KeySpec& k) {
       const std::string v = p.value(k);
       const double t = parse_double(k, v);
       if (!(t > 0.0 && t < 1.0)) bad_value(k.name, v, k.accepted);
       c.garbage_collection_threshold = t;
     },
     [](const Config& c) {
       return c.garbage_collection_threshold > 0 ? fmt::format("{}", c.garbage_collection_threshold)
                                                 : std::string();
     }},
    {"expandable_segments", false, "True or False",
     [](ConfigParser& p, Config& c, const KeySpec& k) { c.expandable_segments = parse_bool(p, k); },
     [](const Config& c) { return std::string(py_bool(c.expandable_segments)); }},
    {"stitching", false, "True or False",
     [](ConfigParser& p, Config& c, const KeySpec& k) { c.stitching = parse_bool(p, k); },
     [](const Config& c) { return std::string(py_bool(c.stitching)); }},
    {"stitch_before_grow_mb", false, "an integer number of MiB (0: off)",
     [](ConfigParser& p, Config& c, const KeySpec& k) { c.stitch_before_grow = uint_in(p, k, 0, kMaxMiB) << 20; },
     [](const Config& c) {
       return c.stitch_before_grow != 0 ? std::to_string(c.stitch_before_grow >> 20) : std::string();
     }},
    {"stitch_reuse_pages", false, "True or False",
     [](ConfigParser& p, Config& c, const KeySpec& k) { c.stitch_reuse_pages = parse_bool(p, k); },
     [](const Config& c) { return c.stitching ? std::string(py_bool(c.stitch_reuse_pages)) : std::string(); }},
    {"stitch_fine_above", false, "a number in [0, 1]",
     [](ConfigParser& p, Config& c, const KeySpec& k) {
       const std::string v = p.value(k);
       const double f = parse_double(k, v);
       if (!(f >= 0.0 && f <= 1.0)) bad_value(k.name, v, k.accepted);
       c.stitch_fine_above = f;
     },
     [](const Config& c) { return c.stitching ? fmt::format("{}", c.stitch_fine_above) : std::string(); }},
    {"stitch_compact", false, "True or False",
     [](ConfigParser& p, Config& c, const KeySpec& k) { c.stitch_compact = parse_bool(p, k); },
     [](const Config& c) { return c.stitch_compact ? std::string(py_bool(true)) : std::string(); }},
    {"spill", false, "off, tags or all",
     [](ConfigParser& p, Config& c, const KeySpec& k) {
       const std::string v = p.value(k);
       if (v == "off") c.spill = Config::Spill::off;
       else if (v == "tags") c.spill = Config::Spill::tags;
       else if (v == "all") c.spill = Config::Spill::all;
       else bad_value(k.name, v, k.accepted);
     },
     [](const Config& c) {
       return c.spill == Config::Spill::off ? std::string()
                                            : std::string(c.spill == Config::Spill::tags ? "tags" : "all");
     }},
    {"spill_limit_mb", false, "an integer number of MiB (0: no cap)",
     [](ConfigParser& p, Config& c, const KeySpec& k) { c.spill_limit = uint_in(p, k, 0, kMaxMiB) << 20; },
     [](const Config& c) { return c.spill_limit != 0 ? std::to_string(c.spill_limit >> 20) : std::string(); }},
    {"kv_page_mb", false, "an integer number of MiB >= 1",
     [](ConfigParser& p, Config& c, const KeySpec& k) { c.kv_page = uint_in(p, k, 1, 1024) << 20; },
     [](const Config& c) { return std::to_string(c.kv_page >> 20); }},
    {"kv_reserve_mb", false, "an integer number of MiB (0: none)",
     [](ConfigParser& p, Config& c, const KeySpec& k) { c.kv_reserve = uint_in(p, k, 0, kMaxMiB) << 20; },
     [](const Config& c) { return c.kv_reserve != 0 ? std::to_string(c.kv_reserve >> 20) : std::string(); }},
    {"kv_zero_page", false, "True or False",
     [](ConfigParser& p, Config& c, const KeySpec& k) { c.kv_zero_page = parse_bool(p, k); },
     [](const Config& c) { return c.kv_zero_page ? std::string(py_bool(true)) : std::string(); }},
    {"per_process_memory_fraction", false, "a number in [0, 1]",
     [](ConfigParser& p, Config& c, const KeySpec& k) {
       const std::string v = p.value(k);
       const double f = parse_double(k, v);
       if (!(f >= 0.0 && f <= 1.0)) bad_value(k.name, v, k.accepted);
       c.per_process_memory_fraction = f;
     },
     [](const Config& c) { return fmt::format("{}", c.per_process_memory_fraction); }},
    {"on_invalid_free", false, "error or abort",
     [](ConfigParser& p, Config& c, const KeySpec& k) {
       const std::string v = p.value(k);
       if (v == "error") c.on_invalid_free = InvalidFreePolicy::error;
       else if (v == "abort") c.on_invalid_free = InvalidFreePolicy::abort;
       else bad_value(k.name, v, k.accepted);
     },
     [](const Config& c) {
       return std::string(c.on_invalid_free == InvalidFreePolicy::abort ? "abort" : "error");
     }},
    {"record_history", false, "True or False",
     [](ConfigParser& p, Config& c, const KeySpec& k) { c.record_history = parse_bool(p, k); },
     [](const Config& c) { return std::string(py_bool(c.record_history)); }},
    {"max_entries", false, "an integer from 1 to 2^32",
     [](ConfigParser& p, Config& c, const KeySpec& k) { c.max_entries = uint_in(p, k, 1, std::uint64_t{1} << 32); },
     [](const Config& c) { return std::to_string(c.max_entries); }},
    {"record_stacks", false, "True, False, cpp, python or all",
     [](ConfigParser& p, Config& c, const KeySpec& k) {
       const std::string v = p.value(k);
       if (v == "True" || v == "cpp") {
         c.record_stacks = true, c.record_python_stacks = false;
       } else if (v == "False") {
         c.record_stacks = false, c.record_python_stacks = false;
       } else if (v == "python") {
         c.record_stacks = false, c.record_python_stacks = true;
       } else if (v == "all") {
         c.record_stacks = true, c.record_python_stacks = true;
       } else {
         bad_value(k.name, v, k.accepted);
       }
     },
     [](const Config& c) {
       if (c.record_python_stacks) return std::string(c.record_stacks ? "all" : "python");
       return std::string(py_bool(c.record_stacks));
     }},
    {"backup_dir", false,
     "an absolute directory path, everything up to the next ',' (no ',' or control characters), or "
     "none (no disk tier)",
     [](ConfigParser& p, Config& c, const KeySpec& k) {
       const std::string v = p.value(k);
       if (v == "none") {
         c.backup_dir.clear();
         return;
       }
       if (v.empty() || v.front() != '/' || v.size() > 4095) bad_value(k.name, v, k.accepted);
       for (const char ch : v)
         if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) bad_value(k.name, v, k.accepted);
       c.backup_dir = v;
     },
     [](const Config& c) { return c.backup_dir; }},
    {"backup_dir_mb", false, "an integer number of MiB (0: the file system's free space)",
     [](ConfigParser& p, Config& c, const KeySpec& k) { c.backup_dir_bytes = uint_in(p, k, 0, kMaxMiB) << 20; },
     [](const Config& c) { return c.backup_dir_bytes != 0 ? std::to_string(c.backup_dir_bytes >> 20) : std::string(); }},
    {"backup_host_mb", false, "an integer number of MiB (0: no cap)",
     [](ConfigParser& p, Config& c, const KeySpec& k) { c.backup_host_bytes = uint_in(p, k, 0, kMaxMiB) << 20; },
     [](const Config& c) { return c.backup_host_bytes != 0 ? std::to_string(c.backup_host_bytes >> 20) : std::string(); }},
    {"oom_snapshot", false, "a file path (no ',', ':' or spaces)",
     [](ConfigParser& p, Config& c, const KeySpec& k) { c.oom_snapshot = p.value(k); },
     [](const Config& c) { return c.oom_snapshot; }},
    {"oom_what_if", false, "True or False",
     [](ConfigParser& p, Config& c, const KeySpec& k) { c.oom_what_if = parse_bool(p, k); },
     [](const Config& c) { return std::string(py_bool(c.oom_what_if)); }},
};

// The `key:value` items of a configuration string, spaces dropped, lists kept whole.
std::vector<std::string> config_items(std::string_view conf) {
  std::vector<std::string> items;
  std::string cur;
  int depth = 0;
  for (const std::string& t : tokenize(conf)) {
    if (t == "," && depth == 0) {
      if (!cur.empty()) items.push_back(std::move(cur));
      cur.clear();
      continue;
    }
    depth += t == "[" ? 1 : t == "]" ? -1 : 0;
    cur += t;
  }
  if (!cur.empty()) items.push_back(std::move(cur));
  return items;
}

// The history recorder's own switches: turning recording on is not a setting of the allocator.
bool is_recorder_key(std::string_view key) {
  return key == "record_history" || key == "max_entries" || key == "record_stacks";
}

// `base` with the items of `conf` applied: an item for a key already there replaces it in place,
// a new key goes at the end, and the recorder's switches are left out.
std::string merged_source(std::string_view base, std::string_view conf) {
  std::vector<std::string> items = config_items(base);
  auto key_of = [](std::string_view item) { return item.substr(0, item.find(':')); };
  for (std::string& item : config_items(conf)) {
    if (is_recorder_key(key_of(item))) continue;
    auto same = std::find_if(items.begin(), items.end(),
                             [&](const std::string& x) { return key_of(x) == key_of(item); });
    if (same != items.end()) {
      *same = std::move(item);
    } else {
      items.push_back(std::move(item));
    }
  }
  std::string out;
  for (const std::string& item : items) {
    if (!out.empty()) out += ',';
    out += item;
  }
  return out;
}

std::string key_list() {
  std::string out;
  for (const KeySpec& k : kKeys) {
    if (!out.empty()) out += ", ";
    out += k.name;
  }
  return out;
}

}  // namespace

std::span<const KeySpec> config_keys() noexcept { return kKeys; }

const KeySpec* find_config_key(std::string_view name) noexcept {
  for (const KeySpec& k : kKeys)
    if (k.name == name) return &k;
  return nullptr;
}

}  // namespace detail

const char* to_string(BackendKind kind) noexcept {
  return kind == BackendKind::sim ? "sim" : "cuda";
}

Config Config::parse(std::string_view conf, const Config& base, std::vector<std::string>* given) {
  Config c = base;
  detail::ConfigParser p(detail::tokenize(conf));
  while (!p.done()) {
    const std::string key = p.next("a key");
    if (key == ",") continue;
    p.expect(":", fmt::format("key '{}'", key));
    const detail::KeySpec* spec = detail::find_config_key(key);
    if (spec == nullptr)
      throw config_error(fmt::format("stitch config: unknown key '{}' (accepted keys: {})", key,
                                     detail::key_list()));
    spec->parse(p, c, *spec);
    if (given != nullptr) given->push_back(key);
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
  if (c.stitch_compact && !c.stitching)
    throw config_error(
        "stitch config: stitch_compact:True requires stitching:True (compaction frees coarse "
        "pages for a stitch, in ranges of one-granule slots)");
  if (c.spill != Config::Spill::off && !c.expandable_segments)
    throw config_error(
        "stitch config: spill:tags and spill:all require expandable_segments:True (spill moves "
        "live memory to host pages under the same addresses, which only ranges of the "
        "virtual-memory API allow)");
  c.source = detail::merged_source(base.source, conf);
  return c;
}

std::string Config::to_string() const {
  std::string out;
  for (const detail::KeySpec& k : detail::config_keys()) {
    const std::string value = k.print(*this);
    if (value.empty()) continue;
    if (!out.empty()) out += ',';
    out += k.name;
    out += ':';
    out += value;
  }
  return out;
}

}  // namespace stitch
