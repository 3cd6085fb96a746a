// Spill to host pages under the same addresses (core/spiller.hpp, docs/spill.md) on the simulated
// device, whose device and host memory are real host memory: under spill:all a program whose live
// memory is twice the device runs to the end with every byte at its address while reserved memory
// stays within the device; under spill:tags cold spillable tags move and untagged memory does not;
// stitch_spill and stitch_unspill move exactly what they say, all or nothing, and fail clearly;
// frees give host pages back at once, empty_cache and stitch_unspill bring the rest back; the
// host budget (sim_host_mb, spill_limit_mb) runs out without losing a byte; a fault at every new
// call site leaves every block with its data at its address; sleep and wake of a spilled tag;
// under spill:all, memory whose streams got work after the rung's synchronization stays.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "diagnostics/oom_report.hpp"
#include "stitch/allocator.hpp"
#include "stitch/config.hpp"
#include "stitch/errors.hpp"
#include "stitch/sim_backend.hpp"
#include "stitch/snapshot.hpp"
#include "support/data_pattern.hpp"

namespace stitch {
namespace {

using test::pattern_intact;
using test::write_pattern;

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t kDevice = 256 * MiB;

struct Live {
  void* ptr;
  std::size_t size;
  std::uint64_t seed;
};

class Spill : public ::testing::TestWithParam<const char*> {
 protected:
  void make(const std::string& extra, std::size_t host = 0) {
    SimBackend::Options o;
    o.capacity = kDevice;
    o.host_capacity = host;
    sim = std::make_shared<SimBackend>(o);
    std::string conf = std::string(GetParam()) + (extra.empty() ? "" : "," + extra);
    alloc = std::make_unique<Allocator>(Config::parse(conf), sim);
  }
  /// A block of `size` bytes with a pattern written; nullptr when the device and host are full.
  Live add(std::size_t size) {
    void* p = nullptr;
    try {
      p = alloc->allocate(size);
    } catch (const out_of_memory&) {
    }
    Live l{p, size, ++seed};
    if (p != nullptr) write_pattern(p, size, l.seed);
    return l;
  }
  std::int64_t stat(const char* key) { return *alloc->stat(0, key); }
  void expect_intact(const std::vector<Live>& blocks) {
    for (const Live& l : blocks)
      EXPECT_TRUE(pattern_intact(l.ptr, l.size, l.seed)) << "block at " << l.ptr << " of " << l.size;
  }
  /// Reserved memory is what the device holds for stitch, and within the device.
  void expect_books() {
    alloc->validate();
    EXPECT_EQ(stat("reserved_bytes.all.current"), static_cast<std::int64_t>(sim->usage(0).used));
    EXPECT_LE(stat("reserved_bytes.all.current"), static_cast<std::int64_t>(kDevice));
    EXPECT_EQ(stat("spilled_bytes.current"), static_cast<std::int64_t>(sim->usage(0).host_pages));
  }

