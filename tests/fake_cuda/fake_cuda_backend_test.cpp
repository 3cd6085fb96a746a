// tests/fake_cuda/fake_cuda_backend_test.cpp — backend:cuda, its real code path, on the strict
// fake driver (libstitch_fake_cuda.so, named by STITCH_CUDA_DRIVER; ctest sets it): the
// allocator plain, with expandable segments and with stitching (data, bad frees, OOM and
// recovery, leaks), contexts (never one on a device the program did not use, the caller's
// restored, threads on other devices), the CUDA defects fixed on this path (cuMemMap out of
// memory, one cuMemSetAccess per run, peers, strays), held streams, pinned host memory and its
// asynchronous copies (out of memory, failures named), a fault sweep over every entry point, and
// one over every call a KV pool's spill and unspill make (each handle created released exactly
// once, counted by the fake). Every test also asserts that the fake saw no contract violation.
// Without the fake every test skips.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <set>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/backend.hpp"
#include "stitch/config.hpp"
#include "stitch/errors.hpp"
#include "stitch/kv_pool.hpp"
#include "stitch/sim_backend.hpp"
#include "support/backup_dir.hpp"
#include "support/cuda_driver.hpp"
#include "support/disk_cycle.hpp"
#include "support/file_fault_backend.hpp"

namespace stitch {
namespace {

using test::TestDriver;
constexpr std::size_t MiB = std::size_t{1} << 20;

#ifdef STITCH_FAKE_CUDA_PATH
// Before any test runs (and before the back end opens a driver): the fake, with two devices of
// 2 GiB, unless the environment names a driver already.
const bool kFakeNamed = [] {
  ::setenv("STITCH_CUDA_DRIVER", STITCH_FAKE_CUDA_PATH, 0);
  ::setenv("STITCH_FAKE_CUDA_DEVICES", "2", 0);
  ::setenv("STITCH_FAKE_CUDA_MEMORY_MB", "2048", 0);
  return true;
}();
#endif

const char* const kConfigs[] = {"", ",expandable_segments:True",
                                ",expandable_segments:True,stitching:True"};

class FakeCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    f_ = test::fake_driver();
    if (f_ == nullptr) {
      GTEST_SKIP() << "needs the strict fake CUDA driver (STITCH_CUDA_DRIVER="
                      "build/tests/libstitch_fake_cuda.so): " << test::test_driver().why;
    }
    f_->clear_faults();
    violations_ = f_->violations();
    for (int d = 0; d < 2; ++d) baseline_[d] = f_->usage(d);
  }
  void TearDown() override {
    if (f_ == nullptr) return;
    f_->clear_faults();
    EXPECT_EQ(f_->violations(), violations_) << "contract violation: " << f_->last_violation();
  }
  /// Everything the allocators of the test held is back (call once they are gone).
  void expect_nothing_held() {
    for (int d = 0; d < 2; ++d) {
      const stitch_fake_cuda_usage u = f_->usage(d), b = baseline_[d];
      EXPECT_EQ(u.used_bytes, b.used_bytes) << "device " << d;
      EXPECT_EQ(u.live_allocations, b.live_allocations) << "device " << d;
      EXPECT_EQ(u.live_handles, b.live_handles) << "device " << d;
      EXPECT_EQ(u.live_reservations, b.live_reservations) << "device " << d;
      EXPECT_EQ(u.live_mappings, b.live_mappings) << "device " << d;
      EXPECT_EQ(u.live_events, b.live_events) << "device " << d;
      EXPECT_EQ(u.live_host_allocations, b.live_host_allocations) << "device " << d;
      EXPECT_EQ(u.host_bytes, b.host_bytes) << "device " << d;
    }
  }
  static std::unique_ptr<Allocator> make(const std::string& conf) {
    return std::make_unique<Allocator>(Config::parse("backend:cuda" + conf));
  }
  static void fill(void* p, std::size_t n, unsigned seed) {
    auto* c = static_cast<unsigned char*>(p);
    for (std::size_t i = 0; i < n; i += 4096) c[i] = static_cast<unsigned char>(i / 4096 * 7 + seed);
    c[n - 1] = static_cast<unsigned char>(seed);
  }
  static bool intact(const void* p, std::size_t n, unsigned seed) {
    const auto* c = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; i += 4096)
      if (c[i] != static_cast<unsigned char>(i / 4096 * 7 + seed)) return false;
    return c[n - 1] == static_cast<unsigned char>(seed);
  }
  static CUcontext current() {
    CUcontext c = nullptr;
    test::test_driver().ctx_get_current(&c);
    return c;
  }

  const TestDriver* f_ = nullptr;
  unsigned long long violations_ = 0;
  stitch_fake_cuda_usage baseline_[2]{};
};

