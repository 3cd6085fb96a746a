// benchmarks/gpu/gpu_bench.cpp — stitch_gpu_bench: stitch against the other CUDA allocators on
// device 0, side by side in one run, plus the raw cost of the driver's virtual-memory calls.
//
// Peers (all on device 0; the stream-ordered ones on a non-blocking stream):
//   cudaMalloc         cudaMalloc / cudaFree, no caching (peak reserved = peak of live bytes)
//   cudaMallocAsync    cudaMallocFromPoolAsync / cudaFreeAsync on its own pool (release threshold
//                      UINT64_MAX) and its own stream
//   torch              PyTorch's CUDACachingAllocator (raw_alloc_with_stream / raw_delete), when
//                      built against torch; named torch_expandable when PYTORCH_CUDA_ALLOC_CONF
//                      (or PYTORCH_ALLOC_CONF) turns expandable_segments on
//   stitch             stitch::Allocator, backend:cuda
//   stitch_expandable  stitch::Allocator, backend:cuda,expandable_segments:True
// Workloads (host wall time per allocator call; items_per_second counts calls):
//   pair/<peer>/<size>  a warm cache-hit alloc+free pair (4 KiB, 1 MiB, 64 MiB)
//   mixed/<peer>        a fixed random trace: log-uniform sizes 512 B..64 MiB, up to 1000 live
//   changing/<peer>     a set of 8 tensors re-allocated every step, growing 4 % per step
//                       (a growing batch / sequence length); peak reserved is the point
//   vmm/<call>/<size>   cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease and the
//                       whole cycle, at 2, 20 and 64 MiB (manual time of that call alone, mean
//                       of 200 cycles)
//   stitch_cost/<op>/<N>pages  what a stitch of N granules costs, and its dissolving, next to an
//                       expandable-segment grow and cudaMalloc of the same bytes (stitch_cost.cpp)
//   compaction_cost/... the device's copy bandwidth, compaction's copies and a whole compaction
//                       per GiB with its driver calls (compaction_cost.cpp)
//   sleep_cost/...      the pinned host copy bandwidth, and sleep and wake of 1, 10 and 50 GiB
//                       of tagged memory with and without backup (sleep_cost.cpp)
// Counters: peak_reserved (bytes), peak_segments (cudaMalloc'ed segments, where known), bytes.
// The driver API is reached through the CUDA back end's entry-point table
// (backends/cuda/driver.hpp, opened with dlopen and cuGetProcAddress): libcuda is never linked.
//
// Without a device it prints "no CUDA device: <reason>", writes a stub JSON to --benchmark_out
// (context.stitch_no_device), and exits 0. --stitch_device_check prints the device and exits
// 0 (device present) or 2 (none).
#include <benchmark/benchmark.h>
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "backends/cuda/driver.hpp"
#include "diagnostics/snapshot_writer.hpp"  // json_escape
#include "gpu_bench_config.h"  // generated: STITCH_BENCH_TORCH_NOTE, STITCH_BENCH_TORCH_VERSION
#include "peers.hpp"
#include "stitch/stitch.hpp"
#include "compaction_cost.hpp"
#include "sleep_cost.hpp"
#include "stitch_cost.hpp"

namespace stitch_bench {
namespace {

std::string cuda_error_text(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
}

}  // namespace

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error(std::string(what) + " failed: " + cuda_error_text(err));
  }
}

namespace {

constexpr std::size_t kKiB = 1024;
constexpr std::size_t kMiB = 1024 * 1024;

std::string no_device_reason() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return "cudaGetDeviceCount failed: " + cuda_error_text(err);
  }
  if (count <= 0) return "cudaGetDeviceCount reported 0 devices";
  return "";
}

std::string size_label(std::size_t bytes) {
  if (bytes % kMiB == 0) return std::to_string(bytes / kMiB) + "MiB";
  if (bytes % kKiB == 0) return std::to_string(bytes / kKiB) + "KiB";
  return std::to_string(bytes) + "B";
}

bool env_turns_on_expandable(const char* var) {
  const char* v = std::getenv(var);
  if (v == nullptr) return false;
  std::string s(v);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s.find("expandable_segments:true") != std::string::npos;
}

// ---- peers --------------------------------------------------------------------------------------

