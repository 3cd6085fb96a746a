// tests/stitching_test.cpp — virtual-memory stitching (stitching:True) on the simulated device:
// free pages scattered between live blocks are remapped into one contiguous range under memory
// pressure; the guarantee that a request fails only when the pages holding no live block (plus
// what the device can still give) are too few; streams; reuse; dissolving on empty_cache; fault
// injection; statistics, trace and configuration.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/errors.hpp"
#include "stitch/sim_backend.hpp"
#include "support/stitch_scenario.hpp"

namespace {

using stitch::SimCall;
using stitch::test::largest_free_block;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kG = 2 * kMiB;  // the simulator's granularity: one stitching page

stitch::stream_t S(int n) { return reinterpret_cast<stitch::stream_t>(static_cast<std::uintptr_t>(n) * 0x100); }

std::size_t round_up(std::size_t n, std::size_t unit) { return (n + unit - 1) / unit * unit; }

// ---- data patterns: the ends and every 64 KiB (at least 32 samples per 2 MiB page) -------------

std::uint64_t word(std::uint64_t seed, std::size_t offset) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ULL + offset;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ULL;
  return x ^ (x >> 29);
}
template <typename Fn>
void offsets(std::size_t size, Fn&& fn) {
  for (std::size_t off = 0; off + 8 <= size; off += 64 * 1024) fn(off);
  if (size >= 8) fn(size - 8);
}
void fill(void* p, std::size_t size, std::uint64_t seed) {
  offsets(size, [&](std::size_t off) {
    const std::uint64_t w = word(seed, off);
    std::memcpy(static_cast<char*>(p) + off, &w, 8);
  });
}
bool intact(const void* p, std::size_t size, std::uint64_t seed) {
  bool ok = true;
  offsets(size, [&](std::size_t off) {
    std::uint64_t w;
    std::memcpy(&w, static_cast<const char*>(p) + off, 8);
    ok = ok && w == word(seed, off);
  });
  return ok;
}

struct Live {
  void* p;
  std::size_t n;
  std::uint64_t seed;
  stitch::stream_t stream;
};

/// Growing a range by moving the stream's own free pages (stitch_reuse_pages, on by default)
/// serves many requests before the device runs out; the tests of stitched ranges themselves
/// turn it off so that the pressure path is what serves them.
constexpr const char* kNoReuse = ",stitch_reuse_pages:False";

/// These tests are about the fine-grained machinery itself: fine pages from the first byte
/// (stitch_fine_above:0). The policy that keeps it off while there is room is tested in
/// stitching_policy_test.cpp.
struct Fixture {
  explicit Fixture(std::size_t capacity_mb = 1024, const std::string& extra = "") {
    stitch::SimBackend::Options o;
    o.capacity = capacity_mb * kMiB;
    sim = std::make_shared<stitch::SimBackend>(o);
    alloc = std::make_unique<stitch::Allocator>(
        stitch::Config::parse("backend:sim,expandable_segments:True,stitching:True,stitch_fine_above:0" + extra),
        sim);
  }
  std::int64_t stat(const char* key) const { return *alloc->stat(0, key); }

  void* take(std::size_t n, stitch::stream_t s = nullptr) {
    void* p = alloc->allocate(n, s);
    live.push_back(Live{p, n, ++seed, s});
    fill(p, n, seed);
    return p;
  }
  /// Fills the device with blocks of 3-9 MiB (and a few odd KiB) on `streams` in turn.
  void fill_device(const std::vector<stitch::stream_t>& streams = {nullptr}) {
    for (std::size_t i = 0;; ++i) {
      const std::size_t n = (3 + (i * 5) % 7) * kMiB + (i % 3) * 4096 + 512;
      try {
        take(n, streams[i % streams.size()]);
      } catch (const stitch::out_of_memory&) {
        break;
      }
    }
    alloc->validate();
  }
  /// Frees every other live block (those with odd positions); returns the bytes freed.
  void free_every_other() {
    std::vector<Live> keep;
    for (std::size_t i = 0; i < live.size(); ++i) {
      if (i % 2 == 1) {
        alloc->deallocate(live[i].p);
      } else {
        keep.push_back(live[i]);
      }
    }
    live.swap(keep);
    alloc->validate();
  }
  void expect_intact() const {
    for (const Live& l : live) EXPECT_TRUE(intact(l.p, l.n, l.seed)) << l.p << " " << l.n;
  }
  void release(void* p) {
    auto it = std::find_if(live.begin(), live.end(), [&](const Live& l) { return l.p == p; });
    ASSERT_NE(it, live.end());
    EXPECT_TRUE(intact(it->p, it->n, it->seed));
    alloc->deallocate(p);
    live.erase(it);
  }
  void release_all() {
    for (const Live& l : live) {
      EXPECT_TRUE(intact(l.p, l.n, l.seed));
      alloc->deallocate(l.p);
    }
    live.clear();
  }
  void expect_nothing_leaked() {
    release_all();
    alloc->empty_cache();
    alloc->validate();
    EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
    const stitch::SimUsage u = sim->usage(0);
    EXPECT_EQ(u.used, 0u);
    EXPECT_EQ(u.physical_handles, 0u);
    EXPECT_EQ(u.mappings, 0u);
    EXPECT_EQ(u.reservations, 0u);
  }

