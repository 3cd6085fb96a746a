// Behaviour tests of stitch::Allocator as its users see it, on the simulated device: allocation
// basics, the out-of-memory report, invalid frees, configure(), lifetime, several devices, the
// statistics and thread safety. The tests of each core type are in the file named after it
// (block_store_test.cpp, plain_segments_test.cpp, stream_events_test.cpp, ledger_test.cpp, ...).
#include <gtest/gtest.h>

#include "support/allocator_fixture.hpp"

namespace stitch {
namespace {

using namespace stitch::test;

// ---- basics --------------------------------------------------------------------------------------

TEST_F(AllocatorTest, AllocationIs512AlignedAndWritable) {
  for (std::size_t size : {std::size_t{1}, std::size_t{511}, std::size_t{512}, std::size_t{1000},
                           4 * KiB, MiB, MiB + 1, 3 * MiB, 12 * MiB + 5}) {
    void* p = a().allocate(size);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 512, 0u) << size;
    std::memset(p, 0xA5, size);
    EXPECT_EQ(static_cast<unsigned char*>(p)[size - 1], 0xA5);
  }
  a().validate();
}

TEST_F(AllocatorTest, ZeroBytesReturnsNullAndCountsNothing) {
  EXPECT_EQ(a().allocate(0), nullptr);
  EXPECT_EQ(a().allocate(0, S(1)), nullptr);
  EXPECT_EQ(st("allocation.all.current"), 0);
  EXPECT_EQ(st("num_device_alloc"), 0);
  EXPECT_EQ(st("num_ooms"), 0);
}

TEST_F(AllocatorTest, FreeingNullIsANoOp) {
  a().deallocate(nullptr);
  a().deallocate(nullptr, S(1));
  a().deallocate(nullptr, 100, 0, S(1));
  EXPECT_EQ(st("num_invalid_frees"), 0);
}

TEST_F(AllocatorTest, BlocksDoNotOverlapAndKeepTheirData) {
  std::vector<Live> blocks;
  for (std::size_t size : {std::size_t{700}, 5 * KiB, 200 * KiB, MiB, 2 * MiB, 7 * MiB, 11 * MiB})
    for (int i = 0; i < 3; ++i) blocks.push_back(live(size));
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges;
  for (const Live& b : blocks) {
    const auto p = reinterpret_cast<std::uintptr_t>(b.ptr);
    ranges.emplace_back(p, p + b.size);
  }
  std::sort(ranges.begin(), ranges.end());
  for (std::size_t i = 1; i < ranges.size(); ++i) EXPECT_LE(ranges[i - 1].second, ranges[i].first);
  expect_intact(blocks);
  a().validate();
}

TEST_F(AllocatorTest, FindReportsTheLiveAllocation) {
  void* p = a().allocate(1000, S(3));
  const auto info = a().find(p);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->device, 0);
  EXPECT_EQ(info->requested, 1000u);
  EXPECT_EQ(info->size, 1024u);
  EXPECT_EQ(info->stream, S(3));
  EXPECT_FALSE(a().find(static_cast<char*>(p) + 512).has_value());
  a().deallocate(p);
  EXPECT_FALSE(a().find(p).has_value());
}


// ---- out of memory -------------------------------------------------------------------------------

TEST_F(AllocatorTest, OomThrowsOutOfMemoryWhichIsABadAlloc) {
  EXPECT_THROW((void)a().allocate(2 * GiB), out_of_memory);
  try {
    (void)a().allocate(2 * GiB);
    FAIL() << "no exception";
  } catch (const std::bad_alloc& e) {
    EXPECT_NE(dynamic_cast<const out_of_memory*>(&e), nullptr);
  }
  EXPECT_EQ(st("num_ooms"), 2);
  EXPECT_EQ(st("allocation.all.current"), 0);
  a().validate();
}

