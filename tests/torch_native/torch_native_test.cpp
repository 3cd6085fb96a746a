// tests/torch_native/torch_native_test.cpp — libstitch_torch through make_allocator, as PyTorch
// calls it, over the process's allocator on the simulated device (two devices of 1 GiB), with a
// DeviceContext of the test's (nothing initializes CUDA): requests and DataPtrs, init's rule,
// statistics, cacheInfo, snapshots with segments, blocks, history and PyTorch's contexts, the
// out-of-memory type and observers, private pools (use counts, routes, live-allocation checks),
// trace trackers, base allocations, copies, memory fraction and the expandable-segment sizes; a
// free that fails (a backend error, a forked child's inherited tensor) warns and leaks instead of
// throwing out of the deleter.
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <algorithm>
#include <tuple>
#include <unordered_set>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/sim_backend.hpp"
#include "stitch/stitch.h"
#include "stitch/torch_native.hpp"

namespace {

namespace cca = c10::cuda::CUDACachingAllocator;
namespace cda = c10::CachingDeviceAllocator;
using Action = cda::TraceEntry::Action;
constexpr std::size_t MiB = std::size_t{1} << 20;

/// The test's current device and stream.
struct TestContext final : stitch::torch_native::DeviceContext {
  int device = 0;
  void* stream = nullptr;
  int current_device() override { return device; }
  void* current_stream(int) override { return stream; }
};

void* S(std::uintptr_t n) { return reinterpret_cast<void*>(n); }

class TorchNative : public ::testing::Test {
 protected:
  void SetUp() override {
    ctx_ = std::make_shared<TestContext>();
    alloc_ = stitch::torch_native::make_allocator(ctx_);
    alloc_->init(2);
  }
  void TearDown() override {
    alloc_->recordHistory(false, nullptr, 0, cda::RecordContext::NEVER, true, {});
    stitch::process_allocator().empty_cache(-1);
    EXPECT_EQ(stitch::process_allocator().stats(0).allocated_bytes[0].current, 0) << "a test leaked";
    EXPECT_EQ(stitch::process_allocator().stats(1).allocated_bytes[0].current, 0) << "a test leaked";
  }
  std::shared_ptr<TestContext> ctx_;
  std::shared_ptr<cca::CUDAAllocator> alloc_;
};

TEST_F(TorchNative, NameAndInitAsPyTorchsAllocator) {
  EXPECT_EQ(alloc_->name(), "stitch");
  auto fresh = stitch::torch_native::make_allocator(ctx_);
  EXPECT_FALSE(fresh->initialized());
  EXPECT_THROW((void)fresh->getDeviceStats(0), c10::Error);  // "did you call init?"
  try {
    (void)fresh->getDeviceStats(0);
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("did you call init?"), std::string::npos) << e.what();
  }
  fresh->init(1);
  EXPECT_TRUE(fresh->initialized());
  EXPECT_NO_THROW((void)fresh->getDeviceStats(0));
  EXPECT_THROW((void)fresh->getDeviceStats(1), c10::Error);
}

TEST_F(TorchNative, DataPtrsComeFromStitchOnTheCurrentDeviceAndStream) {
  ctx_->device = 1;
  ctx_->stream = S(0x71);
  {
    c10::DataPtr p = alloc_->allocate(3 * MiB + 5);
    ASSERT_NE(p.get(), nullptr);
    EXPECT_EQ(p.device(), c10::Device(c10::DeviceType::CUDA, 1));
    EXPECT_EQ(p.get_deleter(), alloc_->raw_deleter());
    const auto info = stitch::process_allocator().find(p.get());
    ASSERT_TRUE(info.has_value());
    EXPECT_EQ(info->device, 1);
    EXPECT_EQ(info->stream, S(0x71));
    EXPECT_EQ(info->requested, 3 * MiB + 5);
    std::memset(p.get(), 0x5a, 3 * MiB + 5);  // the simulated device's memory is readable
    const auto st = alloc_->getDeviceStats(1);
    EXPECT_EQ(st.requested_bytes[0].current, static_cast<int64_t>(3 * MiB + 5));
    EXPECT_EQ(st.allocation[0].current, 1);
  }
  EXPECT_EQ(alloc_->getDeviceStats(1).allocation[0].current, 0);
  EXPECT_EQ(alloc_->allocate(0).get(), nullptr);
  void* r = alloc_->raw_alloc_with_stream(4096, reinterpret_cast<cudaStream_t>(S(0x72)));
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(stitch::process_allocator().find(r)->stream, S(0x72));
  alloc_->raw_delete(r);
  // Not a pointer of stitch's: raw_delete runs in destructors, so it warns instead of throwing
  // (and the allocator counts the invalid free).
  const std::int64_t invalid = *stitch::process_allocator().stat(0, "num_invalid_frees");
  EXPECT_NO_THROW(alloc_->raw_delete(S(0x1234)));
  EXPECT_EQ(*stitch::process_allocator().stat(0, "num_invalid_frees"), invalid + 1);
}

