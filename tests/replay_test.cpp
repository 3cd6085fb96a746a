// Tests of the replay (src/replay, src/tools/stitch_replay): reading RMM logs and snapshot pickles (hostile and
// broken ones included), reconstructing the state at the start of a trace, determinism, the
// minimum-capacity search, the fidelity of a replay to what a recording allocator did (on a trace
// stitch itself recorded, and on real PyTorch traces when /work/shared/traces is there), and
// replays of the shipped generated traces.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "diagnostics/snapshot_writer.hpp"
#include "stitch/allocator.hpp"
#include "stitch/errors.hpp"
#include "stitch/sim_backend.hpp"
#include "tools/stitch_replay/replayer.hpp"
#include "tools/stitch_replay/report.hpp"
#include "tools/stitch_replay/trace_file.hpp"
#include "tools/tracegen/tracegen.hpp"
#include "replay_helpers.hpp"

namespace {

namespace fs = std::filesystem;
namespace rp = stitch::replay_cli;
namespace tg = stitch::tracegen;
using stitch::Snapshot;
using stitch::TraceAction;
using stitch::TraceEntry;

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            ("stitch_replay_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  [[nodiscard]] std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

/// read_trace_file's error message for `path` ("" if it did not throw stitch::error).
std::string read_error(const std::string& path) {
  try {
    (void)rp::read_trace_file(path);
  } catch (const stitch::error& e) {
    return e.what();
  }
  return "";
}

std::string csv_error(const std::string& text) {
  try {
    (void)rp::trace_file_from_rmm_csv(text, "log.csv");
  } catch (const stitch::error& e) {
    return e.what();
  }
  return "";
}

/// The repository's traces/ (STITCH_GENERATED_TRACES_DIR overrides).
fs::path shipped_dir() {
  if (const char* env = std::getenv("STITCH_GENERATED_TRACES_DIR")) return env;
  return fs::path(__FILE__).parent_path().parent_path() / "traces";
}

/// Real PyTorch traces (STITCH_TRACES_DIR overrides /work/shared/traces).
fs::path real_dir() {
  if (const char* env = std::getenv("STITCH_TRACES_DIR")) return env;
  return "/work/shared/traces";
}

using replay_helpers::ev;
using replay_helpers::generated;

// ---- RMM CSV -------------------------------------------------------------------------------------

constexpr const char* kHeader = "Thread,Time,Action,Pointer,Size,Stream\n";

TEST(ReplayRmmCsv, ParsesAGoodLog) {
  const std::string text = std::string(kHeader) +
                           "140245,10:00:00.000001,allocate,0x7f0000000000,1048576,0x0\n"
                           "140245,10:00:00.000002,allocate,0x7f0000100000,2048,0x5a\r\n"
                           "140245,10:00:00.000003,allocate failure,0x0,99999999999,0x0\n"
                           "\n"
                           "140245,10:00:00.000004,free,0x7f0000000000,1048576,0x0\n"
                           "140245,10:00:00.000005,free,0x7e0000000000,4096,0x0\n";
  const rp::TraceFile w = rp::trace_file_from_rmm_csv(text, "log.csv");
  ASSERT_EQ(w.devices.size(), 1u);
  const rp::DeviceWorkload& t = w.devices[0];
  ASSERT_EQ(t.events.size(), 4u);  // the failed allocation is not an event
  EXPECT_EQ(t.events[0].kind, rp::Event::Kind::alloc);
  EXPECT_EQ(t.events[0].addr, 0x7f0000000000u);
  EXPECT_EQ(t.events[0].size, 1048576u);
  EXPECT_EQ(t.events[1].stream, 0x5au);
  EXPECT_EQ(t.events[2].kind, rp::Event::Kind::free);  // free_requested: no free_completed in RMM logs
  // A block freed before the log began was live at its start.
  ASSERT_EQ(t.initial.size(), 1u);
  EXPECT_EQ(t.initial[0].addr, 0x7e0000000000u);
  EXPECT_EQ(t.initial[0].size, 4096u);
  EXPECT_FALSE(t.starts_empty);
  EXPECT_EQ(rp::peak_requested(t), 4096u + 1048576u + 2048u);
}

TEST(ReplayRmmCsv, ErrorsNameTheFileAndLine) {
  EXPECT_NE(csv_error("Time,Action,Pointer\n1,allocate,0x1\n").find("log.csv: line 1: expected the header"),
            std::string::npos);
  EXPECT_NE(csv_error(std::string(kHeader) + "1,t,allocate,0x10,16,0x0\n1,t,allocate,zz,16,0x0\n")
                .find("log.csv: line 3: bad pointer 'zz'"),
            std::string::npos);
  EXPECT_NE(csv_error(std::string(kHeader) + "1,t,allocate,0x10,12ab,0x0\n").find("log.csv: line 2: bad size '12ab'"),
            std::string::npos);
  EXPECT_NE(csv_error(std::string(kHeader) + "1,t,allocate,0x10,-5,0x0\n").find("line 2: bad size"),
            std::string::npos);
  EXPECT_NE(csv_error(std::string(kHeader) + "1,t,allocate,0x10,16,0x0\n1,t,free,0x10").find(
                "log.csv: line 3: expected 6 fields, got 4"),
            std::string::npos);
  EXPECT_NE(csv_error(std::string(kHeader) + "1,t,reallocate,0x10,16,0x0\n").find("line 2: unknown action"),
            std::string::npos);
  EXPECT_NE(csv_error("").find("log.csv: empty file"), std::string::npos);

  // Through read_trace_file, the message names the file's path.
  TempDir dir;
  const std::string path = dir.file("bad.csv");
  write_file(path, std::string(kHeader) + "1,t,allocate,0x10,16,0x0\n1,t,allocate,0x20");
  const std::string msg = read_error(path);
  EXPECT_EQ(msg.rfind(path + ": line 3: expected 6 fields", 0), 0u) << msg;
  EXPECT_NE(read_error(dir.file("missing.pickle")).find("missing.pickle: cannot open file"), std::string::npos);
}

// ---- pickles -------------------------------------------------------------------------------------

TEST(ReplayPickle, RejectsCodeExecutionNamingTheFileAndOffset) {
  TempDir dir;
  const std::string marker = dir.file("pwned");
  // pickle.dumps of os.system("touch MARKER"), protocol 4: PROTO, GLOBAL, MARK, str, TUPLE, REDUCE.
  std::string evil = std::string("\x80\x04", 2) + "cos\nsystem\n(" + "\x8c" +
                     static_cast<char>(6 + marker.size()) + "touch " + marker + "tR.";
  const std::string path = dir.file("evil.pickle");
  write_file(path, evil);
  const std::string msg = read_error(path);
  EXPECT_EQ(msg.rfind(path + ": offset 2: ", 0), 0u) << msg;
  EXPECT_NE(msg.find("GLOBAL"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(marker)) << "the pickle ran code";

  // The protocol-4 spelling: STACK_GLOBAL, then REDUCE.
  std::string evil2 = std::string("\x80\x04\x8c\x02os\x8c\x06system\x93(\x8c\x02id" "tR.", 23);
  const std::string path2 = dir.file("evil2.pickle");
  write_file(path2, evil2);
  const std::string msg2 = read_error(path2);
  EXPECT_EQ(msg2.rfind(path2 + ": offset 14: ", 0), 0u) << msg2;
  EXPECT_NE(msg2.find("STACK_GLOBAL"), std::string::npos) << msg2;
}

TEST(ReplayPickle, RejectsATruncatedSnapshotNamingTheFileAndOffset) {
  tg::Options o;
  o.steps = 1;
  const std::string bytes = tg::generate_pickle("lora", 1, o);
  TempDir dir;
  const std::string whole = dir.file("whole.pickle");
  write_file(whole, bytes);
  EXPECT_EQ(rp::read_trace_file(whole).devices.at(0).events.size(),
            tg::generate("lora", 1, o).device_traces[0].size());
  for (const std::size_t cut : {bytes.size() / 2, bytes.size() - 1, std::size_t{1}}) {
    const std::string path = dir.file("cut.pickle");
    write_file(path, bytes.substr(0, cut));
    const std::string msg = read_error(path);
    EXPECT_EQ(msg.rfind(path + ": offset ", 0), 0u) << msg;
    EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  }
}

// ---- start state -----------------------------------------------------------------------------------

stitch::SegmentSnapshot segment(std::uintptr_t addr, std::size_t size,
                                std::vector<stitch::BlockSnapshot> blocks) {
  stitch::SegmentSnapshot s;
  s.address = addr;
  s.total_size = size;
  s.segment_type = size == 2 * MiB ? "small" : "large";
  s.blocks = std::move(blocks);
  return s;
}

stitch::BlockSnapshot block(std::uintptr_t addr, std::size_t size, std::size_t requested, const char* state) {
  return stitch::BlockSnapshot{addr, size, requested, state};
}

TEST(ReplayStartState, RecordingThatBeganMidRun) {
  Snapshot s;
  s.device_traces.push_back({
      ev(TraceAction::segment_alloc, 0x400000, 20 * MiB),
      ev(TraceAction::alloc, 0x400000, 3 * MiB),            // in memory the trace obtained
      ev(TraceAction::alloc, 0x10200, 1000),                // in a segment held before the trace
      ev(TraceAction::free_requested, 0x2000000, 5 * MiB),  // allocated before the first event
      ev(TraceAction::free_completed, 0x2000000, 5 * MiB),
  });
  s.segments = {
      segment(0x10000, 2 * MiB, {block(0x10000, 512, 400, "active_allocated"),  // never allocated: initial
                                 block(0x10200, 1024, 1000, "active_allocated"),
                                 block(0x10600, 2 * MiB - 0x600, 0, "inactive")}),
      segment(0x400000, 20 * MiB, {block(0x400000, 3 * MiB, 3 * MiB, "active_allocated"),
                                   block(0x700000, MiB, MiB, "active_allocated"),  // made by the trace's memory
                                   block(0x800000, 16 * MiB, 0, "inactive")}),
  };
  const rp::TraceFile w = rp::trace_file_from_snapshot(s, "mid");
  ASSERT_EQ(w.devices.size(), 1u);
  const rp::DeviceWorkload& t = w.devices[0];
  EXPECT_FALSE(t.starts_empty);
  ASSERT_EQ(t.initial.size(), 2u);
  EXPECT_EQ(t.initial[0].addr, 0x10000u);  // address order
  EXPECT_EQ(t.initial[0].size, 400u);      // the requested size
  EXPECT_EQ(t.initial[0].block_size, 512u);  // the dump shows the block
  EXPECT_EQ(t.initial[1].addr, 0x2000000u);
  EXPECT_EQ(t.initial[1].size, 5 * MiB);
  EXPECT_EQ(t.initial[1].block_size, 0u);  // freed before the dump: unknown
  // The small segment was held before the trace (the trace did not create it).
  ASSERT_EQ(t.held_segments.size(), 1u);
  EXPECT_EQ(t.held_segments[0].addr, 0x10000u);
  EXPECT_TRUE(t.held_segments[0].small);
  EXPECT_EQ(rp::peak_requested(t), 400u + 5 * MiB + 3 * MiB + 1000u);
  EXPECT_EQ(rp::live_at_start(t), 400u + 5 * MiB);
  // Reserved at the start: the dump (22 MiB) minus the trace's net segment events (20 MiB).
  EXPECT_EQ(t.reserved_at_start, 2 * MiB);
  ASSERT_TRUE(t.recorded_peak_reserved.has_value());
  EXPECT_EQ(*t.recorded_peak_reserved, 2 * MiB + 20 * MiB);
  // The replay starts with those blocks live.
  const rp::ReplayResult r = rp::replay(t, {});
  EXPECT_EQ(r.ooms, 0u);
  EXPECT_EQ(r.peak_requested, 400u + 5 * MiB + 3 * MiB + 1000u);
}

TEST(ReplayStartState, BlocksTheTraceNeverAllocatedWereLiveBeforeIt) {
  // PyTorch clears the trace when recording stops, so a dump that carries a trace was taken
  // while recording was on: an active block the trace never allocated, outside the memory the
  // trace created, was live before the first event (the weights, typically).
  Snapshot s;
  s.device_traces.push_back({
      ev(TraceAction::segment_alloc, 0x400000, 2 * MiB),
      ev(TraceAction::alloc, 0x400000, 4096),
      ev(TraceAction::free_requested, 0x400000, 4096),
      ev(TraceAction::free_completed, 0x400000, 4096),
  });
  s.segments = {segment(0x400000, 2 * MiB, {block(0x400000, 4096, 0, "inactive"),
                                            block(0x401000, 8192, 8000, "active_allocated"),  // in traced memory
                                            block(0x403000, 2 * MiB - 0x3000, 0, "inactive")}),
                segment(0x9000000, 20 * MiB, {block(0x9000000, 20 * MiB, 20 * MiB, "active_allocated")})};
  const rp::DeviceWorkload t = rp::trace_file_from_snapshot(s, "weights").devices.at(0);
  EXPECT_FALSE(t.starts_empty);
  ASSERT_EQ(t.initial.size(), 1u);
  EXPECT_EQ(t.initial[0].addr, 0x9000000u);
  EXPECT_EQ(t.initial[0].size, 20 * MiB);
  ASSERT_EQ(t.held_segments.size(), 1u);
  EXPECT_EQ(t.held_segments[0].addr, 0x9000000u);
  EXPECT_EQ(t.reserved_at_start, 20 * MiB);
  EXPECT_EQ(rp::cached_at_start(t), 0u);
  EXPECT_EQ(rp::peak_requested(t), 20 * MiB + 4096u);
  EXPECT_EQ(t.recorded_peak_reserved.value_or(0), 22 * MiB);
}

TEST(ReplayStartState, AnEmptyStartIsSeenAsSuch) {
  Snapshot s;
  s.device_traces.push_back({
      ev(TraceAction::segment_alloc, 0x400000, 2 * MiB),
      ev(TraceAction::alloc, 0x400000, 4096),
      ev(TraceAction::free_requested, 0x400000, 4096),
      ev(TraceAction::free_completed, 0x400000, 4096),
  });
  s.segments = {segment(0x400000, 2 * MiB, {block(0x400000, 2 * MiB, 0, "inactive")})};
  const rp::DeviceWorkload t = rp::trace_file_from_snapshot(s, "empty").devices.at(0);
  EXPECT_TRUE(t.starts_empty);
  EXPECT_TRUE(t.initial.empty());
  EXPECT_TRUE(t.held_segments.empty());
  EXPECT_EQ(t.reserved_at_start, 0u);
  EXPECT_EQ(rp::peak_requested(t), 4096u);
  EXPECT_EQ(t.recorded_peak_reserved.value_or(0), 2 * MiB);
}

TEST(ReplayStartState, SegmentsGivenBackBeforeBeingCreatedWereHeld) {
  // A warm cache emptied at the start of the window (empty_cache): every freed segment was held,
  // and the recording's peak is the start itself.
  Snapshot s;
  s.device_traces.push_back({
      ev(TraceAction::segment_free, 0x1000000, 20 * MiB),
      ev(TraceAction::segment_free, 0x3000000, 40 * MiB),
      ev(TraceAction::segment_alloc, 0x8000000, 20 * MiB),
      ev(TraceAction::alloc, 0x8000000, 6 * MiB),
  });
  s.segments = {segment(0x8000000, 20 * MiB, {block(0x8000000, 6 * MiB, 6 * MiB, "active_allocated"),
                                              block(0x8600000, 14 * MiB, 0, "inactive")}),
                segment(0xA000000, 20 * MiB, {block(0xA000000, 20 * MiB, 20 * MiB, "active_allocated")})};
  const rp::DeviceWorkload t = rp::trace_file_from_snapshot(s, "warm").devices.at(0);
  ASSERT_EQ(t.held_segments.size(), 3u);
  EXPECT_EQ(t.held_segments[0].addr, 0x1000000u);
  EXPECT_EQ(t.held_segments[1].addr, 0x3000000u);
  EXPECT_EQ(t.held_segments[1].size, 40 * MiB);
  EXPECT_EQ(t.held_segments[2].addr, 0xA000000u);
  EXPECT_EQ(t.reserved_at_start, 80 * MiB);  // 40 in the dump, minus -40 of net events
  EXPECT_EQ(t.recorded_peak_reserved.value_or(0), 80 * MiB);
  EXPECT_EQ(rp::cached_at_start(t), 60 * MiB);
  // The run of segment_free left no entirely free segment cached: a full release.
  EXPECT_EQ(t.events[0].kind, rp::Event::Kind::release);
  EXPECT_EQ(t.events[1].kind, rp::Event::Kind::none);
}

TEST(ReplayStartState, APartialReleaseIsReplayedSegmentBySegment) {
  // Two free 40 MiB segments; the recording gave back one (garbage collection) and kept the
  // other cached: release_segment, not empty_cache.
  Snapshot s;
  s.device_traces.push_back({
      ev(TraceAction::segment_alloc, 0x1000000, 40 * MiB),
      ev(TraceAction::alloc, 0x1000000, 40 * MiB),
      ev(TraceAction::segment_alloc, 0x4000000, 40 * MiB),
      ev(TraceAction::alloc, 0x4000000, 40 * MiB),
      ev(TraceAction::free_requested, 0x1000000, 40 * MiB),
      ev(TraceAction::free_completed, 0x1000000, 40 * MiB),
      ev(TraceAction::free_requested, 0x4000000, 40 * MiB),
      ev(TraceAction::free_completed, 0x4000000, 40 * MiB),
      ev(TraceAction::segment_free, 0x1000000, 40 * MiB),
  });
  s.segments = {segment(0x4000000, 40 * MiB, {block(0x4000000, 40 * MiB, 0, "inactive")})};
  const rp::DeviceWorkload t = rp::trace_file_from_snapshot(s, "gc").devices.at(0);
  EXPECT_EQ(t.events[8].kind, rp::Event::Kind::release_segment);
  EXPECT_EQ(t.events[8].size, 40 * MiB);
  // The fidelity replay gives back that one segment and keeps the other.
  const auto f = rp::fidelity(t, stitch::Config{});
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->replayed_peak_reserved, 80 * MiB);
  EXPECT_EQ(f->releases, 1u);
  rp::ReplayOptions o;
  o.warm_start = true;
  o.honour_releases = true;
  std::size_t requested = 0;
  const Snapshot after = rp::snapshot_after(t, o, t.events.size(), requested);
  ASSERT_EQ(after.segments.size(), 1u);
  EXPECT_EQ(after.segments[0].total_size, 40 * MiB);
}

TEST(ReplayStartState, ExpandableRunsHeldAtTheStartAreTheDumpWithTheTraceUndone) {
  // One stream's expandable range: at the dump, [0, 60) MiB and [80, 100) MiB are mapped; the
  // trace mapped [40, 60) and unmapped [60, 80): at the start [0, 40) and [60, 100) were mapped.
  const std::uintptr_t base = 0x40000000;
  Snapshot s;
  s.device_traces.push_back({
      ev(TraceAction::alloc, base + 2 * MiB, 30 * MiB),
      ev(TraceAction::segment_map, base + 40 * MiB, 20 * MiB),
      ev(TraceAction::segment_unmap, base + 60 * MiB, 20 * MiB),
  });
  stitch::SegmentSnapshot a = segment(base, 60 * MiB, {block(base, 2 * MiB, 2 * MiB, "active_allocated"),
                                                       block(base + 2 * MiB, 30 * MiB, 30 * MiB, "active_allocated"),
                                                       block(base + 32 * MiB, 28 * MiB, 0, "inactive")});
  stitch::SegmentSnapshot b = segment(base + 80 * MiB, 20 * MiB, {block(base + 80 * MiB, 20 * MiB, 0, "inactive")});
  a.is_expandable = b.is_expandable = true;
  s.segments = {a, b};
  const rp::DeviceWorkload t = rp::trace_file_from_snapshot(s, "expandable").devices.at(0);
  ASSERT_EQ(t.held_segments.size(), 2u);
  EXPECT_TRUE(t.held_segments[0].expandable);
  EXPECT_EQ(t.held_segments[0].addr, base);
  EXPECT_EQ(t.held_segments[0].size, 40 * MiB);
  EXPECT_EQ(t.held_segments[1].addr, base + 60 * MiB);
  EXPECT_EQ(t.held_segments[1].size, 40 * MiB);
  EXPECT_FALSE(t.held_segments[1].small);
  EXPECT_EQ(t.reserved_at_start, 80 * MiB);
  ASSERT_EQ(t.initial.size(), 1u);  // the 2 MiB block; the 30 MiB one came in the trace
  EXPECT_EQ(t.initial[0].addr, base);
  // Seeded under expandable segments, the runs sit where they were relative to each other, the
  // live block in its place.
  rp::ReplayOptions o;
  o.settings = stitch::Config::parse("backend:sim,expandable_segments:True");
  o.warm_start = true;
  std::size_t requested = 0;
  const Snapshot start = rp::snapshot_after(t, o, 0, requested);
  EXPECT_EQ(requested, 2 * MiB);
  ASSERT_EQ(start.segments.size(), 2u);
  std::size_t mapped = 0;
  for (const auto& seg : start.segments) mapped += seg.total_size;
  EXPECT_EQ(mapped, 80 * MiB);
  const auto lo = std::min(start.segments[0].address, start.segments[1].address);
  const auto hi = std::max(start.segments[0].address, start.segments[1].address);
  EXPECT_EQ(hi - lo, 60 * MiB);
}

// ---- replays ---------------------------------------------------------------------------------------

void expect_same(const rp::ReplayResult& a, const rp::ReplayResult& b) {
  EXPECT_EQ(a.events, b.events);
  EXPECT_EQ(a.peak_requested, b.peak_requested);
  EXPECT_EQ(a.peak_reserved, b.peak_reserved);
  EXPECT_EQ(a.peak_unallocated, b.peak_unallocated);
  EXPECT_EQ(a.largest_free_at_worst, b.largest_free_at_worst);
  EXPECT_EQ(a.device_allocs, b.device_allocs);
  EXPECT_EQ(a.device_frees, b.device_frees);
  EXPECT_EQ(a.maps, b.maps);
  EXPECT_EQ(a.unmaps, b.unmaps);
  EXPECT_EQ(a.ooms, b.ooms);
  EXPECT_EQ(a.segments, b.segments);
  ASSERT_EQ(a.series.size(), b.series.size());
  for (std::size_t i = 0; i < a.series.size(); ++i) {
    EXPECT_EQ(a.series[i].reserved, b.series[i].reserved);
    EXPECT_EQ(a.series[i].allocated, b.series[i].allocated);
    EXPECT_EQ(a.series[i].requested, b.series[i].requested);
  }
}

TEST(ReplayDeterminism, TheSameReplayTwiceGivesIdenticalNumbers) {
  const rp::DeviceWorkload t = generated("multistream", 3);
  for (const std::string config : {"", "expandable_segments:True", "max_split_size_mb:64"}) {
    SCOPED_TRACE(config);
    rp::ReplayOptions o;
    o.config = config;
    o.sample_every = 50;
    const rp::ReplayResult a = rp::replay(t, o);
    const rp::ReplayResult b = rp::replay(t, o);
    expect_same(a, b);
    EXPECT_FALSE(a.series.empty());
    // The report built from them is identical as well (speed aside).
    rp::TraceReport ra, rb;
    ra.rows.push_back({a, std::nullopt, false});
    rb.rows.push_back({b, std::nullopt, false});
    EXPECT_EQ(rp::format_svg(ra), rp::format_svg(rb));
  }
}

TEST(ReplayReport, SvgLabelsAreXmlEscaped) {
  // Trace paths and config strings are free text; in the SVG they must stay character data.
  rp::ReplayOptions o;
  o.config = "expandable_segments:True";
  o.sample_every = 50;
  rp::ReplayResult r = rp::replay(generated("multistream", 3), o);
  r.config = "a<b>&c";
  rp::TraceReport report;
  report.trace = "runs/R&D <v2>.pickle";
  report.rows.push_back({r, std::nullopt, false});
  const std::string svg = rp::format_svg(report);
  EXPECT_NE(svg.find("runs/R&amp;D &lt;v2&gt;.pickle"), std::string::npos) << svg.substr(0, 400);
  EXPECT_NE(svg.find(">A = a&lt;b&gt;&amp;c</text>"), std::string::npos);
  EXPECT_EQ(svg.find("R&D"), std::string::npos);
  EXPECT_EQ(svg.find("<v2>"), std::string::npos);
}

TEST(ReplayMinCapacity, FitsAtTheAnswerAndRunsOutOneStepBelow) {
  const rp::DeviceWorkload t = generated("recompute", 3);
  const std::size_t step = 2 * MiB;
  for (const std::string config : {"", "expandable_segments:True"}) {
    SCOPED_TRACE(config);
    const auto cap = rp::min_capacity(t, config, 64 * GiB, step);
    ASSERT_TRUE(cap.has_value());
    EXPECT_EQ(*cap % step, 0u);
    rp::ReplayOptions o;
    o.config = config;
    o.capacity = *cap;
    EXPECT_EQ(rp::replay(t, o).ooms, 0u);
    o.capacity = *cap - step;
    EXPECT_GT(rp::replay(t, o).ooms, 0u);
    // It needs at least what is live at the peak, and no more than an unconstrained replay held
    // (a device at least that large never runs out, so the run is the same).
    rp::ReplayOptions unconstrained;
    unconstrained.config = config;
    const rp::ReplayResult free_run = rp::replay(t, unconstrained);
    EXPECT_GE(*cap, rp::peak_requested(t));
    EXPECT_LE(*cap, (free_run.peak_reserved + step - 1) / step * step);
  }
  EXPECT_FALSE(rp::min_capacity(t, "", GiB, step).has_value());  // does not fit at all
}

// Record a generated workload through stitch itself (PyTorch's default settings, empty start),
// dump the snapshot, read it back: a replay with PyTorch's defaults must reproduce the recorded
// segments exactly.
TEST(ReplayFidelity, ReproducesAStitchRecordingExactly) {
  for (const std::string pattern : {"transformer-varlen", "multistream"}) {
    SCOPED_TRACE(pattern);
    const rp::DeviceWorkload t = generated(pattern, 2, 3);
    stitch::SimBackend::Options so;
    so.capacity = std::size_t{1} << 40;
    auto sim = std::make_shared<stitch::SimBackend>(so);
    stitch::Allocator a(stitch::Config::parse("backend:sim,record_history:True,max_entries:" +
                                              std::to_string(4 * t.events.size())),
                        sim);
    std::unordered_map<std::uintptr_t, void*> live;
    for (const rp::Event& e : t.events) {
      if (e.kind == rp::Event::Kind::alloc) {
        live[e.addr] = a.allocate(e.size, reinterpret_cast<stitch::stream_t>(e.stream), 0);
      } else if (e.kind == rp::Event::Kind::free) {
        a.deallocate(live.at(e.addr));
        live.erase(e.addr);
      }
    }
    TempDir dir;
    const std::string path = dir.file("recorded.pickle");
    a.dump_snapshot(path);
    const rp::TraceFile back = rp::read_trace_file(path);
    ASSERT_EQ(back.devices.size(), 1u);
    const rp::DeviceWorkload& r = back.devices[0];
    EXPECT_TRUE(r.starts_empty);
    EXPECT_TRUE(r.initial.empty());
    ASSERT_TRUE(r.recorded_peak_reserved.has_value());
    EXPECT_EQ(*r.recorded_peak_reserved, static_cast<std::size_t>(a.stats(0).reserved_bytes[stitch::kAll].peak));
    EXPECT_EQ(rp::peak_requested(r), rp::peak_requested(t));
    EXPECT_EQ(back.recorded_by.rfind("stitch ", 0), 0u) << back.recorded_by;
    const auto f = rp::fidelity(r, back.recorded);
    ASSERT_TRUE(f.has_value());
    EXPECT_EQ(f->replayed_peak_reserved, f->recorded_peak_reserved);
    EXPECT_EQ(f->peak_error, 0.0);
    EXPECT_EQ(f->segment_agreement, 1.0);
  }
}

// A recording that began mid-run, with the weights already live, on two devices and several
// streams, with an empty_cache() in the window, under each way of holding memory: replayed
// under the recorded settings from the recorded start, it reserves what the recording did.
TEST(ReplayFidelity, ReproducesAWarmMultiDeviceRecording) {
  for (const std::string conf : {"", "expandable_segments:True", "max_split_size_mb:64",
                                 "expandable_segments:True,stitching:True"}) {
    SCOPED_TRACE(conf);
    stitch::SimBackend::Options so;
    so.devices = 2;
    so.capacity = std::size_t{1} << 40;
    auto sim = std::make_shared<stitch::SimBackend>(so);
    stitch::Allocator a(stitch::Config::parse("backend:sim" + (conf.empty() ? "" : "," + conf)), sim);
    // Before recording: weights on both devices, and a warm cache (blocks freed again).
    std::vector<void*> weights, scratch;
    for (int d = 0; d < 2; ++d) {
      for (int i = 0; i < 40; ++i) {
        weights.push_back(a.allocate((static_cast<std::size_t>(i % 7) + 1) * 3 * MiB + 4096 * i, nullptr, d));
        scratch.push_back(a.allocate((static_cast<std::size_t>(i % 5) + 1) * 5 * MiB, nullptr, d));
      }
    }
    for (void* p : scratch) a.deallocate(p);
    a.record_history(true, 1u << 20);
    const std::vector<rp::DeviceWorkload> work = {generated("multistream", 2, 5), generated("moe", 2, 6)};
    for (int d = 0; d < 2; ++d) {
      std::unordered_map<std::uintptr_t, void*> live;
      const auto& events = work[static_cast<std::size_t>(d)].events;
      for (std::size_t i = 0; i < events.size(); ++i) {
        const rp::Event& e = events[i];
        if (i == events.size() / 2) a.empty_cache(d);
        if (e.kind == rp::Event::Kind::alloc) {
          live[e.addr] = a.allocate(e.size, reinterpret_cast<stitch::stream_t>(e.stream), d);
        } else if (e.kind == rp::Event::Kind::free) {
          a.deallocate(live.at(e.addr));
          live.erase(e.addr);
        }
      }
    }
    TempDir dir;
    const std::string path = dir.file("warm.pickle");
    a.dump_snapshot(path);
    const rp::TraceFile back = rp::read_trace_file(path);
    ASSERT_EQ(back.devices.size(), 2u);
    EXPECT_EQ(rp::settings_difference(back.recorded), conf);
    for (const rp::DeviceWorkload& r : back.devices) {
      SCOPED_TRACE(r.device);
      EXPECT_FALSE(r.starts_empty);
      EXPECT_EQ(r.initial.size(), 40u);  // the weights
      ASSERT_TRUE(r.recorded_peak_reserved.has_value());
      EXPECT_EQ(*r.recorded_peak_reserved,
                static_cast<std::size_t>(a.stats(r.device).reserved_bytes[stitch::kAll].peak));
      const auto f = rp::fidelity(r, back.recorded);
      ASSERT_TRUE(f.has_value());
      EXPECT_GE(f->releases, 1u);
      EXPECT_EQ(f->replayed_peak_reserved, f->recorded_peak_reserved);
    }
  }
}

// The shipped generated traces replay without trouble, and show the orderings that follow from
// how the allocators work.
TEST(ReplayGeneratedTraces, ShippedTracesReplayWithPrincipledOrderings) {
  std::map<std::string, std::map<std::string, rp::ReplayResult>> results;
  int recorded_runs = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(shipped_dir(), ec)) {
    if (entry.path().extension() != ".pickle") continue;
    const std::string name = entry.path().stem().string();
    SCOPED_TRACE(name);
    const rp::TraceFile w = rp::read_trace_file(entry.path().string());
    ASSERT_EQ(w.devices.size(), 1u);
    const rp::DeviceWorkload& t = w.devices[0];
    EXPECT_TRUE(t.starts_empty);
    if (!t.recorded_ooms.empty()) {  // a recorded run that overflowed its device (replay_oom_test)
      ++recorded_runs;
      continue;
    }
    EXPECT_FALSE(rp::fidelity(t, w.recorded).has_value());  // nothing recorded to compare with
    for (const std::string config : {"", "expandable_segments:True"}) {
      rp::ReplayOptions o;
      o.config = config;
      const rp::ReplayResult r = rp::replay(t, o);
      EXPECT_EQ(r.ooms, 0u) << config;
      EXPECT_EQ(r.peak_requested, rp::peak_requested(t)) << config;
      // What is held covers what is live.
      EXPECT_GE(r.peak_reserved, r.peak_requested) << config;
      results[name][config] = r;
    }
    // Expandable segments map pages, they do not make segments.
    EXPECT_EQ(results[name]["expandable_segments:True"].device_allocs, 0);
    EXPECT_GT(results[name]["expandable_segments:True"].maps, 0);
    EXPECT_EQ(results[name][""].maps, 0);
  }
  ASSERT_EQ(results.size(), 6u) << shipped_dir();
  EXPECT_EQ(recorded_runs, 1);
  // With a new sequence length every step, PyTorch's defaults keep segments cut for old sizes
  // while expandable segments grow one range per stream and reuse it whatever the size: they
  // reserve no more (verified by the fragmentation benchmark, docs/fragmentation.md).
  const auto& tv = results.at("transformer-varlen");
  EXPECT_LE(tv.at("expandable_segments:True").peak_reserved, tv.at("").peak_reserved);
  EXPECT_GT(tv.at("").reserved_over_requested(), 1.2);  // the pattern does fragment the defaults
}

// ---- the cost model ----------------------------------------------------------------------------

TEST(ReplayCosts, TheEstimateChargesEachCallItsCost) {
  const rp::CostModel published = rp::CostModel::published();
  rp::CallCounts counts;
  counts.calls[static_cast<std::size_t>(rp::CostCall::mem_map)] = 10;
  counts.calls[static_cast<std::size_t>(rp::CostCall::mem_create)] = 2;
  counts.bytes[static_cast<std::size_t>(rp::CostCall::mem_create)] = 40 * MiB;
  EXPECT_DOUBLE_EQ(published.estimate_us(counts), 10 * 1.45 + 2 * 193.3);
  // A cost file overrides what it names, per call or per MiB; the rest stays published.
  const rp::CostModel mine = rp::CostModel::from_json(
      R"({"cuMemMap": 2, "cuMemCreate": {"per_call_us": 10, "per_mib_us": 1.5}})", "mine.json");
  EXPECT_EQ(mine.source, "mine.json");
  EXPECT_DOUBLE_EQ(mine.estimate_us(counts), 10 * 2.0 + 2 * 10.0 + 40 * 1.5);
  EXPECT_DOUBLE_EQ(mine.costs[static_cast<std::size_t>(rp::CostCall::mem_unmap)].per_call_us, 25.6);
  for (const char* bad : {R"({"cuMemMapp": 1})", R"({"cuMemMap": -1})", R"({"cuMemMap": 1)",
                          R"({"cuMemMap": {"per_gib": 1}})", "[]"}) {
    SCOPED_TRACE(bad);
    try {
      (void)rp::CostModel::from_json(bad, "bad.json");
      ADD_FAILURE() << "accepted";
    } catch (const stitch::error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("bad.json: offset ", 0), 0u) << e.what();
    }
  }
}

