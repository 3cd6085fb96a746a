// Plain segments (core/plain_segments.hpp): their sizes per request, and every way they go back
// to the device: cached oversize segments released for a request, empty_cache, and garbage
// collection under a memory fraction.
#include <gtest/gtest.h>

#include "support/allocator_fixture.hpp"

namespace stitch {
namespace {

using namespace stitch::test;

// ---- segment sizes -------------------------------------------------------------------------------

TEST_F(AllocatorTest, SmallRequestsCarveA2MiBSegment) {
  void* p = a().allocate(1000);
  EXPECT_EQ(st("reserved_bytes.all.current"), I(2 * MiB));
  EXPECT_EQ(st("reserved_bytes.small_pool.current"), I(2 * MiB));
  EXPECT_EQ(st("segment.small_pool.current"), 1);
  EXPECT_EQ(st("segment.large_pool.current"), 0);
  EXPECT_EQ(sim().usage(0).used, 2 * MiB);
  // A 1 MiB request (the largest small one) fits the same segment's remainder.
  void* q = a().allocate(MiB);
  EXPECT_EQ(st("segment.all.current"), 1);
  EXPECT_EQ(st("allocation.small_pool.current"), 2);
  (void)p;
  (void)q;
}

TEST_F(AllocatorTest, OneToTenMiBRequestsCarveA20MiBSegment) {
  void* p = a().allocate(MiB + 1);
  EXPECT_EQ(st("reserved_bytes.all.current"), I(20 * MiB));
  EXPECT_EQ(st("reserved_bytes.large_pool.current"), I(20 * MiB));
  EXPECT_EQ(st("segment.large_pool.current"), 1);
  EXPECT_EQ(st("allocation.large_pool.current"), 1);
  void* q = a().allocate(9 * MiB);
  void* r = a().allocate(9 * MiB);
  EXPECT_EQ(st("segment.large_pool.current"), 1);  // both fit the first segment's remainder
  void* t = a().allocate(5 * MiB);                  // 1 MiB - 512 left: a second segment
  EXPECT_EQ(st("segment.large_pool.current"), 2);
  EXPECT_EQ(st("reserved_bytes.all.current"), I(40 * MiB));
  (void)p;
  (void)q;
  (void)r;
  (void)t;
}

TEST_F(AllocatorTest, TenMiBAndLargerGetTheirOwn2MiBRoundedSegment) {
  (void)a().allocate(10 * MiB);
  EXPECT_EQ(st("reserved_bytes.all.current"), I(10 * MiB));
  (void)a().allocate(11 * MiB + 1);
  EXPECT_EQ(st("reserved_bytes.all.current"), I(22 * MiB));
  (void)a().allocate(100 * MiB - 512);
  EXPECT_EQ(st("reserved_bytes.all.current"), I(122 * MiB));
  EXPECT_EQ(st("segment.large_pool.current"), 3);
  EXPECT_EQ(st("num_device_alloc"), 3);
  EXPECT_EQ(sim().usage(0).used, 122 * MiB);
}


TEST_F(AllocatorTest, OomLadderReleasesACachedOversizeBlockFirst) {
  // With max_split_size set, the ladder frees a cached oversize block of this stream that is
  // big enough before resorting to releasing everything.
  make("max_split_size_mb:20", 120 * MiB);
  void* p = a().allocate(100 * MiB, S(1));
  a().deallocate(p);
  // 100 >= 30 + 20: not reused; 100 + 30 > 120: the cached block has to go.
  void* q = a().allocate(30 * MiB, S(1));
  EXPECT_NE(q, nullptr);
  EXPECT_EQ(st("num_device_free"), 1);
  EXPECT_EQ(st("num_alloc_retries"), 0);  // solved before the last-resort step
  EXPECT_EQ(st("num_ooms"), 0);
  EXPECT_EQ(st("reserved_bytes.all.current"), I(30 * MiB));
  a().validate();
}

TEST_F(AllocatorTest, OomLadderReleasesSeveralCachedOversizeBlocksLargestFirst) {
  make("max_split_size_mb:20", 120 * MiB);
  void* p = a().allocate(40 * MiB, S(1));
  void* q = a().allocate(50 * MiB, S(1));
  a().deallocate(p);
  a().deallocate(q);
  // No single cached block holds 60 MiB; 50 + 40 together reach it.
  EXPECT_NE(a().allocate(60 * MiB, S(1)), nullptr);
  EXPECT_EQ(st("num_device_free"), 2);
  EXPECT_EQ(st("num_alloc_retries"), 0);
  EXPECT_EQ(st("reserved_bytes.all.current"), I(60 * MiB));
  a().validate();
}

TEST_F(AllocatorTest, OomLadderDoesNotReleaseOversizeBlocksOfOtherStreams) {
  make("max_split_size_mb:20", 120 * MiB);
  void* p = a().allocate(100 * MiB, S(2));
  a().deallocate(p);
  // Only the last-resort step (counted as a retry) may release stream 2's block.
  EXPECT_NE(a().allocate(30 * MiB, S(1)), nullptr);
  EXPECT_EQ(st("num_alloc_retries"), 1);
  EXPECT_EQ(st("num_device_free"), 1);
}


// ---- empty_cache ---------------------------------------------------------------------------------

TEST_F(AllocatorTest, EmptyCacheWithNothingLiveReleasesEverything) {
  std::vector<void*> blocks;
  for (std::size_t size : {std::size_t{1000}, 100 * KiB, 3 * MiB, 5 * MiB, 12 * MiB, 40 * MiB})
    for (int s = 0; s < 2; ++s) blocks.push_back(a().allocate(size, S(s)));
  for (void* p : blocks) a().deallocate(p);
  EXPECT_GT(st("reserved_bytes.all.current"), 0);
  a().empty_cache();
  EXPECT_EQ(st("reserved_bytes.all.current"), 0);
  EXPECT_EQ(st("segment.all.current"), 0);
  EXPECT_EQ(st("num_device_free"), st("num_device_alloc"));
  const SimUsage u = sim().usage(0);
  EXPECT_EQ(u.used, 0u);
  EXPECT_EQ(u.allocations, 0u);
  a().validate();
}

TEST_F(AllocatorTest, EmptyCacheReleasesOnlyEntirelyFreeSegments) {
  const Live small_live = live(1000, S(1));
  void* small_free = a().allocate(2000, S(1));  // same segment as small_live
  const Live large_live = live(12 * MiB, S(1));
  void* large_free = a().allocate(12 * MiB, S(1));
  void* mid_free = a().allocate(3 * MiB, S(1));
  a().deallocate(small_free);
  a().deallocate(large_free);
  a().deallocate(mid_free);
  a().empty_cache();
  EXPECT_EQ(st("segment.all.current"), 2);
  EXPECT_EQ(st("reserved_bytes.all.current"), I(2 * MiB + 12 * MiB));
  EXPECT_EQ(sim().usage(0).used, 2 * MiB + 12 * MiB);
  expect_intact({small_live, large_live});
  a().validate();
}

TEST_F(AllocatorTest, EmptyCacheOfOneDeviceLeavesTheOthers) {
  make("", GiB, 2);
  a().deallocate(a().allocate(12 * MiB, S(1), 0));
  a().deallocate(a().allocate(12 * MiB, S(1), 1));
  a().empty_cache(1);
  EXPECT_EQ(st("reserved_bytes.all.current", 0), I(12 * MiB));
  EXPECT_EQ(st("reserved_bytes.all.current", 1), 0);
  a().empty_cache(-1);
  EXPECT_EQ(st("reserved_bytes.all.current", 0), 0);
  EXPECT_THROW(a().empty_cache(2), invalid_argument);
}


// ---- garbage collection --------------------------------------------------------------------------

TEST_F(AllocatorTest, GarbageCollectionFreesTheOldestCachedSegments) {
  // allowed = 512 MiB, GC threshold = 256 MiB.
  make("garbage_collection_threshold:0.5,per_process_memory_fraction:0.5");
  const stream_t s = S(1), s2 = S(2);
  void* y = a().allocate(10 * MiB, s2);
  a().deallocate(y);
  void* pa = a().allocate(100 * MiB, s);
  void* pb = a().allocate(100 * MiB, s);
  void* pc = a().allocate(100 * MiB, s);
  ASSERT_EQ(st("reserved_bytes.all.current"), I(310 * MiB));
  a().deallocate(pa);  // A becomes the oldest cached block ...
  for (int i = 0; i < 10; ++i) a().deallocate(a().allocate(10 * MiB, s2));  // ... time passes
  a().deallocate(pb);
  a().deallocate(pc);
  ASSERT_EQ(st("num_device_free"), 0);
  // Reserved (310) is above 256 MiB: this slow-path allocation first collects old blocks.
  void* big = a().allocate(150 * MiB, s);
  EXPECT_EQ(st("num_device_free"), 1);
  EXPECT_EQ(st("reserved_bytes.all.current"), I(360 * MiB));
  // B and C are still cached, so A (the oldest) was the one released.
  std::set<void*> rest{a().allocate(100 * MiB, s), a().allocate(100 * MiB, s)};
  EXPECT_EQ(rest, (std::set<void*>{pb, pc}));
  EXPECT_EQ(st("num_device_alloc"), 5);
  (void)big;
  a().validate();
}

TEST_F(AllocatorTest, GarbageCollectionDoesNothingBelowTheThreshold) {
  make("garbage_collection_threshold:0.5,per_process_memory_fraction:0.5");
  void* p = a().allocate(100 * MiB, S(1));
  a().deallocate(p);
  (void)a().allocate(120 * MiB, S(1));  // reserved 100 <= 256 MiB
  EXPECT_EQ(st("num_device_free"), 0);
  EXPECT_EQ(st("reserved_bytes.all.current"), I(220 * MiB));
}

TEST_F(AllocatorTest, GarbageCollectionNeedsAMemoryFraction) {
  make("garbage_collection_threshold:0.5");
  void* p = a().allocate(400 * MiB, S(1));
  void* q = a().allocate(100 * MiB, S(1));
  a().deallocate(p);
  a().deallocate(q);
  (void)a().allocate(450 * MiB, S(1));
  EXPECT_EQ(st("num_device_free"), 0);
  EXPECT_EQ(st("reserved_bytes.all.current"), I(950 * MiB));
}

TEST_F(AllocatorTest, GarbageCollectionKeepsReservedUnderTheThresholdWherePossible) {
  make("garbage_collection_threshold:0.5,per_process_memory_fraction:0.5");
  std::vector<void*> blocks;
  for (int i = 0; i < 6; ++i) blocks.push_back(a().allocate(40 * MiB, S(1)));
  for (void* p : blocks) a().deallocate(p);
  ASSERT_EQ(st("reserved_bytes.all.current"), I(240 * MiB));
  for (int i = 0; i < 4; ++i) (void)a().allocate(50 * MiB, S(2));  // other stream: slow path
  // Without GC reserved would be 240 + 200 = 440 MiB; collection keeps it near 256 MiB.
  EXPECT_GT(st("num_device_free"), 0);
  EXPECT_LE(st("reserved_bytes.all.current"), I(256 * MiB + 50 * MiB));
  a().validate();
}

}  // namespace
}  // namespace stitch