/// Collects the warnings c10 raises on this thread while it lives.
struct Warnings final : c10::WarningHandler {
  std::vector<std::string> seen;
  c10::WarningUtils::WarningHandlerGuard guard{this};
  void process(const c10::Warning& w) override { seen.push_back(w.msg()); }
  [[nodiscard]] bool any(const std::string& text) const {
    return std::any_of(seen.begin(), seen.end(), [&](const std::string& s) { return s.find(text) != std::string::npos; });
  }
};

TEST_F(TorchNative, AFreeThatFailsWarnsCountsAndLeaksTheBlockInsteadOfThrowing) {
  // A backend error during a DataPtr's free (here: recording the event of a stream the block was
  // used on) must not escape the deleter, which runs in destructors: a warning with the error,
  // num_failed_frees, the block left allocated.
  auto& sim = dynamic_cast<stitch::SimBackend&>(stitch::process_allocator().backend());
  const std::int64_t failed = *stitch::process_allocator().stat(0, "num_failed_frees");
  void* raw = nullptr;
  {
    Warnings warnings;
    c10::DataPtr p = alloc_->allocate(2 * MiB);
    raw = p.get();
    stitch::process_allocator().record_stream(raw, S(0x99));
    sim.inject_fault(stitch::SimCall::record_event, 1, stitch::SimFault::error);
    EXPECT_NO_THROW(p.clear());
    sim.clear_faults();
    EXPECT_TRUE(warnings.any("stitch: freeing")) << "no warning";
    EXPECT_TRUE(warnings.any("record_event")) << "the warning names the error";
    EXPECT_TRUE(warnings.any("num_failed_frees"));
  }
  EXPECT_EQ(*stitch::process_allocator().stat(0, "num_failed_frees"), failed + 1);
  EXPECT_TRUE(stitch::process_allocator().find(raw).has_value()) << "the block is leaked, not half freed";
  stitch::process_allocator().deallocate(raw);  // (the test's own cleanup)
}

TEST_F(TorchNative, ATensorFreedInAForkedChildDoesNotEndTheChild) {
  // A child of fork() inherits the parent's tensors; when it frees one, stitch's allocator
  // refuses there (its locks may be held by a parent thread), and PyTorch's deleter must not
  // terminate the child: it warns and leaks. The parent's block is untouched.
  c10::DataPtr p = alloc_->allocate(3 * MiB);
  std::memset(p.get(), 0x3c, 3 * MiB);
  void* raw = p.get();
  const pid_t pid = fork();
  if (pid == 0) {
    int code = 0;
    {
      Warnings warnings;
      try {
        p.clear();  // the deleter, in the child
      } catch (...) {
        code = 2;
      }
      if (code == 0 && !warnings.any("stitch: freeing")) code = 3;
    }
    std::_Exit(code);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child ended by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: the deleter threw; 3: no warning";
  ASSERT_TRUE(stitch::process_allocator().find(raw).has_value());
  EXPECT_EQ(static_cast<unsigned char*>(raw)[3 * MiB - 1], 0x3c);
}

TEST_F(TorchNative, StatisticsAreStitchsUnderPyTorchsNames) {
  alloc_->resetAccumulatedStats(0);
  alloc_->resetPeakStats(0);
  std::vector<c10::DataPtr> live;
  for (std::size_t s : {512, 4096, 1 << 20, 5 << 20, 30 << 20}) live.push_back(alloc_->allocate(s));
  live.pop_back();
  const stitch::DeviceStats want = stitch::process_allocator().stats(0);
  const cda::DeviceStats got = alloc_->getDeviceStats(0);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(got.allocated_bytes[i].current, want.allocated_bytes[i].current);
    EXPECT_EQ(got.allocated_bytes[i].peak, want.allocated_bytes[i].peak);
    EXPECT_EQ(got.reserved_bytes[i].current, want.reserved_bytes[i].current);
    EXPECT_EQ(got.active_bytes[i].allocated, want.active_bytes[i].allocated);
    EXPECT_EQ(got.segment[i].current, want.segment[i].current);
    EXPECT_EQ(got.inactive_split_bytes[i].current, want.inactive_split_bytes[i].current);
    EXPECT_EQ(got.requested_bytes[i].freed, want.requested_bytes[i].freed);
  }
  EXPECT_EQ(got.num_device_alloc, want.num_device_alloc);
  EXPECT_EQ(got.max_split_size, want.max_split_size);
  EXPECT_GT(got.allocated_bytes[0].peak, got.allocated_bytes[0].current);  // the 30 MiB block
  live.clear();
  alloc_->resetPeakStats(0);
  EXPECT_EQ(alloc_->getDeviceStats(0).allocated_bytes[0].peak, 0);
  alloc_->resetAccumulatedStats(0);
  EXPECT_EQ(alloc_->getDeviceStats(0).allocated_bytes[0].allocated, 0);
  EXPECT_EQ(alloc_->getDeviceStats(0).num_device_alloc, 0);
}

