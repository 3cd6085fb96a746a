// benchmarks/gpu/stitch_cost.cpp — what a stitch costs on a GPU (stitch_cost/* in
// stitch_gpu_bench), next to what the same bytes cost from cudaMalloc and from growing an
// expandable segment, in the same run. N = 8, 32 and 128 granules (16, 64 and 256 MiB with 2 MiB
// granules). Host wall time (manual time), one call per iteration:
//
//   stitch_cost/stitch/<N>pages      per iteration, on a fresh allocator (untimed): the adversarial
//       scenario of tests/support/stitch_scenario.hpp under a 1 GiB cap (a quarter of the free
//       memory if less): filled, every other block freed, the cap lowered to what is reserved.
//       Timed: the allocate of N granules, which must be a stitch (else the benchmark errors):
//       the allocator's stream sync, the unmap of each source run, N maps into a new range.
//       free_ns: deallocate + empty_cache of that block once every other free page has been
//       given back (untimed), i.e. what dissolving it costs: unmapping and releasing its N pages
//       and its reservation. source_runs: unmap calls per stitch.
//   stitch_cost/grow/<N>pages        the same settings without a cap: an expandable segment (one
//       live granule keeps its range) grows by N fresh granules; free_ns: deallocate +
//       empty_cache, which unmaps and releases them.
//   stitch_cost/cudaMalloc/<N>pages  cudaMalloc of the same bytes; free_ns: its cudaFree.
//
// Counters: pages, bytes, free_ns (mean per iteration), source_runs (stitch only). Nothing is
// queued on the stream, so the syncs cost the call alone. scripts/gpu_report_stitch.py turns
// these into the report's "Stitch cost" section (per stitch, per granule, ratios).
#include "stitch_cost.hpp"

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "peers.hpp"
#include "stitch/stitch.hpp"
#include "support/stitch_scenario.hpp"

