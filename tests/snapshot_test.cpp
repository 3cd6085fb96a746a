// Tests of memory snapshots: Allocator::snapshot/dump_snapshot/record_history, the pickle and JSON
// files in PyTorch's schema (what torch.cuda.memory._dump_snapshot writes and memory_viz reads),
// reading them back with the safe reader, the oom_snapshot hook and the C API.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tools/formats/pickle_reader.hpp"
#include "diagnostics/snapshot_writer.hpp"
#include "stitch/allocator.hpp"
#include "stitch/errors.hpp"
#include "stitch/sim_backend.hpp"
#include "stitch/stitch.h"

namespace {

namespace fs = std::filesystem;
using stitch::Allocator;
using stitch::Config;
using stitch::Snapshot;
using stitch::TraceAction;
using stitch::TraceEntry;
using stitch::detail::PyValue;

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

stitch::stream_t stream(std::uintptr_t n) { return reinterpret_cast<stitch::stream_t>(n); }

/// A fresh directory, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            ("stitch_snapshot_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  [[nodiscard]] std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<TraceAction> actions(const std::vector<TraceEntry>& trace) {
  std::vector<TraceAction> out;
  for (const TraceEntry& e : trace) out.push_back(e.action);
  return out;
}

std::string names(const std::vector<TraceAction>& a) {
  std::string out;
  for (TraceAction x : a) out += std::string(out.empty() ? "" : " ") + stitch::to_string(x);
  return out;
}

const stitch::BlockSnapshot* find_block(const Snapshot& snap, const void* p) {
  for (const auto& s : snap.segments)
    for (const auto& b : s.blocks)
      if (b.address == reinterpret_cast<std::uintptr_t>(p)) return &b;
  return nullptr;
}

/// Everything snapshot() says about the segments equals what `file` says.
void expect_same_segments(const Snapshot& file, const Snapshot& live) {
  ASSERT_EQ(file.segments.size(), live.segments.size());
  for (std::size_t i = 0; i < live.segments.size(); ++i) {
    const auto& a = file.segments[i];
    const auto& b = live.segments[i];
    EXPECT_EQ(a.device, b.device);
    EXPECT_EQ(a.address, b.address);
    EXPECT_EQ(a.total_size, b.total_size);
    EXPECT_EQ(a.allocated_size, b.allocated_size);
    EXPECT_EQ(a.active_size, b.active_size);
    EXPECT_EQ(a.requested_size, b.requested_size);
    EXPECT_EQ(a.stream, b.stream);
    EXPECT_EQ(a.segment_type, b.segment_type);
    EXPECT_EQ(a.is_expandable, b.is_expandable);
    ASSERT_EQ(a.blocks.size(), b.blocks.size()) << "segment " << i;
    for (std::size_t k = 0; k < b.blocks.size(); ++k) {
      EXPECT_EQ(a.blocks[k].address, b.blocks[k].address);
      EXPECT_EQ(a.blocks[k].size, b.blocks[k].size);
      EXPECT_EQ(a.blocks[k].requested_size, b.blocks[k].requested_size);
      EXPECT_EQ(a.blocks[k].state, b.blocks[k].state);
    }
  }
}

/// The file's trace is a prefix of the live one (later snapshot() calls append `snapshot` entries).
void expect_trace_prefix(const std::vector<TraceEntry>& file, const std::vector<TraceEntry>& live) {
  ASSERT_LE(file.size(), live.size());
  for (std::size_t i = 0; i < file.size(); ++i) {
    SCOPED_TRACE("trace entry " + std::to_string(i));
    EXPECT_EQ(file[i].action, live[i].action);
    EXPECT_EQ(file[i].addr, live[i].addr);
    EXPECT_EQ(file[i].size, live[i].size);
    EXPECT_EQ(file[i].stream, live[i].stream);
    EXPECT_EQ(file[i].time_us, live[i].time_us);
    EXPECT_EQ(file[i].frames, live[i].frames);
  }
}

