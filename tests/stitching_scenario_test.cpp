// tests/stitching_scenario_test.cpp — the two GPU stitching tests (tests/cuda/cuda_stitching_test.cu)
// step by step on the simulated device, with the same scenario (tests/support/stitch_scenario.hpp)
// and the same sizes a 2 MiB-granule GPU gets: their expectations are checked here on every
// test run, where no GPU is needed. The simulator's held streams stand in for the GPU test's slow
// kernel, so what the GPU test can only observe (stream B still busy) is asserted exactly here
// (no forced completion of B, which pages stay pending, which path serves each request). Also
// the steps benchmarks/gpu/stitch_cost.cpp times, with the backend calls each one makes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/sim_backend.hpp"
#include "support/data_pattern.hpp"
#include "support/stitch_scenario.hpp"

namespace {

using namespace stitch::test;
using stitch::SimCall;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kG = 2 * kMiB;  // the simulator's granularity, as on current GPUs

stitch::stream_t S(int n) {
  return reinterpret_cast<stitch::stream_t>(static_cast<std::uintptr_t>(n) * 0x100);
}

/// A simulated device of 8 GiB: the scenario's cap is then 2 GiB, as on a GPU with 8 GiB free
/// or more (the H200 of the GPU check).
struct Sim {
  std::shared_ptr<stitch::SimBackend> sim;
  std::unique_ptr<stitch::Allocator> alloc;
  Sim() {
    stitch::SimBackend::Options o;
    o.capacity = 8192 * kMiB;
    sim = std::make_shared<stitch::SimBackend>(o);
    alloc = std::make_unique<stitch::Allocator>(
        stitch::Config::parse(std::string("backend:sim,") + kScenarioConf), sim);
  }
  std::int64_t stat(const char* key) const { return *alloc->stat(0, key); }
  std::size_t cap() const { return scenario_cap(sim->memory_info(0).free, kG); }
};

/// Writes `seed`'s pattern into every page of [p, p + n) (each page with its own seed).
void fill_pages(void* p, std::size_t n, std::uint64_t seed) {
  for (std::size_t off = 0; off < n; off += kG)
    write_pattern(static_cast<char*>(p) + off, std::min(kG, n - off), seed * 100000 + off / kG);
}
bool pages_intact(const void* p, std::size_t n, std::uint64_t seed) {
  for (std::size_t off = 0; off < n; off += kG)
    if (!pattern_intact(static_cast<const char*>(p) + off, std::min(kG, n - off), seed * 100000 + off / kG))
      return false;
  return true;
}

std::size_t pending_blocks(const stitch::Allocator& a) {
  std::size_t n = 0;
  for (const stitch::SegmentSnapshot& s : a.snapshot().segments)
    for (const stitch::BlockSnapshot& b : s.blocks) n += b.state == "active_pending_free";
  return n;
}

void expect_kept_intact(const Fragmentation& f) {
  for (const ScenarioBlock& b : f.kept)
    EXPECT_TRUE(pages_intact(b.ptr, b.size, 1000 + b.index)) << "live block " << b.index;
}

void give_everything_back(Sim& s, const Fragmentation& f, const std::vector<void*>& more) {
  for (void* p : more) s.alloc->deallocate(p);
  for (const ScenarioBlock& b : f.kept) s.alloc->deallocate(b.ptr);
  EXPECT_EQ(s.stat("allocated_bytes.all.current"), 0);
  s.alloc->empty_cache();
  EXPECT_EQ(s.stat("reserved_bytes.all.current"), 0);
  EXPECT_NO_THROW(s.alloc->validate());
  EXPECT_EQ(s.sim->usage(0).used, 0u);
  EXPECT_EQ(s.sim->usage(0).mappings, 0u);
}

// CudaStitching.ScatteredHolesServeALargeRequestWithKernels, without the kernels.
TEST(StitchingScenario, ScatteredHolesServeHalfTheFreePagesPlusOddBytes) {
  Sim s;
  const std::size_t cap = s.cap();
  ASSERT_EQ(cap, 2048 * kMiB);
  Fragmentation f = fragment(
      *s.alloc, nullptr, kG, cap,
      [](const ScenarioBlock& b) { fill_pages(b.ptr, b.size, 1000 + b.index); },
      [&](std::size_t, const ScenarioBlock& b) { s.alloc->deallocate(b.ptr); });
  EXPECT_LE(f.reserved_at_cap, cap);
  EXPECT_GT(f.reserved_at_cap + 5 * kG, cap) << "the cap, not something else, stopped the allocator";
  EXPECT_EQ(f.cap_after, f.reserved_at_cap) << "freeing gives nothing back";
  ASSERT_GE(f.kept.size(), 20u);

  const std::size_t want = round_down(f.freed_pages_at_least(kG) / 2, kG) + 12345;
  ASSERT_GT(want, 2 * f.largest + 2 * kG);
  ASSERT_LT(largest_free_block(*s.alloc), want) << "no hole serves it";
  const std::int64_t reserved = s.stat("reserved_bytes.all.current");
  const std::size_t used = s.sim->usage(0).used;
  void* big = s.alloc->allocate(want, nullptr);
  EXPECT_EQ(s.stat("num_stitches"), 1);
  EXPECT_EQ(s.stat("stitched_bytes"), static_cast<std::int64_t>(round_up(want, kG)));
  EXPECT_EQ(s.stat("reserved_bytes.all.current"), reserved) << "pages moved, none added";
  EXPECT_EQ(s.sim->usage(0).used, used) << "no fresh physical memory";
  EXPECT_EQ(s.stat("num_alloc_retries"), 1) << "only the OOM that ended the fill";
  EXPECT_NO_THROW(s.alloc->validate());

  fill_pages(big, want, 999);
  EXPECT_TRUE(pages_intact(big, want, 999));
  expect_kept_intact(f);
  give_everything_back(s, f, {big});
}

// CudaStitching.PagesPendingOnASlowStreamAreNotStitchedUntilItFinishes, with B held instead of
// busy with a slow kernel.
TEST(StitchingScenario, PagesPendingOnAHeldStreamAreLeftAloneUntilARequestNeedsThem) {
  Sim s;
  const stitch::stream_t a = S(1), b = S(2);
  std::size_t own_at_least = 0, own_at_most = kG;  // + the partial page at the range's end
  std::size_t pending_at_least = 0, pending = 0;
  Fragmentation f = fragment(
      *s.alloc, a, kG, s.cap(),
      [](const ScenarioBlock& blk) { fill_pages(blk.ptr, blk.size, 1000 + blk.index); },
      [&](std::size_t k, const ScenarioBlock& blk) {
        if (k % 2 == 1) {
          s.alloc->deallocate(blk.ptr);
          own_at_least += whole_pages_at_least(blk.size, kG);
          own_at_most += whole_pages_at_most(blk.size, kG);
          return;
        }
        if (pending == 0) s.sim->hold_stream(b);  // the GPU test: B spins for 300 ms
        s.alloc->record_stream(blk.ptr, b);
        s.alloc->deallocate(blk.ptr);
        pending_at_least += whole_pages_at_least(blk.size, kG);
        ++pending;
      });
  ASSERT_GE(f.kept.size(), 20u);
  ASSERT_EQ(pending_blocks(*s.alloc), pending);
  const std::uint64_t forced = s.sim->forced_completions();

  // (1) Half of the pages freed on A: stitched from A's own pages; B is neither waited for nor
  // robbed (its blocks stay pending where they are).
  const std::size_t want1 = round_down(own_at_least / 2, kG);
  ASSERT_GT(want1, 2 * f.largest + 2 * kG);
  void* big1 = s.alloc->allocate(want1, a);
  EXPECT_EQ(s.stat("num_stitches"), 1);
  EXPECT_EQ(s.sim->forced_completions(), forced) << "B's queued work was waited for";
  EXPECT_EQ(pending_blocks(*s.alloc), pending) << "a block pending on B was touched";
  EXPECT_NO_THROW(s.alloc->validate());
  fill_pages(big1, want1, 777);

  // (2) More than A's free pages can cover: no stitch can serve it (B's pages are not free yet),
  // so the last resort does: it waits for every pending event (B completes), gives back every
  // free page and grows the range by what the request needs, under the same cap.
  const std::size_t want2 = own_at_most - want1 + kG;
  ASSERT_LE(want2, own_at_least - want1 + pending_at_least);
  const std::int64_t retries = s.stat("num_alloc_retries");
  const std::int64_t sync_all = s.stat("num_sync_all_streams");
  void* big2 = s.alloc->allocate(want2, a);
  EXPECT_GT(s.sim->forced_completions(), forced) << "served before B's work completed";
  EXPECT_EQ(pending_blocks(*s.alloc), 0u);
  EXPECT_EQ(s.stat("num_sync_all_streams"), sync_all + 1);
  EXPECT_EQ(s.stat("num_alloc_retries"), retries + 1) << "the last resort served it";
  EXPECT_EQ(s.stat("num_stitches"), 1) << "a grow after releasing the free pages, not a stitch";
  EXPECT_LE(s.stat("reserved_bytes.all.peak"), static_cast<std::int64_t>(f.reserved_at_cap));
  EXPECT_NO_THROW(s.alloc->validate());

  fill_pages(big2, want2, 888);
  EXPECT_TRUE(pages_intact(big2, want2, 888));
  EXPECT_TRUE(pages_intact(big1, want1, 777));
  expect_kept_intact(f);
  s.sim->release_stream(b);
  give_everything_back(s, f, {big1, big2});
}

// The steps of benchmarks/gpu/stitch_cost.cpp, with the backend calls each timed one makes.
TEST(StitchingScenario, WhatTheStitchCostBenchmarkTimes) {
  for (const std::size_t pages : {8, 32, 128}) {
    Sim s;
    const std::size_t cap = scenario_cap(s.sim->memory_info(0).free, kG, std::size_t{1} << 30);
    Fragmentation f = fragment(
        *s.alloc, S(1), kG, cap, [](const ScenarioBlock&) {},
        [&](std::size_t, const ScenarioBlock& b) { s.alloc->deallocate(b.ptr); });
    ASSERT_GE(f.freed_pages_at_least(kG), pages * kG);
    // The stitch: one reservation, one unmap per source run, one map per page, no fresh page.
    const auto reserves = s.sim->call_count(SimCall::reserve);
    const auto maps = s.sim->call_count(SimCall::map);
    const auto creates = s.sim->call_count(SimCall::create_physical);
    void* big = s.alloc->allocate(pages * kG, S(1));
    EXPECT_EQ(s.stat("num_stitches"), 1) << pages;
    EXPECT_EQ(s.sim->call_count(SimCall::reserve), reserves + 1);
    EXPECT_EQ(s.sim->call_count(SimCall::map), maps + pages);
    EXPECT_EQ(s.sim->call_count(SimCall::create_physical), creates);
    // Dissolving, once the other free pages are gone: one unmap, a release per page, the range.
    s.alloc->empty_cache();
    const auto unmaps = s.sim->call_count(SimCall::unmap);
    const auto releases = s.sim->call_count(SimCall::release_physical);
    const auto ranges = s.sim->call_count(SimCall::release_reservation);
    const std::int64_t reserved = s.stat("reserved_bytes.all.current");
    s.alloc->deallocate(big);
    s.alloc->empty_cache();
    EXPECT_EQ(s.sim->call_count(SimCall::unmap), unmaps + 1);
    EXPECT_EQ(s.sim->call_count(SimCall::release_physical), releases + pages);
    EXPECT_EQ(s.sim->call_count(SimCall::release_reservation), ranges + 1);
    EXPECT_EQ(s.stat("reserved_bytes.all.current"), reserved - static_cast<std::int64_t>(pages * kG));
    for (const ScenarioBlock& b : f.kept) s.alloc->deallocate(b.ptr);
    s.alloc->empty_cache();
    EXPECT_EQ(s.sim->usage(0).used, 0u);
  }
  // The grow it is compared with: a live granule keeps the range; each grow maps exactly the
  // request's pages (a fresh page each), each free + empty_cache unmaps them in one call.
  Sim s;
  void* pin = s.alloc->allocate(kG, S(1));
  for (const std::size_t pages : {8, 32, 128}) {
    const auto reserves = s.sim->call_count(SimCall::reserve);
    const auto creates = s.sim->call_count(SimCall::create_physical);
    void* p = s.alloc->allocate(pages * kG, S(1));
    EXPECT_EQ(s.stat("reserved_bytes.all.current"), static_cast<std::int64_t>((pages + 1) * kG));
    EXPECT_EQ(s.sim->call_count(SimCall::create_physical), creates + pages);
    const auto unmaps = s.sim->call_count(SimCall::unmap);
    s.alloc->deallocate(p);
    s.alloc->empty_cache();
    EXPECT_EQ(s.sim->call_count(SimCall::unmap), unmaps + 1);
    EXPECT_EQ(s.sim->call_count(SimCall::reserve), reserves) << "the range stayed reserved";
    EXPECT_EQ(s.stat("reserved_bytes.all.current"), static_cast<std::int64_t>(kG));
  }
  s.alloc->deallocate(pin);
  s.alloc->empty_cache();
  EXPECT_EQ(s.sim->usage(0).reservations, 0u);
}

}  // namespace
