// tests/thread_exit/thread_exit_frees.cpp — frees that run while threads end and while the process
// exits, through stitch.h and libstitch.so as a program uses them: from pthread key destructors,
// from thread_local destructors and from a static destructor after main() returned, while other
// threads start and end all the time (one stream per thread, one stream shared by several, two
// devices). Each round starts workers that allocate, hand blocks to each other, leave blocks to
// their key and thread_local destructors, start short-lived threads of their own, and end; a
// churn thread starts and ends threads throughout. At the end no block may be lost (every
// device's allocation count back to zero, the cache returned whole) and nothing may hang (a
// watchdog ends the process with status 3). Run many rounds, under AddressSanitizer and
// ThreadSanitizer too (scripts/sanitize-smoke.sh).
//
// usage: thread_exit_frees [rounds, default 100]   exit status 0: nothing lost, nothing hung
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "stitch/stitch.h"

namespace {

constexpr int kDevices = 2;

struct Block {
  void* ptr;
  std::size_t size;
  int device;
  void* stream;
};

std::atomic<long> g_allocated{0}, g_freed{0}, g_failures{0};

void* stream_of(int id) { return id % 3 == 0 ? nullptr : reinterpret_cast<void*>(std::uintptr_t{0x100} * static_cast<unsigned>(id)); }

Block allocate(std::mt19937_64& rng, int id) {
  const std::size_t size = rng() % 4 == 0 ? (1 + rng() % 4) << 20 : 512 * (1 + rng() % 256);
  const int device = id % kDevices;
  void* stream = stream_of(id);
  void* p = stitch_malloc(size, device, stream);
  if (p == nullptr) {
    std::fprintf(stderr, "stitch_malloc: %s\n", stitch_last_error());
    ++g_failures;
  } else {
    ++g_allocated;
  }
  return {p, size, device, stream};
}

void release(const Block& b) {
  if (b.ptr == nullptr) return;
  stitch_clear_error();
  stitch_free(b.ptr, b.size, b.device, b.stream);
  if (stitch_last_error()[0] != '\0') {
    std::fprintf(stderr, "stitch_free: %s\n", stitch_last_error());
    ++g_failures;
  } else {
    ++g_freed;
  }
}

// Blocks freed by the key's destructor, after the thread's other state may be gone.
pthread_key_t g_key;
void free_key_blocks(void* value) {
  auto* blocks = static_cast<std::vector<Block>*>(value);
  for (const Block& b : *blocks) release(b);
  delete blocks;
}

// Blocks freed by a thread_local destructor.
struct Leftovers {
  std::vector<Block> blocks;
  ~Leftovers() {
    for (const Block& b : blocks) release(b);
  }
};
thread_local Leftovers t_leftovers;

// Blocks handed between threads.
std::mutex g_mailbox_mutex;
std::vector<Block> g_mailbox;

void post(const Block& b) {
  std::lock_guard lock(g_mailbox_mutex);
  g_mailbox.push_back(b);
}
void collect(std::size_t n) {
  std::vector<Block> mine;
  {
    std::lock_guard lock(g_mailbox_mutex);
    while (n-- > 0 && !g_mailbox.empty()) {
      mine.push_back(g_mailbox.back());
      g_mailbox.pop_back();
    }
  }
  for (const Block& b : mine) release(b);
}

/// One thread's life: pairs, blocks for the key's and the thread_local's destructors, blocks
/// handed on, and (when `spawn`) a short-lived thread of its own that is not waited for here.
void life(std::uint64_t seed, int id, bool spawn, std::atomic<int>& running) {
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 20; ++i) release(allocate(rng, id));
  auto* keyed = new std::vector<Block>;
  for (int i = 0; i < 3; ++i) keyed->push_back(allocate(rng, id));
  pthread_setspecific(g_key, keyed);
  for (int i = 0; i < 3; ++i) t_leftovers.blocks.push_back(allocate(rng, id + 1));
  for (int i = 0; i < 2; ++i) post(allocate(rng, id));
  collect(2);
  if (spawn) {
    ++running;
    std::thread([seed, id, &running] {
      life(seed * 31 + 7, id + 1, false, running);
      --running;
    }).detach();
  }
}

void watchdog(int) {
  static const char msg[] = "thread_exit_frees: hung (the watchdog fired)\n";
  (void)!write(2, msg, sizeof msg - 1);
  _exit(3);
}

// Frees after main() returned: the C API keeps working while the process exits.
struct AtExit {
  std::vector<Block> blocks;
  ~AtExit() {
    for (const Block& b : blocks) release(b);
    if (g_failures.load() != 0) _exit(4);
  }
};
AtExit g_at_exit;

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 100;
  signal(SIGALRM, watchdog);
  alarm(static_cast<unsigned>(60 + rounds));
  if (stitch_configure("backend:sim,sim_capacity_mb:8192,sim_devices:2") != 0) {
    std::fprintf(stderr, "stitch_configure: %s\n", stitch_last_error());
    return 1;
  }
  pthread_key_create(&g_key, free_key_blocks);
  std::atomic<bool> stop{false};
  std::atomic<int> running{0};
  // Threads that start and end throughout, each freeing from its destructors as it ends.
  std::thread churn([&] {
    std::uint64_t n = 0;
    while (!stop.load()) {
      std::thread([n] {
        std::atomic<int> none{0};
        life(1000003 * (n + 1), static_cast<int>(n % 7), false, none);
      }).join();
      ++n;
    }
  });
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::thread> workers;
    for (int w = 0; w < 6; ++w)
      workers.emplace_back([round, w, &running] {
        life(static_cast<std::uint64_t>(round) * 131 + static_cast<std::uint64_t>(w), w, true, running);
      });
    for (std::thread& t : workers) t.join();
  }
  stop = true;
  churn.join();
  while (running.load() != 0) std::this_thread::yield();
  collect(~std::size_t{0});
  // Some blocks outlive main() and are freed by a static destructor.
  std::mt19937_64 rng(99);
  for (int i = 0; i < 4; ++i) g_at_exit.blocks.push_back(allocate(rng, i));
  const long live_at_exit = static_cast<long>(g_at_exit.blocks.size());
  int status = 0;
  for (int d = 0; d < kDevices; ++d) {
    // Each device's live blocks: only the ones kept for exit.
    long kept = 0;
    for (const Block& b : g_at_exit.blocks) kept += b.device == d;
    const long live = static_cast<long>(stitch_stat(d, "allocation.all.current"));
    if (live != kept) {
      std::fprintf(stderr, "device %d: %ld blocks live, %ld expected\n", d, live, kept);
      status = 1;
    }
  }
  if (g_allocated.load() - g_freed.load() != live_at_exit || g_failures.load() != 0) {
    std::fprintf(stderr, "allocated %ld, freed %ld, failures %ld\n", g_allocated.load(), g_freed.load(),
                 g_failures.load());
    status = 1;
  }
  std::printf("thread_exit_frees: %d rounds, %ld allocations, %ld frees, %ld failures\n", rounds,
              g_allocated.load(), g_freed.load(), g_failures.load());
  return status;
}
