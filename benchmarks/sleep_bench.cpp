// benchmarks/sleep_bench.cpp — the CPU cost of a sleep and of a wake of region-tagged memory on
// the simulated device, per GiB: every page of the tag touched first (so the host kernel really
// holds the memory and really releases it: the simulator punches the memfd's pages out when a
// handle is released), then one stitch_sleep of the tag, timed, then its wake, timed. Without
// backup (the KV cache) and with it (weights: pinned host memory and the copies). CPU time is the
// calling thread's (user and system), the kernel's page release included.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/config.hpp"
#include "stitch/sim_backend.hpp"

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;
constexpr std::size_t kBlock = 64 * MiB;

struct Tagged {
  std::shared_ptr<stitch::SimBackend> sim;
  std::unique_ptr<stitch::Allocator> alloc;
  std::vector<void*> blocks;

  Tagged(std::size_t bytes, bool backup) {
    stitch::SimBackend::Options o;
    o.capacity = bytes + 2 * GiB;
    sim = std::make_shared<stitch::SimBackend>(o);
    alloc = std::make_unique<stitch::Allocator>(stitch::Config::parse("backend:sim"), sim);
    stitch::Allocator::Region r(*alloc, "bench", backup);
    for (std::size_t done = 0; done < bytes; done += kBlock) blocks.push_back(alloc->allocate(kBlock));
  }
  ~Tagged() {
    for (void* p : blocks) alloc->deallocate(p);
  }
  /// Every 4 KiB page written: the host now holds all of it.
  void touch() {
    for (void* p : blocks)
      for (std::size_t off = 0; off < kBlock; off += 4096) static_cast<char*>(p)[off] = 1;
  }
};

void sleep_or_wake(benchmark::State& state, bool time_wake) {
  const std::size_t gib = static_cast<std::size_t>(state.range(0));
  const bool backup = state.range(1) != 0;
  Tagged t(gib * GiB, backup);
  for (auto _ : state) {
    state.PauseTiming();
    t.touch();
    if (time_wake) t.alloc->sleep(0, "bench");
    state.ResumeTiming();
    if (time_wake) {
      t.alloc->wake(0, "bench");
    } else {
      t.alloc->sleep(0, "bench");
    }
    state.PauseTiming();
    if (!time_wake) t.alloc->wake(0, "bench");
    state.ResumeTiming();
  }
  state.counters["GiB"] = static_cast<double>(gib);
  state.counters["cpu_ms_per_GiB"] = benchmark::Counter(
      1e-3 * static_cast<double>(gib), benchmark::Counter::kIsIterationInvariantRate |
                                          benchmark::Counter::kInvert);
}

void BM_sleep(benchmark::State& state) { sleep_or_wake(state, false); }
void BM_wake(benchmark::State& state) { sleep_or_wake(state, true); }

// {GiB, backup}
BENCHMARK(BM_sleep)->Args({1, 0})->Args({10, 0})->Args({1, 1})->Args({4, 1})
    ->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_wake)->Args({1, 0})->Args({10, 0})->Args({1, 1})->Args({4, 1})
    ->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace
