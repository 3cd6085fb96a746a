// benchmarks/alloc_bench.cpp — CPU cost of stitch's allocator paths, with glibc malloc/free of the
// same sizes in the same binary as the reference:
//   *_pair       a warm cache-hit allocate + free of one size (*_pair_device_lock: with the cache
//                hit off, every request under the device lock);
//   *_random     RMM random_allocations-style mixed workload (random sizes, random frees);
//   *_threads    the cache-hit pair from several threads at once (each on its own stream), on
//                one device and on two (*_devices), through the C++ and the C API, with
//                PyTorch's structure (a std::mutex and an ordered set per device) as the peer;
//                wall time per pair and thread.
// stitch runs on the simulated device, so no device call is ever timed: this is the allocator.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/device_allocator.hpp"
#include "stitch/allocator.hpp"
#include "stitch/sim_backend.hpp"
#include "stitch/stitch.h"

namespace {

stitch::Allocator& shared_allocator() {
  static stitch::Allocator allocator(stitch::Config::parse("backend:sim,sim_capacity_mb:65536"));
  return allocator;
}

void size_args(benchmark::internal::Benchmark* b) {
  for (long s : {512L, 4096L, 65536L, 1L << 20, 8L << 20, 64L << 20}) b->Arg(s);
}

// ---- cache-hit pair -----------------------------------------------------------------------------

void BM_glibc_pair(benchmark::State& state) {
  const auto size = static_cast<std::size_t>(state.range(0));
  free(malloc(size));  // let glibc settle its mmap threshold for this size
  for (auto _ : state) {
    void* p = malloc(size);
    benchmark::DoNotOptimize(p);
    free(p);
  }
}
BENCHMARK(BM_glibc_pair)->Apply(size_args);

void BM_stitch_pair(benchmark::State& state) {
  const auto size = static_cast<std::size_t>(state.range(0));
  stitch::Allocator& a = shared_allocator();
  a.deallocate(a.allocate(size));  // warm: the segment is cached
  for (auto _ : state) {
    void* p = a.allocate(size);
    benchmark::DoNotOptimize(p);
    a.deallocate(p);
  }
}
BENCHMARK(BM_stitch_pair)->Apply(size_args);

// The same pair with the cache hit off: every request takes the device lock (its own and every
// stream shard's) instead of its stream's lock alone; the same best fit, split and coalescing.
void BM_stitch_pair_device_lock(benchmark::State& state) {
  const auto size = static_cast<std::size_t>(state.range(0));
  stitch::Allocator a(stitch::Config::parse("backend:sim,sim_capacity_mb:65536"));
  a.device(0).set_cache_hit(false);
  a.deallocate(a.allocate(size));
  for (auto _ : state) {
    void* p = a.allocate(size);
    benchmark::DoNotOptimize(p);
    a.deallocate(p);
  }
}
BENCHMARK(BM_stitch_pair_device_lock)->Arg(512)->Arg(1 << 20);

// The recorder's cost: the same pair with record_history on (with and without native stacks),
// in allocators of their own. BM_stitch_pair above is the recorder-off reference.
void BM_stitch_pair_recording(benchmark::State& state) {
  const auto size = static_cast<std::size_t>(state.range(0));
  const bool stacks = state.range(1) != 0;
  stitch::Allocator a(stitch::Config::parse(
      std::string("backend:sim,sim_capacity_mb:65536,record_history:True,max_entries:100000") +
      (stacks ? ",record_stacks:True" : "")));
  a.deallocate(a.allocate(size));
  for (auto _ : state) {
    void* p = a.allocate(size);
    benchmark::DoNotOptimize(p);
    a.deallocate(p);
  }
}
BENCHMARK(BM_stitch_pair_recording)->Args({4096, 0})->Args({4096, 1});

constexpr const char* kCapiConf = "backend:sim,sim_capacity_mb:65536,sim_devices:2";

void BM_stitch_capi_pair(benchmark::State& state) {
  const auto size = static_cast<std::size_t>(state.range(0));
  if (stitch_configure(kCapiConf) != 0 &&
      std::string(stitch_last_error()).find("fixed") == std::string::npos) {
    state.SkipWithError(stitch_last_error());
    return;
  }
  stitch_free(stitch_malloc(size, 0, nullptr), size, 0, nullptr);
  for (auto _ : state) {
    void* p = stitch_malloc(size, 0, nullptr);
    benchmark::DoNotOptimize(p);
    stitch_free(p, size, 0, nullptr);
  }
}
BENCHMARK(BM_stitch_capi_pair)->Arg(512)->Arg(1 << 20);

// ---- random mixed workload ----------------------------------------------------------------------

struct Op {
  bool alloc;
  std::size_t size;  // for allocations
  std::size_t slot;
};

// A fixed sequence: up to `live` blocks, sizes log-uniform in [512 B, max], frees at random.
std::vector<Op> make_ops(std::size_t count, std::size_t live, std::size_t max_size) {
  std::mt19937_64 rng(42);
  std::vector<Op> ops;
  std::vector<bool> used(live, false);
  std::uniform_real_distribution<double> log_size(9.0, std::log2(static_cast<double>(max_size)));
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t slot = rng() % live;
    if (!used[slot]) {
      ops.push_back({true, static_cast<std::size_t>(std::exp2(log_size(rng))), slot});
    } else {
      ops.push_back({false, 0, slot});
    }
    used[slot] = !used[slot];
  }
  for (std::size_t s = 0; s < live; ++s)
    if (used[s]) ops.push_back({false, 0, s});
  return ops;
}