/// Totals of the snapshot agree with the statistics.
void expect_consistent_with_stats(const Allocator& a, const Snapshot& snap, int device) {
  const stitch::DeviceStats st = a.stats(device);
  std::int64_t reserved = 0, allocated = 0, active = 0, allocations = 0, requested = 0;
  for (const auto& s : snap.segments) {
    if (s.device != device) continue;
    std::size_t tiled = 0;
    std::uintptr_t next = s.address;
    for (const auto& b : s.blocks) {
      EXPECT_EQ(b.address, next) << "blocks must tile their segment";
      next += b.size;
      tiled += b.size;
      if (b.state == "active_allocated") {
        allocated += static_cast<std::int64_t>(b.size);
        ++allocations;
      }
      if (b.state != "inactive") {
        active += static_cast<std::int64_t>(b.size);
        requested += static_cast<std::int64_t>(b.requested_size);
      }
    }
    EXPECT_EQ(tiled, s.total_size);
    reserved += static_cast<std::int64_t>(s.total_size);
  }
  EXPECT_EQ(reserved, st.reserved_bytes[stitch::kAll].current);
  EXPECT_EQ(allocated, st.allocated_bytes[stitch::kAll].current);
  EXPECT_EQ(active, st.active_bytes[stitch::kAll].current);
  EXPECT_EQ(allocations, st.allocation[stitch::kAll].current);
  EXPECT_EQ(requested, st.requested_bytes[stitch::kAll].current);
}

struct SimAllocator {
  explicit SimAllocator(const std::string& conf, std::size_t capacity = std::size_t{1} << 30) {
    stitch::SimBackend::Options o;
    o.capacity = capacity;
    sim = std::make_shared<stitch::SimBackend>(o);
    alloc = std::make_unique<Allocator>(Config::parse(conf), sim);
  }
  std::shared_ptr<stitch::SimBackend> sim;
  std::unique_ptr<Allocator> alloc;
};

// ---- round trips ------------------------------------------------------------------------------

TEST(Snapshot, RoundTripWithAPendingCrossStreamBlock) {
  TempDir dir;
  SimAllocator s("backend:sim,record_history:True");
  Allocator& a = *s.alloc;
  const auto s1 = stream(0x10);
  const auto s2 = stream(0x20);

  void* p1 = a.allocate(1000);
  void* p2 = a.allocate(3 * MiB);
  void* p3 = a.allocate(5 * MiB);
  a.deallocate(p2);
  void* p4 = a.allocate(64 * KiB, s1);
  a.record_stream(p4, s2);
  s.sim->hold_stream(s2);
  a.deallocate(p4);  // waits for s2: active_pending_free

  const std::string pickle = dir.file("snap.pickle");
  const std::string json = dir.file("snap.json");
  a.dump_snapshot(pickle);
  a.dump_snapshot(json);
  const Snapshot live = a.snapshot();

  const Snapshot file = stitch::formats::read_snapshot_file(pickle);
  expect_same_segments(file, live);
  ASSERT_EQ(file.device_traces.size(), 1u);
  expect_trace_prefix(file.device_traces[0], live.device_traces[0]);
  expect_consistent_with_stats(a, file, 0);

  // Every live block, with its state.
  for (void* p : {p1, p3}) {
    const auto* b = find_block(file, p);
    ASSERT_NE(b, nullptr);
    const auto info = a.find(p);
    ASSERT_TRUE(info.has_value());
    EXPECT_EQ(b->state, "active_allocated");
    EXPECT_EQ(b->size, info->size);
    EXPECT_EQ(b->requested_size, info->requested);
  }
  const auto* pending = find_block(file, p4);
  ASSERT_NE(pending, nullptr);
  EXPECT_EQ(pending->state, "active_pending_free");
  EXPECT_EQ(pending->requested_size, 64 * KiB);
  const auto* freed = find_block(file, p2);
  ASSERT_NE(freed, nullptr);
  EXPECT_EQ(freed->state, "inactive");
  EXPECT_EQ(freed->requested_size, 0u);

  // The history, event by event.
  using A = TraceAction;
  const std::vector<A> expected = {A::segment_alloc, A::alloc,          A::segment_alloc,  A::alloc,
                                   A::alloc,         A::free_requested, A::free_completed, A::segment_alloc,
                                   A::alloc,         A::free_requested, A::snapshot};
  EXPECT_EQ(names(actions(file.device_traces[0])), names(expected));
  const auto& t = file.device_traces[0];
  ASSERT_EQ(t.size(), expected.size());
  EXPECT_EQ(t[0].size, 2 * MiB);   // the small-pool segment
  EXPECT_EQ(t[1].addr, reinterpret_cast<std::uintptr_t>(p1));
  EXPECT_EQ(t[1].size, 1000u);     // alloc entries carry the requested size
  EXPECT_EQ(t[2].size, 20 * MiB);  // 1-10 MiB requests share a 20 MiB segment
  EXPECT_EQ(t[5].addr, reinterpret_cast<std::uintptr_t>(p2));
  EXPECT_EQ(t[7].stream, 0x10u);
  EXPECT_EQ(t[9].addr, reinterpret_cast<std::uintptr_t>(p4));
  for (std::size_t i = 1; i < t.size(); ++i) EXPECT_LE(t[i - 1].time_us, t[i].time_us);

  // The settings travel along, without the recorder's switch.
  EXPECT_EQ(file.settings, "backend:sim");
  EXPECT_EQ(file.max_split_size, SIZE_MAX);
  EXPECT_FALSE(file.expandable_segments);
  EXPECT_EQ(file.roundup_power2_divisions, std::vector<std::uint32_t>(16, 0));

  // JSON: the same structure.
  const std::string text = read_text(json);
  for (const char* key : {"\"segments\":", "\"device_traces\":", "\"allocator_settings\":", "\"blocks\":",
                          "\"active_pending_free\"", "\"segment_pool_id\":[0,0]", "\"max_split_size\":-1",
                          "\"roundup_power2_divisions\":{\"1\":0,", "\"stitch\":{\"version\":"})
    EXPECT_NE(text.find(key), std::string::npos) << key;

  // Once s2 completes, the next allocation reclaims the block: free_completed.
  s.sim->release_stream(s2);
  void* p5 = a.allocate(64 * KiB, s1);
  a.dump_snapshot(pickle);
  const Snapshot later = stitch::formats::read_snapshot_file(pickle);
  const auto tail = actions(later.device_traces[0]);
  ASSERT_GE(tail.size(), 3u);
  EXPECT_EQ(names({tail.end() - 3, tail.end()}), "free_completed alloc snapshot");
  EXPECT_EQ(later.device_traces[0][later.device_traces[0].size() - 3].addr, reinterpret_cast<std::uintptr_t>(p4));
  EXPECT_EQ(find_block(later, p4)->state, "active_allocated");  // p5 reuses p4's block
  EXPECT_EQ(p5, p4);

  for (void* p : {p1, p3, p5}) a.deallocate(p);
  a.validate();
}

TEST(Snapshot, RoundTripWithExpandableSegments) {
  TempDir dir;
  SimAllocator s("backend:sim,record_history:True,expandable_segments:True");
  Allocator& a = *s.alloc;
  void* p1 = a.allocate(3 * MiB);
  void* p2 = a.allocate(300 * KiB);
  void* p3 = a.allocate(7 * MiB);
  a.deallocate(p1);

  const std::string pickle = dir.file("exp.pickle");
  a.dump_snapshot(pickle);
  const Snapshot live = a.snapshot();
  const Snapshot file = stitch::formats::read_snapshot_file(pickle);
  expect_same_segments(file, live);
  expect_trace_prefix(file.device_traces[0], live.device_traces[0]);
  expect_consistent_with_stats(a, file, 0);
  EXPECT_TRUE(file.expandable_segments);
  ASSERT_FALSE(file.segments.empty());
  for (const auto& seg : file.segments) EXPECT_TRUE(seg.is_expandable);
  for (void* p : {p2, p3}) EXPECT_EQ(find_block(file, p)->state, "active_allocated");

  // Expandable segments grow by mapping: segment_map, never segment_alloc.
  const auto acts = actions(file.device_traces[0]);
  EXPECT_EQ(std::count(acts.begin(), acts.end(), TraceAction::segment_alloc), 0) << names(acts);
  EXPECT_GE(std::count(acts.begin(), acts.end(), TraceAction::segment_map), 2) << names(acts);
  EXPECT_EQ(std::count(acts.begin(), acts.end(), TraceAction::alloc), 3);
  EXPECT_EQ(acts.back(), TraceAction::snapshot);

  // Freeing everything and emptying the cache unmaps the pages: segment_unmap, no segments left.
  a.deallocate(p2);
  a.deallocate(p3);
  a.empty_cache();
  a.dump_snapshot(pickle);
  const Snapshot after = stitch::formats::read_snapshot_file(pickle);
  EXPECT_TRUE(after.segments.empty());
  const auto acts2 = actions(after.device_traces[0]);
  EXPECT_GE(std::count(acts2.begin(), acts2.end(), TraceAction::segment_unmap), 1) << names(acts2);
  // Mapped minus unmapped bytes over the whole history is what is still reserved: nothing.
  std::int64_t mapped = 0;
  for (const auto& e : after.device_traces[0]) {
    if (e.action == TraceAction::segment_map) mapped += static_cast<std::int64_t>(e.size);
    if (e.action == TraceAction::segment_unmap) mapped -= static_cast<std::int64_t>(e.size);
  }
  EXPECT_EQ(mapped, 0);
  EXPECT_EQ(a.stats(0).reserved_bytes[stitch::kAll].current, 0);
}

