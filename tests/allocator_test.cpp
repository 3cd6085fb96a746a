// Behaviour tests of stitch::Allocator on the simulated device: the caching policy (pools,
// segment sizes, best fit, splitting, coalescing, max_split_size), streams and events, empty_cache,
// the out-of-memory ladder and report, memory fraction and garbage collection, invalid frees,
// configure(), several devices, statistics and thread safety.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/config.hpp"
#include "stitch/errors.hpp"
#include "stitch/sim_backend.hpp"
#include "stitch/stats.hpp"

namespace stitch {
namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

constexpr auto I = [](std::size_t v) { return static_cast<std::int64_t>(v); };

/// An opaque simulated stream handle (non-null, distinct per n).
stream_t S(int n) { return reinterpret_cast<stream_t>(static_cast<std::uintptr_t>(n) * 0x10); }

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// ---- data patterns: every byte for small blocks, ends + every 4 KiB for large ones ---------------

std::uint64_t pattern_word(std::uint64_t seed, std::size_t offset) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ULL + offset;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 29;
  return x;
}

template <typename Fn>
void for_each_pattern_offset(std::size_t size, Fn&& fn) {
  if (size <= 64 * KiB) {
    for (std::size_t off = 0; off + 8 <= size; off += 8) fn(off);
    return;
  }
  for (std::size_t off = 0; off < 64; off += 8) fn(off);
  for (std::size_t off = 4 * KiB; off + 8 <= size - 64; off += 4 * KiB) fn(off);
  for (std::size_t off = size - 64; off + 8 <= size; off += 8) fn(off);
}

void fill(void* p, std::size_t size, std::uint64_t seed) {
  auto* bytes = static_cast<unsigned char*>(p);
  for_each_pattern_offset(size, [&](std::size_t off) {
    const std::uint64_t w = pattern_word(seed, off);
    std::memcpy(bytes + off, &w, 8);
  });
}

bool intact(const void* p, std::size_t size, std::uint64_t seed) {
  const auto* bytes = static_cast<const unsigned char*>(p);
  bool ok = true;
  for_each_pattern_offset(size, [&](std::size_t off) {
    std::uint64_t w;
    std::memcpy(&w, bytes + off, 8);
    if (w != pattern_word(seed, off)) ok = false;
  });
  return ok;
}

/// A live allocation with a pattern in it.
struct Live {
  void* ptr;
  std::size_t size;
  std::uint64_t seed;
};

// ---- fixture -------------------------------------------------------------------------------------

class AllocatorTest : public ::testing::Test {
 protected:
  void make(const std::string& conf = "", std::size_t capacity = GiB, int devices = 1) {
    SimBackend::Options options;
    options.capacity = capacity;
    options.devices = devices;
    a_.reset();
    sim_ = std::make_shared<SimBackend>(options);
    a_ = std::make_unique<Allocator>(Config::parse(conf.empty() ? "backend:sim" : "backend:sim," + conf),
                                     sim_);
  }

  void SetUp() override { make(); }

  Allocator& a() { return *a_; }
  SimBackend& sim() { return *sim_; }

  std::int64_t st(const std::string& key, int device = 0) {
    const auto v = a_->stat(device, key);
    EXPECT_TRUE(v.has_value()) << key;
    return v.value_or(INT64_MIN);
  }

  Live live(std::size_t size, stream_t stream = nullptr, int device = 0) {
    void* p = a_->allocate(size, stream, device);
    const std::uint64_t seed = ++seed_;
    fill(p, size, seed);
    return Live{p, size, seed};
  }

  void expect_intact(const std::vector<Live>& blocks) {
    for (const Live& b : blocks) {
      EXPECT_TRUE(intact(b.ptr, b.size, b.seed)) << "block " << b.ptr << " of " << b.size;
      const auto info = a_->find(b.ptr);
      ASSERT_TRUE(info.has_value()) << b.ptr << " is no longer live";
      EXPECT_EQ(info->requested, b.size);
    }
  }

  std::shared_ptr<SimBackend> sim_;
  std::unique_ptr<Allocator> a_;
  std::uint64_t seed_ = 0;
};

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

