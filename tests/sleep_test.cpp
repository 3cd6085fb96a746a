// Sleep and wake of region-tagged memory (core/sleeper.hpp, docs/sleep.md) on the simulated
// device, whose memory is real host memory (contents really move and are really lost), in three
// configurations (defaults, expandable segments, stitching): regions scoped to their thread and
// nested; a sleep gives every page of the tags back (reserved memory falls to the untagged
// memory's, the device's free memory rises by as much, and an untagged allocation of nearly the
// whole device succeeds); addresses and backed-up contents survive; three cycles leave every
// statistic as it was; each error case is an error; a fault at every new call site leaves each
// block awake with its data or asleep with its backup; a wake without memory fails whole and
// succeeds later; trim stops at its target.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/config.hpp"
#include "stitch/errors.hpp"
#include "stitch/sim_backend.hpp"
#include "support/data_pattern.hpp"
#include "support/sleep_configs.hpp"

namespace stitch {
namespace {

using test::pattern_intact;
using test::write_pattern;

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t kCapacity = 1024 * MiB;

stream_t S(int n) { return reinterpret_cast<stream_t>(static_cast<std::uintptr_t>(n) * 0x10); }

struct Live {
  void* ptr;
  std::size_t size;
  std::uint64_t seed;
};

class Sleep : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override { make(GetParam()); }
  void make(const std::string& conf, int devices = 1) {
    SimBackend::Options o;
    o.capacity = kCapacity;
    o.devices = devices;
    sim = std::make_shared<SimBackend>(o);
    alloc = std::make_unique<Allocator>(Config::parse(conf), sim);
  }
  Live add(std::size_t size, stream_t stream = nullptr, int device = 0) {
    void* p = alloc->allocate(size, stream, device);
    Live l{p, size, ++seed};
    write_pattern(p, size, l.seed);
    return l;
  }
  std::int64_t stat(const char* key, int device = 0) { return *alloc->stat(device, key); }
  /// A mix of weights (backed up) and KV cache (not), with untagged memory around them.
  void fill() {
    untagged.push_back(add(48 * MiB));
    untagged.push_back(add(300 * 1024));
    {
      Allocator::Region r(*alloc, "weights", /*backup=*/true);
      for (std::size_t s : {64 * MiB, 3 * MiB, 512 * KiB, 200 * KiB, 24 * MiB})
        weights.push_back(add(s));
    }
    {
      Allocator::Region r(*alloc, "kv");
      for (int i = 0; i < 6; ++i) kv.push_back(add(16 * MiB + static_cast<std::size_t>(i) * MiB));
      kv.push_back(add(700 * 1024, S(1)));
    }
    // Cached free memory of each tag: freed blocks stay in their tag's pool.
    alloc->deallocate(kv.back().ptr);
    kv.pop_back();
  }
  void expect_intact(const std::vector<Live>& blocks) {
    for (const Live& l : blocks) EXPECT_TRUE(pattern_intact(l.ptr, l.size, l.seed)) << l.ptr;
  }

