// KV pools (core/kv_pools.hpp, docs/kv.md) on the simulated device: pages mapped only under live
// blocks and in every buffer at once; the caching allocator and the pools drawing from one budget
// (a request takes the pools' unused pages through the out-of-memory ladder, a pool takes the
// cache); allocation of blocks on mapped pages makes no device call; frees never unmap; a fault at
// every call an allocation makes leaves nothing allocated and the books right; threads allocate and
// free at once; statistics and validate() agree; a fault at every call of a spill and an unspill
// (and two faults, the undo's own) keeps every byte, the books and each page released once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/config.hpp"
#include "stitch/errors.hpp"
#include "stitch/kv_pool.hpp"
#include "stitch/sim_backend.hpp"

namespace stitch {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

class Kv : public ::testing::Test {
 protected:
  void SetUp() override { make("backend:sim,expandable_segments:True"); }
  void make(const std::string& conf) {
    SimBackend::Options o;
    o.capacity = 512 * MiB;
    sim = std::make_shared<SimBackend>(o);
    alloc = std::make_unique<Allocator>(Config::parse(conf), sim);
  }
  std::int64_t stat(const char* key) { return *alloc->stat(0, key); }
  void expect_books() {
    alloc->validate();
    EXPECT_EQ(stat("reserved_bytes.all.current"), static_cast<std::int64_t>(sim->usage(0).used));
  }
  std::shared_ptr<SimBackend> sim;
  std::unique_ptr<Allocator> alloc;
};

TEST_F(Kv, PagesAreMappedUnderLiveBlocksOnlyAndInEveryBuffer) {
  KvPool pool(*alloc, 0, 6, 3 * MiB, 100);  // a block spans two 2 MiB pages
  EXPECT_EQ(stat("kv_bytes.current"), 0);
  std::vector<std::int64_t> ids = pool.alloc(3);  // 9 MiB: pages 0..4
  EXPECT_EQ(ids, (std::vector<std::int64_t>{0, 1, 2}));
  EXPECT_EQ(stat("kv_bytes.current"), static_cast<std::int64_t>(5 * 2 * MiB * 6));
  for (int b = 0; b < 6; ++b) {
    auto* p = static_cast<unsigned char*>(pool.buffer(b));
    std::fill(p, p + 9 * MiB, static_cast<unsigned char>(b + 1));
  }
  EXPECT_EQ(stat("allocated_bytes.all.current"), 0);
  expect_books();
  const std::string summary = alloc->memory_summary(0);
  EXPECT_NE(summary.find("KV pool 1 ('kv')"), std::string::npos) << summary;
  EXPECT_NE(summary.find("3 of 100 blocks live"), std::string::npos) << summary;
  EXPECT_NE(summary.find("Reserved but unallocated  | 0 bytes"), std::string::npos) << "KV pages are not the cache\n" << summary;
  const Snapshot snap = alloc->snapshot();
  ASSERT_EQ(snap.kv_pools.size(), 1u);
  EXPECT_EQ(snap.kv_pools[0].live_blocks, 3u);
  EXPECT_NE(alloc->residency(0).find(R"("kv_pools": [{"pool": 1, "tag": "kv")"), std::string::npos) << alloc->residency(0);
  const std::uint64_t maps = sim->call_count(SimCall::map);
  pool.free(ids.data(), 1);  // never unmaps
  EXPECT_EQ(stat("kv_bytes.current"), static_cast<std::int64_t>(5 * 2 * MiB * 6));
  std::vector<std::int64_t> again = pool.alloc(1);
  EXPECT_EQ(again[0], 0);
  EXPECT_EQ(sim->call_count(SimCall::map), maps) << "a block on mapped pages needs no device call";
  for (int b = 0; b < 6; ++b)
    EXPECT_EQ(static_cast<unsigned char*>(pool.buffer(b))[9 * MiB - 1], b + 1);
  pool.free(ids.data(), 3);
  pool.trim();
  EXPECT_EQ(stat("kv_bytes.current"), 0);
  EXPECT_GT(stat("kv_bytes.peak"), 0);
  expect_books();
}

TEST_F(Kv, OneBudgetTheTrainerTakesUnusedPagesAndThePoolTakesTheCache) {
  KvPool pool(*alloc, 0, 4, 2 * MiB, 60);  // up to 480 MiB
  std::vector<std::int64_t> ids = pool.alloc(50);  // 400 MiB
  pool.free(ids.data(), ids.size());
  // The trainer's 300 MiB: only the pool's unused pages can give it.
  void* t = alloc->allocate(300 * MiB);
  ASSERT_NE(t, nullptr);
  EXPECT_LE(stat("kv_bytes.current"), static_cast<std::int64_t>(212 * MiB));
  expect_books();
  // The pool takes the trainer's cache back once it is freed.
  alloc->deallocate(t);
  std::vector<std::int64_t> more = pool.alloc(55);
  EXPECT_EQ(more.size(), 55u);
  EXPECT_EQ(pool.available(), 5u);
  expect_books();
  pool.free(more.data(), more.size());
}

TEST_F(Kv, AFaultAtEveryCallOfAnAllocationLeavesNothingAllocated) {
  KvPool pool(*alloc, 0, 3, 1 * MiB, 64);
  for (SimCall call : {SimCall::create_physical, SimCall::map, SimCall::set_access}) {
    for (std::uint64_t nth : {1, 2, 3, 5}) {
      pool.trim();
      sim->inject_fault(call, nth, SimFault::error);
      EXPECT_THROW((void)pool.alloc(8), backend_error) << to_string(call) << " #" << nth;
      sim->clear_faults();
      EXPECT_EQ(stat("kv_bytes.current"), 0) << to_string(call) << " #" << nth;
      expect_books();
      EXPECT_EQ(pool.available(), 64u);
    }
  }
  sim->inject_fault(SimCall::create_physical, 2, SimFault::out_of_memory);
  std::vector<std::int64_t> ids = pool.alloc(8);  // out of memory once: the ladder, then again
  EXPECT_EQ(ids.size(), 8u);
  sim->clear_faults();
  pool.free(ids.data(), ids.size());
  expect_books();
}

TEST_F(Kv, BadInputChangesNothing) {
  KvPool pool(*alloc, 0, 2, 4096, 16);
  std::vector<std::int64_t> ids = pool.alloc(4);
  const std::int64_t bad[][2] = {{1, 1}, {3, 16}, {-1, 2}, {2, 9}};
  for (const auto& b : bad) EXPECT_THROW(pool.free(b, 2), invalid_argument);
  EXPECT_EQ(pool.available(), 12u);
  EXPECT_THROW((void)pool.buffer(2), invalid_argument);
  EXPECT_THROW((void)pool.alloc(13), out_of_memory);
  EXPECT_THROW(pool.destroy(), invalid_argument);
  EXPECT_THROW(KvPool(*alloc, 0, 0, 4096, 4), invalid_argument);
  EXPECT_THROW(KvPool(*alloc, 0, 2, 4096, 4, "kv", 4), invalid_argument);
  EXPECT_THROW(KvPool(*alloc, 3, 2, 4096, 4), error);
  pool.free(ids.data(), ids.size());
  pool.destroy();
  EXPECT_THROW((void)pool.available(), invalid_argument);
  expect_books();
}

TEST_F(Kv, ThreadsAllocateAndFreeAtOnce) {
  KvPool pool(*alloc, 0, 2, 96 * 1024, 4000);  // 750 MiB of range on a 512 MiB device
  const std::size_t room = pool.available();
  EXPECT_LT(room, 4000u) << "available() counts the device's room";
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      std::vector<std::int64_t> mine;
      for (int i = 0; i < 400; ++i) {
        if (mine.size() < 200 && rng() % 3 != 0) {
          const std::size_t n = 1 + rng() % 8;
          std::vector<std::int64_t> got = pool.alloc(n);
          for (std::int64_t id : got) static_cast<unsigned char*>(pool.buffer(1))[id * 96 * 1024] = static_cast<unsigned char>(t);
          mine.insert(mine.end(), got.begin(), got.end());
        } else if (!mine.empty()) {
          const std::size_t n = 1 + rng() % mine.size();
          for (std::size_t k = mine.size() - n; k < mine.size(); ++k)
            ASSERT_EQ(static_cast<unsigned char*>(pool.buffer(1))[mine[k] * 96 * 1024], t) << "a block changed hands";
          pool.free(mine.data() + (mine.size() - n), n);
          mine.resize(mine.size() - n);
        }
      }
      pool.free(mine.data(), mine.size());
    });
  }
  for (std::thread& t : threads) t.join();
  expect_books();
  EXPECT_EQ(pool.available(), room) << "the unused pages still mapped count as room";
}