  std::shared_ptr<stitch::SimBackend> sim;
  std::unique_ptr<stitch::Allocator> alloc;
  std::vector<Live> live;
  std::uint64_t seed = 0;
};

/// Bytes of whole granules holding no live (allocated or pending) block, from a snapshot.
std::size_t free_granule_bytes(const stitch::Allocator& a) {
  std::size_t total = 0;
  for (const stitch::SegmentSnapshot& s : a.snapshot().segments)
    for (const stitch::BlockSnapshot& b : s.blocks) {
      if (b.state != "inactive") continue;
      const std::size_t first = round_up(b.address, kG);
      const std::size_t last = (b.address + b.size) / kG * kG;
      if (last > first) total += last - first;
    }
  return total;
}

/// Whether some mapped segment of the snapshot covers `p`.
bool covers(const stitch::Allocator& a, const void* p) {
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  for (const stitch::SegmentSnapshot& s : a.snapshot().segments)
    if (s.address <= at && at < s.address + s.total_size) return true;
  return false;
}

/// An upper bound on the free granules a stitch can neither move nor borrow with coarse pages:
/// cuMemMap maps a handle from its start, so a free block's granules on a 20 MiB page that begins
/// before the block (at most 9 granules a block) stay where they are.
std::size_t unborrowable_bound(const stitch::Allocator& a) {
  std::size_t total = 0;
  for (const stitch::SegmentSnapshot& s : a.snapshot().segments) {
    if (!s.is_expandable || s.segment_type != "large") continue;
    for (const stitch::BlockSnapshot& b : s.blocks) {
      if (b.state != "inactive") continue;
      const std::size_t first = round_up(b.address, kG);
      const std::size_t last = (b.address + b.size) / kG * kG;
      if (last > first) total += std::min(last - first, 20 * kMiB - kG);
    }
  }
  return total;
}

std::size_t device_free(const stitch::SimBackend& sim) {
  const stitch::SimUsage u = sim.usage(0);
  return u.used < u.capacity ? u.capacity - u.used : 0;
}

// ---- configuration --------------------------------------------------------------------------

