// adapter_stitch_b.cpp — a second stitch build in the same process (before/after): its C API
// from STITCH_BUILD_B/libstitch.so, loaded with dlmopen into a new link-map namespace so that its
// symbols (and its process-wide allocator) are separate from the linked build's. Calls go through
// function pointers from dlsym, as calls to a shared library go through the PLT anyway.
// Only the C API: the C++ API's classes cannot be shared between two builds' headers safely.
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "loops.hpp"

namespace {
using malloc_fn = void* (*)(std::size_t, int, void*);
using free_fn = void (*)(void*, std::size_t, int, void*);
using err_fn = const char* (*)();
malloc_fn b_malloc = nullptr;
free_fn b_free = nullptr;
using stat_fn = std::int64_t (*)(int, const char*);
stat_fn b_stat = nullptr;

void b_setup() {
  const char* dir = std::getenv("STITCH_BUILD_B");
  const std::string lib = std::string(dir ? dir : ".") + "/libstitch.so";
  void* h = dlmopen(LM_ID_NEWLM, lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    std::fprintf(stderr, "stitch B: dlmopen %s: %s\n", lib.c_str(), dlerror());
    std::abort();
  }
  b_malloc = reinterpret_cast<malloc_fn>(dlsym(h, "stitch_malloc"));
  b_free = reinterpret_cast<free_fn>(dlsym(h, "stitch_free"));
  auto b_err = reinterpret_cast<err_fn>(dlsym(h, "stitch_last_error"));
  b_stat = reinterpret_cast<stat_fn>(dlsym(h, "stitch_stat"));
  if (!b_malloc || !b_free || !b_err) {
    std::fprintf(stderr, "stitch B: %s lacks the C API\n", lib.c_str());
    std::abort();
  }
  void* p = b_malloc(512, 0, nullptr);
  if (!p) {
    std::fprintf(stderr, "stitch B C API: %s\n", b_err());
    std::abort();
  }
  b_free(p, 512, 0, nullptr);
  std::fprintf(stderr, "[stitch B] C API from %s (own namespace)\n", lib.c_str());
}
void no_bind(int) {}
std::size_t b_peak_reserved() {
  return b_stat ? static_cast<std::size_t>(b_stat(0, "reserved_bytes.all.peak")) : 0;
}
int b_devices() { return 64; }  // the same STITCH_ALLOC_CONF as build A; main() takes A's count
auto balloc = [](std::size_t s, pb::Ctx c) { return b_malloc(s, c.device, c.stream); };
auto bfree = [](void* p, std::size_t s, pb::Ctx c) { b_free(p, s, c.device, c.stream); };
PB_DEFINE_LOOPS(sb, balloc, bfree)
}  // namespace

extern const Adapter stitch_b_adapter = PB_ADAPTER(sb, "stitch C API (B)", b_setup, no_bind, b_devices, b_peak_reserved);
