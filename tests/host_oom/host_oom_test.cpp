// tests/host_oom/host_oom_test.cpp — std::bad_alloc anywhere in an allocation's or a free's path
// (the host has no memory for a Block, an index node, a table or a vector) leaves every block where
// it was, or in one consistent place: the request fails with std::bad_alloc (not stitch's
// out_of_memory, which is the device's), the allocator validates, every live block is still live
// and a free that failed left its block allocated.
//
// A program of its own: it replaces the global operator new with one that fails, when armed, at
// the Nth call (not inside the simulated device's own calls: that heap is not the allocator's). Random operations (both cache-hit and device-lock paths, the three ways to free,
// record_stream, streams held, empty_cache) run with the failure armed at a random call, in every
// configuration.
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/errors.hpp"
#include "stitch/sim_backend.hpp"

/// The operation running (a debugger's condition: `break __cxa_throw if host_oom_op == N`).
extern "C" {
long host_oom_op = 0;
}

namespace {

/// -1: disarmed; n >= 0: the allocation n calls from now fails.
std::atomic<long> g_countdown{-1};
std::atomic<long> g_failed{0};

void* counted_new(std::size_t n) {
  if (g_countdown.load(std::memory_order_relaxed) >= 0 &&
      g_countdown.fetch_sub(1, std::memory_order_relaxed) == 0) {
    ++g_failed;
    throw std::bad_alloc();
  }
  void* p = std::malloc(n != 0 ? n : 1);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

}  // namespace

void* operator new(std::size_t n) { return counted_new(n); }
void* operator new[](std::size_t n) { return counted_new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_new(n);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void* operator new(std::size_t n, std::align_val_t al) {
  if (g_countdown.load(std::memory_order_relaxed) >= 0 &&
      g_countdown.fetch_sub(1, std::memory_order_relaxed) == 0) {
    ++g_failed;
    throw std::bad_alloc();
  }
  void* p = std::aligned_alloc(static_cast<std::size_t>(al),
                               (n + static_cast<std::size_t>(al) - 1) / static_cast<std::size_t>(al) *
                                   static_cast<std::size_t>(al));
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* operator new[](std::size_t n, std::align_val_t al) { return operator new(n, al); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace stitch {
namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

stream_t S(int n) { return reinterpret_cast<stream_t>(static_cast<std::uintptr_t>(n) * 0x10); }

/// Arms the failure `after` allocations from now for the life of the scope.
struct Armed {
  explicit Armed(long after) { g_countdown.store(after); }
  ~Armed() { g_countdown.store(-1); }
};

/// The countdown stops inside the device's calls: the simulated device's own bookkeeping is not
/// the allocator's (a GPU's driver does not allocate from this heap).
struct Paused {
  long saved = g_countdown.exchange(-1);
  ~Paused() { g_countdown.store(saved); }
};

class DeviceOutsideTheHeap final : public Backend {
 public:
  explicit DeviceOutsideTheHeap(std::shared_ptr<SimBackend> sim) : sim_(std::move(sim)) {}
  const char* name() const noexcept override { return "sim"; }
  int device_count() override { Paused p; return sim_->device_count(); }
  MemoryInfo memory_info(int d) override { Paused p; return sim_->memory_info(d); }
  std::size_t granularity(int d) override { Paused p; return sim_->granularity(d); }
  bool supports_virtual_memory(int d) override { Paused p; return sim_->supports_virtual_memory(d); }
  void* allocate(int d, std::size_t n) override { Paused p; return sim_->allocate(d, n); }
  void deallocate(int d, void* ptr, std::size_t n) override { Paused p; sim_->deallocate(d, ptr, n); }
  void* reserve(int d, std::size_t n, std::size_t al) override { Paused p; return sim_->reserve(d, n, al); }
  void release_reservation(int d, void* va, std::size_t n) override { Paused p; sim_->release_reservation(d, va, n); }
  phys_handle_t create_physical(int d, std::size_t n) override { Paused p; return sim_->create_physical(d, n); }
  void release_physical(int d, phys_handle_t h) override { Paused p; sim_->release_physical(d, h); }
  bool map_run(int d, void* va, const MapPiece* pieces, std::size_t count) override {
    Paused p;
    if (!sim_->map_run(d, va, pieces, count)) return false;
    auto at = reinterpret_cast<std::uintptr_t>(va);
    for (std::size_t i = 0; i < count; ++i) {
      mapped_[at] = pieces[i].bytes;
      at += pieces[i].bytes;
    }
    return true;
  }
  void unmap(int d, void* va, std::size_t n) override {
    Paused p;
    sim_->unmap(d, va, n);
    const auto from = reinterpret_cast<std::uintptr_t>(va);
    mapped_.erase(mapped_.lower_bound(from), mapped_.lower_bound(from + n));
  }
  /// Whether every mapped run of the allocator's snapshot (its view of mapped memory) is mapped
  /// on the device (a plain segment: allocated).
  bool maps_every_run(const Allocator& a) {
    Paused p;
    for (const SegmentSnapshot& seg : a.snapshot().segments) {
      if (!seg.is_expandable) continue;
      std::uintptr_t at = seg.address;
      const std::uintptr_t end = seg.address + seg.total_size;
      while (at < end) {
        auto it = mapped_.upper_bound(at);
        if (it == mapped_.begin()) return false;
        --it;
        if (it->first + it->second <= at) return false;
        at = it->first + it->second;
      }
    }
    return true;
  }
  event_t create_event(int d) override { Paused p; return sim_->create_event(d); }
  void destroy_event(int d, event_t e) override { Paused p; sim_->destroy_event(d, e); }
  void record_event(int d, event_t e, stream_t st) override { Paused p; sim_->record_event(d, e, st); }
  bool query_event(int d, event_t e) override { Paused p; return sim_->query_event(d, e); }
  void synchronize_event(int d, event_t e) override { Paused p; sim_->synchronize_event(d, e); }
  void synchronize_stream(int d, stream_t st) override { Paused p; sim_->synchronize_stream(d, st); }
  void synchronize_device(int d) override { Paused p; sim_->synchronize_device(d); }
  void copy(int d, void* dst, const void* src, std::size_t n, stream_t st) override {
    Paused p;
    sim_->copy(d, dst, src, n, st);
  }
  void copy_to_host(int d, void* dst, const void* src, std::size_t n) override { Paused p; sim_->copy_to_host(d, dst, src, n); }
  void copy_from_host(int d, void* dst, const void* src, std::size_t n) override { Paused p; sim_->copy_from_host(d, dst, src, n); }
  void* allocate_host(int d, std::size_t n) override { Paused p; return sim_->allocate_host(d, n); }
  void deallocate_host(int d, void* ptr, std::size_t n) override { Paused p; sim_->deallocate_host(d, ptr, n); }
  void copy_to_host_async(int d, void* dst, const void* src, std::size_t n, stream_t st) override {
    Paused p;
    sim_->copy_to_host_async(d, dst, src, n, st);
  }
  void copy_from_host_async(int d, void* dst, const void* src, std::size_t n, stream_t st) override {
    Paused p;
    sim_->copy_from_host_async(d, dst, src, n, st);
  }
  bool is_capturing(int d, stream_t st) override { Paused p; return sim_->is_capturing(d, st); }

 private:
  std::shared_ptr<SimBackend> sim_;
  std::map<std::uintptr_t, std::size_t> mapped_;  ///< what map_run mapped: start -> bytes
};

struct Live {
  void* ptr;
  std::size_t bytes;
  stream_t stream;
};

class HostOutOfMemory : public ::testing::TestWithParam<const char*> {};

/// One run: `live_limit` bounds the live set (near the 96 MiB device, the out-of-memory ladder
/// runs: releases, stitching, compaction).
void run(const char* conf, std::uint64_t seed, std::size_t live_limit) {
  SimBackend::Options o;
  o.capacity = 96 * MiB;  // small: the out-of-memory ladder (release, stitching, compaction) runs too
  auto sim = std::make_shared<SimBackend>(o);
  auto device = std::make_shared<DeviceOutsideTheHeap>(sim);
  Allocator a(Config::parse(std::string("backend:sim,") + conf),
              device);
  std::mt19937_64 rng(seed);
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
  std::vector<Live> live;
  std::size_t live_bytes = 0;
  std::vector<stream_t> held;
  long host_failures = 0, device_ooms = 0;
  auto allocation_count = [&] { return a.stats(0).allocation[kAll].current; };
  for (int op = 0; op < 20000; ++op) {
    host_oom_op = op;
    const std::int64_t before = allocation_count();
    const std::size_t r = pick(100);
    const long after = static_cast<long>(pick(12));
    // Allocations while the live set is below 2/3 of the device; then frees win.
    if ((r < 45 && live_bytes < live_limit) || live.empty()) {
      const std::size_t bytes = pick(5) == 0 ? (1 + pick(20)) * MiB + pick(MiB) : 512 * (1 + pick(400));
      const stream_t stream = S(1 + static_cast<int>(pick(3)));
      try {
        void* p = nullptr;
        {
          Armed armed(after);
          p = a.allocate(bytes, stream);
        }
        live.push_back({p, bytes, stream});
        live_bytes += bytes;
      } catch (const out_of_memory&) {
        ++device_ooms;
      } catch (const std::bad_alloc&) {
        ++host_failures;
        ASSERT_EQ(allocation_count(), before) << "a failed allocation allocated, op " << op;
      }
    } else if (r < 90 || live_bytes >= live_limit) {
      const std::size_t k = pick(live.size());
      const Live l = live[k];
      try {
        {
          Armed armed(after);
          switch (pick(3)) {
            case 0: a.deallocate(l.ptr); break;
            case 1: a.deallocate(l.ptr, S(1 + static_cast<int>(pick(3)))); break;
            default: a.deallocate(l.ptr, l.bytes, 0, l.stream);
          }
        }
        live[k] = live.back();
        live.pop_back();
        live_bytes -= l.bytes;
      } catch (const std::bad_alloc&) {
        ++host_failures;
        ASSERT_TRUE(a.find(l.ptr).has_value()) << "a failed free lost its block, op " << op;
        ASSERT_EQ(allocation_count(), before) << "op " << op;
      }
    } else if (r < 95) {
      const Live& l = live[pick(live.size())];
      const stream_t other = S(1 + static_cast<int>(pick(3)));
      sim->hold_stream(other);
      held.push_back(other);
      try {
        Armed armed(after);
        a.record_stream(l.ptr, other);
      } catch (const std::bad_alloc&) {
        ++host_failures;
      }
    } else if (r < 98) {
      for (stream_t s : held) sim->release_stream(s);
      held.clear();
    } else {
      try {
        Armed armed(after);
        a.empty_cache(0);
      } catch (const std::bad_alloc&) {
        ++host_failures;
      }
    }
    a.validate();
    ASSERT_TRUE(device->maps_every_run(a)) << "a run the allocator shows is not mapped, op " << op;
    ASSERT_EQ(static_cast<std::int64_t>(sim->usage(0).used), a.stats(0).reserved_bytes[kAll].current)
        << "device memory the allocator does not know of (leaked), op " << op;
    for (const Live& l : live) ASSERT_TRUE(a.find(l.ptr).has_value()) << "a live block was lost, op " << op;
  }
  for (stream_t s : held) sim->release_stream(s);
  for (const Live& l : live) a.deallocate(l.ptr);
  a.empty_cache(0);
  a.validate();
  EXPECT_EQ(a.stats(0).allocation[kAll].current, 0);
  EXPECT_EQ(a.stats(0).reserved_bytes[kAll].current, 0);
  EXPECT_EQ(sim->usage(0).used, 0u);
  EXPECT_GT(host_failures, 100) << "the host's failures must have hit the paths";
  const DeviceStats st = a.stats(0);
  std::printf("[ host oom ] %s, seed %llu: %ld requests failed for the host, %ld for the device; "
              "%lld retries after a cache flush, %lld stitches, %lld compactions\n", conf,
              static_cast<unsigned long long>(seed), host_failures, device_ooms,
              static_cast<long long>(st.num_alloc_retries), static_cast<long long>(st.num_stitches),
              static_cast<long long>(st.num_compactions));
}

TEST_P(HostOutOfMemory, LeavesEveryBlockWhereItWasOrInOneConsistentPlace) {
  run(GetParam(), 7, 64 * MiB);
  if (::testing::Test::HasFatalFailure()) return;
  run(GetParam(), 8, 90 * MiB);
}

INSTANTIATE_TEST_SUITE_P(Configs, HostOutOfMemory,
                         ::testing::Values("", "max_split_size_mb:24", "expandable_segments:True",
                                           "expandable_segments:True,stitching:True",
                                           "expandable_segments:True,stitching:True,stitch_compact:True"));

}  // namespace
}  // namespace stitch
