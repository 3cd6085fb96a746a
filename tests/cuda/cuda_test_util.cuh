// tests/cuda/cuda_test_util.cuh — what the GPU tests share: the device check that skips a test
// without a GPU (REQUIRE_CUDA_DEVICE), CUDA error checks, the pattern kernels (fill a block from
// a seed, verify it on the host or count mismatches on the device), a slow kernel, streams, and
// stat() for the allocator's flat stats. Included by each tests/cuda/*.cu file of
// stitch_cuda_tests; kernels have internal linkage, host helpers are inline. Also the steps the
// stitching and compaction tests share (settled free memory, data checks, memory given back).
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "stitch/stitch.hpp"

namespace stitch_cuda_test {
namespace {  // kernels: one copy per translation unit (no relocatable device code)

// ---- device checks ------------------------------------------------------------------------------

/// "" when device 0 is usable, else why not (no driver, no device, ...).
inline std::string no_device_reason() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(err) + ": " +
           cudaGetErrorString(err);
  }
  if (count <= 0) return "cudaGetDeviceCount reported 0 devices";
  return "";
}

#define REQUIRE_CUDA_DEVICE()                                               \
  do {                                                                      \
    const std::string why_ = no_device_reason();                            \
    if (!why_.empty()) GTEST_SKIP() << "no CUDA device: " << why_;          \
  } while (0)

#define CUDA_OK(expr)                                                                     \
  do {                                                                                    \
    const cudaError_t err_ = (expr);                                                      \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorName(err_) << ": "       \
                                 << cudaGetErrorString(err_);                             \
  } while (0)

/// For code that cannot use ASSERT (threads, helpers returning values): throws on failure.
inline void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(err) + ": " +
                             cudaGetErrorString(err));
  }
}

// ---- kernels ----------------------------------------------------------------------------------

/// The byte at offset `i` of a block filled with `seed` (host and device agree).
__host__ __device__ inline std::uint8_t pattern_byte(std::uint32_t seed, std::uint64_t i) {
  std::uint32_t x = seed + static_cast<std::uint32_t>(i) * 2654435761u +
                    static_cast<std::uint32_t>(i >> 32) * 0x85ebca6bu;
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  x ^= x >> 15;
  return static_cast<std::uint8_t>(x);
}

__global__ void fill_kernel(std::uint8_t* p, std::uint64_t n, std::uint32_t seed) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    p[i] = pattern_byte(seed, i);
  }
}

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// Busy-waits about `ns` nanoseconds (by %globaltimer). As a safety net, also stops after
/// 4 clock cycles per requested nanosecond, so a timer that does not tick cannot hang the GPU.
__global__ void spin_kernel(unsigned long long ns) {
  const unsigned long long start = global_ns();
  const long long start_clock = clock64();
  const long long max_cycles = static_cast<long long>(ns) * 4;
  while (global_ns() - start < ns) {
    if (clock64() - start_clock > max_cycles) break;
  }
}

inline void launch_fill(void* p, std::size_t n, std::uint32_t seed, cudaStream_t stream) {
  if (n == 0) return;
  const unsigned threads = 256;
  const std::uint64_t wanted = (n + threads - 1) / threads;
  const unsigned blocks = static_cast<unsigned>(std::min<std::uint64_t>(wanted, 2048));
  fill_kernel<<<blocks, threads, 0, stream>>>(static_cast<std::uint8_t*>(p), n, seed);
  cuda_check(cudaGetLastError(), "fill_kernel launch");
}

inline void launch_spin(unsigned long long ns, cudaStream_t stream) {
  spin_kernel<<<1, 1, 0, stream>>>(ns);
  cuda_check(cudaGetLastError(), "spin_kernel launch");
}