// ---- reuse and streams -------------------------------------------------------------------------

TEST_F(AllocatorTest, FreedBlockIsReusedOnTheSameStream) {
  for (std::size_t size : {std::size_t{1000}, 5 * MiB, 12 * MiB}) {
    void* p = a().allocate(size, S(1));
    a().deallocate(p);
    const auto allocs = st("num_device_alloc");
    void* q = a().allocate(size, S(1));
    EXPECT_EQ(q, p) << size;
    EXPECT_EQ(st("num_device_alloc"), allocs) << size;
    a().deallocate(q);
  }
}

TEST_F(AllocatorTest, FreedBlockIsNotReusedByAnotherStream) {
  for (std::size_t size : {std::size_t{1000}, 5 * MiB, 12 * MiB}) {
    make();
    void* p = a().allocate(size, S(1));
    a().deallocate(p);
    void* q = a().allocate(size, S(2));
    EXPECT_NE(q, p) << size;
    EXPECT_EQ(st("segment.all.current"), 2) << size;
    // The first stream still gets its own block back.
    EXPECT_EQ(a().allocate(size, S(1)), p) << size;
    a().validate();
  }
}

TEST_F(AllocatorTest, DefaultStreamIsAStreamOfItsOwn) {
  void* p = a().allocate(1000, nullptr);
  a().deallocate(p);
  EXPECT_NE(a().allocate(1000, S(1)), p);
  EXPECT_EQ(a().allocate(1000, nullptr), p);
}

TEST_F(AllocatorTest, BestFitPicksTheSmallestFreeBlockThatFits) {
  void* b12 = a().allocate(12 * MiB, S(1));
  void* b16 = a().allocate(16 * MiB, S(1));
  void* b14 = a().allocate(14 * MiB, S(1));
  a().deallocate(b12);
  a().deallocate(b16);
  a().deallocate(b14);
  EXPECT_EQ(a().allocate(13 * MiB, S(1)), b14);
  EXPECT_EQ(a().allocate(11 * MiB, S(1)), b12);
  EXPECT_EQ(a().allocate(15 * MiB, S(1)), b16);
  EXPECT_EQ(st("num_device_alloc"), 3);
}

TEST_F(AllocatorTest, BestFitPrefersTheLowestAddressAmongEqualSizes) {
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(a().allocate(12 * MiB, S(1)));
  for (void* p : blocks) a().deallocate(p);
  std::sort(blocks.begin(), blocks.end());
  for (void* expected : blocks) EXPECT_EQ(a().allocate(12 * MiB, S(1)), expected);
}

TEST_F(AllocatorTest, BestFitInsideASmallSegment) {
  // One 2 MiB segment: [a 1K][b 4K][c 1K][d 2K][e 1K][free tail].
  void* pa = a().allocate(1 * KiB, S(1));
  void* pb = a().allocate(4 * KiB, S(1));
  void* pc = a().allocate(1 * KiB, S(1));
  void* pd = a().allocate(2 * KiB, S(1));
  void* pe = a().allocate(1 * KiB, S(1));
  ASSERT_EQ(st("segment.all.current"), 1);
  a().deallocate(pb);
  a().deallocate(pd);
  // 1.5 KiB fits b (4K), d (2K) and the tail: d is the smallest.
  EXPECT_EQ(a().allocate(1536, S(1)), pd);
  // 3 KiB fits b and the tail: b.
  EXPECT_EQ(a().allocate(3 * KiB, S(1)), pb);
  (void)pa;
  (void)pc;
  (void)pe;
  a().validate();
}

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

// ---- splitting -----------------------------------------------------------------------------------

TEST_F(AllocatorTest, SmallPoolSplitsRemaindersOfAtLeast512) {
  void* p = a().allocate(MiB);
  EXPECT_EQ(st("inactive_split.small_pool.current"), 1);
  EXPECT_EQ(st("inactive_split_bytes.small_pool.current"), I(MiB));
  void* q = a().allocate(MiB - 512);  // leaves exactly 512 B: still split off
  EXPECT_EQ(q, static_cast<char*>(p) + MiB);
  EXPECT_EQ(st("allocated_bytes.small_pool.current"), I(2 * MiB - 512));
  EXPECT_EQ(st("inactive_split_bytes.small_pool.current"), 512);
  void* r = a().allocate(1);
  EXPECT_EQ(r, static_cast<char*>(p) + 2 * MiB - 512);
  EXPECT_EQ(st("inactive_split.small_pool.current"), 0);
  EXPECT_EQ(st("segment.all.current"), 1);
  a().validate();
}

