// Tests of replays of runs that ran out of memory and of replays that do (src/replay/device_size,
// src/tools/stitch_replay/oom_explain, fits, src/tools/tracegen/device_run): the recorded OOM read
// from a trace, the device size it implies, the fidelity replay reproducing it at the same event,
// a generated run that overflows its device, the explanation of each OOM of a replay on a
// limited device, and --fits agreeing with the smallest fitting device.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "replay/device_size.hpp"
#include "stitch/snapshot.hpp"
#include "tools/stitch_replay/explanations.hpp"
#include "tools/stitch_replay/fits.hpp"
#include "tools/stitch_replay/replayer.hpp"
#include "tools/stitch_replay/report.hpp"
#include "tools/stitch_replay/trace_file.hpp"
#include "tools/tracegen/device_run.hpp"
#include "tools/tracegen/tracegen.hpp"
#include "replay_helpers.hpp"

namespace {

namespace rp = stitch::replay_cli;
namespace tg = stitch::tracegen;
using stitch::Snapshot;
using stitch::TraceAction;
using stitch::TraceEntry;

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

using replay_helpers::ev;
using replay_helpers::generated;

// A generated program recorded on a device too small for it (expandable segments, as the run
// the issue describes), read back as the replay reads a file.
rp::TraceFile overflowed(std::size_t steps, std::size_t memory, const std::string& conf) {
  tg::Options o;
  o.steps = steps;
  tg::DeviceRun run;
  run.memory = memory;
  run.alloc_conf = conf;
  return rp::trace_file_from_snapshot(tg::record_on_device(tg::generate("transformer-varlen", 1, o), run),
                                      "overflowed");
}

TEST(ReplayRecordedOom, TheOomEntryGivesTheDeviceItRanOn) {
  // 40 MiB held at the start; the trace maps 20, gives 20 back in the ladder, and fails a 60 MiB
  // request with 30 MiB free: the allocator could hold 40 + 30 = 70 MiB.
  Snapshot s;
  s.device_traces.push_back({
      ev(TraceAction::segment_alloc, 0x10000000, 20 * MiB),
      ev(TraceAction::alloc, 0x10000000, 20 * MiB),
      ev(TraceAction::free_requested, 0x10000000, 20 * MiB),
      ev(TraceAction::free_completed, 0x10000000, 20 * MiB),
      ev(TraceAction::segment_free, 0x10000000, 20 * MiB),
      ev(TraceAction::oom, 30 * MiB, 60 * MiB, 7),
  });
  stitch::SegmentSnapshot held;
  held.address = 0x40000000;
  held.total_size = 40 * MiB;
  held.segment_type = "large";
  held.blocks = {stitch::BlockSnapshot{0x40000000, 40 * MiB, 40 * MiB, "active_allocated"}};
  s.segments = {held};
  const rp::DeviceWorkload t = rp::trace_file_from_snapshot(s, "oom").devices.at(0);
  ASSERT_EQ(t.recorded_ooms.size(), 1u);
  const rp::RecordedOom& oom = t.recorded_ooms[0];
  EXPECT_EQ(oom.event, 5u);
  EXPECT_EQ(oom.size, 60 * MiB);
  EXPECT_EQ(oom.stream, 7u);
  EXPECT_EQ(oom.device_free, 30 * MiB);
  EXPECT_EQ(oom.reserved, 40 * MiB);
  EXPECT_EQ(t.events[5].kind, rp::Event::Kind::failed);
  EXPECT_EQ(stitch::replay::implied_capacity(t).value_or(0), 70 * MiB);
  // The fidelity replay runs on that device and fails the same request there.
  const auto f = rp::fidelity(t, stitch::Config{});
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->capacity.value_or(0), 70 * MiB);
  ASSERT_TRUE(f->recorded_oom.has_value());
  EXPECT_EQ(f->replayed_oom_event.value_or(0), 5u);
  EXPECT_TRUE(f->oom_reproduced);
  EXPECT_EQ(f->replayed_peak_reserved, f->recorded_peak_reserved);
}

TEST(ReplayRecordedOom, NeverSmallerThanWhatTheRecordingHeld) {
  // The allocator held 40 MiB at its peak, then 20 after the ladder gave 20 back, and the device
  // said nothing was free: 20 + 0, but it had held 40, so the device had at least that.
  Snapshot s;
  s.device_traces.push_back({
      ev(TraceAction::segment_alloc, 0x10000000, 20 * MiB),
      ev(TraceAction::segment_alloc, 0x20000000, 20 * MiB),
      ev(TraceAction::segment_free, 0x10000000, 20 * MiB),
      ev(TraceAction::oom, 0, 40 * MiB),
  });
  const rp::DeviceWorkload t = rp::trace_file_from_snapshot(s, "floor").devices.at(0);
  EXPECT_EQ(t.recorded_ooms.at(0).reserved, 20 * MiB);
  EXPECT_EQ(stitch::replay::implied_capacity(t).value_or(0), 40 * MiB);
  EXPECT_FALSE(stitch::replay::implied_capacity(rp::DeviceWorkload{}).has_value());
}