TEST_F(Kv, EmptyCacheKeepsTheReserveAndTheLadderTakesIt) {
  make("backend:sim,expandable_segments:True,kv_reserve_mb:16");
  KvPool pool(*alloc, 0, 2, 2 * MiB, 100);
  std::vector<std::int64_t> ids = pool.alloc(40);  // 160 MiB
  pool.free(ids.data(), ids.size());
  alloc->empty_cache();
  EXPECT_EQ(stat("kv_bytes.current"), static_cast<std::int64_t>(16 * MiB)) << "the reserve stays";
  void* t = alloc->allocate(500 * MiB);  // needs the reserve too
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(stat("kv_bytes.current"), 0);
  alloc->deallocate(t);
  expect_books();
}

TEST_F(Kv, ASpillablePoolSpillsAndComesBackWithItsData) {
  KvPool pool(*alloc, 0, 3, 3 * MiB, 40, "kv-s", Allocator::kRegionSpill);
  std::vector<std::int64_t> ids = pool.alloc(6);  // 18 MiB: 9 pages in each of 3 buffers
  for (int b = 0; b < 3; ++b) {
    auto* p = static_cast<unsigned char*>(pool.buffer(b));
    for (std::size_t i = 0; i < 18 * MiB; i += 4096) p[i] = static_cast<unsigned char>(i / 4096 + b);
  }
  const std::int64_t kv = stat("kv_bytes.current");
  EXPECT_EQ(alloc->spill(0, "kv-s"), 9 * 2 * MiB * 3);
  EXPECT_EQ(stat("kv_bytes.current"), 0) << "its device pages went back";
  EXPECT_EQ(stat("spilled_bytes.current"), kv);
  EXPECT_EQ(sim->usage(0).host_pages, static_cast<std::size_t>(kv));
  expect_books();
  for (int b = 0; b < 3; ++b) {
    auto* p = static_cast<unsigned char*>(pool.buffer(b));
    for (std::size_t i = 0; i < 18 * MiB; i += 4096) ASSERT_EQ(p[i], static_cast<unsigned char>(i / 4096 + b));
  }
  // A fault while spilling moves nothing.
  alloc->unspill(0);
  sim->inject_fault(SimCall::copy, 4, SimFault::error);
  EXPECT_ANY_THROW((void)alloc->spill(0, "kv-s"));
  sim->clear_faults();
  EXPECT_EQ(stat("spilled_bytes.current"), 0);
  EXPECT_EQ(stat("kv_bytes.current"), kv);
  expect_books();
  (void)alloc->spill(0, "kv-s");
  alloc->unspill(0, "kv-s");
  EXPECT_EQ(stat("spilled_bytes.current"), 0);
  EXPECT_EQ(stat("kv_bytes.current"), kv);
  for (int b = 0; b < 3; ++b) {
    auto* p = static_cast<unsigned char*>(pool.buffer(b));
    for (std::size_t i = 0; i < 18 * MiB; i += 4096) ASSERT_EQ(p[i], static_cast<unsigned char>(i / 4096 + b));
  }
  expect_books();
  pool.free(ids.data(), ids.size());
}