TEST_F(AllocatorTest, LargePoolDoesNotSplitARemainderOfAtMost1MiB) {
  void* p = a().allocate(19 * MiB);  // 20 MiB segment, 1 MiB left: stays in the block
  EXPECT_EQ(st("allocated_bytes.large_pool.current"), I(20 * MiB));
  EXPECT_EQ(st("requested_bytes.large_pool.current"), I(19 * MiB));
  EXPECT_EQ(st("inactive_split.all.current"), 0);
  const auto info = a().find(p);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->size, 20 * MiB);
}

TEST_F(AllocatorTest, LargePoolSplitsARemainderAbove1MiB) {
  (void)a().allocate(19 * MiB - 512);  // 1 MiB + 512 left: split
  EXPECT_EQ(st("allocated_bytes.large_pool.current"), I(19 * MiB - 512));
  EXPECT_EQ(st("inactive_split.large_pool.current"), 1);
  EXPECT_EQ(st("inactive_split_bytes.large_pool.current"), I(MiB + 512));
  a().validate();
}

TEST_F(AllocatorTest, AllocatedBlocksFromASplitAreAdjacent) {
  char* p = static_cast<char*>(a().allocate(4 * MiB, S(1)));
  char* q = static_cast<char*>(a().allocate(4 * MiB, S(1)));
  char* r = static_cast<char*>(a().allocate(2 * MiB, S(1)));
  EXPECT_EQ(q, p + 4 * MiB);
  EXPECT_EQ(r, q + 4 * MiB);
}

// ---- coalescing ----------------------------------------------------------------------------------

class CoalesceTest : public AllocatorTest, public ::testing::WithParamInterface<int> {};