  std::shared_ptr<SimBackend> sim;
  std::unique_ptr<Allocator> alloc;
  std::vector<Live> untagged, weights, kv;
  std::uint64_t seed = 0;
};

TEST_P(Sleep, GivesEveryPageBackAndKeepsAddressesAndBackups) {
  // The untagged memory's reserved bytes, measured alone first.
  const Live u = add(48 * MiB);
  const Live u2 = add(300 * 1024);
  const std::int64_t untagged_reserved = stat("reserved_bytes.all.current");
  alloc->deallocate(u.ptr);
  alloc->deallocate(u2.ptr);
  alloc->empty_cache();
  fill();
  alloc->validate();
  const std::int64_t allocated = stat("allocated_bytes.all.current");
  const std::size_t used_before = sim->usage(0).used;
  std::int64_t kv_live = 0, weights_live = 0;
  for (const Live& l : kv) kv_live += static_cast<std::int64_t>(alloc->find(l.ptr)->size);
  for (const Live& l : weights) weights_live += static_cast<std::int64_t>(alloc->find(l.ptr)->size);

  alloc->sleep();
  alloc->validate();
  // Every page of the tags went back: what stays reserved is the untagged memory's.
  EXPECT_EQ(stat("reserved_bytes.all.current"), untagged_reserved);
  EXPECT_EQ(sim->usage(0).used, static_cast<std::size_t>(untagged_reserved));
  EXPECT_LT(sim->usage(0).used, used_before);
  EXPECT_EQ(stat("allocated_bytes.all.current"), allocated);  // sleeping blocks count
  EXPECT_EQ(stat("sleeping_bytes.current"), kv_live + weights_live);
  EXPECT_EQ(stat("num_sleeps"), 1);
  EXPECT_EQ(sim->usage(0).host_bytes, static_cast<std::size_t>(weights_live));  // weights only
  // The memory is really back: an untagged allocation of nearly the whole device succeeds.
  const std::size_t room = kCapacity - static_cast<std::size_t>(untagged_reserved) - 40 * MiB;
  void* big = alloc->allocate(room);
  write_pattern(big, room, 99);
  alloc->validate();
  alloc->deallocate(big);
  alloc->empty_cache();
  expect_intact(untagged);

  alloc->wake();
  alloc->validate();
  EXPECT_EQ(stat("sleeping_bytes.current"), 0);
  EXPECT_EQ(stat("num_wakes"), 1);
  EXPECT_EQ(sim->usage(0).host_bytes, 0u);  // the backups' host memory went back
  expect_intact(weights);  // same addresses, same contents
  expect_intact(untagged);
  // The KV cache's contents are gone (its pages were given back), its addresses valid again.
  for (const Live& l : kv) {
    EXPECT_FALSE(pattern_intact(l.ptr, l.size, l.seed)) << l.ptr;
    write_pattern(l.ptr, l.size, l.seed);
  }
  for (const auto* set : {&weights, &kv, &untagged})
    for (const Live& l : *set) alloc->deallocate(l.ptr);
  alloc->validate();
}

TEST_P(Sleep, ThreeCyclesLeaveEveryStatisticAsItWas) {
  fill();
  const char* keys[] = {"allocated_bytes.all.current", "reserved_bytes.all.current",
                        "active_bytes.all.current",   "segment.all.current",
                        "allocation.all.current",     "active.all.current",
                        "requested_bytes.all.current", "inactive_split_bytes.all.current"};
  std::vector<std::int64_t> before;
  for (const char* k : keys) before.push_back(stat(k));
  for (int cycle = 0; cycle < 3; ++cycle) {
    alloc->sleep(-1, std::nullopt, "kv");  // the KV cache backed up too, this time
    alloc->validate();
    alloc->wake(-1, "weights");  // one tag at a time: weights first
    alloc->validate();
    EXPECT_GT(stat("sleeping_bytes.current"), 0);
    alloc->wake(-1, "kv");
    alloc->validate();
    expect_intact(weights);
    expect_intact(kv);
  }
  for (std::size_t i = 0; i < std::size(keys); ++i) EXPECT_EQ(stat(keys[i]), before[i]) << keys[i];
  EXPECT_EQ(stat("num_sleeps"), 3);
  EXPECT_EQ(stat("num_wakes"), 6);
}

TEST_P(Sleep, ErrorsNameTheirCause) {
  fill();
  // A tag never used.
  try {
    alloc->sleep(-1, "weigths");
    FAIL() << "a misspelt tag slept";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'weigths'"), std::string::npos) << e.what();
  }
  try {
    alloc->begin_region("opened-only");
    alloc->end_region();
    alloc->sleep(-1, "opened-only");
    FAIL() << "a tag without allocations slept";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("never used"), std::string::npos) << e.what();
  }
  EXPECT_THROW(alloc->end_region(), invalid_argument);  // none open
  EXPECT_THROW(alloc->begin_region(""), invalid_argument);
  EXPECT_THROW(alloc->begin_region("a,b"), invalid_argument);
  EXPECT_THROW(alloc->sleep(3), invalid_argument);  // no such device

