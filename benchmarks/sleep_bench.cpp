// benchmarks/sleep_bench.cpp — the CPU cost of a sleep and of a wake of region-tagged memory on
// the simulated device, per GiB: one stitch_sleep of the tag, timed, then its wake, timed.
// Without backup (the KV cache) and with it (weights: pinned host memory and the copies). CPU
// time is the calling thread's (user and system). Args {GiB, backup, touched}: with `touched`,
// every 4 KiB page of the tag is written before each sleep, so that the host kernel really holds
// the memory and really releases it (the simulator unmaps it and punches the memfd's pages out
// when a handle is released): the kernel's page release included. Untouched, the device's pages
// are sparse and the time is the allocator's own work and the calls it makes.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

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
  const bool touched = state.range(2) != 0;
  Tagged t(gib * GiB, backup);
  for (auto _ : state) {
    state.PauseTiming();
    if (touched) t.touch();
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

/// The host kernel's floor for what a touched sleep releases, in the same run: a memfd of {GiB},
/// every 4 KiB page written through a shared mapping, then (timed) the mapping replaced by
/// PROT_NONE and the file's pages punched out, as the simulator's unmap and release do.
void BM_kernel_page_release(benchmark::State& state) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0)) * GiB;
  const int fd = ::memfd_create("stitch-bench", MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    state.SkipWithError("memfd_create/ftruncate failed");
    return;
  }
  void* va = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  for (auto _ : state) {
    state.PauseTiming();
    auto* p = static_cast<char*>(
        ::mmap(va, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0));
    for (std::size_t off = 0; off < bytes; off += 4096) p[off] = 1;
    state.ResumeTiming();
    (void)::mmap(va, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    (void)::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(bytes));
  }
  ::munmap(va, bytes);
  ::close(fd);
  state.counters["cpu_ms_per_GiB"] = benchmark::Counter(
      1e-3 * static_cast<double>(state.range(0)),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_kernel_page_release)->Arg(1)->Unit(benchmark::kMillisecond)->Iterations(3);

void BM_sleep(benchmark::State& state) { sleep_or_wake(state, false); }
void BM_wake(benchmark::State& state) { sleep_or_wake(state, true); }

// {GiB, backup, touched}
BENCHMARK(BM_sleep)->Args({1, 0, 0})->Args({10, 0, 0})->Args({1, 0, 1})->Args({10, 0, 1})
    ->Args({1, 1, 1})->Args({4, 1, 1})->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_wake)->Args({1, 0, 0})->Args({10, 0, 0})->Args({1, 0, 1})->Args({10, 0, 1})
    ->Args({1, 1, 1})->Args({4, 1, 1})->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace
