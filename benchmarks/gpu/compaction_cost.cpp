// benchmarks/gpu/compaction_cost.cpp — what compaction costs on a GPU (compaction_cost/* in
// stitch_gpu_bench): the device's own copy bandwidth, the bandwidth of compaction's copies, and
// the whole compaction's time per GiB with every driver call it makes, in the same run.
//
//   compaction_cost/device_copy/<S>MiB   Backend::copy (cuMemcpyDtoDAsync) of S MiB between two
//       cudaMalloc buffers on the bench stream, timed by CUDA events around the copy: the
//       device's copy bandwidth (bytes_per_second; S = 4, the size compaction copies per page of
//       the scenario, 64 and 1024).
//   compaction_cost/to_host/<S>MiB, from_host/<S>MiB   Backend::copy_to_host / copy_from_host
//       (cuMemcpyDtoH / HtoD, pageable host memory, as staging uses), host wall time.
//   compaction_cost/compact/{room,full}   per iteration, a fresh allocator over the CUDA back end
//       (behind TimedBackend) builds tests/support/compaction_scenario.hpp under a 2 GiB cap (a
//       quarter of the free memory if less; untimed): a live block at the start of every coarse
//       page, the rest of each page freed, the cap set to what is reserved (full: the first page
//       is staged through host memory) or one coarse page above it (room). Timed: the one
//       allocate of every granule free of live data, which must compact (else the benchmark
//       errors): the device sync, per page the fresh pages, the copies, the remap, then the
//       stitch. Counters per compaction: pages, staged, compacted_bytes, and per kind of
//       back-end call its calls and host time (<kind>_calls, <kind>_ns; TimedBackend of
//       timed_backend.hpp, which sleep_cost.cpp shares).
//   compaction_cost/copies/room   the same request with every device copy bracketed by CUDA
//       events: manual time is the sum of the copies' device time, bytes_per_second the
//       bandwidth of compaction's own copies (to set against device_copy's). Separate from
//       compact/ so that the events cost nothing there.
//
// scripts/gpu_report_compaction.py turns these into the report's "Compaction cost" section.
#include "compaction_cost.hpp"

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "peers.hpp"
#include "stitch/stitch.hpp"
#include "support/compaction_scenario.hpp"
#include "timed_backend.hpp"