TEST_F(FakeCuda, CompactionMovesLiveDataThroughTheDriversCopies) {
  // A live 3 MiB block at the start of every 20 MiB coarse page, the rest of each page freed,
  // the device full: one request for every granule no live block touches is served by
  // compaction (the first page staged through host memory with cuMemcpyDtoH/HtoD, the others
  // copied with cuMemcpyDtoDAsync after one cuCtxSynchronize), every block's data at its address.
  const std::size_t granule = 2 * MiB, small = 3 * MiB, big = 17 * MiB;
  const auto before = [&](const char* ep) { return f_->calls(ep); };
  const unsigned long long dtod = before("cuMemcpyDtoDAsync"), dtoh = before("cuMemcpyDtoH"),
                           htod = before("cuMemcpyHtoD"), sync = before("cuCtxSynchronize");
  {
    auto a = make(",expandable_segments:True,stitching:True,stitch_compact:True");
    std::vector<std::pair<void*, std::size_t>> live;
    std::vector<void*> gaps;
    for (int i = 0; i < 1000; ++i) {
      void* p = nullptr;
      void* q = nullptr;
      try {
        p = a->allocate(small);
        live.emplace_back(p, small);
        q = a->allocate(big);
        gaps.push_back(q);
      } catch (const out_of_memory&) {
        break;
      }
    }
    ASSERT_GT(live.size(), 50u);
    for (;;) {  // the rest of the device, in granules: not a byte free
      try {
        live.emplace_back(a->allocate(granule), granule);
      } catch (const out_of_memory&) {
        break;
      }
    }
    for (void* q : gaps) a->deallocate(q);
    for (std::size_t i = 0; i < live.size(); ++i)
      fill(live[i].first, live[i].second, static_cast<unsigned>(i));
    std::set<std::uintptr_t> touched;
    for (const auto& [p, n] : live)
      for (auto g = reinterpret_cast<std::uintptr_t>(p) / granule;
           g <= (reinterpret_cast<std::uintptr_t>(p) + n - 1) / granule; ++g)
        touched.insert(g);
    const std::size_t total = a->backend().memory_info(0).total;
    const std::size_t want = (total / granule - touched.size()) * granule;
    void* p = nullptr;
    ASSERT_NO_THROW(p = a->allocate(want));
    fill(p, want, 77);
    EXPECT_TRUE(intact(p, want, 77));
    for (std::size_t i = 0; i < live.size(); ++i)
      EXPECT_TRUE(intact(live[i].first, live[i].second, static_cast<unsigned>(i))) << i;
    EXPECT_GT(a->stat(0, "num_compactions").value_or(0), 0);
    EXPECT_GE(a->stat(0, "num_staged_compactions").value_or(0), 1);
    a->validate();
    a->deallocate(p);
    for (const auto& [q, n] : live) a->deallocate(q);
  }
  EXPECT_GT(before("cuMemcpyDtoDAsync"), dtod);
  EXPECT_GT(before("cuMemcpyDtoH"), dtoh);
  EXPECT_GT(before("cuMemcpyHtoD"), htod);
  EXPECT_EQ(before("cuCtxSynchronize"), sync + 1) << "one device sync for the request";
  expect_nothing_held();
}

TEST_F(FakeCuda, TheAllocatorRunsOnTheFakeDriverInEveryMode) {
  for (const char* conf : kConfigs) {
    SCOPED_TRACE(std::string("backend:cuda") + conf);
    {
      auto a = make(conf);
      EXPECT_STREQ(a->backend().name(), "cuda");
      EXPECT_EQ(a->device_count(), 2) << "STITCH_FAKE_CUDA_DEVICES=2";
      void* stream = f_->make_stream(0);
      ASSERT_NE(stream, nullptr);
      // Data written through the pointers reads back, across many sizes and two streams.
      std::vector<std::pair<void*, std::size_t>> live;
      for (int i = 0; i < 40; ++i) {
        const std::size_t n = (i % 3 == 0) ? 512 + 97 * i : (1 + i % 7) * 3 * MiB + 4096 * i;
        void* p = a->allocate(n, i % 2 ? stream : nullptr);
        ASSERT_NE(p, nullptr);
        fill(p, n, static_cast<unsigned>(i));
        live.emplace_back(p, n);
      }
      for (std::size_t i = 0; i < live.size(); i += 2) a->deallocate(live[i].first);
      void* big = a->allocate(48 * MiB);  // may be served from holes (stitching) or fresh pages
      fill(big, 48 * MiB, 99);
      for (std::size_t i = 1; i < live.size(); i += 2)
        EXPECT_TRUE(intact(live[i].first, live[i].second, static_cast<unsigned>(i))) << i;
      EXPECT_TRUE(intact(big, 48 * MiB, 99));
      // Bad input is refused and changes nothing else.
      EXPECT_THROW(a->deallocate(static_cast<char*>(big) + 512), invalid_argument);
      int local = 0;
      EXPECT_THROW(a->deallocate(&local), invalid_argument);
      a->validate();
      // Out of memory: reported, and recovered from.
      EXPECT_THROW((void)a->allocate(std::size_t{8} << 30), out_of_memory);
      void* after = a->allocate(8 * MiB);
      fill(after, 8 * MiB, 5);
      EXPECT_TRUE(intact(after, 8 * MiB, 5));
      a->deallocate(after);
      a->deallocate(big);
      for (std::size_t i = 1; i < live.size(); i += 2) a->deallocate(live[i].first);
      a->validate();
      a->empty_cache();
      f_->destroy_stream(0, stream);
    }
    expect_nothing_held();
  }
}