TEST(Snapshot, TwoDevicesGetTwoTraces) {
  TempDir dir;
  stitch::SimBackend::Options o;
  o.devices = 2;
  o.capacity = std::size_t{256} << 20;
  Allocator a(Config::parse("backend:sim,record_history:True"), std::make_shared<stitch::SimBackend>(o));
  void* p0 = a.allocate(4096, nullptr, 0);
  void* p1 = a.allocate(8192, nullptr, 1);
  a.dump_snapshot(dir.file("two.pickle"));
  const Snapshot file = stitch::formats::read_snapshot_file(dir.file("two.pickle"));
  ASSERT_EQ(file.device_traces.size(), 2u);
  EXPECT_EQ(find_block(file, p0)->size, 4096u);
  EXPECT_EQ(find_block(file, p1)->size, 8192u);
  std::set<int> devices;
  for (const auto& s : file.segments) devices.insert(s.device);
  EXPECT_EQ(devices, (std::set<int>{0, 1}));
  expect_consistent_with_stats(a, file, 0);
  expect_consistent_with_stats(a, file, 1);
  a.deallocate(p0);
  a.deallocate(p1);
}

// ---- schema -----------------------------------------------------------------------------------

std::vector<std::string> keys(const PyValue& dict) {
  std::vector<std::string> out;
  for (const auto& [k, v] : dict.entries()) out.push_back(k.as_string());
  return out;
}

using Keys = std::vector<std::string>;
const Keys kSegmentKeys = {"device",         "address",        "total_size",      "allocated_size",
                           "active_size",    "requested_size", "stream",          "segment_type",
                           "segment_pool_id", "is_expandable", "frames",          "blocks"};
const Keys kBlockKeys = {"address", "size", "requested_size", "state", "frames"};
const Keys kTraceKeys = {"action", "addr", "size", "stream", "time_us", "frames"};
const Keys kOomKeys = {"action", "device_free", "size", "stream", "time_us", "frames"};
const Keys kSettingsKeys = {"PYTORCH_CUDA_ALLOC_CONF",       "max_split_size",
                            "garbage_collection_threshold",  "expandable_segments",
                            "pinned_num_register_threads",   "release_lock_on_cudamalloc",
                            "pinned_use_cuda_host_register", "graph_capture_record_stream_reuse",
                            "roundup_power2_divisions"};
const std::set<std::string> kStates = {"active_allocated", "active_pending_free", "inactive"};
const std::set<std::string> kActions = {"alloc",       "free_requested", "free_completed",
                                        "segment_alloc", "segment_free", "segment_map",
                                        "segment_unmap", "oom",          "snapshot"};

void check_frames(const PyValue& frames) {
  ASSERT_TRUE(frames.is_list());
  for (const PyValue& f : frames.items()) {
    ASSERT_TRUE(f.is_dict());
    EXPECT_EQ(keys(f), (Keys{"name", "filename", "line"}));
    EXPECT_TRUE(f.get("name")->is_string());
    EXPECT_TRUE(f.get("filename")->is_string());
    EXPECT_TRUE(f.get("line")->is_int());
  }
}

/// A snapshot exercising every state and action stitch writes: a pending block, an OOM, stacks.
std::string rich_snapshot_pickle(const TempDir& dir, const std::string& name) {
  SimAllocator s("backend:sim,record_history:True,record_stacks:True", 64 * MiB);
  Allocator& a = *s.alloc;
  void* p1 = a.allocate(1000);
  // The OOM first: its retry ladder waits for every stream, which would complete a pending free.
  EXPECT_THROW((void)a.allocate(100 * MiB), stitch::out_of_memory);
  void* p2 = a.allocate(12 * MiB, stream(0x10));
  a.record_stream(p2, stream(0x20));
  s.sim->hold_stream(stream(0x20));
  a.deallocate(p2);
  const std::string path = dir.file(name);
  a.dump_snapshot(path);
  s.sim->release_stream(stream(0x20));
  a.deallocate(p1);
  return path;
}