template <typename Alloc, typename Free>
void run_ops(benchmark::State& state, const std::vector<Op>& ops, std::size_t live, Alloc alloc,
             Free release) {
  std::vector<void*> slots(live, nullptr);
  for (auto _ : state) {
    for (const Op& op : ops) {
      if (op.alloc) {
        slots[op.slot] = alloc(op.size);
      } else {
        release(slots[op.slot]);
      }
    }
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * ops.size()));
}

constexpr std::size_t kLive = 1000;

void BM_glibc_random(benchmark::State& state) {
  static const auto ops = make_ops(100000, kLive, static_cast<std::size_t>(state.range(0)));
  run_ops(state, ops, kLive, [](std::size_t s) { return malloc(s); }, [](void* p) { free(p); });
}
BENCHMARK(BM_glibc_random)->Arg(1 << 20);

void BM_stitch_random(benchmark::State& state) {
  static const auto ops = make_ops(100000, kLive, static_cast<std::size_t>(state.range(0)));
  stitch::Allocator& a = shared_allocator();
  run_ops(state, ops, kLive, [&](std::size_t s) { return a.allocate(s); },
          [&](void* p) { a.deallocate(p); });
}
BENCHMARK(BM_stitch_random)->Arg(1 << 20);

// ---- several threads ----------------------------------------------------------------------------

void thread_args(benchmark::internal::Benchmark* b) {
  b->Threads(1)->Threads(2)->Threads(4)->Threads(8)->UseRealTime();
}

stitch::stream_t own_stream(const benchmark::State& state) {
  return reinterpret_cast<stitch::stream_t>(static_cast<std::uintptr_t>(state.thread_index() + 1));
}

void BM_glibc_pair_threads(benchmark::State& state) {
  for (auto _ : state) {
    void* p = malloc(4096);
    benchmark::DoNotOptimize(p);
    free(p);
  }
}
BENCHMARK(BM_glibc_pair_threads)->Apply(thread_args);

void BM_stitch_pair_threads(benchmark::State& state) {
  stitch::Allocator& a = shared_allocator();
  const stitch::stream_t stream = own_stream(state);
  for (auto _ : state) {
    void* p = a.allocate(4096, stream);
    benchmark::DoNotOptimize(p);
    a.deallocate(p);
  }
}
BENCHMARK(BM_stitch_pair_threads)->Apply(thread_args);

// Thread i on device i % 2.
void BM_stitch_pair_threads_devices(benchmark::State& state) {
  static stitch::Allocator two(stitch::Config::parse("backend:sim,sim_capacity_mb:65536,sim_devices:2"));
  const stitch::stream_t stream = own_stream(state);
  const int device = state.thread_index() % 2;
  for (auto _ : state) {
    void* p = two.allocate(4096, stream, device);
    benchmark::DoNotOptimize(p);
    two.deallocate(p, 4096, device, stream);
  }
}
BENCHMARK(BM_stitch_pair_threads_devices)->Apply(thread_args);

// Through the C API, on one device (range 0) or thread i on device i % 2 (range 1).
void BM_stitch_capi_pair_threads(benchmark::State& state) {
  if (state.thread_index() == 0 && stitch_configure(kCapiConf) != 0 &&
      std::string(stitch_last_error()).find("fixed") == std::string::npos) {
    state.SkipWithError(stitch_last_error());
    return;
  }
  void* stream = own_stream(state);
  const int device = state.range(0) == 0 ? 0 : state.thread_index() % 2;
  for (auto _ : state) {
    void* p = stitch_malloc(512, device, stream);
    benchmark::DoNotOptimize(p);
    stitch_free(p, 512, device, stream);
  }
}
BENCHMARK(BM_stitch_capi_pair_threads)->Arg(0)->Arg(1)->Apply(thread_args);

/// PyTorch's structure for the same pair, as the peer: per device one std::mutex over an
/// ordered set of free blocks (stream, size, address: best fit by lower_bound) and a hash map
/// of the live ones; a freed block goes back into the set at once.
class MutexSetDevice {
 public:
  void* allocate(std::size_t size, stitch::stream_t stream) {
    std::lock_guard lock(mutex_);
    auto it = free_.lower_bound(Key{stream, size, nullptr});
    if (it == free_.end() || it->stream != stream) {
      slabs_.push_back(std::make_unique<char[]>(size));  // grow: one block of this size
      it = free_.insert(Key{stream, size, slabs_.back().get()}).first;
    }
    const Key k = *it;
    free_.erase(it);
    live_.emplace(k.ptr, k);
    return k.ptr;
  }
  void deallocate(void* p) {
    std::lock_guard lock(mutex_);
    auto it = live_.find(p);
    free_.insert(it->second);
    live_.erase(it);
  }

 private:
  struct Key {
    stitch::stream_t stream;
    std::size_t size;
    char* ptr;
    bool operator<(const Key& o) const noexcept {
      if (stream != o.stream) return stream < o.stream;
      if (size != o.size) return size < o.size;
      return ptr < o.ptr;
    }
  };
  std::mutex mutex_;
  std::set<Key> free_;
  std::unordered_map<void*, Key> live_;
  std::vector<std::unique_ptr<char[]>> slabs_;
};

// The peer on one device (range 0), or thread i on device i % 2 (range 1).
void BM_mutex_set_pair_threads(benchmark::State& state) {
  static MutexSetDevice devices[2];
  MutexSetDevice& d = devices[state.range(0) == 0 ? 0 : state.thread_index() % 2];
  const stitch::stream_t stream = own_stream(state);
  for (auto _ : state) {
    void* p = d.allocate(4096, stream);
    benchmark::DoNotOptimize(p);
    d.deallocate(p);
  }
}
BENCHMARK(BM_mutex_set_pair_threads)->Arg(0)->Arg(1)->Apply(thread_args);

}  // namespace
