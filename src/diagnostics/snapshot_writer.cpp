// diagnostics/snapshot_writer.cpp — a Snapshot in PyTorch's snapshot schema, as pickle or JSON.
// One function (emit) walks the snapshot; the two sinks (PickleWriter, JsonWriter) share the
// streaming interface, so both formats always carry the same structure.
#include "diagnostics/snapshot_writer.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "diagnostics/pickle_writer.hpp"
#include "stitch/errors.hpp"

namespace stitch::detail {

void append_json_escaped(std::string& out, std::string_view raw) {
  if (!valid_utf8(raw)) {
    append_json_escaped(out, sanitize_utf8(raw));
    return;
  }
  std::size_t plain = 0;  // start of the run of characters copied as they are
  for (std::size_t i = 0; i < raw.size(); ++i) {
    const auto c = static_cast<unsigned char>(raw[i]);
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    out.append(raw.data() + plain, i - plain);
    plain = i + 1;
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default: out += fmt::format("\\u{:04x}", c);
    }
  }
  out.append(raw.data() + plain, raw.size() - plain);
}

namespace {

// JSON with the PickleWriter's streaming interface. Compact, one trace entry or block per line.
class JsonWriter {
 public:
  void begin_dict() { open('{'); }
  void end_dict() { close('}'); }
  void begin_list() { open('['); }
  void end_list() { close(']'); }
  void begin_tuple() { open('['); }
  void end_tuple() { close(']'); }
  void key(std::string_view k) {
    separator();
    quoted(k);
    out_ += ':';
    after_key_ = true;
  }
  void none() { scalar("null"); }
  void boolean(bool v) { scalar(v ? "true" : "false"); }
  void integer(std::int64_t v) { number(v); }
  void uinteger(std::uint64_t v) { number(v); }
  void wide_integer(const PyValue& v) { scalar(v.decimal()); }
  void floating(double v) {
    if (!std::isfinite(v)) {
      scalar("null");
      return;
    }
    std::string s = fmt::format("{}", v);
    if (s.find_first_of(".eE") == std::string::npos) s += ".0";
    scalar(s);
  }
  void string(std::string_view v) {
    separator();
    quoted(v);
  }
  void bytes(std::string_view v) { string(v); }  // JSON has no bytes: a string
  void value(const PyValue& v) {
    if (write_scalar(*this, v)) return;
    switch (v.type()) {
      case PyValue::Type::list:
      case PyValue::Type::tuple:
        begin_list();
        for (const PyValue& c : v.items()) value(c);
        end_list();
        return;
      case PyValue::Type::dict:
        begin_dict();
        for (const auto& [k, c] : v.entries()) {
          key(k.is_string() ? k.as_string() : k.repr());
          value(c);
        }
        end_dict();
        return;
      default:  // scalars: written above
        return;
    }
  }
  bool reuse(std::string_view) { return false; }  // JSON repeats the value
  std::string finish() {
    out_ += '\n';
    return std::move(out_);
  }

 private:
  void separator() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_.empty()) {
      if (!first_.back().first) out_ += ',';
      first_.back().first = false;
      // A line per top-level key, per segment and per trace entry keeps big files greppable.
      if (first_.size() == 1 || (first_.back().list && first_.size() <= 3)) out_ += '\n';
    }
  }
  void open(char c) {
    separator();
    out_ += c;
    first_.push_back({true, c == '['});
  }
  void close(char c) {
    first_.pop_back();
    out_ += c;
  }
  void scalar(std::string_view s) {
    separator();
    out_ += s;
  }
  template <typename Int>
  void number(Int v) {
    char buf[24];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    scalar(std::string_view(buf, static_cast<std::size_t>(r.ptr - buf)));
  }
  void quoted(std::string_view raw) {
    out_ += '"';
    append_json_escaped(out_, raw);
    out_ += '"';
  }

  std::string out_;
  struct Level {
    bool first;  ///< no element written yet
    bool list;
  };
  std::vector<Level> first_;
  bool after_key_ = false;
};

// The last frames recorded for an address by the given actions, per device.
using FrameIndex = std::unordered_map<std::uintptr_t, const std::vector<std::string>*>;

FrameIndex index_frames(const std::vector<TraceEntry>& trace, TraceAction a, TraceAction b) {
  FrameIndex index;
  for (const TraceEntry& e : trace)
    if (e.action == a || e.action == b) index[e.addr] = &e.frames;
  return index;
}

// Frames split once per distinct text (the snapshot's strings outlive the writing).
using FrameCache = std::unordered_map<std::string_view, FrameParts>;

