// tests/expandable_ranges_test.cpp — expandable segments (core/expandable_ranges.hpp) on the simulated device: growth by mapping
// pages instead of new segments, refilling holes, unmapping free pages on empty_cache and under
// memory pressure, stream safety before unmapping, and consistency under random use.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/sim_backend.hpp"

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

struct Fixture {
  explicit Fixture(std::size_t capacity_mb = 1024, const char* extra = "") {
    stitch::SimBackend::Options o;
    o.capacity = capacity_mb * kMiB;
    sim = std::make_shared<stitch::SimBackend>(o);
    std::string conf = std::string("backend:sim,expandable_segments:True") + extra;
    alloc = std::make_unique<stitch::Allocator>(stitch::Config::parse(conf), sim);
  }
  std::int64_t stat(const char* key) const { return *alloc->stat(0, key); }
  std::shared_ptr<stitch::SimBackend> sim;
  std::unique_ptr<stitch::Allocator> alloc;
};

TEST(Expandable, GrowsByMappingPagesNotNewSegments) {
  Fixture f;
  std::vector<void*> blocks;
  for (int i = 0; i < 10; ++i) blocks.push_back(f.alloc->allocate(24 * kMiB));
  EXPECT_EQ(f.stat("segment.all.current"), 0) << "expandable ranges are not cudaMalloc segments";
  EXPECT_EQ(f.sim->usage(0).reservations, 1u) << "one reserved range for the large pool";
  EXPECT_EQ(f.sim->usage(0).allocations, 0u) << "no plain device allocation was made";
  // 240 MiB requested: mapped in 20 MiB pages, so reserved is 240 MiB rounded up to pages.
  EXPECT_EQ(f.stat("reserved_bytes.all.current"), static_cast<std::int64_t>(240 * kMiB));
  // Consecutive blocks are contiguous in the one range.
  for (std::size_t i = 1; i < blocks.size(); ++i)
    EXPECT_EQ(static_cast<char*>(blocks[i]), static_cast<char*>(blocks[i - 1]) + 24 * kMiB);
  for (void* p : blocks) f.alloc->deallocate(p);
  f.alloc->validate();
}

TEST(Expandable, FreedNeighboursMergeAcrossWhatWouldBeSegments) {
  // Without expandable segments, 8 x 16 MiB then a 64 MiB request needs a new segment; with
  // them, the freed blocks coalesce into one range that serves the large request.
  Fixture f;
  std::vector<void*> small;
  for (int i = 0; i < 8; ++i) small.push_back(f.alloc->allocate(16 * kMiB));
  const auto reserved = f.stat("reserved_bytes.all.current");
  for (void* p : small) f.alloc->deallocate(p);
  void* big = f.alloc->allocate(64 * kMiB);
  EXPECT_EQ(big, small[0]);
  EXPECT_EQ(f.stat("reserved_bytes.all.current"), reserved) << "no new memory was mapped";
  f.alloc->deallocate(big);
  f.alloc->validate();
}

TEST(Expandable, SmallAndLargePoolsUseSeparateRangesAndPageSizes) {
  Fixture f;
  void* s = f.alloc->allocate(4096);
  EXPECT_EQ(f.stat("reserved_bytes.small_pool.current"), static_cast<std::int64_t>(2 * kMiB));
  void* l = f.alloc->allocate(3 * kMiB);
  EXPECT_EQ(f.stat("reserved_bytes.large_pool.current"), static_cast<std::int64_t>(20 * kMiB));
  EXPECT_EQ(f.sim->usage(0).reservations, 2u);
  f.alloc->deallocate(s);
  f.alloc->deallocate(l);
}

TEST(Expandable, EmptyCacheUnmapsFreePagesAndReleasesTheRange) {
  Fixture f;
  void* a = f.alloc->allocate(100 * kMiB);
  void* b = f.alloc->allocate(1 * kMiB + 1);
  f.alloc->deallocate(a);
  const auto maps = f.stat("num_device_alloc");
  f.alloc->empty_cache();
  // b keeps one page mapped; a's pages are gone.
  EXPECT_EQ(f.stat("reserved_bytes.all.current"), static_cast<std::int64_t>(20 * kMiB));
  EXPECT_GT(f.stat("num_device_free"), 0);
  EXPECT_EQ(f.stat("num_device_alloc"), maps);
  f.alloc->validate();
  f.alloc->deallocate(b);
  f.alloc->empty_cache();
  EXPECT_EQ(f.stat("reserved_bytes.all.current"), 0);
  const stitch::SimUsage u = f.sim->usage(0);
  EXPECT_EQ(u.used, 0u);
  EXPECT_EQ(u.physical_handles, 0u);
  EXPECT_EQ(u.mappings, 0u);
  EXPECT_EQ(u.reservations, 0u) << "a wholly unmapped range is given back";
  f.alloc->validate();
}