cudaStream_t g_stream = nullptr;  // stitch's and torch's stream (cudaMallocAsync has its own)

class CudaMallocPeer final : public Peer {
 public:
  void* alloc(std::size_t bytes) override {
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc");
    live_ += static_cast<std::int64_t>(bytes);
    peak_ = std::max(peak_, live_);
    return p;
  }
  void free(void* ptr, std::size_t bytes) override {
    check(cudaFree(ptr), "cudaFree");
    live_ -= static_cast<std::int64_t>(bytes);
  }
  void release_cache() override {}
  void reset_peak() override { peak_ = live_; }
  std::int64_t peak_reserved() override { return peak_; }
  std::int64_t peak_segments() override { return -1; }

 private:
  std::int64_t live_ = 0;
  std::int64_t peak_ = 0;
};

class CudaMallocAsyncPeer final : public Peer {
 public:
  CudaMallocAsyncPeer() {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    check(cudaMemPoolCreate(&pool_, &props), "cudaMemPoolCreate");
    std::uint64_t threshold = UINT64_MAX;
    check(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold),
          "cudaMemPoolSetAttribute(ReleaseThreshold)");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~CudaMallocAsyncPeer() override {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaMemPoolDestroy(pool_);
    (void)cudaStreamDestroy(stream_);
    (void)cudaGetLastError();
  }
  void* alloc(std::size_t bytes) override {
    void* p = nullptr;
    check(cudaMallocFromPoolAsync(&p, bytes, pool_, stream_), "cudaMallocFromPoolAsync");
    return p;
  }
  void free(void* ptr, std::size_t) override { check(cudaFreeAsync(ptr, stream_), "cudaFreeAsync"); }
  void sync() override { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }
  void release_cache() override {
    sync();
    check(cudaMemPoolTrimTo(pool_, 0), "cudaMemPoolTrimTo");
  }
  void reset_peak() override {
    std::uint64_t zero = 0;  // resets the high-water mark to the current value
    check(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &zero),
          "cudaMemPoolSetAttribute(ReservedMemHigh)");
  }
  std::int64_t peak_reserved() override {
    std::uint64_t high = 0;
    check(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &high),
          "cudaMemPoolGetAttribute(ReservedMemHigh)");
    return static_cast<std::int64_t>(high);
  }

 private:
  cudaMemPool_t pool_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

class StitchPeer final : public Peer {
 public:
  explicit StitchPeer(const std::string& conf) : alloc_(stitch::Config::parse(conf)) {}
  void* alloc(std::size_t bytes) override { return alloc_.allocate(bytes, g_stream, 0); }
  void free(void* ptr, std::size_t) override { alloc_.deallocate(ptr); }
  void release_cache() override {
    check(cudaStreamSynchronize(g_stream), "cudaStreamSynchronize");
    alloc_.empty_cache(0);
  }
  void reset_peak() override { alloc_.reset_peak_stats(0); }
  std::int64_t peak_reserved() override { return stat("reserved_bytes.all.peak"); }
  std::int64_t peak_segments() override { return stat("segment.all.peak"); }

 private:
  std::int64_t stat(const char* key) const {
    const auto v = alloc_.stat(0, key);
    return v ? *v : -1;
  }
  stitch::Allocator alloc_;
};

std::string torch_peer_name() {
  return env_turns_on_expandable("PYTORCH_CUDA_ALLOC_CONF") ||
                 env_turns_on_expandable("PYTORCH_ALLOC_CONF")
             ? "torch_expandable"
             : "torch";
}

/// The peers made so far (each once, on first use; kept for the whole run).
std::map<std::string, std::unique_ptr<Peer>>& peers() {
  static std::map<std::string, std::unique_ptr<Peer>> all;
  return all;
}

Peer& peer(const std::string& name) {
  auto& all = peers();
  auto it = all.find(name);
  if (it != all.end()) return *it->second;
  std::unique_ptr<Peer> made;
  if (name == "cudaMalloc") {
    made = std::make_unique<CudaMallocPeer>();
  } else if (name == "cudaMallocAsync") {
    made = std::make_unique<CudaMallocAsyncPeer>();
  } else if (name == "stitch") {
    made = std::make_unique<StitchPeer>("backend:cuda");
  } else if (name == "stitch_expandable") {
    made = std::make_unique<StitchPeer>("backend:cuda,expandable_segments:True");
  } else if (name == "torch" || name == "torch_expandable") {
#if defined(STITCH_BENCH_HAVE_TORCH)
    made = make_torch_peer(g_stream);
#else
    throw std::runtime_error("torch peer not built: " STITCH_BENCH_TORCH_NOTE);
#endif
  } else {
    throw std::runtime_error("unknown peer " + name);
  }
  return *all.emplace(name, std::move(made)).first->second;
}

void set_memory_counters(benchmark::State& state, Peer& p) {
  state.counters["peak_reserved"] = benchmark::Counter(static_cast<double>(p.peak_reserved()));
  const std::int64_t segments = p.peak_segments();
  if (segments >= 0) state.counters["peak_segments"] = benchmark::Counter(static_cast<double>(segments));
}

// ---- workloads ----------------------------------------------------------------------------------