TEST(SnapshotSchema, KeysTypesStatesAndActionsAreThoseOfPyTorch) {
  TempDir dir;
  const PyValue root = stitch::formats::read_pickle_file(rich_snapshot_pickle(dir, "rich.pickle"));
  ASSERT_TRUE(root.is_dict());
  EXPECT_EQ(keys(root), (Keys{"segments", "device_traces", "allocator_settings", "external_annotations", "stitch"}));

  std::set<std::string> states;
  const PyValue& segments = *root.get("segments");
  ASSERT_TRUE(segments.is_list());
  ASSERT_FALSE(segments.items().empty());
  for (const PyValue& seg : segments.items()) {
    EXPECT_EQ(keys(seg), kSegmentKeys);
    for (const char* k : {"device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream"})
      EXPECT_TRUE(seg.get(k)->is_int()) << k;
    EXPECT_TRUE(seg.get("segment_type")->as_string() == "small" || seg.get("segment_type")->as_string() == "large");
    EXPECT_TRUE(*seg.get("segment_pool_id") == PyValue::tuple({PyValue::integer(0), PyValue::integer(0)}));
    EXPECT_TRUE(seg.get("is_expandable")->is_bool());
    check_frames(*seg.get("frames"));
    for (const PyValue& b : seg.get("blocks")->items()) {
      EXPECT_EQ(keys(b), kBlockKeys);
      for (const char* k : {"address", "size", "requested_size"}) EXPECT_TRUE(b.get(k)->is_int()) << k;
      states.insert(b.get("state")->as_string());
      check_frames(*b.get("frames"));
      if (b.get("state")->as_string() == "active_allocated")
        EXPECT_FALSE(b.get("frames")->items().empty()) << "allocated blocks carry their allocation stack";
    }
  }
  for (const auto& st : states) EXPECT_TRUE(kStates.count(st)) << st;
  EXPECT_EQ(states, kStates) << "the sample should show every state";

  const PyValue& traces = *root.get("device_traces");
  ASSERT_EQ(traces.size(), 1u);
  std::set<std::string> seen;
  for (const PyValue& e : traces.items()[0].items()) {
    const std::string action = e.get("action")->as_string();
    seen.insert(action);
    EXPECT_TRUE(kActions.count(action)) << action;
    EXPECT_EQ(keys(e), action == "oom" ? kOomKeys : kTraceKeys) << action;
    for (const auto& [k, v] : e.entries())
      if (k.as_string() != "action" && k.as_string() != "frames") EXPECT_TRUE(v.is_int()) << k.as_string();
    check_frames(*e.get("frames"));
  }
  for (const char* a : {"alloc", "free_requested", "segment_alloc", "oom", "snapshot"}) EXPECT_TRUE(seen.count(a)) << a;

  const PyValue& settings = *root.get("allocator_settings");
  EXPECT_EQ(keys(settings), kSettingsKeys);
  EXPECT_TRUE(settings.get("PYTORCH_CUDA_ALLOC_CONF")->is_string());
  EXPECT_EQ(settings.get("max_split_size")->as_int(), -1);
  EXPECT_TRUE(settings.get("garbage_collection_threshold")->is_float());
  EXPECT_TRUE(settings.get("expandable_segments")->is_bool());
  EXPECT_EQ(settings.get("pinned_num_register_threads")->as_int(), 1);
  const PyValue& div = *settings.get("roundup_power2_divisions");
  EXPECT_EQ(keys(div), (Keys{"1", "2", "4", "8", "16", "32", "64", "128", "256", "512", "1024", "2048", "4096",
                             "8192", "16384", "32768"}));
  EXPECT_TRUE(root.get("external_annotations")->is_list());
  const PyValue& meta = *root.get("stitch");
  EXPECT_EQ(meta.get("backend")->as_string(), "sim");
  EXPECT_EQ(meta.get("device_count")->as_int(), 1);
}

TEST(SnapshotSchema, MatchesTheKeysOfRealPyTorchSnapshots) {
  const char* env = std::getenv("STITCH_TRACES_DIR");
  const fs::path dir = env != nullptr ? fs::path(env) : fs::path("/work/shared/traces");
  std::error_code ec;
  std::vector<fs::path> files;
  if (fs::is_directory(dir, ec))
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().extension() == ".pickle") files.push_back(e.path());
  if (files.empty()) GTEST_SKIP() << "no PyTorch snapshots in " << dir;
  std::sort(files.begin(), files.end());
  // One file is enough to pin the layout down; the smallest keeps the test fast.
  const fs::path f = *std::min_element(files.begin(), files.end(), [](const fs::path& a, const fs::path& b) {
    return fs::file_size(a) < fs::file_size(b);
  });
  const PyValue real = stitch::formats::read_pickle_file(f.string());
  for (const PyValue& seg : real.get("segments")->items()) {
    std::vector<std::string> k = keys(seg);
    std::vector<std::string> want = kSegmentKeys;
    std::sort(k.begin(), k.end());
    std::sort(want.begin(), want.end());
    ASSERT_EQ(k, want) << f;
    for (const PyValue& b : seg.get("blocks")->items()) ASSERT_EQ(keys(b), kBlockKeys) << f;
  }
  for (const PyValue& e : real.get("device_traces")->items()[0].items()) {
    // PyTorch omits frames for `snapshot` entries and adds compile_context/user_metadata in newer
    // builds; everything the viewer reads is in stitch's entries.
    for (const auto& [k, v] : e.entries()) {
      const std::string key = k.as_string();
      if (key == "compile_context" || key == "user_metadata") continue;
      EXPECT_TRUE(std::find(kTraceKeys.begin(), kTraceKeys.end(), key) != kTraceKeys.end() ||
                  key == "device_free")
          << key;
    }
  }
  if (const PyValue* settings = real.get("allocator_settings")) {
    for (const auto& [k, v] : settings->entries())
      EXPECT_TRUE(std::find(kSettingsKeys.begin(), kSettingsKeys.end(), k.as_string()) != kSettingsKeys.end())
          << k.as_string();
  }
}