namespace stitch_bench {
namespace {

using namespace stitch::test;
using Clock = std::chrono::steady_clock;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kCapAtMost = std::size_t{2} << 30;
constexpr int kCompactIterations = 5;  // each builds the scenario (about 100 coarse pages)

double ns_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

stitch::Config compaction_config() {
  return stitch::Config::parse(std::string("backend:cuda,") + kCompactionConf);
}

std::int64_t stat(const stitch::Allocator& a, const char* key) {
  const auto v = a.stat(0, key);
  if (!v) throw std::runtime_error(std::string("no stat ") + key);
  return *v;
}

/// The calls compaction makes whose <kind>_calls and <kind>_ns compact/ and copies/ report, every
/// one of them even when not called (TimedBackend tallies more kinds: sleep's).
using K = TimedBackend::Kind;
constexpr std::array<K, 11> kReported = {
    K::reserve, K::release_reservation, K::create, K::release, K::map, K::unmap, K::copy,
    K::copy_to_host, K::copy_from_host, K::sync_stream, K::sync_device};

// ---- the device's copies ------------------------------------------------------------------------

struct DeviceBuffers {
  void* a = nullptr;
  void* b = nullptr;
  explicit DeviceBuffers(std::size_t bytes) {
    check(cudaMalloc(&a, bytes), "cudaMalloc");
    if (const cudaError_t e = cudaMalloc(&b, bytes); e != cudaSuccess) {
      (void)cudaFree(a);
      check(e, "cudaMalloc");
    }
  }
  ~DeviceBuffers() {
    (void)cudaFree(a);
    (void)cudaFree(b);
  }
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;
};

void bm_device_copy(benchmark::State& state, cudaStream_t stream, std::size_t bytes) {
  try {
    const auto backend = stitch::make_backend(compaction_config());
    DeviceBuffers buf(bytes);
    check(cudaMemsetAsync(buf.a, 1, bytes, stream), "cudaMemsetAsync");
    cudaEvent_t begin = nullptr, end = nullptr;
    check(cudaEventCreate(&begin), "cudaEventCreate");
    check(cudaEventCreate(&end), "cudaEventCreate");
    try {
      backend->copy(0, buf.b, buf.a, bytes, stream);  // untimed: the first copy
      for (auto _ : state) {
        check(cudaEventRecord(begin, stream), "cudaEventRecord");
        backend->copy(0, buf.b, buf.a, bytes, stream);
        check(cudaEventRecord(end, stream), "cudaEventRecord");
        check(cudaEventSynchronize(end), "cudaEventSynchronize");
        float ms = 0;
        check(cudaEventElapsedTime(&ms, begin, end), "cudaEventElapsedTime");
        state.SetIterationTime(static_cast<double>(ms) * 1e-3);
      }
    } catch (...) {
      (void)cudaEventDestroy(begin);
      (void)cudaEventDestroy(end);
      throw;
    }
    (void)cudaEventDestroy(begin);
    (void)cudaEventDestroy(end);
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
    state.counters["bytes"] = benchmark::Counter(static_cast<double>(bytes));
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

void bm_host_copy(benchmark::State& state, std::size_t bytes, bool to_host) {
  try {
    const auto backend = stitch::make_backend(compaction_config());
    DeviceBuffers buf(bytes);
    std::vector<char> host(bytes, 1);  // pageable, as staging's
    for (auto _ : state) {
      const Clock::time_point t0 = Clock::now();
      if (to_host) {
        backend->copy_to_host(0, host.data(), buf.a, bytes);
      } else {
        backend->copy_from_host(0, buf.a, host.data(), bytes);
      }
      state.SetIterationTime(ns_since(t0) * 1e-9);
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(bytes));
    state.counters["bytes"] = benchmark::Counter(static_cast<double>(bytes));
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// ---- one compaction -----------------------------------------------------------------------------

struct Compaction {
  double wall_ns = 0;
  double copy_device_ns = 0;
  std::int64_t pages = 0, staged = 0, copied = 0;
  std::size_t served = 0;
  TimedBackend::Tallies calls{};
};

Compaction compact_once(cudaStream_t stream, bool room, bool events) {
  auto timed = std::make_shared<TimedBackend>(stitch::make_backend(compaction_config()));
  stitch::Allocator alloc(compaction_config(), timed);
  if (!alloc.backend().supports_virtual_memory(0))
    throw std::runtime_error("device 0 has no virtual memory management (compaction needs it)");
  const std::size_t g = alloc.backend().granularity(0);
  const std::size_t cap = scenario_cap(alloc.backend().memory_info(0).free, g, kCapAtMost);
  CoarsePages f = fill_coarse_pages(alloc, stream, g, cap, room ? coarse_page(g) : 0,
                                    [](const ScenarioBlock&) {});
  Compaction c;
  void* big = nullptr;
  auto give_back = [&] {
    if (big != nullptr) alloc.deallocate(big);
    for (const ScenarioBlock& b : f.live) alloc.deallocate(b.ptr);
    alloc.empty_cache(0);
  };
  try {
    c.served = f.free_of_live();
    const std::int64_t pages = stat(alloc, "num_compactions");
    const std::int64_t staged = stat(alloc, "num_staged_compactions");
    const std::int64_t copied = stat(alloc, "compacted_bytes");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");  // nothing queued: the call alone
    timed->reset();
    timed->set_copy_events(events);
    const Clock::time_point t0 = Clock::now();
    big = alloc.allocate(c.served, stream, 0);
    c.wall_ns = ns_since(t0);
    timed->set_copy_events(false);
    c.pages = stat(alloc, "num_compactions") - pages;
    c.staged = stat(alloc, "num_staged_compactions") - staged;
    c.copied = stat(alloc, "compacted_bytes") - copied;
    if (c.pages == 0) throw std::runtime_error("the request was served without compaction");
    c.calls = timed->tallies();
    if (events) c.copy_device_ns = timed->copy_device_ns();
  } catch (...) {
    give_back();
    throw;
  }
  give_back();
  return c;
}

void bm_compact(benchmark::State& state, cudaStream_t stream, bool room, bool events) {
  try {
    double pages = 0, staged = 0, copied = 0, served = 0, device_copied = 0;
    TimedBackend::Tallies calls{};
    for (auto _ : state) {
      const Compaction c = compact_once(stream, room, events);
      state.SetIterationTime((events ? c.copy_device_ns : c.wall_ns) * 1e-9);
      pages += static_cast<double>(c.pages);
      staged += static_cast<double>(c.staged);
      copied += static_cast<double>(c.copied);
      served += static_cast<double>(c.served);
      device_copied += static_cast<double>(c.calls[TimedBackend::index(K::copy)].bytes);
      for (std::size_t k = 0; k < TimedBackend::kKinds; ++k) {
        calls[k].calls += c.calls[k].calls;
        calls[k].ns += c.calls[k].ns;
      }
    }
    using C = benchmark::Counter;
    state.counters["pages"] = C(pages, C::kAvgIterations);
    state.counters["staged"] = C(staged, C::kAvgIterations);
    state.counters["compacted_bytes"] = C(copied, C::kAvgIterations);
    state.counters["device_copy_bytes"] = C(device_copied, C::kAvgIterations);
    state.counters["served_bytes"] = C(served, C::kAvgIterations);
    for (const K kind : kReported) {
      const std::size_t k = TimedBackend::index(kind);
      const std::string n = TimedBackend::kNames[k];
      state.counters[n + "_calls"] = C(static_cast<double>(calls[k].calls), C::kAvgIterations);
      state.counters[n + "_ns"] = C(calls[k].ns, C::kAvgIterations);
    }
    if (events) state.SetBytesProcessed(static_cast<std::int64_t>(device_copied));
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

}  // namespace

void register_compaction_cost(cudaStream_t stream) {
  for (std::size_t mib : {4, 64, 1024}) {
    benchmark::RegisterBenchmark(
        ("compaction_cost/device_copy/" + std::to_string(mib) + "MiB").c_str(),
        [stream, mib](benchmark::State& s) { bm_device_copy(s, stream, mib * kMiB); })
        ->UseManualTime()->Iterations(mib >= 1024 ? 10 : 50)->Unit(benchmark::kMicrosecond);
  }
  for (std::size_t mib : {4, 64}) {
    for (const bool to_host : {true, false}) {
      benchmark::RegisterBenchmark(
          (std::string("compaction_cost/") + (to_host ? "to_host/" : "from_host/") +
           std::to_string(mib) + "MiB").c_str(),
          [mib, to_host](benchmark::State& s) { bm_host_copy(s, mib * kMiB, to_host); })
          ->UseManualTime()->Iterations(10)->Unit(benchmark::kMicrosecond);
    }
  }
  for (const bool room : {true, false}) {
    benchmark::RegisterBenchmark(
        (std::string("compaction_cost/compact/") + (room ? "room" : "full")).c_str(),
        [stream, room](benchmark::State& s) { bm_compact(s, stream, room, /*events=*/false); })
        ->UseManualTime()->Iterations(kCompactIterations)->Unit(benchmark::kMicrosecond);
  }
  benchmark::RegisterBenchmark(
      "compaction_cost/copies/room",
      [stream](benchmark::State& s) { bm_compact(s, stream, /*room=*/true, /*events=*/true); })
      ->UseManualTime()->Iterations(kCompactIterations)->Unit(benchmark::kMicrosecond);
}

}  // namespace stitch_bench
