// Statistics are exact at every reader: after any run, every current statistic equals what the
// device holds, as validate() recounts it, and a block whose cross-stream work has completed is
// free, not "active", whether or not an allocation came after it.
//
// A free on another stream (or of a block used on other streams through record_stream) leaves
// the block pending until its events complete; the events used to be looked at only by the next
// allocation (or empty_cache). A run whose last operations were such frees therefore ended with
// requested_bytes and active_bytes above zero while allocated_bytes was zero, although the
// streams had long finished: the C API torture below, from many threads, showed it in runs
// where no thread allocated after the last cross-stream free.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "capi/c_api_testing.hpp"
#include "stitch/allocator.hpp"
#include "stitch/config.hpp"
#include "stitch/sim_backend.hpp"
#include "stitch/stitch.h"
#include "support/data_pattern.hpp"

namespace stitch {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

stream_t S(int n) { return reinterpret_cast<stream_t>(static_cast<std::uintptr_t>(n) * 0x10); }

/// Every statistic that counts what callers hold, in every pool: all zero once nothing is held.
const char* const kHeld[] = {"allocation", "allocated_bytes", "requested_bytes", "active",
                             "active_bytes"};
const char* const kPools[] = {"all", "small_pool", "large_pool"};

void expect_nothing_held(const DeviceStats& s, const std::string& when) {
  for (const char* name : kHeld)
    for (const char* pool : kPools) {
      const std::string key = std::string(name) + "." + pool + ".current";
      EXPECT_EQ(s.get(key).value_or(-1), 0) << key << " " << when;
    }
}

TEST(StatsExact, ABlockWhoseStreamsAreDoneIsFreeAtTheNextRead) {
  auto sim = std::make_shared<SimBackend>();
  Allocator a(Config::parse("backend:sim"), sim);
  void* p = a.allocate(1000, S(1));
  a.record_stream(p, S(2));
  a.deallocate(p);  // S(2)'s work completes at once: the block's event is done
  expect_nothing_held(a.stats(0), "after a free whose event completed");
  a.validate();

  // Still running on S(2): pending, active and requested until S(2) is done, then free.
  sim->hold_stream(S(2));
  p = a.allocate(1000, S(1));
  a.record_stream(p, S(2));
  a.deallocate(p);
  DeviceStats s = a.stats(0);
  EXPECT_EQ(s.allocated_bytes[kAll].current, 0);
  EXPECT_EQ(s.active_bytes[kAll].current, 1024);
  EXPECT_EQ(s.requested_bytes[kAll].current, 1000);
  a.validate();
  sim->release_stream(S(2));
  expect_nothing_held(a.stats(0), "after its stream was released");
  a.validate();
}

TEST(StatsExact, AReadIsNeverFailedByTheEventsItRetires) {
  auto sim = std::make_shared<SimBackend>();
  Allocator a(Config::parse("backend:sim"), sim);
  void* p = a.allocate(1000, S(1));
  a.record_stream(p, S(2));
  a.deallocate(p);
  sim->inject_fault(SimCall::query_event, 1, SimFault::error);
  DeviceStats s;
  ASSERT_NO_THROW(s = a.stats(0));
  EXPECT_EQ(s.active_bytes[kAll].current, 1024) << "the query failed: still pending";
  a.validate();
  expect_nothing_held(a.stats(0), "at the next read");
  a.validate();
}

TEST(StatsExact, AFreeOnAnotherStreamIsFreeOnceThatStreamIsDone) {
  Allocator a(Config::parse("backend:sim"), std::make_shared<SimBackend>());
  void* p = a.allocate(3 * MiB - 100, S(1));
  a.deallocate(p, S(3));  // its last use was on S(3)
  expect_nothing_held(a.stats(0), "after a free on another stream");
  EXPECT_EQ(a.stats(0).inactive_split[kAll].current, 0);
  a.validate();
}

/// A torture through the C API: 4 threads, 3 streams each, requested sizes that differ inside
/// one rounded size, record_stream on other threads' streams, frees on other streams and by
/// other threads, bad frees (unknown pointers, wrong sizes), one out-of-memory per thread, and
/// every block's data checked before it is freed. Each thread ends by freeing what it holds on
/// other streams. Then, with no allocation after those frees, every current statistic must be
/// exact. With stitch_compact:True the threads follow compaction's rule (docs/stitching.md): no
/// thread touches block data while another allocates (data work under a shared lock, stitch_malloc
/// under an exclusive one); frees and record_stream stay concurrent.
class StatsExactTorture : public ::testing::TestWithParam<const char*> {};

struct Held {
  void* ptr;
  std::size_t size;
  int stream;
  std::uint64_t seed;
};

TEST_P(StatsExactTorture, EveryCurrentStatisticIsExactAfterAManyThreadRun) {
  constexpr int kThreads = 4;
  SimBackend::Options so;
  so.capacity = std::size_t{256} << 20;
  auto sim = std::make_shared<SimBackend>(so);
  auto owned = std::make_unique<Allocator>(Config::parse(GetParam()), sim);
  Allocator& a = *owned;
  (void)detail::capi_exchange_allocator(std::move(owned));
  std::mutex inbox_mutex[kThreads];
  std::deque<Held> inbox[kThreads];
  std::atomic<int> broken{0}, ooms{0}, rejected{0}, records{0}, cross{0};
  // Compaction's rule: block data is not touched while an allocation runs.
  const bool compacts = std::string(GetParam()).find("stitch_compact:True") != std::string::npos;
  std::shared_mutex data_work;
  auto data_lock = [&] { return compacts ? std::shared_lock(data_work) : std::shared_lock<std::shared_mutex>(); };
  auto malloc_ = [&](std::size_t size, stream_t stream) {
    std::unique_lock<std::shared_mutex> lock;
    if (compacts) lock = std::unique_lock(data_work);
    return stitch_malloc(size, 0, stream);
  };

  auto check = [&](const Held& b) {
    const auto lock = data_lock();
    bool ok = true;
    test::pattern_offsets(b.size, [&](std::size_t off) {
      std::uint64_t v = 0;
      std::memcpy(&v, static_cast<char*>(b.ptr) + off, 8);
      if (v != test::mix(b.seed + off)) ok = false;
    });
    if (!ok) ++broken;
  };
  auto worker = [&](int t) {
    std::mt19937_64 rng(20261202 + static_cast<std::uint64_t>(t));
    auto any_stream = [&] { return 1 + static_cast<int>(rng() % (3 * kThreads)); };
    std::vector<Held> own;
    // Rounded sizes of both pools; the requests differ inside each (by up to 511 bytes).
    const std::size_t rounded[] = {512, 4096, 65536, MiB, 2 * MiB, 6 * MiB, 12 * MiB};
    for (int op = 0; op < 4000; ++op) {
      if (op == 2000) {  // one request the device can never serve
        if (malloc_(std::size_t{1} << 40, S(3 * t + 1)) == nullptr) ++ooms;
        continue;
      }
      const unsigned r = static_cast<unsigned>(rng() % 100);
      if (r < 45 || own.empty()) {
        const std::size_t size = rounded[rng() % 7] - rng() % 512;
        const int s = 3 * t + 1 + static_cast<int>(rng() % 3);
        void* p = malloc_(size, S(s));
        if (p == nullptr) continue;  // the small device is full for now
        const Held b{p, size, s, rng()};
        const auto lock = data_lock();
        test::pattern_offsets(size, [&](std::size_t off) {
          const std::uint64_t v = test::mix(b.seed + off);
          std::memcpy(static_cast<char*>(p) + off, &v, 8);
        });
        own.push_back(b);
      } else if (r < 80) {
        const std::size_t i = rng() % own.size();
        const Held b = own[i];
        own[i] = own.back();
        own.pop_back();
        check(b);
        if (rng() % 4 == 0) {
          const int to = static_cast<int>(rng() % kThreads);
          std::lock_guard lock(inbox_mutex[to]);
          inbox[to].push_back(b);
        } else {
          const int s = rng() % 3 == 0 ? any_stream() : b.stream;
          if (s != b.stream) ++cross;
          stitch_free(b.ptr, b.size, 0, S(s));
        }
      } else if (r < 90) {
        if (stitch_record_stream(own[rng() % own.size()].ptr, S(any_stream())) == 0) ++records;
      } else if (r < 96) {
        std::deque<Held> mine;
        {
          std::lock_guard lock(inbox_mutex[t]);
          mine.swap(inbox[t]);
        }
        for (const Held& b : mine) {
          check(b);
          stitch_free(b.ptr, b.size, 0, S(any_stream()));
        }
      } else {
        static int unknown;
        stitch_clear_error();
        stitch_free(&unknown, 512, 0, S(1));
        if (*stitch_last_error() != '\0') ++rejected;
        const Held& b = own[rng() % own.size()];
        stitch_clear_error();
        stitch_free(b.ptr, b.size + 1, 0, S(b.stream));  // the wrong size: kept
        if (*stitch_last_error() != '\0') ++rejected;
      }
    }
    for (const Held& b : own) {
      check(b);
      stitch_free(b.ptr, b.size, 0, S(b.stream % (3 * kThreads) + 1));  // another stream
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t)
    for (const Held& b : inbox[t]) {
      check(b);
      stitch_free(b.ptr, b.size, 0, S(b.stream % (3 * kThreads) + 1));
    }

  EXPECT_EQ(broken.load(), 0) << "a block's data changed while it was held";
  EXPECT_GT(ooms.load(), 0);
  EXPECT_GT(rejected.load(), 0);
  EXPECT_GT(records.load(), 0);
  EXPECT_GT(cross.load(), 0);
  EXPECT_EQ(stitch_stat(0, "num_invalid_frees"), rejected.load());
  if (compacts) {
    std::printf("compaction: %lld pages, %lld refused requests\n",
                static_cast<long long>(stitch_stat(0, "num_compactions")),
                static_cast<long long>(stitch_stat(0, "num_compactions_refused")));
  }
  // No allocation came after the last frees: the readers see them completed.
  expect_nothing_held(a.stats(0), "after every block was freed");
  EXPECT_NO_THROW(a.validate());  // segment, reserved and inactive_split as the recount gives
  ASSERT_EQ(stitch_empty_cache(-1), 0);
  const DeviceStats s = a.stats(0);
  expect_nothing_held(s, "after empty_cache");
  EXPECT_EQ(s.reserved_bytes[kAll].current, 0);
  EXPECT_EQ(s.segment[kAll].current, 0);
  EXPECT_EQ(sim->usage(0).used, 0u);
  (void)detail::capi_exchange_allocator(nullptr);
}

INSTANTIATE_TEST_SUITE_P(Configs, StatsExactTorture,
                         ::testing::Values("backend:sim", "backend:sim,expandable_segments:True",
                                           "backend:sim,expandable_segments:True,stitching:True",
                                           "backend:sim,expandable_segments:True,stitching:True,"
                                           "stitch_compact:True"));

}  // namespace
}  // namespace stitch
