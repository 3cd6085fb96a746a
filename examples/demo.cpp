// examples/demo.cpp — stitch at work: reuse, splitting, cross-stream safety, stats, and an
// out-of-memory report. Uses the GPU when there is one (backend:cuda), and says so when it falls
// back to the simulated device instead.
#include <cstdio>
#include <memory>
#include <string>

#include "stitch/stitch.hpp"

namespace {

std::string mib(std::int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

void show(const stitch::Allocator& a, const char* what) {
  const stitch::DeviceStats s = a.stats(0);
  std::printf("  %-44s allocated %-11s reserved %-11s segments %lld  device allocs %lld\n", what,
              mib(s.allocated_bytes[stitch::kAll].current).c_str(),
              mib(s.reserved_bytes[stitch::kAll].current).c_str(),
              static_cast<long long>(s.segment[stitch::kAll].current),
              static_cast<long long>(s.num_device_alloc));
}

std::unique_ptr<stitch::Allocator> make_allocator(bool force_sim) {
  if (!force_sim) {
    try {
      auto a = std::make_unique<stitch::Allocator>(stitch::Config::parse("backend:cuda"));
      std::printf("backend: cuda (a real GPU)\n");
      return a;
    } catch (const stitch::error& e) {
      std::printf("backend:cuda is not available here: %s\n", e.what());
    }
  }
  std::printf("backend: sim (simulated 8 GiB device; pointers are host memory)\n");
  return std::make_unique<stitch::Allocator>(
      stitch::Config::parse("backend:sim,sim_capacity_mb:8192"));
}

}  // namespace

int main(int argc, char** argv) {
  const bool force_sim = argc > 1 && std::string(argv[1]) == "--sim";
  auto alloc = make_allocator(force_sim);
  stitch::Allocator& a = *alloc;

  std::printf("\n1. Caching: a freed block is reused without a device call\n");
  void* p = a.allocate(1000);
  show(a, "allocate 1000 B (rounded to 1024 B)");
  a.deallocate(p);
  void* q = a.allocate(1000);
  show(a, q == p ? "free + allocate again: same pointer back" : "free + allocate again");
  a.deallocate(q);

  std::printf("\n2. Splitting: 1-10 MiB requests share one 20 MiB segment\n");
  void* b1 = a.allocate(3 << 20);
  void* b2 = a.allocate(5 << 20);
  void* b3 = a.allocate(7 << 20);
  show(a, "3 + 5 + 7 MiB: one new 20 MiB segment");
  a.deallocate(b2);
  show(a, "free the 5 MiB block (a hole in the segment)");
  a.deallocate(b1);
  a.deallocate(b3);
  show(a, "free the rest: coalesced into one free block");

  std::printf("\n3. Streams: a block used on another stream waits for that stream\n");
  auto* side = reinterpret_cast<stitch::stream_t>(0x5);  // any non-null handle on the sim device
  if (std::string(a.backend().name()) == "sim") {
    auto& sim = static_cast<stitch::SimBackend&>(a.backend());
    void* t = a.allocate(64 << 10);
    a.record_stream(t, side);
    sim.hold_stream(side);  // the side stream is still busy
    a.deallocate(t);
    void* u = a.allocate(64 << 10);
    std::printf("  side stream busy:  new block %s the freed one\n", u == t ? "REUSES" : "avoids");
    sim.release_stream(side);  // its work completes
    a.deallocate(u);
    void* v = a.allocate(64 << 10);
    std::printf("  side stream done:  new block %s the freed one\n", v == t ? "reuses" : "avoids");
    a.deallocate(v);
  } else {
    std::printf("  (shown on the simulated device only; run with --sim)\n");
  }

  std::printf("\n4. Out of memory, explained (memory capped at 256 MiB for the demo)\n");
  const double total = static_cast<double>(a.backend().memory_info(0).total);
  a.set_memory_fraction((256.0 * (1 << 20)) / total, 0);
  void* held[24] = {};
  for (auto& h : held) h = a.allocate(9 << 20);           // two per 20 MiB segment: 240 MiB
  for (int i = 0; i < 24; i += 2) a.deallocate(held[i]);  // 108 MiB free, in 9 MiB holes
  show(a, "24 x 9 MiB, every other one freed");
  try {
    void* big = a.allocate(64 << 20);
    a.deallocate(big);
  } catch (const stitch::out_of_memory& e) {
    std::printf("  stitch::out_of_memory: %s\n", e.what());
  }
  for (int i = 1; i < 24; i += 2) a.deallocate(held[i]);
  a.empty_cache();
  a.set_memory_fraction(1.0, 0);

  std::printf("\n5. Statistics (PyTorch's memory_stats names)\n");
  const stitch::DeviceStats s = a.stats(0);
  for (const char* key : {"allocation.all.allocated", "allocated_bytes.all.peak",
                          "reserved_bytes.all.peak", "reserved_bytes.all.current",
                          "num_device_alloc", "num_device_free", "num_alloc_retries", "num_ooms"}) {
    std::printf("  %-28s %lld\n", key, static_cast<long long>(*s.get(key)));
  }
  a.validate();
  std::printf("\ndemo finished: every internal invariant holds\n");
  return 0;
}
