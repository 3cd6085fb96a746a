// fork(): a child process never hangs in stitch, and an allocator created before the fork refuses
// in the child with a clear error (CUDA cannot be used in a forked child, the simulated device's
// memory is shared with the parent, and a lock another parent thread held stays held), through the
// C++ API and the C API alike; an allocator created in the child works (core/fork_guard.hpp).
// Each fork happens while another thread of the parent allocates and frees without pause, so
// that locks are often held at the moment of the fork. A child reports by its exit status; a
// watchdog in it turns a hang into status 3.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "capi/c_api_testing.hpp"
#include "stitch/allocator.hpp"
#include "stitch/errors.hpp"
#include "stitch/sim_backend.hpp"
#include "stitch/stitch.h"

namespace stitch {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

stream_t S(int n) { return reinterpret_cast<stream_t>(static_cast<std::uintptr_t>(n) * 0x10); }

/// Whether `fn` throws stitch::error naming fork().
template <typename Fn>
bool refuses(Fn&& fn) {
  try {
    fn();
  } catch (const error& e) {
    return std::strstr(e.what(), "fork()") != nullptr;
  } catch (...) {
  }
  return false;
}

/// Runs `child` in a forked child (with a watchdog); its exit status.
template <typename Fn>
int in_child(Fn&& child) {
  const pid_t pid = fork();
  if (pid == 0) {
    signal(SIGALRM, [](int) { _exit(3); });
    alarm(20);
    _exit(child());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

TEST(Fork, AChildNeverHangsAndTheParentsAllocatorRefusesThere) {
  Allocator a(Config::parse("backend:sim,sim_capacity_mb:1024,expandable_segments:True"));
  void* kept = a.allocate(MiB, S(1));
  // The C API's allocator too, created in the parent.
  detail::capi_exchange_allocator(
      std::make_unique<Allocator>(Config::parse("backend:sim,sim_capacity_mb:1024")));
  void* kept_c = stitch_malloc(4096, 0, nullptr);
  ASSERT_NE(kept_c, nullptr);
  std::atomic<bool> stop{false};
  std::thread busy([&] {  // holds the device's and the shards' locks often
    for (int i = 0; !stop.load(); ++i) {
      a.deallocate(a.allocate(512 * (1 + i % 64), S(1 + i % 3)));
      if (i % 64 == 0) (void)a.stats(0);
      stitch_free(stitch_malloc(4096, 0, S(2)), 4096, 0, S(2));
    }
  });
  for (int round = 0; round < 20; ++round) {
    const int status = in_child([&] {
      if (!refuses([&] { (void)a.allocate(4096, S(1)); })) return 10;
      if (!refuses([&] { (void)a.allocate(4096, S(9)); })) return 11;  // a new stream too
      if (!refuses([&] { a.deallocate(kept); })) return 12;
      if (!refuses([&] { (void)a.stats(0); })) return 13;
      if (!refuses([&] { a.empty_cache(); })) return 14;
      if (!refuses([&] { a.record_stream(kept, S(2)); })) return 15;
      if (stitch_malloc(4096, 0, nullptr) != nullptr) return 20;
      if (std::strstr(stitch_last_error(), "fork()") == nullptr) return 21;
      stitch_clear_error();
      stitch_free(kept_c, 4096, 0, nullptr);
      if (std::strstr(stitch_last_error(), "fork()") == nullptr) return 22;
      // An allocator made in the child is the child's own, and works.
      Allocator mine(Config::parse("backend:sim,sim_capacity_mb:64"));
      void* p = mine.allocate(4096);
      mine.deallocate(p);
      mine.validate();
      return 0;
    });
    ASSERT_EQ(status, 0) << "round " << round << " (3: the child hung; 10+: a call did not refuse)";
  }
  stop = true;
  busy.join();
  // The parent is untouched.
  a.deallocate(kept);
  a.validate();
  stitch_free(kept_c, 4096, 0, nullptr);
  detail::capi_exchange_allocator(nullptr);
}

}  // namespace
}  // namespace stitch