void bm_pair(benchmark::State& state, const std::string& name, std::size_t bytes) {
  try {
    Peer& p = peer(name);
    p.release_cache();
    p.reset_peak();
    p.free(p.alloc(bytes), bytes);  // warm: the pair below is a cache hit for caching peers
    p.sync();
    std::int64_t n = 0;
    for (auto _ : state) {
      void* ptr = p.alloc(bytes);
      benchmark::DoNotOptimize(ptr);
      p.free(ptr, bytes);
      if ((++n & 1023) == 0) p.sync();  // keep the stream-ordered queue bounded
    }
    p.sync();
    state.SetItemsProcessed(state.iterations() * 2);
    state.counters["bytes"] = benchmark::Counter(static_cast<double>(bytes));
    set_memory_counters(state, p);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

/// One allocator call of a trace: allocate `bytes` into `slot`, or (bytes == 0) free `slot`.
struct Op {
  std::uint32_t slot;
  std::size_t bytes;
};
struct Trace {
  std::vector<Op> ops;
  std::uint32_t slots = 0;
};

constexpr std::size_t kMixedSteps = 6000;
constexpr std::size_t kMixedMaxLive = 1000;

/// Fixed seed; sizes log-uniform in [512 B, 64 MiB]; allocates with probability 0.6 while fewer
/// than 1000 blocks are live (else frees a random live block); frees everything at the end.
const Trace& mixed_trace() {
  static const Trace trace = [] {
    Trace t;
    std::mt19937_64 rng(20240601);
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    const double lo = std::log(512.0), hi = std::log(64.0 * kMiB);
    std::vector<std::uint32_t> live, free_slots;
    for (std::size_t i = 0; i < kMixedSteps; ++i) {
      const bool alloc = live.empty() || (live.size() < kMixedMaxLive && unit(rng) < 0.6);
      if (alloc) {
        std::uint32_t slot;
        if (!free_slots.empty()) {
          slot = free_slots.back();
          free_slots.pop_back();
        } else {
          slot = t.slots++;
        }
        const auto bytes = static_cast<std::size_t>(std::exp(lo + (hi - lo) * unit(rng)));
        t.ops.push_back({slot, std::max<std::size_t>(bytes, 512)});
        live.push_back(slot);
      } else {
        const std::size_t k = static_cast<std::size_t>(unit(rng) * live.size()) % live.size();
        t.ops.push_back({live[k], 0});
        free_slots.push_back(live[k]);
        live[k] = live.back();
        live.pop_back();
      }
    }
    for (std::uint32_t slot : live) t.ops.push_back({slot, 0});
    return t;
  }();
  return trace;
}

constexpr int kChangingSteps = 48;
constexpr double kChangingGrowth = 1.04;
constexpr int kChangingTensors = 8;

/// Step s allocates 8 tensors of base_i * 1.04^s bytes (rounded down to 16) and then frees them:
/// 1.5 .. 48 MiB at step 0, 6.3 times that at the last step.
const Trace& changing_trace() {
  static const Trace trace = [] {
    const double base_mib[kChangingTensors] = {1.5, 3, 5, 8, 12, 20, 32, 48};
    Trace t;
    t.slots = kChangingTensors;
    for (int s = 0; s < kChangingSteps; ++s) {
      const double scale = std::pow(kChangingGrowth, s);
      for (int i = 0; i < kChangingTensors; ++i) {
        const auto bytes = static_cast<std::size_t>(base_mib[i] * scale * kMiB) / 16 * 16;
        t.ops.push_back({static_cast<std::uint32_t>(i), bytes});
      }
      for (int i = 0; i < kChangingTensors; ++i) t.ops.push_back({static_cast<std::uint32_t>(i), 0});
    }
    return t;
  }();
  return trace;
}

struct Slot {
  void* ptr = nullptr;
  std::size_t bytes = 0;
};

void replay(Peer& p, const Trace& trace, std::vector<Slot>& slots) {
  for (const Op& op : trace.ops) {
    Slot& s = slots[op.slot];
    if (op.bytes != 0) {
      s.ptr = p.alloc(op.bytes);
      s.bytes = op.bytes;
    } else {
      p.free(s.ptr, s.bytes);
      s.ptr = nullptr;
    }
  }
  p.sync();
}

/// Frees whatever an interrupted replay left allocated.
void free_leftovers(Peer& p, std::vector<Slot>& slots) {
  for (Slot& s : slots) {
    if (s.ptr != nullptr) {
      try {
        p.free(s.ptr, s.bytes);
      } catch (...) {
      }
      s.ptr = nullptr;
    }
  }
}

/// `warm`: replay once untimed first (the mixed trace measures a warm steady state); otherwise
/// every repetition starts from an empty cache (the changing trace measures growth).
void bm_trace(benchmark::State& state, const std::string& name, const Trace& trace, bool warm) {
  Peer* p = nullptr;
  std::vector<Slot> slots(trace.slots);
  try {
    p = &peer(name);
    p->release_cache();
    p->reset_peak();
    if (warm) replay(*p, trace, slots);
    for (auto _ : state) replay(*p, trace, slots);
    state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(trace.ops.size()));
    state.counters["ops_per_iteration"] = benchmark::Counter(static_cast<double>(trace.ops.size()));
    set_memory_counters(state, *p);
    p->release_cache();
  } catch (const std::exception& e) {
    if (p != nullptr) free_leftovers(*p, slots);
    state.SkipWithError(e.what());
  }
}

// ---- raw VMM costs ----------------------------------------------------------------------------

/// The back end's driver entry points (backends/cuda/driver.hpp) and device 0's granularity.
struct Vmm {
  const stitch::cuda_driver::Driver* api = nullptr;
  std::string missing;  // "" when everything was found
  CUdevice device = 0;
  std::size_t granularity_min = 0;
  std::size_t granularity_recommended = 0;
};

const Vmm& vmm() {
  static const Vmm v = [] {
    Vmm v;
    v.api = stitch::cuda_driver::driver(&v.missing);
    if (v.api == nullptr) return v;
    const stitch::cuda_driver::Driver& api = *v.api;
    if (api.device_get(&v.device, 0) != CUDA_SUCCESS) {
      v.missing = "cuDeviceGet(0) failed";
      return v;
    }
    int supported = 0;
    if (api.device_get_attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                 v.device) != CUDA_SUCCESS ||
        supported == 0) {
      v.missing = "device 0 does not support virtual memory management";
      return v;
    }
    const CUmemAllocationProp prop = stitch::cuda_driver::device_memory_prop(v.device);
    (void)api.mem_get_allocation_granularity(&v.granularity_min, &prop,
                                             CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    (void)api.mem_get_allocation_granularity(&v.granularity_recommended, &prop,
                                             CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (v.granularity_min == 0) v.missing = "cuMemGetAllocationGranularity failed";
    return v;
  }();
  return v;
}

enum class VmmCall { create, map, set_access, unmap, release, cycle };
constexpr int kVmmIterations = 200;
const char* to_string(VmmCall c) {
  switch (c) {
    case VmmCall::create: return "cuMemCreate";
    case VmmCall::map: return "cuMemMap";
    case VmmCall::set_access: return "cuMemSetAccess";
    case VmmCall::unmap: return "cuMemUnmap";
    case VmmCall::release: return "cuMemRelease";
    case VmmCall::cycle: return "cycle";
  }
  return "?";
}

void cu_check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) throw std::runtime_error(std::string(what) + " failed: CUresult " + std::to_string(r));
}

