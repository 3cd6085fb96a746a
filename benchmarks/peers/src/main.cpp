// main.cpp — interleaved CPU-cost benchmark of the cache-hit allocate+free pair.
//
// Every round runs every case for every allocator, in the same order, in this one process;
// the report is the median over rounds of the CPU time per pair (CLOCK_THREAD_CPUTIME_ID), with
// wall time printed beside it. Usage: peerbench [rounds=5] [target_ms=150]
// Env: PB_CASES=i,j,... (case indices) to run only some cases; NO_TORCH / NO_RMM to leave a peer
// out; STITCH_BUILD_B=<dir> adds the C API of a second stitch build (adapter_stitch_b.cpp).
// With the counting stub (stub/count on LD_LIBRARY_PATH) it runs one short round and prints the
// CUDA runtime calls each allocator makes per pair instead of times.
#include <dlfcn.h>
#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "loops.hpp"

extern const Adapter glibc_adapter;
extern const Adapter stitch_cxx_adapter;
extern const Adapter stitch_capi_adapter;
extern const Adapter torch_adapter __attribute__((weak));
extern const Adapter rmm_pool_adapter __attribute__((weak));
extern const Adapter stitch_b_adapter __attribute__((weak));

namespace {

double now_ns(clockid_t c) {
  timespec ts;
  clock_gettime(c, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

// ---- the stub's call counters (only in the counting build) ----
using counting_fn = int (*)();
using nfn_fn = int (*)();
using name_fn = const char* (*)(int);
using count_fn = unsigned long long (*)(int);
counting_fn stub_counting = nullptr;
nfn_fn stub_num = nullptr;
name_fn stub_name = nullptr;
count_fn stub_count = nullptr;
bool counting() { return stub_counting && stub_counting(); }
std::vector<unsigned long long> snapshot() {
  std::vector<unsigned long long> v;
  if (!counting()) return v;
  for (int i = 0; i < stub_num(); ++i) v.push_back(stub_count(i));
  return v;
}
std::string per_pair(const std::vector<unsigned long long>& a, const std::vector<unsigned long long>& b, long n) {
  std::string s;
  for (size_t i = 0; i < a.size(); ++i) {
    if (b[i] != a[i]) {
      char buf[128];
      std::snprintf(buf, sizeof buf, "%s%s=%.3f", s.empty() ? "" : " ", stub_name(static_cast<int>(i)),
                    double(b[i] - a[i]) / double(n));
      s += buf;
    }
  }
  return s.empty() ? "none" : s;
}

struct Case {
  std::string name;
  int kind;          // pb::Kind
  std::size_t size;  // kPair only
  int threads;       // 0: main thread, default (NULL) stream; >= 1: that many threads, own streams
  int devices;       // threads: thread t on device t % devices
  int live;          // blocks (16 KiB .. 32 MiB, powers of two in turn) held around the pairs, by the
                     // main thread or by each thread on its stream and device
  bool shared = false;  // threads: all on the default (NULL) stream instead of their own
};

struct Sample {
  double cpu, wall;
};

void* thread_stream(int t) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(0x7000 + 0x100 * t)); }

void run_body(const Adapter& a, const Case& c, pb::Ctx ctx, long n, long first) {
  a.run(c.kind, c.size, ctx, n, first);
}

// One measurement: n pairs (per thread), CPU and wall ns per pair (mean over threads).
// mix_bench's WorkingSet: `count` blocks of 16 KiB << (i % 12) on `ctx`, untimed.
std::vector<std::pair<void*, std::size_t>> hold_live(const Adapter& a, int count, pb::Ctx ctx) {
  std::vector<std::pair<void*, std::size_t>> live;
  for (int i = 0; i < count; ++i) {
    const std::size_t size = (std::size_t{16} << 10) << (i % 12);
    live.emplace_back(a.alloc1(size, ctx), size);
  }
  return live;
}
void release_live(const Adapter& a, const std::vector<std::pair<void*, std::size_t>>& live, pb::Ctx ctx) {
  for (auto& [p, size] : live) a.free1(p, size, ctx);
}

Sample measure(const Adapter& a, const Case& c, long n) {
  if (c.threads == 0) {
    const auto live = hold_live(a, c.live, {nullptr, 0});
    const double w0 = now_ns(CLOCK_MONOTONIC), c0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
    run_body(a, c, {nullptr, 0}, n, 0);
    const double c1 = now_ns(CLOCK_THREAD_CPUTIME_ID), w1 = now_ns(CLOCK_MONOTONIC);
    release_live(a, live, {nullptr, 0});
    return {(c1 - c0) / n, (w1 - w0) / n};
  }
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, nullptr, c.threads);
  std::vector<Sample> per(c.threads);
  std::vector<std::thread> ts;
  for (int t = 0; t < c.threads; ++t) {
    ts.emplace_back([&, t] {
      const pb::Ctx ctx{c.shared ? nullptr : thread_stream(t), t % std::max(1, c.devices)};
      a.bind(ctx.device);
      a.warm(ctx);
      const auto live = hold_live(a, c.live, ctx);
      run_body(a, c, ctx, 1000, t);
      pthread_barrier_wait(&bar);
      const double w0 = now_ns(CLOCK_MONOTONIC), c0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
      run_body(a, c, ctx, n, t);
      const double c1 = now_ns(CLOCK_THREAD_CPUTIME_ID), w1 = now_ns(CLOCK_MONOTONIC);
      per[t] = {(c1 - c0) / n, (w1 - w0) / n};
      pthread_barrier_wait(&bar);
      release_live(a, live, ctx);
    });
  }
  for (auto& th : ts) th.join();
  pthread_barrier_destroy(&bar);
  Sample m{0, 0};
  for (auto& s : per) {
    m.cpu += s.cpu / c.threads;
    m.wall += s.wall / c.threads;
  }
  return m;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t k = v.size();
  return k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  // peerbench --one ADAPTER CASE N: set up one allocator only and run N pairs of one case on the
  // main thread (for instruction counting under callgrind: run with N and 2N and subtract).
  const bool one = argc > 1 && std::strcmp(argv[1], "--one") == 0;
  // peerbench --train THREADS STEPS SEED: train_step.hpp's loop for every allocator, one after
  // the other in this process (each its own allocator: its peak is its own), backward on a second
  // thread when THREADS is 2; prints a "train |" line each.
  const bool train = argc > 4 && std::strcmp(argv[1], "--train") == 0;
  if (one || train) {
    argc = 0;
  }
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 5;
  const double target_ms = argc > 2 ? std::atof(argv[2]) : 150.0;