TEST_F(Kv, TheZeroPageLiesUnderUnusedSlotsThroughSleepWakeAndTrim) {
  make("backend:sim,expandable_segments:True,kv_zero_page:True");
  KvPool pool(*alloc, 0, 2, 2 * MiB, 16, "kv-zero", Allocator::kRegionBackup);
  EXPECT_EQ(stat("kv_bytes.current"), static_cast<std::int64_t>(2 * MiB)) << "one zero page";
  auto* b1 = static_cast<unsigned char*>(pool.buffer(1));
  EXPECT_EQ(b1[10 * 2 * MiB + 5], 0) << "an unused slot reads zeros";
  std::vector<std::int64_t> ids = pool.alloc(2);
  b1[0] = 7;
  b1[2 * MiB] = 8;
  expect_books();
  alloc->sleep(0, "kv-zero");
  EXPECT_EQ(b1[0], 0) << "asleep, the slots read zeros";
  expect_books();
  alloc->wake(0, "kv-zero");
  EXPECT_EQ(b1[0], 7);
  EXPECT_EQ(b1[2 * MiB], 8);
  pool.free(ids.data(), ids.size());
  pool.trim();
  EXPECT_EQ(b1[0], 0);
  expect_books();
  pool.destroy();
  EXPECT_EQ(stat("kv_bytes.current"), 0);
  expect_books();
}