  std::shared_ptr<SimBackend> sim;
  std::unique_ptr<Allocator> alloc;
  std::uint64_t seed = 0;
};

TEST_P(Spill, AllRunsAProgramTwiceTheDeviceWithEveryByteAtItsAddress) {
  make("spill:all");
  std::vector<Live> live;
  // Mixed sizes, some freed on the way: twice the device in live memory at the end.
  const std::size_t sizes[] = {24 * MiB, 3 * MiB, 40 * MiB, 700 * 1024, 17 * MiB, 9 * MiB};
  std::size_t total = 0;
  for (int i = 0; total < 2 * kDevice; ++i) {
    Live l = add(sizes[i % 6]);
    ASSERT_NE(l.ptr, nullptr) << "request " << i << " failed with " << total << " bytes live";
    live.push_back(l);
    total += l.size;
    if (i % 7 == 6) {  // a free now and then
      alloc->deallocate(live[live.size() / 2].ptr);
      total -= live[live.size() / 2].size;
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(live.size() / 2));
    }
    EXPECT_LE(stat("reserved_bytes.all.current"), static_cast<std::int64_t>(kDevice));
  }
  expect_books();
  EXPECT_GT(stat("spilled_bytes.current"), 0);
  EXPECT_GT(stat("num_spills"), 0);
  EXPECT_EQ(stat("allocated_bytes.all.current") <= stat("reserved_bytes.all.current") + stat("spilled_bytes.current"), true);
  expect_intact(live);
  // Every address is its own: the blocks do not overlap.
  std::vector<std::pair<char*, char*>> spans;
  for (const Live& l : live) spans.emplace_back(static_cast<char*>(l.ptr), static_cast<char*>(l.ptr) + l.size);
  std::sort(spans.begin(), spans.end());
  for (std::size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].second, spans[i].first);
  // Writing through the addresses still works (the host pages are mapped there).
  for (Live& l : live) write_pattern(l.ptr, l.size, l.seed = ++seed);
  // Freeing two thirds: host pages go back at the frees; empty_cache brings the rest back.
  std::vector<Live> kept;
  for (std::size_t i = 0; i < live.size(); ++i) {
    if (i % 3 != 0) {
      alloc->deallocate(live[i].ptr);
    } else {
      kept.push_back(live[i]);
    }
  }
  expect_books();
  alloc->empty_cache();
  expect_books();
  expect_intact(kept);
  // Every host page the device has room for came back: with one-granule pages (stitching) all
  // of them; with coarse pages, until no free page is left (live blocks share the others).
  const std::string residency = alloc->residency(0);
  const std::size_t page = std::string(GetParam()).find("stitching") != std::string::npos ? 2 * MiB : 20 * MiB;
  if (page == 2 * MiB) EXPECT_EQ(stat("spilled_bytes.current"), 0) << residency;
  if (stat("spilled_bytes.current") != 0)
    EXPECT_LT(sim->memory_info(0).free, page) << "a host page stayed while the device had room\n" << residency;
  EXPECT_GT(stat("num_unspills"), 0);
  for (const Live& l : kept) alloc->deallocate(l.ptr);
  alloc->empty_cache();
  expect_books();
  EXPECT_EQ(sim->usage(0).host_pages, 0u);
  EXPECT_EQ(stat("spilled_bytes.peak") > 0, true);
}

TEST_P(Spill, FreeingSpilledBlocksGivesTheirHostPagesBackAtOnce) {
  make("spill:all");
  std::vector<Live> live;
  for (int i = 0; i < 12; ++i) live.push_back(add(40 * MiB));  // 480 MiB on a 256 MiB device
  for (const Live& l : live) ASSERT_NE(l.ptr, nullptr);
  ASSERT_GT(stat("spilled_bytes.current"), 0);
  for (const Live& l : live) alloc->deallocate(l.ptr);
  expect_books();
  EXPECT_EQ(stat("spilled_bytes.current"), 0) << "no free block lies on a host page";
  EXPECT_EQ(sim->usage(0).host_pages, 0u);
}

TEST_P(Spill, TagsMovesColdSpillableTagsFirstAndNeverUntaggedMemory) {
  make("spill:tags");
  std::vector<Live> cold, warm, pinned_tag, untagged;
  {
    Allocator::Region r(*alloc, "optimizer", Allocator::kRegionSpill);
    for (int i = 0; i < 3; ++i) cold.push_back(add(30 * MiB));
  }
  {
    Allocator::Region r(*alloc, "weights", Allocator::kRegionSpill | Allocator::kRegionBackup);
    for (int i = 0; i < 3; ++i) warm.push_back(add(30 * MiB));
  }
  {
    Allocator::Region r(*alloc, "kv");  // not spillable
    pinned_tag.push_back(add(20 * MiB));
  }
  // Untagged memory past the device: the coldest spillable tag goes first.
  for (int i = 0; i < 5; ++i) {
    untagged.push_back(add(30 * MiB));
    ASSERT_NE(untagged.back().ptr, nullptr) << i;
  }
  expect_books();
  const std::string r = alloc->residency(0);
  EXPECT_NE(r.find(R"("tag": "optimizer", "state": "spilled")"), std::string::npos) << r;
  EXPECT_NE(r.find(R"("tag": "kv", "state": "awake", "spill": false)"), std::string::npos) << r;
  expect_intact(cold);
  expect_intact(warm);
  expect_intact(pinned_tag);
  expect_intact(untagged);
  // Beyond what the tags can give: an out-of-memory, untagged memory never moves.
  std::vector<Live> more;
  for (int i = 0; i < 20; ++i) {
    Live l = add(30 * MiB);
    if (l.ptr == nullptr) break;
    more.push_back(l);
  }
  EXPECT_LT(more.size(), 20u) << "untagged memory does not spill under spill:tags";
  expect_books();
  for (const Live& l : more) alloc->deallocate(l.ptr);
  for (const Live& l : untagged) alloc->deallocate(l.ptr);
  // stitch_unspill brings the tags back.
  alloc->unspill(0);
  expect_books();
  EXPECT_EQ(stat("spilled_bytes.current"), 0);
  expect_intact(cold);
  expect_intact(warm);
}

TEST_P(Spill, ExplicitSpillIsAllOrNothingAndNamesWhatItRefuses) {
  make("", 96 * MiB);  // a host of 96 MiB
  std::vector<Live> a, b, c;
  {
    Allocator::Region r(*alloc, "a", Allocator::kRegionSpill);
    for (int i = 0; i < 2; ++i) a.push_back(add(12 * MiB));
  }
  {
    Allocator::Region r(*alloc, "b", Allocator::kRegionSpill);
    for (int i = 0; i < 5; ++i) b.push_back(add(20 * MiB));
  }
  {
    Allocator::Region r(*alloc, "c");
    c.push_back(add(8 * MiB));
  }
  const std::int64_t reserved = stat("reserved_bytes.all.current");
  // Errors: not spillable, never used, unknown flags.
  try {
    (void)alloc->spill(0, "c");
    FAIL() << "a tag without STITCH_REGION_SPILL spilled";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'c'"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)alloc->spill(0, "nope"), invalid_argument);
  EXPECT_THROW(alloc->begin_region("x", 4), invalid_argument);
  // More than the host holds: nothing moves.
  try {
    (void)alloc->spill(0, "b");
    FAIL() << "100 MiB went to a 96 MiB host";
  } catch (const out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find("nothing moved"), std::string::npos) << e.what();
  }
  expect_books();
  EXPECT_EQ(stat("spilled_bytes.current"), 0);
  EXPECT_EQ(stat("reserved_bytes.all.current"), reserved);
  EXPECT_EQ(sim->usage(0).host_pages, 0u);
  // Part of it: at least the bytes asked.
  EXPECT_GE(alloc->spill(0, "b", 30 * MiB), 30 * MiB);
  EXPECT_GE(stat("spilled_bytes.current"), static_cast<std::int64_t>(30 * MiB));
  EXPECT_LT(stat("reserved_bytes.all.current"), reserved) << "the device pages went back";
  expect_books();
  // All of 'a'.
  (void)alloc->spill(0, "a");
  expect_books();
  expect_intact(a);
  expect_intact(b);
  expect_intact(c);
  // Back again.
  alloc->unspill(0, "a,b");
  expect_books();
  EXPECT_EQ(stat("spilled_bytes.current"), 0);
  EXPECT_EQ(stat("num_unspills"), 1);
  expect_intact(a);
  expect_intact(b);
}

TEST_P(Spill, UnspillWithoutRoomFailsNamingWhatStaysAndSucceedsLater) {
  make("");
  std::vector<Live> w;
  {
    Allocator::Region r(*alloc, "weights", Allocator::kRegionSpill);
    for (int i = 0; i < 4; ++i) w.push_back(add(25 * MiB));
  }
  (void)alloc->spill(0, "weights");
  std::vector<Live> fill;
  for (;;) {
    Live l = add(20 * MiB);
    if (l.ptr == nullptr) break;
    fill.push_back(l);
  }
  try {
    alloc->unspill(0, "weights");
    FAIL() << "the unspill found room on a full device";
  } catch (const out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find("tag 'weights'"), std::string::npos) << e.what();
  }
  expect_books();
  expect_intact(w);
  expect_intact(fill);
  for (const Live& l : fill) alloc->deallocate(l.ptr);
  alloc->unspill(0);
  expect_books();
  EXPECT_EQ(stat("spilled_bytes.current"), 0);
  expect_intact(w);
}

TEST_P(Spill, TheHostBudgetRunsOutWithoutLosingAByte) {
  make("spill:all,spill_limit_mb:96", 0);
  std::vector<Live> live;
  for (int i = 0; i < 40; ++i) {
    Live l = add(20 * MiB);
    if (l.ptr == nullptr) break;
    live.push_back(l);
  }
  EXPECT_LT(live.size(), 40u);
  EXPECT_LE(stat("spilled_bytes.current"), static_cast<std::int64_t>(96 * MiB));
  EXPECT_GT(stat("num_ooms"), 0);
  expect_books();
  expect_intact(live);
  for (const Live& l : live) alloc->deallocate(l.ptr);
  expect_books();
}

TEST_P(Spill, SimHostMbBoundsSpillToo) {
  make("spill:all", 64 * MiB);
  std::vector<Live> live;
  for (int i = 0; i < 40; ++i) {
    Live l = add(20 * MiB);
    if (l.ptr == nullptr) break;
    live.push_back(l);
  }
  EXPECT_LT(live.size(), 40u);
  EXPECT_LE(sim->usage(0).host_pages, 64 * MiB);
  expect_books();
  expect_intact(live);
}

