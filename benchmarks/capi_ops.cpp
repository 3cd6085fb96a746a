// benchmarks/capi_ops.cpp — a fixed sequence of C API requests, for counting instructions per
// request pair under callgrind (scripts/instructions-per-op.sh): deterministic where timings on
// a shared machine are not. `capi_ops MODE N` runs N steps of one workload after a warm-up of
// every size of a real trace (benchmarks/peers/src/trace_sizes.hpp) on backend:sim:
//   0  the same-size pair, 512 B
//   1  the mix 4K/64K/1M/8M in turn, each allocated and freed
//   2  a real trace's requests in order, 8 blocks live (each frees the block of 8 requests before)
//   3  the mix with 64 live blocks (16 KiB to 32 MiB) around it
//   4  a real trace's requests in order, each allocated and freed
//   5  random: up to 1000 live, sizes 512 B to 1 MiB (log-uniform), a fixed xorshift sequence
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <utility>

#include "peers/src/trace_sizes.hpp"
#include "stitch/stitch.h"

namespace {

constexpr std::size_t kMix[4] = {std::size_t{4} << 10, std::size_t{64} << 10, std::size_t{1} << 20,
                                 std::size_t{8} << 20};

void pair(std::size_t size) { stitch_free(stitch_malloc(size, 0, nullptr), size, 0, nullptr); }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: capi_ops MODE(0-5) N\n");
    return 2;
  }
  const int mode = std::atoi(argv[1]);
  const long n = std::atol(argv[2]);
  if (stitch_configure("backend:sim,sim_capacity_mb:65536") != 0) {
    std::fprintf(stderr, "capi_ops: %s\n", stitch_last_error());
    return 1;
  }
  constexpr std::size_t kTrace = std::size(pb::kTraceSizes);
  for (std::size_t s : pb::kTraceSizes) pair(s);
  if (mode == 3)
    for (int i = 0; i < 64; ++i) (void)stitch_malloc((std::size_t{16} << 10) << (i % 12), 0, nullptr);
  std::pair<void*, std::size_t> window[8] = {};
  std::pair<void*, std::size_t> pool[1000] = {};
  int live = 0;
  unsigned long long x = 88172645463325252ull;
  for (long i = 0; i < n; ++i) {
    const auto k = static_cast<std::size_t>(i);
    switch (mode) {
      case 0: pair(512); break;
      case 1: case 3: pair(kMix[k & 3]); break;
      case 2: {
        const std::size_t s = pb::kTraceSizes[k % kTrace];
        void* p = stitch_malloc(s, 0, nullptr);
        auto& slot = window[k % 8];
        if (slot.first != nullptr) stitch_free(slot.first, slot.second, 0, nullptr);
        slot = {p, s};
        break;
      }
      case 4: pair(pb::kTraceSizes[k % kTrace]); break;
      case 5: {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if (live == 0 || (live < 1000 && (x & 1) != 0)) {
          std::size_t s = std::size_t{512} << ((x >> 8) % 12);
          s += (x >> 20) % s;
          pool[live++] = {stitch_malloc(s, 0, nullptr), s};
        } else {
          const auto j = static_cast<int>((x >> 32) % static_cast<unsigned>(live));
          stitch_free(pool[j].first, pool[j].second, 0, nullptr);
          pool[j] = pool[--live];
        }
        break;
      }
      default:
        std::fprintf(stderr, "capi_ops: unknown mode %d\n", mode);
        return 2;
    }
  }
  return 0;
}
