// examples/oom_what_if.cpp — the out-of-memory what-if check at work on a simulated 1000 MiB
// device: a fragmentation failure checked from the recorded history, the same failure checked
// from the device's layout (no history), and a failure that no configuration fixes. The output
// is pasted in docs/diagnostics.md, section 5.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/sim_backend.hpp"

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

auto* const kStream = reinterpret_cast<stitch::stream_t>(0x10);

std::unique_ptr<stitch::Allocator> make(const std::string& conf) {
  stitch::SimBackend::Options o;
  o.capacity = 1000 * kMiB;
  return std::make_unique<stitch::Allocator>(stitch::Config::parse("backend:sim," + conf),
                                             std::make_shared<stitch::SimBackend>(o));
}

// Allocates `live` then `hole` bytes until the device is full, frees the holes, asks for 8 MiB.
void fail(stitch::Allocator& a, std::size_t live, std::size_t hole) {
  std::vector<void*> holes;
  for (std::size_t i = 0; i < 1000 * kMiB / (live + hole); ++i) {
    (void)a.allocate(live, kStream);
    holes.push_back(a.allocate(hole, kStream));
  }
  for (void* p : holes) a.deallocate(p);
  try {
    (void)a.allocate(8 * kMiB, kStream);
    std::puts("served");
  } catch (const stitch::out_of_memory& e) {
    std::printf("%s\n\n", e.what());
  }
}

}  // namespace

int main() {
  std::puts("== 5 MiB holes, recorded history ==");
  auto a = make("record_history:True");
  fail(*a, 5 * kMiB, 5 * kMiB);
  const stitch::Snapshot s = a->snapshot();
  const auto& trace = s.device_traces[0];
  std::printf("history: %zu entries, the last two: %s, %s; num_ooms=%lld\n\n", trace.size(),
              stitch::to_string(trace[trace.size() - 2].action),
              stitch::to_string(trace.back().action),
              static_cast<long long>(*a->stat(0, "num_ooms")));

  std::puts("== 5 MiB holes, no history ==");
  fail(*make(""), 5 * kMiB, 5 * kMiB);

  std::puts("== 1.5 MiB holes between 2.5 MiB blocks, recorded history ==");
  fail(*make("record_history:True"), 5 * kMiB / 2, 3 * kMiB / 2);

  std::puts("== 5 MiB holes, oom_what_if:False ==");
  fail(*make("oom_what_if:False"), 5 * kMiB, 5 * kMiB);
  return 0;
}