TEST(Expandable, HolesAreRefilledBeforeGrowingAtTheEnd) {
  Fixture f;
  void* a = f.alloc->allocate(40 * kMiB);
  void* b = f.alloc->allocate(40 * kMiB);
  void* c = f.alloc->allocate(40 * kMiB);
  f.alloc->deallocate(b);
  f.alloc->empty_cache();  // unmaps b's pages: a hole in the middle of the range
  EXPECT_EQ(f.stat("reserved_bytes.all.current"), static_cast<std::int64_t>(80 * kMiB));
  void* d = f.alloc->allocate(40 * kMiB);
  EXPECT_EQ(d, b) << "the hole is mapped again rather than growing past c";
  for (void* p : {a, c, d}) f.alloc->deallocate(p);
  f.alloc->validate();
}

TEST(Expandable, AHoleBetweenFreeBlocksServesWhatTheirSumHolds) {
  // PyTorch's search: a free block, the hole after it and the free block after that count
  // together. [b1 30][free 10 | hole 40][free 30][b4 10]: a 70 MiB request maps the hole and
  // takes the three, instead of mapping 80 MiB at the end.
  Fixture f;
  char* b1 = static_cast<char*>(f.alloc->allocate(30 * kMiB));  // pages [0, 40)
  void* b2 = f.alloc->allocate(50 * kMiB);                     // [30, 80)
  void* b3 = f.alloc->allocate(30 * kMiB);                     // [80, 110), pages to 120
  void* b4 = f.alloc->allocate(10 * kMiB);                     // [110, 120)
  ASSERT_EQ(static_cast<char*>(b2), b1 + 30 * kMiB);
  ASSERT_EQ(static_cast<char*>(b4), b1 + 110 * kMiB);
  f.alloc->deallocate(b2);
  f.alloc->empty_cache();  // unmaps [40, 80): free [30, 40) stays
  EXPECT_EQ(f.stat("reserved_bytes.all.current"), static_cast<std::int64_t>(80 * kMiB));
  f.alloc->deallocate(b3);  // free [80, 110)
  const auto maps = f.sim->call_count(stitch::SimCall::map);
  void* big = f.alloc->allocate(70 * kMiB);
  EXPECT_EQ(static_cast<char*>(big), b1 + 30 * kMiB);
  EXPECT_EQ(f.stat("reserved_bytes.all.current"), static_cast<std::int64_t>(120 * kMiB));
  EXPECT_EQ(f.sim->call_count(stitch::SimCall::map), maps + 2) << "the hole's two pages";
  f.alloc->validate();
  for (void* p : {static_cast<void*>(b1), big, b4}) f.alloc->deallocate(p);
}

TEST(Expandable, UnmapWaitsForTheSegmentStream) {
  Fixture f;
  auto* s = reinterpret_cast<stitch::stream_t>(0x42);
  void* a = f.alloc->allocate(40 * kMiB, s);
  f.sim->hold_stream(s);
  f.alloc->deallocate(a);
  const auto syncs = f.sim->call_count(stitch::SimCall::synchronize_stream);
  const auto unmaps = f.sim->call_count(stitch::SimCall::unmap);
  f.alloc->empty_cache();
  EXPECT_EQ(f.sim->call_count(stitch::SimCall::synchronize_stream), syncs + 1)
      << "unmapping synchronized the segment's stream first";
  EXPECT_GT(f.sim->call_count(stitch::SimCall::unmap), unmaps);
  f.sim->release_stream(s);
  EXPECT_EQ(f.stat("reserved_bytes.all.current"), 0);
}

TEST(Expandable, MemoryPressureUnmapsFreePagesOfOtherStreams) {
  Fixture f(256);
  auto* s1 = reinterpret_cast<stitch::stream_t>(0x1);
  auto* s2 = reinterpret_cast<stitch::stream_t>(0x2);
  void* a = f.alloc->allocate(200 * kMiB, s1);
  f.alloc->deallocate(a);  // cached on s1's range
  void* b = f.alloc->allocate(200 * kMiB, s2);  // needs s1's pages back
  EXPECT_NE(b, nullptr);
  EXPECT_EQ(f.stat("num_alloc_retries"), 1);
  f.alloc->deallocate(b);
  f.alloc->validate();
}

