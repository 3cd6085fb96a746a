// benchmarks/gpu/sleep_cost.cpp — what sleep and wake cost on a GPU (sleep_cost/* in
// stitch_gpu_bench, docs/sleep.md), against the plain pinned host copy bandwidth of the same run.
//
//   sleep_cost/pinned_copy/{d2h,h2d}   cudaMemcpyAsync of 1 GiB between a cudaMalloc buffer and a
//       cudaMallocHost one on the bench stream, timed by CUDA events around each copy: the
//       pinned host copy bandwidth (bytes_per_second, GiB_per_s) that sleep's backups are set
//       against (the goal: backups at 80% of it or more).
//   sleep_cost/sleep/<N>GiB/{backup,nobackup}, sleep_cost/wake/<N>GiB/{backup,nobackup}
//       (N = 1, 10, 50) per iteration, untimed: a fresh stitch::Allocator over backend:cuda (behind
//       TimedBackend of timed_backend.hpp, which times the back-end calls sleep and wake make)
//       allocates N GiB in 256 MiB blocks under a Region (with backup or without) and writes them
//       (cudaMemset), then the device is synchronized. Timed (host wall time, manual time):
//       alloc.sleep(0) — the device sync, the pinned host memory and the copies of the backups,
//       every page unmapped and released — and then alloc.wake(0) — fresh pages mapped at the same
//       addresses, the backups copied back, the host memory freed. One pass measures both: the
//       sleep benchmark keeps each iteration's wake, and the wake benchmark of the same size and
//       mode reports those (it runs its own cycles only when the sleep benchmark did not run, e.g.
//       under a --benchmark_filter). Counters: GiB, ms_per_GiB, per kind of back-end call
//       <kind>_calls and <kind>_ns, and for backups backup_GiB_per_s (bytes backed up / the whole
//       sleep; on wake: bytes restored / the whole wake) and copy_GiB_per_s (bytes / the copies'
//       calls and the one stream wait after them). Sizes the device's free memory (cudaMemGetInfo)
//       or, for backups, the host's (MemAvailable) cannot hold with headroom are skipped with an
//       error message that begins with "skipped:".
//
// Fixed iteration counts (2 at 1 GiB, 1 above) keep the set near a minute on an H200.
// scripts/gpu_report_sleep.py turns these into the report's "Sleep and wake cost" section.
#include "sleep_cost.hpp"

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "peers.hpp"
#include "stitch/stitch.hpp"
#include "timed_backend.hpp"

namespace stitch_bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;
constexpr std::size_t kBlock = 256 * kMiB;
constexpr std::size_t kPinnedBytes = kGiB;
constexpr std::size_t kDeviceHeadroom = 2 * kGiB;  // the context, the bench's own buffers
constexpr std::size_t kHostHeadroom = 8 * kGiB;    // the rest of the machine

double ns_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

using K = TimedBackend::Kind;
/// The calls sleep and wake make whose <kind>_calls and <kind>_ns the benchmarks report (those
/// called at least once; TimedBackend tallies more kinds: compaction's).
constexpr std::array<K, 10> kReported = {
    K::sync_device, K::allocate_host, K::copy_to_host_async, K::copy_from_host_async,
    K::sync_stream, K::unmap, K::release, K::create, K::map, K::deallocate_host};

// ---- the pinned host copy bandwidth -------------------------------------------------------------

void bm_pinned_copy(benchmark::State& state, cudaStream_t stream, bool to_host) {
  void* dev = nullptr;
  void* host = nullptr;
  cudaEvent_t begin = nullptr, end = nullptr;
  try {
    check(cudaMalloc(&dev, kPinnedBytes), "cudaMalloc");
    check(cudaMallocHost(&host, kPinnedBytes), "cudaMallocHost");
    check(cudaEventCreate(&begin), "cudaEventCreate");
    check(cudaEventCreate(&end), "cudaEventCreate");
    check(cudaMemsetAsync(dev, 1, kPinnedBytes, stream), "cudaMemsetAsync");
    const cudaMemcpyKind kind = to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
    void* dst = to_host ? host : dev;
    const void* src = to_host ? dev : host;
    check(cudaMemcpyAsync(dst, src, kPinnedBytes, kind, stream), "cudaMemcpyAsync");  // untimed
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    for (auto _ : state) {
      check(cudaEventRecord(begin, stream), "cudaEventRecord");
      check(cudaMemcpyAsync(dst, src, kPinnedBytes, kind, stream), "cudaMemcpyAsync");
      check(cudaEventRecord(end, stream), "cudaEventRecord");
      check(cudaEventSynchronize(end), "cudaEventSynchronize");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, begin, end), "cudaEventElapsedTime");
      state.SetIterationTime(static_cast<double>(ms) * 1e-3);
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                            static_cast<std::int64_t>(kPinnedBytes));
    state.counters["bytes"] = benchmark::Counter(static_cast<double>(kPinnedBytes));
    state.counters["GiB_per_s"] = benchmark::Counter(
        static_cast<double>(state.iterations()) * static_cast<double>(kPinnedBytes) / kGiB,
        benchmark::Counter::kIsRate);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
  if (begin != nullptr) (void)cudaEventDestroy(begin);
  if (end != nullptr) (void)cudaEventDestroy(end);
  if (host != nullptr) (void)cudaFreeHost(host);
  if (dev != nullptr) (void)cudaFree(dev);
}