/// Every iteration runs create -> map -> set_access -> unmap -> release on one range; only
/// `call` is timed (all five for `cycle`).
void bm_vmm(benchmark::State& state, VmmCall call, std::size_t bytes) {
  CUdeviceptr va = 0;
  std::size_t size = bytes;
  const Vmm& v = vmm();
  try {
    if (!v.missing.empty()) throw std::runtime_error("VMM unavailable: " + v.missing);
    size = (bytes + v.granularity_min - 1) / v.granularity_min * v.granularity_min;
    check(cudaSetDevice(0), "cudaSetDevice");
    check(cudaFree(nullptr), "cudaFree(nullptr)");  // makes the primary context current here
    cu_check(v.api->mem_address_reserve(&va, size, v.granularity_min, 0, 0), "cuMemAddressReserve");
    const CUmemAllocationProp prop = stitch::cuda_driver::device_memory_prop(v.device);
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = static_cast<int>(v.device);
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    using clock = std::chrono::steady_clock;
    for (auto _ : state) {
      double seconds = 0;
      auto step = [&](VmmCall which, auto&& fn, const char* what) {
        const bool timed = call == VmmCall::cycle || call == which;
        const auto t0 = clock::now();
        const CUresult r = fn();
        if (timed) seconds += std::chrono::duration<double>(clock::now() - t0).count();
        cu_check(r, what);
      };
      CUmemGenericAllocationHandle handle = 0;
      step(VmmCall::create, [&] { return v.api->mem_create(&handle, size, &prop, 0); }, "cuMemCreate");
      step(VmmCall::map, [&] { return v.api->mem_map(va, size, 0, handle, 0); }, "cuMemMap");
      step(VmmCall::set_access, [&] { return v.api->mem_set_access(va, size, &access, 1); }, "cuMemSetAccess");
      step(VmmCall::unmap, [&] { return v.api->mem_unmap(va, size); }, "cuMemUnmap");
      step(VmmCall::release, [&] { return v.api->mem_release(handle); }, "cuMemRelease");
      state.SetIterationTime(seconds);
    }
    cu_check(v.api->mem_address_free(va, size), "cuMemAddressFree");
    va = 0;
    state.counters["bytes"] = benchmark::Counter(static_cast<double>(size));
  } catch (const std::exception& e) {
    if (va != 0) (void)v.api->mem_address_free(va, size);
    state.SkipWithError(e.what());
  }
}

// ---- registration and main --------------------------------------------------------------------

void register_all() {
  std::vector<std::string> names = {"cudaMalloc", "cudaMallocAsync", torch_peer_name(), "stitch",
                                    "stitch_expandable"};
#if !defined(STITCH_BENCH_HAVE_TORCH)
  names.erase(std::remove(names.begin(), names.end(), torch_peer_name()), names.end());
#endif
  for (std::size_t bytes : {4 * kKiB, 1 * kMiB, 64 * kMiB}) {
    for (const auto& n : names) {
      benchmark::RegisterBenchmark(("pair/" + n + "/" + size_label(bytes)).c_str(),
                                   [n, bytes](benchmark::State& s) { bm_pair(s, n, bytes); })
          ->UseRealTime()
          ->Unit(benchmark::kNanosecond);
    }
  }
  for (const auto& n : names) {
    benchmark::RegisterBenchmark(("mixed/" + n).c_str(), [n](benchmark::State& s) {
      bm_trace(s, n, mixed_trace(), /*warm=*/true);
    })->UseRealTime()->Unit(benchmark::kMillisecond);
  }
  for (const auto& n : names) {
    benchmark::RegisterBenchmark(("changing/" + n).c_str(), [n](benchmark::State& s) {
      bm_trace(s, n, changing_trace(), /*warm=*/false);
    })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(1)
        ->Repetitions(3)
        ->ReportAggregatesOnly(true);
  }
  for (std::size_t bytes : {2 * kMiB, 20 * kMiB, 64 * kMiB}) {
    for (VmmCall c : {VmmCall::create, VmmCall::map, VmmCall::set_access, VmmCall::unmap,
                      VmmCall::release, VmmCall::cycle}) {
      benchmark::RegisterBenchmark(
          (std::string("vmm/") + to_string(c) + "/" + size_label(bytes)).c_str(),
          [c, bytes](benchmark::State& s) { bm_vmm(s, c, bytes); })
          ->UseManualTime()
          ->Iterations(kVmmIterations)  // min_time counts only the timed call: bound the wall time
          ->Unit(benchmark::kMicrosecond);
    }
  }
  register_stitch_cost(g_stream);
  register_compaction_cost(g_stream);
  register_sleep_cost(g_stream);
}

