// Tests of the core's data structures on their own (src/core): FreeIndex and BlockTree (best fit,
// in-place re-keying, the red-black rules), AtomicMap (claims, tombstones, rebuilds, readers
// without a lock), ObjectPool (reuse without the heap), the fast path's statistics (HotStats over
// several stream shards against a naive model of the device-wide sums and peaks), PageTable, and
// the undo guard. The core's types have files of their own (block_store_test.cpp, ...).
#include <gtest/gtest.h>

#include <algorithm>

#include <map>
#include <memory>
#include <random>
#include <set>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/block.hpp"
#include "core/free_index.hpp"
#include "core/hot_stats.hpp"
#include "core/object_pool.hpp"
#include "core/page_table.hpp"
#include "core/atomic_map.hpp"
#include "core/stream_shards.hpp"
#include "core/undo.hpp"
#include "stitch/errors.hpp"
#include "stitch/sim_backend.hpp"

namespace stitch::detail {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

stream_t S(std::uintptr_t s) { return reinterpret_cast<stream_t>(s); }

// ---- FreeIndex ------------------------------------------------------------------------------

struct IndexFixture {
  explicit IndexFixture(bool one_stream = false) : index(one_stream) {}
  FreeIndex index;
  std::vector<std::unique_ptr<Block>> blocks;
  Block* make(std::uintptr_t addr, std::size_t size, std::uintptr_t stream = 0) {
    blocks.push_back(std::make_unique<Block>(reinterpret_cast<char*>(addr), size, S(stream), nullptr, nullptr, false,
                                                    BlockState::free));
    return blocks.back().get();
  }
};

TEST(FreeIndex, BestFitIsTheSmallestBlockOfTheStreamLowestAddressFirst) {
  IndexFixture f;
  Block* a = f.make(0x10000, 4 * MiB);
  Block* b = f.make(0x90000, 2 * MiB);
  Block* c = f.make(0x50000, 2 * MiB);
  Block* other = f.make(0x20000, 3 * MiB, 7);
  for (Block* x : {a, b, c, other}) f.index.insert(x);
  EXPECT_EQ(*f.index.best_fit(S(0), 2 * MiB), c);      // ties by address
  EXPECT_EQ(*f.index.best_fit(S(0), 3 * MiB), a);      // not the other stream's 3 MiB
  EXPECT_EQ(*f.index.best_fit(S(7), 1 * MiB), other);
  EXPECT_EQ(f.index.best_fit(S(0), 5 * MiB), f.index.end());
  EXPECT_EQ(f.index.best_fit(S(7), 4 * MiB), f.index.end());  // never another stream's block
  EXPECT_TRUE(f.index.contains(c));
  f.index.erase(c);
  EXPECT_FALSE(f.index.contains(c));
  EXPECT_EQ(*f.index.best_fit(S(0), 2 * MiB), b);
  EXPECT_EQ(f.index.size(), 3u);
}

TEST(FreeIndex, ShrinkAndGrowKeepTheOrderWhetherOrNotTheNodeMoves) {
  // Random re-keys against a std::set with the same order: the index must stay sorted and
  // every lookup must agree.
  IndexFixture f;
  std::mt19937_64 rng(5);
  std::vector<Block*> blocks;
  for (int i = 0; i < 200; ++i) {
    Block* b = f.make(0x100000 + static_cast<std::uintptr_t>(i) * 0x1000000, (1 + rng() % 64) * 512, rng() % 3);
    f.index.insert(b);
    blocks.push_back(b);
  }
  for (int step = 0; step < 5000; ++step) {
    Block* b = blocks[rng() % blocks.size()];
    const std::size_t delta = (1 + rng() % 8) * 512;
    if (rng() % 2 == 0 && b->size > delta) {
      f.index.shrink(b, b->ptr + delta, b->size - delta);  // a split takes the front
    } else {
      f.index.grow(b, b->ptr - delta, b->size + delta);     // a merge with the neighbour before
    }
  }
  std::set<Block*, FreeOrder> model(blocks.begin(), blocks.end());
  ASSERT_EQ(f.index.size(), model.size());
  auto it = f.index.begin();
  for (Block* b : model) {
    ASSERT_EQ(*it, b);
    ASSERT_TRUE(f.index.contains(b));
    ++it;
  }
  for (int q = 0; q < 500; ++q) {
    const auto stream = S(rng() % 3);
    const std::size_t size = (1 + rng() % 80) * 512;
    auto want = model.lower_bound(FreeKey{stream, size, nullptr});
    const Block* expect = want != model.end() && (*want)->stream == stream ? *want : nullptr;
    auto got = f.index.best_fit(stream, size);
    EXPECT_EQ(got == f.index.end() ? nullptr : *got, expect);
  }
}

/// The black height of the subtree at `b` (its links consistent, no red node under a red one,
/// every path as black), or -1 where something is broken.
int black_height(const Block* b, const Block* parent) {
  if (b == nullptr) return 1;
  if (b->tree.parent != parent) return -1;
  if (b->tree.red && parent != nullptr && parent->tree.red) return -1;
  const int left = black_height(b->tree.child[0], b);
  const int right = black_height(b->tree.child[1], b);
  if (left < 0 || left != right) return -1;
  return left + (b->tree.red ? 0 : 1);
}

TEST(FreeIndex, InsertsAndErasesInAnyOrderKeepTheOrderBothWays) {
  // Blocks filed and taken out at random (keys with many equal sizes and streams) against a
  // std::set with the same order: forward and backward walks, lower bounds and the size agree,
  // and the tree keeps the red-black rules (so its depth stays logarithmic).
  IndexFixture f;
  std::mt19937_64 rng(11);
  std::vector<Block*> all;
  for (int i = 0; i < 600; ++i)
    all.push_back(f.make(0x100000 + static_cast<std::uintptr_t>(rng() % 100000) * 512 + static_cast<std::uintptr_t>(i),
                         (1 + rng() % 16) * 512, rng() % 3));
  std::set<Block*, FreeOrder> model;
  for (int step = 0; step < 20000; ++step) {
    Block* b = all[rng() % all.size()];
    if (model.count(b) != 0) {
      f.index.erase(b);
      model.erase(b);
    } else {
      f.index.insert(b);
      model.insert(b);
    }
    ASSERT_EQ(f.index.size(), model.size());
    if (step % 97 != 0) continue;
    std::vector<Block*> forward(f.index.begin(), f.index.end());
    ASSERT_EQ(forward, std::vector<Block*>(model.begin(), model.end()));
    std::vector<Block*> backward;
    for (auto it = f.index.end(); it != f.index.begin();) backward.push_back(*--it);
    ASSERT_EQ(backward, std::vector<Block*>(model.rbegin(), model.rend()));
    for (Block* x : all) ASSERT_EQ(f.index.contains(x), model.count(x) != 0);
    if (model.empty()) continue;
    const Block* root = *model.begin();
    while (root->tree.parent != nullptr) root = root->tree.parent;
    ASSERT_FALSE(root->tree.red);
    ASSERT_GT(black_height(root, nullptr), 0) << "a red-black rule broken after step " << step;
  }
  for (int q = 0; q < 2000; ++q) {
    const FreeKey key{S(rng() % 3), (1 + rng() % 17) * 512, reinterpret_cast<const char*>(0x100000 + rng() % 50000000)};
    auto want = model.lower_bound(key);
    auto got = f.index.lower_bound(key);
    ASSERT_EQ(got == f.index.end() ? nullptr : *got, want == model.end() ? nullptr : *want);
  }
}

TEST(FreeIndex, AOneStreamIndexKeepsTheFullOrderWithoutComparingStreams) {
  // A stream shard's index (one stream): inserts, erases, re-keys, best fits and lower bounds at
  // random against a std::set in the full (stream, size, address) order.
  IndexFixture f(true);
  std::mt19937_64 rng(13);
  const std::uintptr_t stream = 0x40;
  std::vector<Block*> all;
  for (int i = 0; i < 400; ++i)
    all.push_back(f.make(0x100000 + static_cast<std::uintptr_t>(i) * 0x1000000, (1 + rng() % 24) * 512, stream));
  std::set<Block*, FreeOrder> model;
  for (int step = 0; step < 20000; ++step) {
    Block* b = all[rng() % all.size()];
    const std::size_t delta = (1 + rng() % 4) * 512;
    if (model.count(b) == 0) {
      f.index.insert(b);
      model.insert(b);
    } else if (rng() % 3 == 0) {
      f.index.erase(b);
      model.erase(b);
    } else {
      model.erase(b);
      if (rng() % 2 == 0 && b->size > delta) {
        f.index.shrink(b, b->ptr + delta, b->size - delta);
      } else {
        f.index.grow(b, b->ptr - delta, b->size + delta);
      }
      model.insert(b);
    }
    ASSERT_EQ(f.index.size(), model.size());
    const std::size_t size = (1 + rng() % 30) * 512;
    auto want = model.lower_bound(FreeKey{S(stream), size, nullptr});
    auto got = f.index.best_fit(S(stream), size);
    ASSERT_EQ(got == f.index.end() ? nullptr : *got, want == model.end() ? nullptr : *want);
    const FreeKey key{S(stream), size, reinterpret_cast<const char*>(0x100000 + rng() % 0x190000000)};
    want = model.lower_bound(key);
    auto bound = f.index.lower_bound(key);
    ASSERT_EQ(bound == f.index.end() ? nullptr : *bound, want == model.end() ? nullptr : *want);
    if (step % 97 != 0) continue;
    ASSERT_EQ(std::vector<Block*>(f.index.begin(), f.index.end()), std::vector<Block*>(model.begin(), model.end()));
    for (Block* x : all) ASSERT_EQ(f.index.contains(x), model.count(x) != 0);
  }
}

// ---- AtomicMap ------------------------------------------------------------------------------

TEST(AtomicMap, AgreesWithAHashMapThroughTombstonesAndRebuilds) {
  AtomicMap<int> map(1024);
  std::unordered_map<std::uintptr_t, int*> model;
  std::vector<int> values(20000);
  std::mt19937_64 rng(11);
  int rebuilds = 0;
  for (int step = 0; step < 60000; ++step) {
    // 512-byte aligned keys close together: long probe runs, full of tombstones.
    const std::uintptr_t key = 0x7f0000000000 + (rng() % 20000) * 512;
    if (model.count(key) == 0 && rng() % 3 != 0) {
      int* v = &values[(key - 0x7f0000000000) / 512];
      auto* slot = map.claim(key);
      if (slot == nullptr) {  // crowded: the owner rebuilds (here: nothing else runs)
        EXPECT_TRUE(map.crowded());
        slot = map.claim_excluding_writers(key);
      }
      AtomicMap<int>::publish(slot, v);
      model[key] = v;
    } else {
      EXPECT_EQ(map.erase(key), model.count(key) != 0);
      model.erase(key);
    }
    if (map.crowded()) {
      map.rebuild();
      ++rebuilds;
      EXPECT_FALSE(map.crowded());
    }
    if (step % 1000 == 0) {
      ASSERT_EQ(map.count(), model.size());
      for (const auto& [k, v] : model) ASSERT_EQ(map.find(k), v);
      std::size_t seen = 0;
      map.for_each([&](std::uintptr_t k, int* v) {
        ++seen;
        EXPECT_EQ(model.at(k), v);
      });
      EXPECT_EQ(seen, model.size());
    }
  }
  EXPECT_GT(rebuilds, 0) << "the test meant to crowd the map";
  EXPECT_EQ(map.find(0x1234), nullptr);
  EXPECT_FALSE(map.erase(0x1234));
}

TEST(AtomicMap, ReadersWithoutALockSeeEveryEntryPublishedBeforeThem) {
  // Two writers on disjoint keys (two streams' shards) and a reader; each writer checks, after
  // publishing, that the reader's kind of lookup finds its key, and after erasing, that it does
  // not. Run under ThreadSanitizer by scripts/sanitize-smoke.sh.
  AtomicMap<int> map(1024);
  std::vector<int> values(2 * 4096);
  std::atomic<bool> stop{false};
  std::atomic<long> found{0};
  auto writer = [&](int id) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(id) + 1);
    std::vector<std::uintptr_t> mine;
    for (int step = 0; step < 40000; ++step) {
      if (mine.size() < 64 && rng() % 2 == 0) {
        const std::uintptr_t key = (static_cast<std::uintptr_t>(id) << 40) + (rng() % 4096 + 1) * 512;
        if (std::find(mine.begin(), mine.end(), key) != mine.end()) continue;
        auto* slot = map.claim(key);
        if (slot == nullptr) continue;  // crowded: an owner would take the device lock
        AtomicMap<int>::publish(slot, &values[static_cast<std::size_t>(id) * 4096 + (key >> 9) % 4096]);
        ASSERT_NE(map.find(key), nullptr);
        mine.push_back(key);
      } else if (!mine.empty()) {
        const std::size_t i = rng() % mine.size();
        ASSERT_TRUE(map.erase(mine[i]));
        ASSERT_EQ(map.find(mine[i]), nullptr);
        mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
  };
  std::thread reader([&] {
    while (!stop.load()) found += map.find((std::uintptr_t{1} << 40) + 512) != nullptr;
  });
  std::thread a(writer, 1), b(writer, 2);
  a.join();
  b.join();
  stop = true;
  reader.join();
}

// ---- ObjectPool -----------------------------------------------------------------------------

TEST(ObjectPool, RecyclesStorageAndConstructsAndDestroysObjects) {
  static int live = 0;
  struct Counted {
    explicit Counted(int v) : value(v) { ++live; }
    ~Counted() { --live; }
    int value;
  };
  ObjectPool<Counted> pool;
  std::vector<Counted*> made;
  for (int i = 0; i < 130; ++i) made.push_back(pool.create(i));  // three chunks
  EXPECT_EQ(live, 130);
  std::set<Counted*> distinct(made.begin(), made.end());
  EXPECT_EQ(distinct.size(), made.size());
  for (int i = 0; i < 130; ++i) EXPECT_EQ(made[static_cast<std::size_t>(i)]->value, i);
  Counted* last = made.back();
  pool.destroy(last);
  EXPECT_EQ(live, 129);
  EXPECT_EQ(pool.create(7), last) << "the storage given back is the first reused";
  for (Counted* c : made) pool.destroy(c);
  EXPECT_EQ(live, 0);
}

// ---- the fast path's statistics ---------------------------------------------------------------

// A naive model: every event applied to explicit current/peak/allocated/freed per pool.
struct NaiveStats {
  DeviceStats s;
  void up(StatArray& a, bool small, std::int64_t n) {
    for (int p : {kAll, small ? kSmallPool : kLargePool}) a[p].increase(n);
  }
  void down(StatArray& a, bool small, std::int64_t n) {
    for (int p : {kAll, small ? kSmallPool : kLargePool}) a[p].decrease(n);
  }
};

TEST(HotStats, SumsAndPeaksOverStreamShardsAreWhatANaiveDeviceCountGives) {
  // Counters per stream shard, peaks of the device-wide sums: one thread, so every peak must be
  // exact, however the changes alternate between the shards.
  StreamShards shards;
  HotStats hot(shards.head());
  std::vector<StreamShard*> streams;
  for (std::uintptr_t s : {0x30, 0x10, 0x0, 0x20})  // (created out of order: listed in order)
    streams.push_back(&shards.get(reinterpret_cast<stream_t>(s)));
  NaiveStats naive;
  std::mt19937_64 rng(3);
  struct Live {
    StreamShard* shard;
    bool small;
    std::int64_t bytes, requested;
    bool pending;
  };
  std::vector<Live> live;
  std::int64_t split[2] = {};  // an inactive-split count of the naive model, per pool
  for (int step = 0; step < 40000; ++step) {
    const int op = static_cast<int>(rng() % 11);
    StreamShard* shard = streams[rng() % streams.size()];
    if (op < 4 || live.empty()) {
      const bool small = rng() % 2 == 0;
      const std::int64_t bytes = static_cast<std::int64_t>((1 + rng() % 100) * 512);
      const std::int64_t requested = bytes - static_cast<std::int64_t>(rng() % 512);
      hot.allocated_block(shard->stats, small, bytes, requested);
      naive.up(naive.s.allocation, small, 1);
      naive.up(naive.s.allocated_bytes, small, bytes);
      naive.up(naive.s.requested_bytes, small, requested);
      naive.up(naive.s.active, small, 1);
      naive.up(naive.s.active_bytes, small, bytes);
      live.push_back({shard, small, bytes, requested, false});
      continue;
    }
    if (op == 10) {  // a split or a merge: inactive_split moves by a net amount
      const bool small = rng() % 2 == 0;
      const std::int64_t n = static_cast<std::int64_t>(rng() % 3) - 1;
      if (split[small ? 0 : 1] + n < 0) continue;
      hot.change(shard->stats, kInactiveSplits, small, n);
      if (n > 0) naive.up(naive.s.inactive_split, small, n);
      if (n < 0) naive.down(naive.s.inactive_split, small, -n);
      split[small ? 0 : 1] += n;
      continue;
    }
    const std::size_t i = rng() % live.size();
    Live& l = live[i];
    if (l.pending) {  // its last event completed
      hot.pending_done(l.small, l.bytes);
      HotStats::inactive_block(l.shard->stats, l.small, l.requested);
      naive.down(naive.s.active, l.small, 1);
      naive.down(naive.s.active_bytes, l.small, l.bytes);
      naive.down(naive.s.requested_bytes, l.small, l.requested);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    } else if (op == 9) {  // freed, waiting for another stream
      HotStats::freed_block(l.shard->stats, l.small, l.bytes);
      hot.pending_block(l.small, l.bytes);
      naive.down(naive.s.allocation, l.small, 1);
      naive.down(naive.s.allocated_bytes, l.small, l.bytes);
      l.pending = true;
    } else {  // freed outright
      HotStats::freed_block(l.shard->stats, l.small, l.bytes);
      HotStats::inactive_block(l.shard->stats, l.small, l.requested);
      naive.down(naive.s.allocation, l.small, 1);
      naive.down(naive.s.allocated_bytes, l.small, l.bytes);
      naive.down(naive.s.active, l.small, 1);
      naive.down(naive.s.active_bytes, l.small, l.bytes);
      naive.down(naive.s.requested_bytes, l.small, l.requested);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (step == 10000 || step == 25000) {  // the resets start everything over from the values now
      hot.reset_peak();
      hot.reset_accumulated();
      naive.s.reset_peak();
      naive.s.reset_accumulated();
    }
    if (step == 17000) streams.push_back(&shards.get(reinterpret_cast<stream_t>(0x18)));
  }
  DeviceStats out;
  hot.expand(out);
  for (auto [name, have, want] :
       {std::tuple{"allocation", &out.allocation, &naive.s.allocation},
        std::tuple{"allocated_bytes", &out.allocated_bytes, &naive.s.allocated_bytes},
        std::tuple{"requested_bytes", &out.requested_bytes, &naive.s.requested_bytes},
        std::tuple{"active", &out.active, &naive.s.active},
        std::tuple{"active_bytes", &out.active_bytes, &naive.s.active_bytes},
        std::tuple{"inactive_split", &out.inactive_split, &naive.s.inactive_split}}) {
    for (int p = 0; p < 3; ++p) {
      SCOPED_TRACE(std::string(name) + " pool " + std::to_string(p));
      EXPECT_EQ((*have)[p].current, (*want)[p].current);
      EXPECT_EQ((*have)[p].peak, (*want)[p].peak);
      EXPECT_EQ((*have)[p].allocated, (*want)[p].allocated);
      EXPECT_EQ((*have)[p].freed, (*want)[p].freed);
    }
  }
  std::int64_t prev = 0;
  for (StreamShard* s = shards.first(); s != nullptr; s = s->next.load()) {
    EXPECT_GE(reinterpret_cast<std::intptr_t>(s->stream), prev) << "shards are listed in stream order";
    prev = reinterpret_cast<std::intptr_t>(s->stream);
  }
}

TEST(PageTable, StorageGrowsWithTheHighestMappedSlotAndHandlesStayWhole) {
  PageTable t;
  t.reset(1u << 20);  // a range of a million slots: nothing stored yet
  EXPECT_EQ(t.slots(), 1u << 20);
  EXPECT_EQ(t.stored(), 0u);
  EXPECT_EQ(t.handle(12345), 0u);
  EXPECT_EQ(t.extent(12345), 0u);
  t.set(100, 4, 0);  // unmapping slots without storage changes nothing
  EXPECT_EQ(t.stored(), 0u);

  // A coarse handle over slots [10, 20) and single-slot handles at 20 and 21.
  t.make_room(22);
  EXPECT_GE(t.stored(), 22u);
  EXPECT_LT(t.stored(), 64u);  // doubling from what is stored, not the range
  t.set(10, 10, 7);
  t.set(20, 1, 8);
  t.set(21, 1, 9);
  for (std::size_t i = 10; i < 20; ++i) EXPECT_EQ(t.handle(i), 7u);
  EXPECT_EQ(t.extent(10), 10u);
  EXPECT_EQ(t.extent(15), 0u);
  EXPECT_EQ(t.head_of(17), 10u);
  EXPECT_EQ(t.head_of(21), 21u);

  // Shrinking to whole handles: a range cutting the coarse handle keeps only what is whole.
  std::size_t first = 12, last = 22;
  t.whole_handles(first, last);
  EXPECT_EQ(first, 20u);
  EXPECT_EQ(last, 22u);
  first = 10;
  last = 15;
  t.whole_handles(first, last);
  EXPECT_EQ(first, last);  // inside one handle: nothing whole
  first = 10;
  last = 21;
  t.whole_handles(first, last);
  EXPECT_EQ(first, 10u);
  EXPECT_EQ(last, 21u);

  // Unmapping clears the handle and its extent; growth keeps what was stored.
  t.set(10, 10, 0);
  EXPECT_EQ(t.handle(15), 0u);
  EXPECT_EQ(t.extent(10), 0u);
  t.make_room(1000);
  EXPECT_GE(t.stored(), 1000u);
  EXPECT_EQ(t.handle(21), 9u);
  EXPECT_EQ(t.extent(21), 1u);
  EXPECT_EQ(t.handle(999), 0u);
  t.reset(8);
  EXPECT_EQ(t.stored(), 0u);
  EXPECT_EQ(t.handle(21), 0u);
}

TEST(Undo, RunsUnlessDoneAndOnExceptions) {
  int undone = 0;
  {
    Undo u([&] { ++undone; });
  }
  EXPECT_EQ(undone, 1);
  {
    Undo u([&] { ++undone; });
    u.done();
  }
  EXPECT_EQ(undone, 1);
  try {
    Undo u([&] { ++undone; });
    throw std::runtime_error("step failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(undone, 2);
}

}  // namespace
}  // namespace stitch::detail
