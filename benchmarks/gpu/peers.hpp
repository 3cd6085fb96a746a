// benchmarks/gpu/peers.hpp — the allocators stitch_gpu_bench compares, behind one interface, and
// the CUDA error check its sources share. gpu_bench.cpp implements cudaMalloc, cudaMallocAsync,
// stitch and check(); torch_peer.cpp (compiled only when CMake found PyTorch for python3)
// implements PyTorch's CUDACachingAllocator.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace stitch_bench {

/// Throws std::runtime_error("<what> failed: <error name>: <error text>") unless `err` is
/// cudaSuccess (clearing the runtime's last error first).
void check(cudaError_t err, const char* what);

/// One allocator under test, on device 0. Every method throws std::exception on failure.
class Peer {
 public:
  virtual ~Peer() = default;
  /// Allocates `bytes` for use on the peer's stream.
  virtual void* alloc(std::size_t bytes) = 0;
  /// Frees a pointer from alloc() (`bytes`: its size).
  virtual void free(void* ptr, std::size_t bytes) = 0;
  /// Waits for the peer's queued work (only the stream-ordered allocator queues any).
  virtual void sync() {}
  /// Gives every cached byte back to the device (empty_cache / trim).
  virtual void release_cache() = 0;
  /// Starts a new peak of reserved bytes from the current value.
  virtual void reset_peak() = 0;
  /// The most bytes reserved from the device since reset_peak().
  virtual std::int64_t peak_reserved() = 0;
  /// Peak count of cudaMalloc'ed segments since reset_peak(), -1 if unknown.
  virtual std::int64_t peak_segments() { return -1; }
};

#if defined(STITCH_BENCH_HAVE_TORCH)
/// PyTorch's CUDACachingAllocator (raw_alloc_with_stream / raw_delete) on `stream`, device 0.
/// Its settings come from PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF, read by PyTorch itself.
std::unique_ptr<Peer> make_torch_peer(cudaStream_t stream);
#endif

}  // namespace stitch_bench