TEST_F(AllocatorTest, OomMessageReportsTheFigures) {
  const Live l1 = live(1 * KiB);    // 2 MiB small segment, 2 MiB - 1 KiB free
  const Live l2 = live(5 * MiB);    // 20 MiB segment, 15 MiB free
  const Live l3 = live(100 * MiB);  // its own segment
  std::string msg;
  try {
    (void)a().allocate(2 * GiB);
  } catch (const out_of_memory& e) {
    msg = e.what();
  }
  ASSERT_FALSE(msg.empty());
  EXPECT_TRUE(contains(msg, "Tried to allocate 2.00 GiB")) << msg;
  EXPECT_TRUE(contains(msg, "GPU 0")) << msg;
  EXPECT_TRUE(contains(msg, "total capacity of 1024.00 MiB")) << msg;
  EXPECT_TRUE(contains(msg, "902.00 MiB is free")) << msg;  // 1024 - 122 MiB reserved
  EXPECT_TRUE(contains(msg, "105.00 MiB is allocated by stitch")) << msg;
  EXPECT_TRUE(contains(msg, "17.00 MiB is reserved by stitch but unallocated")) << msg;
  EXPECT_TRUE(contains(msg, "largest free cached block is 15.00 MiB")) << msg;
  EXPECT_FALSE(contains(msg, "fragmentation")) << msg;
  EXPECT_FALSE(contains(msg, "allowed")) << msg;
  EXPECT_EQ(st("num_ooms"), 1);
  expect_intact({l1, l2, l3});
  a().validate();
}

TEST_F(AllocatorTest, OomReportsTheRequestWhenItDiffersFromTheSegmentSize) {
  make("", 64 * MiB);
  std::string msg;
  try {
    (void)a().allocate(100 * MiB + 1);
  } catch (const out_of_memory& e) {
    msg = e.what();
  }
  EXPECT_TRUE(contains(msg, "Tried to allocate 102.00 MiB")) << msg;
  EXPECT_TRUE(contains(msg, "100.00 MiB")) << msg;
}

TEST_F(AllocatorTest, OomForAnAbsurdRequestDoesNotOverflow) {
  EXPECT_THROW((void)a().allocate(SIZE_MAX), out_of_memory);
  EXPECT_THROW((void)a().allocate(SIZE_MAX - 511), out_of_memory);
  EXPECT_THROW((void)a().allocate(std::size_t{1} << 60), out_of_memory);
  EXPECT_EQ(st("num_ooms"), 3);
  EXPECT_EQ(st("reserved_bytes.all.current"), 0);
  a().validate();
}

TEST_F(AllocatorTest, OomRecoversByReleasingCachedSegments) {
  void* p = a().allocate(600 * MiB, S(1));
  a().deallocate(p);
  void* q = a().allocate(600 * MiB, S(2));  // needs the cached 600 MiB of stream 1
  EXPECT_NE(q, nullptr);
  EXPECT_EQ(st("num_alloc_retries"), 1);
  EXPECT_EQ(st("num_ooms"), 0);
  EXPECT_EQ(st("num_device_free"), 1);
  EXPECT_EQ(st("reserved_bytes.all.current"), I(600 * MiB));
  a().validate();
}

TEST_F(AllocatorTest, OomThenSucceedsAfterFrees) {
  const Live big = live(700 * MiB, S(1));
  EXPECT_THROW((void)a().allocate(500 * MiB, S(1)), out_of_memory);
  EXPECT_EQ(st("num_ooms"), 1);
  EXPECT_EQ(st("num_alloc_retries"), 1);  // the ladder ran to its last step
  EXPECT_TRUE(pattern_intact(big.ptr, big.size, big.seed));
  a().deallocate(big.ptr);
  // Another stream cannot use the cached 700 MiB: the ladder releases it, then succeeds.
  void* p = a().allocate(500 * MiB, S(2));
  EXPECT_NE(p, nullptr);
  EXPECT_EQ(st("num_alloc_retries"), 2);
  EXPECT_EQ(st("num_ooms"), 1);
  EXPECT_EQ(st("reserved_bytes.all.current"), I(500 * MiB));
  a().validate();
}

TEST_F(AllocatorTest, FragmentationOomNamesACheckedConfiguration) {
  make("", 200 * MiB);
  std::vector<void*> blocks;
  for (int i = 0; i < 40; ++i) blocks.push_back(a().allocate(5 * MiB, S(1)));
  ASSERT_EQ(st("reserved_bytes.all.current"), I(200 * MiB));
  ASSERT_EQ(st("segment.all.current"), 10);
  for (std::size_t i = 0; i < blocks.size(); i += 2) a().deallocate(blocks[i]);
  std::string msg;
  try {
    (void)a().allocate(8 * MiB, S(1));
  } catch (const out_of_memory& e) {
    msg = e.what();
  }
  ASSERT_FALSE(msg.empty()) << "expected an OOM";
  EXPECT_TRUE(contains(msg, "100.00 MiB is reserved by stitch but unallocated")) << msg;
  EXPECT_TRUE(contains(msg, "largest free cached block is 5.00 MiB")) << msg;
  EXPECT_TRUE(contains(msg, "fragmentation")) << msg;
  // The what-if check (oom_what_if_test.cpp) names what it verified would serve the request.
  EXPECT_TRUE(contains(msg, "expandable_segments:True")) << msg;
  EXPECT_TRUE(contains(msg, "would have served this request (checked: ")) << msg;
  a().validate();
}