template <typename Sink>
void emit_frames(Sink& w, const std::vector<std::string>* frames, FrameCache& cache) {
  w.begin_list();
  if (frames != nullptr) {
    for (const std::string& f : *frames) {
      // A stack frame recurs in many entries: the pickle stores it once (as PyTorch's does).
      if (w.reuse(f)) continue;
      auto it = cache.find(f);
      if (it == cache.end()) it = cache.emplace(f, split_frame(f)).first;
      const FrameParts& p = it->second;
      w.begin_dict();
      w.key("name");
      w.string(p.name);
      w.key("filename");
      w.string(p.filename);
      w.key("line");
      w.integer(p.line);
      w.end_dict();
    }
  }
  w.end_list();
}

template <typename Sink>
void emit(Sink& w, const Snapshot& snap, const SnapshotMeta& meta) {
  FrameCache cache;
  std::vector<FrameIndex> alloc_frames;
  std::vector<FrameIndex> segment_frames;
  for (const auto& trace : snap.device_traces) {
    alloc_frames.push_back(index_frames(trace, TraceAction::alloc, TraceAction::alloc));
    segment_frames.push_back(index_frames(trace, TraceAction::segment_alloc, TraceAction::segment_map));
  }
  auto lookup = [](const std::vector<FrameIndex>& idx, int device,
                   std::uintptr_t addr) -> const std::vector<std::string>* {
    if (device < 0 || static_cast<std::size_t>(device) >= idx.size()) return nullptr;
    auto it = idx[static_cast<std::size_t>(device)].find(addr);
    return it == idx[static_cast<std::size_t>(device)].end() ? nullptr : it->second;
  };

  w.begin_dict();

  w.key("segments");
  w.begin_list();
  for (const SegmentSnapshot& s : snap.segments) {
    w.begin_dict();
    w.key("device");
    w.integer(s.device);
    w.key("address");
    w.uinteger(s.address);
    w.key("total_size");
    w.uinteger(s.total_size);
    w.key("allocated_size");
    w.uinteger(s.allocated_size);
    w.key("active_size");
    w.uinteger(s.active_size);
    w.key("requested_size");
    w.uinteger(s.requested_size);
    w.key("stream");
    w.uinteger(s.stream);
    w.key("segment_type");
    w.string(s.segment_type.empty() ? "large" : s.segment_type);
    w.key("segment_pool_id");
    w.value(PyValue::tuple({PyValue::integer(static_cast<std::int64_t>(s.pool_id.first)),
                            PyValue::integer(static_cast<std::int64_t>(s.pool_id.second))}));
    w.key("is_expandable");
    w.boolean(s.is_expandable);
    if (!s.tag.empty()) {
      w.key("tag");
      w.string(s.tag);
      w.key("sleeping");
      w.boolean(s.sleeping);
    }
    if (s.spilled_bytes != 0) {
      w.key("spilled_bytes");
      w.uinteger(s.spilled_bytes);
    }
    if (s.backup_host_bytes != 0) {
      w.key("backup_host_bytes");
      w.uinteger(s.backup_host_bytes);
    }
    if (s.backup_file_bytes != 0) {
      w.key("backup_file_bytes");
      w.uinteger(s.backup_file_bytes);
    }
    w.key("frames");
    emit_frames(w, lookup(segment_frames, s.device, s.address), cache);
    w.key("blocks");
    w.begin_list();
    for (const BlockSnapshot& b : s.blocks) {
      if (b.state == "unmapped") continue;
      const bool active = b.state == "active_allocated" || b.state == "active_pending_free";
      w.begin_dict();
      w.key("address");
      w.uinteger(b.address);
      w.key("size");
      w.uinteger(b.size);
      w.key("requested_size");
      w.uinteger(b.requested_size);
      w.key("state");
      w.string(b.state);
      w.key("frames");
      emit_frames(w, active ? lookup(alloc_frames, s.device, b.address) : nullptr, cache);
      w.end_dict();
    }
    w.end_list();
    w.end_dict();
  }
  w.end_list();

  w.key("device_traces");
  w.begin_list();
  for (const auto& trace : snap.device_traces) {
    w.begin_list();
    for (const TraceEntry& e : trace) {
      w.begin_dict();
      w.key("action");
      w.string(to_string(e.action));
      w.key(e.action == TraceAction::oom ? "device_free" : "addr");
      w.uinteger(e.addr);
      w.key("size");
      w.uinteger(e.size);
      w.key("stream");
      w.uinteger(e.stream);
      w.key("time_us");
      w.integer(e.time_us);
      w.key("frames");
      emit_frames(w, &e.frames, cache);
      w.end_dict();
    }
    w.end_list();
  }
  w.end_list();

  w.key("allocator_settings");
  w.begin_dict();
  w.key("PYTORCH_CUDA_ALLOC_CONF");
  w.string(snap.settings);
  w.key("max_split_size");
  w.integer(snap.max_split_size == SIZE_MAX ? -1 : static_cast<std::int64_t>(snap.max_split_size));
  w.key("garbage_collection_threshold");
  w.floating(snap.garbage_collection_threshold);
  w.key("expandable_segments");
  w.boolean(snap.expandable_segments);
  // Settings stitch does not have, at the values that mean "off".
  w.key("pinned_num_register_threads");
  w.integer(1);
  w.key("release_lock_on_cudamalloc");
  w.boolean(false);
  w.key("pinned_use_cuda_host_register");
  w.boolean(false);
  w.key("graph_capture_record_stream_reuse");
  w.boolean(false);
  w.key("roundup_power2_divisions");
  w.begin_dict();
  for (std::size_t i = 0; i < snap.roundup_power2_divisions.size() && i < 16; ++i) {
    w.key(fmt::format("{}", std::size_t{1} << i));
    w.uinteger(snap.roundup_power2_divisions[i]);
  }
  w.end_dict();
  w.end_dict();

  w.key("external_annotations");
  w.begin_list();
  w.end_list();

  w.key("stitch");
  w.begin_dict();
  w.key("version");
  w.string(meta.version);
  w.key("backend");
  w.string(meta.backend);
  w.key("config");
  w.string(meta.config);
  w.key("device_count");
  w.integer(meta.device_count);
  w.key("format");
  w.integer(1);
  if (!snap.kv_pools.empty()) {
    w.key("kv_pools");  // docs/kv.md: the pools' pages are reserved memory outside "segments"
    w.begin_list();
    for (const KvPoolSnapshot& k : snap.kv_pools) {
      w.begin_dict();
      w.key("device");
      w.integer(k.device);
      w.key("pool");
      w.integer(k.id);
      w.key("tag");
      w.string(k.tag);
      w.key("buffers");
      w.integer(k.buffers);
      w.key("block_bytes");
      w.uinteger(k.block_bytes);
      w.key("max_blocks");
      w.uinteger(k.max_blocks);
      w.key("page_bytes");
      w.uinteger(k.page_bytes);
      w.key("live_blocks");
      w.uinteger(k.live_blocks);
      w.key("mapped_bytes");
      w.uinteger(k.mapped_bytes);
      w.key("used_bytes");
      w.uinteger(k.used_bytes);
      w.key("asleep");
      w.boolean(k.asleep);
      w.end_dict();
    }
    w.end_list();
  }
  w.end_dict();

  w.end_dict();
}

}  // namespace

