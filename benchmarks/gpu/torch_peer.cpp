// benchmarks/gpu/torch_peer.cpp — PyTorch's CUDACachingAllocator as a stitch_gpu_bench peer,
// through its C++ API (raw_alloc_with_stream / raw_delete and the device statistics). Built only
// when CMake found torch for python3 (STITCH_BENCH_HAVE_TORCH); the only file that sees torch.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>

#include "peers.hpp"

namespace stitch_bench {
namespace {

namespace cca = c10::cuda::CUDACachingAllocator;

class TorchPeer final : public Peer {
 public:
  explicit TorchPeer(cudaStream_t stream) : stream_(stream) {
    // What torch's lazy CUDA initialisation does before the first allocation.
    cca::init(static_cast<int>(c10::cuda::device_count()));
  }
  ~TorchPeer() override {
    try {
      cca::emptyCache();
    } catch (...) {
    }
  }
  void* alloc(std::size_t bytes) override {
    void* p = cca::raw_alloc_with_stream(bytes, stream_);
    if (p == nullptr) throw std::runtime_error("raw_alloc_with_stream returned nullptr");
    return p;
  }
  void free(void* ptr, std::size_t) override { cca::raw_delete(ptr); }
  void release_cache() override {
    if (cudaStreamSynchronize(stream_) != cudaSuccess) (void)cudaGetLastError();
    cca::emptyCache();
  }
  void reset_peak() override { cca::resetPeakStats(0); }
  std::int64_t peak_reserved() override {
    const auto stats = cca::getDeviceStats(0);
    return static_cast<std::int64_t>(stats.reserved_bytes[0].peak);  // [0]: all pools
  }
  std::int64_t peak_segments() override {
    const auto stats = cca::getDeviceStats(0);
    return static_cast<std::int64_t>(stats.segment[0].peak);
  }

 private:
  cudaStream_t stream_;
};

}  // namespace

std::unique_ptr<Peer> make_torch_peer(cudaStream_t stream) {
  return std::make_unique<TorchPeer>(stream);
}

}  // namespace stitch_bench