TEST_F(FakeCuda, NoContextOnADeviceTheProgramDidNotUse) {
  ASSERT_EQ(f_->contexts_activated(1), 0) << "each test runs in its own process";
  {
    // A memory fraction needs each device's total: cuDeviceTotalMem, no context.
    auto a = make(",expandable_segments:True,per_process_memory_fraction:0.5");
    std::thread fresh([&] {  // a thread that never chose a device
      void* p = a->allocate(30 * MiB, nullptr, 0);
      a->deallocate(p);
      EXPECT_EQ(current(), nullptr) << "the thread is left without a context, as it was";
    });
    fresh.join();
    a->empty_cache();
    (void)a->stats(1);
    (void)a->memory_summary(1);
    (void)a->snapshot();
  }
  EXPECT_EQ(f_->contexts_activated(0), 1);
  EXPECT_EQ(f_->contexts_activated(1), 0) << "device 1 was never used";
  expect_nothing_held();
}

TEST_F(FakeCuda, CallsFromAThreadOnAnotherDeviceRestoreItsContext) {
  auto a = make(",expandable_segments:True");
  CUcontext one = f_->context(1);
  ASSERT_NE(one, nullptr);
  std::thread t([&] {
    ASSERT_EQ(f_->ctx_set_current(one), CUDA_SUCCESS);
    void* p = a->allocate(25 * MiB, nullptr, 0);  // device 0, from a thread on device 1
    fill(p, 25 * MiB, 3);
    EXPECT_EQ(current(), one);
    void* q = a->allocate(1 * MiB, nullptr, 1);
    EXPECT_EQ(current(), one);
    a->record_stream(p, nullptr);
    a->deallocate(p);
    a->deallocate(q);
    a->empty_cache();
    EXPECT_EQ(current(), one) << "the caller's context is current again after every call";
    f_->ctx_set_current(nullptr);
  });
  t.join();
  a.reset();
  expect_nothing_held();
}

