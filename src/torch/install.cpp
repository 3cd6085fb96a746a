// torch/install.cpp — stitch_torch_native_install (include/stitch/torch_native_install.h): makes
// make_allocator()'s allocator PyTorch's CUDA allocator, as changeCurrentAllocator does, for
// callers that cannot link torch's C++ (stitch.torch's ctypes loader).
#include "stitch/torch_native_install.h"

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <exception>
#include <memory>
#include <mutex>
#include <string>

#include "stitch/torch_native.hpp"

namespace {
std::mutex g_mutex;
std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> g_installed;  // kept for the process
thread_local std::string t_error;
}  // namespace

extern "C" int stitch_torch_native_install(void) {
  try {
    std::lock_guard lock(g_mutex);
    if (g_installed != nullptr) return 0;
    auto* current = c10::cuda::CUDACachingAllocator::allocator.load();
    if (current != nullptr && current->initialized()) {
      t_error = "PyTorch's CUDA allocator is initialized already (CUDA was used): it cannot be swapped";
      return -1;
    }
    auto ours = stitch::torch_native::make_allocator();
    c10::cuda::CUDACachingAllocator::allocator.store(ours.get());
    c10::SetAllocator(c10::DeviceType::CUDA, ours.get(), /*priority=*/2);
    g_installed = std::move(ours);
    return 0;
  } catch (const std::exception& e) {
    t_error = e.what();
  } catch (...) {
    t_error = "unknown error";
  }
  return -1;
}

extern "C" const char* stitch_torch_native_error(void) { return t_error.c_str(); }