TEST(ReplayCosts, AReplayCountsTheSimulatedDevicesCalls) {
  const rp::DeviceWorkload t = generated("recompute", 2);
  rp::ReplayOptions o;
  o.config = "expandable_segments:True";
  const rp::ReplayResult r = rp::replay(t, o);
  EXPECT_EQ(r.calls.calls[static_cast<std::size_t>(rp::CostCall::mem_map)], static_cast<std::uint64_t>(r.maps));
  // One access grant per run of maps (a grow maps its pages as one run), covering its bytes.
  const std::uint64_t grants = r.calls.calls[static_cast<std::size_t>(rp::CostCall::mem_set_access)];
  EXPECT_GT(grants, 0u);
  EXPECT_LT(grants, static_cast<std::uint64_t>(r.maps));
  EXPECT_EQ(r.calls.bytes[static_cast<std::size_t>(rp::CostCall::mem_set_access)],
            r.calls.bytes[static_cast<std::size_t>(rp::CostCall::mem_map)]);
  EXPECT_EQ(r.calls.calls[static_cast<std::size_t>(rp::CostCall::mem_create)], static_cast<std::uint64_t>(r.maps));
  // 2 MiB pages in the small pool, 20 MiB in the large: whole pages either way.
  EXPECT_EQ(r.calls.bytes[static_cast<std::size_t>(rp::CostCall::mem_map)] % (2 * MiB), 0u);
  EXPECT_GT(r.calls.bytes[static_cast<std::size_t>(rp::CostCall::mem_map)], static_cast<std::uint64_t>(r.maps) * 2 * MiB);
  EXPECT_GT(rp::CostModel::published().estimate_us(r.calls), 0.0);
}