  stub_counting = reinterpret_cast<counting_fn>(dlsym(RTLD_DEFAULT, "stub_counting"));
  stub_num = reinterpret_cast<nfn_fn>(dlsym(RTLD_DEFAULT, "stub_num_functions"));
  stub_name = reinterpret_cast<name_fn>(dlsym(RTLD_DEFAULT, "stub_function_name"));
  stub_count = reinterpret_cast<count_fn>(dlsym(RTLD_DEFAULT, "stub_count"));
  Dl_info info{};
  if (stub_counting && dladdr(reinterpret_cast<void*>(stub_counting), &info))
    std::printf("# CUDA runtime in this process: %s (counting=%d)\n", info.dli_fname, counting() ? 1 : 0);
  else
    std::printf("# no stub CUDA runtime found in this process\n");

  {  // which CUDA runtime(s) are mapped: must be only the stub
    FILE* f = std::fopen("/proc/self/maps", "r");
    char line[4096];
    std::vector<std::string> seen;
    while (f && std::fgets(line, sizeof line, f)) {
      const char* p = std::strchr(line, '/');
      if (p && std::strstr(p, "cudart") && std::find(seen.begin(), seen.end(), std::string(p)) == seen.end()) {
        seen.emplace_back(p);
        std::printf("# mapped: %s", p);
      }
    }
    if (f) std::fclose(f);
  }

