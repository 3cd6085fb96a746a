// loops.hpp — the timed loops, instantiated in each adapter's translation unit so that the
// allocator's calls are made directly from the loop (no extra indirection added by the harness).
// The cases mirror benchmarks/mix_bench.cpp (and alloc_bench.cpp's same-size pair).
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "trace_sizes.hpp"

namespace pb {
inline void escape(void* p) { asm volatile("" : : "r"(p) : "memory"); }

// Where a loop runs: the stream its pairs use and the device (0 unless the case spreads threads
// over two devices; the adapter's bind() has made it current for allocators that use a current
// device).
struct Ctx {
  void* stream;
  int device;
};

// what a loop does per "pair" (one allocate and one free)
enum Kind : int {
  kPair = 0,    // one size again and again
  kMixed = 1,   // 4 KiB, 64 KiB, 1 MiB, 8 MiB in turn (mix_bench's kMix)
  kTrace = 2,   // the sizes of a real trace in order (trace_sizes.hpp), each allocated and freed
  kWindow = 3,  // the same sizes, 8 live: allocate the next, free the one allocated 8 steps ago
};
inline constexpr std::size_t kMix[4] = {std::size_t{4} << 10, std::size_t{64} << 10, std::size_t{1} << 20,
                                        std::size_t{8} << 20};
inline constexpr int kWindowN = 8;

template <class Alloc, class Free>
inline void pair_loop(Alloc alloc, Free release, std::size_t size, Ctx c, long n) {
  for (long i = 0; i < n; ++i) {
    void* p = alloc(size, c);
    escape(p);
    release(p, size, c);
  }
}

// `first` offsets the start in the cycle (threads start at their index, as in mix_bench)
template <class Alloc, class Free>
inline void mixed_loop(Alloc alloc, Free release, Ctx c, long n, long first) {
  for (long i = first; i < first + n; ++i) {
    const std::size_t s = kMix[i & 3];
    void* p = alloc(s, c);
    escape(p);
    release(p, s, c);
  }
}

template <class Alloc, class Free>
inline void trace_loop(Alloc alloc, Free release, Ctx c, long n) {
  std::size_t k = 0;
  for (long i = 0; i < n; ++i) {
    const std::size_t s = kTraceSizes[k];
    if (++k == kTraceCount) k = 0;
    void* p = alloc(s, c);
    escape(p);
    release(p, s, c);
  }
}

// Sliding window: 8 blocks live. The first 8 allocations (not paired with a free) and the last 8
// frees (not paired with an allocation) are inside the timed region; with n >= 10,000 pairs they
// are under 0.1% of the calls.
template <class Alloc, class Free>
inline void window_loop(Alloc alloc, Free release, Ctx c, long n) {
  void* ring[kWindowN];
  std::size_t ring_size[kWindowN];
  std::size_t k = 0;
  for (int j = 0; j < kWindowN; ++j) {
    ring_size[j] = kTraceSizes[k++];
    ring[j] = alloc(ring_size[j], c);
    escape(ring[j]);
  }
  int slot = 0;
  for (long i = 0; i < n; ++i) {
    const std::size_t s = kTraceSizes[k];
    if (++k == kTraceCount) k = 0;
    void* p = alloc(s, c);
    escape(p);
    release(ring[slot], ring_size[slot], c);
    ring[slot] = p;
    ring_size[slot] = s;
    if (++slot == kWindowN) slot = 0;
  }
  for (int j = 0; j < kWindowN; ++j) release(ring[j], ring_size[j], c);
}
}  // namespace pb

// Every adapter defines one of these (see main.cpp).
struct Adapter {
  const char* name;
  void (*setup)();                    // create the allocator (untimed)
  void (*bind)(int device);           // per thread, before its first call: make `device` current
  int (*devices)();                   // after setup: devices it can spread threads over here
  void (*warm)(pb::Ctx);              // one pair of every mix size on the context (untimed)
  void (*run)(int kind, std::size_t size, pb::Ctx, long n, long first);
  void* (*alloc1)(std::size_t size, pb::Ctx);           // untimed: live working sets
  void (*free1)(void* p, std::size_t size, pb::Ctx);    // untimed
  // train_step.hpp's loop: `steps` steps, backward on a second thread when threads == 2; returns
  // the allocations made
  long (*train)(int threads, int steps, unsigned seed, void (*bind)(int));
  std::size_t (*peak_reserved)();     // device 0's peak reserved bytes; nullptr: not known
};

#define PB_DEFINE_LOOPS(PREFIX, ALLOC, FREE)                                                      \
  static void PREFIX##_run(int kind, std::size_t size, pb::Ctx c, long n, long first) {          \
    switch (kind) {                                                                               \
      case pb::kPair: pb::pair_loop(ALLOC, FREE, size, c, n); break;                              \
      case pb::kMixed: pb::mixed_loop(ALLOC, FREE, c, n, first); break;                           \
      case pb::kTrace: pb::trace_loop(ALLOC, FREE, c, n); break;                                  \
      case pb::kWindow: pb::window_loop(ALLOC, FREE, c, n); break;                                \
    }                                                                                             \
  }                                                                                               \
  static void PREFIX##_warm(pb::Ctx c) {                                                          \
    for (std::size_t s : {512ul, 4096ul, 65536ul, 1ul << 20, 8ul << 20}) {                       \
      void* p = ALLOC(s, c);                                                                      \
      FREE(p, s, c);                                                                              \
    }                                                                                             \
  }                                                                                               \
  static void* PREFIX##_alloc1(std::size_t s, pb::Ctx c) { return ALLOC(s, c); }                  \
  static void PREFIX##_free1(void* p, std::size_t s, pb::Ctx c) { FREE(p, s, c); }              \
  static long PREFIX##_train(int threads, int steps, unsigned seed, void (*bind)(int)) {          \
    return pb::TrainLoop(ALLOC, FREE).run(threads, steps, seed, bind);                            \
  }

#define PB_ADAPTER(PREFIX, NAME, SETUP, BIND, DEVICES, PEAK_RESERVED)                                 \
  Adapter {                                                                                         \
    NAME, SETUP, BIND, DEVICES, PREFIX##_warm, PREFIX##_run, PREFIX##_alloc1, PREFIX##_free1,      \
        PREFIX##_train, PEAK_RESERVED                                                               \
  }

#include "train_step.hpp"