// ---- one sleep and wake -------------------------------------------------------------------------

struct Phase {
  double wall_ns = 0;
  TimedBackend::Tallies calls{};
};
struct Cycle {
  Phase sleep, wake;
  std::size_t backed_up = 0;  // bytes copied to the host at the sleep
  std::size_t restored = 0;   // and back at the wake
};

/// The host's MemAvailable in bytes (0 when /proc/meminfo cannot be read).
std::size_t host_available() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream s(line.substr(13));
    std::size_t kb = 0;
    s >> kb;
    return kb * 1024;
  }
  return 0;
}

/// "" when `bytes` fit on the device (and, for a backup, in the host), else why not.
std::string does_not_fit(std::size_t bytes, bool backup) {
  std::size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  const auto gib = [](std::size_t b) { return std::to_string(b / kMiB / 1024.0).substr(0, 6) + " GiB"; };
  if (free < bytes + kDeviceHeadroom)
    return "skipped: the device has " + gib(free) + " free, fewer than " + gib(bytes) + " + " +
           gib(kDeviceHeadroom) + " of headroom";
  if (backup) {
    const std::size_t avail = host_available();
    if (avail < bytes + kHostHeadroom)
      return "skipped: the host has " + gib(avail) + " available (MemAvailable), fewer than " +
             gib(bytes) + " of backup + " + gib(kHostHeadroom) + " of headroom";
  }
  return "";
}

Cycle cycle_once(std::size_t bytes, bool backup) {
  const stitch::Config cfg = stitch::Config::parse("backend:cuda");
  auto timed = std::make_shared<TimedBackend>(stitch::make_backend(cfg));
  stitch::Allocator alloc(cfg, timed);
  if (!alloc.backend().supports_virtual_memory(0))
    throw std::runtime_error("device 0 has no virtual memory management (sleep needs it)");
  std::vector<void*> blocks;
  Cycle c;
  bool asleep = false;
  try {
    {
      stitch::Allocator::Region region(alloc, backup ? "weights" : "kv_cache", backup);
      for (std::size_t done = 0; done < bytes; done += kBlock) {
        const std::size_t n = std::min(kBlock, bytes - done);
        void* p = alloc.allocate(n, nullptr, 0);
        blocks.push_back(p);
        check(cudaMemset(p, static_cast<int>(blocks.size() & 0xff), n), "cudaMemset");
      }
    }
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // the writes are not the sleep's
    timed->reset();
    Clock::time_point t0 = Clock::now();
    alloc.sleep(0);
    c.sleep.wall_ns = ns_since(t0);
    asleep = true;
    c.sleep.calls = timed->tallies();
    c.backed_up = c.sleep.calls[TimedBackend::index(K::copy_to_host_async)].bytes;
    if (backup && c.backed_up < bytes)
      throw std::runtime_error("the sleep backed up " + std::to_string(c.backed_up) + " of " +
                               std::to_string(bytes) + " bytes");
    if (alloc.stat(0, "reserved_bytes.all.current").value_or(-1) != 0)
      throw std::runtime_error("reserved bytes are not 0 after the sleep");
    timed->reset();
    t0 = Clock::now();
    alloc.wake(0);
    c.wake.wall_ns = ns_since(t0);
    asleep = false;
    c.wake.calls = timed->tallies();
    c.restored = c.wake.calls[TimedBackend::index(K::copy_from_host_async)].bytes;
  } catch (...) {
    if (asleep) {
      try {
        alloc.wake(0);
      } catch (...) {
      }
    }
    for (void* p : blocks) alloc.deallocate(p);
    throw;
  }
  for (void* p : blocks) alloc.deallocate(p);
  alloc.empty_cache(0);
  return c;
}