TEST(Expandable, OutOfMemoryLeavesNoPartialMapping) {
  Fixture f(100);
  void* a = f.alloc->allocate(60 * kMiB);
  EXPECT_THROW((void)f.alloc->allocate(60 * kMiB), stitch::out_of_memory);
  EXPECT_EQ(f.stat("reserved_bytes.all.current"), static_cast<std::int64_t>(60 * kMiB));
  EXPECT_EQ(f.sim->usage(0).used, 60 * kMiB);
  f.alloc->validate();
  f.alloc->deallocate(a);
}

TEST(Expandable, MapFaultsAreUndone) {
  for (stitch::SimCall call : {stitch::SimCall::create_physical, stitch::SimCall::map}) {
    for (std::uint64_t nth = 1; nth <= 3; ++nth) {
      Fixture f;
      f.sim->inject_fault(call, nth, stitch::SimFault::error);
      EXPECT_THROW((void)f.alloc->allocate(60 * kMiB), stitch::backend_error);
      f.alloc->validate();
      EXPECT_EQ(f.sim->usage(0).used, 0u) << to_string(call) << " fault " << nth;
      EXPECT_EQ(f.sim->usage(0).mappings, 0u);
      void* p = f.alloc->allocate(60 * kMiB);  // works again
      f.alloc->deallocate(p);
    }
  }
}

TEST(Expandable, ThroughTheMaxSplitSizeSettingToo) {
  Fixture f(1024, ",max_split_size_mb:40");
  void* a = f.alloc->allocate(100 * kMiB);
  f.alloc->deallocate(a);
  void* b = f.alloc->allocate(10 * kMiB);  // served from the free range: expandable ignores it
  EXPECT_EQ(a, b);
  f.alloc->deallocate(b);
  f.alloc->validate();
}

TEST(Expandable, ConfigRejectedWhenBackendLacksVirtualMemory) {
  // A backend without the VMM calls must refuse expandable segments, not ignore them silently.
  class NoVmm : public stitch::SimBackend {
   public:
    bool supports_virtual_memory(int) override { return false; }
  };
  EXPECT_THROW(stitch::Allocator(stitch::Config::parse("backend:sim,expandable_segments:True"),
                                 std::make_shared<NoVmm>()),
               stitch::config_error);
}

// Random use with data checks, in both modes: the same invariants hold.
class Modes : public ::testing::TestWithParam<bool> {};

TEST_P(Modes, RandomUseKeepsDataAndInvariants) {
  stitch::SimBackend::Options o;
  o.capacity = 2048 * kMiB;
  auto sim = std::make_shared<stitch::SimBackend>(o);
  stitch::Allocator a(stitch::Config::parse(GetParam() ? "backend:sim,expandable_segments:True"
                                                       : "backend:sim"),
                      sim);
  std::mt19937_64 rng(7);
  struct Live {
    unsigned char* p;
    std::size_t n;
    unsigned char tag;
  };
  std::vector<Live> live;
  stitch::stream_t streams[3] = {nullptr, reinterpret_cast<stitch::stream_t>(0x10),
                                 reinterpret_cast<stitch::stream_t>(0x20)};
  for (int i = 0; i < 60000; ++i) {
    if (live.empty() || rng() % 2 == 0) {
      const std::size_t n = rng() % 5 == 0 ? 1 + rng() % (48 * kMiB) : 1 + rng() % kMiB;
      try {
        auto* p = static_cast<unsigned char*>(a.allocate(n, streams[rng() % 3]));
        const auto tag = static_cast<unsigned char>(rng());
        for (std::size_t off = 0; off < n; off += 4096) p[off] = tag;
        p[n - 1] = tag;
        live.push_back({p, n, tag});
      } catch (const stitch::out_of_memory&) {
      }
    } else {
      const std::size_t k = rng() % live.size();
      const Live l = live[k];
      live[k] = live.back();
      live.pop_back();
      for (std::size_t off = 0; off < l.n; off += 4096) ASSERT_EQ(l.p[off], l.tag);
      ASSERT_EQ(l.p[l.n - 1], l.tag);
      a.deallocate(l.p);
    }
    if (i % 5000 == 0) {
      a.validate();
      if (i % 15000 == 0) a.empty_cache();
    }
  }
  for (const Live& l : live) a.deallocate(l.p);
  a.empty_cache();
  a.validate();
  EXPECT_EQ(sim->usage(0).used, 0u);
  EXPECT_EQ(*a.stat(0, "reserved_bytes.all.current"), 0);
}

INSTANTIATE_TEST_SUITE_P(Allocator, Modes, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "expandable" : "segments"; });

}  // namespace