TEST_F(TorchNative, CacheInfoIsARequestThatSucceedsWithoutFreeingLiveMemory) {
  // Fill most of device 0, leave a hole between live blocks and little room on the device.
  std::vector<c10::DataPtr> live;
  for (int i = 0; i < 9; ++i) live.push_back(alloc_->allocate(100 * MiB));
  live[4] = c10::DataPtr();  // a 100 MiB hole
  size_t largest = 0;
  alloc_->cacheInfo(0, &largest);
  const auto [free, total] = alloc_->getMemoryInfo(0);
  EXPECT_EQ(total, 1024 * MiB);
  EXPECT_GE(largest, 100 * MiB);
  EXPECT_GE(largest, free / (2 * MiB) * (2 * MiB));
  const int64_t reserved = alloc_->getDeviceStats(0).reserved_bytes[0].current;
  {
    c10::DataPtr w = alloc_->allocate(largest);  // what cuDNN does with it: it fits
    EXPECT_NE(w.get(), nullptr);
  }
  EXPECT_GE(alloc_->getDeviceStats(0).reserved_bytes[0].current, reserved);
  // The argument is in/out: a larger guess stays.
  size_t big = 4096 * MiB;
  alloc_->cacheInfo(0, &big);
  EXPECT_EQ(big, 4096 * MiB);
}

TEST_F(TorchNative, OutOfMemoryIsTorchsTypeAfterTheObservers) {
  struct Seen {
    int64_t device = -1;
    size_t allocated = 0, total = 0, free = 0;
    int calls = 0;
  };
  auto seen = std::make_shared<Seen>();
  alloc_->attachOutOfMemoryObserver([seen](int64_t device, size_t allocated, size_t total, size_t free) {
    *seen = {device, allocated, total, free, seen->calls + 1};
  });
  ctx_->device = 1;
  c10::DataPtr keep = alloc_->allocate(64 * MiB);
  bool thrown = false;
  try {
    (void)alloc_->allocate(2048 * MiB);
  } catch (const c10::OutOfMemoryError& e) {
    thrown = true;
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(thrown) << "not c10::OutOfMemoryError";
  EXPECT_EQ(seen->calls, 1);
  EXPECT_EQ(seen->device, 1);
  EXPECT_EQ(seen->allocated, 2048 * MiB);  // the segment it needed
  EXPECT_EQ(seen->total, 1024 * MiB);
  EXPECT_LE(seen->free, 1024 * MiB - 64 * MiB);
  EXPECT_EQ(alloc_->getDeviceStats(1).num_ooms, stitch::process_allocator().stats(1).num_ooms);
  EXPECT_GE(alloc_->getDeviceStats(1).num_ooms, 1);
}

/// A context PyTorch's recorder would return (the test's: a number).
struct TestGathered final : c10::GatheredContext {
  explicit TestGathered(int n) : n(n) {}
  int n;
};
std::atomic<int> g_gathered{0};
std::shared_ptr<c10::GatheredContext> test_recorder() {
  return std::make_shared<TestGathered>(++g_gathered);
}
int number(const std::shared_ptr<c10::GatheredContext>& c) {
  auto* t = dynamic_cast<TestGathered*>(c.get());
  return t == nullptr ? 0 : t->n;
}

TEST_F(TorchNative, SnapshotHasSegmentsBlocksHistoryAndContexts) {
  alloc_->emptyCache({0, 0});
  alloc_->recordHistory(true, &test_recorder, 1000, cda::RecordContext::ALL, true, {});
  EXPECT_TRUE(alloc_->isHistoryEnabled());
  const auto t0 = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::system_clock::now().time_since_epoch()).count();
  c10::DataPtr a = alloc_->allocate(1000);
  c10::DataPtr b = alloc_->allocate(6 * MiB);
  const int ctx_b = number(alloc_->getContextForPointer(b.get()));
  EXPECT_GT(ctx_b, 0);
  { c10::DataPtr c = alloc_->allocate(2000); }
  const cca::SnapshotInfo snap = alloc_->snapshot({0, 0}, true);
  // Segments and blocks: a and b are allocated blocks of theirs, with their contexts.
  int found = 0;
  for (const auto& s : snap.segments) {
    std::size_t sum = 0, addr = s.address;
    for (const auto& blk : s.blocks) {
      sum += blk.size;
      if (addr == reinterpret_cast<std::size_t>(b.get())) {
        ++found;
        EXPECT_TRUE(blk.allocated);
        EXPECT_EQ(blk.requested_size, 6 * MiB);
        EXPECT_EQ(number(blk.context_when_allocated), ctx_b);
        EXPECT_TRUE(s.is_large);
      }
      if (addr == reinterpret_cast<std::size_t>(a.get())) {
        ++found;
        EXPECT_TRUE(blk.allocated);
        EXPECT_FALSE(s.is_large);
      }
      addr += blk.size;
    }
    EXPECT_EQ(sum, s.total_size);
  }
  EXPECT_EQ(found, 2);
  // The history: alloc, segment_alloc, free_requested, free_completed, snapshot, with contexts.
  ASSERT_GE(snap.device_traces.size(), 1u);
  const auto& trace = snap.device_traces[0];
  int allocs = 0, segment_allocs = 0, frees = 0, snapshots = 0;
  for (const auto& te : trace) {
    EXPECT_GE(te.time_.t_, t0 - 1);  // microseconds since the epoch
    EXPECT_LE(te.time_.t_, t0 + 600'000'000);
    switch (te.action_) {
      case Action::ALLOC: ++allocs; EXPECT_GT(number(te.context_), 0); break;
      case Action::SEGMENT_ALLOC: ++segment_allocs; break;
      case Action::FREE_REQUESTED:
      case Action::FREE_COMPLETED: ++frees; EXPECT_GT(number(te.context_), 0); break;
      case Action::SNAPSHOT: ++snapshots; break;
      default: break;
    }
  }
  EXPECT_EQ(allocs, 3);
  EXPECT_GE(segment_allocs, 2);
  EXPECT_EQ(frees, 2);
  EXPECT_EQ(snapshots, 1);
  EXPECT_EQ(snap.config_metadata.last_allocator_settings, stitch::process_allocator().config().source);
  // Skipped actions, and a history without free contexts (RecordContext::ALLOC): a free's entry
  // has its block's context.
  alloc_->recordHistory(true, &test_recorder, 1000, cda::RecordContext::ALLOC, true, {"free_requested"});
  { c10::DataPtr c = alloc_->allocate(2000); }
  const auto trace2 = alloc_->snapshot({0, 0}, true).device_traces[0];
  int requested = 0, completed = 0;
  for (const auto& te : trace2) {
    if (te.action_ == Action::FREE_REQUESTED) ++requested;
    if (te.action_ == Action::FREE_COMPLETED) {
      ++completed;
      EXPECT_GT(number(te.context_), 0);
    }
  }
  EXPECT_EQ(requested, 0);
  EXPECT_EQ(completed, 1);
  // Off: nothing kept; the snapshot without traces has none.
  alloc_->recordHistory(false, nullptr, 0, cda::RecordContext::NEVER, false, {});
  EXPECT_FALSE(alloc_->isHistoryEnabled());
  EXPECT_TRUE(alloc_->snapshot({0, 0}, false).device_traces.empty());
  EXPECT_TRUE(alloc_->snapshot({0, 0}, true).device_traces[0].empty());
}

TEST_F(TorchNative, TraceTrackersSeeSegmentsAsPyTorchReportsThem) {
  alloc_->emptyCache({0, 0});
  struct Event {
    Action action;
    std::size_t addr, size;
  };
  auto events = std::make_shared<std::vector<Event>>();
  alloc_->attachAllocatorTraceTracker([events](const cda::TraceEntry& te) {
    events->push_back({te.action_, te.addr_, te.size_});
  });
  void* base = nullptr;
  {
    c10::DataPtr p = alloc_->allocate(30 * MiB);
    base = p.get();
  }
  alloc_->emptyCache({0, 0});
  bool allocated = false, freed = false;
  for (const Event& e : *events) {
    if (e.action == Action::SEGMENT_ALLOC && e.addr == reinterpret_cast<std::size_t>(base)) allocated = e.size >= 30 * MiB;
    if (e.action == Action::SEGMENT_FREE && e.addr == reinterpret_cast<std::size_t>(base)) freed = true;
  }
  EXPECT_TRUE(allocated);
  EXPECT_TRUE(freed);
}

TEST_F(TorchNative, PrivatePoolsCountUsesRouteStreamsAndCheckLiveAllocations) {
  const c10::MempoolId_t pool{0, 7};
  EXPECT_EQ(alloc_->getPoolUseCount(0, pool), 0);
  alloc_->createOrIncrefPool(0, pool, nullptr);
  EXPECT_EQ(alloc_->getPoolUseCount(0, pool), 1);
  const auto capturing = reinterpret_cast<cudaStream_t>(S(0x99));
  alloc_->beginAllocateToPool(0, pool, [capturing](cudaStream_t s) { return s == capturing; });
  EXPECT_EQ(alloc_->getPoolUseCount(0, pool), 2);
  ctx_->stream = S(0x99);
  c10::DataPtr in_pool = alloc_->allocate(1 * MiB);
  ctx_->stream = S(0x98);
  c10::DataPtr outside = alloc_->allocate(1 * MiB);
  alloc_->endAllocateToPool(0, pool);
  EXPECT_EQ(alloc_->getPoolUseCount(0, pool), 2);
  alloc_->releasePool(0, pool);
  EXPECT_EQ(alloc_->getPoolUseCount(0, pool), 1);
  // The pool's snapshot holds its own segments only.
  const auto snap = alloc_->snapshot(pool, false);
  ASSERT_FALSE(snap.segments.empty());
  for (const auto& s : snap.segments) EXPECT_EQ(s.owner_private_pool_id, pool);
  EXPECT_TRUE(alloc_->checkPoolLiveAllocations(0, pool, {in_pool.get()}));
  EXPECT_FALSE(alloc_->checkPoolLiveAllocations(0, pool, {outside.get()}));
  EXPECT_FALSE(alloc_->checkPoolLiveAllocations(0, pool, {}));
  EXPECT_FALSE(alloc_->checkPoolLiveAllocations(0, pool, {in_pool.get(), outside.get()}));
  EXPECT_GT(alloc_->getDeviceStats(0).reserved_bytes_by_private_pools.at(pool)[0].current, 0);
  alloc_->setUseOnOOM(0, pool, true);
  alloc_->setNoSplit(0, pool);
  // emptyCache of one pool leaves the device's own cache alone.
  {
    c10::DataPtr cached = alloc_->allocate(3 * MiB);
  }
  const int64_t reserved = alloc_->getDeviceStats(0).reserved_bytes[0].current;
  alloc_->emptyCache(pool);
  EXPECT_EQ(alloc_->getDeviceStats(0).reserved_bytes[0].current, reserved);
  // Released: its memory goes back once its blocks are free.
  alloc_->releasePool(0, pool);
  EXPECT_EQ(alloc_->getPoolUseCount(0, pool), 0);
  in_pool = c10::DataPtr();
  alloc_->emptyCache({0, 0});
  EXPECT_TRUE(alloc_->snapshot(pool, false).segments.empty());
  EXPECT_THROW(alloc_->releasePool(0, pool), c10::Error);
  // A MemPool over this allocator is a stitch pool.
  EXPECT_NO_THROW(alloc_->createOrIncrefPool(0, {0, 8}, alloc_));
  alloc_->releasePool(0, {0, 8});
}

TEST_F(TorchNative, BaseAllocationRecordStreamCopiesAndFraction) {
  c10::DataPtr p = alloc_->allocate(5 * MiB);
  size_t size = 0;
  void* base = alloc_->getBaseAllocation(p.get(), &size);
  const auto segment = stitch::process_allocator().segment_of(p.get());
  ASSERT_TRUE(segment.has_value());
  EXPECT_EQ(base, segment->first);
  EXPECT_EQ(size, segment->second);
  EXPECT_THROW((void)alloc_->getBaseAllocation(S(0x10), &size), c10::Error);
  // As PyTorch's: the pointer must start a live block.
  EXPECT_THROW((void)alloc_->getBaseAllocation(static_cast<char*>(p.get()) + 4096, &size), c10::Error);
  // recordStream: the block waits for the other stream after its free.
  const auto other = c10::cuda::getStreamFromExternal(reinterpret_cast<cudaStream_t>(S(0x610000)), 0);
  alloc_->recordStream(p, other);
  auto& sim = dynamic_cast<stitch::SimBackend&>(stitch::process_allocator().backend());
  sim.hold_stream(S(0x610000));  // work queued on the other stream is not done
  const int64_t active = alloc_->getDeviceStats(0).active_bytes[0].current;
  {
    c10::DataPtr r = alloc_->allocate(6 * MiB);
    alloc_->recordStream(r, other);
  }
  // Freed, and still active until the other stream's work completes.
  EXPECT_EQ(alloc_->getDeviceStats(0).active_bytes[0].current, active + static_cast<int64_t>(6 * MiB));
  sim.release_stream(S(0x610000));
  EXPECT_EQ(alloc_->getDeviceStats(0).active_bytes[0].current, active);
  alloc_->recordStream(c10::DataPtr(), other);  // empty: nothing
  c10::DataPtr foreign(S(0x40), S(0x40), nullptr, c10::Device(c10::DeviceType::CUDA, 0));
  alloc_->recordStream(foreign, other);  // not stitch's: nothing
  // memcpyAsync on the simulated device copies.
  c10::DataPtr q = alloc_->allocate(4096);
  std::memset(p.get(), 0x33, 4096);
  EXPECT_EQ(alloc_->memcpyAsync(q.get(), 0, p.get(), 0, 4096, nullptr, false), cudaSuccess);
  stitch::process_allocator().backend().synchronize_stream(0, nullptr);
  EXPECT_EQ(static_cast<unsigned char*>(q.get())[4095], 0x33);
  // Memory fraction.
  EXPECT_THROW(alloc_->setMemoryFraction(1.5, 0), c10::Error);
  alloc_->setMemoryFraction(0.5, 0);
  EXPECT_DOUBLE_EQ(alloc_->getMemoryFraction(0), 0.5);
  alloc_->setMemoryFraction(1.0, 0);
  EXPECT_NO_THROW(alloc_->enablePeerAccess(0, 1));
}

TEST_F(TorchNative, ExpandableSegmentSizesByStreamAndPool) {
  ASSERT_EQ(stitch_configure("expandable_segments:True"), 0) << stitch_last_error();
  ctx_->stream = S(0x51);
  c10::DataPtr small = alloc_->allocate(4096);
  c10::DataPtr large = alloc_->allocate(12 * MiB);
  std::size_t small_bytes = 0, large_bytes = 0;
  for (const auto& s : alloc_->getExpandableSegmentSizes(0)) {
    if (s.stream != reinterpret_cast<cudaStream_t>(S(0x51))) continue;
    (s.is_small_pool ? small_bytes : large_bytes) += s.total_size;
  }
  EXPECT_GE(small_bytes, 4096u);
  EXPECT_GE(large_bytes, 12 * MiB);
  small = c10::DataPtr();
  large = c10::DataPtr();
  alloc_->emptyCache({0, 0});
  ASSERT_EQ(stitch_configure("expandable_segments:False"), 0) << stitch_last_error();
}

TEST_F(TorchNative, APoolMarkedUseOnOomServesWhatTheDeviceCannot) {
  alloc_->emptyCache({0, 0});
  const c10::MempoolId_t pool{0, 31};
  // (As in PyTorch's, a pool's free blocks serve requests of their own stream.)
  const auto g = reinterpret_cast<cudaStream_t>(S(0x551));
  alloc_->createOrIncrefPool(0, pool, nullptr);
  alloc_->beginAllocateToPool(0, pool, [g](cudaStream_t s) { return s == g; });
  void* in_pool = alloc_->raw_alloc_with_stream(200 * MiB, g);
  alloc_->endAllocateToPool(0, pool);
  alloc_->raw_delete(in_pool);  // the pool keeps a free 200 MiB block
  ctx_->stream = S(0x551);
  c10::DataPtr big = alloc_->allocate(800 * MiB);  // the device is nearly full now
  EXPECT_THROW((void)alloc_->allocate(100 * MiB), c10::OutOfMemoryError);
  alloc_->setUseOnOOM(0, pool, true);
  {
    c10::DataPtr served = alloc_->allocate(100 * MiB);  // from the pool's free block
    const auto seg = stitch::process_allocator().segment_of(served.get());
    ASSERT_TRUE(seg.has_value());
    EXPECT_EQ(seg->first, in_pool);
    EXPECT_EQ(alloc_->getPoolUseCount(0, pool), 2);  // the fallback's route left no use behind
  }
  alloc_->setUseOnOOM(0, pool, false);
  EXPECT_THROW((void)alloc_->allocate(100 * MiB), c10::OutOfMemoryError);
  big = c10::DataPtr();
  alloc_->releasePool(0, pool);
  alloc_->releasePool(0, pool);
  alloc_->emptyCache({0, 0});
}

TEST_F(TorchNative, ANoSplitPoolServesItsFreeBlocksWhole) {
  const c10::MempoolId_t pool{0, 41};
  const auto g = reinterpret_cast<cudaStream_t>(S(0x660));
  alloc_->createOrIncrefPool(0, pool, nullptr);
  alloc_->setNoSplit(0, pool);
  alloc_->beginAllocateToPool(0, pool, [g](cudaStream_t s) { return s == g; });
  void* first = alloc_->raw_alloc_with_stream(4 * MiB, g);
  alloc_->raw_delete(first);
  void* small = alloc_->raw_alloc_with_stream(1 * MiB + 4096, g);  // large pool, would split
  alloc_->endAllocateToPool(0, pool);
  EXPECT_EQ(small, first);
  const auto info = stitch::process_allocator().find(small);
  ASSERT_TRUE(info.has_value());
  EXPECT_GE(info->size, 4 * MiB) << "served whole, not split";
  alloc_->raw_delete(small);
  alloc_->releasePool(0, pool);
  alloc_->releasePool(0, pool);
  alloc_->emptyCache({0, 0});
  EXPECT_THROW(alloc_->setNoSplit(0, pool), c10::Error);
}

TEST_F(TorchNative, AllocateWithAddressServesAFreeBlockThere) {
  ctx_->stream = S(0x330);
  void* x = alloc_->raw_alloc(3 * MiB);
  void* y = alloc_->raw_alloc(1 * MiB);  // after x in the same segment
  alloc_->raw_delete(x);
  {
    c10::DataPtr at = alloc_->allocateWithAddress(3 * MiB, x);
    EXPECT_EQ(at.get(), x);
    EXPECT_EQ(stitch::process_allocator().find(x)->requested, 3 * MiB);
    // Taken now: the same address again, and an address inside a live block, cannot be served.
    EXPECT_THROW((void)alloc_->allocateWithAddress(4096, x), c10::Error);
    EXPECT_THROW((void)alloc_->allocateWithAddress(4096, y), c10::Error);
  }
  // Inside the free block: the space before it stays free.
  void* inside = static_cast<char*>(x) + 1 * MiB;
  {
    c10::DataPtr at = alloc_->allocateWithAddress(1 * MiB, inside);
    EXPECT_EQ(at.get(), inside);
  }
  EXPECT_THROW((void)alloc_->allocateWithAddress(4096, static_cast<char*>(x) + 100), c10::Error);  // alignment
  ctx_->stream = S(0x331);  // another stream's free block is not this stream's
  EXPECT_THROW((void)alloc_->allocateWithAddress(4096, x), c10::Error);
  alloc_->raw_delete(y);
}

TEST_F(TorchNative, CheckpointsPutAPoolsBlocksBackWhereTheyWere) {
  const c10::MempoolId_t pool{0, 21};
  const auto graph = reinterpret_cast<cudaStream_t>(S(0x440));
  alloc_->createOrIncrefPool(0, pool, nullptr);
  alloc_->beginAllocateToPool(0, pool, [graph](cudaStream_t s) { return s == graph; });
  void* a = alloc_->raw_alloc_with_stream(1 * MiB, graph);
  void* b = alloc_->raw_alloc_with_stream(2 * MiB, graph);
  void* c = alloc_->raw_alloc_with_stream(512 * 1024, graph);
  alloc_->endAllocateToPool(0, pool);
  alloc_->raw_delete(b);
  const auto state = alloc_->getCheckpointState(0, pool);
  const auto before = alloc_->snapshot(pool, false).segments;
  // The path diverges: other blocks of the pool.
  alloc_->beginAllocateToPool(0, pool, [graph](cudaStream_t s) { return s == graph; });
  void* d = alloc_->raw_alloc_with_stream(3 * MiB, graph);
  alloc_->endAllocateToPool(0, pool);
  alloc_->raw_delete(a);
  cca::CheckpointDelta delta = alloc_->setCheckpointPoolState(0, state);
  std::unordered_set<void*> freed(delta.ptrs_freed.begin(), delta.ptrs_freed.end());
  EXPECT_EQ(freed, (std::unordered_set<void*>{c, d}));
  std::unordered_set<void*> back;
  for (const auto& p : delta.dataptrs_allocd) back.insert(p.get());
  EXPECT_EQ(back, (std::unordered_set<void*>{a, c}));
  EXPECT_TRUE(alloc_->checkPoolLiveAllocations(0, pool, {a, c}));
  // The pool's layout is the checkpoint's: the same allocated blocks, sizes and requests.
  const auto after = alloc_->snapshot(pool, false).segments;
  auto allocated = [](const std::vector<cda::SegmentInfo>& segs) {
    std::vector<std::tuple<std::size_t, std::size_t, std::size_t>> out;
    for (const auto& s : segs) {
      std::size_t at = s.address;
      for (const auto& blk : s.blocks) {
        if (blk.allocated) out.emplace_back(at, blk.size, blk.requested_size);
        at += blk.size;
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  EXPECT_EQ(allocated(after), allocated(before));
  EXPECT_THROW((void)alloc_->getCheckpointState(0, {0, 999}), c10::Error);
  delta.dataptrs_allocd.clear();  // frees a and c through their deleters
  EXPECT_EQ(alloc_->getPoolUseCount(0, pool), 3);  // created, and two routes
  for (int i = 0; i < 3; ++i) alloc_->releasePool(0, pool);
  alloc_->emptyCache({0, 0});
  EXPECT_TRUE(alloc_->snapshot(pool, false).segments.empty());
}

std::string g_self;  // this program, for the second process of the IPC test

/// The second process: maps the handle as PyTorch's receiver does (getIpcDevPtr, plus the
/// offset), checks `expect` in every byte, writes `write`, drops the mapping.
int ipc_peer(const std::string& handle, std::size_t offset, std::size_t bytes, int expect, int write) {
  if (stitch_configure("backend:sim") != 0) return 10;
  auto ctx = std::make_shared<TestContext>();
  auto alloc = stitch::torch_native::make_allocator(ctx);
  alloc->init(1);
  try {
    std::shared_ptr<void> base = alloc->getIpcDevPtr(handle);
    if (alloc->getIpcDevPtr(handle).get() != base.get()) return 11;  // cached while in use
    auto* p = static_cast<unsigned char*>(base.get()) + offset;
    for (std::size_t i = 0; i < bytes; ++i)
      if (p[i] != expect) return 12;
    std::memset(p, write, bytes);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "peer: %s\n", e.what_without_backtrace());
    return 13;
  }
  return 0;
}

TEST_F(TorchNative, IpcHandleOpenedByASecondProcessSharesTheBlock) {
  // PyTorch's defaults: the block lies in a plain segment (tests/ipc covers expandable ranges).
  constexpr std::size_t bytes = 5 * MiB + 512;
  c10::DataPtr neighbour = alloc_->allocate(1 * MiB);
  c10::DataPtr block = alloc_->allocate(bytes);
  std::memset(block.get(), 0x5e, bytes);
  size_t base_size = 0;
  (void)alloc_->getBaseAllocation(block.get(), &base_size);  // PyTorch asks first
  const cca::ShareableHandle h = alloc_->shareIpcHandle(block.get());
  EXPECT_EQ(h.handle[1], 's');
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string off = std::to_string(h.offset), n = std::to_string(bytes);
    execl(g_self.c_str(), g_self.c_str(), "--ipc-peer", h.handle.c_str(), off.c_str(), n.c_str(), "94", "33",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the second process failed";
  auto* p = static_cast<unsigned char*>(block.get());
  EXPECT_EQ(p[0], 33);
  EXPECT_EQ(p[bytes - 1], 33);  // the peer's bytes, in the exporter's block
  // In this process too: one mapping per handle while in use, the base plus the offset is the block.
  {
    std::shared_ptr<void> mapped = alloc_->getIpcDevPtr(h.handle);
    auto* q = static_cast<unsigned char*>(mapped.get()) + h.offset;
    EXPECT_NE(q, p);
    q[9] = 0x42;
    EXPECT_EQ(p[9], 0x42);
  }
  EXPECT_THROW((void)alloc_->shareIpcHandle(static_cast<char*>(block.get()) + 512), c10::Error);
  EXPECT_THROW((void)alloc_->getIpcDevPtr(std::string("\x02c") + std::string(64, 'x')), c10::Error);
  block = c10::DataPtr();
  neighbour = c10::DataPtr();
  alloc_->emptyCache({0, 0});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 7 && std::string(argv[1]) == "--ipc-peer")
    return ipc_peer(argv[2], std::stoul(argv[3]), std::stoul(argv[4]), std::atoi(argv[5]), std::atoi(argv[6]));
  g_self = argv[0];
  // The process's allocator: two simulated devices of 1 GiB (before anything allocates).
  if (stitch_configure("backend:sim,sim_devices:2,sim_capacity_mb:1024") != 0) {
    std::fprintf(stderr, "stitch_configure: %s\n", stitch_last_error());
    return 1;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