TEST_F(AllocatorTest, OomLeavesEveryLiveBlockIntact) {
  make("", 256 * MiB);
  std::vector<Live> blocks;
  for (std::size_t size : {std::size_t{1000}, 3 * MiB, 50 * MiB, 100 * MiB})
    blocks.push_back(live(size, S(1)));
  void* cached = a().allocate(40 * MiB, S(2));
  a().deallocate(cached);
  EXPECT_THROW((void)a().allocate(120 * MiB, S(1)), out_of_memory);
  expect_intact(blocks);
  a().validate();
  for (const Live& b : blocks) a().deallocate(b.ptr);
  a().empty_cache();
  EXPECT_EQ(sim().usage(0).used, 0u);
}


// ---- invalid frees -------------------------------------------------------------------------------

class InvalidFreeTest : public AllocatorTest {
 protected:
  void SetUp() override {
    make("", GiB, 2);
    for (std::size_t size : {std::size_t{1000}, 4 * KiB, 3 * MiB, 12 * MiB})
      others_.push_back(live(size, S(1), 0));
    others_.push_back(live(2000, S(1), 1));
  }

  /// Runs `bad`, which must throw invalid_argument and change nothing else.
  template <typename Fn>
  std::string expect_rejected(Fn&& bad, int counted_on = 0) {
    const DeviceStats before0 = a().stats(0);
    const DeviceStats before1 = a().stats(1);
    std::string msg;
    try {
      bad();
      ADD_FAILURE() << "the bad free was accepted";
    } catch (const invalid_argument& e) {
      msg = e.what();
    }
    const DeviceStats after0 = a().stats(0);
    const DeviceStats after1 = a().stats(1);
    EXPECT_EQ(after0.num_invalid_frees + after1.num_invalid_frees, 1);
    EXPECT_EQ(a().stats(counted_on).num_invalid_frees, 1);
    EXPECT_EQ(after0.allocation[kAll].current, before0.allocation[kAll].current);
    EXPECT_EQ(after1.allocation[kAll].current, before1.allocation[kAll].current);
    EXPECT_EQ(after0.allocated_bytes[kAll].current, before0.allocated_bytes[kAll].current);
    EXPECT_EQ(after0.reserved_bytes[kAll].current, before0.reserved_bytes[kAll].current);
    expect_intact(others_);
    a().validate();
    return msg;
  }

  std::vector<Live> others_;
};

TEST_F(InvalidFreeTest, UnknownPointer) {
  int host = 0;
  const std::string msg = expect_rejected([&] { a().deallocate(&host); });
  EXPECT_TRUE(contains(msg, "not a live allocation")) << msg;
}

TEST_F(InvalidFreeTest, UnknownPointerWithSizeAndDevice) {
  int host = 0;
  (void)expect_rejected([&] { a().deallocate(&host, sizeof host, 0, S(1)); });
}

TEST_F(InvalidFreeTest, InteriorPointer) {
  const Live& victim = others_[1];
  (void)expect_rejected([&] { a().deallocate(static_cast<char*>(victim.ptr) + 512); });
  a().deallocate(victim.ptr);  // the real pointer still frees normally
}

TEST_F(InvalidFreeTest, PointerIntoTheFreeTailOfASegment) {
  // The block after others_[0] and others_[1] in the small segment is free: not a live block.
  char* tail = static_cast<char*>(others_[1].ptr) + 4 * KiB;
  ASSERT_FALSE(a().find(tail).has_value());
  (void)expect_rejected([&] { a().deallocate(tail); });
}

TEST_F(InvalidFreeTest, DoubleFree) {
  void* p = a().allocate(5000, S(1));
  a().deallocate(p);
  const std::string msg = expect_rejected([&] { a().deallocate(p); });
  EXPECT_TRUE(contains(msg, "double free")) << msg;
  // The cache is not corrupted: the block is handed out exactly once.
  void* q = a().allocate(5000, S(1));
  EXPECT_EQ(q, p);
  void* r = a().allocate(5000, S(1));
  EXPECT_NE(r, p);
  a().validate();
}

