// Compaction (stitch_compact:True, core/compactor.hpp) on the simulated device: the promise at
// granule size — a request fails only if the device cannot supply the granules that hold no live
// data — on generated worst cases (random sizes, a live block at the start or at the end of
// every coarse page, several streams), with every live block's contents checked at its address
// afterwards; pinned blocks stay where they are; a fault at any step leaves every block with its
// data and fails the request with the out-of-memory report.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/config.hpp"
#include "stitch/errors.hpp"
#include "stitch/sim_backend.hpp"
#include "support/compaction_scenario.hpp"
#include "support/data_pattern.hpp"

namespace stitch {
namespace {

using test::pattern_intact;
using test::write_pattern;

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t kGranule = 2 * MiB;
constexpr std::size_t kCapacity = 1024 * MiB;

stream_t S(int n) { return reinterpret_cast<stream_t>(static_cast<std::uintptr_t>(n) * 0x10); }

constexpr const char* kCompact = "backend:sim,expandable_segments:True,stitching:True,stitch_compact:True";
constexpr const char* kNoCompact = "backend:sim,expandable_segments:True,stitching:True";

struct Live {
  void* ptr;
  std::size_t size;
  std::uint64_t seed;
};

/// A device of kCapacity with a fragmented fill, and the promise's measure of it.
struct Fragmented {
  std::shared_ptr<SimBackend> sim;
  std::unique_ptr<Allocator> alloc;
  std::vector<Live> live;
  std::uint64_t seed = 1;