// The opcodes the JavaScript unpickler of pytorch.org/memory_viz (torch/utils/viz/MemoryViz.js)
// implements; anything else makes it throw "UNKNOWN OPCODE".
TEST(SnapshotSchema, UsesOnlyOpcodesTheWebViewerParses) {
  TempDir dir;
  const std::string data = read_text(rich_snapshot_pickle(dir, "ops.pickle"));
  std::map<unsigned char, std::size_t> used;
  std::size_t i = 0;
  auto le = [&](std::size_t at, std::size_t n) {
    std::uint64_t v = 0;
    for (std::size_t k = n; k > 0; --k) v = (v << 8) | static_cast<unsigned char>(data[at + k - 1]);
    return v;
  };
  bool stopped = false;
  while (i < data.size() && !stopped) {
    const auto op = static_cast<unsigned char>(data[i++]);
    ++used[op];
    switch (op) {
      case 0x80: i += 1; break;                    // PROTO
      case 0x95: i += 8; break;                    // FRAME
      case '}': case ']': case ')': case '(': case 'u': case 'e': case 'a': case 's': case 't':
      case 0x85: case 0x86: case 0x87: case 'N': case 0x88: case 0x89: case 0x94: case 'd': case 'l':
        break;
      case 'J': i += 4; break;                     // BININT
      case 'K': i += 1; break;                     // BININT1
      case 'M': i += 2; break;                     // BININT2
      case 0x8a: i += 1 + le(i, 1); break;         // LONG1
      case 'G': i += 8; break;                     // BINFLOAT
      case 0x8c: i += 1 + le(i, 1); break;         // SHORT_BINUNICODE
      case 'X': i += 4 + le(i, 4); break;          // BINUNICODE
      case 'h': case 'q': i += 1; break;           // BINGET, BINPUT
      case 'j': case 'r': i += 4; break;           // LONG_BINGET, LONG_BINPUT
      case '.': stopped = true; break;
      default: FAIL() << "opcode 0x" << std::hex << int(op) << " at offset " << std::dec << i - 1
                      << " is not one MemoryViz.js implements";
    }
  }
  EXPECT_TRUE(stopped);
  EXPECT_EQ(i, data.size());
  EXPECT_EQ(static_cast<unsigned char>(data[1]), 4) << "protocol 2 to 4 only";
  EXPECT_GT(used['h'] + used['j'], 0u) << "repeated strings are memoized";
}

TEST(SnapshotSchema, SplitsFramesIntoNameFileAndLine) {
  using stitch::detail::split_frame;
  auto f = split_frame("stitch::Allocator::allocate(unsigned long, void*, int) (/usr/lib/libstitch.so.0)");
  EXPECT_EQ(f.name, "stitch::Allocator::allocate(unsigned long, void*, int)");
  EXPECT_EQ(f.filename, "/usr/lib/libstitch.so.0");
  EXPECT_EQ(f.line, 0);
  f = split_frame("forward (/home/x/model.py:22)");
  EXPECT_EQ(f.name, "forward");
  EXPECT_EQ(f.filename, "/home/x/model.py");
  EXPECT_EQ(f.line, 22);
  f = split_frame("0x7f12 (?)");
  EXPECT_EQ(f.name, "0x7f12");
  EXPECT_EQ(f.filename, "?");
  f = split_frame("no file here");
  EXPECT_EQ(f.name, "no file here");
  EXPECT_EQ(f.filename, "??");
}

// ---- record_history ---------------------------------------------------------------------------

