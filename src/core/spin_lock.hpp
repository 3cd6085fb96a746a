// core/spin_lock.hpp — the device lock: a test-and-test-and-set spin lock that backs off to
// yielding and then to short sleeps. Uncontended it costs one atomic exchange to take and a
// plain store to release (a pthread mutex needs an atomic operation for both), which matters on
// the cache-hit path; held across a slow device call, waiters stop burning the CPU quickly.
#pragma once

#include <atomic>
#include <chrono>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define STITCH_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define STITCH_CPU_RELAX() asm volatile("yield" ::: "memory")
#else
#define STITCH_CPU_RELAX() ((void)0)
#endif

namespace stitch::detail {

class SpinLock {
 public:
  void lock() noexcept {
    if (!locked_.exchange(true, std::memory_order_acquire)) return;
    lock_slow();
  }
  /// One exchange, as lock()'s first try (a caller that fails goes on to lock()).
  bool try_lock() noexcept { return !locked_.exchange(true, std::memory_order_acquire); }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  void lock_slow() noexcept {
    for (unsigned spins = 0;; ++spins) {
      while (locked_.load(std::memory_order_relaxed)) {
        if (spins < 64) {
          STITCH_CPU_RELAX();
        } else if (spins < 256) {
          std::this_thread::yield();
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
        ++spins;
      }
      if (!locked_.exchange(true, std::memory_order_acquire)) return;
    }
  }

  std::atomic<bool> locked_{false};
};

}  // namespace stitch::detail