  explicit Fragmented(const char* conf) {
    SimBackend::Options o;
    o.capacity = kCapacity;
    sim = std::make_shared<SimBackend>(o);
    alloc = std::make_unique<Allocator>(Config::parse(conf), sim);
  }
  /// Allocates `size` on `stream` with a pattern; false when the device is full.
  bool add(std::size_t size, stream_t stream = nullptr) {
    void* p = nullptr;
    try {
      p = alloc->allocate(size, stream);
    } catch (const out_of_memory&) {
      return false;
    }
    live.push_back(Live{p, size, ++seed});
    write_pattern(p, size, live.back().seed);
    return true;
  }
  void drop(std::size_t i) {
    alloc->deallocate(live[i].ptr);
    live[i] = live.back();
    live.pop_back();
  }
  /// The granules no live block touches: what the device could supply for one request.
  [[nodiscard]] std::size_t free_of_live() const {
    std::set<std::uintptr_t> touched;
    for (const Live& b : live) {
      const auto a = reinterpret_cast<std::uintptr_t>(b.ptr);
      for (std::uintptr_t g = a / kGranule; g <= (a + b.size - 1) / kGranule; ++g) touched.insert(g);
    }
    return kCapacity / kGranule - touched.size();
  }
  void expect_intact() const {
    for (const Live& b : live)
      EXPECT_TRUE(pattern_intact(b.ptr, b.size, b.seed)) << "the block at " << b.ptr << " of " << b.size;
    EXPECT_NO_THROW(alloc->validate());
  }
  [[nodiscard]] std::int64_t stat(const char* key) const { return alloc->stat(0, key).value_or(-1); }
};

/// Random 1-64 MiB blocks (odd sizes) on `streams` streams until the device is full, then a
/// random half freed.
void fill_random(Fragmented& f, std::uint64_t seed, int streams) {
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 10000; ++i) {
    const std::size_t size = (1 + rng() % 64) * MiB - rng() % 4096;
    if (!f.add(size, S(static_cast<int>(rng() % streams)))) break;
  }
  std::shuffle(f.live.begin(), f.live.end(), rng);
  const std::size_t half = f.live.size() / 2;
  for (std::size_t i = 0; i < half; ++i) f.drop(f.live.size() - 1);
}

/// Pairs of blocks that fill 20 MiB coarse pages exactly, one of each pair freed: the live one at
/// the start (`at_start`) or at the end of every page.
void fill_pages(Fragmented& f, bool at_start) {
  const std::size_t small = 3 * MiB, big = 17 * MiB;
  std::vector<std::size_t> freed;
  for (int i = 0; i < 10000; ++i) {
    if (!f.add(at_start ? small : big)) break;
    if (!at_start) freed.push_back(f.live.size() - 1);
    if (!f.add(at_start ? big : small)) break;
    if (at_start) freed.push_back(f.live.size() - 1);
  }
  std::sort(freed.rbegin(), freed.rend());
  for (std::size_t i : freed) f.drop(i);
}

/// Asks for every granule no live block touches, in one request (`compacts`: compaction is what
/// serves it).
void expect_the_promise(Fragmented& f, bool compacts = true) {
  const std::size_t want = f.free_of_live() * kGranule;
  const std::int64_t syncs = f.stat("num_device_syncs");
  ASSERT_GT(want, 64 * MiB) << "the fill left too little to ask for";
  void* p = nullptr;
  EXPECT_NO_THROW(p = f.alloc->allocate(want)) << "a request of every granule free of live data ("
                                               << want / MiB << " MiB) failed";
  f.expect_intact();
  if (compacts) {
    EXPECT_GT(f.stat("num_compactions"), 0);
    EXPECT_GT(f.stat("compacted_bytes"), 0);
    EXPECT_EQ(f.stat("num_device_syncs"), syncs + 1) << "one device sync for the request";
  }
  if (p != nullptr) {
    write_pattern(p, want, 99);
    EXPECT_TRUE(pattern_intact(p, want, 99));
    f.expect_intact();
    f.alloc->deallocate(p);
  }
}

/// Without compaction the same request fails (the promise is compaction's).
void expect_stitching_alone_fails(Fragmented& f) {
  EXPECT_THROW((void)f.alloc->allocate(f.free_of_live() * kGranule), out_of_memory);
  f.expect_intact();
}

TEST(Compaction, RandomSizesGetEveryGranuleFreeOfLiveData) {
  for (std::uint64_t seed : {1, 2, 3}) {
    SCOPED_TRACE(seed);
    Fragmented f(kCompact);
    fill_random(f, seed, 1);
    expect_the_promise(f);
  }
  Fragmented control(kNoCompact);
  fill_random(control, 1, 1);
  expect_stitching_alone_fails(control);
}

TEST(Compaction, ALiveBlockAtTheStartOfEveryCoarsePage) {
  Fragmented f(kCompact);
  fill_pages(f, /*at_start=*/true);
  expect_the_promise(f);
  Fragmented control(kNoCompact);
  fill_pages(control, true);
  expect_stitching_alone_fails(control);
}

TEST(Compaction, ALiveBlockAtTheEndOfEveryCoarsePage) {
  // The free start of every coarse page is borrowed (mapped a second time) by the stitch: the
  // promise holds without moving anything, with compaction on or off.
  Fragmented f(kCompact);
  fill_pages(f, /*at_start=*/false);
  expect_the_promise(f, /*compacts=*/false);
  EXPECT_EQ(f.stat("num_compactions"), 0);
  EXPECT_GT(f.stat("num_page_borrows"), 0);
  Fragmented control(kNoCompact);
  fill_pages(control, false);
  expect_the_promise(control, /*compacts=*/false);
}

TEST(Compaction, AFullDeviceStagesThroughHostMemory) {
  // A live block at the start of every coarse page and not a byte free on the device: the
  // first page's live granules wait in host memory while its handle goes back.
  Fragmented f(kCompact);
  fill_pages(f, /*at_start=*/true);
  ASSERT_EQ(f.sim->memory_info(0).free, 0u);
  expect_the_promise(f);
  EXPECT_GE(f.stat("num_staged_compactions"), 1);
  EXPECT_LT(f.stat("num_staged_compactions"), f.stat("num_compactions"))
      << "once one page is free, the others use fresh device pages";
  EXPECT_GT(f.sim->call_count(SimCall::copy_to_host), 0u);
  EXPECT_GT(f.sim->call_count(SimCall::copy), 0u);
}

TEST(Compaction, SeveralStreams) {
  Fragmented f(kCompact);
  fill_random(f, 7, 3);
  expect_the_promise(f);
}

TEST(Compaction, TheGpuScenarioOnTheSimulatedDevice) {
  // tests/cuda/cuda_compaction_test.cu and benchmarks/gpu/compaction_cost.cpp step by step, with
  // the sizes a 2 MiB-granule GPU gets: a live block at the start of every coarse page under a
  // 1 GiB cap, the cap at what is reserved (staged) or one coarse page above it (fresh pages).
  for (const bool room : {false, true}) {
    SCOPED_TRACE(room ? "a coarse page of room" : "no room");
    SimBackend::Options o;
    o.capacity = 4096 * MiB;
    auto sim = std::make_shared<SimBackend>(o);
    Allocator alloc(Config::parse(std::string("backend:sim,") + test::kCompactionConf), sim);
    const std::size_t cap = test::scenario_cap(sim->memory_info(0).free, kGranule, 1024 * MiB);
    ASSERT_EQ(cap, 1024 * MiB);
    test::CoarsePages f = test::fill_coarse_pages(
        alloc, nullptr, kGranule, cap, room ? test::coarse_page(kGranule) : 0,
        [&](const test::ScenarioBlock& b) { write_pattern(b.ptr, b.size, 1000 + b.index); });
    ASSERT_GE(f.live.size(), 40u);
    const std::size_t want = f.free_of_live();
    ASSERT_GT(want, f.cap / 2) << "most of the cap is free of live data";
    const auto stat = [&](const char* k) { return alloc.stat(0, k).value_or(-1); };
    const std::int64_t compactions = stat("num_compactions"), staged = stat("num_staged_compactions");
    const std::int64_t copied = stat("compacted_bytes"), syncs = stat("num_device_syncs");
    void* big = nullptr;
    ASSERT_NO_THROW(big = alloc.allocate(want)) << want / MiB << " MiB free of live data under "
                                                << f.cap / MiB << " MiB";
    EXPECT_GT(stat("num_compactions"), compactions);
    EXPECT_EQ(stat("num_staged_compactions") - staged, room ? 0 : 1);
    EXPECT_GT(stat("compacted_bytes"), copied);
    EXPECT_LE(stat("compacted_bytes") - copied, static_cast<std::int64_t>(f.live_bytes()));
    EXPECT_EQ(stat("num_device_syncs"), syncs + 1);
    EXPECT_LE(stat("reserved_bytes.all.current"), static_cast<std::int64_t>(f.cap));
    for (const test::ScenarioBlock& b : f.live)
      EXPECT_TRUE(pattern_intact(b.ptr, b.size, 1000 + b.index)) << "the block at " << b.ptr;
    write_pattern(big, want, 99);
    EXPECT_TRUE(pattern_intact(big, want, 99));
    EXPECT_NO_THROW(alloc.validate());
    alloc.deallocate(big);
    for (const test::ScenarioBlock& b : f.live) alloc.deallocate(b.ptr);
    alloc.empty_cache();
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
  }
}

TEST(Compaction, AHopelessRequestMovesNothing) {
  // One granule more than every granule free of live data: emptying every page could not serve
  // it, so no page moves, nothing syncs, and the request fails with the report at once. The
  // promise's own size, asked next, is still served.
  Fragmented f(kCompact);
  fill_pages(f, /*at_start=*/true);
  const std::size_t want = f.free_of_live() * kGranule;
  const std::size_t copies = f.sim->call_count(SimCall::copy) + f.sim->call_count(SimCall::copy_to_host);
  EXPECT_THROW((void)f.alloc->allocate(want + kGranule), out_of_memory);
  EXPECT_EQ(f.stat("num_compactions"), 0);
  EXPECT_EQ(f.stat("num_device_syncs"), 0);
  EXPECT_EQ(f.stat("num_compactions_refused"), 1);
  EXPECT_EQ(f.sim->call_count(SimCall::copy) + f.sim->call_count(SimCall::copy_to_host), copies);
  f.expect_intact();
  expect_the_promise(f);
}

TEST(Compaction, WithRoomNothingMovesAndNothingSyncs) {
  Fragmented f(kCompact);
  ASSERT_TRUE(f.add(100 * MiB));
  ASSERT_TRUE(f.add(5 * MiB));
  f.drop(0);
  ASSERT_TRUE(f.add(300 * MiB));
  EXPECT_EQ(f.stat("num_compactions"), 0);
  EXPECT_EQ(f.stat("num_device_syncs"), 0);
  EXPECT_EQ(f.sim->call_count(SimCall::copy), 0u);
  EXPECT_EQ(f.sim->call_count(SimCall::synchronize_device), 0u);
}

TEST(Compaction, APinnedBlockKeepsItsPage) {
  Fragmented f(kCompact);
  fill_pages(f, /*at_start=*/true);
  // Every live block pinned: no page may move, so the request is refused.
  for (const Live& b : f.live) f.alloc->pin(b.ptr);
  const std::size_t want = f.free_of_live() * kGranule;
  EXPECT_THROW((void)f.alloc->allocate(want), out_of_memory);
  EXPECT_EQ(f.stat("num_compactions"), 0);
  EXPECT_THROW(f.alloc->unpin(&f), invalid_argument);
  for (const Live& b : f.live) f.alloc->unpin(b.ptr);
  EXPECT_THROW(f.alloc->unpin(f.live[0].ptr), invalid_argument) << "no pin left";
  void* p = f.alloc->allocate(want);
  EXPECT_NE(p, nullptr);
  f.expect_intact();
  f.alloc->deallocate(p);
}

TEST(Compaction, AFaultInItsCallsKeepsEveryBlockAndReportsOutOfMemory) {
  // The calls only compaction makes (the device sync, the device copy, the copy out to the host),
  // failing once: the request fails with the out-of-memory report, every block keeps its data at
  // its address, and the next request (no fault) compacts and succeeds. (Faults in the calls it
  // shares with the rest of the ladder are page_mapper_test's remap tests.)
  struct Case {
    SimCall call;
    bool full;  ///< a full device (staging) or one with room for fresh pages
  };
  for (const Case c : {Case{SimCall::synchronize_device, false}, Case{SimCall::copy, false},
                       Case{SimCall::copy_to_host, true}, Case{SimCall::synchronize_device, true}}) {
    SCOPED_TRACE(std::string(to_string(c.call)) + (c.full ? ", full device" : ", room"));
    Fragmented f(kCompact);
    if (c.full) {
      fill_pages(f, /*at_start=*/true);
    } else {
      fill_random(f, 1, 1);
    }
    const std::size_t want = f.free_of_live() * kGranule;
    f.sim->inject_fault(c.call, 1, SimFault::error);
    try {
      void* p = f.alloc->allocate(want);
      ADD_FAILURE() << "the request succeeded although compaction failed";
      f.alloc->deallocate(p);
    } catch (const out_of_memory& e) {
      EXPECT_NE(std::string(e.what()).find("CUDA out of memory"), std::string::npos);
    }
    f.sim->clear_faults();
    f.expect_intact();
    void* p = nullptr;
    EXPECT_NO_THROW(p = f.alloc->allocate(want)) << "after the fault, compaction serves it";
    f.expect_intact();
    if (p != nullptr) f.alloc->deallocate(p);
  }
}

TEST(Compaction, TheOomReportNamesItWhenItWouldHaveServed) {
  // Stitching alone fails; the what-if replays the recorded history with compaction on and says
  // so, with what it would have copied.
  Fragmented f("backend:sim,expandable_segments:True,stitching:True,record_history:True");
  fill_pages(f, /*at_start=*/true);
  try {
    (void)f.alloc->allocate(f.free_of_live() * kGranule);
    ADD_FAILURE() << "stitching alone served it";
  } catch (const out_of_memory& e) {
    const std::string report = e.what();
    EXPECT_NE(report.find("stitch_compact:True (compaction copying"), std::string::npos) << report;
    EXPECT_NE(report.find("would have served this request"), std::string::npos) << report;
  }
  f.expect_intact();
}

TEST(Compaction, TheKeyNeedsStitching) {
  EXPECT_THROW((void)Config::parse("expandable_segments:True,stitch_compact:True"), config_error);
  EXPECT_EQ(Config::parse(kCompact).to_string().find("stitch_compact:True") != std::string::npos, true);
}

}  // namespace
}  // namespace stitch