  using namespace pb;
  const std::vector<Case> cases = {
      {"512 B", kPair, 512, 0, 1, 0},
      {"4 KiB", kPair, 4096, 0, 1, 0},
      {"1 MiB", kPair, 1u << 20, 0, 1, 0},
      {"8 MiB", kPair, 8u << 20, 0, 1, 0},
      {"mixed 4K/64K/1M/8M", kMixed, 0, 0, 1, 0},
      {"mixed, 64 live blocks", kMixed, 0, 0, 1, 64},
      {"trace sizes, pair", kTrace, 0, 0, 1, 0},
      {"trace sizes, 8 live (window)", kWindow, 0, 0, 1, 0},
      {"4 KiB, 1 thread, own stream", kPair, 4096, 1, 1, 0},
      {"4 KiB, 2 threads, own streams", kPair, 4096, 2, 1, 0},
      // mixed sizes with 8 blocks (16 KiB .. 2 MiB) live per thread around the pairs
      {"mixed+live, 1 thread, own stream", kMixed, 0, 1, 1, 8},
      {"mixed+live, 2 threads, own streams", kMixed, 0, 2, 1, 8},
      {"mixed+live, 4 threads, own streams", kMixed, 0, 4, 1, 8},
      {"mixed+live, 8 threads, own streams", kMixed, 0, 8, 1, 8},
      {"mixed+live, 2 threads, one stream", kMixed, 0, 2, 1, 8, true},
      {"mixed+live, 4 threads, one stream", kMixed, 0, 4, 1, 8, true},
      {"mixed+live, 8 threads, one stream", kMixed, 0, 8, 1, 8, true},
      {"mixed+live, 2 threads, 2 devices", kMixed, 0, 2, 2, 8},
      {"mixed+live, 4 threads, 2 devices", kMixed, 0, 4, 2, 8},
      {"mixed+live, 8 threads, 2 devices", kMixed, 0, 8, 2, 8},
  };
  std::vector<const Adapter*> adapters = {&glibc_adapter, &stitch_cxx_adapter, &stitch_capi_adapter};
  if (&stitch_b_adapter && std::getenv("STITCH_BUILD_B")) adapters.push_back(&stitch_b_adapter);
  if (&torch_adapter && !std::getenv("NO_TORCH")) adapters.push_back(&torch_adapter);
  if (&rmm_pool_adapter && !std::getenv("NO_RMM")) adapters.push_back(&rmm_pool_adapter);
  // PB_CASES=0,4,5: only those cases (by index)
  std::vector<size_t> case_ids;
  if (const char* sel = std::getenv("PB_CASES")) {
    for (const char* p = sel; *p;) {
      case_ids.push_back(std::strtoul(p, const_cast<char**>(&p), 10));
      if (*p == ',') ++p;
    }
  } else {
    for (size_t i = 0; i < cases.size(); ++i) case_ids.push_back(i);
  }
  if (train) {
    const int threads = std::atoi(argv[2]), steps = std::atoi(argv[3]);
    const unsigned seed = static_cast<unsigned>(std::atoi(argv[4]));
    for (const Adapter* a : adapters) a->setup();
    for (const Adapter* a : adapters) {
      a->bind(0);
      const double w0 = now_ns(CLOCK_MONOTONIC), c0 = now_ns(CLOCK_PROCESS_CPUTIME_ID);
      const long n = a->train(threads, steps, seed, a->bind);
      const double c1 = now_ns(CLOCK_PROCESS_CPUTIME_ID), w1 = now_ns(CLOCK_MONOTONIC);
      const double peak = a->peak_reserved ? double(a->peak_reserved()) / 1e9 : -1.0;
      std::printf("train | %s | %d | %d | %u | %ld | %.4f | %.1f | %.1f\n", a->name, threads, steps, seed, n,
                  peak, (c1 - c0) / 1e3 / steps, (w1 - w0) / 1e3 / steps);
      std::fflush(stdout);
    }
    return 0;
  }
  if (one) {
    const Adapter* a = adapters.at(std::atoi(argv[2]));
    const Case c = cases.at(std::atoi(argv[3]));
    a->setup();
    a->warm({nullptr, 0});
    for (int i = 0; i < c.live; ++i) a->alloc1((std::size_t{16} << 10) << (i % 12), {nullptr, 0});  // kept
    run_body(*a, c, {nullptr, 0}, 1000, 0);
    run_body(*a, c, {nullptr, 0}, std::atol(argv[4]), 0);
    std::printf("one | %s | %s | %ld pairs\n", a->name, c.name.c_str(), std::atol(argv[4]));
    return 0;
  }
  std::vector<int> adapter_devices;
  for (const Adapter* a : adapters) {
    a->setup();
    a->warm({nullptr, 0});
    for (int t = 0; t < 2; ++t) a->warm({thread_stream(t), 0});
    adapter_devices.push_back(a->devices());
    std::printf("# %s: %d device(s)\n", a->name, adapter_devices.back());
  }
  // a case with more devices than an allocator has here is skipped for it
  auto runs = [&](size_t ci, size_t ai) { return cases[ci].devices <= adapter_devices[ai]; };

