// The conformance suite every stitch::Backend must pass, run against each backend that ships
// (the simulator, and CUDA over a GPU's driver or the strict fake driver of tests/fake_cuda/). It
// talks only to stitch::Backend.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/backend.hpp"
#include "stitch/config.hpp"
#include "stitch/errors.hpp"
#include "stitch/sim_backend.hpp"
#include "support/cuda_driver.hpp"

namespace stitch {
namespace {

/// What the fake driver held when the cuda instance's backend was made (its leak check).
stitch_fake_cuda_usage& cuda_baseline() {
  static stitch_fake_cuda_usage usage{};
  return usage;
}

/// How to obtain and drive one backend in the suite.
struct BackendFactory {
  std::string name;
  /// Creates the backend; throwing skips the instance (with the exception's message).
  std::function<std::shared_ptr<Backend>()> make;
  /// A stream to record on, and its disposal.
  std::function<stream_t()> make_stream;
  std::function<void(stream_t)> destroy_stream;
  /// Copies `n` bytes between host and device memory (either direction). Returns false when the
  /// test cannot reach the backend's memory; the data checks are then skipped.
  std::function<bool(void* dst, const void* src, std::size_t n)> copy;
  /// Optional: checks after each test that the backend holds nothing any more (leak check).
  std::function<void(Backend&)> expect_clean;
};

void PrintTo(const BackendFactory& factory, std::ostream* os) { *os << factory.name; }

BackendFactory sim_factory() {
  BackendFactory f;
  f.name = "sim";
  f.make = [] {
    SimBackend::Options options;
    options.capacity = std::size_t{1} << 30;
    return std::make_shared<SimBackend>(options);
  };
  // Simulated streams are opaque: any fresh non-null address will do.
  f.make_stream = [] { return static_cast<stream_t>(new char); };
  f.destroy_stream = [](stream_t s) { delete static_cast<char*>(s); };
  f.copy = [](void* dst, const void* src, std::size_t n) {
    std::memcpy(dst, src, n);
    return true;
  };
  f.expect_clean = [](Backend& backend) {
    const SimUsage u = dynamic_cast<SimBackend&>(backend).usage(0);
    EXPECT_EQ(u.used, 0u);
    EXPECT_EQ(u.allocations, 0u);
    EXPECT_EQ(u.physical_handles, 0u);
    EXPECT_EQ(u.reservations, 0u);
    EXPECT_EQ(u.mappings, 0u);
    EXPECT_EQ(u.events, 0u);
    EXPECT_EQ(u.host_allocations, 0u);
    EXPECT_EQ(u.host_bytes, 0u);
  };
  return f;
}

BackendFactory cuda_factory() {
  // backend:cuda over whatever driver it opens: a GPU's, or the strict fake of
  // tests/fake_cuda/ (STITCH_CUDA_DRIVER), whose memory is host memory. Streams come from the
  // driver itself (tests/support/cuda_driver.hpp).
  BackendFactory f;
  f.name = "cuda";
  f.make = [] {
    auto backend = make_backend(Config::parse("backend:cuda"));
    if (const test::TestDriver* fake = test::fake_driver()) cuda_baseline() = fake->usage(0);
    return backend;
  };
  f.make_stream = [] {
    const test::TestDriver& d = test::test_driver();
    return d.loaded ? static_cast<stream_t>(d.make_stream(0)) : stream_t{nullptr};
  };
  f.destroy_stream = [](stream_t s) {
    if (s != nullptr) test::test_driver().destroy_stream(0, s);
  };
  f.copy = [](void* dst, const void* src, std::size_t n) {
    const test::TestDriver& d = test::test_driver();
    if (d.fake) {
      std::memcpy(dst, src, n);  // the fake's device memory is host memory
      return true;
    }
    if (d.memcpy == nullptr) return false;
    EXPECT_EQ(d.memcpy(reinterpret_cast<CUdeviceptr>(dst), reinterpret_cast<CUdeviceptr>(src), n),
              CUDA_SUCCESS) << "cuMemcpy failed";
    return true;
  };
  f.expect_clean = [](Backend&) {
    const test::TestDriver* fake = test::fake_driver();
    if (fake == nullptr) return;
    const stitch_fake_cuda_usage u = fake->usage(0), b = cuda_baseline();
    EXPECT_EQ(u.used_bytes, b.used_bytes);
    EXPECT_EQ(u.live_allocations, b.live_allocations);
    EXPECT_EQ(u.live_handles, b.live_handles);
    EXPECT_EQ(u.live_reservations, b.live_reservations);
    EXPECT_EQ(u.live_mappings, b.live_mappings);
    EXPECT_EQ(u.live_events, b.live_events);
    EXPECT_EQ(u.live_host_allocations, b.live_host_allocations);
    EXPECT_EQ(u.host_bytes, b.host_bytes);
    EXPECT_EQ(fake->violations(), 0u) << "the fake driver saw a contract violation: "
                                      << fake->last_violation();
  };
  return f;
}

class BackendConformance : public ::testing::TestWithParam<BackendFactory> {
 protected:
  void SetUp() override {
    try {
      backend_ = GetParam().make();
    } catch (const std::exception& e) {
      GTEST_SKIP() << GetParam().name << " backend unavailable: " << e.what();
    }
    ASSERT_NE(backend_, nullptr);
    ASSERT_GE(backend_->device_count(), 1);
  }