TEST(Snapshot, RecordHistoryTurnsTracingOnAndOffOnEveryDevice) {
  stitch::SimBackend::Options o;
  o.devices = 2;
  o.capacity = std::size_t{256} << 20;
  Allocator a(Config::parse("backend:sim,max_split_size_mb:64"), std::make_shared<stitch::SimBackend>(o));
  EXPECT_TRUE(a.snapshot().device_traces[0].empty());
  a.record_history(true, 8);
  for (int i = 0; i < 20; ++i) a.deallocate(a.allocate(4096, nullptr, i % 2));
  const Snapshot snap = a.snapshot();
  ASSERT_EQ(snap.device_traces.size(), 2u);
  EXPECT_EQ(snap.device_traces[0].size(), 8u);  // the ring buffer keeps the newest 8
  EXPECT_EQ(snap.device_traces[1].size(), 8u);
  EXPECT_EQ(snap.device_traces[0].back().action, TraceAction::snapshot);
  // The user's settings string is what the snapshot reports, not record_history's.
  EXPECT_EQ(snap.settings, "backend:sim,max_split_size_mb:64");
  EXPECT_TRUE(a.config().record_history);
  EXPECT_EQ(a.config().max_entries, 8u);
  a.record_history(false);
  EXPECT_TRUE(a.snapshot().device_traces[0].empty());
  EXPECT_FALSE(a.config().record_history);
}

// ---- oom_snapshot -----------------------------------------------------------------------------

TEST(Snapshot, OomSnapshotIsWrittenAndTheOomStillThrown) {
  TempDir dir;
  const std::string path = dir.file("oom.pickle");
  SimAllocator s("backend:sim,record_history:True,oom_snapshot:" + path, 64 * MiB);
  Allocator& a = *s.alloc;
  void* keep = a.allocate(10 * MiB);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_THROW((void)a.allocate(100 * MiB), stitch::out_of_memory);
  ASSERT_TRUE(fs::exists(path));
  const PyValue root = stitch::formats::read_pickle_file(path);
  const auto& trace = root.get("device_traces")->items()[0].items();
  ASSERT_GE(trace.size(), 2u);
  const PyValue& oom = trace[trace.size() - 2];  // then the dump's own `snapshot` entry
  EXPECT_EQ(oom.get("action")->as_string(), "oom");
  EXPECT_EQ(oom.get("addr"), nullptr);
  ASSERT_NE(oom.get("device_free"), nullptr);
  EXPECT_EQ(oom.get("device_free")->as_uint(), s.sim->memory_info(0).free);
  EXPECT_GE(oom.get("size")->as_uint(), 100 * MiB);
  const Snapshot snap = stitch::formats::snapshot_from_pyvalue(root, path);
  EXPECT_NE(find_block(snap, keep), nullptr);
  // Each OOM rewrites the file; JSON when the path says so.
  a.configure("oom_snapshot:" + dir.file("oom.json"));
  EXPECT_THROW((void)a.allocate(200 * MiB), stitch::out_of_memory);
  EXPECT_NE(read_text(dir.file("oom.json")).find("\"device_free\":"), std::string::npos);
  a.deallocate(keep);
}

TEST(Snapshot, OomSnapshotFailureDoesNotMaskTheOom) {
  SimAllocator s("backend:sim,oom_snapshot:/nonexistent-stitch-dir/oom.pickle", 64 * MiB);
  testing::internal::CaptureStderr();
  EXPECT_THROW((void)s.alloc->allocate(100 * MiB), stitch::out_of_memory);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("stitch: oom_snapshot: dump_snapshot: cannot create /nonexistent-stitch-dir/oom.pickle"),
            std::string::npos)
      << err;
  EXPECT_EQ(s.alloc->stats(0).num_ooms, 1);
}

TEST(Snapshot, DumpSnapshotReportsUnwritablePaths) {
  SimAllocator s("backend:sim");
  try {
    s.alloc->dump_snapshot("/nonexistent-stitch-dir/x.pickle");
    FAIL() << "no error";
  } catch (const stitch::error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-stitch-dir/x.pickle"), std::string::npos) << e.what();
  }
  EXPECT_THROW(s.alloc->dump_snapshot(""), stitch::error);
}

// ---- C API ------------------------------------------------------------------------------------