// ---- spill, unspill and their faults -------------------------------------------------------------

/// The simulated device, counting each handle's releases: a second release of one is counted (and
/// refused by the device), so that a test can require that every page is released exactly once.
class ReleaseCountingSim : public SimBackend {
 public:
  using SimBackend::SimBackend;
  void release_physical(int device, phys_handle_t handle) override {
    {
      std::lock_guard lock(mu_);
      if (released_.count(handle) != 0) ++double_releases_;
    }
    SimBackend::release_physical(device, handle);  // (a refused or failed release is not one)
    std::lock_guard lock(mu_);
    released_.insert(handle);
  }
  std::size_t double_releases() {
    std::lock_guard lock(mu_);
    return double_releases_;
  }

 private:
  std::mutex mu_;
  std::set<phys_handle_t> released_;
  std::size_t double_releases_ = 0;
};

/// A spillable pool of two buffers with three live blocks over three pages (each block's bytes a
/// pattern of its own), on a fresh device whose faults the test arms.
struct SpillRig {
  std::shared_ptr<ReleaseCountingSim> sim;
  std::unique_ptr<Allocator> alloc;
  std::unique_ptr<KvPool> pool;
  std::vector<std::int64_t> ids;
  static constexpr std::size_t kBlock = 768 * 1024;  // blocks straddle the 1 MiB pages
  static constexpr std::size_t kPages = 3 * 2 * MiB;  // three blocks: three pages, two buffers
  SpillRig() {
    SimBackend::Options o;
    o.capacity = 32 * MiB;
    o.granularity = MiB;  // (small pages: a run is quick)
    sim = std::make_shared<ReleaseCountingSim>(o);
    alloc = std::make_unique<Allocator>(Config::parse("backend:sim,expandable_segments:True,kv_page_mb:1"), sim);
    pool = std::make_unique<KvPool>(*alloc, 0, 2, kBlock, 8, "kv-s", Allocator::kRegionSpill);
    ids = pool->alloc(3);
    for (int b = 0; b < 2; ++b)
      for (std::int64_t id : ids) std::memset(at(b, id), static_cast<int>(0x20 + 8 * b + id), kBlock);
  }
  [[nodiscard]] unsigned char* at(int b, std::int64_t id) const {
    return static_cast<unsigned char*>(pool->buffer(b)) + static_cast<std::size_t>(id) * kBlock;
  }
  [[nodiscard]] bool intact() const {
    for (int b = 0; b < 2; ++b)
      for (std::int64_t id : ids) {
        const unsigned char* p = at(b, id);
        const auto want = static_cast<unsigned char>(0x20 + 8 * b + id);
        for (std::size_t i = 0; i < kBlock; i += 4096)
          if (p[i] != want) return false;
        if (p[kBlock - 1] != want) return false;
      }
    return true;
  }
  [[nodiscard]] std::int64_t stat(const char* key) const { return *alloc->stat(0, key); }
  /// Faults cleared, and what an undo left for a retry retried, without moving the pool's pages:
  /// a stray scratch mapping (the next map retries it: a block's page mapped), a handle whose
  /// release failed (stitch_trim retries it, and gives that page back).
  void settle() {
    sim->clear_faults();
    alloc->deallocate(alloc->allocate(MiB));
    alloc->trim(0, 0);
  }
  /// Every statistic against the device (settled): reserved memory is what the device holds,
  /// spilled memory the host pages it holds, and each of the pool's pages is counted once, where
  /// it is; every byte at its address.
  void expect_books(const std::string& where) {
    SCOPED_TRACE(where);
    settle();
    EXPECT_NO_THROW(alloc->validate());
    EXPECT_EQ(stat("reserved_bytes.all.current"), static_cast<std::int64_t>(sim->usage(0).used));
    EXPECT_EQ(stat("spilled_bytes.current"), static_cast<std::int64_t>(sim->usage(0).host_pages));
    EXPECT_EQ(stat("kv_bytes.current") + stat("spilled_bytes.current"), static_cast<std::int64_t>(kPages))
        << "three pages in each of two buffers, on the device or the host";
    EXPECT_TRUE(intact());
  }
  /// Everything back, freed and given back: the device holds nothing, no page was released twice.
  void expect_nothing_left(const std::string& where) {
    SCOPED_TRACE(where);
    sim->clear_faults();
    EXPECT_NO_THROW(alloc->unspill(0));
    EXPECT_EQ(stat("spilled_bytes.current"), 0);
    EXPECT_TRUE(intact());
    pool->free(ids.data(), ids.size());
    pool->destroy();
    alloc->empty_cache();
    EXPECT_NO_THROW(alloc->validate());
    const SimUsage u = sim->usage(0);
    EXPECT_EQ(u.physical_handles, 0u);
    EXPECT_EQ(u.host_pages, 0u);
    EXPECT_EQ(u.used, 0u);
    EXPECT_EQ(sim->double_releases(), 0u) << "a page was released twice";
  }
};