TEST_F(FakeCuda, OutOfMemoryInsideCuMemMapTakesTheOomPath) {
  {
    auto a = make(",expandable_segments:True");
    // Every map runs out of memory: an out_of_memory, not a backend error; nothing left mapped.
    for (unsigned long long n = 1; n <= 64; ++n) f_->fail("cuMemMap", n, CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT_THROW((void)a->allocate(50 * MiB), out_of_memory);
    a->validate();
    EXPECT_EQ(a->stat(0, "reserved_bytes.all.current"), 0);
    f_->clear_faults();
    // Once: the ladder's retry after freeing the cache serves it.
    f_->fail("cuMemMap", 2, CUDA_ERROR_OUT_OF_MEMORY);
    void* p = a->allocate(50 * MiB);
    fill(p, 50 * MiB, 1);
    a->deallocate(p);
    // The same for cuMemSetAccess.
    a->empty_cache();
    f_->fail("cuMemSetAccess", 1, CUDA_ERROR_OUT_OF_MEMORY);
    void* q = a->allocate(50 * MiB);
    a->deallocate(q);
    a->validate();
  }
  expect_nothing_held();
}

TEST_F(FakeCuda, ARunOfPagesGetsOneCuMemSetAccess) {
  for (const char* conf : {",expandable_segments:True", ",expandable_segments:True,stitching:True"}) {
    SCOPED_TRACE(conf);
    auto a = make(conf);
    const auto maps = f_->calls("cuMemMap");
    const auto grants = f_->set_access_calls(0);
    void* p = a->allocate(60 * MiB);  // three 20 MiB pages, one grow
    EXPECT_EQ(f_->calls("cuMemMap") - maps, 3u);
    EXPECT_EQ(f_->set_access_calls(0) - grants, 1u);
    a->deallocate(p);
  }
  {
    // Fine pages (stitching short of memory): one grant for a run of 2 MiB pages too.
    auto a = make(",expandable_segments:True,stitching:True,stitch_fine_above:0");
    const auto maps = f_->calls("cuMemMap");
    const auto grants = f_->set_access_calls(0);
    void* p = a->allocate(60 * MiB);
    EXPECT_EQ(f_->calls("cuMemMap") - maps, 30u);
    EXPECT_EQ(f_->set_access_calls(0) - grants, 1u);
    a->deallocate(p);
  }
  expect_nothing_held();
}

TEST_F(FakeCuda, PeerAccessGrantsTheOtherDevice) {
  {
    auto a = make(",expandable_segments:True,peer_access:True");
    void* p = a->allocate(40 * MiB, nullptr, 1);
    fill(p, 40 * MiB, 8);
    EXPECT_TRUE(intact(p, 40 * MiB, 8));
    a->deallocate(p);
    a->empty_cache();
  }
  expect_nothing_held();
}

TEST_F(FakeCuda, AStrayMappingBlocksOnlyItsOwnAddresses) {
  {
    auto a = make(",expandable_segments:True");
    // The second map of a run fails, and so does the unmap that undoes the first: that run stays
    // mapped (a stray) until it can be unmapped.
    f_->fail("cuMemMap", 2, CUDA_ERROR_UNKNOWN);
    f_->fail("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN);
    EXPECT_THROW((void)a->allocate(50 * MiB), backend_error);
    a->validate();
    // While it still cannot be unmapped, grows elsewhere (another stream's range) still work.
    void* stream = f_->make_stream(0);
    f_->fail("cuMemUnmap", 1, CUDA_ERROR_UNKNOWN);
    void* elsewhere = a->allocate(50 * MiB, stream);
    fill(elsewhere, 50 * MiB, 4);
    // Once it can, the range it blocked grows again.
    void* p = a->allocate(50 * MiB);
    fill(p, 50 * MiB, 2);
    EXPECT_TRUE(intact(elsewhere, 50 * MiB, 4));
    a->deallocate(p);
    a->deallocate(elsewhere);
    a->empty_cache();
    f_->destroy_stream(0, stream);
  }
  expect_nothing_held();
}

TEST_F(FakeCuda, AHeldStreamKeepsItsBlockFromReuseUntilItsWorkCompletes) {
  {
    auto a = make(",expandable_segments:True");
    void* s1 = f_->make_stream(0);
    void* s2 = f_->make_stream(0);
    void* p = a->allocate(4 * MiB, s1);
    a->record_stream(p, s2);
    ASSERT_EQ(f_->hold_stream(static_cast<CUstream_st*>(s2)), 0);
    a->deallocate(p);  // s2's work on it is still running
    void* q = a->allocate(4 * MiB, s1);
    EXPECT_NE(q, p) << "reused while another stream may still use it";
    ASSERT_EQ(f_->release_stream(static_cast<CUstream_st*>(s2)), 0);
    void* r = a->allocate(4 * MiB, s1);
    EXPECT_EQ(r, p) << "reused once the other stream's work completed";
    a->deallocate(q);
    a->deallocate(r);
    a->empty_cache();
    f_->destroy_stream(0, s1);
    f_->destroy_stream(0, s2);
  }
  expect_nothing_held();
}

// ---- the fault sweep ------------------------------------------------------------------------

/// A workload that reaches every entry point of the back end: plain or mapped memory, two
/// streams, cross-stream frees, an OOM and its ladder, empty_cache.
void workload(Allocator& a, void* stream, int& backend_errors) {
  std::vector<void*> live;
  auto step = [&](auto&& f) {
    try {
      f();
    } catch (const backend_error&) {
      ++backend_errors;
    } catch (const out_of_memory&) {
    }
  };
  for (int i = 0; i < 12; ++i) {
    step([&] {
      void* p = a.allocate((1 + i % 5) * 5 * MiB + 512 * i, i % 2 ? stream : nullptr);
      live.push_back(p);
    });
  }
  for (std::size_t i = 0; i < live.size(); i += 2) {
    step([&] { a.record_stream(live[i], stream); });
    step([&] {
      a.deallocate(live[i]);  // a free that throws leaves the pointer allocated: freed below
      live[i] = nullptr;
    });
  }
  step([&] { live.push_back(a.allocate(70 * MiB)); });
  step([&] { (void)a.allocate(std::size_t{16} << 30); });  // OOM: the ladder runs
  for (void* p : live)
    if (p != nullptr) step([&] { a.deallocate(p); });
  for (void* p : live)  // once more for a free the fault made fail
    if (p != nullptr && a.find(p)) step([&] { a.deallocate(p); });
  step([&] { a.empty_cache(); });
}

// A CUDA graph captured in global mode, as PyTorch's CUDAGraph does it, with the allocator told
// through the private-pool route: its memory comes in relaxed mode, nothing is queried, waited
// for or freed during the capture, and the capture stays valid. The fake invalidates a capture
// on any of those (rule 12). In every mode, with a cross-stream free during the capture.
TEST_F(FakeCuda, AGraphCaptureThroughAPrivatePoolStaysValid) {
  const TestDriver& t = test::test_driver();
  ASSERT_NE(t.stream_begin_capture, nullptr);
  for (const char* conf : kConfigs) {
    SCOPED_TRACE(std::string("backend:cuda") + conf);
    {
      auto a = make(conf);
      void* capturing = f_->make_stream(0);
      void* side = f_->make_stream(0);
      ASSERT_NE(capturing, nullptr);
      CUcontext previous = current();
      t.ctx_set_current(f_->context(0));
      // An event outstanding from before the capture (a block used on a held stream).
      f_->hold_stream(static_cast<CUstream_st*>(side));
      void* before = a->allocate(2 * MiB, capturing);
      a->record_stream(before, side);
      a->deallocate(before, capturing);
      const unsigned long long queries = f_->calls("cuEventQuery");
      ASSERT_EQ(t.stream_begin_capture(static_cast<CUstream>(capturing), CU_STREAM_CAPTURE_MODE_GLOBAL),
                CUDA_SUCCESS);
      const PoolId pool{1, 1};
      a->begin_allocate_to_pool(0, pool, [capturing](stream_t s) { return s == capturing; });
      std::vector<void*> blocks;
      for (std::size_t n : {1 * MiB, 5 * MiB, 30 * MiB, 700 * std::size_t{1} << 10})
        blocks.push_back(a->allocate(n, capturing));  // new segments of the pool: cuMemAlloc
      a->record_stream(blocks[1], side);
      a->deallocate(blocks[1], capturing);  // cross-stream: its event waits for the route's end
      a->deallocate(blocks[0], capturing);
      blocks[0] = a->allocate(1 * MiB, capturing);  // reused within the capture
      a->empty_cache();                             // frees nothing during the capture
      EXPECT_THROW((void)a->allocate(std::size_t{64} << 30, capturing), out_of_memory);
      a->end_allocate_to_pool(0, pool);
      CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
      ASSERT_EQ(t.stream_is_capturing(static_cast<CUstream>(capturing), &status), CUDA_SUCCESS);
      EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_ACTIVE) << "the allocator invalidated the capture";
      EXPECT_EQ(f_->calls("cuEventQuery"), queries) << "an event was queried during the capture";
      void* graph = nullptr;
      EXPECT_EQ(t.stream_end_capture(static_cast<CUstream>(capturing), &graph), CUDA_SUCCESS);
      t.ctx_set_current(previous);
      f_->release_stream(static_cast<CUstream_st*>(side));
      a->validate();
      for (void* p : {blocks[0], blocks[2], blocks[3]}) a->deallocate(p, capturing);
      a->release_pool(0, pool);
      a->empty_cache();
      a->validate();
      EXPECT_EQ(a->stats(0).reserved_bytes[kAll].current, 0);
      f_->destroy_stream(0, capturing);
      f_->destroy_stream(0, side);
    }
  }
  expect_nothing_held();
}

TEST_F(FakeCuda, SleepAndWakeRunOnTheDriverInEveryMode) {
  // Sleep and wake through the driver's calls (cuCtxSynchronize, cuMemHostAlloc,
  // cuMemcpyDtoHAsync, cuMemUnmap, cuMemRelease; cuMemCreate, cuMemMap, cuMemSetAccess,
  // cuMemcpyHtoDAsync, cuMemFreeHost), each mode: the pages really go back to the device, the
  // backed-up data is back at its address, and a fault at each of those calls leaves every block
  // awake with its data or asleep with its backup.
  for (const char* conf : kConfigs) {
    SCOPED_TRACE(conf);
    {
      auto a = make(conf);
      void* w = nullptr;
      void* k = nullptr;
      {
        Allocator::Region r(*a, "weights", /*backup=*/true);
        w = a->allocate(24 * MiB);
      }
      {
        Allocator::Region r(*a, "kv");
        k = a->allocate(40 * MiB);
      }
      fill(w, 24 * MiB, 5);
      const std::size_t used = f_->usage(0).used_bytes;
      const auto before = [&](const char* ep) { return f_->calls(ep); };
      const unsigned long long syncs = before("cuCtxSynchronize"), dtoh = before("cuMemcpyDtoHAsync");
      a->sleep();
      a->validate();
      EXPECT_GE(before("cuCtxSynchronize"), syncs + 2) << "the device and its peer";
      EXPECT_GT(before("cuMemcpyDtoHAsync"), dtoh);
      EXPECT_LE(f_->usage(0).used_bytes + 64 * MiB, used) << "the pages went back";
      EXPECT_EQ(f_->usage(0).live_host_allocations, baseline_[0].live_host_allocations + 1);
      a->wake();
      a->validate();
      EXPECT_TRUE(intact(w, 24 * MiB, 5));
      EXPECT_EQ(f_->usage(0).live_host_allocations, baseline_[0].live_host_allocations);
      // A fault at every call of the path, one at a time.
      for (const char* entry : {"cuCtxSynchronize", "cuMemHostAlloc", "cuMemcpyDtoHAsync",
                                "cuStreamSynchronize", "cuMemUnmap", "cuMemRelease"}) {
        SCOPED_TRACE(entry);
        fill(w, 24 * MiB, 6);
        ASSERT_EQ(f_->fail(entry, 1, CUDA_ERROR_UNKNOWN), 0);
        bool asleep = false;
        try {
          a->sleep();
          asleep = true;
        } catch (const error& e) {
          asleep = std::string(e.what()).find("is asleep") != std::string::npos;
        }
        f_->clear_faults();
        a->validate();
        if (asleep) a->wake();
        a->validate();
        EXPECT_TRUE(intact(w, 24 * MiB, 6));
      }
      a->sleep();
      for (const char* entry : {"cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemcpyHtoDAsync"}) {
        SCOPED_TRACE(entry);
        ASSERT_EQ(f_->fail(entry, 1, CUDA_ERROR_UNKNOWN), 0);
        EXPECT_THROW(a->wake(), backend_error);
        f_->clear_faults();
        a->validate();
        Allocator::Region r(*a, "weights");
        EXPECT_THROW((void)a->allocate(MiB), error) << "still asleep";
      }
      a->wake();
      a->validate();
      EXPECT_TRUE(intact(w, 24 * MiB, 6));
      a->deallocate(w);
      a->deallocate(k);
      a->empty_cache();
    }
    expect_nothing_held();
  }
}

TEST_F(FakeCuda, TheDiskTierRunsOnTheDriverAndAFaultAtAnyCallLosesNoByteAndLeavesNoFile) {
  // Sleep's disk tier (backup_dir) on backend:cuda: the staging buffers and host pieces from
  // cuMemHostAlloc, the chunks through cuMemcpyDtoHAsync / cuMemcpyHtoDAsync and
  // cuStreamSynchronize, the files through the simulator's file calls (FilesThroughSim), so that
  // short writes, ENOSPC and EIO reach it too. A fault at every call of each kind, one at a time
  // (support/disk_cycle.hpp): every byte intact, no file left, no pinned memory kept.
  for (const char* conf : {"", ",expandable_segments:True,stitching:True"}) {
    SCOPED_TRACE(conf);
    test::BackupDir dir;
    test::DiskSweepCounts counts;
    int fired = 0;
    std::shared_ptr<test::FilesThroughSim> backend;
    std::unique_ptr<Allocator> a;
    auto fresh = [&] {
      a.reset();
      backend = std::make_shared<test::FilesThroughSim>(make_backend(Config::parse(std::string("backend:cuda") + conf)));
      a = std::make_unique<Allocator>(
          Config::parse(std::string("backend:cuda") + conf + ",backup_host_mb:1,backup_dir:" + dir.path()), backend);
    };
    auto nothing_held = [&](const std::string& where) {
      EXPECT_EQ(dir.entries(), 0u) << where;
      EXPECT_EQ(dir.open_files(), 0u) << where;
      EXPECT_EQ(backend->files().usage(0).files, 0u) << where;
      EXPECT_EQ(f_->usage(0).live_host_allocations, baseline_[0].live_host_allocations) << where;
      EXPECT_EQ(*a->stat(0, "backup_file_bytes.current"), 0) << where;
    };
    auto clear = [&] {
      f_->clear_faults();
      backend->files().clear_faults();
    };
    // Once without a fault: the files are really used.
    fresh();
    test::disk_cycle(*a, clear, nothing_held, counts, "no fault");
    EXPECT_GT(backend->files().call_count(SimCall::write_file), 1u);
    EXPECT_GT(backend->files().call_count(SimCall::read_file), 1u);
    EXPECT_GT(f_->calls("cuMemcpyDtoHAsync"), 0u);
    for (const auto& [entry, result] : {std::pair{"cuMemHostAlloc", CUDA_ERROR_OUT_OF_MEMORY},
                                        std::pair{"cuMemHostAlloc", CUDA_ERROR_UNKNOWN},
                                        std::pair{"cuMemcpyDtoHAsync", CUDA_ERROR_UNKNOWN},
                                        std::pair{"cuStreamSynchronize", CUDA_ERROR_UNKNOWN},
                                        std::pair{"cuMemcpyHtoDAsync", CUDA_ERROR_UNKNOWN}}) {
      for (unsigned long long nth = 1; nth < 100; ++nth) {
        const std::string what = std::string(entry) + " #" + std::to_string(nth);
        SCOPED_TRACE(what);
        fresh();
        const unsigned long long before = f_->calls(entry);
        ASSERT_EQ(f_->fail(entry, nth, result), 0);
        test::disk_cycle(*a, clear, nothing_held, counts, what);
        if (f_->calls(entry) - before < nth) break;  // the cycle made fewer calls: it never fired
        ++fired;
        if (HasFatalFailure()) return;
      }
    }
    const std::pair<SimCall, SimFault> file_faults[] = {
        {SimCall::open_file, SimFault::no_space}, {SimCall::write_file, SimFault::short_io},
        {SimCall::write_file, SimFault::no_space}, {SimCall::write_file, SimFault::io_error},
        {SimCall::read_file, SimFault::short_io}, {SimCall::read_file, SimFault::io_error}};
    for (const auto& [call, fault] : file_faults) {
      for (std::uint64_t nth = 1; nth < 100; ++nth) {
        const std::string what = std::string(to_string(call)) + " #" + std::to_string(nth);
        SCOPED_TRACE(what);
        fresh();
        const std::uint64_t before = backend->files().faults_fired();
        backend->files().inject_fault(call, nth, fault);
        test::disk_cycle(*a, clear, nothing_held, counts, what);
        if (backend->files().faults_fired() == before) break;
        ++fired;
        if (HasFatalFailure()) return;
      }
    }
    a.reset();
    std::printf("disk tier fault sweep (backend:cuda on the fake driver%s): %d runs, %d with a fault fired, %d sleeps "
                "and %d wakes failed (%d by a backup's read), every byte intact and no file left after each\n",
                conf, counts.runs, fired, counts.sleeps_failed, counts.wakes_failed, counts.reads_failed);
    EXPECT_GT(counts.sleeps_failed, 10);
    EXPECT_GT(counts.reads_failed, 3);
    expect_nothing_held();
  }
}

TEST_F(FakeCuda, PinnedHostMemoryRunsOutAsNullptrAndFailuresNameTheCall) {
  {
    auto b = make_backend(Config::parse("backend:cuda"));
    auto throws_naming = [](const char* call, auto&& fn) {
      try {
        fn();
        ADD_FAILURE() << call << ": no backend_error";
      } catch (const backend_error& e) {
        EXPECT_NE(std::string(e.what()).find(call), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("on device 1"), std::string::npos) << e.what();
      }
    };
    // Out of memory is an answer (nullptr); any other failure throws, naming the call.
    ASSERT_EQ(f_->fail("cuMemHostAlloc", 1, CUDA_ERROR_OUT_OF_MEMORY), 0);
    EXPECT_EQ(b->allocate_host(1, 4096), nullptr);
    ASSERT_EQ(f_->fail("cuMemHostAlloc", 1, CUDA_ERROR_UNKNOWN), 0);
    throws_naming("cuMemHostAlloc(4096 bytes)", [&] { (void)b->allocate_host(1, 4096); });
    throws_naming("zero-byte request", [&] { (void)b->allocate_host(1, 0); });
    EXPECT_EQ(f_->usage(1).live_host_allocations, baseline_[1].live_host_allocations);

    auto* host = static_cast<unsigned char*>(b->allocate_host(1, 4096));
    ASSERT_NE(host, nullptr);
    EXPECT_EQ(current(), nullptr) << "the caller's (absent) context is restored";
    EXPECT_EQ(f_->usage(1).live_host_allocations, baseline_[1].live_host_allocations + 1);
    EXPECT_EQ(f_->usage(1).host_bytes, baseline_[1].host_bytes + 4096);
    EXPECT_EQ(f_->usage(0).live_host_allocations, baseline_[0].live_host_allocations);
    auto* dev = static_cast<unsigned char*>(b->allocate(1, 4096));
    ASSERT_NE(dev, nullptr);
    std::memset(dev, 5, 4096);  // the fake's device memory is host memory
    void* stream = f_->make_stream(1);
    ASSERT_NE(stream, nullptr);
    b->copy_to_host_async(1, host, dev, 4096, stream);
    b->synchronize_stream(1, stream);
    EXPECT_EQ(host[4095], 5);
    host[7] = 9;
    b->copy_from_host_async(1, dev, host, 8, nullptr);  // the legacy stream
    b->synchronize_stream(1, nullptr);
    EXPECT_EQ(dev[7], 9);

    ASSERT_EQ(f_->fail("cuMemcpyDtoHAsync", 1, CUDA_ERROR_UNKNOWN), 0);
    throws_naming("cuMemcpyDtoHAsync(", [&] { b->copy_to_host_async(1, host, dev, 4096, stream); });
    ASSERT_EQ(f_->fail("cuMemcpyHtoDAsync", 1, CUDA_ERROR_UNKNOWN), 0);
    throws_naming("cuMemcpyHtoDAsync(", [&] { b->copy_from_host_async(1, dev, host, 4096, stream); });
    ASSERT_EQ(f_->fail("cuMemFreeHost", 1, CUDA_ERROR_UNKNOWN), 0);
    throws_naming("cuMemFreeHost(", [&] { b->deallocate_host(1, host, 4096); });
    EXPECT_EQ(f_->usage(1).live_host_allocations, baseline_[1].live_host_allocations + 1)
        << "a failed free keeps the memory";
    b->deallocate_host(1, host, 4096);
    b->deallocate_host(1, nullptr, 0);  // nothing to free
    b->deallocate(1, dev, 4096);
    f_->destroy_stream(1, stream);
    EXPECT_EQ(current(), nullptr);
  }
  expect_nothing_held();
}

TEST_F(FakeCuda, KvSpillAndUnspillFailCleanlyAtEveryCallAndReleaseEachHandleOnce) {
  // A spillable KV pool's pages to host pages (CU_MEM_LOCATION_TYPE_HOST_NUMA) and back, a fault
  // at every position of every entry point the moves use, out of memory and other errors: every
  // byte at its address, the statistics exact, and every handle the driver made released exactly
  // once (the fake counts creates and releases; a second release would be a rule 8 violation).
  ASSERT_NE(f_->handle_counts, nullptr);
  const char* const entry_points[] = {"cuMemCreate", "cuMemAddressReserve", "cuMemMap", "cuMemSetAccess",
                                      "cuMemcpyDtoDAsync", "cuStreamSynchronize", "cuMemUnmap", "cuMemRelease",
                                      "cuMemAddressFree", "cuCtxSynchronize"};
  const CUresult results[] = {CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_UNKNOWN};
  constexpr std::size_t kBlock = 3 * MiB;  // two blocks over three 2 MiB pages, in two buffers
  auto fill = [](KvPool& pool, unsigned seed) {
    for (int b = 0; b < 2; ++b) FakeCuda::fill(pool.buffer(b), 2 * kBlock, seed + static_cast<unsigned>(b));
  };
  auto intact = [](KvPool& pool, unsigned seed) {
    for (int b = 0; b < 2; ++b)
      if (!FakeCuda::intact(pool.buffer(b), 2 * kBlock, seed + static_cast<unsigned>(b))) return false;
    return true;
  };
  std::uint64_t fired = 0;
  for (const char* entry : entry_points) {
    for (CUresult result : results) {
      for (unsigned long long pos = 1; pos <= 200; ++pos) {
        SCOPED_TRACE(std::string(entry) + " #" + std::to_string(pos) + " -> " + std::to_string(static_cast<int>(result)));
        unsigned long long created0 = 0, released0 = 0, created = 0, released = 0;
        f_->handle_counts(&created0, &released0);
        const auto before = f_->calls(entry);
        {
          auto a = make(",expandable_segments:True");
          KvPool pool(*a, 0, 2, kBlock, 4, "kv-s", Allocator::kRegionSpill);
          std::vector<std::int64_t> ids = pool.alloc(2);
          fill(pool, 40);
          f_->fail(entry, pos, result);
          bool spilled = false;
          try {
            (void)a->spill(0, "kv-s");
            spilled = true;
            a->unspill(0, "kv-s");
          } catch (const error&) {
          } catch (const out_of_memory&) {
          }
          f_->clear_faults();
          EXPECT_NO_THROW(a->validate());
          EXPECT_TRUE(intact(pool, 40));
          const std::int64_t kv = *a->stat(0, "kv_bytes.current"), host = *a->stat(0, "spilled_bytes.current");
          EXPECT_EQ(kv + host, static_cast<std::int64_t>(2 * 3 * 2 * MiB)) << "each page counted once, where it is";
          EXPECT_EQ(*a->stat(0, "reserved_bytes.all.current"), kv) << "the pool is all the device holds";
          if (!spilled) EXPECT_EQ(host, 0) << "a spill that failed moved nothing";
          f_->handle_counts(&created, &released);
          EXPECT_EQ(created - released - (created0 - released0), f_->usage(0).live_handles - baseline_[0].live_handles)
              << "a handle is held that the driver counts released, or the other way round";
          a->unspill(0);
          EXPECT_TRUE(intact(pool, 40));
          pool.free(ids.data(), ids.size());
          pool.destroy();
          a->empty_cache();
        }
        f_->handle_counts(&created, &released);
        EXPECT_EQ(created - created0, released - released0) << "every handle made is released, once";
        const bool hit = f_->calls(entry) - before >= pos;
        expect_nothing_held();
        if (HasFailure()) return;
        if (!hit) break;
        ++fired;
      }
    }
  }
  EXPECT_GT(fired, 40u) << "the faults must hit";
  std::printf("KV spill and unspill on the fake driver: %llu faults fired\n", static_cast<unsigned long long>(fired));
}

TEST_F(FakeCuda, EveryEntryPointFailsCleanlyAtEveryPosition) {
  const char* const entry_points[] = {
      "cuMemAlloc",  "cuMemFree",   "cuMemGetInfo",   "cuMemAddressReserve", "cuMemAddressFree",
      "cuMemCreate", "cuMemRelease", "cuMemMap",      "cuMemSetAccess",      "cuMemUnmap",
      "cuEventCreate", "cuEventDestroy", "cuEventRecord", "cuEventQuery", "cuEventSynchronize",
      "cuStreamSynchronize", "cuCtxSetCurrent"};
  const CUresult results[] = {CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_UNKNOWN};
  void* stream = f_->make_stream(0);
  ASSERT_NE(stream, nullptr);
  std::uint64_t fired = 0;
  for (const char* conf : kConfigs) {
    for (const char* entry : entry_points) {
      for (CUresult result : results) {
        for (unsigned long long pos = 1; pos <= 300; ++pos) {
          SCOPED_TRACE(std::string(conf) + " " + entry + " #" + std::to_string(pos) + " -> " +
                       std::to_string(static_cast<int>(result)));
          const auto before = f_->calls(entry);
          int backend_errors = 0;
          {
            auto a = make(conf);
            f_->fail(entry, pos, result);
            workload(*a, stream, backend_errors);
            f_->clear_faults();
            EXPECT_NO_THROW(a->validate());
            try {
              a->empty_cache();  // whatever a failure left behind goes back now
            } catch (const backend_error&) {
              ADD_FAILURE() << "empty_cache failed after the fault";
            }
          }
          const bool hit = f_->calls(entry) - before >= pos;
          expect_nothing_held();
          if (!hit) break;  // the workload makes fewer calls of this entry point
          ++fired;
          EXPECT_LE(backend_errors, 1) << "only the failing call reports an error";
          if (HasFailure()) return;
        }
      }
    }
  }
  f_->destroy_stream(0, stream);
  EXPECT_GT(fired, 200u) << "the faults must hit";
}

}  // namespace
}  // namespace stitch