TEST_F(InvalidFreeTest, DoubleFreeWithSizeAndDevice) {
  void* p = a().allocate(5000, S(1));
  a().deallocate(p, 5000, 0, S(1));
  (void)expect_rejected([&] { a().deallocate(p, 5000, 0, S(1)); });
}

TEST_F(InvalidFreeTest, WrongSize) {
  const Live& victim = others_[2];  // 3 MiB
  const std::string msg =
      expect_rejected([&] { a().deallocate(victim.ptr, victim.size + 1, 0, S(1)); });
  EXPECT_TRUE(contains(msg, std::to_string(victim.size))) << msg;
  // Even the rounded size is not the requested size.
  a().deallocate(victim.ptr, victim.size, 0, S(1));
}

TEST_F(InvalidFreeTest, WrongSizeOfTheRoundedBlock) {
  const Live& victim = others_[0];  // 1000 B in a 1024 B block
  (void)expect_rejected([&] { a().deallocate(victim.ptr, 1024, 0, S(1)); });
}

TEST_F(InvalidFreeTest, WrongDevice) {
  const Live& victim = others_[4];  // on device 1
  // Counted by the device that owns the pointer.
  const std::string msg =
      expect_rejected([&] { a().deallocate(victim.ptr, victim.size, 0, S(1)); }, /*counted_on=*/1);
  EXPECT_TRUE(contains(msg, "device 1")) << msg;
  a().deallocate(victim.ptr, victim.size, 1, S(1));
  EXPECT_EQ(st("allocation.all.current", 1), 0);
}

TEST_F(InvalidFreeTest, BadDeviceIndexInFreeThrowsWithoutFreeing) {
  const Live& victim = others_[0];
  EXPECT_THROW(a().deallocate(victim.ptr, victim.size, 7, S(1)), invalid_argument);
  expect_intact(others_);
}

TEST(InvalidFreeAbort, AbortPolicyAbortsOnAnUnknownPointer) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        SimBackend::Options o;
        o.capacity = 64 * MiB;
        Allocator alloc(Config::parse("backend:sim,on_invalid_free:abort"),
                        std::make_shared<SimBackend>(o));
        int host = 0;
        alloc.deallocate(&host);
      },
      "on_invalid_free:abort");
}

TEST(InvalidFreeAbort, AbortPolicyAbortsOnAWrongSize) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        SimBackend::Options o;
        o.capacity = 64 * MiB;
        Allocator alloc(Config::parse("backend:sim,on_invalid_free:abort"),
                        std::make_shared<SimBackend>(o));
        void* p = alloc.allocate(1000);
        alloc.deallocate(p, 999, 0, nullptr);
      },
      "size 999");
}

TEST_F(AllocatorTest, ValidFreesDoNotAbortUnderTheAbortPolicy) {
  make("on_invalid_free:abort");
  void* p = a().allocate(1000);
  a().deallocate(p, 1000, 0, nullptr);
  a().deallocate(nullptr);
  EXPECT_EQ(st("num_invalid_frees"), 0);
}


// ---- configure -----------------------------------------------------------------------------------

TEST_F(AllocatorTest, ConfigureChangesTunables) {
  a().configure("max_split_size_mb:20");
  EXPECT_EQ(st("max_split_size"), I(20 * MiB));
  EXPECT_EQ(a().config().max_split_size, 20 * MiB);
  void* p = a().allocate(40 * MiB, S(1));
  a().deallocate(p);
  EXPECT_NE(a().allocate(10 * MiB, S(1)), p);  // oversize now
}

TEST_F(AllocatorTest, ConfigureAppliesRoundingToLaterRequests) {
  a().configure("roundup_power2_divisions:4");
  void* p = a().allocate(5 * MiB + 1);
  ASSERT_TRUE(a().find(p).has_value());
  EXPECT_EQ(a().find(p)->size, 6 * MiB);
}

TEST_F(AllocatorTest, ConfigureRejectsKeysFixedAtConstruction) {
  EXPECT_THROW(a().configure("backend:cuda"), config_error);
  EXPECT_THROW(a().configure("sim_devices:2"), config_error);
  EXPECT_THROW(a().configure("sim_capacity_mb:1"), config_error);
  EXPECT_THROW(a().configure("max_split_size_mb:30,backend:cuda"), config_error);
  EXPECT_EQ(a().config().backend, BackendKind::sim);
  EXPECT_EQ(a().config().max_split_size, Config::kUnlimited);
  EXPECT_EQ(st("max_split_size"), -1);
}

