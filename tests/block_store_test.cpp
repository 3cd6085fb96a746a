// The block store (core/block_store.hpp), through the allocator: per-stream reuse, best fit,
// splitting, coalescing, oversize blocks (max_split_size) and the inactive-split statistics;
// and the store itself: block states and their transitions, filing, taking pages out and mapping
// them back, a placed start state, and the invariants validate() checks.
#include <gtest/gtest.h>

#include "core/block_store.hpp"
#include "core/stream_shards.hpp"
#include "support/allocator_fixture.hpp"

namespace stitch {
namespace {

using namespace stitch::test;

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
    EXPECT_TRUE(pattern_intact(b.ptr, b.size, b.seed));
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


// ---- inactive_split ----------------------------------------------------------------------------

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

}  // namespace
}  // namespace stitch

// ---- the store itself ----------------------------------------------------------------------------

namespace stitch::detail {
namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

char* at(std::uintptr_t a) { return reinterpret_cast<char*>(a); }

struct StoreFixture {
  Config config = Config::parse("backend:sim");
  StreamShards shards;
  HotStats hot{shards.head()};
  BlockStore store{config, shards, hot};
  std::vector<const Block*> live;
  /// The current value of hot counter `c` in pool `small`, summed over the streams.
  std::int64_t hot_current(int c, bool small) const {
    std::int64_t n = 0;
    for (const StreamShard* s = shards.first(); s != nullptr; s = s->next.load())
      n += s->stats.cur[c][small ? 0 : 1].read();
    return n;
  }
  StoreCount check() {
    return store.validate(0, [&](const Block* b) {
      return std::find(live.begin(), live.end(), b) != live.end();
    });
  }
  Block* take(BlockPool& pool, Block* b, std::size_t n) {
    Block* out = store.take(pool, b, n);
    live.push_back(out);
    return out;
  }
  void file(BlockPool& pool, Block* b) {
    live.erase(std::find(live.begin(), live.end(), b));
    store.file(pool, b);
  }
};

TEST(BlockState, OnlyTheLifecycleTransitionsAreAllowed) {
  using S = BlockState;
  EXPECT_TRUE(may_become(S::free, S::allocated));
  EXPECT_TRUE(may_become(S::allocated, S::free));
  EXPECT_TRUE(may_become(S::allocated, S::deferred));
  EXPECT_TRUE(may_become(S::deferred, S::pending));
  EXPECT_TRUE(may_become(S::pending, S::free));
  EXPECT_TRUE(may_become(S::free, S::unmapped));
  EXPECT_TRUE(may_become(S::free, S::lent));
  EXPECT_TRUE(may_become(S::lent, S::free));
  EXPECT_FALSE(may_become(S::pending, S::allocated)) << "a pending block is never handed out";
  EXPECT_FALSE(may_become(S::deferred, S::free)) << "its events come first";
  EXPECT_FALSE(may_become(S::unmapped, S::allocated)) << "mapped first";
  EXPECT_FALSE(may_become(S::lent, S::unmapped));
  EXPECT_FALSE(may_become(S::free, S::free));
  EXPECT_FALSE(may_become(S::unmapped, S::lent)) << "only mapped free memory is lent";
  EXPECT_STREQ(to_string(S::deferred), "deferred");
}

TEST(BlockStore, TakesSplitsFilesAndCoalescesKeepingEveryInvariant) {
  StoreFixture f;
  BlockPool& small = f.store.pool(nullptr, true);
  Block* seg = f.store.add_segment(f.store.prepare_segment(nullptr), small, nullptr, at(0x10000000), 2 * MiB, BlockState::free);
  EXPECT_EQ(seg->state, BlockState::free);
  f.check();
  Block* a = f.take(small, f.store.best_fit(small, nullptr, 4 * KiB), 4 * KiB);
  Block* b = f.take(small, f.store.best_fit(small, nullptr, 8 * KiB), 8 * KiB);
  EXPECT_EQ(a->state, BlockState::allocated);
  EXPECT_EQ(b->ptr, a->ptr + 4 * KiB) << "splits hand out the front, address order";
  EXPECT_EQ(f.check().inactive[1], 1) << "the free rest of a split segment is inactive_split";
  EXPECT_EQ(f.hot_current(kInactiveSplits, true), 1);
  // Freeing in any order coalesces back into one free block over the segment.
  f.file(small, a);
  EXPECT_EQ(f.check().inactive[0], 2);
  f.file(small, b);
  const StoreCount c = f.check();
  EXPECT_EQ(c.inactive[0], 0);
  EXPECT_EQ(c.free_blocks[0], 1u);
  Segment* s = f.store.segments();
  EXPECT_TRUE(s->head->is_free() && s->head->next == nullptr && s->head->size == 2 * MiB);
  f.store.remove_segment(s);
  EXPECT_EQ(f.store.segments(), nullptr);
  EXPECT_EQ(f.check().free_blocks[0], 0u);
}

TEST(BlockStore, TakesPagesOutMapsThemBackAndLendsThem) {
  StoreFixture f;
  BlockPool& large = f.store.pool(nullptr, false);
  const std::size_t page = 2 * MiB;
  Segment* r = f.store.add_range(f.store.prepare_segment(nullptr), large, nullptr, at(0x40000000), 16 * page, page, false,
                                 BlockState::unmapped);
  EXPECT_TRUE(r->wholly_unmapped());
  f.check();
  // Pages 2-9 mapped (as PageMapper would enter them), then filed free.
  r->pages.make_room(16);
  for (std::size_t i = 2; i < 10; ++i) r->pages.set(i, 1, 100 + i);
  Block* run = f.store.mapped(r->head, r->base + 2 * page, 8 * page, /*merge=*/true);
  EXPECT_EQ(run->state, BlockState::free);
  EXPECT_EQ(run->size, 8 * page);
  StoreCount c = f.check();
  EXPECT_EQ(c.unmapped_blocks[1], 2u) << "the unmapped pieces before and after";
  EXPECT_EQ(c.reserved[0], static_cast<std::int64_t>(8 * page));
  // Pages 4-5 go out again: the free block around them splits, the hole is unmapped.
  for (std::size_t i = 4; i < 6; ++i) r->pages.set(i, 1, 0);
  Block* hole = f.store.take_pages(run, 4 * page, 6 * page, BlockState::unmapped);
  EXPECT_EQ(hole->state, BlockState::unmapped);
  c = f.check();
  EXPECT_EQ(c.unmapped_blocks[1], 3u);
  // Pages 6-7 are lent to another range: in no set, counted there.
  Block* six = hole->next;
  Block* lent = f.store.take_pages(six, 6 * page, 8 * page, BlockState::lent);
  EXPECT_EQ(lent->state, BlockState::lent);
  EXPECT_THROW(f.check(), stitch::error) << "a lent block no range borrows";
  f.store.return_lent(lent);
  c = f.check();
  EXPECT_EQ(c.free_blocks[1], 2u) << "pages 2-3 and 6-9, the hole between them";
  // Mapped back, the hole merges everything into one free block again.
  for (std::size_t i = 4; i < 6; ++i) r->pages.set(i, 1, 200 + i);
  Block* whole = f.store.mapped(hole, r->base + 4 * page, 2 * page, /*merge=*/true);
  EXPECT_EQ(whole->size, 8 * page);
  EXPECT_EQ(f.check().free_blocks[1], 1u);
}

TEST(BlockStore, PlacesARecordedStartState) {
  StoreFixture f;
  BlockPool& large = f.store.pool(nullptr, false);
  Block* seg = f.store.add_segment(f.store.prepare_segment(nullptr), large, nullptr, at(0x30000000), 20 * MiB, BlockState::free);
  const std::vector<SeedBlock> blocks = {
      {2 * MiB, 4 * MiB, 4 * MiB - 100}, {6 * MiB, 2 * MiB, 2 * MiB}, {30 * MiB, MiB, MiB}};
  const std::vector<Block*> placed = f.store.place(large, seg, seg->ptr, blocks);
  ASSERT_EQ(placed.size(), 3u);
  EXPECT_EQ(placed[2], nullptr) << "outside the segment";
  for (int i = 0; i < 2; ++i) {
    ASSERT_NE(placed[i], nullptr);
    EXPECT_EQ(placed[i]->state, BlockState::allocated);
    EXPECT_EQ(placed[i]->size, blocks[i].size);
    f.live.push_back(placed[i]);
  }
  const StoreCount c = f.check();
  EXPECT_EQ(c.allocated, 2u);
  EXPECT_EQ(c.free_blocks[1], 2u) << "the 2 MiB before and the 12 MiB after";
  EXPECT_EQ(c.inactive[2], 2);
  EXPECT_EQ(f.hot_current(kInactiveSplits, false), 2) << "counted as the recount gives";
}

TEST(BlockStore, ValidateFindsWhatIsBroken) {
  StoreFixture f;
  BlockPool& small = f.store.pool(nullptr, true);
  f.store.add_segment(f.store.prepare_segment(nullptr), small, nullptr, at(0x50000000), 2 * MiB, BlockState::free);
  Block* a = f.take(small, f.store.best_fit(small, nullptr, 4 * KiB), 4 * KiB);
  f.check();
  f.live.clear();  // the caller's live table lost it
  EXPECT_THROW(f.check(), stitch::error);
  f.live.push_back(a);
  a->event_count = 1;  // an allocated block waiting for events
  EXPECT_THROW(f.check(), stitch::error);
  a->event_count = 0;
  Block* rest = a->next;
  small.index.erase(rest);  // a free block missing from the index
  EXPECT_THROW(f.check(), stitch::error);
  small.index.insert(rest);
  f.check();
}

}  // namespace
}  // namespace stitch::detail
