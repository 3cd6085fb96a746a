// tests/stress/concurrency_stress.cpp — concurrency stress, built to run under ThreadSanitizer
// (scripts/sanitize-smoke.sh, scripts/soak.sh) and, briefly, in the default test suite.
//
// Many threads share one allocator over a simulated device with several devices and streams,
// once per configuration (plain segments, expandable segments, stitching). Half the threads go
// through the C API (stitch_malloc/stitch_free/... on the allocator installed with the test
// hook), half through the C++ API. Each thread allocates, writes a pattern, and either frees
// the block itself (on its stream or as a last use on another), records it on another stream,
// pins, finds and unpins it, or hands it to another thread's queue, which checks the pattern and
// frees it. Alongside:
// concurrent empty_cache, stream holds and releases, configure() of tunables, memory-fraction
// changes, and readers of stats, snapshots and memory summaries. There is no lock around the
// allocator calls (only the hand-off queues have one), so ThreadSanitizer sees the allocator's
// own synchronisation. At the end: every block's data was intact when freed, validate()
// passes, and once everything is freed and the cache emptied the devices hold nothing.
//
// Usage: concurrency_stress [--threads N] [--ops N] [--seconds S] [--seed N]
//   --ops: operations per thread and configuration (default 20000); --seconds: run each
//   configuration for S seconds instead (soak). Exit status 0 when nothing was lost or broken.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "capi/c_api_testing.hpp"
#include "stitch/allocator.hpp"
#include "stitch/config.hpp"
#include "stitch/errors.hpp"
#include "stitch/sim_backend.hpp"
#include "stitch/stitch.h"
#include "support/data_pattern.hpp"

namespace {

using stitch::test::mix;

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;
constexpr int kDevices = 2;
constexpr int kStreams = 4;  // S(0) is the default stream
constexpr std::size_t kMaxOwned = 96;

void* S(int n) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(n) * 0x10); }

struct Options {
  int threads = 8;
  std::uint64_t ops = 20000;
  double seconds = 0;
  std::uint64_t seed = 20261201;
};

struct Block {
  void* ptr;
  std::size_t size;
  int device;
  int stream;
  std::uint64_t seed;
  int owner;  // the allocating thread
};

struct Figures {
  std::atomic<std::uint64_t> ops{0}, allocs{0}, frees{0}, cross_thread_frees{0}, other_stream_frees{0},
      records{0}, ooms{0}, empty_caches{0}, holds{0}, configures{0}, readers{0}, errors{0};
};

/// A thread's inbox: blocks other threads hand it to free.
struct Inbox {
  std::mutex mutex;
  std::deque<Block> blocks;
};

const char* const kTunables[] = {
    "max_split_size_mb:40", "max_split_size_mb:200", "roundup_power2_divisions:4",
    "roundup_power2_divisions:0", "garbage_collection_threshold:0.7", "max_non_split_rounding_mb:40",
    "record_history:True,max_entries:256", "record_history:False",
};

class Stress {
 public:
  Stress(const Options& o, const char* conf, Figures& f) : o_(o), conf_(conf), f_(f) {
    stitch::SimBackend::Options so;
    so.devices = kDevices;
    so.capacity = GiB;  // with the memory-fraction changes: some OOMs, so the ladder runs concurrently too
    sim_ = std::make_shared<stitch::SimBackend>(so);
    auto a = std::make_unique<stitch::Allocator>(stitch::Config::parse(conf), sim_);
    a_ = a.get();
    (void)stitch::detail::capi_exchange_allocator(std::move(a));
    inboxes_ = std::vector<Inbox>(static_cast<std::size_t>(o.threads));
  }
  ~Stress() { (void)stitch::detail::capi_exchange_allocator(nullptr); }

