// adapter_glibc.cpp — glibc malloc/free of the same sizes: the CPU floor (no devices: a thread
// "on device 1" just mallocs).
#include <cstdlib>
#include "loops.hpp"

namespace {
auto galloc = [](std::size_t s, pb::Ctx) { return std::malloc(s); };
auto gfree = [](void* p, std::size_t, pb::Ctx) { std::free(p); };
PB_DEFINE_LOOPS(glibc, galloc, gfree)
void glibc_setup() {}
void glibc_bind(int) {}
int glibc_devices() { return 64; }
}  // namespace

extern const Adapter glibc_adapter = PB_ADAPTER(glibc, "glibc malloc/free", glibc_setup, glibc_bind, glibc_devices, nullptr);