  alloc->sleep(-1, "kv");
  // Allocating under a sleeping tag fails, naming it; others go on.
  {
    Allocator::Region r(*alloc, "kv");
    try {
      (void)alloc->allocate(MiB);
      FAIL() << "allocated under a sleeping tag";
    } catch (const error& e) {
      EXPECT_NE(std::string(e.what()).find("'kv'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("asleep"), std::string::npos) << e.what();
    }
    Allocator::Region inner(*alloc, "weights");
    weights.push_back(add(MiB));
  }
  // Sleeping a sleeping tag changes nothing.
  const std::int64_t reserved = stat("reserved_bytes.all.current");
  alloc->sleep(-1, "kv");
  EXPECT_EQ(stat("reserved_bytes.all.current"), reserved);
  EXPECT_EQ(stat("num_sleeps"), 1);
  // Not while a private-pool route (a graph capture) is underway.
  alloc->begin_allocate_to_pool(0, PoolId{1, 1}, [](stream_t) { return true; });
  EXPECT_THROW(alloc->sleep(-1, "weights"), error);
  EXPECT_THROW(alloc->wake(-1, "kv"), error);
  alloc->end_allocate_to_pool(0, PoolId{1, 1});
  alloc->release_pool(0, PoolId{1, 1});
  alloc->validate();
  alloc->wake();
  expect_intact(weights);
}

TEST_P(Sleep, FreeingASleepingBlockDropsItsBackup) {
  fill();
  alloc->sleep();
  const std::size_t host = sim->usage(0).host_bytes;
  const std::int64_t sleeping = stat("sleeping_bytes.current");
  const std::size_t size = alloc->find(weights[0].ptr)->size;
  alloc->deallocate(weights[0].ptr);
  weights.erase(weights.begin());
  alloc->validate();
  EXPECT_EQ(stat("sleeping_bytes.current"), sleeping - static_cast<std::int64_t>(size));
  EXPECT_EQ(sim->usage(0).host_bytes, host);  // the other weights share its host memory
  // Every block of the KV cache freed while asleep: nothing of it is live at the wake.
  for (const Live& l : kv) alloc->deallocate(l.ptr, S(2));  // on another stream, too
  kv.clear();
  alloc->empty_cache();  // never touches a sleeping range
  alloc->validate();
  alloc->wake();
  alloc->validate();
  expect_intact(weights);
  for (const Live& l : weights) alloc->deallocate(l.ptr);
  weights.clear();
  alloc->sleep(-1, "weights");  // nothing live: nothing backed up
  EXPECT_EQ(sim->usage(0).host_bytes, 0u);
  alloc->wake();
  alloc->validate();
}

TEST_P(Sleep, AWakeWithoutMemoryFailsWholeAndSucceedsLater) {
  fill();
  alloc->sleep();
  // Another user takes the memory the sleep gave back.
  std::vector<void*> hog;
  for (;;) {
    try {
      hog.push_back(alloc->allocate(32 * MiB, S(7)));
    } catch (const out_of_memory&) {
      break;
    }
  }
  const std::int64_t reserved = stat("reserved_bytes.all.current");
  try {
    alloc->wake();
    FAIL() << "woke without memory";
  } catch (const out_of_memory& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("stitch_wake"), std::string::npos) << what;
    EXPECT_NE(what.find("stay asleep"), std::string::npos) << what;
  }
  alloc->validate();  // nothing half-mapped
  EXPECT_EQ(stat("reserved_bytes.all.current"), reserved);
  {
    Allocator::Region r(*alloc, "weights");
    EXPECT_THROW((void)alloc->allocate(MiB), error);  // still asleep
  }
  for (void* p : hog) alloc->deallocate(p);
  alloc->wake();  // retried once memory is free
  alloc->validate();
  expect_intact(weights);
  expect_intact(untagged);
}

TEST_P(Sleep, RegionsBelongToTheirThreadAndNest) {
  alloc->begin_region("outer");
  EXPECT_EQ(alloc->current_region(), "outer");
  const Live a = add(MiB);
  std::thread other([&] {
    EXPECT_EQ(alloc->current_region(), "");
    EXPECT_THROW(alloc->end_region(), invalid_argument);  // this thread opened none
    untagged.push_back(add(2 * MiB));                     // not tagged
  });
  other.join();
  alloc->begin_region("inner");
  const Live b = add(MiB);  // the innermost wins
  alloc->end_region();
  const Live c = add(MiB);
  alloc->end_region();
  EXPECT_EQ(alloc->current_region(), "");
  alloc->sleep(-1, "inner");
  // The other thread's block and "outer"'s stay mapped and keep their contents.
  EXPECT_TRUE(pattern_intact(a.ptr, a.size, a.seed));
  EXPECT_TRUE(pattern_intact(c.ptr, c.size, c.seed));
  expect_intact(untagged);
  alloc->wake();
  alloc->sleep(-1, "outer");
  expect_intact(untagged);
  alloc->wake();
  for (const Live& l : {a, b, c, untagged[0]}) alloc->deallocate(l.ptr);
  alloc->validate();
}

TEST_P(Sleep, AFaultAtEveryNewCallLeavesEachBlockAwakeWithItsDataOrAsleepWithItsBackup) {
  fill();
  alloc->empty_cache();  // (what a final empty_cache would give back besides the stray pages)
  const std::int64_t reserved = stat("reserved_bytes.all.current");
  // Before anything is unmapped: the call fails, every block is awake with its data.
  for (SimCall call : {SimCall::allocate_host, SimCall::copy_to_host_async,
                       SimCall::synchronize_stream, SimCall::synchronize_device}) {
    sim->inject_fault(call, 1, SimFault::error);
    EXPECT_ANY_THROW(alloc->sleep()) << to_string(call);
    sim->clear_faults();
    alloc->validate();
    EXPECT_EQ(stat("reserved_bytes.all.current"), reserved) << to_string(call);
    EXPECT_EQ(stat("sleeping_bytes.current"), 0) << to_string(call);
    EXPECT_EQ(sim->usage(0).host_bytes, 0u) << to_string(call);
    expect_intact(weights);
    expect_intact(kv);
  }
  sim->inject_fault(SimCall::allocate_host, 1, SimFault::out_of_memory);
  EXPECT_THROW(alloc->sleep(), out_of_memory);
  alloc->validate();
  expect_intact(kv);
  // A failing unmap or release: the tags are asleep with their backups (the page waits to be
  // retried), and the error says so.
  for (SimCall call : {SimCall::unmap, SimCall::release_physical}) {
    const std::size_t mapped_before = sim->usage(0).mappings;
    sim->inject_fault(call, 1, SimFault::error);
    // An unmap is tried again at once: twice failing leaves a stray mapping for the retry.
    if (call == SimCall::unmap) sim->inject_fault(call, 2, SimFault::error);
    try {
      alloc->sleep();
      FAIL() << "a failed " << to_string(call) << " went unreported";
    } catch (const backend_error& e) {
      EXPECT_NE(std::string(e.what()).find("asleep"), std::string::npos) << e.what();
    }
    sim->clear_faults();
    alloc->validate();  // reserved memory counts what is still mapped (recounted there)
    if (call == SimCall::unmap) {
      // The mapping the unmap left is still the device's: reserved memory counts it until the
      // retry, which a validate() after empty_cache() checks too.
      EXPECT_LT(sim->usage(0).mappings, mapped_before);
      EXPECT_EQ(stat("reserved_bytes.all.current"), static_cast<std::int64_t>(sim->usage(0).used))
          << "reserved memory is what the device holds for stitch, the stray mapping included";
    }
    EXPECT_GT(stat("sleeping_bytes.current"), 0);
    // A wake: fresh pages, and faults there too, each leaving everything asleep.
    for (auto [wcall, nth] : {std::pair{SimCall::create_physical, 2}, std::pair{SimCall::map, 2},
                              std::pair{SimCall::copy_from_host_async, 1},
                              std::pair{SimCall::synchronize_stream, 1}}) {
      sim->inject_fault(wcall, static_cast<std::uint64_t>(nth), SimFault::error);
      EXPECT_ANY_THROW(alloc->wake()) << to_string(wcall);
      sim->clear_faults();
      alloc->validate();
      Allocator::Region r(*alloc, "weights");
      EXPECT_THROW((void)alloc->allocate(MiB), error) << "awake after a failed wake";
    }
    alloc->wake();
    alloc->validate();
    expect_intact(weights);
    for (const Live& l : kv) write_pattern(l.ptr, l.size, l.seed);
  }
  alloc->empty_cache();  // the stray pages, retried
  alloc->validate();
  EXPECT_EQ(stat("reserved_bytes.all.current"), reserved);
}

TEST_P(Sleep, TrimStopsAtItsTarget) {
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(alloc->allocate(40 * MiB));
  for (void* p : blocks) alloc->deallocate(p);
  const std::int64_t cached = stat("reserved_bytes.all.current");
  ASSERT_GE(cached, 320 * static_cast<std::int64_t>(MiB));
  alloc->trim(0, 150 * MiB);
  const std::int64_t after = stat("reserved_bytes.all.current");
  EXPECT_LE(after, 150 * static_cast<std::int64_t>(MiB));
  EXPECT_GT(after, 0);  // it stopped: not an empty_cache
  alloc->trim(0, 0);
  EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
  alloc->validate();
}

TEST_P(Sleep, ResidencySaysWhatStaysOnTheDevice) {
  fill();
  alloc->sleep(-1, "kv");
  const std::string r = alloc->residency(0);
  EXPECT_NE(r.find(R"("tag": "kv", "state": "asleep")"), std::string::npos) << r;
  EXPECT_NE(r.find(R"("tag": "weights", "state": "awake")"), std::string::npos) << r;
  EXPECT_NE(r.find(R"("untagged": {"live_bytes": )"), std::string::npos) << r;
  EXPECT_NE(r.find(R"("sleeping_bytes": )" + std::to_string(stat("sleeping_bytes.current"))),
            std::string::npos) << r;
  // memory_summary and snapshots show the sleeping ranges as such.
  const std::string summary = alloc->memory_summary(0);
  EXPECT_NE(summary.find("Asleep (stitch_sleep)"), std::string::npos) << summary;
  EXPECT_NE(summary.find("Sleeping tags"), std::string::npos) << summary;
  bool sleeping = false, awake = false;
  for (const SegmentSnapshot& s : alloc->snapshot().segments) {
    if (s.tag == "kv") sleeping = sleeping || s.sleeping;
    if (s.tag == "weights") awake = awake || !s.sleeping;
  }
  EXPECT_TRUE(sleeping);
  EXPECT_TRUE(awake);
  const std::string all = alloc->residency();
  EXPECT_EQ(all.rfind(R"({"devices": [)", 0), 0u) << all;
  alloc->wake();
}

TEST_P(Sleep, EveryDeviceAndItsPeersAreSynchronized) {
  make(GetParam(), 2);
  {
    Allocator::Region r(*alloc, "weights", true);
    weights.push_back(add(8 * MiB, nullptr, 0));
    weights.push_back(add(8 * MiB, nullptr, 1));
  }
  const std::uint64_t syncs = sim->call_count(SimCall::synchronize_device);
  alloc->sleep(1);
  // Device 1 and its peer (device 0): a kernel there may use device 1's memory.
  EXPECT_EQ(sim->call_count(SimCall::synchronize_device), syncs + 2);
  EXPECT_TRUE(pattern_intact(weights[0].ptr, weights[0].size, weights[0].seed));  // device 0 awake
  alloc->sleep();  // device 0 now
  alloc->wake(1);
  EXPECT_TRUE(pattern_intact(weights[1].ptr, weights[1].size, weights[1].seed));
  alloc->wake(0);
  expect_intact(weights);
  alloc->validate();
}

TEST_P(Sleep, AGraphPoolBegunInARegionSleepsWithItsTag) {
  // As a capture inside a region (torch_memory_saver's cuda_graph): the pool takes the region's
  // tag, and every allocation into it keeps it, from any thread, inside a region or not.
  const PoolId id{0, 7};
  {
    Allocator::Region r(*alloc, "graph", /*backup=*/true);
    alloc->begin_allocate_to_pool(0, id, [](stream_t s) { return s == S(3); });
  }
  std::vector<Live> graph;
  for (std::size_t size : {6 * MiB, 300 * KiB, 40 * MiB}) graph.push_back(add(size, S(3)));
  const Live outside = add(4 * MiB, S(4));  // another stream: not the pool's, untagged
  alloc->deallocate(graph[1].ptr);  // freed during the capture: stays the pool's
  graph.erase(graph.begin() + 1);
  alloc->end_allocate_to_pool(0, id);
  alloc->empty_cache();  // a graph pool's free pages stay (its replay may use them)
  alloc->validate();
  auto private_reserved = [&] {
    const std::string r = alloc->residency(0);
    const auto at = r.find(R"("private_pools": {)");
    const auto key = r.find(R"("reserved_bytes": )", at);
    return std::stoll(r.substr(key + 18));
  };
  const long long pool_reserved = private_reserved();
  EXPECT_GE(pool_reserved, static_cast<long long>(46 * MiB));
  const std::int64_t reserved = stat("reserved_bytes.all.current");
  alloc->sleep(-1, "graph");
  alloc->validate();
  EXPECT_EQ(private_reserved(), 0);
  EXPECT_EQ(stat("reserved_bytes.all.current"), reserved - pool_reserved);
  EXPECT_TRUE(pattern_intact(outside.ptr, outside.size, outside.seed));
  {
    // Allocating into the sleeping pool fails too.
    alloc->begin_allocate_to_pool(0, id, [](stream_t s) { return s == S(3); });
    EXPECT_THROW((void)alloc->allocate(MiB, S(3)), error);
    alloc->end_allocate_to_pool(0, id);
    alloc->release_pool(0, id);  // (each begin is one use)
  }
  alloc->wake(-1, "graph");
  alloc->validate();
  expect_intact(graph);  // the region asked for backup
  EXPECT_EQ(stat("reserved_bytes.all.current"), reserved);
  // The graph goes: its pool's memory goes back once its blocks are free.
  alloc->release_pool(0, id);
  for (const Live& l : graph) alloc->deallocate(l.ptr);
  alloc->empty_cache();
  alloc->validate();
  EXPECT_EQ(private_reserved(), 0) << alloc->residency(0);
  alloc->deallocate(outside.ptr);
  alloc->empty_cache();
  EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
}

TEST(SleepWithoutVirtualMemory, TheFirstTaggedAllocationFailsWithAClearMessage) {
  class NoVmm : public SimBackend {
   public:
    bool supports_virtual_memory(int) override { return false; }
  };
  Allocator a(Config::parse("backend:sim"), std::make_shared<NoVmm>());
  void* untagged = a.allocate(MiB);  // untagged memory does not need it
  Allocator::Region r(a, "weights");
  try {
    (void)a.allocate(MiB);
    FAIL() << "a tagged allocation without the virtual-memory API";
  } catch (const backend_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'weights'"), std::string::npos) << what;
    EXPECT_NE(what.find("virtual-memory API"), std::string::npos) << what;
  }
  a.deallocate(untagged);
  a.validate();
}

TEST(SleepHostBudget, ABackupPastSimHostMbFailsWithNothingChanged) {
  // sim_host_mb bounds the pinned host memory of backups: a sleep whose backups do not fit fails
  // whole, every block awake with its data; with room it succeeds.
  auto alloc = std::make_unique<Allocator>(
      Config::parse("backend:sim,sim_capacity_mb:256,sim_host_mb:8,expandable_segments:True"));
  std::vector<void*> blocks;
  {
    Allocator::Region r(*alloc, "weights", /*backup=*/true);
    for (int i = 0; i < 3; ++i) {
      blocks.push_back(alloc->allocate(4 * MiB, nullptr, 0));
      std::memset(blocks.back(), 0x30 + i, 4 * MiB);
    }
  }
  EXPECT_THROW(alloc->sleep(-1, "weights"), std::exception);  // 12 MiB of backups, 8 MiB of host
  alloc->validate();
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(static_cast<unsigned char*>(blocks[static_cast<std::size_t>(i)])[4 * MiB - 1], 0x30 + i);
  alloc->deallocate(blocks.back());
  blocks.pop_back();
  alloc->sleep(-1, "weights");  // 8 MiB: fits
  alloc->wake(-1, "weights");
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(static_cast<unsigned char*>(blocks[static_cast<std::size_t>(i)])[0], 0x30 + i);
  for (void* p : blocks) alloc->deallocate(p);
}

INSTANTIATE_TEST_SUITE_P(Configs, Sleep, test::sleep_configs(), test::sleep_config_name);

}  // namespace
}  // namespace stitch