  /// Runs the threads, then frees everything and checks the end state. Returns false on error.
  bool run() {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(o_.seconds));
    std::vector<std::thread> threads;
    for (int t = 0; t < o_.threads; ++t)
      threads.emplace_back([this, t, deadline] { worker(t, deadline); });
    for (auto& th : threads) th.join();
    // Whatever is still in an inbox is freed here, after every thread is gone.
    for (Inbox& in : inboxes_)
      for (const Block& b : in.blocks) release(b, -1, /*cpp=*/true, 0);
    for (int s = 1; s < kStreams; ++s) sim_->release_stream(S(s));
    try {
      a_->empty_cache();
      a_->validate();
    } catch (const std::exception& e) {
      error(std::string("at the end: ") + e.what());
    }
    for (int d = 0; d < kDevices; ++d) {
      const stitch::SimUsage u = sim_->usage(d);
      const stitch::DeviceStats s = a_->stats(d);
      if (u.used != 0 || u.allocations != 0 || u.physical_handles != 0 || u.mappings != 0 ||
          u.reservations != 0 || s.reserved_bytes[stitch::kAll].current != 0 ||
          s.allocation[stitch::kAll].current != 0)
        error("device " + std::to_string(d) + " still holds memory after everything was freed");
      if (s.num_invalid_frees != 0) error("a valid free was rejected");
    }
    return errors_ == 0;
  }

 private:
  void error(const std::string& what) {
    ++f_.errors;
    if (errors_++ < 10) std::fprintf(stderr, "concurrency_stress [%s]: ERROR: %s\n", conf_, what.c_str());
  }

  static std::size_t random_size(std::mt19937_64& rng) {
    const auto r = rng() % 1000;
    auto between = [&](std::size_t lo, std::size_t hi) { return lo + rng() % (hi - lo + 1); };
    if (r < 600) return between(1, 16 * KiB);
    if (r < 880) return between(16 * KiB, MiB);
    if (r < 985) return between(MiB, 12 * MiB);
    return between(12 * MiB, 48 * MiB);
  }

  /// Frees `b` (checking its data first) from thread `t` on `stream` (-1: its own stream).
  void release(const Block& b, int stream, bool cpp, int t) {
    if (!stitch::test::pattern_intact(b.ptr, b.size, b.seed)) error("a block's data changed while it was live");
    const int s = stream < 0 ? b.stream : stream;
    if (cpp) {
      try {
        a_->deallocate(b.ptr, b.size, b.device, S(s));
      } catch (const std::exception& e) {
        error(std::string("deallocate: ") + e.what());
        return;
      }
    } else {
      stitch_clear_error();  // the error text is kept until cleared
      stitch_free(b.ptr, b.size, b.device, S(s));
      if (*stitch_last_error() != '\0') {
        error(std::string("stitch_free: ") + stitch_last_error());
        return;
      }
    }
    ++f_.frees;
    if (s != b.stream) ++f_.other_stream_frees;
    if (b.owner != t) ++f_.cross_thread_frees;
  }

  void worker(int t, std::chrono::steady_clock::time_point deadline) {
    std::mt19937_64 rng(mix(o_.seed + static_cast<std::uint64_t>(t)));
    const bool cpp = t % 2 == 1;  // even threads use the C API, odd ones the C++ API
    std::vector<Block> owned;
    std::vector<Block> incoming;
    for (std::uint64_t i = 0;; ++i) {
      if (o_.seconds > 0 ? (i % 64 == 0 && std::chrono::steady_clock::now() >= deadline) : i >= o_.ops) break;
      ++f_.ops;
      const auto r = rng() % 1000;
      if (r < 420 && owned.size() < kMaxOwned) {
        allocate(rng, t, cpp, owned);
      } else if (r < 620 && !owned.empty()) {
        const std::size_t k = rng() % owned.size();
        const int stream = rng() % 4 == 0 ? static_cast<int>(rng() % kStreams) : -1;
        release(owned[k], stream, cpp, t);
        owned[k] = owned.back();
        owned.pop_back();
      } else if (r < 800 && !owned.empty()) {
        // Hand the block to another thread, which frees it.
        const std::size_t k = rng() % owned.size();
        const auto to = static_cast<std::size_t>((t + 1 + static_cast<int>(rng() % (o_.threads - 1))) % o_.threads);
        {
          std::lock_guard lock(inboxes_[to].mutex);
          inboxes_[to].blocks.push_back(owned[k]);
        }
        owned[k] = owned.back();
        owned.pop_back();
      } else if (r < 880) {
        {
          std::lock_guard lock(inboxes_[static_cast<std::size_t>(t)].mutex);
          auto& q = inboxes_[static_cast<std::size_t>(t)].blocks;
          incoming.assign(q.begin(), q.end());
          q.clear();
        }
        for (const Block& b : incoming) release(b, rng() % 3 == 0 ? static_cast<int>(rng() % kStreams) : -1, cpp, t);
        incoming.clear();
      } else if (r < 940 && !owned.empty()) {
        const Block& b = owned[rng() % owned.size()];
        const int s = static_cast<int>(rng() % kStreams);
        try {
          if (cpp) {
            a_->record_stream(b.ptr, S(s));
          } else if (stitch_record_stream(b.ptr, S(s)) != 0) {
            error(std::string("stitch_record_stream: ") + stitch_last_error());
          }
        } catch (const std::exception& e) {
          error(std::string("record_stream: ") + e.what());
        }
        ++f_.records;
      } else if (r < 960 && !owned.empty()) {
        // Pinned and unpinned, and found: under the block's stream lock, beside the cache hits.
        const Block& b = owned[rng() % owned.size()];
        try {
          if (cpp) {
            a_->pin(b.ptr);
            const auto info = a_->find(b.ptr);
            if (!info || info->requested != b.size || info->device != b.device) error("find: wrong block");
            a_->unpin(b.ptr);
          } else if (stitch_pin(b.ptr) != 0 || stitch_unpin(b.ptr) != 0) {
            error(std::string("stitch_pin: ") + stitch_last_error());
          }
        } catch (const std::exception& e) {
          error(std::string("pin: ") + e.what());
        }
        ++f_.records;
      } else {
        rare(rng, t, cpp);
      }
    }
    for (const Block& b : owned) release(b, -1, cpp, t);
  }

  void allocate(std::mt19937_64& rng, int t, bool cpp, std::vector<Block>& owned) {
    Block b{nullptr, random_size(rng), static_cast<int>(rng() % kDevices), static_cast<int>(rng() % kStreams),
            rng(), t};
    if (cpp) {
      try {
        b.ptr = a_->allocate(b.size, S(b.stream), b.device);
      } catch (const stitch::out_of_memory&) {
        ++f_.ooms;
        return;
      } catch (const std::exception& e) {
        error(std::string("allocate: ") + e.what());
        return;
      }
    } else {
      b.ptr = stitch_malloc(b.size, b.device, S(b.stream));
      if (b.ptr == nullptr) {
        if (std::strncmp(stitch_last_error(), "CUDA out of memory", 18) == 0) {
          ++f_.ooms;
        } else {
          error(std::string("stitch_malloc: ") + stitch_last_error());
        }
        return;
      }
    }
    ++f_.allocs;
    stitch::test::write_pattern(b.ptr, b.size, b.seed);
    owned.push_back(b);
  }

  /// The rare operations: cache, streams, settings and readers.
  void rare(std::mt19937_64& rng, int t, bool cpp) {
    const int d = static_cast<int>(rng() % kDevices);
    try {
      switch (rng() % 8) {
        case 0:
          if (cpp) a_->empty_cache(rng() % 2 == 0 ? -1 : d); else if (stitch_empty_cache(d) != 0) error(stitch_last_error());
          ++f_.empty_caches;
          break;
        case 1: {
          const int s = 1 + static_cast<int>(rng() % (kStreams - 1));
          std::lock_guard lock(hold_mutex_);  // hold and release in pairs
          if (held_[s]) sim_->release_stream(S(s)); else sim_->hold_stream(S(s));
          held_[s] = !held_[s];
          ++f_.holds;
          break;
        }
        case 2: {
          const char* conf = kTunables[rng() % std::size(kTunables)];
          if (cpp) a_->configure(conf); else if (stitch_configure(conf) != 0) error(stitch_last_error());
          ++f_.configures;
          break;
        }
        case 3:
          a_->set_memory_fraction(0.75 + static_cast<double>(rng() % 5) / 16, d);
          ++f_.configures;
          break;
        case 4: {
          const stitch::DeviceStats s = a_->stats(d);
          if (s.allocated_bytes[stitch::kAll].current > s.reserved_bytes[stitch::kAll].current)
            error("allocated_bytes above reserved_bytes");
          if (stitch_stat(d, "active_bytes.all.current") < 0) error(stitch_last_error());
          ++f_.readers;
          break;
        }
        case 5:
          (void)a_->snapshot();
          ++f_.readers;
          break;
        case 6: {
          char buf[512];
          if (stitch_memory_summary(d, buf, sizeof buf) == 0) error(stitch_last_error());
          ++f_.readers;
          break;
        }
        default:
          if (stitch_reset_peak_stats(t % 2 == 0 ? -1 : d) != 0) error(stitch_last_error());
          ++f_.readers;
      }
    } catch (const std::exception& e) {
      error(std::string("rare operation: ") + e.what());
    }
  }

  const Options o_;
  const char* conf_;
  Figures& f_;
  std::shared_ptr<stitch::SimBackend> sim_;
  stitch::Allocator* a_ = nullptr;  // owned by the C API while the stress runs
  std::vector<Inbox> inboxes_;
  std::mutex hold_mutex_;
  bool held_[kStreams] = {};
  std::atomic<int> errors_{0};
};

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "concurrency_stress: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--threads") o.threads = std::max(2, std::atoi(value()));
    else if (a == "--ops") o.ops = std::strtoull(value(), nullptr, 10);
    else if (a == "--seconds") o.seconds = std::atof(value());
    else if (a == "--seed") o.seed = std::strtoull(value(), nullptr, 10);
    else {
      std::fprintf(stderr, "usage: concurrency_stress [--threads N] [--ops N] [--seconds S] [--seed N]\n");
      std::exit(2);
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_args(argc, argv);
  const char* const configs[] = {
      "backend:sim",
      "backend:sim,expandable_segments:True",
      "backend:sim,expandable_segments:True,stitching:True",
  };
  Figures f;
  bool ok = true;
  for (const char* conf : configs) {
    Stress stress(o, conf, f);
    ok = stress.run() && ok;
  }
  auto u = [](const std::atomic<std::uint64_t>& v) { return static_cast<unsigned long long>(v.load()); };
  std::printf("concurrency_stress: %d threads x %zu configurations, seed %llu: %llu operations, %llu "
              "allocations, %llu frees (%llu by another thread than the allocating one, %llu on "
              "another stream), %llu record_stream, %llu OOMs, %llu empty_cache, %llu stream "
              "holds/releases, %llu setting changes, %llu stats/snapshot/summary reads; errors: %llu; "
              "lost: %s\n",
              o.threads, std::size(configs), static_cast<unsigned long long>(o.seed), u(f.ops),
              u(f.allocs), u(f.frees), u(f.cross_thread_frees), u(f.other_stream_frees), u(f.records),
              u(f.ooms), u(f.empty_caches), u(f.holds), u(f.configures), u(f.readers), u(f.errors),
              ok ? "nothing" : "see the errors above");
  const bool exercised = f.cross_thread_frees > 0 && f.records > 0 && f.empty_caches > 0 && f.allocs > 0;
  if (!exercised) std::printf("concurrency_stress: the run was too short to exercise every operation\n");
  return ok && exercised ? 0 : 1;
}