// ---- real PyTorch traces (skipped when absent) -------------------------------------------------------

TEST(ReplayRealTraces, EveryRealTraceLoadsAndTheFidelityReplayReproducesThePeak) {
  // Every snapshot of the real-trace directory, whatever it is: it must load, and where it has
  // segment events the replay under its recorded settings, from its recorded start, must come
  // within 1% of what PyTorch really held at its peak. (The start state and the baseline are
  // checked against an independent computation by tests/python/test_replay_oracle.py.)
  std::error_code ec;
  if (!fs::is_directory(real_dir(), ec)) GTEST_SKIP() << "no real traces in " << real_dir();
  int checked = 0, with_peak = 0;
  for (const auto& entry : fs::directory_iterator(real_dir(), ec)) {
    if (entry.path().extension() != ".pickle") continue;
    SCOPED_TRACE(entry.path().filename().string());
    const rp::TraceFile w = rp::read_trace_file(entry.path().string());
    EXPECT_FALSE(w.devices.empty());
    for (const rp::DeviceWorkload& t : w.devices) {
      if (t.recorded_peak_reserved) {
        const auto f = rp::fidelity(t, w.recorded);
        ASSERT_TRUE(f.has_value());
        EXPECT_LE(f->peak_error, 0.01) << "replayed " << f->replayed_peak_reserved << " recorded "
                                       << f->recorded_peak_reserved;
        EXPECT_GE(*t.recorded_peak_reserved, t.reserved_at_start);
        ++with_peak;
      }
      const rp::ReplayResult r = rp::replay(t, rp::ReplayOptions{});
      EXPECT_EQ(r.ooms, 0u);
      EXPECT_EQ(r.peak_requested, rp::peak_requested(t));  // the memory live at the start counts
      EXPECT_GE(r.peak_reserved, r.peak_requested);
    }
    ++checked;
  }
  EXPECT_GT(checked, 0) << "no .pickle in " << real_dir();
  EXPECT_GT(with_peak, 0);
}

}  // namespace
