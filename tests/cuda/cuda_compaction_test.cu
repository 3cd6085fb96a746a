// tests/cuda/cuda_compaction_test.cu — compaction (stitch_compact:True, docs/stitching.md
// "Compaction") on a real GPU: the worst case of tests/support/compaction_scenario.hpp (a live
// block at the start of every coarse page under a 1 GiB cap) on backend:cuda. Kernels write a
// pattern into every live block; a slow kernel on another stream then rewrites them (queued
// before the request, so the device sync must wait for it); one request for every granule no
// live block touches is served by compaction; kernels check every live block at its address and
// the new block. With the cap at what is reserved the first page is staged through host memory;
// with a coarse page of room, fresh device pages take the data. Ends with every page given back.
// Skips without a device or without virtual memory management. tests/compaction_test.cpp
// (TheGpuScenarioOnTheSimulatedDevice) runs the same steps on the simulated device on every test
// run. Helpers: cuda_test_util.cuh.
#include <string>

#include "cuda_test_util.cuh"
#include "support/compaction_scenario.hpp"

namespace {

using namespace stitch_cuda_test;
using namespace stitch::test;

constexpr unsigned long long kSlowNs = 200ull * 1000 * 1000;  // 200 ms

void compact_under_kernels(bool room) {
  CUDA_OK(cudaSetDevice(0));
  Streams st(2);  // declared first: the streams outlive the allocator
  cudaStream_t a = st.s[0];
  cudaStream_t b = st.s[1];
  MismatchCounter counter;
  const std::size_t free_at_start = settled_free_memory(a, counter);
  std::size_t granule = 0;
  {
    stitch::Allocator alloc(stitch::Config::parse(std::string("backend:cuda,") + kCompactionConf));
    if (const std::string why = vmm_missing(alloc); !why.empty()) GTEST_SKIP() << why;
    granule = alloc.backend().granularity(0);
    const std::size_t cap = scenario_cap(free_at_start, granule, std::size_t{1} << 30);
    CoarsePages f = fill_coarse_pages(
        alloc, a, granule, cap, room ? coarse_page(granule) : 0,
        [&](const ScenarioBlock& blk) { launch_fill(blk.ptr, blk.size, 1000 + blk.index, a); });
    ASSERT_GE(f.live.size(), 20u) << "too few coarse pages under the cap of " << cap << " bytes";
    const std::size_t want = f.free_of_live();
    ASSERT_GT(want, f.cap / 2) << "the fill left too little free of live data";

    // Queued before the request on another stream: after a spin, every live block rewritten
    // with a second pattern. The device sync must let it finish before any page is copied.
    Event filled;
    CUDA_OK(cudaEventRecord(filled.e, a));
    CUDA_OK(cudaStreamWaitEvent(b, filled.e, 0));
    launch_spin(kSlowNs, b);
    for (const ScenarioBlock& blk : f.live) launch_fill(blk.ptr, blk.size, 50000 + blk.index, b);
    const bool busy_before = busy(b);

    const std::int64_t compactions = stat(alloc, "num_compactions");
    const std::int64_t staged = stat(alloc, "num_staged_compactions");
    const std::int64_t copied = stat(alloc, "compacted_bytes");
    const std::int64_t syncs = stat(alloc, "num_device_syncs");
    void* big = nullptr;
    try {
      big = alloc.allocate(want, a, 0);
    } catch (const stitch::out_of_memory& e) {
      ADD_FAILURE() << "a request of every granule free of live data failed:\n" << e.what();
    }
    EXPECT_FALSE(busy(b)) << "compaction returned before the device's queued work finished";
    EXPECT_GT(stat(alloc, "num_compactions"), compactions);
    EXPECT_EQ(stat(alloc, "num_staged_compactions") - staged, room ? 0 : 1);
    EXPECT_GT(stat(alloc, "compacted_bytes"), copied);
    EXPECT_LE(stat(alloc, "compacted_bytes") - copied, static_cast<std::int64_t>(f.live_bytes()));
    EXPECT_EQ(stat(alloc, "num_device_syncs"), syncs + 1);
    EXPECT_LE(stat(alloc, "reserved_bytes.all.current"), static_cast<std::int64_t>(f.cap));
    EXPECT_NO_THROW(alloc.validate());

    // Every live block holds the second pattern at its old address; the new block reads back.
    const auto second = [](const ScenarioBlock& blk) { return 50000 + blk.index; };
    EXPECT_EQ(count_damaged(f.live, second, counter, a), 0);
    if (big != nullptr) {
      launch_fill(big, want, 999, a);
      EXPECT_EQ(counter.count(big, want, 999, a), 0u) << "the compacted-into block does not read back";
      EXPECT_EQ(count_damaged(f.live, second, counter, a), 0) << "writing the new block reached a live one";
    }
    CUDA_OK(cudaGetLastError());
    std::printf("compacted %lld pages (%lld staged), copied %lld bytes; served %zu bytes under a "
                "cap of %zu; %zu live blocks intact; the slow stream was %s at the request\n",
                static_cast<long long>(stat(alloc, "num_compactions") - compactions),
                static_cast<long long>(stat(alloc, "num_staged_compactions") - staged),
                static_cast<long long>(stat(alloc, "compacted_bytes") - copied), want, f.cap,
                f.live.size(), busy_before ? "still running" : "ALREADY DONE (sync not exercised)");
    ::testing::Test::RecordProperty("slow_stream_running_at_request", busy_before ? "yes" : "no");

    if (big != nullptr) alloc.deallocate(big);
    for (const ScenarioBlock& blk : f.live) alloc.deallocate(blk.ptr);
    EXPECT_EQ(stat(alloc, "allocated_bytes.all.current"), 0);
    alloc.empty_cache();
    EXPECT_EQ(stat(alloc, "reserved_bytes.all.current"), 0);
  }
  expect_memory_back(free_at_start, granule);
}

TEST(CudaCompaction, AFullCapStagesThroughHostAndKeepsEveryBlocksData) {
  REQUIRE_CUDA_DEVICE();
  compact_under_kernels(/*room=*/false);
}

TEST(CudaCompaction, FreshDevicePagesTakeTheDataWhenThereIsRoom) {
  REQUIRE_CUDA_DEVICE();
  compact_under_kernels(/*room=*/true);
}

}  // namespace
