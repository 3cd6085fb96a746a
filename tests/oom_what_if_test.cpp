// Tests of the out-of-memory what-if check (replay/what_if.hpp): on crafted failures on the
// simulated device, the report names a configuration exactly when replaying the same workload
// under it really serves the request; both workload sources (recorded history, layout now);
// the switch-off key; the fallbacks when the history is incomplete; no escape from the OOM path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "replay/what_if.hpp"
#include "stitch/allocator.hpp"
#include "stitch/config.hpp"
#include "stitch/errors.hpp"
#include "stitch/sim_backend.hpp"

namespace stitch {
namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

stream_t S(std::uintptr_t n) { return reinterpret_cast<stream_t>(n); }

bool contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

/// A program that runs into an out-of-memory failure: what it does first, then the request.
struct Workload {
  std::function<void(Allocator&)> setup;
  std::size_t request = 0;
  stream_t stream = nullptr;
};

/// Fill the device with 5 MiB blocks (four per 20 MiB segment), free every other one, then ask
/// for 8 MiB: half the memory is free, in 5 MiB holes.
Workload holes_of_5_mib(std::size_t bytes) {
  return {[bytes](Allocator& a) {
            std::vector<void*> blocks;
            for (std::size_t i = 0; i < bytes / (5 * MiB); ++i)
              blocks.push_back(a.allocate(5 * MiB, S(1)));
            for (std::size_t i = 0; i < blocks.size(); i += 2) a.deallocate(blocks[i]);
          },
          8 * MiB, S(1)};
}

/// Fill the device with pairs of 2.5 MiB and 1.5 MiB blocks and free the 1.5 MiB ones: 37.5% of
/// the memory is free, but no free hole holds a whole 2 MiB page, so neither expandable segments
/// nor stitching can reuse it for an 8 MiB request.
Workload holes_smaller_than_a_page(std::size_t bytes) {
  return {[bytes](Allocator& a) {
            std::vector<void*> holes;
            for (std::size_t i = 0; i < bytes / (4 * MiB); ++i) {
              (void)a.allocate(5 * MiB / 2, S(1));
              holes.push_back(a.allocate(3 * MiB / 2, S(1)));
            }
            for (void* p : holes) a.deallocate(p);
          },
          8 * MiB, S(1)};
}

/// A simulated device and an allocator on it.
struct Device {
  Device(const std::string& conf, std::size_t capacity) {
    SimBackend::Options options;
    options.capacity = capacity;
    sim = std::make_shared<SimBackend>(options);
    alloc = std::make_unique<Allocator>(Config::parse("backend:sim," + conf), sim);
  }
  std::shared_ptr<SimBackend> sim;
  std::unique_ptr<Allocator> alloc;
};

/// Runs `w` on `a` and returns the OOM report of its request ("" if it was served).
std::string oom_report(Allocator& a, const Workload& w) {
  w.setup(a);
  try {
    (void)a.allocate(w.request, w.stream);
  } catch (const out_of_memory& e) {
    return e.what();
  }
  return "";
}

/// Whether `w`'s request is served under `conf` on a fresh device of `capacity` bytes (with
/// `fraction` of it allowed): the test's own replay, independent of the check.
bool serves(const std::string& conf, std::size_t capacity, const Workload& w,
            double fraction = 1.0) {
  Device d("oom_what_if:False," + conf, capacity);
  if (fraction < 1.0) d.alloc->set_memory_fraction(fraction, 0);
  return oom_report(*d.alloc, w).empty();
}

/// The report's what-if paragraph.
std::string what_if_line(const std::string& report) {
  const auto at = report.find("What-if: ");
  if (at == std::string::npos) return "";
  return report.substr(at, report.find('\n', at) - at);
}

/// The configurations the report names as serving the request.
std::vector<std::string> named(const std::string& report) {
  const std::string line = what_if_line(report);
  const auto end = line.find(" would have served this request");
  if (end == std::string::npos) return {};
  std::vector<std::string> out;
  std::string_view list = std::string_view(line).substr(9, end - 9);
  for (auto sep = list.find(" or "); sep != std::string_view::npos; sep = list.find(" or ")) {
    out.emplace_back(list.substr(0, sep));
    list.remove_prefix(sep + 4);
  }
  out.emplace_back(list);
  return out;
}

const std::vector<std::string> kChanges = {"expandable_segments:True",
                                           "expandable_segments:True,stitching:True"};

/// Every configuration the check could name is named exactly when it really serves `w`.
void expect_named_exactly_those_that_serve(const std::string& report, std::size_t capacity,
                                           const Workload& w, double fraction = 1.0) {
  const std::vector<std::string> names = named(report);
  for (const std::string& change : kChanges) {
    const bool is_named = std::find(names.begin(), names.end(), change) != names.end();
    EXPECT_EQ(is_named, serves(change, capacity, w, fraction)) << change << "\n" << report;
  }
}

// ---- fragmentation: a checked configuration is named -----------------------------------------------

TEST(OomWhatIf, FragmentationFromTheHistoryNamesOnlyConfigurationsThatServe) {
  const Workload w = holes_of_5_mib(200 * MiB);
  Device d("record_history:True", 200 * MiB);
  const std::string report = oom_report(*d.alloc, w);
  ASSERT_FALSE(report.empty()) << "expected an OOM";
  EXPECT_TRUE(contains(report, "Verdict: fragmentation")) << report;
  EXPECT_TRUE(contains(what_if_line(report), "(checked: replayed ")) << report;
  EXPECT_TRUE(contains(what_if_line(report), "recorded events on a simulated 200.00 MiB device"))
      << report;
  EXPECT_FALSE(named(report).empty()) << report;
  EXPECT_FALSE(serves("", 200 * MiB, w));  // the current configuration really fails
  expect_named_exactly_those_that_serve(report, 200 * MiB, w);
}

/// Under `conf`, the 5 MiB holes workload is checked from the layout now, for `reason`, and
/// names exactly the configurations that serve it.
void expect_checked_from_the_layout(const std::string& conf, std::string_view reason) {
  const Workload w = holes_of_5_mib(200 * MiB);
  Device d(conf, 200 * MiB);
  const std::string report = oom_report(*d.alloc, w);
  ASSERT_FALSE(report.empty()) << "expected an OOM";
  const std::string line = what_if_line(report);
  EXPECT_TRUE(contains(line, "rebuilt the device's 20 live and 20 free blocks")) << report;
  EXPECT_TRUE(contains(line, reason)) << report;
  EXPECT_FALSE(named(report).empty()) << report;
  expect_named_exactly_those_that_serve(report, 200 * MiB, w);
}

TEST(OomWhatIf, FragmentationWithoutHistoryRebuildsTheLayoutNow) {
  expect_checked_from_the_layout("", "The history was not replayed: recording is off");
}

TEST(OomWhatIf, NamesNothingWhenNoConfigurationServes) {
  const Workload w = holes_smaller_than_a_page(200 * MiB);
  for (const char* conf : {"record_history:True", ""}) {
    Device d(conf, 200 * MiB);
    const std::string report = oom_report(*d.alloc, w);
    ASSERT_FALSE(report.empty()) << "expected an OOM";
    EXPECT_TRUE(contains(report, "Verdict: fragmentation")) << report;
    EXPECT_TRUE(named(report).empty()) << report;
    EXPECT_TRUE(contains(what_if_line(report), "no configuration change serves this request"))
        << report;
    for (const std::string& change : kChanges) EXPECT_FALSE(serves(change, 200 * MiB, w)) << change;
  }
}

TEST(OomWhatIf, TooMuchLiveDataIsNotReplayed) {
  Device d("record_history:True", 200 * MiB);
  void* live = d.alloc->allocate(150 * MiB);
  std::string report;
  try {
    (void)d.alloc->allocate(100 * MiB);
  } catch (const out_of_memory& e) {
    report = e.what();
  }
  ASSERT_FALSE(report.empty()) << "expected an OOM";
  EXPECT_TRUE(contains(report, "Verdict: live data exceeds the device")) << report;
  EXPECT_TRUE(contains(report, "no allocator setting can fit it")) << report;
  EXPECT_TRUE(named(report).empty()) << report;
  EXPECT_EQ(what_if_line(report), "") << report;
  d.alloc->deallocate(live);
}

// ---- the device's capacity ---------------------------------------------------------------------

TEST(OomWhatIf, TheSimulatedDeviceLeavesOutMemoryHeldByOthers) {
  // Another allocator on the same device holds 100 MiB: this one can use 200 MiB of the 300.
  const Workload w = holes_of_5_mib(200 * MiB);
  Device d("record_history:True", 300 * MiB);
  Allocator other(Config::parse("backend:sim"), d.sim);
  void* theirs = other.allocate(100 * MiB);
  const std::string report = oom_report(*d.alloc, w);
  ASSERT_FALSE(report.empty()) << "expected an OOM";
  EXPECT_TRUE(contains(what_if_line(report), "on a simulated 200.00 MiB device")) << report;
  EXPECT_FALSE(named(report).empty()) << report;
  expect_named_exactly_those_that_serve(report, 200 * MiB, w);
  other.deallocate(theirs);
}

TEST(OomWhatIf, TheSimulatedDeviceKeepsTheMemoryFraction) {
  const Workload w = holes_of_5_mib(200 * MiB);
  Device d("record_history:True", 400 * MiB);
  d.alloc->set_memory_fraction(0.5, 0);
  const std::string report = oom_report(*d.alloc, w);
  ASSERT_FALSE(report.empty()) << "expected an OOM";
  EXPECT_TRUE(contains(what_if_line(report), "on a simulated 400.00 MiB device (200.00 MiB allowed)"))
      << report;
  EXPECT_FALSE(named(report).empty()) << report;
  expect_named_exactly_those_that_serve(report, 400 * MiB, w, 0.5);
}

// ---- switching it off -----------------------------------------------------------------------------

TEST(OomWhatIf, OffByConfigurationKey) {
  EXPECT_TRUE(Config{}.oom_what_if);
  EXPECT_FALSE(Config::parse("oom_what_if:False").oom_what_if);
  EXPECT_TRUE(Config::parse("oom_what_if:True").oom_what_if);
  EXPECT_TRUE(contains(Config::parse("oom_what_if:False").to_string(), "oom_what_if:False"));
  try {
    (void)Config::parse("oom_what_if:no");
    FAIL() << "expected a config_error";
  } catch (const config_error& e) {
    EXPECT_TRUE(contains(e.what(), "bad value 'no' for oom_what_if (accepted: True or False)"))
        << e.what();
  }
  const Workload w = holes_of_5_mib(200 * MiB);
  Device d("record_history:True,oom_what_if:False", 200 * MiB);
  const std::string report = oom_report(*d.alloc, w);
  ASSERT_FALSE(report.empty()) << "expected an OOM";
  EXPECT_TRUE(contains(report, "Verdict: fragmentation")) << report;
  EXPECT_EQ(what_if_line(report), "What-if: off (oom_what_if:False); no other configuration was checked.");
  EXPECT_TRUE(named(report).empty()) << report;
}

TEST(OomWhatIf, SwitchedOnAtRunTime) {
  const Workload w = holes_of_5_mib(200 * MiB);
  Device d("oom_what_if:False", 200 * MiB);
  w.setup(*d.alloc);
  auto report = [&] {
    try {
      (void)d.alloc->allocate(w.request, w.stream);
    } catch (const out_of_memory& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_TRUE(contains(what_if_line(report()), "off (oom_what_if:False)"));
  d.alloc->configure("oom_what_if:True");
  EXPECT_FALSE(named(report()).empty());
}

// ---- incomplete histories fall back to the layout now ----------------------------------------------

TEST(OomWhatIf, WrappedRingBufferFallsBackToTheLayout) {
  expect_checked_from_the_layout("record_history:True,max_entries:10",
                                 "the history's ring buffer wrapped");
}

TEST(OomWhatIf, HistoryLongerThanTheCapFallsBackToTheLayout) {
  // Enough recorded entries to pass the cap (alloc, free_requested, free_completed per pair).
  const std::size_t pairs = detail::kWhatIfMaxEvents / 3 + 1;
  const Workload w = holes_of_5_mib(200 * MiB);
  Device d("record_history:True,max_entries:" + std::to_string(2 * detail::kWhatIfMaxEvents),
           200 * MiB);
  for (std::size_t i = 0; i < pairs; ++i) d.alloc->deallocate(d.alloc->allocate(KiB));
  const std::string report = oom_report(*d.alloc, w);
  ASSERT_FALSE(report.empty()) << "expected an OOM";
  const std::string line = what_if_line(report);
  EXPECT_TRUE(contains(line, "rebuilt the device's")) << report;
  EXPECT_TRUE(contains(line, "more than the " + std::to_string(detail::kWhatIfMaxEvents) +
                                 " the check replays"))
      << report;
  EXPECT_FALSE(named(report).empty()) << report;
}

TEST(OomWhatIf, RecordingStartedOnABusyDeviceFallsBackToTheLayout) {
  const Workload w = holes_of_5_mib(200 * MiB);
  Device d("", 200 * MiB);
  void* early = d.alloc->allocate(MiB);  // held when recording starts
  d.alloc->record_history(true);
  d.alloc->deallocate(early);
  d.alloc->empty_cache();
  const std::string report = oom_report(*d.alloc, w);
  EXPECT_TRUE(contains(what_if_line(report),
                       "recording started while the device already held memory"))
      << report;
}

TEST(OomWhatIf, RecordingStartedOnAnEmptyDeviceIsReplayed) {
  const Workload w = holes_of_5_mib(200 * MiB);
  Device d("", 200 * MiB);
  d.alloc->deallocate(d.alloc->allocate(MiB));
  d.alloc->empty_cache();  // nothing held any more: a history from here is complete
  d.alloc->record_history(true);
  const std::string report = oom_report(*d.alloc, w);
  EXPECT_TRUE(contains(what_if_line(report), "(checked: replayed ")) << report;
  EXPECT_FALSE(contains(report, "The history was not replayed")) << report;
}

TEST(OomWhatIf, EmptyCacheInTheHistoryIsReplayed) {
  // 32 MiB segments cached and then given back: a replay that kept them would carve the 5 MiB
  // blocks out of them, waste 2 MiB in each, and fail before the request.
  const Workload holes = holes_of_5_mib(200 * MiB);
  const Workload w{[&](Allocator& a) {
                     std::vector<void*> big;
                     for (int i = 0; i < 6; ++i) big.push_back(a.allocate(32 * MiB, S(1)));
                     for (void* p : big) a.deallocate(p);
                     a.empty_cache();
                     holes.setup(a);
                   },
                   holes.request, holes.stream};
  Device d("record_history:True", 200 * MiB);
  const std::string report = oom_report(*d.alloc, w);
  ASSERT_FALSE(report.empty()) << "expected an OOM";
  EXPECT_TRUE(contains(what_if_line(report), "(checked: replayed ")) << report;
  EXPECT_FALSE(contains(report, "not conclusive")) << report;
  EXPECT_FALSE(named(report).empty()) << report;
  expect_named_exactly_those_that_serve(report, 200 * MiB, w);
}

// ---- the failing allocator is left alone --------------------------------------------------------------

TEST(OomWhatIf, LeavesTheFailingAllocatorAsItWas) {
  const Workload w = holes_of_5_mib(200 * MiB);
  Device d("record_history:True", 200 * MiB);
  w.setup(*d.alloc);
  const DeviceStats before = d.alloc->stats(0);
  const std::size_t entries = d.alloc->snapshot().device_traces[0].size();  // + its own entry
  EXPECT_THROW((void)d.alloc->allocate(w.request, w.stream), out_of_memory);
  const DeviceStats after = d.alloc->stats(0);
  EXPECT_EQ(after.num_ooms, before.num_ooms + 1);
  EXPECT_EQ(after.allocated_bytes[kAll].current, before.allocated_bytes[kAll].current);
  EXPECT_EQ(after.allocation[kAll].current, before.allocation[kAll].current);
  const auto trace = d.alloc->snapshot().device_traces[0];
  // The failure added its `oom` entry (and this snapshot's): the replay recorded nothing here.
  EXPECT_EQ(trace.size(), entries + 2);
  EXPECT_EQ(trace[trace.size() - 2].action, TraceAction::oom);
  d.alloc->validate();
}

TEST(OomWhatIf, AFailingReplayStillGivesTheReport) {
  // A check whose simulated device cannot be built (granularity 3 is not a power of two).
  detail::OomCapture capture;
  capture.facts.requested = capture.facts.rounded = capture.facts.alloc_size = 8 * MiB;
  capture.facts.device_total = 200 * MiB;
  auto input = std::make_shared<detail::WhatIfInput>();
  input->granularity = 3;
  capture.what_if = input;
  const std::string report = replay::oom_message(capture);
  EXPECT_TRUE(contains(report, "What-if: not run: the replay failed: sim: granularity 3")) << report;
  EXPECT_TRUE(contains(report, "CUDA out of memory. Tried to allocate 8.00 MiB")) << report;
}

}  // namespace
}  // namespace stitch
