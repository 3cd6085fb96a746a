// benchmarks/torch/torch_backends_bench.cpp — the hot path of stitch's two PyTorch backends in one
// process, on the simulated device (no GPU: the figures are CPU cost), cases interleaved over
// rounds, median of the rounds:
//   native     libstitch_torch (make_allocator): raw_alloc_with_stream / raw_delete, and
//              allocate() with the DataPtr's deleter (what a tensor does)
//   pluggable  PyTorch's CUDAPluggableAllocator over stitch_torch_malloc / stitch_free (what
//              stitch.torch.enable() installs where the native backend cannot be built):
//              malloc(size, device, stream) / raw_delete (its allocate() asks CUDA for the device)
// Workloads: the same 4 KiB pair; the 4 KiB / 64 KiB / 1 MiB / 512 B mix with one 1 MiB block live.
// usage: torch_backends_bench [pairs per measurement, default 2000000] [rounds, default 7]
// Not a test: timings depend on the machine (docs/benchmarks.md has a run).
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "stitch/stitch.h"
#include "stitch/torch_hooks.h"
#include "stitch/torch_native.hpp"

namespace {

namespace cca = c10::cuda::CUDACachingAllocator;

struct Context final : stitch::torch_native::DeviceContext {
  void* stream = reinterpret_cast<void*>(0x5000);
  int current_device() override { return 0; }
  void* current_stream(int) override { return stream; }
};

constexpr std::size_t kMix[4] = {4096, 65536, 1 << 20, 512};

template <typename Pair>
double ns_per_pair(long pairs, Pair&& pair) {
  for (long i = 0; i < 1000; ++i) pair(i);  // warm
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < pairs; ++i) pair(i);
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(pairs);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const long pairs = argc > 1 ? std::atol(argv[1]) : 2000000;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 7;
  if (stitch_configure("backend:sim") != 0) {
    std::fprintf(stderr, "stitch_configure: %s\n", stitch_last_error());
    return 1;
  }
  auto ctx = std::make_shared<Context>();
  auto native = stitch::torch_native::make_allocator(ctx);
  native->init(1);
  auto pluggable = std::make_shared<torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator>(
      [](size_t size, int device, cudaStream_t stream) { return stitch_torch_malloc(size, device, stream); },
      [](void* ptr, size_t size, int device, cudaStream_t stream) { stitch_free(ptr, size, device, stream); });
  const auto stream = static_cast<cudaStream_t>(ctx->stream);

  struct Case {
    std::string name;
    std::function<double()> run;
  };
  void* live = nullptr;  // the mix's live 1 MiB block (allocated through each path's own calls)
  std::vector<Case> cases = {
      {"4 KiB pair, native raw_alloc/raw_delete",
       [&] { return ns_per_pair(pairs, [&](long) { native->raw_delete(native->raw_alloc_with_stream(4096, stream)); }); }},
      {"4 KiB pair, native allocate()/DataPtr",
       [&] { return ns_per_pair(pairs, [&](long) { c10::DataPtr p = native->allocate(4096); }); }},
      {"4 KiB pair, pluggable malloc/raw_delete",
       [&] { return ns_per_pair(pairs, [&](long) { pluggable->raw_delete(pluggable->malloc(4096, 0, stream)); }); }},
      {"mix + 1 MiB live, native raw_alloc/raw_delete",
       [&] {
         live = native->raw_alloc_with_stream(1 << 20, stream);
         const double ns = ns_per_pair(pairs, [&](long i) { native->raw_delete(native->raw_alloc_with_stream(kMix[i & 3], stream)); });
         native->raw_delete(live);
         return ns;
       }},
      {"mix + 1 MiB live, native allocate()/DataPtr",
       [&] {
         c10::DataPtr keep = native->allocate(1 << 20);
         return ns_per_pair(pairs, [&](long i) { c10::DataPtr p = native->allocate(kMix[i & 3]); });
       }},
      {"mix + 1 MiB live, pluggable malloc/raw_delete",
       [&] {
         live = pluggable->malloc(1 << 20, 0, stream);
         const double ns = ns_per_pair(pairs, [&](long i) { pluggable->raw_delete(pluggable->malloc(kMix[i & 3], 0, stream)); });
         pluggable->raw_delete(live);
         return ns;
       }},
  };
  std::vector<std::vector<double>> results(cases.size());
  for (int r = 0; r < rounds; ++r)
    for (std::size_t c = 0; c < cases.size(); ++c) results[c].push_back(cases[c].run());
  std::printf("torch_backends_bench: %ld pairs per measurement, median of %d rounds\n", pairs, rounds);
  for (std::size_t c = 0; c < cases.size(); ++c)
    std::printf("%-48s %7.1f ns per pair\n", cases[c].name.c_str(), median(results[c]));
  return 0;
}
