// adapter_torch.cpp — PyTorch's CUDACachingAllocator (native backend, defaults) from the
// installed torch wheel: raw_alloc_with_stream / raw_delete, on the stub CUDA runtime. It
// allocates on the thread's current device (bind() sets it with cudaSetDevice, as a training
// process does once per rank/thread); with STUB_DEVICES=2 the stub reports two devices.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include <cstdio>

#include "loops.hpp"

namespace {
namespace cca = c10::cuda::CUDACachingAllocator;
int g_n = 1;

void torch_setup() {
  g_n = c10::cuda::device_count();
  std::fprintf(stderr, "[torch] device_count()=%d, allocator backend=%s\n", g_n, cca::get()->name().c_str());
  cca::init(g_n);
}
std::size_t torch_peak_reserved() {
  return static_cast<std::size_t>(cca::getDeviceStats(0).reserved_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak);
}
int torch_devices() { return g_n; }
void torch_bind(int device) { c10::cuda::set_device(static_cast<c10::DeviceIndex>(device)); }
auto talloc = [](std::size_t s, pb::Ctx c) {
  return cca::raw_alloc_with_stream(s, static_cast<cudaStream_t>(c.stream));
};
auto tfree = [](void* p, std::size_t, pb::Ctx) { cca::raw_delete(p); };
PB_DEFINE_LOOPS(torch, talloc, tfree)
}  // namespace

extern const Adapter torch_adapter = PB_ADAPTER(torch, "PyTorch CUDACachingAllocator", torch_setup, torch_bind, torch_devices, torch_peak_reserved);
