// tests/cuda/cuda_allocator_test.cu — GPU-only tests of stitch::Allocator on backend:cuda with
// real kernels: several streams writing, freeing and reallocating concurrently; record_stream
// against a slow kernel on another stream; expandable segments growing and shrinking while
// kernels run. Every test first asks the CUDA runtime for a device and skips (GTEST_SKIP) with
// the reason when there is none, so the binary runs, lists and skips on a machine without a GPU
// or driver. Nothing here runs on the simulated device. Helpers: cuda_test_util.cuh.
#include <atomic>
#include <cmath>
#include <mutex>
#include <random>
#include <thread>

#include "cuda_test_util.cuh"

namespace {

using namespace stitch_cuda_test;

// ---- (a) several streams writing, freeing and reallocating concurrently ----------------------------

TEST(CudaAllocator, MultiStreamStressEveryByteChecked) {
  REQUIRE_CUDA_DEVICE();
  CUDA_OK(cudaSetDevice(0));
  constexpr int kStreams = 4;
  constexpr int kRounds = 400;
  constexpr std::size_t kMaxLivePerThread = 40;
  Streams streams(kStreams);  // declared first: the streams outlive the allocator
  stitch::Allocator alloc(stitch::Config::parse("backend:cuda"));
  std::atomic<std::uint32_t> next_seed{1};
  std::mutex mu;
  std::vector<std::string> errors;
  std::vector<std::vector<LiveBlock>> live(kStreams);
  std::atomic<int> cross_stream_uses{0};

  auto worker = [&](int t) {
    try {
      cuda_check(cudaSetDevice(0), "cudaSetDevice");
      std::mt19937_64 rng(1234 + t);
      std::uniform_real_distribution<double> unit(0.0, 1.0);
      cudaStream_t own = streams.s[t];
      auto& mine = live[t];
      for (int round = 0; round < kRounds; ++round) {
        const bool do_alloc = mine.size() < 8 || (mine.size() < kMaxLivePerThread && unit(rng) < 0.55);
        if (do_alloc) {
          // Log-uniform from 1 byte to 8 MiB, sometimes 24 MiB (a dedicated large segment).
          std::size_t size = static_cast<std::size_t>(std::exp(unit(rng) * std::log(8.0 * kMiB)));
          if (unit(rng) < 0.03) size = 24 * kMiB + 123;
          size = std::max<std::size_t>(size, 1);
          void* p = alloc.allocate(size, own, 0);
          if (p == nullptr) throw std::runtime_error("allocate returned nullptr");
          const std::uint32_t seed = next_seed.fetch_add(1);
          // Sometimes a delay first, so the writes land late and overlap other streams' work.
          if (unit(rng) < 0.2) launch_spin(20000 + static_cast<unsigned long long>(unit(rng) * 200000), own);
          if (unit(rng) < 0.15) {
            // Used on another stream: that stream waits for the allocation, writes the block,
            // and record_stream tells stitch not to reuse it before that write completes.
            const int u = (t + 1 + static_cast<int>(unit(rng) * (kStreams - 1))) % kStreams;
            cudaEvent_t ready = nullptr;
            cuda_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
            cuda_check(cudaEventRecord(ready, own), "cudaEventRecord");
            cuda_check(cudaStreamWaitEvent(streams.s[u], ready, 0), "cudaStreamWaitEvent");
            cuda_check(cudaEventDestroy(ready), "cudaEventDestroy");
            if (unit(rng) < 0.5) launch_spin(50000, streams.s[u]);
            launch_fill(p, size, seed, streams.s[u]);
            alloc.record_stream(p, streams.s[u]);
            cross_stream_uses.fetch_add(1);
          } else {
            launch_fill(p, size, seed, own);
          }
          mine.push_back({p, size, seed});
        } else {
          // Free a random live block right away: its kernel may still be queued or running.
          const std::size_t i = static_cast<std::size_t>(unit(rng) * mine.size()) % mine.size();
          alloc.deallocate(mine[i].ptr);
          mine[i] = mine.back();
          mine.pop_back();
        }
      }
    } catch (const std::exception& e) {
      std::lock_guard lock(mu);
      errors.push_back("stream " + std::to_string(t) + ": " + e.what());
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kStreams; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  for (const auto& e : errors) ADD_FAILURE() << e;
  ASSERT_TRUE(errors.empty());

  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaGetLastError());
  std::size_t blocks = 0;
  std::size_t bytes = 0;
  for (int t = 0; t < kStreams; ++t) {
    for (const LiveBlock& b : live[t]) {
      const std::string bad = verify_block(b.ptr, b.size, b.seed);
      EXPECT_TRUE(bad.empty()) << bad;
      ++blocks;
      bytes += b.size;
    }
  }
  std::printf("verified %zu live blocks (%zu bytes); %d cross-stream uses; reserved peak %lld\n",
              blocks, bytes, cross_stream_uses.load(),
              static_cast<long long>(stat(alloc, "reserved_bytes.all.peak")));
  EXPECT_NO_THROW(alloc.validate());
  for (int t = 0; t < kStreams; ++t)
    for (const LiveBlock& b : live[t]) alloc.deallocate(b.ptr);
  EXPECT_EQ(stat(alloc, "allocated_bytes.all.current"), 0);
  alloc.empty_cache();
  EXPECT_EQ(stat(alloc, "reserved_bytes.all.current"), 0);
  EXPECT_NO_THROW(alloc.validate());
  CUDA_OK(cudaDeviceSynchronize());
}

// ---- (b) record_stream / free-on-stream against a slow kernel --------------------------------------

constexpr unsigned long long kSlowNs = 50ull * 1000 * 1000;  // 50 ms

/// Allocates on A, has a slow kernel on B write the block at the end of its spin, then frees it
/// (`use_record_stream`: record_stream(p, B) + deallocate(p); else deallocate(p, B)). The next
/// allocation of that size on A must not get the block while B is busy; after B finishes it may.
void slow_other_stream_case(bool use_record_stream) {
  Streams st(2);  // declared first: the streams outlive the allocator
  stitch::Allocator alloc(stitch::Config::parse("backend:cuda"));
  cudaStream_t a = st.s[0];
  cudaStream_t b = st.s[1];
  const std::size_t size = 4 * kMiB;
  const std::uint32_t seed_a1 = 11, seed_b = 22, seed_a2 = 33, seed_a3 = 44;

  void* p1 = alloc.allocate(size, a, 0);
  ASSERT_NE(p1, nullptr);
  launch_fill(p1, size, seed_a1, a);
  cudaEvent_t filled = nullptr;
  CUDA_OK(cudaEventCreateWithFlags(&filled, cudaEventDisableTiming));
  CUDA_OK(cudaEventRecord(filled, a));
  CUDA_OK(cudaStreamWaitEvent(b, filled, 0));
  launch_spin(kSlowNs, b);           // B is busy for ~50 ms ...
  launch_fill(p1, size, seed_b, b);  // ... then writes p1.
  if (use_record_stream) {
    alloc.record_stream(p1, b);
    alloc.deallocate(p1);
  } else {
    alloc.deallocate(p1, b);
  }

  // While B is busy: same size on A, several times. None may overlap p1.
  std::vector<void*> during;
  for (int i = 0; i < 3; ++i) {
    void* p = alloc.allocate(size, a, 0);
    ASSERT_NE(p, nullptr);
    const auto lo = reinterpret_cast<std::uintptr_t>(p);
    const auto p1_lo = reinterpret_cast<std::uintptr_t>(p1);
    EXPECT_TRUE(lo + size <= p1_lo || p1_lo + size <= lo)
        << "allocation " << i << " (" << p << ") overlaps the block still in use on stream B ("
        << p1 << ")";
    launch_fill(p, size, seed_a2 + i, a);
    during.push_back(p);
  }
  const cudaError_t busy = cudaStreamQuery(b);
  (void)cudaGetLastError();
  EXPECT_EQ(busy, cudaErrorNotReady)
      << "stream B finished before the reallocation: the race window was not exercised";
  EXPECT_EQ(stat(alloc, "num_sync_all_streams"), 0) << "stitch waited for all streams";

  CUDA_OK(cudaStreamSynchronize(a));
  for (int i = 0; i < 3; ++i) {
    const std::string bad = verify_block(during[i], size, seed_a2 + i);
    EXPECT_TRUE(bad.empty()) << "block allocated while B was busy: " << bad;
  }
  CUDA_OK(cudaStreamSynchronize(b));
  {
    const std::string bad = verify_block(p1, size, seed_b);
    EXPECT_TRUE(bad.empty()) << "the block B wrote: " << bad;
  }

  // B is done: the block may be reused now (stitch polls events on allocate), and reuse is safe.
  void* p3 = alloc.allocate(size, a, 0);
  ASSERT_NE(p3, nullptr);
  EXPECT_EQ(p3, p1) << "after B finished, the freed block was expected to be reused (best fit)";
  launch_fill(p3, size, seed_a3, a);
  CUDA_OK(cudaStreamSynchronize(a));
  {
    const std::string bad = verify_block(p3, size, seed_a3);
    EXPECT_TRUE(bad.empty()) << "reused block: " << bad;
  }
  for (int i = 0; i < 3; ++i) {
    const std::string bad = verify_block(during[i], size, seed_a2 + i);
    EXPECT_TRUE(bad.empty()) << "neighbour of the reused block: " << bad;
  }
  for (void* p : during) alloc.deallocate(p);
  alloc.deallocate(p3);
  EXPECT_NO_THROW(alloc.validate());
  CUDA_OK(cudaEventDestroy(filled));
  CUDA_OK(cudaDeviceSynchronize());
}

TEST(CudaAllocator, RecordStreamDefersReuseWhileSlowKernelRuns) {
  REQUIRE_CUDA_DEVICE();
  CUDA_OK(cudaSetDevice(0));
  slow_other_stream_case(/*use_record_stream=*/true);
}

TEST(CudaAllocator, FreeOnOtherStreamDefersReuseWhileSlowKernelRuns) {
  REQUIRE_CUDA_DEVICE();
  CUDA_OK(cudaSetDevice(0));
  slow_other_stream_case(/*use_record_stream=*/false);
}

// ---- (c) expandable segments growing and shrinking under real kernels ------------------------------

TEST(CudaAllocator, ExpandableSegmentsGrowAndShrinkUnderKernels) {
  REQUIRE_CUDA_DEVICE();
  CUDA_OK(cudaSetDevice(0));
  Streams st(1);  // declared first: the stream outlives the allocator
  cudaStream_t s = st.s[0];
  stitch::Allocator alloc(stitch::Config::parse("backend:cuda,expandable_segments:True"));
  if (!alloc.backend().supports_virtual_memory(0)) {
    GTEST_SKIP() << "device 0 has no virtual memory management (expandable segments need it)";
  }

  // Grow: each request is larger than what is left mapped, so the segment maps more pages while
  // the kernels writing the earlier blocks are still running.
  const std::vector<std::size_t> sizes = {2 * kMiB, 6 * kMiB, 14 * kMiB, 30 * kMiB,
                                          62 * kMiB, 126 * kMiB, 254 * kMiB};
  std::vector<LiveBlock> blocks;
  std::int64_t last_reserved = 0;
  std::int64_t last_maps = stat(alloc, "num_device_alloc");
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    void* p = alloc.allocate(sizes[i], s, 0);
    ASSERT_NE(p, nullptr);
    launch_spin(2000000, s);  // 2 ms: the next growth happens while this kernel runs
    launch_fill(p, sizes[i], 100 + static_cast<std::uint32_t>(i), s);
    blocks.push_back({p, sizes[i], 100 + static_cast<std::uint32_t>(i)});
    const std::int64_t reserved = stat(alloc, "reserved_bytes.all.current");
    EXPECT_GE(reserved, last_reserved);
    last_reserved = reserved;
    if (i > 0) {
      // One stream, one pool: the blocks follow each other in one virtual range.
      EXPECT_EQ(static_cast<char*>(blocks[i - 1].ptr) + blocks[i - 1].size, static_cast<char*>(p))
          << "block " << i << " is not right after block " << i - 1;
    }
  }
  EXPECT_GT(stat(alloc, "num_device_alloc"), last_maps) << "growing mapped no pages";
  std::int64_t total = 0;
  for (const auto& b : blocks) total += static_cast<std::int64_t>(b.size);
  EXPECT_GE(last_reserved, total);
  EXPECT_EQ(stat(alloc, "segment.all.current"), 0) << "expandable mappings are not segments";

  // Shrink under kernels: rewrite the middle blocks after a delay, free them at once, and empty
  // the cache right away. stitch must wait for the stream before unmapping (an early unmap would
  // make the kernel fault).
  const std::size_t first_mid = 2, last_mid = 4;  // 14, 30, 62 MiB
  launch_spin(20000000, s);                        // 20 ms
  for (std::size_t i = first_mid; i <= last_mid; ++i) {
    blocks[i].seed += 1000;
    launch_fill(blocks[i].ptr, blocks[i].size, blocks[i].seed, s);
  }
  for (std::size_t i = first_mid; i <= last_mid; ++i) alloc.deallocate(blocks[i].ptr);
  const std::int64_t frees_before = stat(alloc, "num_device_free");
  const std::int64_t reserved_before = stat(alloc, "reserved_bytes.all.current");
  alloc.empty_cache();
  const std::int64_t reserved_after = stat(alloc, "reserved_bytes.all.current");
  EXPECT_LT(reserved_after, reserved_before) << "empty_cache unmapped nothing";
  EXPECT_GT(stat(alloc, "num_device_free"), frees_before);
  CUDA_OK(cudaStreamSynchronize(s));
  CUDA_OK(cudaGetLastError());
  EXPECT_NO_THROW(alloc.validate());
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    if (i >= first_mid && i <= last_mid) continue;
    const std::string bad = verify_block(blocks[i].ptr, blocks[i].size, blocks[i].seed);
    EXPECT_TRUE(bad.empty()) << "kept block " << i << " after unmapping its neighbours: " << bad;
  }

