// stitch/torch_native.hpp — stitch as PyTorch's CUDA allocator (libstitch_torch): a subclass of
// c10::cuda::CUDACachingAllocator::CUDAAllocator over the process's stitch allocator (the one
// stitch_configure() or STITCH_ALLOC_CONF set up, stitch::process_allocator()). Built against
// the torch that is installed (-DSTITCH_WITH_TORCH=ON), as every C++ extension is; install it
// before torch initializes CUDA:
//   c10::cuda::CUDACachingAllocator::allocator.store(stitch::torch_native::make_allocator().get())
// (keeping the shared_ptr alive), or torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator.
// docs/python.md lists what each method does.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <memory>

namespace stitch::torch_native {
/// Where the allocator reads the current device and stream. The default reads c10::cuda's;
/// tests pass their own, so that nothing initializes CUDA.
struct DeviceContext {
  virtual ~DeviceContext() = default;
  virtual int current_device() = 0;
  virtual void* current_stream(int device) = 0;  // a cudaStream_t
};
std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator>
make_allocator(std::shared_ptr<DeviceContext> context = nullptr);
}  // namespace stitch::torch_native