TEST(StitchingConfig, NeedsExpandableSegments) {
  try {
    (void)stitch::Config::parse("stitching:True");
    FAIL() << "stitching without expandable segments was accepted";
  } catch (const stitch::config_error& e) {
    EXPECT_NE(std::string(e.what()).find("expandable_segments:True"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(stitch::Config::parse("stitching:True,expandable_segments:True").stitching);
  EXPECT_TRUE(stitch::Config::parse("expandable_segments:True,stitching:True").stitching);
  EXPECT_FALSE(stitch::Config::parse("stitching:False").stitching);
  EXPECT_FALSE(stitch::Config{}.stitching);
  EXPECT_THROW((void)stitch::Config::parse("stitching:yes,expandable_segments:True"),
               stitch::config_error);
  // Turning expandable segments off under a stitching configuration is refused too.
  Fixture f;
  EXPECT_THROW(f.alloc->configure("expandable_segments:False"), stitch::config_error);
  EXPECT_TRUE(f.alloc->config().stitching);
  f.alloc->configure("stitching:False,expandable_segments:False");
  EXPECT_FALSE(f.alloc->config().stitching);
  // A Config built by hand is checked as well.
  stitch::Config c = stitch::Config::parse("backend:sim");
  c.stitching = true;
  EXPECT_THROW(stitch::Allocator(c, std::make_shared<stitch::SimBackend>()), stitch::config_error);
}

TEST(StitchingConfig, RoundTripsAndIsListed) {
  const stitch::Config c = stitch::Config::parse("expandable_segments:True,stitching:True");
  const std::string text = c.to_string();
  EXPECT_NE(text.find(",stitching:True"), std::string::npos) << text;
  EXPECT_TRUE(stitch::Config::parse(text).stitching);
  EXPECT_NE(stitch::Config{}.to_string().find("stitching:False"), std::string::npos);
  try {
    (void)stitch::Config::parse("stitchingg:True");
    FAIL();
  } catch (const stitch::config_error& e) {
    EXPECT_NE(std::string(e.what()).find("stitching"), std::string::npos) << "key list";
  }
}

TEST(Stitching, PagesAreOneGranuleInBothPools) {
  Fixture f;
  void* small = f.take(4096);
  void* large = f.take(3 * kMiB);
  EXPECT_EQ(f.stat("reserved_bytes.small_pool.current"), static_cast<std::int64_t>(kG));
  EXPECT_EQ(f.stat("reserved_bytes.large_pool.current"), static_cast<std::int64_t>(4 * kMiB))
      << "3 MiB maps two 2 MiB pages, not one 20 MiB page";
  f.release(small);
  f.release(large);
  f.alloc->validate();
}

TEST(StitchingConfig, StitchBeforeGrow) {
  EXPECT_EQ(stitch::Config{}.stitch_before_grow, 0u);
  const stitch::Config c =
      stitch::Config::parse("expandable_segments:True,stitching:True,stitch_before_grow_mb:64");
  EXPECT_EQ(c.stitch_before_grow, 64 * kMiB);
  EXPECT_EQ(stitch::Config::parse(c.to_string()).stitch_before_grow, 64 * kMiB);
  EXPECT_EQ(stitch::Config{}.to_string().find("stitch_before_grow_mb"), std::string::npos);
  EXPECT_THROW((void)stitch::Config::parse("stitch_before_grow_mb:-1"), stitch::config_error);
  EXPECT_THROW((void)stitch::Config::parse("stitch_before_grow_mb:big"), stitch::config_error);
}

TEST(Stitching, BeforeGrowReusesOwnPagesForLargeRequestsOnly) {
  Fixture f(2048, ",stitch_before_grow_mb:64" + std::string(kNoReuse));
  std::vector<void*> blocks;
  for (int i = 0; i < 100; ++i) blocks.push_back(f.take((3 + i % 7) * kMiB + 4096));
  f.free_every_other();
  const auto reserved = f.stat("reserved_bytes.all.current");
  const auto syncs = f.sim->call_count(SimCall::synchronize_stream);
  // Below the threshold: the device has room, the range grows as usual.
  f.take(20 * kMiB);
  EXPECT_EQ(f.stat("num_stitches"), 0);
  EXPECT_GT(f.stat("reserved_bytes.all.current"), reserved) << "grown (the free tail counts)";
  // At the threshold, with enough free pages of its own: stitched, nothing new reserved.
  const auto before = f.stat("reserved_bytes.all.current");
  f.take(64 * kMiB);
  EXPECT_EQ(f.stat("num_stitches"), 1);
  EXPECT_EQ(f.stat("reserved_bytes.all.current"), before);
  EXPECT_EQ(f.sim->call_count(SimCall::synchronize_stream), syncs + 1) << "its own stream";
  // Another stream's pages are never taken before growing.
  f.take(64 * kMiB, S(7));
  EXPECT_EQ(f.stat("num_stitches"), 1);
  EXPECT_EQ(f.stat("reserved_bytes.all.current"), before + static_cast<std::int64_t>(64 * kMiB));
  f.alloc->validate();
  f.expect_intact();
  f.expect_nothing_leaked();
}

// ---- the adversarial case: every other block freed ------------------------------------------

TEST(Stitching, ScatteredHolesServeALargeRequest) {
  Fixture f(1024, kNoReuse);
  f.fill_device();
  f.free_every_other();
  const std::size_t hole = largest_free_block(*f.alloc);
  const std::size_t free_pages = free_granule_bytes(*f.alloc);
  ASSERT_LT(hole, 10 * kMiB);
  ASSERT_GT(free_pages, 300 * kMiB);
  f.sim->set_capacity(0, f.sim->usage(0).used);  // not one fresh page left
  const auto reserved = f.stat("reserved_bytes.all.current");
  const auto maps = f.sim->call_count(SimCall::map);
  const auto used = f.sim->usage(0).used;

  const std::size_t want = 200 * kMiB + 12345;  // far more than any hole, less than the pages
  void* big = f.take(want);
  f.alloc->validate();
  f.expect_intact();  // the stitched pages alias no live block: the neighbours kept their data
  EXPECT_EQ(f.stat("num_stitches"), 1);
  EXPECT_EQ(f.stat("stitched_bytes"), static_cast<std::int64_t>(round_up(want, kG)));
  EXPECT_EQ(f.stat("reserved_bytes.all.current"), reserved) << "pages moved, none added";
  EXPECT_EQ(f.sim->usage(0).used, used) << "no fresh physical memory";
  EXPECT_EQ(f.sim->call_count(SimCall::map), maps + round_up(want, kG) / kG);
  EXPECT_LE(f.sim->usage(0).used, f.sim->usage(0).capacity);
  EXPECT_EQ(f.alloc->find(big)->size, round_up(want, 512));

  // Writing the whole stitched block does not touch any neighbour, and reads back.
  fill(big, want, 999);
  EXPECT_TRUE(intact(big, want, 999));
  f.live.back().seed = 999;
  f.expect_intact();
  f.expect_nothing_leaked();
}

TEST(Stitching, RequestLargerThanTheFreePagesIsOutOfMemory) {
  Fixture f;
  f.fill_device();
  f.free_every_other();
  const std::size_t free_pages = free_granule_bytes(*f.alloc) + device_free(*f.sim) / kG * kG;
  const auto ooms = f.stat("num_ooms");  // filling the device ended with one
  EXPECT_THROW((void)f.alloc->allocate(free_pages + kG + 1), stitch::out_of_memory);
  f.alloc->validate();
  f.expect_intact();
  EXPECT_EQ(f.stat("num_stitches"), 0);
  EXPECT_EQ(f.stat("num_ooms"), ooms + 1);
  // What is left is still usable: exactly the free pages.
  void* p = f.take(free_pages - kG);
  f.alloc->validate();
  f.release(p);
  f.expect_nothing_leaked();
}

TEST(Stitching, FreshPagesTopUpTheMovedOnes) {
  // The device still has some memory, not enough to grow by the whole request.
  Fixture f(1024, kNoReuse);
  f.fill_device();
  f.free_every_other();
  const std::size_t spare = device_free(*f.sim);
  const std::size_t want = 100 * kMiB;
  ASSERT_LT(spare, want);
  f.sim->set_capacity(0, f.sim->usage(0).used + 6 * kG);  // exactly six fresh pages
  const auto reserved = f.stat("reserved_bytes.all.current");
  // Only a few of the free pages can move: the rest of the request must be fresh pages.
  const std::size_t movable = free_granule_bytes(*f.alloc);
  ASSERT_GT(movable, want);
  f.take(want);
  EXPECT_EQ(f.stat("num_stitches"), 1);
  EXPECT_EQ(f.stat("reserved_bytes.all.current"), reserved) << "own pages suffice: none fresh";
  // Now more than the free pages: the six fresh pages make up the difference.
  const std::size_t rest = free_granule_bytes(*f.alloc);
  f.take(rest + 6 * kG);
  EXPECT_EQ(f.stat("num_stitches"), 2);
  EXPECT_EQ(f.stat("reserved_bytes.all.current"), static_cast<std::int64_t>(reserved + 6 * kG));
  EXPECT_EQ(device_free(*f.sim), 0u);
  f.alloc->validate();
  f.expect_intact();
  f.expect_nothing_leaked();
}

// ---- streams ----------------------------------------------------------------------------------

TEST(Stitching, OwnStreamPagesFirstOthersOnlyAfterTheirStreamIsSynchronized) {
  Fixture f(1024, kNoReuse);
  const stitch::stream_t s1 = S(1), s2 = S(2);
  f.fill_device({s1, s1, s2, s2});  // blocks 0,1 on s1, 2,3 on s2, ...: holes on both streams
  f.free_every_other();
  // Work queued on s2 that has not run: a block used on s2, freed, waiting for an event.
  f.sim->hold_stream(s2);
  void* used_on_s2 = f.take(kMiB + 4096, s1);
  f.alloc->record_stream(used_on_s2, s2);
  f.release(used_on_s2);
  const std::uint64_t forced = f.sim->forced_completions();

  // Half of s1's free pages: s1's own pages suffice, s2 is left alone.
  std::size_t s1_pages = 0, s2_pages = 0;
  for (const stitch::SegmentSnapshot& s : f.alloc->snapshot().segments)
    for (const stitch::BlockSnapshot& b : s.blocks) {
      if (b.state != "inactive") continue;
      const std::size_t first = round_up(b.address, kG), last = (b.address + b.size) / kG * kG;
      if (last > first) (s.stream == reinterpret_cast<std::uintptr_t>(s1) ? s1_pages : s2_pages) += last - first;
    }
  ASSERT_GT(s1_pages, 100 * kMiB);
  ASSERT_GT(s2_pages, 100 * kMiB);
  auto syncs = f.sim->call_count(SimCall::synchronize_stream);
  f.take(s1_pages / 2, s1);
  EXPECT_EQ(f.sim->call_count(SimCall::synchronize_stream), syncs + 1) << "s1 only";
  EXPECT_EQ(f.sim->forced_completions(), forced) << "s2's queued work was not waited for";
  f.alloc->validate();

  // More than s1 has left: s2's pages are needed, after s2 is synchronized.
  syncs = f.sim->call_count(SimCall::synchronize_stream);
  f.take(s1_pages / 2 + 40 * kMiB, s1);
  EXPECT_EQ(f.stat("num_stitches"), 2);
  EXPECT_EQ(f.sim->call_count(SimCall::synchronize_stream), syncs + 2) << "s1 and s2";
  EXPECT_GT(f.sim->forced_completions(), forced) << "s2's queued work completed before its pages moved";
  f.alloc->validate();
  f.expect_intact();
  f.sim->release_stream(s2);
  f.expect_nothing_leaked();
}

// ---- reuse and dissolving -----------------------------------------------------------------------

TEST(Stitching, StitchedBlocksAreReusedAfterFree) {
  Fixture f(1024, kNoReuse);
  f.fill_device();
  f.free_every_other();
  void* big = f.take(150 * kMiB);
  const auto maps = f.sim->call_count(SimCall::map);
  const auto reserves = f.sim->call_count(SimCall::reserve);
  f.release(big);
  f.alloc->validate();
  void* again = f.take(150 * kMiB);
  EXPECT_EQ(again, big) << "the cached stitched block serves the same request";
  f.release(again);
  void* part = f.take(40 * kMiB);  // and smaller ones, by splitting it
  EXPECT_EQ(part, big);
  EXPECT_EQ(f.sim->call_count(SimCall::map), maps);
  EXPECT_EQ(f.sim->call_count(SimCall::reserve), reserves);
  EXPECT_EQ(f.stat("num_stitches"), 1);
  f.alloc->validate();
  f.expect_intact();
  f.expect_nothing_leaked();
}

TEST(Stitching, EmptyCacheDissolvesStitchedSegments) {
  Fixture f(1024, kNoReuse);
  f.fill_device();
  f.free_every_other();
  void* big = f.take(150 * kMiB);
  EXPECT_EQ(f.stat("num_stitches"), 1);
  f.release(big);
  f.alloc->empty_cache();
  f.alloc->validate();
  // Only the stream's expandable range is left (the stitched range and the empty range the
  // failed growth reserved are given back).
  EXPECT_EQ(f.sim->usage(0).reservations, 1u);
  EXPECT_FALSE(covers(*f.alloc, big));
  EXPECT_EQ(static_cast<std::size_t>(f.stat("reserved_bytes.all.current")), f.sim->usage(0).used);
  f.expect_intact();

  // A stitched segment still holding a live block keeps that block's pages only.
  f.free_every_other();
  f.sim->set_capacity(0, f.sim->usage(0).used);  // full again: the next request stitches
  void* big2 = f.take(120 * kMiB);
  EXPECT_EQ(f.stat("num_stitches"), 2);
  f.release(big2);
  void* inner = f.take(30 * kMiB);  // the front of the cached stitched block
  EXPECT_EQ(inner, big2);
  const auto ranges = f.sim->usage(0).reservations;
  f.alloc->empty_cache();
  EXPECT_EQ(f.sim->usage(0).reservations, ranges) << "the stitched range still holds a live block";
  EXPECT_EQ(static_cast<std::size_t>(f.stat("reserved_bytes.all.current")), f.sim->usage(0).used);
  EXPECT_EQ(free_granule_bytes(*f.alloc), 0u) << "its free pages (and all others) were unmapped";
  f.alloc->validate();
  f.expect_intact();
  f.release(inner);
  f.expect_nothing_leaked();
}

TEST(Stitching, AnEntirelyFreeStitchedSegmentIsRestitchedWhenItsPagesAreNeeded) {
  Fixture f(1024, kNoReuse);
  f.fill_device();
  f.free_every_other();
  void* a = f.take(100 * kMiB);
  EXPECT_EQ(f.stat("num_stitches"), 1);
  f.release(a);
  const auto reserves = f.sim->call_count(SimCall::release_reservation);
  // Bigger than the cached stitched block: its pages and other free pages make a new range.
  const std::size_t want = 100 * kMiB + 60 * kMiB;
  ASSERT_GT(free_granule_bytes(*f.alloc), want);
  f.take(want);
  EXPECT_EQ(f.stat("num_stitches"), 2);
  EXPECT_FALSE(covers(*f.alloc, a)) << "the old stitched range was dissolved";
  EXPECT_EQ(f.sim->call_count(SimCall::release_reservation), reserves + 1);
  f.alloc->validate();
  f.expect_intact();
  f.expect_nothing_leaked();
}

TEST(Stitching, SmallRequestsTakeAFreePageWhenTheDeviceIsFull) {
  Fixture f(256, kNoReuse);
  f.fill_device();
  f.free_every_other();
  f.sim->set_capacity(0, f.sim->usage(0).used);
  // The small pool has no page yet, and the device none left: one page is moved into a stitched
  // small-pool segment.
  ASSERT_EQ(f.stat("reserved_bytes.small_pool.current"), 0);
  void* p = f.take(1000);
  EXPECT_EQ(f.stat("num_stitches"), 1);
  EXPECT_EQ(f.stat("reserved_bytes.small_pool.current"), static_cast<std::int64_t>(kG));
  void* q = f.take(200 * 1024);
  EXPECT_EQ(static_cast<char*>(q), static_cast<char*>(p) + 1024) << "the rest of the page serves the small pool";
  f.alloc->validate();
  f.expect_intact();
  f.expect_nothing_leaked();
}

TEST(Stitching, MemoryFractionIsRespected) {
  Fixture f(1024, ",per_process_memory_fraction:0.5" + std::string(kNoReuse));
  f.fill_device();
  EXPECT_LE(f.stat("reserved_bytes.all.current"), static_cast<std::int64_t>(512 * kMiB));
  f.free_every_other();
  void* big = f.take(150 * kMiB);
  EXPECT_NE(big, nullptr);
  EXPECT_EQ(f.stat("num_stitches"), 1);
  EXPECT_LE(f.stat("reserved_bytes.all.peak"), static_cast<std::int64_t>(512 * kMiB));
  f.alloc->validate();
  f.expect_intact();
  f.expect_nothing_leaked();
}

// ---- statistics, trace, snapshot ----------------------------------------------------------------

TEST(Stitching, StatsTraceAndSnapshot) {
  Fixture f(1024, ",record_history:True" + std::string(kNoReuse));
  f.fill_device();
  f.free_every_other();
  const auto allocs = f.stat("num_device_alloc");
  const auto frees = f.stat("num_device_free");
  const std::size_t before = f.alloc->snapshot().device_traces[0].size();
  const std::size_t want = 64 * kMiB;
  void* big = f.take(want);
  EXPECT_EQ(f.stat("num_stitches"), 1);
  EXPECT_EQ(f.stat("stitched_bytes"), static_cast<std::int64_t>(want));
  EXPECT_EQ(f.stat("num_device_alloc"), allocs + 1) << "one map of the stitched range";
  EXPECT_GT(f.stat("num_device_free"), frees) << "one unmap per source run";
  const stitch::Snapshot snap = f.alloc->snapshot();
  std::size_t unmapped = 0, mapped = 0;
  const auto& trace = snap.device_traces[0];
  for (std::size_t i = before; i < trace.size(); ++i) {
    if (trace[i].action == stitch::TraceAction::segment_unmap) unmapped += trace[i].size;
    if (trace[i].action == stitch::TraceAction::segment_map) {
      mapped += trace[i].size;
      EXPECT_EQ(trace[i].addr, reinterpret_cast<std::uintptr_t>(big));
    }
  }
  EXPECT_EQ(unmapped, want);
  EXPECT_EQ(mapped, want);
  // The stitched range is a segment of its own in the snapshot.
  bool found = false;
  for (const stitch::SegmentSnapshot& s : snap.segments) {
    if (s.address != reinterpret_cast<std::uintptr_t>(big)) continue;
    found = true;
    EXPECT_TRUE(s.is_expandable);
    EXPECT_EQ(s.total_size, want);
    EXPECT_EQ(s.segment_type, "large");
    ASSERT_EQ(s.blocks.size(), 1u);
    EXPECT_EQ(s.blocks[0].state, "active_allocated");
  }
  EXPECT_TRUE(found);
  const stitch::DeviceStats st = f.alloc->stats(0);
  EXPECT_EQ(st.num_stitches, 1);
  f.alloc->reset_accumulated_stats(0);
  EXPECT_EQ(f.stat("num_stitches"), 0);
  EXPECT_EQ(f.stat("stitched_bytes"), 0);
  f.expect_nothing_leaked();
}

TEST(Stitching, OffMeansNoStitching) {
  stitch::SimBackend::Options o;
  o.capacity = 1024 * kMiB;
  auto sim = std::make_shared<stitch::SimBackend>(o);
  stitch::Allocator a(stitch::Config::parse("backend:sim,expandable_segments:True"), sim);
  std::vector<void*> blocks;
  for (std::size_t i = 0;; ++i) {
    try {
      blocks.push_back(a.allocate((3 + (i * 5) % 7) * kMiB + 512));
    } catch (const stitch::out_of_memory&) {
      break;
    }
  }
  for (std::size_t i = 1; i < blocks.size(); i += 2) a.deallocate(blocks[i]);
  // Without stitching the last resort unmaps the free 20 MiB pages and maps them again: it works
  // when whole 20 MiB pages are free, but moves nothing and counts no stitch.
  try {
    void* p = a.allocate(100 * kMiB);
    a.deallocate(p);
  } catch (const stitch::out_of_memory&) {
  }
  EXPECT_EQ(*a.stat(0, "num_stitches"), 0);
  a.validate();
  for (std::size_t i = 0; i < blocks.size(); i += 2) a.deallocate(blocks[i]);
}

// ---- fault injection ----------------------------------------------------------------------------

/// Takes `want` bytes with the faults `inject` sets up armed, then clears them; whether the
/// request was served. Adds the faults that fired to `fired`.
template <typename Inject>
bool take_under_faults(Fixture& f, std::size_t want, Inject&& inject, std::uint64_t& fired) {
  const std::uint64_t before = f.sim->faults_fired();
  inject();
  bool served = false;
  try {
    f.take(want);
    served = true;
  } catch (const stitch::backend_error&) {
  } catch (const stitch::out_of_memory&) {
  }
  fired += f.sim->faults_fired() - before;
  f.sim->clear_faults();
  f.alloc->validate();
  f.expect_intact();
  return served;
}

TEST(Stitching, FaultsDuringStitchingLeaveAConsistentState) {
  // A fault at the nth call of a kind, optionally with a second fault that hits the undo.
  struct Fault {
    SimCall call;
    stitch::SimFault fault;
  };
  struct Case {
    Fault first;
    std::optional<Fault> second;  ///< fires at the first call of its kind
    bool lossy;                   ///< the undo itself fails: pages may be given back
  };
  using F = stitch::SimFault;
  const Case cases[] = {
      {{SimCall::reserve, F::error}, {}, false},
      {{SimCall::reserve, F::out_of_memory}, {}, false},
      {{SimCall::synchronize_stream, F::error}, {}, false},
      {{SimCall::unmap, F::error}, {}, false},
      {{SimCall::map, F::error}, {}, false},
      {{SimCall::create_physical, F::error}, {}, false},
      {{SimCall::create_physical, F::out_of_memory}, {}, false},
      {{SimCall::map, F::error}, Fault{SimCall::release_physical, F::error}, false},
      {{SimCall::unmap, F::error}, Fault{SimCall::map, F::error}, true},
      {{SimCall::map, F::error}, Fault{SimCall::release_reservation, F::error}, false},
  };
  std::uint64_t fired = 0;
  for (const Case& c : cases) {
    for (bool with_fresh : {false, true}) {
      for (std::uint64_t nth : {1, 2, 3, 5, 8, 20, 40}) {
        SCOPED_TRACE(std::string(to_string(c.first.call)) + " fault " + std::to_string(nth) +
                     (c.second ? std::string(" then ") + to_string(c.second->call) : "") +
                     (with_fresh ? " (with fresh pages)" : ""));
        Fixture f(512, kNoReuse);
        f.fill_device();
        f.free_every_other();
        // A memory fraction just above what is reserved: growing is refused without a backend
        // call, and stitching may add four fresh pages.
        const auto reserved = f.stat("reserved_bytes.all.current");
        const auto ooms = f.stat("num_ooms");
        f.sim->set_capacity(0, 1024 * kMiB);
        f.alloc->set_memory_fraction(
            static_cast<double>(reserved + 4 * kG) / static_cast<double>(1024 * kMiB), 0);
        const std::size_t want = with_fresh ? free_granule_bytes(*f.alloc) + 3 * kG : 60 * kMiB;
        const bool served = take_under_faults(f, want, [&] {
          f.sim->inject_fault(c.first.call, nth, c.first.fault);
          if (c.second) f.sim->inject_fault(c.second->call, 1, c.second->fault);
        }, fired);
        if (served) {
          EXPECT_TRUE(intact(f.live.back().p, want, f.live.back().seed));
        } else if (f.stat("num_ooms") == ooms) {
          // Failed while moving: every page went back where it was (or, when mapping it back
          // failed too, to the device).
          if (c.lossy) {
            EXPECT_LE(f.stat("reserved_bytes.all.current"), reserved);
          } else {
            EXPECT_EQ(f.stat("reserved_bytes.all.current"), reserved);
          }
          EXPECT_EQ(f.stat("num_stitches"), 0);
          // It still works afterwards.
          f.take(want);
          f.alloc->validate();
          f.expect_intact();
        }
        f.expect_nothing_leaked();
      }
    }
  }
  EXPECT_GT(fired, 100u) << "the faults must hit";
}

// ---- reusing free pages when a range grows (stitch_reuse_pages) -------------------------------

TEST(StitchingConfig, ReusePages) {
  EXPECT_TRUE(stitch::Config{}.stitch_reuse_pages);
  const stitch::Config off =
      stitch::Config::parse("expandable_segments:True,stitching:True,stitch_reuse_pages:False");
  EXPECT_FALSE(off.stitch_reuse_pages);
  EXPECT_FALSE(stitch::Config::parse(off.to_string()).stitch_reuse_pages);
  EXPECT_NE(off.to_string().find("stitch_reuse_pages:False"), std::string::npos);
  EXPECT_EQ(stitch::Config{}.to_string().find("stitch_reuse_pages"), std::string::npos)
      << "listed only with stitching";
  EXPECT_THROW((void)stitch::Config::parse("stitch_reuse_pages:maybe"), stitch::config_error);
}

/// 25 blocks of 6 MiB (3 pages each) on `stream`, every other one freed: twelve 3-page holes
/// between live blocks, none of which holds a 10 MiB request; the last block stays live.
void six_mib_holes(Fixture& f, stitch::stream_t stream) {
  for (int i = 0; i < 25; ++i) f.take(6 * kMiB, stream);
  f.free_every_other();
}

TEST(Stitching, GrowingReusesTheStreamsFreePagesFirst) {
  Fixture f(2048);
  six_mib_holes(f, nullptr);
  ASSERT_LT(largest_free_block(*f.alloc), 10 * kMiB);
  const auto reserved = f.stat("reserved_bytes.all.current");
  const auto maps = f.sim->call_count(SimCall::map);
  const auto unmaps = f.sim->call_count(SimCall::unmap);
  const auto creates = f.sim->call_count(SimCall::create_physical);
  const auto syncs = f.sim->call_count(SimCall::synchronize_stream);
  // The device has plenty of room, yet the five pages come from the holes.
  void* p = f.take(10 * kMiB);
  f.alloc->validate();
  f.expect_intact();
  EXPECT_EQ(f.stat("reserved_bytes.all.current"), reserved) << "pages moved, none added";
  EXPECT_EQ(f.stat("num_page_reuses"), 1);
  EXPECT_EQ(f.stat("num_stitches"), 0) << "no new range: the stream's own range grew";
  EXPECT_EQ(f.sim->call_count(SimCall::create_physical), creates);
  EXPECT_EQ(f.sim->call_count(SimCall::map), maps + 5) << "one map per page";
  EXPECT_EQ(f.sim->call_count(SimCall::unmap), unmaps + 2) << "a 3-page hole and 2 of another";
  EXPECT_EQ(f.sim->call_count(SimCall::synchronize_stream), syncs + 1) << "its own stream";
  // The block is usable in full and its neighbours kept their data.
  fill(p, 10 * kMiB, 4242);
  f.live.back().seed = 4242;
  f.expect_intact();
  // More than the free pages: they all move, fresh pages make up the rest.
  const auto free_pages = static_cast<std::int64_t>(free_granule_bytes(*f.alloc));
  f.take(free_pages + 6 * kG);
  EXPECT_EQ(f.stat("reserved_bytes.all.current"), reserved + static_cast<std::int64_t>(6 * kG));
  EXPECT_EQ(f.stat("num_page_reuses"), 2);
  EXPECT_EQ(free_granule_bytes(*f.alloc), 0u);
  f.alloc->validate();
  f.expect_intact();
  f.expect_nothing_leaked();
}

TEST(Stitching, WithoutReuseTheRangeGrows) {
  Fixture f(2048, ",stitch_reuse_pages:False");
  six_mib_holes(f, nullptr);
  const auto reserved = f.stat("reserved_bytes.all.current");
  const auto syncs = f.sim->call_count(SimCall::synchronize_stream);
  f.take(10 * kMiB);
  EXPECT_EQ(f.stat("reserved_bytes.all.current"), reserved + static_cast<std::int64_t>(10 * kMiB));
  EXPECT_EQ(f.stat("num_page_reuses"), 0);
  EXPECT_EQ(f.sim->call_count(SimCall::synchronize_stream), syncs);
  f.expect_nothing_leaked();
}

TEST(Stitching, ReuseTakesNoOtherStreamsPages) {
  Fixture f(2048);
  six_mib_holes(f, S(7));
  const auto reserved = f.stat("reserved_bytes.all.current");
  const auto syncs = f.sim->call_count(SimCall::synchronize_stream);
  f.take(10 * kMiB);  // the default stream has no free page: fresh ones
  EXPECT_EQ(f.stat("reserved_bytes.all.current"), reserved + static_cast<std::int64_t>(10 * kMiB));
  EXPECT_EQ(f.stat("num_page_reuses"), 0);
  EXPECT_EQ(f.sim->call_count(SimCall::synchronize_stream), syncs) << "no stream waited for";
  f.alloc->validate();
  f.expect_nothing_leaked();
}

TEST(Stitching, FaultsWhileReusingPagesLeaveAConsistentState) {
  using F = stitch::SimFault;
  const std::pair<SimCall, F> faults[] = {
      {SimCall::synchronize_stream, F::error}, {SimCall::unmap, F::error},
      {SimCall::map, F::error},                {SimCall::create_physical, F::error},
      {SimCall::create_physical, F::out_of_memory}};
  std::uint64_t fired = 0;
  for (const auto& call_fault : faults) {
    const SimCall call = call_fault.first;  // (clang 14 cannot capture structured bindings)
    const F fault = call_fault.second;
    for (std::uint64_t nth : {1, 2, 4, 7}) {
      SCOPED_TRACE(std::string(to_string(call)) + " fault " + std::to_string(nth));
      Fixture f(2048);
      six_mib_holes(f, nullptr);
      const auto reserved = f.stat("reserved_bytes.all.current");
      // Five of the six fresh pages are needed: the free pages are too few on their own.
      const std::size_t want = free_granule_bytes(*f.alloc) + 5 * kG;
      const bool served =
          take_under_faults(f, want, [&] { f.sim->inject_fault(call, nth, fault); }, fired);
      if (!served) {
        EXPECT_EQ(f.stat("reserved_bytes.all.current"), reserved) << "every page back in place";
        f.take(want);  // and it still works
        f.alloc->validate();
      }
      f.expect_nothing_leaked();
    }
  }
  EXPECT_GT(fired, 10u) << "the faults must hit";
}

// ---- the guarantee, on random use ------------------------------------------------------------

class StitchingRandom : public ::testing::TestWithParam<const char*> {};

TEST_P(StitchingRandom, FailsOnlyWhenTheFreePagesAreTooFew) {
  Fixture f(512, GetParam());
  const bool coarse = std::string(GetParam()).find("stitch_fine_above") != std::string::npos;
  std::mt19937_64 rng(20240611);
  const stitch::stream_t streams[] = {nullptr, S(1), S(2)};
  std::size_t ooms = 0, served_after_pressure = 0;
  for (int step = 0; step < 4000; ++step) {
    const bool grow = f.live.empty() || rng() % 100 < 55;
    if (grow) {
      const auto kind = rng() % 10;
      const std::size_t n = kind < 4   ? 1 + rng() % kMiB                 // small pool
                            : kind < 9 ? kMiB + rng() % (24 * kMiB)       // medium
                                       : 16 * kMiB + rng() % (96 * kMiB);  // large
      const stitch::stream_t s = streams[rng() % 3];
      const auto stitches = f.stat("num_stitches");
      try {
        f.take(n, s);
        if (f.stat("num_stitches") > stitches) ++served_after_pressure;
      } catch (const stitch::out_of_memory&) {
        ++ooms;
        // The OOM ladder has unmapped every free page since; pages holding no live block plus
        // what the device can give are the same total as when the request failed.
        std::size_t available = free_granule_bytes(*f.alloc) + device_free(*f.sim) / kG * kG;
        if (coarse) available -= std::min(available, unborrowable_bound(*f.alloc));
        const std::size_t rounded = round_up(n, 512);
        ASSERT_GT(round_up(rounded, kG), available) << "step " << step << ": " << n << " bytes";
        ASSERT_GT(n + kG + 512, available) << "the guarantee, up to one granule of rounding";
      }
    } else {
      const std::size_t k = rng() % f.live.size();
      const Live l = f.live[k];
      ASSERT_TRUE(intact(l.p, l.n, l.seed)) << "step " << step;
      f.alloc->deallocate(l.p);
      f.live[k] = f.live.back();
      f.live.pop_back();
    }
    f.alloc->validate();
    if (step % 1000 == 999) f.alloc->empty_cache();
  }
  EXPECT_GT(ooms, 10u) << "the test must reach the device's limit";
  EXPECT_GT(served_after_pressure, 10u) << "and stitch under pressure";
  if (coarse) EXPECT_GT(f.stat("num_page_borrows"), 0) << "coarse pages: stitches borrow the free starts of pages";
  f.expect_intact();
  f.expect_nothing_leaked();
}

std::string random_case_name(std::size_t index) {
  static const char* const names[] = {"reusing_pages", "before_grow", "under_pressure_only",
                                      "coarse_pages_with_room", "coarse_pages_until_full"};
  return names[index];
}

INSTANTIATE_TEST_SUITE_P(Stitching, StitchingRandom,
                         ::testing::Values("", ",stitch_before_grow_mb:16", kNoReuse,
                                           ",stitch_fine_above:0.9", ",stitch_fine_above:1"),
                         [](const auto& info) { return random_case_name(info.index); });

}  // namespace