TEST(ReplayRecordedOom, PyTorchsLadderUnmapsThenMapsAndThatIsARelease) {
  // release_cached_blocks() unmapped the free pages, then alloc_block() mapped new ones: a
  // release in a PyTorch trace, pages moving only in a stitch recording made with stitching.
  const std::vector<TraceEntry> entries = {
      ev(TraceAction::segment_map, 0x10000000, 20 * MiB),
      ev(TraceAction::segment_unmap, 0x10000000, 20 * MiB),
      ev(TraceAction::segment_map, 0x20000000, 40 * MiB),
  };
  EXPECT_EQ(stitch::replay::events_from_trace(entries, stitch::replay::FreeAt::automatic,
                                              stitch::replay::Unmaps::release)[1].kind,
            rp::Event::Kind::release);
  EXPECT_EQ(stitch::replay::events_from_trace(entries)[1].kind, rp::Event::Kind::none);
  Snapshot s;
  s.device_traces.push_back(entries);
  EXPECT_EQ(rp::trace_file_from_snapshot(s, "torch").devices.at(0).events[1].kind, rp::Event::Kind::release);
  s.stitch_version = "0.1.0";
  s.stitch_config = "backend:sim,expandable_segments:True,stitching:True";
  EXPECT_EQ(rp::trace_file_from_snapshot(s, "stitching").devices.at(0).events[1].kind, rp::Event::Kind::none);
}

TEST(ReplayRecordedOom, AGeneratedRunThatOverflowsItsDeviceIsReproducedAtTheSameEvent) {
  for (const std::string conf : {"expandable_segments:True", ""}) {
    SCOPED_TRACE(conf);
    const rp::TraceFile w = overflowed(3, 8 * GiB, conf);
    ASSERT_EQ(w.devices.size(), 1u);
    const rp::DeviceWorkload& t = w.devices[0];
    ASSERT_EQ(t.recorded_ooms.size(), 1u);
    // The run had 8 GiB, 512 MiB of it the context's: the allocator could hold 7.5 GiB.
    EXPECT_EQ(stitch::replay::implied_capacity(t).value_or(0), 8 * GiB - 512 * MiB);
    EXPECT_EQ(t.recorded_ooms[0].event + 1, t.events.size());  // the program died there
    const auto f = rp::fidelity(t, w.recorded);
    ASSERT_TRUE(f.has_value());
    EXPECT_TRUE(f->oom_reproduced) << f->replayed_oom_event.value_or(0) << " vs " << t.recorded_ooms[0].event;
    EXPECT_LE(f->peak_error, 0.01) << f->replayed_peak_reserved << " vs " << f->recorded_peak_reserved;
    EXPECT_LE(f->replayed_peak_reserved, *f->capacity);
  }
}

TEST(ReplayRecordedOom, TheRecordingIsTheSameOnEveryRun) {
  tg::Options o;
  o.steps = 2;
  tg::DeviceRun run;
  run.memory = 6 * GiB;
  run.alloc_conf = "expandable_segments:True";
  const Snapshot program = tg::generate("recompute", 1, o);
  const auto meta = tg::device_run_meta("recompute", 1, o, run);
  EXPECT_EQ(stitch::detail::snapshot_to_pickle(tg::record_on_device(program, run), meta),
            stitch::detail::snapshot_to_pickle(tg::record_on_device(program, run), meta));
  EXPECT_EQ(meta.config, "tracegen pattern:recompute,seed:1,steps:2,device_memory_mb:6144,context_mb:512,"
                         "alloc_conf:expandable_segments:True");
}

// ---- explanations --------------------------------------------------------------------------------


TEST(ReplayExplain, TheFirstOomOfAReplayOnASmallDeviceIsExplained) {
  const rp::DeviceWorkload t = generated("transformer-varlen", 3);
  rp::TraceReport report;
  report.device = 0;
  const std::size_t capacity = rp::peak_requested(t) - 64 * MiB;  // below the live peak: both fail
  for (const std::string config : {"", "expandable_segments:True"}) {
    rp::ReplayOptions o;
    o.config = config;
    o.capacity = capacity;
    o.explain = rp::Explain::first;
    rp::Row row;
    row.result = rp::replay(t, o);
    report.rows.push_back(row);
  }
  rp::complete_explanations(report, "no-such-file.pickle");
  for (const rp::Row& row : report.rows) {
    const rp::ReplayResult& r = row.result;
    SCOPED_TRACE(r.config);
    ASSERT_GT(r.ooms, 0u);
    ASSERT_EQ(r.explanations.size(), 1u);
    const rp::OomExplanation& e = r.explanations[0];
    EXPECT_EQ(e.event, r.first_oom_event.value_or(SIZE_MAX));
    ASSERT_LT(e.event, t.events.size());
    EXPECT_EQ(t.events[e.event].kind, rp::Event::Kind::alloc);
    EXPECT_EQ(e.size, t.events[e.event].size);
    EXPECT_EQ(e.stream, t.events[e.event].stream);
    EXPECT_FALSE(e.verdict.empty());
    EXPECT_NE(e.verdict_text.find(e.verdict), std::string::npos) << e.verdict_text;
    EXPECT_EQ(e.facts.device_total, capacity);
    ASSERT_FALSE(e.largest_live.empty());
    for (std::size_t i = 1; i < e.largest_live.size(); ++i)
      EXPECT_GE(e.largest_live[i - 1].size, e.largest_live[i].size);
    ASSERT_EQ(e.what_if.size(), 1u);  // the other config, on the same device
    const std::string json = rp::explanation_json(e);
    EXPECT_NE(json.find("\"verdict\":\"" + e.verdict + "\""), std::string::npos) << json;
  }
}

}  // namespace