  void TearDown() override {
    if (backend_ != nullptr && GetParam().expect_clean) GetParam().expect_clean(*backend_);
  }

  Backend& b() { return *backend_; }

  /// Writes a pattern (seeded by `seed`) to `n` bytes of device memory at `dst`.
  /// Returns false when the memory cannot be reached from the test.
  bool write(void* dst, std::size_t n, unsigned seed) {
    std::vector<unsigned char> host(n);
    for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<unsigned char>(i * 31 + seed);
    return GetParam().copy(dst, host.data(), n);
  }

  /// Checks that `n` bytes at `src` hold the pattern of `seed`.
  void expect_pattern(const void* src, std::size_t n, unsigned seed) {
    std::vector<unsigned char> host(n);
    if (!GetParam().copy(host.data(), src, n)) return;
    for (std::size_t i = 0; i < n; ++i) {
      if (host[i] != static_cast<unsigned char>(i * 31 + seed)) {
        ADD_FAILURE() << "byte " << i << " of " << src << " differs";
        return;
      }
    }
  }

  std::shared_ptr<Backend> backend_;
};

TEST_P(BackendConformance, DescribesItself) {
  EXPECT_NE(std::string(b().name()), "");
  const MemoryInfo info = b().memory_info(0);
  EXPECT_GT(info.total, 0u);
  EXPECT_LE(info.free, info.total);
  const std::size_t g = b().granularity(0);
  EXPECT_GT(g, 0u);
  EXPECT_EQ(g & (g - 1), 0u) << "granularity " << g << " is not a power of two";
}

TEST_P(BackendConformance, AllocateWriteReadDeallocate) {
  const std::vector<std::size_t> sizes = {1, 512, 4096 + 3, std::size_t{1} << 20,
                                          (std::size_t{3} << 20) + 5};
  std::vector<void*> ptrs;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    void* p = b().allocate(0, sizes[i]);
    ASSERT_NE(p, nullptr) << sizes[i] << " bytes";
    ptrs.push_back(p);
    if (!write(p, sizes[i], static_cast<unsigned>(i))) break;
  }
  for (std::size_t i = 0; i < ptrs.size(); ++i) {
    expect_pattern(ptrs[i], sizes[i], static_cast<unsigned>(i));
    b().deallocate(0, ptrs[i], sizes[i]);
  }
}

TEST_P(BackendConformance, AllocationsAre512ByteAligned) {
  std::vector<std::pair<void*, std::size_t>> live;
  for (std::size_t bytes : {1, 3, 511, 513, 1000, 4097, 70000}) {
    void* p = b().allocate(0, bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 512, 0u) << bytes << " bytes at " << p;
    live.emplace_back(p, bytes);
  }
  for (auto [p, bytes] : live) b().deallocate(0, p, bytes);
}

TEST_P(BackendConformance, OutOfMemoryReturnsNullptr) {
  const MemoryInfo info = b().memory_info(0);
  void* p = nullptr;
  EXPECT_NO_THROW(p = b().allocate(0, info.total + b().granularity(0)));
  EXPECT_EQ(p, nullptr);
  if (p != nullptr) b().deallocate(0, p, info.total + b().granularity(0));
  // The device still works.
  void* q = b().allocate(0, 4096);
  ASSERT_NE(q, nullptr);
  b().deallocate(0, q, 4096);
}

TEST_P(BackendConformance, VirtualMemoryMapWriteReadUnmap) {
  if (!b().supports_virtual_memory(0)) GTEST_SKIP() << "no virtual memory support";
  const std::size_t g = b().granularity(0);
  auto* va = static_cast<char*>(b().reserve(0, 4 * g, g));
  ASSERT_NE(va, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(va) % g, 0u);
  const phys_handle_t h1 = b().create_physical(0, 2 * g);
  const phys_handle_t h2 = b().create_physical(0, 2 * g);
  ASSERT_NE(h1, 0u);
  ASSERT_NE(h2, 0u);
  EXPECT_NE(h1, h2);
  ASSERT_TRUE(b().map(0, va, 2 * g, h1));
  ASSERT_TRUE(b().map(0, va + 2 * g, 2 * g, h2));
  // The two mappings form one contiguous range.
  if (write(va, 4 * g, 7)) expect_pattern(va, 4 * g, 7);
  // Unmapping a range made of several mappings at once.
  b().unmap(0, va, 4 * g);
  // The reservation survives unmap: map again (the handles still hold their bytes).
  ASSERT_TRUE(b().map(0, va, 2 * g, h2));
  if (write(va + g, 16, 3)) expect_pattern(va + g, 16, 3);
  b().unmap(0, va, 2 * g);
  b().release_physical(0, h1);
  b().release_physical(0, h2);
  b().release_reservation(0, va, 4 * g);
}

TEST_P(BackendConformance, TwoRangesMappedToOneHandleAlias) {
  if (!b().supports_virtual_memory(0)) GTEST_SKIP() << "no virtual memory support";
  const std::size_t g = b().granularity(0);
  auto* a = static_cast<char*>(b().reserve(0, 2 * g, g));
  auto* c = static_cast<char*>(b().reserve(0, g, g));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(c, nullptr);
  const phys_handle_t h = b().create_physical(0, g);
  ASSERT_NE(h, 0u);
  ASSERT_TRUE(b().map(0, a + g, g, h));
  ASSERT_TRUE(b().map(0, c, g, h));
  if (write(a + g, g, 11)) expect_pattern(c, g, 11);
  if (write(c + 100, 200, 5)) expect_pattern(a + g + 100, 200, 5);
  // Released while mapped twice: the memory stays valid until the last mapping goes.
  b().release_physical(0, h);
  b().unmap(0, a + g, g);
  expect_pattern(c + 100, 200, 5);
  b().unmap(0, c, g);
  b().release_reservation(0, a, 2 * g);
  b().release_reservation(0, c, g);
}

TEST_P(BackendConformance, TheStartOfAMappedHandleMapsASecondTime) {
  // Borrowing: the free first granules of a handle mapped whole are mapped again elsewhere (a
  // prefix: cuMemMap's offset must be zero), while the whole mapping stays; both views see the
  // same memory.
  if (!b().supports_virtual_memory(0)) GTEST_SKIP() << "no virtual memory support";
  const std::size_t g = b().granularity(0);
  auto* a = static_cast<char*>(b().reserve(0, 3 * g, g));
  auto* c = static_cast<char*>(b().reserve(0, 2 * g, g));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(c, nullptr);
  const phys_handle_t h = b().create_physical(0, 3 * g);
  ASSERT_NE(h, 0u);
  ASSERT_TRUE(b().map(0, a, 3 * g, h));
  const bool host = write(a, 2 * g, 22) && write(a + 2 * g, g, 21);
  ASSERT_TRUE(b().map(0, c, 2 * g, h));  // granules 0 and 1 of the handle
  if (host) expect_pattern(c, 2 * g, 22);
  if (write(c + 100, 200, 5)) expect_pattern(a + 100, 200, 5);
  // The second view goes; the first keeps everything.
  b().unmap(0, c, 2 * g);
  if (host) {
    expect_pattern(a + 2 * g, g, 21);
    expect_pattern(a + 100, 200, 5);
  }
  b().unmap(0, a, 3 * g);
  b().release_physical(0, h);
  b().release_reservation(0, a, 3 * g);
  b().release_reservation(0, c, 2 * g);
}

TEST_P(BackendConformance, VirtualMemoryReleaseOrders) {
  if (!b().supports_virtual_memory(0)) GTEST_SKIP() << "no virtual memory support";
  const std::size_t g = b().granularity(0);
  // Reserve and release with nothing mapped.
  void* va = b().reserve(0, 2 * g, g);
  ASSERT_NE(va, nullptr);
  b().release_reservation(0, va, 2 * g);
  // Create and release without mapping.
  phys_handle_t h = b().create_physical(0, g);
  ASSERT_NE(h, 0u);
  b().release_physical(0, h);
  // map, unmap, release_physical, release_reservation.
  va = b().reserve(0, g, g);
  h = b().create_physical(0, g);
  ASSERT_NE(va, nullptr);
  ASSERT_NE(h, 0u);
  ASSERT_TRUE(b().map(0, va, g, h));
  b().unmap(0, va, g);
  b().release_physical(0, h);
  b().release_reservation(0, va, g);
  // map, release_physical (deferred), unmap, release_reservation.
  va = b().reserve(0, g, g);
  h = b().create_physical(0, g);
  ASSERT_NE(va, nullptr);
  ASSERT_NE(h, 0u);
  ASSERT_TRUE(b().map(0, va, g, h));
  b().release_physical(0, h);
  if (write(va, 64, 9)) expect_pattern(va, 64, 9);
  b().unmap(0, va, g);
  b().release_reservation(0, va, g);
  // map, unmap, release_reservation, then release_physical (the handle outlives the range).
  va = b().reserve(0, g, g);
  h = b().create_physical(0, g);
  ASSERT_NE(va, nullptr);
  ASSERT_NE(h, 0u);
  ASSERT_TRUE(b().map(0, va, g, h));
  b().unmap(0, va, g);
  b().release_reservation(0, va, g);
  b().release_physical(0, h);
}

TEST_P(BackendConformance, EventsCompleteAfterSynchronize) {
  event_t never = b().create_event(0);
  event_t e = b().create_event(0);
  ASSERT_NE(e, nullptr);
  ASSERT_NE(never, nullptr);
  EXPECT_NE(e, never);
  EXPECT_TRUE(b().query_event(0, never));  // never recorded: complete

  b().record_event(0, e, nullptr);
  b().synchronize_event(0, e);
  EXPECT_TRUE(b().query_event(0, e));

  stream_t s = GetParam().make_stream();
  b().record_event(0, e, s);
  b().synchronize_stream(0, s);
  EXPECT_TRUE(b().query_event(0, e));
  b().record_event(0, e, s);
  b().synchronize_event(0, e);
  EXPECT_TRUE(b().query_event(0, e));
  b().synchronize_stream(0, nullptr);

  b().destroy_event(0, e);
  b().destroy_event(0, never);
  GetParam().destroy_stream(s);
}

TEST_P(BackendConformance, CopiesBetweenMappedRangesAndSynchronizesTheDevice) {
  if (!b().supports_virtual_memory(0)) GTEST_SKIP() << "no virtual memory support";
  const std::size_t g = b().granularity(0);
  auto* va = static_cast<char*>(b().reserve(0, 4 * g, g));
  ASSERT_NE(va, nullptr);
  const phys_handle_t h1 = b().create_physical(0, 2 * g);
  const phys_handle_t h2 = b().create_physical(0, g);
  ASSERT_TRUE(b().map(0, va, 2 * g, h1));
  ASSERT_TRUE(b().map(0, va + 3 * g, g, h2));
  const bool readable = write(va, 2 * g, 11);
  stream_t s = GetParam().make_stream();
  // From a mapped range to another (the copy compaction makes), then the device's sync.
  b().copy(0, va + 3 * g, va + g, g, s);
  b().synchronize_device(0);
  if (readable) expect_pattern(va + 3 * g, 16, static_cast<unsigned>(11 + g * 31 % 256));
  // Plain memory too.
  void* plain = b().allocate(0, g);
  ASSERT_NE(plain, nullptr);
  b().copy(0, plain, va, 4096, s);
  b().synchronize_stream(0, s);
  if (readable) expect_pattern(plain, 4096, 11);
  b().deallocate(0, plain, g);
  b().synchronize_device(0);
  b().unmap(0, va, 2 * g);
  b().unmap(0, va + 3 * g, g);
  b().release_physical(0, h1);
  b().release_physical(0, h2);
  b().release_reservation(0, va, 4 * g);
  GetParam().destroy_stream(s);
}

TEST_P(BackendConformance, CopiesThroughPinnedHostMemoryAsynchronously) {
  // Sleep's backups: pinned host memory, chunked asynchronous copies out and back in, a sync.
  if (!b().supports_virtual_memory(0)) GTEST_SKIP() << "no virtual memory support";
  const std::size_t g = b().granularity(0);
  auto* va = static_cast<char*>(b().reserve(0, 2 * g, g));
  ASSERT_NE(va, nullptr);
  const phys_handle_t h = b().create_physical(0, 2 * g);
  ASSERT_TRUE(b().map(0, va, 2 * g, h));
  const bool readable = write(va, 2 * g, 7);
  auto* host = static_cast<unsigned char*>(b().allocate_host(0, 2 * g));
  ASSERT_NE(host, nullptr);
  stream_t s = GetParam().make_stream();
  b().copy_to_host_async(0, host, va, g, s);  // in two chunks
  b().copy_to_host_async(0, host + g, va + g, g, s);
  b().synchronize_stream(0, s);
  if (readable) {
    for (std::size_t i = 0; i < 2 * g; i += 4099)
      ASSERT_EQ(host[i], static_cast<unsigned char>(i * 31 + 7)) << "byte " << i;
  }
  // Back in at another place, from host memory changed meanwhile.
  for (std::size_t i = 0; i < g; ++i) host[i] = static_cast<unsigned char>(i * 31 + 9);
  b().copy_from_host_async(0, va + g, host, g, s);
  b().synchronize_stream(0, s);
  if (readable) expect_pattern(va + g, g, 9);
  b().deallocate_host(0, host, 2 * g);
  b().unmap(0, va, 2 * g);
  b().release_physical(0, h);
  b().release_reservation(0, va, 2 * g);
  GetParam().destroy_stream(s);
}

TEST_P(BackendConformance, HostPagesMapBesideDevicePagesAndHoldTheData) {
  // Spill's pages: host memory mapped into a device range next to device memory, the device's
  // copies moving data between the two, free device memory unchanged by host pages.
  if (!b().supports_virtual_memory(0)) GTEST_SKIP() << "no virtual memory support";
  const std::size_t hg = b().host_granularity(0);
  if (hg == 0) GTEST_SKIP() << "no host pages on this back end";
  ASSERT_EQ(hg & (hg - 1), 0u) << "a power of two";
  const std::size_t g = std::max(b().granularity(0), hg);  // a unit both granularities divide
  auto* va = static_cast<char*>(b().reserve(0, 2 * g, g));
  ASSERT_NE(va, nullptr);
  const std::size_t free_before = b().memory_info(0).free;
  const phys_handle_t host = b().create_host_physical(0, g);
  ASSERT_NE(host, 0u);
  EXPECT_EQ(b().memory_info(0).free, free_before) << "host pages are not device memory";
  const phys_handle_t dev = b().create_physical(0, g);
  ASSERT_NE(dev, 0u);
  const MapPiece pieces[] = {{dev, g}, {host, g}};
  ASSERT_TRUE(b().map_run(0, va, pieces, 2));
  const bool readable = write(va, g, 5);
  stream_t s = GetParam().make_stream();
  b().copy(0, va + g, va, g, s);  // device -> host pages, at their device addresses
  b().synchronize_stream(0, s);
  if (readable) expect_pattern(va + g, g, 5);
  b().unmap(0, va, 2 * g);
  b().release_physical(0, host);
  b().release_physical(0, dev);
  b().release_reservation(0, va, 2 * g);
  GetParam().destroy_stream(s);
}

TEST(BackendDefaults, CopyAndDeviceSyncThrowUnlessImplemented) {
  // A back end (or a wrapper) that does not implement them must not appear to have done them.
  struct Minimal final : Backend {
    const char* name() const noexcept override { return "minimal"; }
    int device_count() override { return 1; }
    MemoryInfo memory_info(int) override { return {}; }
    std::size_t granularity(int) override { return 1; }
    bool supports_virtual_memory(int) override { return false; }
    void* allocate(int, std::size_t) override { return nullptr; }
    void deallocate(int, void*, std::size_t) override {}
    void* reserve(int, std::size_t, std::size_t) override { return nullptr; }
    void release_reservation(int, void*, std::size_t) override {}
    phys_handle_t create_physical(int, std::size_t) override { return 0; }
    void release_physical(int, phys_handle_t) override {}
    bool map_run(int, void*, const MapPiece*, std::size_t) override { return false; }
    void unmap(int, void*, std::size_t) override {}
    event_t create_event(int) override { return nullptr; }
    void destroy_event(int, event_t) override {}
    void record_event(int, event_t, stream_t) override {}
    bool query_event(int, event_t) override { return true; }
    void synchronize_event(int, event_t) override {}
    void synchronize_stream(int, stream_t) override {}
  } m;
  char a[8] = {}, b[8] = {};
  EXPECT_THROW(m.copy(0, a, b, 8, nullptr), backend_error);
  EXPECT_THROW(m.synchronize_device(0), backend_error);
  EXPECT_THROW((void)m.allocate_host(0, 8), backend_error);
  EXPECT_THROW(m.deallocate_host(0, a, 8), backend_error);
  EXPECT_THROW(m.copy_to_host_async(0, a, b, 8, nullptr), backend_error);
  EXPECT_THROW(m.copy_from_host_async(0, a, b, 8, nullptr), backend_error);
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendConformance,
                         ::testing::Values(sim_factory(), cuda_factory()),
                         [](const ::testing::TestParamInfo<BackendFactory>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace stitch