TEST_P(CoalesceTest, FreeingEverythingInAnyOrderLeavesOneFreeBlockPerSegment) {
  // Fill one small segment and two 20 MiB segments with blocks of assorted sizes, then free
  // them in an order chosen by the parameter (0: forward, 1: reverse, 2: odd then even, others:
  // shuffles).
  std::vector<Live> blocks;
  for (std::size_t size : {std::size_t{512}, 3 * KiB, 100 * KiB, 512 * KiB, std::size_t{1536},
                           300 * KiB, 8 * KiB})
    blocks.push_back(live(size, S(1)));
  for (std::size_t size : {3 * MiB, 2 * MiB, 5 * MiB, 4 * MiB, 2 * MiB + 512, 6 * MiB, 3 * MiB})
    blocks.push_back(live(size, S(1)));
  const auto segments = st("segment.all.current");
  ASSERT_EQ(segments, 3);
  ASSERT_GT(st("inactive_split.all.current"), 0);

  std::vector<std::size_t> order(blocks.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  const int mode = GetParam();
  if (mode == 1) {
    std::reverse(order.begin(), order.end());
  } else if (mode == 2) {
    std::stable_partition(order.begin(), order.end(), [](std::size_t i) { return i % 2 == 1; });
  } else if (mode > 2) {
    std::mt19937 rng(static_cast<unsigned>(mode));
    std::shuffle(order.begin(), order.end(), rng);
  }
  for (std::size_t k = 0; k < order.size(); ++k) {
    const Live& b = blocks[order[k]];
    EXPECT_TRUE(intact(b.ptr, b.size, b.seed));
    a().deallocate(b.ptr);
    a().validate();  // includes "no two adjacent free blocks"
  }
  EXPECT_EQ(st("inactive_split.all.current"), 0);
  EXPECT_EQ(st("inactive_split_bytes.all.current"), 0);
  EXPECT_EQ(st("allocation.all.current"), 0);
  EXPECT_EQ(st("active.all.current"), 0);
  EXPECT_EQ(st("segment.all.current"), segments);
  // Only whole free segments are released, so all of them going proves they coalesced.
  a().empty_cache();
  EXPECT_EQ(st("reserved_bytes.all.current"), 0);
  EXPECT_EQ(st("segment.all.current"), 0);
}

INSTANTIATE_TEST_SUITE_P(Orders, CoalesceTest, ::testing::Range(0, 10));

TEST_F(AllocatorTest, CoalescedBlockIsReusedWhole) {
  char* p = static_cast<char*>(a().allocate(4 * MiB, S(1)));
  void* q = a().allocate(4 * MiB, S(1));
  void* r = a().allocate(4 * MiB, S(1));
  a().deallocate(q);
  a().deallocate(p);
  a().deallocate(r);
  // The whole 20 MiB segment is one block again: a 19 MiB request gets it from the start.
  EXPECT_EQ(a().allocate(19 * MiB, S(1)), p);
  EXPECT_EQ(st("num_device_alloc"), 1);
}

// ---- max_split_size_mb ---------------------------------------------------------------------------

TEST_F(AllocatorTest, OversizeBlockIsNotSplit) {
  make("max_split_size_mb:20");
  void* p = a().allocate(40 * MiB, S(1));
  a().deallocate(p);
  EXPECT_EQ(a().allocate(30 * MiB, S(1)), p);
  EXPECT_EQ(st("allocated_bytes.all.current"), I(40 * MiB));
  EXPECT_EQ(st("requested_bytes.all.current"), I(30 * MiB));
  EXPECT_EQ(st("inactive_split.all.current"), 0);
  a().validate();
}

TEST_F(AllocatorTest, OversizeBlockIsNotGivenToSmallerRequests) {
  make("max_split_size_mb:20");
  void* p = a().allocate(40 * MiB, S(1));
  a().deallocate(p);
  EXPECT_NE(a().allocate(10 * MiB, S(1)), p);
  EXPECT_NE(a().allocate(5 * MiB, S(1)), p);
  EXPECT_EQ(st("num_device_alloc"), 3);
}

TEST_F(AllocatorTest, OversizeBlockIsReusedOnlyWithinMaxNonSplitRounding) {
  make("max_split_size_mb:20");
  void* p = a().allocate(40 * MiB, S(1));
  a().deallocate(p);
  // 40 MiB >= 20 MiB + 20 MiB (default max_non_split_rounding): too wasteful, new segment.
  void* q = a().allocate(20 * MiB, S(1));
  EXPECT_NE(q, p);
  // 40 MiB < 21 MiB + 20 MiB: reused.
  EXPECT_EQ(a().allocate(21 * MiB, S(1)), p);
}

TEST_F(AllocatorTest, MaxNonSplitRoundingIsConfigurable) {
  make("max_split_size_mb:20,max_non_split_rounding_mb:40");
  void* p = a().allocate(50 * MiB, S(1));
  a().deallocate(p);
  EXPECT_EQ(a().allocate(20 * MiB, S(1)), p);  // 50 < 20 + 40
}

TEST_F(AllocatorTest, WithoutMaxSplitSizeLargeBlocksAreSplitForSmallerRequests) {
  void* p = a().allocate(40 * MiB, S(1));
  a().deallocate(p);
  EXPECT_EQ(a().allocate(10 * MiB, S(1)), p);
  EXPECT_EQ(st("inactive_split.large_pool.current"), 1);
  EXPECT_EQ(st("num_device_alloc"), 1);
}

TEST_F(AllocatorTest, OversizeStatistics) {
  make("max_split_size_mb:20");
  EXPECT_EQ(st("max_split_size"), I(20 * MiB));
  void* p = a().allocate(40 * MiB, S(1));
  void* q = a().allocate(12 * MiB, S(1));
  EXPECT_EQ(st("oversize_allocations.current"), 1);
  EXPECT_EQ(st("oversize_segments.current"), 1);
  a().deallocate(p);
  a().deallocate(q);
  EXPECT_EQ(st("oversize_allocations.current"), 0);
  EXPECT_EQ(st("oversize_allocations.peak"), 1);
  EXPECT_EQ(st("oversize_segments.current"), 1);
  a().empty_cache();
  EXPECT_EQ(st("oversize_segments.current"), 0);
}

TEST_F(AllocatorTest, MaxSplitSizeStatIsMinusOneWhenUnlimited) {
  EXPECT_EQ(st("max_split_size"), -1);
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

// ---- record_stream and events --------------------------------------------------------------------

TEST_F(AllocatorTest, RecordStreamDefersReuseUntilTheOtherStreamCompletes) {
  const stream_t s = S(1), t = S(2);
  void* p = a().allocate(12 * MiB, s);
  a().record_stream(p, t);
  sim().hold_stream(t);
  a().deallocate(p);
  // Pending: no longer allocated, still active.
  EXPECT_FALSE(a().find(p).has_value());
  EXPECT_EQ(st("allocation.all.current"), 0);
  EXPECT_EQ(st("allocated_bytes.all.current"), 0);
  EXPECT_EQ(st("active.all.current"), 1);
  EXPECT_EQ(st("active_bytes.all.current"), I(12 * MiB));
  EXPECT_EQ(st("requested_bytes.all.current"), I(12 * MiB));
  a().validate();
  void* q = a().allocate(12 * MiB, s);
  EXPECT_NE(q, p);
  EXPECT_EQ(st("segment.all.current"), 2);
  sim().release_stream(t);
  void* r = a().allocate(12 * MiB, s);
  EXPECT_EQ(r, p);
  EXPECT_EQ(st("segment.all.current"), 2);
  EXPECT_EQ(st("active.all.current"), 2);
  a().validate();
}

TEST_F(AllocatorTest, RecordStreamDefersReuseInTheSmallPool) {
  const stream_t s = S(1), t = S(2);
  void* p = a().allocate(1000, s);
  a().record_stream(p, t);
  sim().hold_stream(t);
  a().deallocate(p);
  void* q = a().allocate(1000, s);
  EXPECT_NE(q, p);
  a().deallocate(q);
  sim().release_stream(t);
  // Once the event completes, p's block coalesces with the rest and is the lowest address.
  EXPECT_EQ(a().allocate(1000, s), p);
  a().validate();
}

TEST_F(AllocatorTest, RecordStreamOnSeveralStreamsWaitsForAllOfThem) {
  const stream_t s = S(1), t = S(2), u = S(3);
  void* p = a().allocate(12 * MiB, s);
  a().record_stream(p, t);
  a().record_stream(p, u);
  sim().hold_stream(t);
  sim().hold_stream(u);
  a().deallocate(p);
  EXPECT_EQ(sim().call_count(SimCall::record_event), 2u);
  sim().release_stream(t);
  void* q = a().allocate(12 * MiB, s);
  EXPECT_NE(q, p);  // u still holds it
  sim().release_stream(u);
  EXPECT_EQ(a().allocate(12 * MiB, s), p);
}

TEST_F(AllocatorTest, NoEventForBlocksThatNeverCrossedStreams) {
  std::vector<void*> blocks;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 4; ++i) {
      for (std::size_t size : {std::size_t{1000}, 3 * MiB, 12 * MiB})
        blocks.push_back(a().allocate(size, S(i)));
    }
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      void* p = blocks[i];
      const auto info = a().find(p);
      ASSERT_TRUE(info.has_value());
      if (i % 3 == 0) {
        a().deallocate(p);
      } else if (i % 3 == 1) {
        a().deallocate(p, info->stream);  // last use on its own stream
      } else {
        a().record_stream(p, info->stream);  // own stream: nothing to record
        a().deallocate(p, info->requested, 0, info->stream);
      }
    }
    blocks.clear();
  }
  a().empty_cache();
  EXPECT_EQ(sim().call_count(SimCall::create_event), 0u);
  EXPECT_EQ(sim().call_count(SimCall::record_event), 0u);
  EXPECT_EQ(sim().call_count(SimCall::query_event), 0u);
  EXPECT_EQ(sim().call_count(SimCall::synchronize_event), 0u);
  EXPECT_EQ(st("num_sync_all_streams"), 0);
}