FrameParts split_frame(std::string_view frame) {
  FrameParts p;
  const std::size_t open = frame.rfind(" (");
  if (frame.size() < 3 || frame.back() != ')' || open == std::string_view::npos) {
    p.name = std::string(frame);
    p.filename = "??";
    return p;
  }
  p.name = std::string(frame.substr(0, open));
  std::string_view file = frame.substr(open + 2, frame.size() - open - 3);
  // "file:123" carries a line number.
  const std::size_t colon = file.rfind(':');
  if (colon != std::string_view::npos && colon + 1 < file.size() &&
      std::all_of(file.begin() + static_cast<std::ptrdiff_t>(colon) + 1, file.end(),
                  [](char c) { return c >= '0' && c <= '9'; }) &&
      file.size() - colon - 1 <= 9) {
    p.line = std::stoll(std::string(file.substr(colon + 1)));
    file = file.substr(0, colon);
  }
  p.filename = std::string(file);
  return p;
}

std::string snapshot_to_pickle(const Snapshot& snap, const SnapshotMeta& meta) {
  PickleWriter w;
  emit(w, snap, meta);
  return w.finish();
}

std::string snapshot_to_json(const Snapshot& snap, const SnapshotMeta& meta) {
  JsonWriter w;
  emit(w, snap, meta);
  return w.finish();
}

bool wants_json(std::string_view path) noexcept {
  if (path.size() < 5) return false;
  const std::string_view ext = path.substr(path.size() - 5);
  return std::equal(ext.begin(), ext.end(), ".json", [](char a, char b) {
    return (a >= 'A' && a <= 'Z' ? static_cast<char>(a - 'A' + 'a') : a) == b;
  });
}

void write_snapshot_file(const Snapshot& snap, const std::string& path, const SnapshotMeta& meta) {
  if (path.empty()) throw error("dump_snapshot: empty path");
  const std::string data = wants_json(path) ? snapshot_to_json(snap, meta) : snapshot_to_pickle(snap, meta);
  const std::string tmp = fmt::format("{}.tmp.{}", path, static_cast<long>(::getpid()));
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) throw error(fmt::format("dump_snapshot: cannot create {}: {}", tmp, std::strerror(errno)));
  const bool written = std::fwrite(data.data(), 1, data.size(), f) == data.size();
  const int write_errno = errno;
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed) {
    std::remove(tmp.c_str());
    throw error(fmt::format("dump_snapshot: cannot write {}: {}", tmp, std::strerror(written ? errno : write_errno)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    throw error(fmt::format("dump_snapshot: cannot rename {} to {}: {}", tmp, path, std::strerror(e)));
  }
}

}  // namespace stitch::detail