TEST(SnapshotCApi, RecordHistoryAndDumpSnapshot) {
  // The process-wide allocator, as the C API tests configure it.
  ASSERT_EQ(stitch_configure("backend:sim,sim_capacity_mb:1024"), 0) << stitch_last_error();
  TempDir dir;
  ASSERT_EQ(stitch_record_history(1, 1000), 0) << stitch_last_error();
  void* p = stitch_malloc(5000, 0, nullptr);
  ASSERT_NE(p, nullptr);
  const std::string path = dir.file("capi.pickle");
  ASSERT_EQ(stitch_dump_snapshot(path.c_str()), 0) << stitch_last_error();
  const Snapshot snap = stitch::formats::read_snapshot_file(path);
  const auto* b = find_block(snap, p);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->state, "active_allocated");
  EXPECT_EQ(b->requested_size, 5000u);
  ASSERT_GE(snap.device_traces[0].size(), 2u);
  EXPECT_EQ(snap.device_traces[0][snap.device_traces[0].size() - 2].action, TraceAction::alloc);
  ASSERT_EQ(stitch_dump_snapshot(dir.file("capi.json").c_str()), 0) << stitch_last_error();
  EXPECT_EQ(read_text(dir.file("capi.json")).front(), '{');
  stitch_free(p, 5000, 0, nullptr);

  EXPECT_NE(stitch_dump_snapshot(nullptr), 0);
  EXPECT_NE(std::string(stitch_last_error()).find("NULL"), std::string::npos);
  EXPECT_NE(stitch_dump_snapshot("/nonexistent-stitch-dir/x.pickle"), 0);
  EXPECT_NE(std::string(stitch_last_error()).find("cannot create"), std::string::npos);
  ASSERT_EQ(stitch_record_history(0, 0), 0) << stitch_last_error();
  ASSERT_EQ(stitch_dump_snapshot(path.c_str()), 0);
  EXPECT_TRUE(stitch::formats::read_snapshot_file(path).device_traces[0].empty());
}

TEST(SnapshotCApi, RecordHistoryBeforeTheAllocatorExistsLeavesTheBackendOpen) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        // A fresh process: recording is requested before any configuration.
        if (stitch_record_history(1, 50) != 0) std::_Exit(10);
        if (stitch_configure("backend:sim,sim_capacity_mb:256") != 0) std::_Exit(11);
        void* p = stitch_malloc(4096, 0, nullptr);
        if (p == nullptr) std::_Exit(12);
        stitch_free(p, 4096, 0, nullptr);
        const std::string path = fs::temp_directory_path() / ("stitch_early_" + std::to_string(::getpid()) + ".pickle");
        if (stitch_dump_snapshot(path.c_str()) != 0) std::_Exit(13);
        const Snapshot snap = stitch::formats::read_snapshot_file(path);
        fs::remove(path);
        if (snap.device_traces.empty() || snap.device_traces[0].size() != 5) std::_Exit(14);  // segment_alloc alloc free_requested free_completed snapshot
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

// ---- sample files for tests/python/check_snapshot_schema.py -----------------------------------

// Writes sample snapshots (pickle and JSON; plain, with a pending block and an OOM, and with
// expandable segments) to $STITCH_SNAPSHOT_SAMPLE_DIR, or to a temporary directory when unset.
TEST(SnapshotFile, WritesSamplesForThePythonCheck) {
  const char* env = std::getenv("STITCH_SNAPSHOT_SAMPLE_DIR");
  TempDir tmp;
  auto out = [&](const std::string& name) { return env != nullptr ? (fs::path(env) / name).string() : tmp.file(name); };
  {
    SimAllocator s("backend:sim,record_history:True,record_stacks:True", 64 * MiB);
    Allocator& a = *s.alloc;
    void* p1 = a.allocate(1000);
    void* p2 = a.allocate(3 * MiB);
    void* big = a.allocate(30 * MiB);
    a.deallocate(big);
    EXPECT_THROW((void)a.allocate(100 * MiB), stitch::out_of_memory);  // segment_free, oom
    a.empty_cache();
    void* p3 = a.allocate(5 * MiB, stream(0x10));
    a.deallocate(p2);
    a.record_stream(p3, stream(0x20));
    s.sim->hold_stream(stream(0x20));
    a.deallocate(p3);  // pending until stream 0x20 completes
    void* p4 = a.allocate(100 * KiB);
    a.dump_snapshot(out("sample.pickle"));
    a.dump_snapshot(out("sample.json"));
    s.sim->release_stream(stream(0x20));
    a.deallocate(p1);
    a.deallocate(p4);
  }
  {
    SimAllocator s("backend:sim,record_history:True,expandable_segments:True", 256 * MiB);
    Allocator& a = *s.alloc;
    std::vector<void*> live;
    for (std::size_t size : {3 * MiB, 300 * KiB, 7 * MiB, 40 * MiB, std::size_t{1000}}) live.push_back(a.allocate(size));
    a.deallocate(live[0]);
    a.deallocate(live[3]);
    a.empty_cache();
    live.push_back(a.allocate(5 * MiB));
    a.dump_snapshot(out("expandable.pickle"));
    a.dump_snapshot(out("expandable.json"));
    for (void* p : {live[1], live[2], live[4], live[5]}) a.deallocate(p);
  }
  EXPECT_TRUE(fs::exists(out("sample.pickle")) && fs::exists(out("expandable.json")));
}

}  // namespace