TEST_P(Spill, AFaultAtEveryNewCallLeavesEveryBlockWithItsDataAtItsAddress) {
  make("");
  std::vector<Live> t;
  {
    Allocator::Region r(*alloc, "t", Allocator::kRegionSpill);
    for (int i = 0; i < 3; ++i) t.push_back(add(30 * MiB));
  }
  // (A spill gives the ranges' free pages back: one cycle first, to compare with.)
  (void)alloc->spill(0, "t");
  alloc->unspill(0);
  const std::int64_t reserved = stat("reserved_bytes.all.current");
  for (SimCall call : {SimCall::create_host_physical, SimCall::reserve, SimCall::map, SimCall::set_access,
                       SimCall::copy, SimCall::synchronize_stream, SimCall::unmap,
                       SimCall::synchronize_device}) {
    for (std::uint64_t nth : {1, 2}) {
      sim->inject_fault(call, nth, SimFault::error);
      try {
        (void)alloc->spill(0, "t");
      } catch (const error&) {
      }
      sim->clear_faults();
      alloc->validate();
      expect_intact(t);
      // Whatever moved comes back whole.
      alloc->unspill(0);
      expect_books();
      EXPECT_EQ(stat("reserved_bytes.all.current"), reserved) << to_string(call) << " #" << nth;
      expect_intact(t);
    }
  }
  // Out of host memory at the second host page: nothing moved.
  sim->inject_fault(SimCall::create_host_physical, 2, SimFault::out_of_memory);
  EXPECT_THROW((void)alloc->spill(0, "t"), out_of_memory);
  sim->clear_faults();
  expect_books();
  EXPECT_EQ(stat("spilled_bytes.current"), 0);
  // Faults on the way back: it stays on the host, usable, and a later unspill succeeds.
  (void)alloc->spill(0, "t");
  for (SimCall call : {SimCall::create_physical, SimCall::map, SimCall::copy, SimCall::unmap}) {
    sim->inject_fault(call, 1, SimFault::error);
    try {
      alloc->unspill(0);
    } catch (const error&) {
    }
    sim->clear_faults();
    alloc->validate();
    expect_intact(t);
    (void)alloc->spill(0, "t");
  }
  alloc->unspill(0);
  expect_books();
  expect_intact(t);
}

TEST_P(Spill, ASpilledTagSleepsAndWakesWithItsBackup) {
  make("");
  std::vector<Live> w;
  {
    Allocator::Region r(*alloc, "w", Allocator::kRegionSpill | Allocator::kRegionBackup);
    for (int i = 0; i < 3; ++i) w.push_back(add(10 * MiB + static_cast<std::size_t>(i) * MiB));
  }
  (void)alloc->spill(0, "w", 1);
  ASSERT_GT(stat("spilled_bytes.current"), 0);
  alloc->sleep(0, "w");
  expect_books();
  EXPECT_EQ(stat("spilled_bytes.current"), 0);
  alloc->wake(0, "w");
  expect_books();
  expect_intact(w);
}

TEST_P(Spill, WithRoomSpillCostsNothing) {
  // The same requests with spill off and with spill:all on a device with room: the same device
  // calls of every kind, no host page, no copy over the bus.
  std::vector<std::uint64_t> calls[2];
  for (int on = 0; on < 2; ++on) {
    make(on != 0 ? "spill:all" : "");
    std::vector<Live> live;
    for (int i = 0; i < 60; ++i) {
      live.push_back(add((static_cast<std::size_t>(i) * 7919 % 64 + 1) * 64 * 1024));
      if (i % 3 == 2) {
        alloc->deallocate(live[static_cast<std::size_t>(i) / 2].ptr);
        live[static_cast<std::size_t>(i) / 2].ptr = nullptr;
      }
    }
    for (const Live& l : live)
      if (l.ptr != nullptr) alloc->deallocate(l.ptr);
    alloc->empty_cache();
    for (int k = 0; k < static_cast<int>(SimCall::count_); ++k)
      calls[on].push_back(sim->call_count(static_cast<SimCall>(k)));
    EXPECT_EQ(sim->bus_copies().first, 0u);
    EXPECT_EQ(stat("num_spills"), 0);
  }
  EXPECT_EQ(calls[0], calls[1]);
}

