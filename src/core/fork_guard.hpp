// core/fork_guard.hpp — what fork() leaves an allocator: nothing usable. The child of a fork()
// has one thread; a lock another thread of the parent held stays held, CUDA refuses to work in a
// forked child, and the simulated device's memory is shared with the parent. So a child handler
// (pthread_atfork) bumps a process-wide generation, every allocator remembers the generation it
// was created in, and its entry points refuse, before they touch a lock, when the two differ.
// An allocator created in the child works.
#pragma once

#include <atomic>
#include <cstdint>

namespace stitch::detail {

/// The number of fork()s this process descends from since stitch was loaded (the first call
/// registers the handler).
std::uint64_t fork_generation() noexcept;
/// The same, read on a fast path: no registration (an allocator registered it when created).
extern std::atomic<std::uint64_t> g_fork_generation;
/// Throws the stitch::error that says so.
[[noreturn]] void throw_forked();
/// Throws stitch::error when the process is not the one an allocator of `generation` was
/// created in.
inline void refuse_after_fork(std::uint64_t generation) {
  if (g_fork_generation.load(std::memory_order_relaxed) != generation) [[unlikely]]
    throw_forked();
}

}  // namespace stitch::detail
