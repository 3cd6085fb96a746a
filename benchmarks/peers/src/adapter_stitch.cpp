// adapter_stitch.cpp — stitch on its simulated device (backend:sim): the C++ API
// (stitch::Allocator::allocate(size, stream, device) / deallocate(ptr)) and the C API
// (stitch_malloc / stitch_free, the signatures PyTorch's CUDAPluggableAllocator calls), both
// configured from STITCH_ALLOC_CONF (the run script sets backend:sim,sim_devices:2,...).
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "loops.hpp"
#include "stitch/allocator.hpp"
#include "stitch/stitch.h"

namespace {
std::unique_ptr<stitch::Allocator> g_alloc;

stitch::Config env_config() {
  const char* conf = std::getenv("STITCH_ALLOC_CONF");
  return stitch::Config::parse(conf ? conf : "backend:sim");
}
void cxx_setup() { g_alloc = std::make_unique<stitch::Allocator>(env_config()); }
void no_bind(int) {}
int stitch_sim_devices() { return env_config().sim_devices; }
auto salloc = [](std::size_t s, pb::Ctx c) { return g_alloc->allocate(s, c.stream, c.device); };
auto sfree = [](void* p, std::size_t, pb::Ctx) { g_alloc->deallocate(p); };
PB_DEFINE_LOOPS(scxx, salloc, sfree)
std::size_t cxx_peak_reserved() { return static_cast<std::size_t>(g_alloc->stats(0).reserved_bytes[0].peak); }

void capi_setup() {
  void* p = stitch_malloc(512, 0, nullptr);
  if (!p) {
    std::fprintf(stderr, "stitch C API: %s\n", stitch_last_error());
    std::abort();
  }
  stitch_free(p, 512, 0, nullptr);
}
auto calloc_ = [](std::size_t s, pb::Ctx c) { return stitch_malloc(s, c.device, c.stream); };
auto cfree = [](void* p, std::size_t s, pb::Ctx c) { stitch_free(p, s, c.device, c.stream); };
PB_DEFINE_LOOPS(scapi, calloc_, cfree)
std::size_t capi_peak_reserved() { return static_cast<std::size_t>(stitch_stat(0, "reserved_bytes.all.peak")); }
}  // namespace

extern const Adapter stitch_cxx_adapter = PB_ADAPTER(scxx, "stitch C++ API", cxx_setup, no_bind, stitch_sim_devices, cxx_peak_reserved);
extern const Adapter stitch_capi_adapter = PB_ADAPTER(scapi, "stitch C API", capi_setup, no_bind, stitch_sim_devices, capi_peak_reserved);
