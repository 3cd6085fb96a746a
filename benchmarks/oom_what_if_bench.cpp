// benchmarks/oom_what_if_bench.cpp — what an out-of-memory failure costs with the what-if check
// (oom_what_if:True, the default) and without it, after a recorded history of a given length:
// a seeded churn of mixed sizes, then a device filled with 5 MiB blocks of which every other one
// is freed, then an 8 MiB request (a fragmentation failure). Only the failing allocate() is timed.
// 90000 entries is the longest history the check replays (kWhatIfMaxEvents is 100000 entries);
// with 200000 it rebuilds the device's layout instead.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/sim_backend.hpp"

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kCapacity = std::size_t{2000} * kMiB;  // exactly 400 blocks of 5 MiB

auto* const kStream = reinterpret_cast<stitch::stream_t>(0x1);

// Records about `entries` history entries, then leaves the device fragmented.
void run_up_to_the_failure(stitch::Allocator& a, std::size_t entries) {
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<int> log_size(9, 25);  // 512 B .. 32 MiB
  std::vector<void*> live;
  // An alloc and its free record three entries (alloc, free_requested, free_completed).
  for (std::size_t i = 0; i < entries / 3; ++i) {
    if (live.size() >= 64 || (!live.empty() && rng() % 2 == 0)) {
      const std::size_t k = rng() % live.size();
      a.deallocate(live[k]);
      live[k] = live.back();
      live.pop_back();
    }
    live.push_back(a.allocate(std::size_t{1} << log_size(rng), kStream));
  }
  for (void* p : live) a.deallocate(p);
  a.empty_cache();
  std::vector<void*> blocks;
  for (std::size_t i = 0; i < kCapacity / (5 * kMiB); ++i) blocks.push_back(a.allocate(5 * kMiB, kStream));
  for (std::size_t i = 0; i < blocks.size(); i += 2) a.deallocate(blocks[i]);
}

void BM_oom_what_if(benchmark::State& state) {
  const auto entries = static_cast<std::size_t>(state.range(0));
  const bool what_if = state.range(1) != 0;
  const std::string conf = "backend:sim,record_history:True,max_entries:1000000,oom_what_if:" +
                           std::string(what_if ? "True" : "False");
  std::size_t recorded = 0;
  bool named = false;
  for (auto _ : state) {
    state.PauseTiming();
    stitch::SimBackend::Options o;
    o.capacity = kCapacity;
    auto a = std::make_unique<stitch::Allocator>(stitch::Config::parse(conf),
                                                 std::make_shared<stitch::SimBackend>(o));
    run_up_to_the_failure(*a, entries);
    recorded = a->snapshot().device_traces[0].size();
    state.ResumeTiming();
    try {
      benchmark::DoNotOptimize(a->allocate(8 * kMiB, kStream));
      state.SkipWithError("the request was served: no out-of-memory failure to time");
      break;
    } catch (const stitch::out_of_memory& e) {
      named = std::string(e.what()).find("would have served") != std::string::npos;
    }
    state.PauseTiming();
    a.reset();
    state.ResumeTiming();
  }
  state.counters["recorded_entries"] = static_cast<double>(recorded);
  state.counters["config_named"] = named ? 1 : 0;
}
BENCHMARK(BM_oom_what_if)
    ->ArgsProduct({{1000, 10000, 90000, 200000}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);

}  // namespace
