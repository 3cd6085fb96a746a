// Immediate reuse (DeviceAllocator::set_immediate_reuse) must change nothing anyone can see. Two
// allocators, one with it on (the default) and one with it off, get the same random operations,
// biased towards "free, then allocate the same size again" so that reuse happens often: every
// allocation must succeed or fail in both, and at random checkpoints every statistic and the
// whole block layout (snapshot, as offsets within each segment) must be equal (except the count
// of immediate reuses itself, num_immediate_reuses). The configs cover
// the small and large pools, max_split_size and rounding, expandable segments, stitching, a
// memory fraction with garbage collection, out of memory, and blocks that wait for events on
// other streams. ImmediateReuseThreads does the same from four threads at once, each on its own
// stream, with blocks handed to another thread to free: every thread's pairs then run in its own
// slot without the device lock.
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <stdexcept>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/device_allocator.hpp"
#include "core/device_lock.hpp"
#include "stitch/allocator.hpp"
#include "stitch/config.hpp"
#include "stitch/errors.hpp"
#include "stitch/sim_backend.hpp"

namespace stitch {
namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

stream_t S(int n) { return reinterpret_cast<stream_t>(static_cast<std::uintptr_t>(n) * 0x10); }

/// The simulated device with addresses that depend only on the calls made: each allocation or
/// reservation gets the next free range of a private address space, never reused, and calls are
/// translated to the simulated device's real addresses. Best fit breaks ties by address, so two
/// allocators can be compared only where the same calls give the same addresses (the real
/// ones come from mmap, which also serves the heap). The core never reads the memory, and this
/// test does not either.
class FixedAddressBackend final : public Backend {
 public:
  explicit FixedAddressBackend(std::shared_ptr<SimBackend> sim) : sim_(std::move(sim)) {}

  const char* name() const noexcept override { return "sim"; }
  int device_count() override { return sim_->device_count(); }
  MemoryInfo memory_info(int d) override { return sim_->memory_info(d); }
  std::size_t granularity(int d) override { return sim_->granularity(d); }
  bool supports_virtual_memory(int d) override { return sim_->supports_virtual_memory(d); }
  void* allocate(int d, std::size_t bytes) override {
    return expose(sim_->allocate(d, bytes), bytes);
  }
  void deallocate(int d, void* ptr, std::size_t bytes) override {
    sim_->deallocate(d, forget(ptr), bytes);
  }
  void* reserve(int d, std::size_t bytes, std::size_t alignment) override {
    return expose(sim_->reserve(d, bytes, alignment), bytes);
  }
  void release_reservation(int d, void* va, std::size_t bytes) override {
    sim_->release_reservation(d, forget(va), bytes);
  }
  phys_handle_t create_physical(int d, std::size_t bytes) override {
    return sim_->create_physical(d, bytes);
  }
  void release_physical(int d, phys_handle_t h) override { sim_->release_physical(d, h); }
  bool map_run(int d, void* va, const MapPiece* pieces, std::size_t count) override {
    return sim_->map_run(d, real(va), pieces, count);
  }
  void unmap(int d, void* va, std::size_t bytes) override { sim_->unmap(d, real(va), bytes); }
  event_t create_event(int d) override { return sim_->create_event(d); }
  void destroy_event(int d, event_t e) override { sim_->destroy_event(d, e); }
  void record_event(int d, event_t e, stream_t s) override { sim_->record_event(d, e, s); }
  bool query_event(int d, event_t e) override { return sim_->query_event(d, e); }
  void synchronize_event(int d, event_t e) override { sim_->synchronize_event(d, e); }
  void synchronize_stream(int d, stream_t s) override { sim_->synchronize_stream(d, s); }

 private:
  static constexpr std::uintptr_t kAlign = std::uintptr_t{2} << 20;
  void* expose(void* real_ptr, std::size_t bytes) {
    const std::uintptr_t fake = next_;
    next_ += (bytes + 2 * kAlign - 1) / kAlign * kAlign;  // a gap between ranges
    ranges_[fake] = reinterpret_cast<std::uintptr_t>(real_ptr);
    return reinterpret_cast<void*>(fake);
  }
  void* real(void* fake_ptr) const {
    const auto f = reinterpret_cast<std::uintptr_t>(fake_ptr);
    auto it = std::prev(ranges_.upper_bound(f));
    return reinterpret_cast<void*>(it->second + (f - it->first));
  }
  void* forget(void* fake_ptr) {
    void* r = real(fake_ptr);
    ranges_.erase(reinterpret_cast<std::uintptr_t>(fake_ptr));
    return r;
  }