TEST_P(Spill, TheSimulatedDeviceCountsSpillCopiesAsBusCopies) {
  make("");
  {
    Allocator::Region r(*alloc, "t", Allocator::kRegionSpill);
    (void)add(30 * MiB);
  }
  const std::uint64_t copies = sim->call_count(SimCall::copy);
  const std::size_t moved = alloc->spill(0, "t");
  alloc->unspill(0);
  const auto [bus, bus_bytes] = sim->bus_copies();
  EXPECT_EQ(bus, sim->call_count(SimCall::copy) - copies) << "every spill copy crosses the bus";
  EXPECT_EQ(bus_bytes, 2 * moved) << "out and back";
}

TEST_P(Spill, TheOutOfMemoryReportNamesTheSpillSettingThatWouldServeIt) {
  make("");  // spill off
  {
    Allocator::Region r(*alloc, "cold", Allocator::kRegionSpill);
    for (int i = 0; i < 5; ++i) (void)add(30 * MiB);
  }
  std::vector<Live> untagged;
  for (int i = 0; i < 3; ++i) untagged.push_back(add(30 * MiB));
  try {
    (void)alloc->allocate(100 * MiB);
    FAIL() << "100 MiB fit a device holding 240 MiB of 256";
  } catch (const out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find("Spill: spill:tags would have served it"), std::string::npos) << e.what();
  }
  try {
    (void)alloc->allocate(200 * MiB);
    FAIL() << "200 MiB fit";
  } catch (const out_of_memory& e) {
    EXPECT_NE(std::string(e.what()).find("Spill: spill:all would have served it"), std::string::npos) << e.what();
  }
  try {
    (void)alloc->allocate(600 * MiB);
    FAIL() << "600 MiB fit";
  } catch (const out_of_memory& e) {
    EXPECT_EQ(std::string(e.what()).find("would have served it"), std::string::npos) << e.what();
  }
}

// Memory on host pages is allocated but not on the device: the out-of-memory report judges the
// device by what lives there (here fragmentation, not "live data exceeds the device", though the
// allocations with those on the host exceed it) and the summary counts the host pages it holds.
TEST(SpillReport, TheOutOfMemoryReportJudgesTheDeviceByWhatLivesOnIt) {
  SimBackend::Options o;
  o.capacity = kDevice;
  auto sim = std::make_shared<SimBackend>(o);
  Allocator alloc(Config::parse("backend:sim,expandable_segments:True,spill:all,spill_limit_mb:80"), sim);
  std::vector<void*> cold, warm;
  {
    Allocator::Region r(alloc, "cold", Allocator::kRegionSpill);
    for (int i = 0; i < 4; ++i) cold.push_back(alloc.allocate(20 * MiB));
  }
  EXPECT_EQ(alloc.spill(0, "cold"), 80 * MiB);
  // 240 MiB of the device in 30 MiB blocks over 20 MiB pages; every other one freed: 90 MiB free
  // in pieces that share pages with live blocks.
  for (int i = 0; i < 8; ++i) warm.push_back(alloc.allocate(30 * MiB));
  for (int i = 1; i < 8; i += 2) alloc.deallocate(warm[static_cast<std::size_t>(i)]);
  std::string report;
  try {
    (void)alloc.allocate(100 * MiB);
    FAIL() << "100 MiB fit with 120 MiB live on a 256 MiB device, no page free and the host full";
  } catch (const out_of_memory& e) {
    report = e.what();
  }
  auto stat = [&](const char* key) { return *alloc.stat(0, key); };
  EXPECT_EQ(stat("spilled_bytes.current"), static_cast<std::int64_t>(80 * MiB));
  EXPECT_NE(report.find("Verdict: fragmentation"), std::string::npos) << report;
  EXPECT_NE(report.find("Live on the device: 120.00 MiB (80.00 MiB of the allocations is on host pages)"),
            std::string::npos) << report;
  const auto unallocated = static_cast<std::size_t>(stat("reserved_bytes.all.current")) - 120 * MiB;
  EXPECT_NE(report.find(detail::format_size(unallocated) + " is reserved by stitch but unallocated"), std::string::npos)
      << report;
  EXPECT_NE(report.find("Spill: spill:all is on and 80.00 MiB is on host pages"), std::string::npos) << report;
  EXPECT_NE(report.find("What-if: not run: 80.00 MiB is on host pages"), std::string::npos) << report;
  // The summary: what stitch holds (device and host pages) less the allocations, never negative.
  const std::int64_t held = stat("reserved_bytes.all.current") + stat("spilled_bytes.current");
  const std::string summary = alloc.memory_summary(0);
  EXPECT_NE(summary.find("| Reserved but unallocated  | " +
                         detail::format_size(static_cast<std::size_t>(held - stat("allocated_bytes.all.current"))) +
                         " ("),
            std::string::npos)
      << summary;
  EXPECT_NE(summary.find("% of reserved and spilled)"), std::string::npos) << summary;
  for (int i = 0; i < 8; i += 2) alloc.deallocate(warm[static_cast<std::size_t>(i)]);
  for (void* p : cold) alloc.deallocate(p);
  alloc.validate();
  EXPECT_EQ(stat("spilled_bytes.current"), 0);
}