TEST_F(AllocatorTest, DeallocateOnAnotherStreamIsALastUseThere) {
  const stream_t s = S(1), t = S(2);
  void* p = a().allocate(12 * MiB, s);
  sim().hold_stream(t);
  a().deallocate(p, t);
  EXPECT_EQ(sim().call_count(SimCall::record_event), 1u);
  EXPECT_EQ(st("active.all.current"), 1);
  EXPECT_NE(a().allocate(12 * MiB, s), p);
  sim().release_stream(t);
  EXPECT_EQ(a().allocate(12 * MiB, s), p);
}

TEST_F(AllocatorTest, FourArgumentDeallocateOnAnotherStreamIsALastUseThere) {
  const stream_t s = S(1), t = S(2);
  void* p = a().allocate(12 * MiB, s);
  sim().hold_stream(t);
  a().deallocate(p, 12 * MiB, 0, t);
  EXPECT_EQ(st("active.all.current"), 1);
  EXPECT_NE(a().allocate(12 * MiB, s), p);
  sim().release_stream(t);
  EXPECT_EQ(a().allocate(12 * MiB, s), p);
}

TEST_F(AllocatorTest, EventsArePooled) {
  const stream_t s = S(1), t = S(2);
  for (int i = 0; i < 10; ++i) {
    void* p = a().allocate(1000, s);
    a().record_stream(p, t);
    a().deallocate(p);
  }
  // Each event completes at once (t is not held) and goes back to the pool at the next malloc,
  // or at a read of the statistics (the last one here).
  EXPECT_EQ(sim().call_count(SimCall::record_event), 10u);
  EXPECT_EQ(sim().call_count(SimCall::create_event), 1u);
  EXPECT_EQ(st("active.all.current"), 0);
  void* q = a().allocate(1000, s);
  EXPECT_EQ(st("active.all.current"), 1);
  a().deallocate(q);
  a().validate();
}