/// The cycles of each (GiB, backup) the sleep benchmark measured, for the wake benchmark.
std::map<std::pair<std::size_t, bool>, std::vector<Cycle>>& measured() {
  static std::map<std::pair<std::size_t, bool>, std::vector<Cycle>> m;
  return m;
}

void set_counters(benchmark::State& state, std::size_t gib, const std::vector<Cycle>& cycles,
                  bool wake, bool backup) {
  using C = benchmark::Counter;
  double wall = 0, moved = 0, copy_ns = 0;
  TimedBackend::Tallies sum{};
  for (const Cycle& c : cycles) {
    const Phase& p = wake ? c.wake : c.sleep;
    wall += p.wall_ns;
    moved += static_cast<double>(wake ? c.restored : c.backed_up);
    const K copy_kind = wake ? K::copy_from_host_async : K::copy_to_host_async;
    copy_ns += p.calls[TimedBackend::index(copy_kind)].ns +
               p.calls[TimedBackend::index(K::sync_stream)].ns;
    for (std::size_t k = 0; k < TimedBackend::kKinds; ++k) {
      sum[k].calls += p.calls[k].calls;
      sum[k].ns += p.calls[k].ns;
    }
  }
  const double n = static_cast<double>(cycles.size());
  state.counters["GiB"] = C(static_cast<double>(gib));
  state.counters["ms_per_GiB"] = C(wall / n / 1e6 / static_cast<double>(gib));
  state.counters["moved_bytes"] = C(moved / n);
  if (backup && wall > 0) {
    state.counters["backup_GiB_per_s"] = C(moved / kGiB / (wall * 1e-9));
    if (copy_ns > 0) state.counters["copy_GiB_per_s"] = C(moved / kGiB / (copy_ns * 1e-9));
  }
  for (const K kind : kReported) {
    const std::size_t k = TimedBackend::index(kind);
    if (sum[k].calls == 0) continue;
    const std::string name = TimedBackend::kNames[k];
    state.counters[name + "_calls"] = C(static_cast<double>(sum[k].calls) / n);
    state.counters[name + "_ns"] = C(sum[k].ns / n);
  }
}

void bm_sleep_wake(benchmark::State& state, std::size_t gib, bool backup, bool wake) {
  try {
    const std::size_t bytes = gib * kGiB;
    if (const std::string why = does_not_fit(bytes, backup); !why.empty()) {
      state.SkipWithError(why.c_str());
      return;
    }
    std::vector<Cycle>& mine = measured()[{gib, backup}];
    if (!wake) mine.clear();
    const bool reuse = wake && static_cast<std::int64_t>(mine.size()) >= state.max_iterations;
    std::vector<Cycle> used;
    for (auto _ : state) {
      const Cycle c = reuse ? mine[used.size()] : cycle_once(bytes, backup);
      if (!wake) mine.push_back(c);
      state.SetIterationTime((wake ? c.wake.wall_ns : c.sleep.wall_ns) * 1e-9);
      used.push_back(c);
    }
    if (used.empty()) return;
    set_counters(state, gib, used, wake, backup);
    state.counters["reused_sleep_cycles"] = benchmark::Counter(reuse ? 1.0 : 0.0);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

}  // namespace

void register_sleep_cost(cudaStream_t stream) {
  for (const bool to_host : {true, false}) {
    benchmark::RegisterBenchmark(
        (std::string("sleep_cost/pinned_copy/") + (to_host ? "d2h" : "h2d")).c_str(),
        [stream, to_host](benchmark::State& s) { bm_pinned_copy(s, stream, to_host); })
        ->UseManualTime()->Iterations(5)->Unit(benchmark::kMillisecond);
  }
  for (const std::size_t gib : {1, 10, 50}) {
    for (const bool backup : {true, false}) {
      for (const bool wake : {false, true}) {  // the sleep first: the wake reuses its cycles
        benchmark::RegisterBenchmark(
            (std::string("sleep_cost/") + (wake ? "wake/" : "sleep/") + std::to_string(gib) +
             "GiB/" + (backup ? "backup" : "nobackup")).c_str(),
            [gib, backup, wake](benchmark::State& s) { bm_sleep_wake(s, gib, backup, wake); })
            ->UseManualTime()->Iterations(gib == 1 ? 2 : 1)->Unit(benchmark::kMillisecond);
      }
    }
  }
}

}  // namespace stitch_bench