TEST_P(Spill, AllMovesOnlyMemoryWhoseStreamsShowNoWorkSinceTheSync) {
  // What spill:all guarantees when another host thread keeps launching work (docs/spill.md,
  // "When spill:all is safe"): after the rung's device synchronization a range moves only when
  // every stream its blocks use shows no work queued since (an event recorded there completes at
  // once). Stream B stands for another thread's stream, held busy; the requests come on stream A.
  make("spill:all");
  void* const a_stream = reinterpret_cast<void*>(0x10);
  void* const b_stream = reinterpret_cast<void*>(0x20);
  auto on = [&](std::size_t size, void* stream) -> Live {
    void* p = nullptr;
    try {
      p = alloc->allocate(size, stream);
    } catch (const out_of_memory&) {
    }
    Live l{p, size, ++seed};
    if (p != nullptr) write_pattern(p, size, l.seed);
    return l;
  };
  auto spilled_on = [&](void* stream) {
    std::size_t n = 0;
    for (const SegmentSnapshot& seg : alloc->snapshot().segments)
      if (seg.stream == reinterpret_cast<std::uintptr_t>(stream)) n += seg.spilled_bytes;
    return n;
  };
  std::vector<Live> live{on(100 * MiB, b_stream), on(100 * MiB, a_stream)};  // B's range is the older
  ASSERT_NE(live[0].ptr, nullptr);
  ASSERT_NE(live[1].ptr, nullptr);
  sim->hold_stream(b_stream);  // another thread's kernels on B, queued after any synchronization
  // A request on A that moving A's own memory serves: B's memory, the oldest, stays.
  live.push_back(on(100 * MiB, a_stream));
  ASSERT_NE(live.back().ptr, nullptr) << "A's memory was idle and could move";
  EXPECT_EQ(spilled_on(b_stream), 0u) << "memory of a stream with new work moved";
  EXPECT_GT(spilled_on(a_stream), 0u) << "A's own memory made the room";
  expect_intact(live);
  expect_books();
  // A request only B's memory could serve fails while B has work, and B's memory stays.
  Live big = on(200 * MiB, a_stream);
  EXPECT_EQ(big.ptr, nullptr);
  EXPECT_EQ(spilled_on(b_stream), 0u);
  expect_intact(live);
  // B's work done: its memory is idle and moves.
  sim->release_stream(b_stream);
  big = on(200 * MiB, a_stream);
  ASSERT_NE(big.ptr, nullptr) << "B's memory was idle and could move";
  EXPECT_GT(spilled_on(b_stream), 0u);
  live.push_back(big);
  expect_intact(live);
  expect_books();
  for (const Live& l : live) alloc->deallocate(l.ptr);
}

TEST_P(Spill, ConfigurationSaysWhatSpillNeeds) {
  EXPECT_THROW((void)Config::parse("backend:sim,spill:all"), config_error) << "no expandable segments";
  EXPECT_THROW((void)Config::parse("backend:sim,expandable_segments:True,spill:some"), config_error);
  const Config c = Config::parse("backend:sim,expandable_segments:True,spill:tags,spill_limit_mb:5");
  EXPECT_EQ(c.spill, Config::Spill::tags);
  EXPECT_EQ(c.spill_limit, 5 * MiB);
  EXPECT_NE(c.to_string().find("spill:tags"), std::string::npos) << c.to_string();
  EXPECT_NE(c.to_string().find("spill_limit_mb:5"), std::string::npos) << c.to_string();
}

INSTANTIATE_TEST_SUITE_P(Configs, Spill,
                         ::testing::Values("backend:sim,expandable_segments:True",
                                           "backend:sim,expandable_segments:True,stitching:True"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.index == 0 ? "expandable" : "stitching");
                         });

}  // namespace
}  // namespace stitch