  // Grow again into the hole (and beyond), under kernels; then check every live block.
  std::vector<LiveBlock> again;
  for (std::size_t i = first_mid; i <= last_mid + 1; ++i) {
    const std::size_t size = sizes[i] + 3 * kMiB + 512;
    void* p = alloc.allocate(size, s, 0);
    ASSERT_NE(p, nullptr);
    launch_spin(1000000, s);
    launch_fill(p, size, 500 + static_cast<std::uint32_t>(i), s);
    again.push_back({p, size, 500 + static_cast<std::uint32_t>(i)});
  }
  EXPECT_GT(stat(alloc, "reserved_bytes.all.current"), reserved_after);
  CUDA_OK(cudaStreamSynchronize(s));
  CUDA_OK(cudaGetLastError());
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    if (i >= first_mid && i <= last_mid) continue;
    const std::string bad = verify_block(blocks[i].ptr, blocks[i].size, blocks[i].seed);
    EXPECT_TRUE(bad.empty()) << "block " << i << ": " << bad;
  }
  for (const auto& b : again) {
    const std::string bad = verify_block(b.ptr, b.size, b.seed);
    EXPECT_TRUE(bad.empty()) << "regrown block: " << bad;
  }
  EXPECT_NO_THROW(alloc.validate());

  // Free everything while a last kernel runs; empty_cache gives every page back.
  launch_spin(5000000, s);
  for (const auto& b : again) launch_fill(b.ptr, b.size, b.seed + 7, s);
  for (std::size_t i = 0; i < blocks.size(); ++i)
    if (i < first_mid || i > last_mid) alloc.deallocate(blocks[i].ptr);
  for (const auto& b : again) alloc.deallocate(b.ptr);
  alloc.empty_cache();
  EXPECT_EQ(stat(alloc, "reserved_bytes.all.current"), 0);
  EXPECT_EQ(stat(alloc, "allocated_bytes.all.current"), 0);
  EXPECT_NO_THROW(alloc.validate());
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaGetLastError());
}

}  // namespace