/// Runs `op` with faults armed; a failure must be an error of stitch's (out of memory included),
/// never anything else. True when it succeeded.
template <class Op>
bool survives(Op&& op) {
  try {
    op();
    return true;
  } catch (const error&) {
    return false;
  } catch (const out_of_memory&) {
    return false;
  }
}

TEST(KvSpillFaults, AFaultAtEveryCallOfSpillAndUnspillKeepsEveryByteAndTheBooks) {
  // Every call kind the spill and the unspill of a pool make (create host pages, reserve the
  // scratch range, map and set access, copy, sync, unmap, release, release the scratch; create
  // device pages on the way back), every position, out of memory and error: each byte stays at
  // its address, the statistics match the device, each page is released exactly once.
  std::size_t fired = 0, runs = 0;
  for (int kind = 0; kind < static_cast<int>(SimCall::count_); ++kind)
    for (SimFault fault : {SimFault::error, SimFault::out_of_memory})
      for (std::uint64_t nth = 1;; ++nth) {
        const std::string where = std::string(to_string(static_cast<SimCall>(kind))) + " #" + std::to_string(nth) +
                                  (fault == SimFault::error ? " error" : " out of memory");
        SpillRig r;
        ++runs;
        r.sim->inject_fault(static_cast<SimCall>(kind), nth, fault);
        const std::uint64_t before = r.sim->faults_fired();
        if (survives([&] { (void)r.alloc->spill(0, "kv-s"); })) {
          EXPECT_EQ(r.stat("spilled_bytes.current"), static_cast<std::int64_t>(SpillRig::kPages)) << where;
          const bool back = survives([&] { r.alloc->unspill(0, "kv-s"); });
          if (back) EXPECT_EQ(r.stat("spilled_bytes.current"), 0) << where;
        } else {
          EXPECT_EQ(r.stat("spilled_bytes.current"), 0) << where << ": a spill that failed moved nothing";
        }
        EXPECT_TRUE(r.intact()) << where;
        const bool hit = r.sim->faults_fired() > before;
        r.expect_books(where);
        r.expect_nothing_left(where);
        if (::testing::Test::HasFailure()) return;
        if (!hit) break;
        ++fired;
      }
  EXPECT_GT(fired, 40u) << "the faults must hit the spill's and the unspill's calls";
  std::printf("KV spill and unspill: %zu runs, %zu faults fired\n", runs, fired);
}