namespace stitch_bench {
namespace {

using namespace stitch::test;
using Clock = std::chrono::steady_clock;

constexpr int kStitchIterations = 5;  // each builds the scenario (about 512 granules mapped)
constexpr int kCallIterations = 20;
constexpr std::size_t kCapAtMost = std::size_t{1} << 30;

double ns_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

std::int64_t stat(const stitch::Allocator& a, const char* key) {
  const auto v = a.stat(0, key);
  if (!v) throw std::runtime_error(std::string("no stat ") + key);
  return *v;
}

stitch::Config scenario_config() {
  return stitch::Config::parse(std::string("backend:cuda,") + kScenarioConf);
}

/// The CUDA back end's granularity on device 0 (the size of one stitching page); throws when
/// the device cannot map pages.
std::size_t granule() {
  static const std::size_t g = [] {
    const auto backend = stitch::make_backend(scenario_config());
    if (!backend->supports_virtual_memory(0))
      throw std::runtime_error("device 0 has no virtual memory management (stitching needs it)");
    return backend->granularity(0);
  }();
  return g;
}

void set_counters(benchmark::State& state, std::size_t pages, std::size_t bytes, double free_ns) {
  state.counters["pages"] = benchmark::Counter(static_cast<double>(pages));
  state.counters["bytes"] = benchmark::Counter(static_cast<double>(bytes));
  state.counters["free_ns"] = benchmark::Counter(free_ns, benchmark::Counter::kAvgIterations);
}

struct StitchTimes {
  double stitch_ns = 0;
  double free_ns = 0;
  std::int64_t runs = 0;
};

/// One scenario on a fresh allocator: the stitch of `pages` granules and its dissolving, timed.
StitchTimes stitch_once(cudaStream_t stream, std::size_t pages) {
  const std::size_t page = granule();
  stitch::Allocator alloc(scenario_config());
  const std::size_t cap = scenario_cap(alloc.backend().memory_info(0).free, page, kCapAtMost);
  Fragmentation f = fragment(
      alloc, stream, page, cap, [](const ScenarioBlock&) {},
      [&](std::size_t, const ScenarioBlock& b) { alloc.deallocate(b.ptr); });
  StitchTimes t;
  void* big = nullptr;
  try {
    if (f.freed_pages_at_least(page) < pages * page)
      throw std::runtime_error("the scenario under a cap of " + std::to_string(cap) + " bytes frees " +
                               std::to_string(f.freed_pages_at_least(page) / page) +
                               " granules at least, fewer than " + std::to_string(pages));
    const std::int64_t stitches = stat(alloc, "num_stitches");
    const std::int64_t unmaps = stat(alloc, "num_device_free");
    const Clock::time_point t0 = Clock::now();
    big = alloc.allocate(pages * page, stream, 0);
    t.stitch_ns = ns_since(t0);
    if (stat(alloc, "num_stitches") != stitches + 1)
      throw std::runtime_error("the request was not served by a stitch");
    t.runs = stat(alloc, "num_device_free") - unmaps;
    alloc.empty_cache(0);  // every other free page goes back; the stitched block stays
    const Clock::time_point t1 = Clock::now();
    alloc.deallocate(big);
    big = nullptr;
    alloc.empty_cache(0);  // unmaps and releases its pages, then its reservation
    t.free_ns = ns_since(t1);
  } catch (...) {
    if (big != nullptr) alloc.deallocate(big);
    for (const ScenarioBlock& b : f.kept) alloc.deallocate(b.ptr);
    throw;
  }
  for (const ScenarioBlock& b : f.kept) alloc.deallocate(b.ptr);
  alloc.empty_cache(0);
  return t;
}

void bm_stitch(benchmark::State& state, cudaStream_t stream, std::size_t pages) {
  try {
    double free_ns = 0;
    std::int64_t runs = 0;
    for (auto _ : state) {
      const StitchTimes t = stitch_once(stream, pages);
      state.SetIterationTime(t.stitch_ns * 1e-9);
      free_ns += t.free_ns;
      runs += t.runs;
    }
    set_counters(state, pages, pages * granule(), free_ns);
    state.counters["source_runs"] =
        benchmark::Counter(static_cast<double>(runs), benchmark::Counter::kAvgIterations);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void bm_grow(benchmark::State& state, cudaStream_t stream, std::size_t pages) {
  try {
    const std::size_t bytes = pages * granule();
    stitch::Allocator alloc(scenario_config());
    void* pin = alloc.allocate(granule(), stream, 0);  // keeps the range reserved between grows
    double free_ns = 0;
    try {
      for (auto _ : state) {
        const std::int64_t reserved = stat(alloc, "reserved_bytes.all.current");
        const Clock::time_point t0 = Clock::now();
        void* p = alloc.allocate(bytes, stream, 0);
        state.SetIterationTime(ns_since(t0) * 1e-9);
        const std::int64_t grown = stat(alloc, "reserved_bytes.all.current") - reserved;
        const Clock::time_point t1 = Clock::now();
        alloc.deallocate(p);
        alloc.empty_cache(0);
        free_ns += ns_since(t1);
        if (grown != static_cast<std::int64_t>(bytes))
          throw std::runtime_error("the request grew the range by " + std::to_string(grown) +
                                   " bytes, not by its " + std::to_string(bytes));
      }
    } catch (...) {
      alloc.deallocate(pin);
      throw;
    }
    alloc.deallocate(pin);
    alloc.empty_cache(0);
    set_counters(state, pages, bytes, free_ns);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void bm_cuda_malloc(benchmark::State& state, std::size_t pages) {
  try {
    const std::size_t bytes = pages * granule();
    double free_ns = 0;
    for (auto _ : state) {
      void* p = nullptr;
      const Clock::time_point t0 = Clock::now();
      check(cudaMalloc(&p, bytes), "cudaMalloc");
      state.SetIterationTime(ns_since(t0) * 1e-9);
      const Clock::time_point t1 = Clock::now();
      check(cudaFree(p), "cudaFree");
      free_ns += ns_since(t1);
    }
    set_counters(state, pages, bytes, free_ns);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

}  // namespace

void register_stitch_cost(cudaStream_t stream) {
  for (std::size_t pages : {8, 32, 128}) {
    const std::string n = std::to_string(pages) + "pages";
    benchmark::RegisterBenchmark(("stitch_cost/stitch/" + n).c_str(),
                                 [stream, pages](benchmark::State& s) { bm_stitch(s, stream, pages); })
        ->UseManualTime()->Iterations(kStitchIterations)->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("stitch_cost/grow/" + n).c_str(),
                                 [stream, pages](benchmark::State& s) { bm_grow(s, stream, pages); })
        ->UseManualTime()->Iterations(kCallIterations)->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("stitch_cost/cudaMalloc/" + n).c_str(),
                                 [pages](benchmark::State& s) { bm_cuda_malloc(s, pages); })
        ->UseManualTime()->Iterations(kCallIterations)->Unit(benchmark::kMicrosecond);
  }
}

}  // namespace stitch_bench
