// benchmarks/mix_bench.cpp — the cache-hit pair as training steps make it: sizes in turn
// (4 KiB, 64 KiB, 1 MiB, 8 MiB: activations, gradients, workspace), not one size again and again,
// with glibc's pair of the same sizes in the same binary as the reference:
//   *_mix          one thread, the four sizes in turn, each allocated and freed (Arg: the live
//                  working set held around the pairs: 0 or 64 blocks of 16 KiB to 32 MiB;
//                  BM_stitch_mix's second Arg 1: the cache hit off: the device lock serves every request);
//   *_mix_threads  1, 2, 4 and 8 threads, each doing the same around its own working set of 8
//                  live blocks (16 KiB to 2 MiB); Arg 0: each thread on its own stream, 1: all on
//                  the null stream, 2: own streams on two devices (thread i on device i % 2). Wall
//                  time per pair and thread, and CPU time per pair.
//   *_trace_mix   the requests of a real training step in turn (below).
// The same-size pair stays in alloc_bench.cpp (BM_*_pair). stitch runs on the simulated device, so
// no device call is ever timed: this is the allocator.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <utility>
#include <string>
#include <vector>

#include "core/device_allocator.hpp"
#include "stitch/allocator.hpp"
#include "stitch/stitch.h"
#include "peers/src/trace_sizes.hpp"