TEST(KvSpillFaults, AnUndoThatFailsTooLeavesEachSlotWhereItsDataIs) {
  // Two faults, in a spill or in an unspill: the move fails, and so may the undo of a slot
  // already moved (its remap back, or the page made for it). No page is released while mapped
  // or released twice; a slot that could not go back stays where its data is, usable at its
  // address, and is counted there.
  const SimCall kinds[] = {SimCall::map, SimCall::copy, SimCall::create_physical, SimCall::create_host_physical,
                           SimCall::unmap};
  std::size_t runs = 0;
  for (const bool in_unspill : {false, true})
    for (SimCall first : kinds)
      for (SimCall second : kinds)
        for (std::uint64_t a = 1; a <= 4; ++a)
          for (std::uint64_t b = 1; b <= 4; ++b) {
            if (first == second && a == b) continue;
            const std::string where = std::string(in_unspill ? "unspill: " : "spill: ") + to_string(first) + " #" +
                                      std::to_string(a) + " and " + to_string(second) + " #" + std::to_string(b);
            SpillRig r;
            if (in_unspill) (void)r.alloc->spill(0, "kv-s");
            r.sim->inject_fault(first, a, SimFault::error);
            r.sim->inject_fault(second, b, SimFault::error);
            if (in_unspill) {
              (void)survives([&] { r.alloc->unspill(0, "kv-s"); });
            } else {
              (void)survives([&] { (void)r.alloc->spill(0, "kv-s"); });
            }
            r.expect_books(where);
            r.expect_nothing_left(where);
            ++runs;
            if (::testing::Test::HasFailure()) return;
          }
  EXPECT_GT(runs, 700u);
  std::printf("KV spill and unspill, two faults: %zu runs\n", runs);
}

TEST(KvSpillFaults, AFailedCreateLeavesTheTagAsItWas) {
  SimBackend::Options o;
  o.capacity = 64 * MiB;
  auto sim = std::make_shared<SimBackend>(o);
  Allocator alloc(Config::parse("backend:sim,expandable_segments:True"), sim);
  sim->inject_fault(SimCall::reserve, 2, SimFault::error);  // the second buffer's range
  EXPECT_THROW(KvPool(alloc, 0, 2, 2 * MiB, 8, "kv-late", Allocator::kRegionSpill), backend_error);
  // The tag's memory, allocated in a region without STITCH_REGION_SPILL, may not spill.
  void* block = nullptr;
  {
    Allocator::Region region(alloc, "kv-late");
    block = alloc.allocate(4 * MiB);
  }
  try {
    (void)alloc.spill(0, "kv-late");
    ADD_FAILURE() << "the failed create left the tag spillable";
  } catch (const error& e) {
    EXPECT_NE(std::string(e.what()).find("kv-late"), std::string::npos) << e.what();
  }
  EXPECT_EQ(*alloc.stat(0, "spilled_bytes.current"), 0);
  alloc.deallocate(block);
  // Made for real, it is spillable.
  KvPool pool(alloc, 0, 2, 2 * MiB, 8, "kv-late", Allocator::kRegionSpill);
  std::vector<std::int64_t> ids = pool.alloc(1);
  EXPECT_EQ(alloc.spill(0, "kv-late"), 2 * 2 * MiB);
  alloc.unspill(0);
  pool.free(ids.data(), ids.size());
}

TEST(KvNoVmm, APoolNeedsTheVirtualMemoryApi) {
  class NoVmm : public SimBackend {
   public:
    bool supports_virtual_memory(int) override { return false; }
  };
  Allocator alloc(Config::parse("backend:sim"), std::make_shared<NoVmm>());
  try {
    KvPool pool(alloc, 0, 2, 4096, 4);
    FAIL() << "a pool without the virtual-memory API";
  } catch (const backend_error& e) {
    EXPECT_NE(std::string(e.what()).find("virtual-memory"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace stitch