TEST_F(AllocatorTest, PendingBlockCannotBeFreedAgain) {
  void* p = a().allocate(1000, S(1));
  a().record_stream(p, S(2));
  sim().hold_stream(S(2));
  a().deallocate(p);
  EXPECT_THROW(a().deallocate(p), invalid_argument);
  EXPECT_EQ(st("num_invalid_frees"), 1);
  a().validate();
}

TEST_F(AllocatorTest, RecordStreamOfAnUnknownPointerThrows) {
  int x = 0;
  EXPECT_THROW(a().record_stream(&x, S(1)), invalid_argument);
  void* p = a().allocate(1000);
  a().deallocate(p);
  EXPECT_THROW(a().record_stream(p, S(1)), invalid_argument);
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

TEST_F(AllocatorTest, EmptyCacheWaitsForPendingEvents) {
  const stream_t s = S(1), t = S(2);
  void* p = a().allocate(12 * MiB, s);
  a().record_stream(p, t);
  sim().hold_stream(t);
  a().deallocate(p);
  const auto forced = sim().forced_completions();
  a().empty_cache();
  EXPECT_EQ(sim().forced_completions(), forced + 1);
  EXPECT_EQ(sim().call_count(SimCall::synchronize_event), 1u);
  EXPECT_EQ(st("num_sync_all_streams"), 1);
  EXPECT_EQ(st("active.all.current"), 0);
  EXPECT_EQ(st("reserved_bytes.all.current"), 0);
  EXPECT_EQ(sim().usage(0).used, 0u);
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
  EXPECT_TRUE(intact(big.ptr, big.size, big.seed));
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

// ---- memory fraction -----------------------------------------------------------------------------

TEST_F(AllocatorTest, SetMemoryFractionCapsReservedMemory) {
  a().set_memory_fraction(0.25, 0);  // 256 MiB of 1 GiB
  void* p = a().allocate(200 * MiB);
  std::string msg;
  try {
    (void)a().allocate(100 * MiB);
  } catch (const out_of_memory& e) {
    msg = e.what();
  }
  ASSERT_FALSE(msg.empty()) << "expected an OOM";
  EXPECT_TRUE(contains(msg, "The memory fraction allows 256.00 MiB")) << msg;
  EXPECT_LE(st("reserved_bytes.all.current"), I(256 * MiB));
  EXPECT_EQ(sim().usage(0).used, 200 * MiB);
  (void)p;
}

TEST_F(AllocatorTest, SetMemoryFractionOfOneRemovesTheCap) {
  a().set_memory_fraction(0.25, 0);
  (void)a().allocate(200 * MiB);
  EXPECT_THROW((void)a().allocate(100 * MiB), out_of_memory);
  a().set_memory_fraction(1.0, 0);
  EXPECT_NE(a().allocate(100 * MiB), nullptr);
}

TEST_F(AllocatorTest, SetMemoryFractionRejectsBadArguments) {
  EXPECT_THROW(a().set_memory_fraction(1.5, 0), invalid_argument);
  EXPECT_THROW(a().set_memory_fraction(-0.1, 0), invalid_argument);
  EXPECT_THROW(a().set_memory_fraction(0.5, 1), invalid_argument);
  EXPECT_THROW(a().set_memory_fraction(0.5, -1), invalid_argument);
}

TEST_F(AllocatorTest, SetMemoryFractionAppliesToOneDevice) {
  make("", GiB, 2);
  a().set_memory_fraction(0.25, 1);
  EXPECT_NE(a().allocate(500 * MiB, nullptr, 0), nullptr);
  EXPECT_THROW((void)a().allocate(500 * MiB, nullptr, 1), out_of_memory);
}

TEST_F(AllocatorTest, PerProcessMemoryFractionKeyCapsReservedMemory) {
  make("per_process_memory_fraction:0.25");
  (void)a().allocate(200 * MiB);
  std::string msg;
  try {
    (void)a().allocate(100 * MiB);
  } catch (const out_of_memory& e) {
    msg = e.what();
  }
  EXPECT_TRUE(contains(msg, "The memory fraction allows")) << msg;
  EXPECT_LE(st("reserved_bytes.all.current"), I(256 * MiB));
}

TEST_F(AllocatorTest, MemoryFractionLadderReleasesCacheBeforeGivingUp) {
  a().set_memory_fraction(0.25, 0);
  void* p = a().allocate(200 * MiB, S(1));
  a().deallocate(p);
  // 200 cached + 150 > 256 allowed: the cached segment is released and the request served.
  EXPECT_NE(a().allocate(150 * MiB, S(2)), nullptr);
  EXPECT_EQ(st("num_alloc_retries"), 1);
  EXPECT_EQ(st("reserved_bytes.all.current"), I(150 * MiB));
}

TEST_F(AllocatorTest, ConfigureKeepsAMemoryFractionSetAtRunTime) {
  // set_memory_fraction() is a run-time setting; applying an unrelated tunable must not undo it.
  a().set_memory_fraction(0.25, 0);
  a().configure("max_split_size_mb:64");
  EXPECT_THROW((void)a().allocate(500 * MiB), out_of_memory);
}

TEST_F(AllocatorTest, ConfigureAppliesAnExplicitFractionAfterARunTimeChange) {
  // A fraction named in configure() is the cap afterwards, even if it equals the fraction the
  // allocator was built with and set_memory_fraction() changed it in between.
  make("per_process_memory_fraction:0.25");
  a().set_memory_fraction(1.0, 0);
  a().configure("per_process_memory_fraction:0.25");
  EXPECT_THROW((void)a().allocate(500 * MiB), out_of_memory);
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
    fill(p, 5 * MiB, 77);
    a.deallocate(a.allocate(12 * MiB, S(1)));  // cached: returned
  }
  EXPECT_TRUE(intact(p, 5 * MiB, 77));
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
  for (const char* name : {"oversize_allocations", "oversize_segments"})
    for (const char* part : {"current", "peak", "allocated", "freed"})
      keys.push_back(std::string(name) + "." + part);
  for (const char* name : {"num_alloc_retries", "num_ooms", "num_sync_all_streams",
                           "num_device_alloc", "num_device_free", "num_invalid_frees",
                           "num_stitches", "stitched_bytes", "num_page_reuses", "num_page_borrows",
                           "num_immediate_reuses",
                           "max_split_size"})
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

TEST_F(AllocatorTest, ActiveStatisticsFollowPendingBlocksAcrossResets) {
  // active = allocated + pending: its running sums and peaks must behave as if it were counted
  // on its own, including across reset_accumulated_stats and reset_peak_stats.
  const stream_t s = S(1), t = S(2);
  void* p = a().allocate(12 * MiB, s);
  void* q = a().allocate(12 * MiB, s);
  a().record_stream(p, t);
  sim().hold_stream(t);
  a().deallocate(p);  // pending
  a().deallocate(q);  // free at once
  EXPECT_EQ(st("active.all.current"), 1);
  EXPECT_EQ(st("active.all.peak"), 2);
  EXPECT_EQ(st("active.all.allocated"), 2);
  EXPECT_EQ(st("active.all.freed"), 1);
  EXPECT_EQ(st("active.large_pool.freed"), 1);
  a().reset_accumulated_stats(0);
  EXPECT_EQ(st("active.all.allocated"), 0);
  EXPECT_EQ(st("active.all.freed"), 0);
  a().reset_peak_stats(0);
  EXPECT_EQ(st("active.all.peak"), 1);
  EXPECT_EQ(st("active_bytes.all.peak"), I(12 * MiB));
  // While p is pending, a new allocation makes active 2 again: a new peak.
  void* r = a().allocate(12 * MiB, s);
  EXPECT_EQ(st("active.all.current"), 2);
  EXPECT_EQ(st("active.all.peak"), 2);
  EXPECT_EQ(st("active.large_pool.peak"), 2);
  EXPECT_EQ(st("active_bytes.all.peak"), I(24 * MiB));
  EXPECT_EQ(st("allocation.all.peak"), 1);
  sim().release_stream(t);
  a().deallocate(r);
  void* u = a().allocate(1000, s);  // processes the completed event: p leaves active
  EXPECT_EQ(st("active.all.allocated"), 2);
  EXPECT_EQ(st("active.all.freed"), 2);  // p (its event completed) and r
  EXPECT_EQ(st("active.all.current"), 1);
  EXPECT_EQ(st("active.small_pool.current"), 1);
  a().deallocate(u);
  a().validate();
}

TEST_F(AllocatorTest, InactiveSplitCountsNetChangesAsPyTorchDoes) {
  // PyTorch changes inactive_split once per split or free by the net effect. Splitting an
  // unsplit free segment adds one inactive block; freeing the piece back merges it into one
  // unsplit free block: one inactive block leaves.
  void* p = a().allocate(1000);
  EXPECT_EQ(st("inactive_split.all.current"), 1);
  EXPECT_EQ(st("inactive_split.all.allocated"), 1);
  EXPECT_EQ(st("inactive_split_bytes.all.current"), I(2 * MiB - 1024));
  a().deallocate(p);
  EXPECT_EQ(st("inactive_split.all.current"), 0);
  EXPECT_EQ(st("inactive_split.all.freed"), 1);
  // A split free remainder that shrinks stays one inactive block: only its bytes change.
  void* x = a().allocate(1000);
  void* y = a().allocate(1000);
  EXPECT_EQ(st("inactive_split.all.allocated"), 2);
  EXPECT_EQ(st("inactive_split.all.freed"), 1);
  EXPECT_EQ(st("inactive_split_bytes.all.current"), I(2 * MiB - 2048));
  // Freeing x (its neighbour y is allocated) adds one; freeing y merges x, y and the tail.
  a().deallocate(x);
  EXPECT_EQ(st("inactive_split.all.current"), 2);
  a().deallocate(y);
  EXPECT_EQ(st("inactive_split.all.current"), 0);
  EXPECT_EQ(st("inactive_split.all.allocated"), 3);
  EXPECT_EQ(st("inactive_split.all.freed"), 3);
  a().validate();
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
            fill(p, l.size, seed);
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
          if (!intact(l.ptr, l.size, l.seed)) ++corrupted;
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
        if (!intact(l.ptr, l.size, l.seed)) ++corrupted;
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