TEST_F(AllocatorTest, ConfigureAcceptsTheCurrentBackend) {
  EXPECT_NO_THROW(a().configure("backend:sim,max_split_size_mb:30"));
  EXPECT_EQ(st("max_split_size"), I(30 * MiB));
}

TEST_F(AllocatorTest, ConfigureRejectsBadStringsAndChangesNothing) {
  EXPECT_THROW(a().configure("max_split_size_mb:30,nonsense:1"), config_error);
  EXPECT_THROW(a().configure("max_split_size_mb:5"), config_error);
  EXPECT_EQ(st("max_split_size"), -1);
  EXPECT_EQ(a().config().max_split_size, Config::kUnlimited);
}

TEST_F(AllocatorTest, ConfigureOnInvalidFreeTakesEffect) {
  a().configure("on_invalid_free:abort");
  EXPECT_EQ(a().config().on_invalid_free, InvalidFreePolicy::abort);
  a().configure("on_invalid_free:error");
  int host = 0;
  EXPECT_THROW(a().deallocate(&host), invalid_argument);
}


// ---- lifetime ------------------------------------------------------------------------------------

TEST(AllocatorLifetime, DestructionReturnsCachedAndPendingMemoryAndEvents) {
  SimBackend::Options o;
  o.capacity = GiB;
  auto sim = std::make_shared<SimBackend>(o);
  {
    Allocator a(Config::parse("backend:sim"), sim);
    void* p = a.allocate(12 * MiB, S(1));
    a.record_stream(p, S(2));
    sim->hold_stream(S(2));
    a.deallocate(p);  // pending on a held stream
    a.deallocate(a.allocate(1000, S(1)));
    a.deallocate(a.allocate(3 * MiB, S(3)));
    ASSERT_GT(sim->usage(0).used, 0u);
  }
  const SimUsage u = sim->usage(0);
  EXPECT_EQ(u.used, 0u);
  EXPECT_EQ(u.allocations, 0u);
  EXPECT_EQ(u.events, 0u);
}

TEST(AllocatorLifetime, BlocksStillAllocatedStayValidAfterDestruction) {
  SimBackend::Options o;
  o.capacity = GiB;
  auto sim = std::make_shared<SimBackend>(o);
  void* p = nullptr;
  {
    Allocator a(Config::parse("backend:sim"), sim);
    p = a.allocate(5 * MiB, S(1));
    write_pattern(p, 5 * MiB, 77);
    a.deallocate(a.allocate(12 * MiB, S(1)));  // cached: returned
  }
  EXPECT_TRUE(pattern_intact(p, 5 * MiB, 77));
  EXPECT_EQ(sim->usage(0).used, 20 * MiB);  // the live block's segment stays with the device
  EXPECT_EQ(sim->usage(0).allocations, 1u);
}


// ---- several devices -----------------------------------------------------------------------------

TEST_F(AllocatorTest, DevicesHaveSeparateCachesAndStatistics) {
  make("", GiB, 2);
  EXPECT_EQ(a().device_count(), 2);
  void* p = a().allocate(12 * MiB, S(1), 1);
  EXPECT_EQ(a().find(p)->device, 1);
  EXPECT_EQ(st("allocation.all.current", 0), 0);
  EXPECT_EQ(st("reserved_bytes.all.current", 0), 0);
  EXPECT_EQ(st("num_device_alloc", 0), 0);
  EXPECT_EQ(st("allocation.all.current", 1), 1);
  EXPECT_EQ(sim().usage(0).used, 0u);
  EXPECT_EQ(sim().usage(1).used, 12 * MiB);
  a().deallocate(p);  // found on device 1 from the pointer alone
  EXPECT_EQ(st("allocation.all.current", 1), 0);
  // Device 0 does not reuse device 1's cache.
  EXPECT_NE(a().allocate(12 * MiB, S(1), 0), p);
  EXPECT_EQ(st("num_device_alloc", 0), 1);
  a().validate();
}