/// Copies the block to the host and compares every byte with the pattern of `seed`.
/// Returns "" when all match, else a description of the first mismatch and the count.
inline std::string verify_block(const void* p, std::size_t n, std::uint32_t seed) {
  std::vector<std::uint8_t> host(n);
  cuda_check(cudaMemcpy(host.data(), p, n, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  std::size_t bad = 0;
  std::size_t first = n;
  for (std::size_t i = 0; i < n; ++i) {
    if (host[i] != pattern_byte(seed, i)) {
      if (bad == 0) first = i;
      ++bad;
    }
  }
  if (bad == 0) return "";
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "block %p (%zu bytes, seed %u): %zu bytes differ, first at offset %zu "
                "(0x%02x, expected 0x%02x)",
                p, n, seed, bad, first, host[first], pattern_byte(seed, first));
  return buf;
}

__global__ void count_mismatches_kernel(const std::uint8_t* p, std::uint64_t n, std::uint32_t seed,
                                        unsigned long long* bad) {
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  unsigned long long mine = 0;
  for (std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    if (p[i] != pattern_byte(seed, i)) ++mine;
  }
  if (mine != 0) atomicAdd(bad, mine);
}

/// Counts, on the device, the bytes of blocks that differ from their seed's pattern (for blocks
/// too large to check on the host). The counter lives in mapped host memory, so it takes no
/// device memory (tests compare cudaMemGetInfo before and after).
class MismatchCounter {
 public:
  MismatchCounter() {
    cuda_check(cudaHostAlloc(reinterpret_cast<void**>(&host_), sizeof *host_, cudaHostAllocMapped),
               "cudaHostAlloc");
    cuda_check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_), host_, 0),
               "cudaHostGetDevicePointer");
  }
  ~MismatchCounter() { (void)cudaFreeHost(host_); }
  MismatchCounter(const MismatchCounter&) = delete;
  MismatchCounter& operator=(const MismatchCounter&) = delete;

  /// Bytes of [p, p + n) that differ from the pattern of `seed`; waits for `stream`.
  std::uint64_t count(const void* p, std::size_t n, std::uint32_t seed, cudaStream_t stream) {
    *host_ = 0;
    if (n != 0) {
      const unsigned threads = 256;
      const auto blocks = static_cast<unsigned>(
          std::min<std::uint64_t>((n + threads - 1) / threads, 2048));
      count_mismatches_kernel<<<blocks, threads, 0, stream>>>(static_cast<const std::uint8_t*>(p), n,
                                                              seed, dev_);
      cuda_check(cudaGetLastError(), "count_mismatches_kernel launch");
    }
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return *host_;
  }

 private:
  unsigned long long* host_ = nullptr;
  unsigned long long* dev_ = nullptr;
};

inline std::int64_t stat(const stitch::Allocator& a, const char* key) {
  const auto v = a.stat(0, key);
  return v ? *v : -1;
}

struct Streams {
  std::vector<cudaStream_t> s;
  explicit Streams(int n) {
    for (int i = 0; i < n; ++i) {
      cudaStream_t st = nullptr;
      cuda_check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
      s.push_back(st);
    }
  }
  ~Streams() {
    for (cudaStream_t st : s) (void)cudaStreamDestroy(st);
  }
  Streams(const Streams&) = delete;
  Streams& operator=(const Streams&) = delete;
};

constexpr std::size_t kMiB = std::size_t{1} << 20;

struct LiveBlock {
  void* ptr = nullptr;
  std::size_t size = 0;
  std::uint32_t seed = 0;
};

// ---- test steps shared by the stitching and compaction tests ---------------------------------

/// Device free memory once the CUDA context and the test kernels are loaded (lazy module
/// loading maps their code on first launch), so that it can be compared at the end.
inline std::size_t settled_free_memory(cudaStream_t s, MismatchCounter& counter) {
  void* p = nullptr;
  cuda_check(cudaMalloc(&p, kMiB), "cudaMalloc");
  launch_spin(1000, s);
  launch_fill(p, kMiB, 1, s);
  const std::uint64_t bad = counter.count(p, kMiB, 1, s);
  cuda_check(cudaFree(p), "cudaFree");
  if (bad != 0) throw std::runtime_error("warm-up kernels wrote a wrong pattern");
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::size_t free = 0, total = 0;
  cuda_check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free;
}

/// The device's free memory is back within two granules of `start`.
inline void expect_memory_back(std::size_t start, std::size_t granule) {
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::size_t free = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  const std::size_t diff = free > start ? free - start : start - free;
  EXPECT_LE(diff, 2 * granule) << "device free memory " << free << " at the end, " << start
                               << " at the start";
}

/// Checks every block of `blocks` (each with .ptr and .size) on the device against the pattern
/// of `seed_of(block)`; returns how many differ (each one a test failure).
template <class Blocks, class SeedOf>
int count_damaged(const Blocks& blocks, SeedOf&& seed_of, MismatchCounter& counter, cudaStream_t s) {
  int damaged = 0;
  for (const auto& b : blocks) {
    const std::uint64_t bad = counter.count(b.ptr, b.size, seed_of(b), s);
    if (bad != 0) {
      ++damaged;
      ADD_FAILURE() << "live block " << b.ptr << " (" << b.size << " bytes): " << bad
                    << " bytes differ from its pattern";
    }
  }
  return damaged;
}

/// "" when the allocator can stitch on device 0, else why not.
inline std::string vmm_missing(stitch::Allocator& alloc) {
  return alloc.backend().supports_virtual_memory(0)
             ? ""
             : "device 0 has no virtual memory management (stitching needs it)";
}

/// Whether `stream` still has work queued (cudaStreamQuery), clearing the not-ready error.
inline bool busy(cudaStream_t stream) {
  const cudaError_t e = cudaStreamQuery(stream);
  (void)cudaGetLastError();
  return e == cudaErrorNotReady;
}

struct Event {
  cudaEvent_t e = nullptr;
  Event() { cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate"); }
  ~Event() { (void)cudaEventDestroy(e); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
};

}  // namespace
}  // namespace stitch_cuda_test
