// tests/cuda/cuda_stitching_test.cu — virtual-memory stitching (docs/stitching.md) on a real GPU:
// the adversarial scenario of tests/support/stitch_scenario.hpp (fill under a memory cap, free
// every other block, lower the cap to what is reserved, ask for more than any hole) on
// backend:cuda, with kernels writing and verifying every byte of the stitched blocks and of every
// live block; and a variant where half the freed blocks are still being written by a slow kernel
// on another stream (record_stream). Both end with every page given back (reserved 0,
// cudaMemGetInfo back to where it started). They skip without a device or without virtual memory
// management. tests/stitching_scenario_test.cpp runs the same steps on the simulated device and
// checks the same expectations on every test run. Helpers: cuda_test_util.cuh.
#include <string>

#include "cuda_test_util.cuh"
#include "support/stitch_scenario.hpp"

namespace {

using namespace stitch_cuda_test;
using namespace stitch::test;

const std::string kStitchConf = std::string("backend:cuda,") + kScenarioConf;

std::uint32_t seed_of(const ScenarioBlock& b) { return 1000 + b.index; }

/// Frees everything, empties the cache: reserved must be 0.
void give_everything_back(stitch::Allocator& alloc, std::vector<void*> ptrs,
                          const Fragmentation& f) {
  for (const ScenarioBlock& b : f.kept) ptrs.push_back(b.ptr);
  for (void* p : ptrs) alloc.deallocate(p);
  EXPECT_EQ(stat(alloc, "allocated_bytes.all.current"), 0);
  alloc.empty_cache();
  EXPECT_EQ(stat(alloc, "reserved_bytes.all.current"), 0);
  EXPECT_NO_THROW(alloc.validate());
}

// ---- the adversarial case with kernels ----------------------------------------------------------

TEST(CudaStitching, ScatteredHolesServeALargeRequestWithKernels) {
  REQUIRE_CUDA_DEVICE();
  CUDA_OK(cudaSetDevice(0));
  Streams st(1);  // declared first: the stream outlives the allocator
  cudaStream_t s = st.s[0];
  MismatchCounter counter;
  const std::size_t free_at_start = settled_free_memory(s, counter);
  std::size_t granule = 0;
  {
    stitch::Allocator alloc(stitch::Config::parse(kStitchConf));
    if (const std::string why = vmm_missing(alloc); !why.empty()) GTEST_SKIP() << why;
    granule = alloc.backend().granularity(0);
    const std::size_t cap = scenario_cap(free_at_start, granule);
    Fragmentation f = fragment(
        alloc, s, granule, cap,
        [&](const ScenarioBlock& b) { launch_fill(b.ptr, b.size, seed_of(b), s); },
        [&](std::size_t, const ScenarioBlock& b) { alloc.deallocate(b.ptr); });
    EXPECT_LE(f.reserved_at_cap, cap) << "the memory fraction was not honoured while growing";
    ASSERT_GE(f.kept.size(), 20u) << "too few blocks under the cap of " << cap << " bytes";

    // Far more than any hole (a freed block, or one merged with the free tail of its range),
    // less than the whole free pages.
    const std::size_t want = round_down(f.freed_pages_at_least(granule) / 2, granule) + 12345;
    ASSERT_GT(want, 2 * f.largest + 2 * granule) << "the free pages are too few for the test";
    const std::int64_t stitches = stat(alloc, "num_stitches");
    const std::int64_t stitched = stat(alloc, "stitched_bytes");
    const std::int64_t reserved = stat(alloc, "reserved_bytes.all.current");
    void* big = alloc.allocate(want, s, 0);
    ASSERT_NE(big, nullptr);
    EXPECT_EQ(stat(alloc, "num_stitches"), stitches + 1);
    EXPECT_EQ(stat(alloc, "stitched_bytes") - stitched,
              static_cast<std::int64_t>(round_up(want, granule)));
    EXPECT_EQ(stat(alloc, "reserved_bytes.all.current"), reserved) << "pages moved, none added";
    EXPECT_NO_THROW(alloc.validate());

    // A kernel writes the whole stitched block, another checks every byte; the live blocks
    // (written before the stitch) are intact: the moved pages alias none of them.
    launch_fill(big, want, 999, s);
    EXPECT_EQ(counter.count(big, want, 999, s), 0u) << "the stitched block does not read back";
    EXPECT_EQ(count_damaged(f.kept, seed_of, counter, s), 0);
    CUDA_OK(cudaGetLastError());
    std::printf("stitched %zu bytes out of %zu freed blocks; %zu live blocks intact; cap %zu, "
                "granule %zu\n",
                want, f.freed.size(), f.kept.size(), cap, granule);
    give_everything_back(alloc, {big}, f);
  }
  expect_memory_back(free_at_start, granule);
}

// ---- freed blocks still written by a slow kernel on another stream --------------------------------

constexpr unsigned long long kSlowNs = 300ull * 1000 * 1000;  // 300 ms

/// Half of the freed blocks are handed to stream B first: B waits for the fills, spins, then
/// rewrites them; record_stream(p, B) + deallocate(p) leaves them pending on B (not free, so no
/// stitch may take their pages). (1) A request that the blocks freed on A cover is stitched from
/// A's pages while B still runs; B's late writes must not reach it. (2) A request that only B's
/// pages can complete: no stitch serves it; the last resort waits for every pending event (B has
/// finished when allocate returns), gives back the free pages and grows under the same cap.
/// Whether B was still running at (1) and (2) is timing (printed; the simulator mirror asserts
/// the allocator's side exactly); data integrity and the allocator's stats are checked here.
TEST(CudaStitching, PagesPendingOnASlowStreamAreLeftAloneUntilARequestNeedsThem) {
  REQUIRE_CUDA_DEVICE();
  CUDA_OK(cudaSetDevice(0));
  Streams st(2);  // declared first: the streams outlive the allocator
  cudaStream_t a = st.s[0];
  cudaStream_t b = st.s[1];
  MismatchCounter counter;
  const std::size_t free_at_start = settled_free_memory(a, counter);
  std::size_t granule = 0;
  {
    stitch::Allocator alloc(stitch::Config::parse(kStitchConf));
    if (const std::string why = vmm_missing(alloc); !why.empty()) GTEST_SKIP() << why;
    Event filled;
    granule = alloc.backend().granularity(0);
    const std::size_t cap = scenario_cap(free_at_start, granule);
    std::size_t own_at_least = 0, own_at_most = granule;  // + the partial page at the range's end
    std::size_t pending_at_least = 0;
    bool b_started = false;
    Fragmentation f = fragment(
        alloc, a, granule, cap,
        [&](const ScenarioBlock& blk) { launch_fill(blk.ptr, blk.size, seed_of(blk), a); },
        [&](std::size_t k, const ScenarioBlock& blk) {
          if (k % 2 == 1) {
            alloc.deallocate(blk.ptr);  // free on A at once
            own_at_least += whole_pages_at_least(blk.size, granule);
            own_at_most += whole_pages_at_most(blk.size, granule);
            return;
          }
          if (!b_started) {  // B waits for every fill queued so far, then spins
            cuda_check(cudaEventRecord(filled.e, a), "cudaEventRecord");
            cuda_check(cudaStreamWaitEvent(b, filled.e, 0), "cudaStreamWaitEvent");
            launch_spin(kSlowNs, b);
            b_started = true;
          }
          launch_fill(blk.ptr, blk.size, seed_of(blk) + 50000, b);  // lands after the spin
          alloc.record_stream(blk.ptr, b);
          alloc.deallocate(blk.ptr);
          pending_at_least += whole_pages_at_least(blk.size, granule);
        });
    ASSERT_TRUE(b_started);
    ASSERT_GE(f.kept.size(), 20u) << "too few blocks under the cap of " << cap << " bytes";

    // (1) Covered by the blocks freed on A: stitched now, B's pages untouched.
    const std::size_t want1 = round_down(own_at_least / 2, granule);
    ASSERT_GT(want1, 2 * f.largest + 2 * granule) << "the free pages are too few for the test";
    const std::int64_t stitches = stat(alloc, "num_stitches");
    void* big1 = alloc.allocate(want1, a, 0);
    ASSERT_NE(big1, nullptr);
    EXPECT_EQ(stat(alloc, "num_stitches"), stitches + 1);
    const bool busy_after_stitch = busy(b);
    launch_fill(big1, want1, 777, a);
    EXPECT_EQ(counter.count(big1, want1, 777, a), 0u);

    // (2) More than every page freed on A can cover: only B's pages make up the rest.
    const std::size_t want2 = own_at_most - want1 + granule;
    ASSERT_LE(want2, own_at_least - want1 + pending_at_least)
        << "the pending pages are too few for the test";
    const bool busy_before_wait = busy(b);
    const std::int64_t retries = stat(alloc, "num_alloc_retries");
    void* big2 = alloc.allocate(want2, a, 0);
    ASSERT_NE(big2, nullptr);
    EXPECT_FALSE(busy(b)) << "served from pages still pending on stream B before B finished";
    EXPECT_EQ(stat(alloc, "num_stitches"), stitches + 1) << "the last resort serves it, not a stitch";
    EXPECT_EQ(stat(alloc, "num_alloc_retries"), retries + 1);
    EXPECT_LE(stat(alloc, "reserved_bytes.all.peak"), static_cast<std::int64_t>(f.reserved_at_cap));
    launch_fill(big2, want2, 888, a);
    EXPECT_EQ(counter.count(big2, want2, 888, a), 0u);
    EXPECT_NO_THROW(alloc.validate());

    // B is done: its late writes landed in the blocks it was given, not in big1 or live blocks.
    CUDA_OK(cudaStreamSynchronize(b));
    CUDA_OK(cudaGetLastError());
    EXPECT_EQ(counter.count(big1, want1, 777, a), 0u) << "stream B's late writes reached the stitched block";
    EXPECT_EQ(count_damaged(f.kept, seed_of, counter, a), 0);
    std::printf("stitched %zu bytes (stream B %s); then %zu bytes after waiting for B (%s)\n",
                want1, busy_after_stitch ? "still running" : "ALREADY DONE: window not exercised",
                want2, busy_before_wait ? "B was still running" : "B HAD FINISHED: wait not exercised");
    ::testing::Test::RecordProperty("b_running_at_stitch", busy_after_stitch ? "yes" : "no");
    ::testing::Test::RecordProperty("b_running_before_wait", busy_before_wait ? "yes" : "no");
    give_everything_back(alloc, {big1, big2}, f);
  }
  expect_memory_back(free_at_start, granule);
}

}  // namespace