// deallocate(ptr) and deallocate(ptr, stream) try each device's pair (device 0's first), then the
// plain path of the device whose pair found the block, else every device's cache hit again and
// every device lock: each route frees exactly its block.
TEST_F(AllocatorTest, TheUnsizedFreeTakesEveryRouteOnEveryDevice) {
  make("", GiB, 2);
  auto live = [&](int d) { return st("allocation.all.current", d); };
  // Device 0: a plain free, then the same size again and its free (a pair's take and give).
  void* p = a().allocate(4 * KiB, S(1), 0);
  a().deallocate(p);
  const std::int64_t hits = st("num_cache_hits", 0);
  void* q = a().allocate(4 * KiB, S(1), 0);
  EXPECT_EQ(q, p);
  EXPECT_EQ(st("num_cache_hits", 0), hits + 1);  // (counts allocations)
  a().deallocate(q, S(1));
  EXPECT_EQ(live(0), 0);
  // Device 0, a block used on another stream: its plain path declines, the device lock frees it
  // (pending until the other stream's event completes).
  void* r = a().allocate(4 * KiB, S(1), 0);
  a().record_stream(r, S(2));
  a().deallocate(r);
  EXPECT_EQ(live(0), 0);
  EXPECT_FALSE(a().find(r).has_value());
  // Device 1: not found on device 0, freed by device 1's cache hit, then by its pair.
  void* t = a().allocate(1 * MiB, S(1), 1);
  a().deallocate(t);
  const std::int64_t hits1 = st("num_cache_hits", 1);
  void* u = a().allocate(1 * MiB, S(1), 1);
  EXPECT_EQ(st("num_cache_hits", 1), hits1 + 1);
  a().deallocate(u, S(1));
  EXPECT_EQ(live(1), 0);
  // A pointer live nowhere: refused, counted once, and nothing else changes.
  const std::int64_t reserved = st("reserved_bytes.all.current", 0) + st("reserved_bytes.all.current", 1);
  EXPECT_THROW(a().deallocate(u), invalid_argument);
  EXPECT_EQ(st("num_invalid_frees", 0), 1);
  EXPECT_EQ(st("reserved_bytes.all.current", 0) + st("reserved_bytes.all.current", 1), reserved);
  a().validate();
}

TEST_F(AllocatorTest, BadDeviceIndexThrowsInvalidArgument) {
  make("", GiB, 2);
  EXPECT_THROW((void)a().allocate(1000, nullptr, 2), invalid_argument);
  EXPECT_THROW((void)a().allocate(1000, nullptr, -1), invalid_argument);
  EXPECT_THROW((void)a().stats(2), invalid_argument);
  EXPECT_THROW((void)a().stat(-1, "num_ooms"), invalid_argument);
  EXPECT_THROW(a().reset_peak_stats(5), invalid_argument);
  EXPECT_THROW((void)a().device(2), invalid_argument);
  EXPECT_EQ(st("allocation.all.current", 0) + st("allocation.all.current", 1), 0);
}


// ---- statistics ----------------------------------------------------------------------------------

std::vector<std::string> all_pytorch_keys() {
  std::vector<std::string> keys;
  for (const char* name : {"allocation", "segment", "active", "inactive_split", "allocated_bytes",
                           "reserved_bytes", "active_bytes", "inactive_split_bytes",
                           "requested_bytes"})
    for (const char* pool : {"all", "small_pool", "large_pool"})
      for (const char* part : {"current", "peak", "allocated", "freed"})
        keys.push_back(std::string(name) + "." + pool + "." + part);
  for (const char* name : {"oversize_allocations", "oversize_segments", "sleeping_bytes", "spilled_bytes", "kv_bytes",
                           "backup_file_bytes"})
    for (const char* part : {"current", "peak", "allocated", "freed"})
      keys.push_back(std::string(name) + "." + part);
  for (const char* name : {"num_alloc_retries", "num_ooms", "num_sync_all_streams",
                           "num_device_alloc", "num_device_free", "num_invalid_frees", "num_failed_frees",
                           "num_stitches", "stitched_bytes", "num_page_reuses", "num_page_borrows",
                           "num_cache_hits", "num_compactions", "num_staged_compactions",
                           "num_compactions_refused", "compacted_bytes", "num_device_syncs", "num_sleeps",
                           "num_wakes", "num_spills", "num_unspills", "max_split_size"})
    keys.emplace_back(name);
  return keys;
}

TEST_F(AllocatorTest, EveryPyTorchStatKeyResolves) {
  for (const std::string& key : all_pytorch_keys())
    EXPECT_TRUE(a().stat(0, key).has_value()) << key;
}

