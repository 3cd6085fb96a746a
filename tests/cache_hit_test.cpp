// The cache hit (core/cache_hit.hpp) must change nothing anyone can see. Two allocators, one with
// it on (the default) and one with it off (the device lock serves everything), get the same random
// operations, biased towards "free, then allocate the same size again": every allocation must
// succeed or fail in both, and at random checkpoints every statistic and the whole block layout
// must be equal (but num_cache_hits, which counts the difference). The configs cover the small and
// large pools, max_split_size and rounding, expandable segments, stitching, compaction, a memory
// fraction with garbage collection, out of memory, and blocks that wait for events on other
// streams. CacheHitThreads runs four threads at once, each on its own stream, against the same
// scripts one after another.
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "core/device_allocator.hpp"
#include "stitch/allocator.hpp"
#include "stitch/config.hpp"
#include "stitch/errors.hpp"
#include "stitch/sim_backend.hpp"
#include "support/fixed_address_backend.hpp"

namespace stitch {
namespace {

using test::FixedSide;
using test::layout;

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

stream_t S(int n) { return reinterpret_cast<stream_t>(static_cast<std::uintptr_t>(n) * 0x10); }

/// Every statistic but num_cache_hits, which differs by design (and, for threads at once, with
/// the interleaving: a crowded live table sends requests to the device lock until it is rebuilt).
std::string stats_text(const Allocator& a, bool peaks = true) {
  std::string out = test::stats_text(a, peaks);
  const auto at = out.find("num_cache_hits=");
  if (at != std::string::npos) out.erase(at, out.find('\n', at) - at + 1);
  return out;
}

struct Live {
  void* on;
  void* off;
  std::size_t bytes;
  stream_t stream;
};

using Params = std::tuple<const char*, std::size_t /*capacity MiB*/>;

class CacheHit : public ::testing::TestWithParam<Params> {};

TEST_P(CacheHit, ChangesNothingObservable) {
  const std::string conf = std::string("backend:sim,") + std::get<0>(GetParam());
  const std::size_t capacity = std::get<1>(GetParam()) * MiB;
  FixedSide on(conf, capacity);
  FixedSide off(conf, capacity);
  off.alloc->device(0).set_cache_hit(false);

  std::mt19937_64 rng(20261201);
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
  auto random_size = [&]() -> std::size_t {
    switch (pick(10)) {
      case 0: return 1 + pick(511);                     // below the minimum block
      case 1: return (2 + pick(30)) * MiB + pick(MiB);  // large pool
      case 2: return (1 + pick(1000)) * KiB;            // up to the small pool's limit
      default: return 512 * (1 + pick(64));             // small, block-sized
    }
  };

  std::vector<Live> live;
  std::vector<stream_t> held;
  int ooms = 0;
  auto alloc_both = [&](std::size_t bytes, stream_t stream) {
    void* a = on.allocate(bytes, stream);
    void* b = off.allocate(bytes, stream);
    ASSERT_EQ(a == nullptr, b == nullptr) << "one allocator ran out of memory, the other did not";
    if (a == nullptr) {
      ++ooms;
      return;
    }
    live.push_back({a, b, bytes, stream});
  };
  auto free_at = [&](std::size_t i) {
    const Live l = live[i];
    live[i] = live.back();
    live.pop_back();
    switch (pick(3)) {  // the three ways to free
      case 0:
        on.alloc->deallocate(l.on);
        off.alloc->deallocate(l.off);
        break;
      case 1:
        on.alloc->deallocate(l.on, l.stream);
        off.alloc->deallocate(l.off, l.stream);
        break;
      default:
        on.alloc->deallocate(l.on, l.bytes, 0, l.stream);
        off.alloc->deallocate(l.off, l.bytes, 0, l.stream);
    }
  };
  auto compare = [&](const char* where, int op) {
    ASSERT_EQ(stats_text(*on.alloc), stats_text(*off.alloc)) << where << ", op " << op;
    ASSERT_EQ(layout(*on.alloc), layout(*off.alloc)) << where << ", op " << op;
  };

  constexpr int kOps = 30000;
  int next_check = 1 + static_cast<int>(pick(80));
  for (int op = 0; op < kOps; ++op) {
    const std::size_t r = pick(100);
    const stream_t stream = S(1 + static_cast<int>(pick(3)));
    if (r < 35 || live.empty()) {
      alloc_both(random_size(), stream);
    } else if (r < 75) {
      // Free the newest block and, usually, ask for about the same again on its stream.
      const Live last = live.back();
      free_at(live.size() - 1);
      const std::size_t q = pick(10);
      if (q < 7) {
        std::size_t bytes = last.bytes;
        if (q == 6 && bytes > 512) bytes -= 1 + pick(511);  // same rounding, another request
        alloc_both(bytes, q == 5 ? S(1 + static_cast<int>(pick(3))) : last.stream);
      }
    } else if (r < 93) {
      free_at(pick(live.size()));
    } else if (r < 96) {
      // A block used on another stream, whose work is held: its free waits for an event.
      Live& l = live[pick(live.size())];
      const stream_t other = S(1 + static_cast<int>(pick(3)));
      if (other != l.stream) {
        on.sim->hold_stream(other);
        off.sim->hold_stream(other);
        held.push_back(other);
        on.alloc->record_stream(l.on, other);
        off.alloc->record_stream(l.off, other);
      }
    } else if (r < 98) {
      for (stream_t s : held) {
        on.sim->release_stream(s);
        off.sim->release_stream(s);
      }
      held.clear();
    } else if (r < 99) {
      on.alloc->empty_cache(0);
      off.alloc->empty_cache(0);
    } else {
      on.alloc->reset_peak_stats(0);
      off.alloc->reset_peak_stats(0);
    }
    if (::testing::Test::HasFatalFailure()) return;
    if (op == next_check) {
      compare("checkpoint", op);
      if (::testing::Test::HasFatalFailure()) return;
      next_check = op + 1 + static_cast<int>(pick(80));
    }
  }
  while (!live.empty()) free_at(live.size() - 1);
  for (stream_t s : held) {
    on.sim->release_stream(s);
    off.sim->release_stream(s);
  }
  compare("end", kOps);
  on.alloc->validate();
  off.alloc->validate();

  // The comparison means something only if the cache hit served most requests.
  const std::int64_t hits = on.alloc->stats(0).num_cache_hits;
  EXPECT_EQ(off.alloc->stats(0).num_cache_hits, 0);
  EXPECT_GT(hits, kOps / 4) << "hits: " << hits;
  std::printf("[ hits     ] %s: %lld cache hits, %d out-of-memory results\n", conf.c_str(),
              static_cast<long long>(hits), ooms);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, CacheHit,
    ::testing::Values(Params{"max_split_size_mb:20000", 4096},
                      Params{"max_split_size_mb:24,roundup_power2_divisions:4", 4096},
                      Params{"expandable_segments:True", 4096},
                      Params{"expandable_segments:True,stitching:True", 160},
                      Params{"expandable_segments:True,stitching:True,stitch_compact:True", 160},
                      Params{"garbage_collection_threshold:0.6,per_process_memory_fraction:0.8", 192},
                      Params{"roundup_power2_divisions:2", 48}));

// The pair a training loop repeats, and a mix of sizes in turn, land where best fit puts them,
// in the small and the large pool, served by the cache hit.
TEST(CacheHitUnit, PairsAndMixesComeBackWhereBestFitPutsThem) {
  FixedSide side("backend:sim", 4096 * MiB);
  Allocator& a = *side.alloc;
  void* keep = a.allocate(4096);
  void* p = a.allocate(4096);
  a.deallocate(p);
  const std::int64_t hits = a.stats(0).num_cache_hits;
  EXPECT_EQ(a.allocate(4000), p);  // same rounding: the same block
  a.deallocate(p);
  void* q = a.allocate(2048);  // another size: best fit splits the same free block
  EXPECT_EQ(q, p);
  a.deallocate(q);
  EXPECT_EQ(a.stats(0).num_cache_hits, hits + 2);
  void* other_stream = a.allocate(4096, S(1));  // another stream: never the freed block
  EXPECT_NE(other_stream, p);
  a.deallocate(other_stream, S(1));
  const std::size_t sizes[4] = {4096, 64 * KiB, MiB, 8 * MiB};
  void* first[4] = {};
  for (int i = 0; i < 400; ++i) {
    void* b = a.allocate(sizes[i % 4]);
    if (i < 4) first[i] = b;
    EXPECT_EQ(b, first[i % 4]) << "pair " << i;
    a.deallocate(b);
  }
  // A 4 KiB hole before the small pool's free rest: best fit takes it.
  void* h1 = a.allocate(4096);
  void* hole = a.allocate(4096);
  void* h2 = a.allocate(4096);
  a.deallocate(hole);
  void* w = a.allocate(64 * KiB);
  a.deallocate(w);
  EXPECT_EQ(a.allocate(4096), hole);
  for (void* b : {h1, hole, h2, keep}) a.deallocate(b);
  EXPECT_GT(a.stats(0).num_cache_hits, hits + 390);
  a.validate();
  a.empty_cache(0);
  EXPECT_EQ(a.stats(0).reserved_bytes[kAll].current, 0);
}

// A held block's pairs (core/pair_verdict.hpp) count nothing a full cache hit would not: pairs in
// both pools of one stream, of sizes that pass and fall back under every peak (new peaks of
// allocated, requested and inactive-split bytes, in one pool, in the other and in both), with
// blocks that stay live in between, a record_stream on a taken block, a new stream's shard made
// while a pair is taken, and resets of the peaks. Compared with the device lock alone after every
// operation: every statistic, peaks included, and the layout.
TEST(CacheHitUnit, PairsCountExactlyWhatTheDeviceLockCounts) {
  for (const char* conf : {"backend:sim", "backend:sim,expandable_segments:True"}) {
    FixedSide on(conf, 8192 * MiB);
    FixedSide off(conf, 8192 * MiB);
    off.alloc->device(0).set_cache_hit(false);
    std::mt19937_64 rng(20261206);
    auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
    std::vector<std::pair<void*, void*>> keep;  // (on, off) blocks live for a while
    std::vector<std::size_t> keep_bytes;
    int op = 0;
    auto check = [&] {
      ASSERT_EQ(stats_text(*on.alloc), stats_text(*off.alloc)) << conf << ", op " << op;
      ASSERT_EQ(layout(*on.alloc), layout(*off.alloc)) << conf << ", op " << op;
    };
    auto pair = [&](std::size_t bytes, stream_t s) {
      void* a = on.alloc->allocate(bytes, s);
      void* b = off.alloc->allocate(bytes, s);
      ++op;
      check();
      if (::testing::Test::HasFatalFailure()) return;
      on.alloc->deallocate(a, bytes, 0, s);
      off.alloc->deallocate(b, bytes, 0, s);
      ++op;
      check();
    };
    for (int round = 0; round < 400 && !::testing::Test::HasFatalFailure(); ++round) {
      // A small and a large size, drifting so that some pairs make new peaks.
      const std::size_t small = 512 * (1 + pick(64 + static_cast<std::size_t>(round)));
      const std::size_t large = (2 + pick(6 + static_cast<std::size_t>(round / 20))) * MiB + pick(MiB);
      for (int i = 0; i < 6 && !::testing::Test::HasFatalFailure(); ++i) {
        pair(i % 2 == 0 ? small : large, nullptr);
        if (pick(4) == 0) pair(small - 1 - pick(200), nullptr);  // the same rounding, fewer bytes
      }
      switch (pick(8)) {
        case 0: {  // a block that stays live (a pair taken and kept)
          const std::size_t bytes = pick(2) == 0 ? small : large;
          keep.emplace_back(on.alloc->allocate(bytes), off.alloc->allocate(bytes));
          keep_bytes.push_back(bytes);
          break;
        }
        case 1:
          if (!keep.empty()) {
            const std::size_t i = pick(keep.size());
            on.alloc->deallocate(keep[i].first);
            off.alloc->deallocate(keep[i].second);
            keep.erase(keep.begin() + static_cast<std::ptrdiff_t>(i));
            keep_bytes.erase(keep_bytes.begin() + static_cast<std::ptrdiff_t>(i));
          }
          break;
        case 2: {  // a taken block used on another stream: its free waits for an event
          void* a = on.alloc->allocate(small);
          void* b = off.alloc->allocate(small);
          on.alloc->record_stream(a, S(7));
          off.alloc->record_stream(b, S(7));
          on.alloc->deallocate(a);
          off.alloc->deallocate(b);
          break;
        }
        case 3: {  // a new stream's shard made while a pair is taken
          void* a = on.alloc->allocate(small);
          void* b = off.alloc->allocate(small);
          pair(small, S(100 + round));
          on.alloc->deallocate(a);
          off.alloc->deallocate(b);
          break;
        }
        case 4:
          on.alloc->reset_peak_stats(0);
          off.alloc->reset_peak_stats(0);
          break;
        default:
          break;
      }
      ++op;
      check();
    }
    for (std::size_t i = 0; i < keep.size(); ++i) {
      on.alloc->deallocate(keep[i].first);
      off.alloc->deallocate(keep[i].second);
    }
    check();
    on.alloc->validate();
    EXPECT_GT(on.alloc->stats(0).num_cache_hits, 3000) << conf;
  }
}

// A pair's verdict assumes the other pool of its stream counts no more than when it was decided:
// a block that stays live there makes the next pair's total a new peak, which it must count.
/// Two allocators, the cache hit on and off, given the same calls (`both`).
struct OnOff {
  FixedSide on{"backend:sim", 4096 * MiB};
  FixedSide off{"backend:sim", 4096 * MiB};
  OnOff() { off.alloc->device(0).set_cache_hit(false); }
  template <typename Fn>
  void both(Fn&& fn) {
    fn(*on.alloc);
    fn(*off.alloc);
  }
};

TEST(CacheHitUnit, APlainChangeInTheOtherPoolVoidsAPairsVerdict) {
  OnOff s;
  FixedSide& on = s.on;
  FixedSide& off = s.off;
  auto both = [&](auto&& fn) { s.both(fn); };
  both([](Allocator& a) {  // the large pool's memory, cached
    void* x = a.allocate(8 * MiB);
    void* y = a.allocate(8 * MiB);
    a.deallocate(x);
    a.deallocate(y);
  });
  const std::int64_t hits = on.alloc->stats(0).num_cache_hits;  // (a read takes the device lock)
  for (int i = 0; i < 4; ++i) both([](Allocator& a) { a.deallocate(a.allocate(4096)); });
  // Two large blocks stay live (the second by the hit's plain path, which must void the small
  // pool's verdict: it assumed the large pool held nothing).
  std::vector<void*> big[2];
  both([&](Allocator& a) {
    auto& v = big[&a == on.alloc.get() ? 0 : 1];
    v.push_back(a.allocate(8 * MiB));
    v.push_back(a.allocate(8 * MiB));
  });
  both([](Allocator& a) { a.deallocate(a.allocate(4096)); });  // 16 MiB + 4 KiB: a new peak
  EXPECT_EQ(on.alloc->stats(0).num_cache_hits, hits + 6);  // all but the first (a new segment)
  EXPECT_EQ(on.alloc->stats(0).allocated_bytes[kAll].peak, static_cast<std::int64_t>(16 * MiB + 4096));
  EXPECT_EQ(stats_text(*on.alloc), stats_text(*off.alloc));
  for (int k = 0; k < 2; ++k) {
    Allocator& a = k == 0 ? *on.alloc : *off.alloc;
    for (void* p : big[k]) a.deallocate(p);
  }
  EXPECT_EQ(stats_text(*on.alloc), stats_text(*off.alloc));
  on.alloc->validate();
}

// While a pair's block is taken, the other pool's pairs wait: their verdicts assumed this pool at
// its held state, and the taken block and the other pair's together make a new peak.
TEST(CacheHitUnit, APairTakenKeepsTheOtherPoolsPairsWaiting) {
  OnOff s;
  FixedSide& on = s.on;
  FixedSide& off = s.off;
  auto both = [&](auto&& fn) { s.both(fn); };
  for (int i = 0; i < 4; ++i) {
    both([](Allocator& a) { a.deallocate(a.allocate(4096)); });
    both([](Allocator& a) { a.deallocate(a.allocate(8 * MiB)); });
  }
  void* kept[2] = {};
  both([&](Allocator& a) { kept[&a == on.alloc.get() ? 0 : 1] = a.allocate(4096); });  // taken
  both([](Allocator& a) { a.deallocate(a.allocate(8 * MiB)); });  // 8 MiB + 4 KiB: a new peak
  EXPECT_EQ(on.alloc->stats(0).allocated_bytes[kAll].peak, static_cast<std::int64_t>(8 * MiB + 4096));
  EXPECT_EQ(stats_text(*on.alloc), stats_text(*off.alloc));
  on.alloc->deallocate(kept[0]);
  off.alloc->deallocate(kept[1]);
  EXPECT_EQ(stats_text(*on.alloc), stats_text(*off.alloc));
  EXPECT_EQ(on.alloc->stats(0).num_cache_hits, 8);  // all but the two new segments
}

// What leaves the cache hit for the device lock does so with nothing changed: a request on a new
// stream, an oversize one, one inside a region, a free of a block used on another stream, a
// free on another stream, and everything while the history is recorded.
TEST(CacheHitUnit, WhatTheDeviceLockMustDoGoesThere) {
  FixedSide side("backend:sim,max_split_size_mb:64", 4096 * MiB);
  Allocator& a = *side.alloc;
  void* p = a.allocate(4096, S(1));  // a new stream: the device lock makes its shard
  EXPECT_EQ(a.stats(0).num_cache_hits, 0);
  a.deallocate(p);
  void* q = a.allocate(4096, S(1));
  EXPECT_EQ(q, p);
  EXPECT_EQ(a.stats(0).num_cache_hits, 1);
  a.record_stream(q, S(2));
  a.deallocate(q);  // events: the device lock records them
  a.validate();
  void* big = a.allocate(100 * MiB, S(1));  // oversize: counted by the device lock
  a.deallocate(big);
  void* big2 = a.allocate(100 * MiB, S(1));
  EXPECT_EQ(big2, big);
  EXPECT_EQ(a.stats(0).oversize_allocations.current, 1);
  a.deallocate(big2);
  const std::int64_t before = a.stats(0).num_cache_hits;
  a.configure("record_history:True");
  a.deallocate(a.allocate(4096, S(1)));
  EXPECT_EQ(a.stats(0).num_cache_hits, before) << "recording: every request takes the device lock";
  a.configure("record_history:False");
  a.deallocate(a.allocate(4096, S(1)));
  EXPECT_EQ(a.stats(0).num_cache_hits, before + 1);
  a.validate();
}

// garbage_collection_threshold releases the free whole segments that sat unused longer than the
// average, by the large pools' clock, which counts best-fit lookups. Every lookup the cache hit
// makes must tick it as the device lock's does. Here one segment is freed before three lookups
// that only the hit makes (best fit in the index, pairs, or a held block taken back), and one
// after them: the collector must release the older one. (Were those lookups not counted, both
// would look as old, and the collector would release the first in address order: the younger.)
TEST(CacheHitUnit, ItsLookupsAgeFreeSegmentsForTheCollectorAsTheDeviceLocksDo) {
  for (const char* how : {"best fit in the index", "pairs", "taken back"}) {
    SCOPED_TRACE(how);
    const std::string way = how;
    const char* conf =
        "backend:sim,garbage_collection_threshold:0.5,per_process_memory_fraction:0.5";
    FixedSide on(conf, 200 * MiB);
    FixedSide off(conf, 200 * MiB);
    off.alloc->device(0).set_cache_hit(false);
    const stream_t s = S(1);
    struct Both {
      void* on;
      void* off;
    };
    auto allocate = [&](std::size_t bytes) {
      return Both{on.alloc->allocate(bytes, s), off.alloc->allocate(bytes, s)};
    };
    auto free = [&](Both b, std::size_t bytes) {
      on.alloc->deallocate(b.on, bytes, 0, s);
      off.alloc->deallocate(b.off, bytes, 0, s);
    };
    const Both younger = allocate(20 * MiB);  // (the lower address)
    const Both older = allocate(20 * MiB);
    const Both work = allocate(12 * MiB);  // 52 MiB reserved: past the threshold's 50
    free(work, 12 * MiB);
    std::vector<Both> pieces{allocate(2 * MiB)};  // the front of `work`, taken back
    // Taken back: `work` full, so that its last piece, freed, has no free neighbour.
    while (way == "taken back" && pieces.size() < 6) pieces.push_back(allocate(2 * MiB));
    free(older, 20 * MiB);
    for (int i = 0; i < 3; ++i) {
      if (way == "best fit in the index") {  // the rest of `work`
        pieces.push_back(allocate(2 * MiB));
      } else {  // a free and the same request again
        free(pieces.back(), 2 * MiB);
        pieces.back() = allocate(2 * MiB);
      }
    }
    free(younger, 20 * MiB);
    const std::int64_t hits = on.alloc->stats(0).num_cache_hits;
    EXPECT_GE(hits, 4) << "the hit made the lookups";
    const Both big = allocate(30 * MiB);  // a new segment: the collector runs first
    ASSERT_NE(big.on, nullptr);
    ASSERT_NE(big.off, nullptr);
    EXPECT_EQ(on.alloc->stats(0).num_cache_hits, hits) << "the device lock grew the device";
    EXPECT_EQ(stats_text(*on.alloc), stats_text(*off.alloc));
    EXPECT_EQ(layout(*on.alloc), layout(*off.alloc));
    bool has_younger = false;
    bool has_older = false;
    for (const SegmentSnapshot& seg : on.alloc->snapshot().segments) {
      has_younger |= seg.address == reinterpret_cast<std::uintptr_t>(younger.on);
      has_older |= seg.address == reinterpret_cast<std::uintptr_t>(older.on);
    }
    EXPECT_TRUE(has_younger) << "the younger free segment stays";
    EXPECT_FALSE(has_older) << "the older free segment is released";
    for (const Both& p : pieces) free(p, 2 * MiB);
    free(big, 30 * MiB);
    on.alloc->validate();
    off.alloc->validate();
  }
}

// Many live blocks crowd the live table, which the device lock rebuilds; the blocks stay found.
TEST(CacheHitUnit, ACrowdedLiveTableIsRebuiltAndLosesNothing) {
  FixedSide side("backend:sim", 65536 * MiB);
  Allocator& a = *side.alloc;
  std::vector<void*> blocks;
  std::mt19937_64 rng(5);
  for (int round = 0; round < 4; ++round) {
    for (int i = 0; i < 20000; ++i) blocks.push_back(a.allocate(512 * (1 + rng() % 8), S(1 + round % 2)));
    for (std::size_t i = 0; i < blocks.size(); i += 2) a.deallocate(blocks[i]);
    std::vector<void*> rest;
    for (std::size_t i = 1; i < blocks.size(); i += 2) rest.push_back(blocks[i]);
    blocks.swap(rest);
    a.validate();
  }
  for (void* b : blocks) EXPECT_TRUE(a.find(b).has_value());
  for (void* b : blocks) a.deallocate(b);
  EXPECT_EQ(a.stats(0).allocation[kAll].current, 0);
  a.validate();
}

// ---- several threads at once ----------------------------------------------------------------

/// Per stream, its segments in creation order, each as its blocks' offsets, sizes and states:
/// what one stream's own operations decide, whatever the other streams did meanwhile.
std::map<std::uintptr_t, std::vector<std::string>> layout_by_stream(const Allocator& a) {
  std::map<std::uintptr_t, std::vector<std::string>> out;
  for (const SegmentSnapshot& s : a.snapshot().segments) {
    std::string seg = std::to_string(s.total_size) + " " + s.segment_type +
                      (s.is_expandable ? " expandable" : "") + ":";
    for (const BlockSnapshot& b : s.blocks)
      seg += " " + std::to_string(b.address - s.address) + "+" + std::to_string(b.size) + "/" +
             std::to_string(b.requested_size) + "/" + b.state;
    out[s.stream].push_back(seg);
  }
  return out;
}

/// One thread's script: the operations of one phase, decided by its own generator.
struct ThreadScript {
  std::mt19937_64 rng;
  std::vector<std::pair<void*, std::size_t>> live;  ///< its blocks (pointer, bytes)
  std::vector<void*> inbox;                         ///< other threads' blocks to free
};

void run_phase(Allocator& a, ThreadScript& t, stream_t stream, int ops) {
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(t.rng() % n); };
  for (int i = 0; i < ops; ++i) {
    const std::size_t r = pick(100);
    if (r < 30 || t.live.empty()) {
      const std::size_t bytes = pick(4) == 0 ? (1 + pick(8)) * MiB + pick(MiB) : 512 * (1 + pick(64));
      t.live.emplace_back(a.allocate(bytes, stream), bytes);
    } else if (r < 85) {
      // The pair a training loop repeats: free the newest, the same size again.
      const auto [p, bytes] = t.live.back();
      a.deallocate(p, bytes, 0, stream);
      t.live.back().first = a.allocate(bytes, stream);
    } else {
      const std::size_t k = pick(t.live.size());
      a.deallocate(t.live[k].first, stream);
      t.live[k] = t.live.back();
      t.live.pop_back();
    }
  }
}

class CacheHitThreads : public ::testing::TestWithParam<const char*> {};

// Threads on their own streams never meet: run at once, each stream's layout and every current
// statistic are those of the same scripts run one after another.
TEST_P(CacheHitThreads, AtOnceOnOwnStreamsAsOneAfterAnother) {
  constexpr int kThreads = 4, kPhases = 12, kOps = 3000;
  const std::string conf = std::string("backend:sim,") + GetParam();
  FixedSide at_once(conf, 65536 * MiB);  // room enough: no stream's growth fails
  FixedSide in_turn(conf, 65536 * MiB);
  std::vector<ThreadScript> a_scripts, b_scripts;
  for (int t = 0; t < kThreads; ++t) {
    a_scripts.push_back({std::mt19937_64(1000 + t), {}, {}});
    b_scripts.push_back({std::mt19937_64(1000 + t), {}, {}});
  }
  for (int phase = 0; phase < kPhases; ++phase) {
    // Blocks handed over at the end of the last phase: each freed by its new thread, one thread
    // after another (a free among another thread's operations on its stream would make the
    // outcome depend on the timing).
    for (std::vector<ThreadScript>* side : {&a_scripts, &b_scripts}) {
      Allocator& a = side == &a_scripts ? *at_once.alloc : *in_turn.alloc;
      for (ThreadScript& t : *side) {
        std::thread([&] {
          for (void* p : t.inbox) a.deallocate(p);
        }).join();
        t.inbox.clear();
      }
    }
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] { run_phase(*at_once.alloc, a_scripts[t], S(t + 1), kOps); });
    for (auto& th : threads) th.join();
    for (int t = 0; t < kThreads; ++t) run_phase(*in_turn.alloc, b_scripts[t], S(t + 1), kOps);
    // Peaks are of sums over the streams, which depend on how the threads interleaved.
    ASSERT_EQ(stats_text(*at_once.alloc, false), stats_text(*in_turn.alloc, false))
        << "phase " << phase;
    ASSERT_EQ(layout_by_stream(*at_once.alloc), layout_by_stream(*in_turn.alloc)) << "phase " << phase;
    for (std::vector<ThreadScript>* side : {&a_scripts, &b_scripts}) {
      for (int t = 0; t < kThreads; ++t) {
        ThreadScript& from = (*side)[static_cast<std::size_t>(t)];
        ThreadScript& to = (*side)[static_cast<std::size_t>((t + 1) % kThreads)];
        for (int k = 0; k < 3 && !from.live.empty(); ++k) {
          to.inbox.push_back(from.live.back().first);
          from.live.pop_back();
        }
      }
    }
  }
  at_once.alloc->validate();
  in_turn.alloc->validate();
  const std::int64_t hits = at_once.alloc->stats(0).num_cache_hits;
  EXPECT_GT(hits, kThreads * kPhases * kOps / 4) << "the pairs must mostly be cache hits";
}

INSTANTIATE_TEST_SUITE_P(Configs, CacheHitThreads,
                         ::testing::Values("max_split_size_mb:20000", "max_split_size_mb:24",
                                           "expandable_segments:True",
                                           "expandable_segments:True,stitching:True"));

}  // namespace
}  // namespace stitch
