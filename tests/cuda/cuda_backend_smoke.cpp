// tests/cuda/cuda_backend_smoke.cpp — a stand-alone device check of the CUDA back end: every
// Backend method once on device 0 (ctest: cuda.backend_smoke on a GPU, fake_cuda.backend_smoke on
// the strict fake driver). Build and run from the repository root:
//   g++ -std=c++20 -Wall -Wextra -Iinclude -Isrc -I/usr/local/cuda/include
//       tests/cuda/cuda_backend_smoke.cpp src/backends/cuda/*.cpp -ldl -o /tmp/cuda_smoke
//   (one command line; no CUDA library is linked: the driver is opened at run time)
//   /tmp/cuda_smoke    # exit 0: passed, 77: no CUDA device (skipped), 1: failed

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>

#include "backends/cuda/cuda_backend.hpp"
#include "stitch/config.hpp"
#include "stitch/errors.hpp"

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  if (!ok) ++failures;
}

template <class F>
void expect_backend_error(F&& f, const char* what) {
  try {
    f();
    check(false, what);
  } catch (const stitch::backend_error& e) {
    std::printf("     (%s)\n", e.what());
    check(true, what);
  }
}

}  // namespace

int main() {
  std::shared_ptr<stitch::Backend> b;
  try {
    b = stitch::make_cuda_backend(stitch::Config{});
  } catch (const stitch::backend_error& e) {
    std::printf("skipped: %s\n", e.what());
    return 77;
  }
  try {
    const int dev = 0;
    check(std::string(b->name()) == "cuda", "name() is \"cuda\"");
    std::printf("     %d device(s)\n", b->device_count());
    const stitch::MemoryInfo info = b->memory_info(dev);
    std::printf("     free %zu / total %zu\n", info.free, info.total);
    check(info.total > 0 && info.free <= info.total, "memory_info");
    const std::size_t g = b->granularity(dev);
    std::printf("     granularity %zu, vmm %d\n", g, int(b->supports_virtual_memory(dev)));
    check(g > 0 && (g & (g - 1)) == 0, "granularity is a power of two");

    void* p = b->allocate(dev, 2 << 20);
    check(p != nullptr && reinterpret_cast<std::uintptr_t>(p) % 512 == 0, "allocate 2 MiB");
    b->deallocate(dev, p, 2 << 20);
    check(b->allocate(dev, info.total * 4) == nullptr, "allocate beyond capacity -> nullptr");
    void* q = b->allocate(dev, 1 << 20);  // the OOM above must not have left a sticky error
    check(q != nullptr, "allocate after OOM");
    b->deallocate(dev, q, 1 << 20);

    if (b->supports_virtual_memory(dev)) {
      void* va = b->reserve(dev, 4 * g, g);
      check(va != nullptr, "reserve 4 granules");
      const stitch::phys_handle_t h1 = b->create_physical(dev, g);
      const stitch::phys_handle_t h2 = b->create_physical(dev, g);
      check(h1 != 0 && h2 != 0, "create_physical x2");
      check(b->map(dev, va, g, h1) && b->map(dev, static_cast<char*>(va) + g, g, h2), "map x2");
      b->release_physical(dev, h1);  // still mapped: freed at unmap
      b->unmap(dev, va, 2 * g);      // one unmap over two mappings
      b->release_physical(dev, h2);
      b->release_reservation(dev, va, 4 * g);
      check(true, "unmap / release");
      check(b->create_physical(dev, info.total * 4 / g * g) == 0, "create_physical beyond capacity -> 0");
      // A real handle onto the released range: refused (a made-up handle would be undefined).
      const stitch::phys_handle_t h3 = b->create_physical(dev, g);
      check(h3 != 0, "create_physical");
      expect_backend_error([&] { (void)b->map(dev, va, g, h3); }, "map onto a released range throws");
      b->release_physical(dev, h3);
    }

    stitch::event_t e = b->create_event(dev);
    b->record_event(dev, e, nullptr);
    b->synchronize_event(dev, e);
    check(b->query_event(dev, e), "event completes on the default stream");
    b->synchronize_stream(dev, nullptr);
    b->destroy_event(dev, e);
    check(true, "events and streams");

    expect_backend_error([&] { (void)b->memory_info(b->device_count()); }, "bad device throws");
  } catch (const std::exception& e) {
    std::printf("FAIL unexpected exception: %s\n", e.what());
    return 1;
  }
  std::printf("%s\n", failures == 0 ? "PASSED" : "FAILED");
  return failures == 0 ? 0 : 1;
}