TEST_F(AllocatorTest, ForEachListsExactlyThePyTorchKeys) {
  std::vector<std::string> listed;
  const DeviceStats stats = a().stats(0);
  stats.for_each([&](const std::string& key, std::int64_t value) {
    listed.push_back(key);
    EXPECT_EQ(stats.get(key), value) << key;
  });
  std::vector<std::string> expected = all_pytorch_keys();
  std::sort(listed.begin(), listed.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(listed, expected);
}

TEST_F(AllocatorTest, UnknownStatKeysAreNullopt) {
  for (const char* key : {"", "allocation", "allocation.all", "allocation.all.current.x",
                          "allocation.medium_pool.current", "allocation.all.latest", "num_oom",
                          "num_ooms.current", "oversize_allocations", "oversize_segments.all.current",
                          "bogus.all.current", "reserved_bytes..current"})
    EXPECT_FALSE(a().stat(0, key).has_value()) << key;
}

TEST_F(AllocatorTest, StatKeysMatchTheStructFields) {
  void* p = a().allocate(1000);
  void* q = a().allocate(3 * MiB);
  const DeviceStats s = a().stats(0);
  EXPECT_EQ(st("allocation.all.current"), s.allocation[kAll].current);
  EXPECT_EQ(st("allocation.small_pool.current"), s.allocation[kSmallPool].current);
  EXPECT_EQ(st("reserved_bytes.large_pool.current"), s.reserved_bytes[kLargePool].current);
  EXPECT_EQ(st("requested_bytes.all.allocated"), s.requested_bytes[kAll].allocated);
  EXPECT_EQ(st("num_device_alloc"), s.num_device_alloc);
  EXPECT_EQ(st("allocation.all.current"), 2);
  EXPECT_EQ(st("allocation.small_pool.current"), 1);
  EXPECT_EQ(st("allocation.large_pool.current"), 1);
  (void)p;
  (void)q;
}

TEST_F(AllocatorTest, RequestedBytesCountTheUnroundedSizes) {
  void* p = a().allocate(1000);
  void* q = a().allocate(3 * MiB + 7);
  EXPECT_EQ(st("requested_bytes.all.current"), I(1000 + 3 * MiB + 7));
  EXPECT_EQ(st("requested_bytes.small_pool.current"), 1000);
  EXPECT_EQ(st("requested_bytes.large_pool.current"), I(3 * MiB + 7));
  EXPECT_EQ(st("allocated_bytes.small_pool.current"), 1024);
  EXPECT_EQ(st("allocated_bytes.large_pool.current"), I(3 * MiB + 512));
  a().deallocate(p);
  EXPECT_EQ(st("requested_bytes.small_pool.freed"), 1000);
  EXPECT_EQ(st("requested_bytes.small_pool.allocated"), 1000);
  a().deallocate(q);
  EXPECT_EQ(st("requested_bytes.all.current"), 0);
  EXPECT_EQ(st("requested_bytes.large_pool.freed"), I(3 * MiB + 7));
  EXPECT_EQ(st("requested_bytes.all.peak"), I(1000 + 3 * MiB + 7));
}

TEST_F(AllocatorTest, PeaksTrackTheMaximumAndResetToCurrent) {
  std::vector<void*> blocks;
  for (int i = 0; i < 5; ++i) blocks.push_back(a().allocate(12 * MiB));
  for (int i = 0; i < 4; ++i) a().deallocate(blocks[static_cast<std::size_t>(i)]);
  EXPECT_EQ(st("allocation.all.current"), 1);
  EXPECT_EQ(st("allocation.all.peak"), 5);
  EXPECT_EQ(st("allocated_bytes.all.peak"), I(60 * MiB));
  EXPECT_EQ(st("reserved_bytes.all.peak"), I(60 * MiB));
  a().empty_cache();
  EXPECT_EQ(st("reserved_bytes.all.current"), I(12 * MiB));
  EXPECT_EQ(st("reserved_bytes.all.peak"), I(60 * MiB));
  a().reset_peak_stats(0);
  EXPECT_EQ(st("allocation.all.peak"), 1);
  EXPECT_EQ(st("allocated_bytes.all.peak"), I(12 * MiB));
  EXPECT_EQ(st("reserved_bytes.all.peak"), I(12 * MiB));
  // Accumulated counts are untouched by a peak reset.
  EXPECT_EQ(st("allocation.all.allocated"), 5);
  EXPECT_EQ(st("allocation.all.freed"), 4);
}

TEST_F(AllocatorTest, ResetAccumulatedStatsZeroesSumsAndCounters) {
  void* p = a().allocate(12 * MiB);
  a().deallocate(p);
  EXPECT_THROW((void)a().allocate(4 * GiB), out_of_memory);
  a().reset_accumulated_stats(0);
  EXPECT_EQ(st("allocation.all.allocated"), 0);
  EXPECT_EQ(st("allocation.all.freed"), 0);
  EXPECT_EQ(st("num_ooms"), 0);
  EXPECT_EQ(st("num_device_alloc"), 0);
  EXPECT_EQ(st("reserved_bytes.all.current"), 0);  // the OOM ladder released the cache
  EXPECT_EQ(st("max_split_size"), -1);
}

TEST_F(AllocatorTest, AccumulatedSumsBalance) {
  for (int i = 0; i < 20; ++i) {
    void* p = a().allocate(static_cast<std::size_t>(1000 * (i + 1)));
    a().deallocate(p);
  }
  EXPECT_EQ(st("allocation.all.allocated"), 20);
  EXPECT_EQ(st("allocation.all.freed"), 20);
  EXPECT_EQ(st("allocated_bytes.all.allocated"), st("allocated_bytes.all.freed"));
  EXPECT_EQ(st("requested_bytes.all.allocated"), st("requested_bytes.all.freed"));
  EXPECT_EQ(st("active_bytes.all.allocated") - st("active_bytes.all.freed"),
            st("active_bytes.all.current"));
}



// ---- threads -------------------------------------------------------------------------------------

TEST_F(AllocatorTest, ConcurrentAllocationsAndFreesOnTwoDevicesStayConsistent) {
  make("", GiB, 2);
  constexpr int kThreads = 8;
  constexpr int kOps = 3000;
  std::atomic<int> corrupted{0};
  std::atomic<int> failures{0};
  std::atomic<int> ooms{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(1234 + static_cast<unsigned>(t));
      std::vector<std::pair<Live, int>> mine;  // block, device
      for (int op = 0; op < kOps; ++op) {
        const bool alloc = mine.size() < 4 || (mine.size() < 24 && rng() % 2 == 0);
        if (alloc) {
          const unsigned r = static_cast<unsigned>(rng() % 100);
          const std::size_t size = r < 70   ? 1 + rng() % (64 * KiB)
                                   : r < 95 ? 1 + rng() % (2 * MiB)
                                            : 1 + rng() % (12 * MiB);
          const int device = static_cast<int>(rng() % 2);
          const stream_t stream = S(1 + static_cast<int>(rng() % 3));
          try {
            void* p = a().allocate(size, stream, device);
            const std::uint64_t seed = rng();
            Live l{p, std::min<std::size_t>(size, 4 * KiB), seed};
            write_pattern(p, l.size, seed);
            if (rng() % 8 == 0) a().record_stream(p, S(4 + static_cast<int>(rng() % 2)));
            mine.emplace_back(l, device);
          } catch (const out_of_memory&) {
            ++ooms;
          } catch (...) {
            ++failures;
          }
        } else {
          const std::size_t i = rng() % mine.size();
          const auto [l, device] = mine[i];
          mine[i] = mine.back();
          mine.pop_back();
          if (!pattern_intact(l.ptr, l.size, l.seed)) ++corrupted;
          try {
            if (rng() % 2 == 0) {
              a().deallocate(l.ptr);
            } else {
              const auto info = a().find(l.ptr);
              if (!info) {
                ++failures;
                continue;
              }
              a().deallocate(l.ptr, info->requested, device, info->stream);
            }
          } catch (...) {
            ++failures;
          }
        }
        if (op % 1000 == 999 && t == 0) a().empty_cache();
      }
      for (const auto& [l, device] : mine) {
        if (!pattern_intact(l.ptr, l.size, l.seed)) ++corrupted;
        a().deallocate(l.ptr);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(corrupted.load(), 0);
  EXPECT_EQ(failures.load(), 0);
  a().validate();
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(st("allocation.all.current", d), 0) << d;
    EXPECT_EQ(st("allocated_bytes.all.current", d), 0) << d;
    EXPECT_EQ(st("num_invalid_frees", d), 0) << d;
  }
  a().empty_cache();
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(st("active.all.current", d), 0) << d;
    EXPECT_EQ(st("reserved_bytes.all.current", d), 0) << d;
    EXPECT_EQ(sim().usage(d).used, 0u) << d;
  }
  a().validate();
}

}  // namespace
}  // namespace stitch
