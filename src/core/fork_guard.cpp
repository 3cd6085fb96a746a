// core/fork_guard.cpp — the fork() generation and its pthread_atfork child handler.
#include "core/fork_guard.hpp"

#include <pthread.h>

#include "stitch/errors.hpp"

namespace stitch::detail {

std::atomic<std::uint64_t> g_fork_generation{0};  // (64 bits: never wraps)

std::uint64_t fork_generation() noexcept {
  static const bool registered = [] {
    return pthread_atfork(nullptr, nullptr, [] {
      g_fork_generation.fetch_add(1, std::memory_order_relaxed);
    }) == 0;
  }();
  (void)registered;
  return g_fork_generation.load(std::memory_order_relaxed);
}

void throw_forked() {
  throw error(
      "stitch: this allocator was created before fork(), in the parent process; a forked child "
      "cannot use it (CUDA does not work in a forked child, the simulated device's memory is "
      "shared with the parent, and a lock another parent thread held stays held). Create the "
      "child with the 'spawn' start method, or create a new allocator in the child.");
}

}  // namespace stitch::detail