  if (counting()) {
    std::printf("# CUDA runtime calls per pair (counting stub; one short run per case)\n");
    for (size_t ci : case_ids)
      for (size_t ai = 0; ai < adapters.size(); ++ai) {
        const Case& c = cases[ci];
        const Adapter* a = adapters[ai];
        if (!runs(ci, ai)) continue;
        const long n = 20000;
        auto s0 = snapshot();
        measure(*a, c, n);
        auto s1 = snapshot();
        // threads: counts are summed over threads, so divide by pairs in all threads
        std::printf("calls | %-30s | %-30s | %s\n", c.name.c_str(), a->name,
                    per_pair(s0, s1, n * std::max(1, c.threads)).c_str());
      }
    return 0;
  }

  // calibrate n per (case, adapter) to about target_ms per measurement (threads: as run)
  std::map<std::pair<size_t, size_t>, long> iters;
  for (size_t ci : case_ids)
    for (size_t ai = 0; ai < adapters.size(); ++ai) {
      if (!runs(ci, ai)) continue;
      const long n = cases[ci].threads ? 5000 : 20000;
      Sample s = measure(*adapters[ai], cases[ci], n);
      const double per = std::max(s.wall, 1.0);
      iters[{ci, ai}] = std::max(10000L, static_cast<long>(target_ms * 1e6 / per));
    }

  std::map<std::pair<size_t, size_t>, std::vector<double>> cpu, wall;
  std::printf("# raw: round | case | allocator | pairs per thread | cpu ns/pair | wall ns/pair (per thread)\n");
  for (int r = 0; r < rounds; ++r)
    for (size_t ci : case_ids)
      for (size_t ai = 0; ai < adapters.size(); ++ai) {
        if (!runs(ci, ai)) {
          if (r == 0) std::printf("skip | %s | %s | %d device(s) here\n", cases[ci].name.c_str(), adapters[ai]->name, adapter_devices[ai]);
          continue;
        }
        const long n = iters[{ci, ai}];
        Sample s = measure(*adapters[ai], cases[ci], n);
        cpu[{ci, ai}].push_back(s.cpu);
        wall[{ci, ai}].push_back(s.wall);
        std::printf("raw | %d | %s | %s | %ld | %.2f | %.2f\n", r, cases[ci].name.c_str(), adapters[ai]->name, n,
                    s.cpu, s.wall);
        std::fflush(stdout);
      }

  std::printf("\n# median over %d rounds, wall ns per pair per thread [CPU ns per pair]; ratio = allocator / stitch C++ API (wall)\n",
              rounds);
  for (size_t ci : case_ids) {
    const double ref = median(wall[{ci, 1}]);
    for (size_t ai = 0; ai < adapters.size(); ++ai) {
      if (!runs(ci, ai)) continue;
      const double m = median(wall[{ci, ai}]);
      std::printf("median | %-30s | %-30s | %9.2f | [%9.2f] | %6.2fx stitch\n", cases[ci].name.c_str(),
                  adapters[ai]->name, m, median(cpu[{ci, ai}]), m / ref);
    }
  }
  return 0;
}