namespace {

constexpr std::size_t kMix[4] = {std::size_t{4} << 10, std::size_t{64} << 10, std::size_t{1} << 20,
                                 std::size_t{8} << 20};
constexpr const char* kConf = "backend:sim,sim_capacity_mb:65536,sim_devices:2";

bool configure_capi(benchmark::State& state) {
  if (stitch_configure(kConf) != 0 &&
      std::string(stitch_last_error()).find("fixed") == std::string::npos) {
    state.SkipWithError(stitch_last_error());
    return false;
  }
  return true;
}

/// `count` live blocks of 16 KiB to 32 MiB (sizes cycling through powers of two), allocated by
/// `alloc`, freed by `release` at the end of the scope.
template <typename Alloc, typename Release>
struct WorkingSet {
  WorkingSet(std::size_t count, Alloc alloc, Release release) : release_(release) {
    for (std::size_t i = 0; i < count; ++i) {
      const std::size_t size = (std::size_t{16} << 10) << (i % 12);
      blocks_.push_back({alloc(size), size});
    }
  }
  ~WorkingSet() {
    for (const auto& [p, size] : blocks_) release_(p, size);
  }
  Release release_;
  std::vector<std::pair<void*, std::size_t>> blocks_;
};

void BM_glibc_mix(benchmark::State& state) {
  WorkingSet live(static_cast<std::size_t>(state.range(0)), [](std::size_t n) { return malloc(n); },
                  [](void* p, std::size_t) { free(p); });
  for (std::size_t s : kMix) free(malloc(s));
  std::size_t i = 0;
  for (auto _ : state) {
    void* p = malloc(kMix[i++ & 3]);
    benchmark::DoNotOptimize(p);
    free(p);
  }
}
BENCHMARK(BM_glibc_mix)->Arg(0)->Arg(64);

void BM_stitch_mix(benchmark::State& state) {
  stitch::Allocator a(stitch::Config::parse("backend:sim,sim_capacity_mb:65536"));
  if (state.range(1) != 0) a.device(0).set_cache_hit(false);
  WorkingSet live(static_cast<std::size_t>(state.range(0)), [&](std::size_t n) { return a.allocate(n); },
                  [&](void* p, std::size_t) { a.deallocate(p); });
  for (std::size_t s : kMix) a.deallocate(a.allocate(s));
  std::size_t i = 0;
  for (auto _ : state) {
    void* p = a.allocate(kMix[i++ & 3]);
    benchmark::DoNotOptimize(p);
    a.deallocate(p);
  }
}
// Arg 1: the cache hit off (every request takes the device lock).
BENCHMARK(BM_stitch_mix)->Args({0, 0})->Args({64, 0})->Args({0, 1})->Args({64, 1});

void BM_stitch_capi_mix(benchmark::State& state) {
  if (!configure_capi(state)) return;
  WorkingSet live(static_cast<std::size_t>(state.range(0)),
                  [](std::size_t n) { return stitch_malloc(n, 0, nullptr); },
                  [](void* p, std::size_t n) { stitch_free(p, n, 0, nullptr); });
  for (std::size_t s : kMix) stitch_free(stitch_malloc(s, 0, nullptr), s, 0, nullptr);
  std::size_t i = 0;
  for (auto _ : state) {
    const std::size_t size = kMix[i++ & 3];
    void* p = stitch_malloc(size, 0, nullptr);
    benchmark::DoNotOptimize(p);
    stitch_free(p, size, 0, nullptr);
  }
}
BENCHMARK(BM_stitch_capi_mix)->Arg(0)->Arg(64);

// ---- a real trace's sizes -------------------------------------------------------------------------
// The 6,771 requests of a real training step in order (peers/src/trace_sizes.hpp: cs336-ctx128-
// fullstep, 25 sizes from 1 B to 157 MiB). Arg 0: each allocated and freed at once; Arg 8: a
// window of 8 live blocks (each request frees the block of 8 requests before).

template <typename Alloc, typename Release>
void trace_pairs(benchmark::State& state, Alloc alloc, Release release) {
  constexpr std::size_t n = std::size(pb::kTraceSizes);
  const auto window = static_cast<std::size_t>(state.range(0));
  std::vector<std::pair<void*, std::size_t>> live(window == 0 ? 1 : window);
  for (std::size_t s : pb::kTraceSizes) release(alloc(s), s);  // warm: every size once
  std::size_t i = 0;
  for (auto _ : state) {
    const std::size_t size = pb::kTraceSizes[i % n];
    void* p = alloc(size);
    benchmark::DoNotOptimize(p);
    auto& slot = live[window == 0 ? 0 : i % window];
    if (window == 0) {
      release(p, size);
    } else {
      if (slot.first != nullptr) release(slot.first, slot.second);
      slot = {p, size};
    }
    ++i;
  }
  for (auto& [p, size] : live)
    if (p != nullptr) release(p, size);
}

void BM_glibc_trace_mix(benchmark::State& state) {
  trace_pairs(state, [](std::size_t n) { return malloc(n); }, [](void* p, std::size_t) { free(p); });
}
BENCHMARK(BM_glibc_trace_mix)->Arg(0)->Arg(8);

void BM_stitch_capi_trace_mix(benchmark::State& state) {
  if (!configure_capi(state)) return;
  trace_pairs(state, [](std::size_t n) { return stitch_malloc(n, 0, nullptr); },
              [](void* p, std::size_t n) { stitch_free(p, n, 0, nullptr); });
}
BENCHMARK(BM_stitch_capi_trace_mix)->Arg(0)->Arg(8);

// ---- threads ------------------------------------------------------------------------------------

void thread_args(benchmark::internal::Benchmark* b) {
  b->UseRealTime()->MeasureProcessCPUTime();
  for (int t : {1, 2, 4, 8}) b->Threads(t);
}

constexpr std::size_t kThreadLive = 8;  // each thread's working set

void BM_glibc_mix_threads(benchmark::State& state) {
  WorkingSet live(kThreadLive, [](std::size_t n) { return malloc(n); }, [](void* p, std::size_t) { free(p); });
  std::size_t i = static_cast<std::size_t>(state.thread_index());
  for (auto _ : state) {
    void* p = malloc(kMix[i++ & 3]);
    benchmark::DoNotOptimize(p);
    free(p);
  }
}
BENCHMARK(BM_glibc_mix_threads)->Apply(thread_args);

void BM_stitch_capi_mix_threads(benchmark::State& state) {
  if (!configure_capi(state)) return;
  const int mode = static_cast<int>(state.range(0));
  const int t = state.thread_index();
  void* stream = mode == 1 ? nullptr : reinterpret_cast<void*>(static_cast<std::uintptr_t>(t + 1) * 0x100);
  const int device = mode == 2 ? t % 2 : 0;
  WorkingSet live(kThreadLive, [&](std::size_t n) { return stitch_malloc(n, device, stream); },
                  [&](void* p, std::size_t n) { stitch_free(p, n, device, stream); });
  for (std::size_t s : kMix) stitch_free(stitch_malloc(s, device, stream), s, device, stream);
  std::size_t i = static_cast<std::size_t>(t);
  for (auto _ : state) {
    const std::size_t size = kMix[i++ & 3];
    void* p = stitch_malloc(size, device, stream);
    benchmark::DoNotOptimize(p);
    stitch_free(p, size, device, stream);
  }
}
BENCHMARK(BM_stitch_capi_mix_threads)->Arg(0)->Arg(1)->Arg(2)->Apply(thread_args);

}  // namespace