  std::shared_ptr<SimBackend> sim_;
  std::uintptr_t next_ = std::uintptr_t{1} << 44;
  std::map<std::uintptr_t, std::uintptr_t> ranges_;  ///< exposed start -> real start
};

struct Side {
  std::shared_ptr<SimBackend> sim;
  std::unique_ptr<Allocator> alloc;

  /// `backoff` off: every free keeps an extent (the machinery exercised most).
  Side(const std::string& conf, std::size_t capacity, bool immediate_reuse, bool backoff = true) {
    SimBackend::Options o;
    o.capacity = capacity;
    sim = std::make_shared<SimBackend>(o);
    alloc = std::make_unique<Allocator>(Config::parse(conf),
                                        std::make_shared<FixedAddressBackend>(sim));
    alloc->device(0).set_immediate_reuse(immediate_reuse, backoff);
  }
  /// nullptr on out of memory.
  void* allocate(std::size_t bytes, stream_t stream) {
    try {
      return alloc->allocate(bytes, stream);
    } catch (const out_of_memory&) {
      return nullptr;
    }
  }
};

/// The snapshot with addresses as offsets within their segment (the two allocators get their
/// memory at different addresses).
std::string layout(const Allocator& a) {
  std::string out;
  for (const SegmentSnapshot& s : a.snapshot().segments) {
    out += "segment " + std::to_string(s.total_size) + " " + std::to_string(s.stream) + " " +
           s.segment_type + (s.is_expandable ? " expandable" : "") + ":";
    for (const BlockSnapshot& b : s.blocks)
      out += " " + std::to_string(b.address - s.address) + "+" + std::to_string(b.size) + "/" +
             std::to_string(b.requested_size) + "/" + b.state;
    out += "\n";
  }
  return out;
}

std::string stats_text(const Allocator& a, bool peaks = true) {
  std::string out;
  a.stats(0).for_each([&](const std::string& key, std::int64_t v) {
    if (key == "num_immediate_reuses") return;
    if (!peaks && key.find(".peak") != std::string::npos) return;
    out += key + "=" + std::to_string(v) + "\n";
  });
  return out;
}

struct Live {
  void* on;
  void* off;
  std::size_t bytes;
  stream_t stream;
};

using Params = std::tuple<const char*, std::size_t /*capacity MiB*/>;

class ImmediateReuse : public ::testing::TestWithParam<Params> {};

/// The differential run of ImmediateReuse.ChangesNothingObservable; `backoff`: the default
/// policy (misses make frees keep no extent for a while) or every free keeping one.
void run_differential(const std::string& conf, std::size_t capacity, bool backoff) {
  Side on(conf, capacity, true, backoff);
  Side off(conf, capacity, false);

  std::mt19937_64 rng(20261201);
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
  auto random_size = [&]() -> std::size_t {
    switch (pick(10)) {
      case 0: return 1 + pick(511);                 // below the minimum block
      case 1: return (2 + pick(30)) * MiB + pick(MiB);  // large pool
      case 2: return (1 + pick(1000)) * KiB;         // up to the small pool's limit
      default: return 512 * (1 + pick(64));          // small, block-sized
    }
  };

  std::vector<Live> live;
  std::vector<stream_t> held;
  int ooms = 0;
  auto alloc_both = [&](std::size_t bytes, stream_t stream) {
    void* a = on.allocate(bytes, stream);
    void* b = off.allocate(bytes, stream);
    ASSERT_EQ(a == nullptr, b == nullptr) << "one allocator ran out of memory, the other did not";
    if (a == nullptr) {
      ++ooms;
      return;
    }
    live.push_back({a, b, bytes, stream});
  };
  auto free_at = [&](std::size_t i) {
    const Live l = live[i];
    live[i] = live.back();
    live.pop_back();
    on.alloc->deallocate(l.on, l.stream);
    off.alloc->deallocate(l.off, l.stream);
  };
  auto compare = [&](const char* where, int op) {
    ASSERT_EQ(stats_text(*on.alloc), stats_text(*off.alloc)) << where << ", op " << op;
    ASSERT_EQ(layout(*on.alloc), layout(*off.alloc)) << where << ", op " << op;
  };

  constexpr int kOps = 30000;
  int next_check = 1 + static_cast<int>(pick(80));
  for (int op = 0; op < kOps; ++op) {
    const std::size_t r = pick(100);
    const stream_t stream = S(1 + static_cast<int>(pick(3)));
    if (r < 35 || live.empty()) {
      alloc_both(random_size(), stream);
    } else if (r < 75) {
      // Free the newest block and, usually, ask for about the same again on its stream.
      const Live last = live.back();
      free_at(live.size() - 1);
      const std::size_t q = pick(10);
      if (q < 7) {
        std::size_t bytes = last.bytes;
        if (q == 6 && bytes > 512) bytes -= 1 + pick(511);  // same rounding, another request
        alloc_both(bytes, q == 5 ? S(1 + static_cast<int>(pick(3))) : last.stream);
      }
    } else if (r < 93) {
      free_at(pick(live.size()));
    } else if (r < 96) {
      // A block used on another stream, whose work is held: its free waits for an event.
      Live& l = live[pick(live.size())];
      const stream_t other = S(1 + static_cast<int>(pick(3)));
      if (other != l.stream) {
        on.sim->hold_stream(other);
        off.sim->hold_stream(other);
        held.push_back(other);
        on.alloc->record_stream(l.on, other);
        off.alloc->record_stream(l.off, other);
      }
    } else if (r < 98) {
      for (stream_t s : held) {
        on.sim->release_stream(s);
        off.sim->release_stream(s);
      }
      held.clear();
    } else if (r < 99) {
      on.alloc->empty_cache(0);
      off.alloc->empty_cache(0);
    } else {
      on.alloc->reset_peak_stats(0);
      off.alloc->reset_peak_stats(0);
    }
    if (::testing::Test::HasFatalFailure()) return;
    if (op == next_check) {
      compare("checkpoint", op);
      if (::testing::Test::HasFatalFailure()) return;
      next_check = op + 1 + static_cast<int>(pick(80));
    }
  }
  while (!live.empty()) free_at(live.size() - 1);
  for (stream_t s : held) {
    on.sim->release_stream(s);
    off.sim->release_stream(s);
  }
  compare("end", kOps);
  on.alloc->validate();
  off.alloc->validate();

  // The comparison means something only if reuse happened, often (with every free keeping an
  // extent; the default policy keeps fewer in a workload this random).
  const std::int64_t reuses = on.alloc->stats(0).num_immediate_reuses;
  EXPECT_EQ(off.alloc->stats(0).num_immediate_reuses, 0);
  EXPECT_GT(reuses, backoff ? kOps / 40 : kOps / 20) << "reuses: " << reuses;
  std::printf("[ reuse    ] %s%s: %lld immediate reuses, %d out-of-memory results\n",
              conf.c_str(), backoff ? "" : " (no backoff)", static_cast<long long>(reuses), ooms);
}

TEST_P(ImmediateReuse, ChangesNothingObservable) {
  const std::string conf = std::string("backend:sim,") + std::get<0>(GetParam());
  const std::size_t capacity = std::get<1>(GetParam()) * MiB;
  for (const bool backoff : {false, true}) {
    SCOPED_TRACE(backoff ? "default backoff" : "every free keeps an extent");
    run_differential(conf, capacity, backoff);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Configs, ImmediateReuse,
    ::testing::Values(Params{"max_split_size_mb:20000", 4096},
                      Params{"max_split_size_mb:24,roundup_power2_divisions:4", 4096},
                      Params{"expandable_segments:True", 4096},
                      Params{"expandable_segments:True,stitching:True", 160},
                      Params{"garbage_collection_threshold:0.6,per_process_memory_fraction:0.8", 192},
                      Params{"roundup_power2_divisions:2", 48}));

// The pair a training loop repeats (free, then the same size again) is taken straight back, in
// the small and the large pool, and so is another size best fit serves from the same free block;
// any reader completes the free first.
TEST(ImmediateReuseUnit, SameSizeAndOtherSizesComeBackWhereBestFitPutsThem) {
  Side side("backend:sim", 4096 * MiB, true);
  Allocator& a = *side.alloc;
  void* keep = a.allocate(4096);
  void* p = a.allocate(4096);
  a.deallocate(p);
  EXPECT_EQ(a.allocate(4000), p);  // same rounding: taken back
  EXPECT_EQ(a.stats(0).num_immediate_reuses, 1);
  a.deallocate(p);
  EXPECT_EQ(a.stats(0).allocation[kAll].current, 1);  // reading completes the free
  EXPECT_EQ(a.allocate(4096), p);                     // then best fit finds it as usual
  EXPECT_EQ(a.stats(0).num_immediate_reuses, 1);
  a.deallocate(p);
  void* q = a.allocate(2048);  // another size: best fit splits the same free block
  EXPECT_EQ(q, p);
  EXPECT_EQ(a.stats(0).num_immediate_reuses, 2);
  a.deallocate(q);
  void* other_stream = a.allocate(4096, S(1));  // another stream: never the freed block
  EXPECT_NE(other_stream, p);
  a.deallocate(other_stream, S(1));
  void* big = a.allocate(12 * MiB);
  for (int i = 0; i < 3; ++i) {
    a.deallocate(big);
    EXPECT_EQ(a.allocate(6 * MiB), big);  // the large pool's extent, split
    a.deallocate(big);
    EXPECT_EQ(a.allocate(12 * MiB), big);
  }
  EXPECT_EQ(a.stats(0).num_immediate_reuses, 8);
  a.deallocate(big);
  a.deallocate(keep);
  a.validate();
  a.empty_cache(0);
  EXPECT_EQ(a.stats(0).reserved_bytes[kAll].current, 0);
}

// A mix of sizes in turn (a training step's activations, gradients and workspace) is served from
// the thread's extents; where best fit would take another block, it does, and the thread's next
// frees keep no extent for a while (ThreadSlot::cold); same-size pairs that follow come back.
TEST(ImmediateReuseUnit, AMixOfSizesComesBackAndBestFitElsewhereWins) {
  Side side("backend:sim", 4096 * MiB, true);
  Allocator& a = *side.alloc;
  const std::size_t sizes[4] = {4096, 64 * 1024, MiB, 8 * MiB};
  void* first[4] = {};
  for (int i = 0; i < 400; ++i) {
    void* p = a.allocate(sizes[i % 4]);
    if (i < 4) first[i] = p;
    EXPECT_EQ(p, first[i % 4]) << "pair " << i;  // where best fit puts each size
    a.deallocate(p);
  }
  EXPECT_GE(a.stats(0).num_immediate_reuses, 390);  // all but the first of each pool
  a.validate();
  // A 4 KiB hole before the small pool's free rest: best fit takes it, not the extent.
  void* h1 = a.allocate(4096);
  void* hole = a.allocate(4096);
  void* h2 = a.allocate(4096);
  a.deallocate(hole);
  const std::int64_t before = a.stats(0).num_immediate_reuses;
  void* w = a.allocate(64 * 1024);
  a.deallocate(w);  // the rest of the segment: the extent
  EXPECT_EQ(a.allocate(4096), hole);  // best fit: the hole, not the extent
  EXPECT_EQ(a.stats(0).num_immediate_reuses, before);
  for (int i = 0; i < 100; ++i) a.deallocate(a.allocate(MiB));
  EXPECT_GE(a.stats(0).num_immediate_reuses, before + 80);  // after at most kColdFrees frees
  for (void* p : {h1, hole, h2}) a.deallocate(p);
  a.validate();
}

// ---- several threads ------------------------------------------------------------------------

/// Per stream, its segments in creation order, each as its blocks' offsets, sizes and states:
/// what one thread's own operations decide, whatever the other threads did meanwhile.
std::map<std::uintptr_t, std::vector<std::string>> layout_by_stream(const Allocator& a) {
  std::map<std::uintptr_t, std::vector<std::string>> out;
  for (const SegmentSnapshot& s : a.snapshot().segments) {
    std::string seg = std::to_string(s.total_size) + " " + s.segment_type +
                      (s.is_expandable ? " expandable" : "") + ":";
    for (const BlockSnapshot& b : s.blocks)
      seg += " " + std::to_string(b.address - s.address) + "+" + std::to_string(b.size) + "/" +
             std::to_string(b.requested_size) + "/" + b.state;
    out[s.stream].push_back(seg);
  }
  return out;
}

/// One thread's script: the operations of one phase, decided by its own generator.
struct ThreadScript {
  std::mt19937_64 rng;
  std::vector<std::pair<void*, std::size_t>> live;  ///< its blocks (pointer, bytes)
  std::vector<void*> inbox;                         ///< other threads' blocks to free
};

void run_phase(Allocator& a, ThreadScript& t, stream_t stream, int ops) {
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(t.rng() % n); };
  for (int i = 0; i < ops; ++i) {
    const std::size_t r = pick(100);
    if (r < 30 || t.live.empty()) {
      const std::size_t bytes = pick(4) == 0 ? (1 + pick(8)) * MiB + pick(MiB) : 512 * (1 + pick(64));
      t.live.emplace_back(a.allocate(bytes, stream), bytes);
    } else if (r < 85) {
      // The pair a training loop repeats: free the newest, the same size again.
      const auto [p, bytes] = t.live.back();
      a.deallocate(p, bytes, 0, stream);
      t.live.back().first = a.allocate(bytes, stream);
    } else {
      const std::size_t k = pick(t.live.size());
      a.deallocate(t.live[k].first, stream);
      t.live[k] = t.live.back();
      t.live.pop_back();
    }
  }
}

class ImmediateReuseThreads : public ::testing::TestWithParam<const char*> {};

TEST_P(ImmediateReuseThreads, ChangesNothingObservable) {
  constexpr int kThreads = 4, kPhases = 12, kOps = 3000;
  const std::string conf = std::string("backend:sim,") + GetParam();
  Side on(conf, 65536 * MiB, true, false);  // room enough: no thread's memory ever serves another's
  Side off(conf, 65536 * MiB, false);
  std::vector<ThreadScript> on_scripts, off_scripts;
  for (int t = 0; t < kThreads; ++t) {
    on_scripts.push_back({std::mt19937_64(1000 + t), {}, {}});
    off_scripts.push_back({std::mt19937_64(1000 + t), {}, {}});
  }
  for (int phase = 0; phase < kPhases; ++phase) {
    // Blocks handed over at the end of the last phase: each freed by its new thread, one thread
    // after another (a free among another thread's operations on its stream would make the
    // outcome depend on the timing).
    for (std::vector<ThreadScript>* side : {&on_scripts, &off_scripts}) {
      Allocator& a = side == &on_scripts ? *on.alloc : *off.alloc;
      for (ThreadScript& t : *side) {
        std::thread([&] {
          for (void* p : t.inbox) a.deallocate(p);
        }).join();
        t.inbox.clear();
      }
    }
    // The allocator with immediate reuse runs the threads at once, the other one after another.
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] { run_phase(*on.alloc, on_scripts[t], S(t + 1), kOps); });
    for (auto& th : threads) th.join();
    for (int t = 0; t < kThreads; ++t) run_phase(*off.alloc, off_scripts[t], S(t + 1), kOps);
    // Peaks are of sums over the streams, which depend on how the threads interleaved.
    ASSERT_EQ(stats_text(*on.alloc, false), stats_text(*off.alloc, false)) << "phase " << phase;
    ASSERT_EQ(layout_by_stream(*on.alloc), layout_by_stream(*off.alloc)) << "phase " << phase;
    // A few blocks change hands: the next thread frees them in the next phase.
    for (std::vector<ThreadScript>* side : {&on_scripts, &off_scripts}) {
      for (int t = 0; t < kThreads; ++t) {
        ThreadScript& from = (*side)[static_cast<std::size_t>(t)];
        ThreadScript& to = (*side)[static_cast<std::size_t>((t + 1) % kThreads)];
        for (int k = 0; k < 3 && !from.live.empty(); ++k) {
          to.inbox.push_back(from.live.back().first);
          from.live.pop_back();
        }
      }
    }
  }
  on.alloc->validate();
  off.alloc->validate();
  const std::int64_t reuses = on.alloc->stats(0).num_immediate_reuses;
  EXPECT_GT(reuses, kThreads * kPhases * kOps / 4) << "the pairs must mostly be taken straight back";
  std::printf("[ reuse    ] %s: %d threads, %lld immediate reuses\n", GetParam(), kThreads,
              static_cast<long long>(reuses));
}

INSTANTIATE_TEST_SUITE_P(Configs, ImmediateReuseThreads,
                         ::testing::Values("max_split_size_mb:20000", "max_split_size_mb:24",
                                           "expandable_segments:True",
                                           "expandable_segments:True,stitching:True"));

// Two live threads on one stream each keep their own extents (the accepted deviation of shared
// streams): their pairs of every size come back without the lock, a request only another live
// thread's extent could serve gets a segment of its own while the device has room (bounded: a
// few small and large segments per thread), and when the thread ends its extents are anyone's
// again: the next request on the stream files them back, and nothing grows.
TEST(ImmediateReuseSharedStream, LiveThreadsKeepTheirExtentsAndEndedThreadsGiveThemBack) {
  Side side("backend:sim", 4096 * MiB, true);
  Allocator& a = *side.alloc;
  const std::size_t sizes[4] = {512, 64 * KiB, MiB, 8 * MiB};
  std::atomic<int> turn{0};
  constexpr int kRounds = 2000;
  // The two threads take turns (one round each, then the other), so the outcome is decided.
  auto run = [&](int me) {
    for (int r = 0; r < kRounds; ++r) {
      while (turn.load() % 2 != me) std::this_thread::yield();
      for (std::size_t s : sizes) a.deallocate(a.allocate(s, S(1)), s, 0, S(1));
      turn.fetch_add(1);
    }
  };
  std::thread t0(run, 0), t1(run, 1);
  t0.join();
  t1.join();
  // The threads ended (no reader has settled their extents yet): another thread's request on the
  // stream files them back first, so best fit sees that memory free and the device gives nothing.
  const std::uint64_t device_allocations = side.sim->call_count(SimCall::allocate);
  std::thread([&] { a.deallocate(a.allocate(8 * MiB, S(1))); }).join();
  EXPECT_EQ(side.sim->call_count(SimCall::allocate), device_allocations);
  const DeviceStats st = a.stats(0);
  EXPECT_GT(st.num_immediate_reuses, 2 * kRounds * 4 * 9 / 10) << "pairs came back in the slots";
  // Each thread has a small and a large segment of its own at most.
  EXPECT_LE(st.segment[kAll].current, 4);
  a.validate();
}

}  // namespace
}  // namespace stitch

namespace stitch::detail {
namespace {

// ---- the device lock: every lock but malloc's and free's settles the slots --------------------

struct Owner {
  int settled = 0;
  bool fail = false;
  void settle_all() {
    if (fail) throw std::runtime_error("settle failed");
    ++settled;
  }
};

TEST(DeviceLock, EveryLockButMallocsAndFreesSettlesTheSlots) {
  Owner owner;
  DeviceLock<Owner> lock(&owner);
  {
    UnsettledGuard guard(lock);  // malloc's and free's way: the slots stay as they are
  }
  EXPECT_EQ(owner.settled, 0);
  {
    std::lock_guard guard(lock);  // any other path: settled on entry
  }
  EXPECT_EQ(owner.settled, 1);
  // A settle that throws leaves the lock free.
  owner.fail = true;
  EXPECT_THROW(lock.lock(), std::runtime_error);
  owner.fail = false;
  {
    UnsettledGuard guard(lock);  // would deadlock if the failed lock() had kept it
  }
  EXPECT_EQ(owner.settled, 1);
}

}  // namespace
}  // namespace stitch::detail