void add_context() {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
    benchmark::AddCustomContext("stitch_device", prop.name);
    benchmark::AddCustomContext("stitch_compute_capability",
                                std::to_string(prop.major) + "." + std::to_string(prop.minor));
    benchmark::AddCustomContext("stitch_device_memory_bytes", std::to_string(prop.totalGlobalMem));
  }
  (void)cudaGetLastError();
  int driver = 0, runtime = 0;
  (void)cudaDriverGetVersion(&driver);
  (void)cudaRuntimeGetVersion(&runtime);
  benchmark::AddCustomContext("stitch_cuda_driver_version", std::to_string(driver));
  benchmark::AddCustomContext("stitch_cuda_runtime_version", std::to_string(runtime));
  const Vmm& v = vmm();
  if (v.missing.empty()) {
    benchmark::AddCustomContext("stitch_vmm_granularity_min", std::to_string(v.granularity_min));
    benchmark::AddCustomContext("stitch_vmm_granularity_recommended",
                                std::to_string(v.granularity_recommended));
  } else {
    benchmark::AddCustomContext("stitch_vmm_unavailable", v.missing);
  }
#if defined(STITCH_BENCH_HAVE_TORCH)
  benchmark::AddCustomContext("stitch_torch", "built against torch " STITCH_BENCH_TORCH_VERSION);
  benchmark::AddCustomContext("stitch_torch_peer", torch_peer_name());
#else
  benchmark::AddCustomContext("stitch_torch", "skipped: " STITCH_BENCH_TORCH_NOTE);
#endif
  for (const char* var : {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"}) {
    if (const char* val = std::getenv(var)) benchmark::AddCustomContext(std::string("stitch_env_") + var, val);
  }
}


}  // namespace
}  // namespace stitch_bench

int main(int argc, char** argv) {
  using namespace stitch_bench;
  bool device_check = false;
  std::string out_path;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--stitch_device_check") {
      device_check = true;
      continue;
    }
    if (arg.rfind("--benchmark_out=", 0) == 0) out_path = arg.substr(16);
    argv[kept++] = argv[i];
  }
  argc = kept;

  const std::string why = no_device_reason();
  if (!why.empty()) {
    std::printf("no CUDA device: %s\n", why.c_str());
    std::printf("stitch_gpu_bench: nothing measured (this is not an error on a machine without a GPU)\n");
    if (!out_path.empty()) {
      std::ofstream out(out_path);
      out << "{\n  \"context\": {\n    \"stitch_no_device\": \"" << stitch::detail::json_escape(why)
          << "\",\n    \"stitch_torch\": \"" <<
#if defined(STITCH_BENCH_HAVE_TORCH)
          stitch::detail::json_escape("built against torch " STITCH_BENCH_TORCH_VERSION)
#else
          stitch::detail::json_escape("skipped: " STITCH_BENCH_TORCH_NOTE)
#endif
          << "\"\n  },\n  \"benchmarks\": []\n}\n";
    }
    return device_check ? 2 : 0;
  }
  if (device_check) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
      std::printf("CUDA device 0: %s, compute capability %d.%d, %zu bytes\n", prop.name, prop.major,
                  prop.minor, static_cast<std::size_t>(prop.totalGlobalMem));
    }
    return 0;
  }

  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  try {
    check(cudaSetDevice(0), "cudaSetDevice(0)");
    check(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking), "cudaStreamCreate");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stitch_gpu_bench: %s\n", e.what());
    return 1;
  }
  register_all();
  add_context();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  peers().clear();  // stitch and torch give their caches back before the stream goes
  (void)cudaStreamSynchronize(g_stream);
  (void)cudaStreamDestroy(g_stream);
  return 0;
}
