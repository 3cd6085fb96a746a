// adapter_rmm.cpp — RAPIDS RMM 26.10 pool_memory_resource (coalescing best fit, per-stream free
// lists with an event per stream) over cuda_memory_resource, on the stub CUDA runtime: one pool
// per device (RMM's usual multi-GPU set-up), each created with its device current.
// Headers from the librmm-cu13 26.10.0 wheel; RMM's compiled parts (pool_memory_resource_impl,
// cuda_memory_resource, logger, ...) are rebuilt from source here against the stub (build-rmm.sh),
// because the wheel's librmm.so links cudart statically and would never reach the stub.
#include <cuda_runtime_api.h>
#include <rmm/cuda_stream_view.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <vector>

#include "loops.hpp"

namespace {
std::vector<std::unique_ptr<rmm::mr::pool_memory_resource>> g_pools;

void rmm_setup() {
  int n = 1;
  cudaGetDeviceCount(&n);
  for (int d = 0; d < n; ++d) {
    cudaSetDevice(d);
    // 1 GiB initial pool, no maximum: every case below is served from the pool after warm-up
    // (PB_RMM_INITIAL_MB: another initial size; the training loop's run starts from 0)
    const char* mb = std::getenv("PB_RMM_INITIAL_MB");
    const std::size_t initial = (mb ? std::strtoull(mb, nullptr, 10) : 1024) << 20;
    g_pools.push_back(std::make_unique<rmm::mr::pool_memory_resource>(rmm::mr::cuda_memory_resource{},
                                                                      initial, std::nullopt));
    std::fprintf(stderr, "[rmm] device %d: pool_memory_resource, pool size %zu\n", d, g_pools.back()->pool_size());
  }
  cudaSetDevice(0);
}
std::size_t rmm_peak_reserved() { return g_pools.empty() ? 0 : g_pools[0]->pool_size(); }  // it never shrinks
int rmm_devices() { return static_cast<int>(g_pools.size()); }
void rmm_bind(int device) { cudaSetDevice(device); }
auto ralloc = [](std::size_t s, pb::Ctx c) {
  return g_pools[c.device]->allocate(cuda::stream_ref{static_cast<cudaStream_t>(c.stream)}, s,
                                     rmm::CUDA_ALLOCATION_ALIGNMENT);
};
auto rfree = [](void* p, std::size_t s, pb::Ctx c) {
  g_pools[c.device]->deallocate(cuda::stream_ref{static_cast<cudaStream_t>(c.stream)}, p, s,
                                rmm::CUDA_ALLOCATION_ALIGNMENT);
};
PB_DEFINE_LOOPS(rmm, ralloc, rfree)
}  // namespace

extern const Adapter rmm_pool_adapter = PB_ADAPTER(rmm, "RMM pool_memory_resource", rmm_setup, rmm_bind, rmm_devices, rmm_peak_reserved);
