// Tests of the C API (stitch/stitch.h) from C++.
//
// The C API drives one process-wide allocator. Under ctest every TEST runs in a process of its
// own, but run directly the tests share it, so each one starts with use_sim() (the simulated
// device, 1 GiB, no memory cap), frees what it allocates, and looks at statistics as deltas.
// Tests that need a fresh process (the default CUDA backend, STITCH_ALLOC_CONF, two devices) run
// their body in a death-test child, which re-executes this binary ("threadsafe" style).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "stitch/stitch.h"
#ifdef STITCH_CAPI_TEST_CONF
#include "support/cuda_driver.hpp"
#endif

namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

#ifdef STITCH_CAPI_TEST_CONF
// stitch_fake_cuda_capi_tests: the same tests on backend:cuda over the strict fake driver, with
// streams of the driver (device 0's) and a 1 GiB device like the simulated one.
const bool kFakeNamed = [] {
  ::setenv("STITCH_CUDA_DRIVER", STITCH_FAKE_CUDA_PATH, 0);
  ::setenv("STITCH_FAKE_CUDA_DEVICES", "2", 0);
  ::setenv("STITCH_FAKE_CUDA_MEMORY_MB", "1024", 0);
  return true;
}();
void* stream(int n) {
  static void* streams[8] = {};
  if (streams[n] == nullptr) streams[n] = stitch::test::test_driver().make_stream(0);
  return streams[n];
}
#else
void* stream(int n) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(n) * 0x10); }
#endif

std::string last_error() { return stitch_last_error(); }

bool contains(const std::string& haystack, const char* needle) {
  return haystack.find(needle) != std::string::npos;
}

std::int64_t stat(const char* key, int device = 0) {
  const std::int64_t v = stitch_stat(device, key);
  EXPECT_GE(v, 0) << key << ": " << last_error();
  return v;
}

/// Every test starts here: the simulated 1 GiB device, no memory cap, no error left.
void use_sim() {
#ifdef STITCH_CAPI_TEST_CONF
  ASSERT_EQ(stitch_configure(STITCH_CAPI_TEST_CONF), 0) << last_error();
#else
  ASSERT_EQ(stitch_configure("backend:sim,sim_capacity_mb:1024"), 0) << last_error();
#endif
  ASSERT_EQ(stitch_set_memory_fraction(1.0, 0), 0) << last_error();
  stitch_clear_error();
}

void fill(void* p, std::size_t n, unsigned char seed) {
  auto* b = static_cast<unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>(seed + i * 31);
}

bool intact(const void* p, std::size_t n, unsigned char seed) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i)
    if (b[i] != static_cast<unsigned char>(seed + i * 31)) return false;
  return true;
}

/// A few live blocks with data, to check that a rejected call leaves everything else alone.
struct Bystanders {
  static constexpr std::size_t kSizes[3] = {1000, 64 * KiB, 3 * MiB};
  void* ptr[3] = {};
  Bystanders() {
    for (int i = 0; i < 3; ++i) {
      ptr[i] = stitch_malloc(kSizes[i], 0, stream(1));
      if (ptr[i] != nullptr) fill(ptr[i], kSizes[i], static_cast<unsigned char>(i + 1));
    }
  }
  bool all_intact() const {
    for (int i = 0; i < 3; ++i)
      if (ptr[i] == nullptr || !intact(ptr[i], kSizes[i], static_cast<unsigned char>(i + 1)))
        return false;
    return true;
  }
  ~Bystanders() {
    for (int i = 0; i < 3; ++i)
      if (ptr[i] != nullptr) stitch_free(ptr[i], kSizes[i], 0, stream(1));
  }
};

/// A free with bad arguments must be rejected with `needle` in the error, counted as an invalid
/// free, and leave every allocation (and the bystanders' data) alone.
void expect_rejected_free(const Bystanders& others, void* ptr, std::size_t size, int device,
                          const char* needle) {
  const std::int64_t invalid = stat("num_invalid_frees");
  const std::int64_t live = stat("allocation.all.current");
  stitch_free(ptr, size, device, stream(1));
  EXPECT_TRUE(contains(last_error(), needle)) << last_error();
  EXPECT_EQ(stat("num_invalid_frees"), invalid + 1);
  EXPECT_EQ(stat("allocation.all.current"), live);
  EXPECT_TRUE(others.all_intact());
}

// ---- malloc / free ---------------------------------------------------------------------------------

TEST(CApi, MallocFreeRoundTrip) {
  use_sim();
  const std::int64_t live = stat("allocation.all.current");
  void* p = stitch_malloc(1000, 0, nullptr);
  ASSERT_NE(p, nullptr) << last_error();
  EXPECT_EQ(last_error(), "");
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 512, 0u);
  std::memset(p, 0x7E, 1000);
  EXPECT_EQ(stat("allocation.all.current"), live + 1);
  stitch_free(p, 1000, 0, nullptr);
  EXPECT_EQ(last_error(), "");
  EXPECT_EQ(stat("allocation.all.current"), live);
}

TEST(CApi, MallocOnAStreamReusesItsBlock) {
  use_sim();
  void* p = stitch_malloc(5 * MiB, 0, stream(3));
  ASSERT_NE(p, nullptr) << last_error();
  stitch_free(p, 5 * MiB, 0, stream(3));
  void* q = stitch_malloc(5 * MiB, 0, stream(3));
  EXPECT_EQ(q, p);
  stitch_free(q, 5 * MiB, 0, stream(3));
}

TEST(CApi, MallocZeroReturnsNullWithoutAnError) {
  use_sim();
  EXPECT_EQ(stitch_malloc(0, 0, nullptr), nullptr);
  EXPECT_EQ(last_error(), "");
  (void)stitch_stat(0, "no_such_key");  // leaves an error behind, which size 0 does not touch
  const std::string earlier = last_error();
  ASSERT_NE(earlier, "");
  EXPECT_EQ(stitch_malloc(0, 0, nullptr), nullptr);
  EXPECT_EQ(last_error(), earlier);
}

TEST(CApi, LastErrorIsKeptUntilTheNextFailure) {
  use_sim();
  EXPECT_EQ(stitch_stat(0, "no_such_key"), -1);
  const std::string first = last_error();
  EXPECT_TRUE(contains(first, "no_such_key")) << first;
  // Successful calls of every kind leave it alone.
  void* p = stitch_malloc(1000, 0, nullptr);
  ASSERT_NE(p, nullptr);
  EXPECT_GE(stitch_stat(0, "allocation.all.current"), 1);
  EXPECT_EQ(stitch_reset_peak_stats(0), 0);
  stitch_free(p, 1000, 0, nullptr);
  EXPECT_EQ(last_error(), first);
  // The next failure replaces it; stitch_clear_error() empties it.
  EXPECT_NE(stitch_set_memory_fraction(2.0, 0), 0);
  EXPECT_NE(last_error(), first);
  EXPECT_NE(last_error(), "");
  stitch_clear_error();
  EXPECT_EQ(last_error(), "");
  // Per thread: another thread's failure does not show here.
  std::thread([] { (void)stitch_stat(0, "other_thread_key"); }).join();
  EXPECT_EQ(last_error(), "");
}

TEST(CApi, FreeOfNullIsANoOp) {
  use_sim();
  const std::int64_t invalid = stat("num_invalid_frees");
  stitch_free(nullptr, 0, 0, nullptr);
  stitch_free(nullptr, 100, 0, stream(1));
  EXPECT_EQ(last_error(), "");
  EXPECT_EQ(stat("num_invalid_frees"), invalid);
}

TEST(CApi, MallocOnABadDeviceReturnsNull) {
  use_sim();
  EXPECT_EQ(stitch_malloc(1000, 3, nullptr), nullptr);
  EXPECT_TRUE(contains(last_error(), "device 3")) << last_error();
  EXPECT_EQ(stitch_malloc(1000, -1, nullptr), nullptr);
  EXPECT_NE(last_error(), "");
}

TEST(CApi, OutOfMemoryReturnsNullAndCounts) {
  use_sim();
  Bystanders others;
  const std::int64_t ooms = stat("num_ooms");
  EXPECT_EQ(stitch_malloc(2 * GiB, 0, nullptr), nullptr);
  EXPECT_TRUE(contains(last_error(), "out of memory")) << last_error();
  EXPECT_TRUE(contains(last_error(), "Tried to allocate")) << last_error();
  EXPECT_EQ(stat("num_ooms"), ooms + 1);
  EXPECT_TRUE(others.all_intact());
  // A program that logs statistics and keeps going after the OOM still has the report.
  const std::string report = last_error();
  EXPECT_GE(stitch_stat(0, "reserved_bytes.all.current"), 0);
  void* p = stitch_malloc(1000, 0, nullptr);
  ASSERT_NE(p, nullptr);
  stitch_free(p, 1000, 0, nullptr);
  EXPECT_EQ(last_error(), report);
}

// ---- invalid frees ---------------------------------------------------------------------------------

TEST(CApi, FreeOfAnUnknownPointerSetsTheErrorAndChangesNothing) {
  use_sim();
  Bystanders others;
  int host = 0;
  expect_rejected_free(others, &host, sizeof host, 0, "not a live allocation");
}

// A wrong size is refused the same way whichever path the free would take: the pair's taken
// block (its free is a pair's when asked right), a block the hit's plain path frees, and one the
// device lock frees (a block used on another stream). The error names the size it was allocated
// with, and the block stays live.
TEST(CApi, AWrongSizeIsRefusedOnEveryPathWithTheAllocatedSize) {
  use_sim();
  Bystanders others;
  for (int route = 0; route < 3; ++route) {
    void* p = stitch_malloc(1000, 0, stream(2));
    ASSERT_NE(p, nullptr) << last_error();
    if (route == 0) {  // a pair: freed, taken again
      stitch_free(p, 1000, 0, stream(2));
      p = stitch_malloc(1000, 0, stream(2));
      ASSERT_NE(p, nullptr) << last_error();
    } else if (route == 1) {  // a plain free: another block allocated after it
      void* q = stitch_malloc(5000, 0, stream(2));
      ASSERT_NE(q, nullptr) << last_error();
      stitch_free(q, 5000, 0, stream(2));
    } else {  // used on another stream: the device lock
      ASSERT_EQ(stitch_record_stream(p, stream(3)), 0) << last_error();
    }
    fill(p, 1000, 9);
    const std::int64_t live = stat("allocation.all.current");
    const std::int64_t invalid = stat("num_invalid_frees");
    stitch_free(p, 999, 0, stream(2));
    EXPECT_TRUE(contains(last_error(), "allocated with size 1000; nothing was freed")) << route << ": " << last_error();
    EXPECT_EQ(stat("num_invalid_frees"), invalid + 1) << route;
    EXPECT_EQ(stat("allocation.all.current"), live) << route;
    EXPECT_TRUE(intact(p, 1000, 9)) << route;
    stitch_clear_error();
    stitch_free(p, 1000, 0, stream(2));
    EXPECT_EQ(last_error(), "") << route;
    EXPECT_EQ(stat("allocation.all.current"), live - 1) << route;
  }
  EXPECT_TRUE(others.all_intact());
}

TEST(CApi, InteriorPointerFreeIsRejected) {
  use_sim();
  Bystanders others;
  const std::int64_t invalid = stat("num_invalid_frees");
  stitch_free(static_cast<char*>(others.ptr[1]) + 512, 1000, 0, stream(1));
  EXPECT_NE(last_error(), "");
  EXPECT_EQ(stat("num_invalid_frees"), invalid + 1);
  EXPECT_TRUE(others.all_intact());
}

TEST(CApi, DoubleFreeSetsTheErrorAndChangesNothing) {
  use_sim();
  Bystanders others;
  void* p = stitch_malloc(4000, 0, stream(1));
  ASSERT_NE(p, nullptr);
  stitch_free(p, 4000, 0, stream(1));
  ASSERT_EQ(last_error(), "");
  const std::int64_t invalid = stat("num_invalid_frees");
  const std::int64_t live = stat("allocation.all.current");
  stitch_free(p, 4000, 0, stream(1));
  EXPECT_TRUE(contains(last_error(), "double free")) << last_error();
  EXPECT_EQ(stat("num_invalid_frees"), invalid + 1);
  EXPECT_EQ(stat("allocation.all.current"), live);
  EXPECT_TRUE(others.all_intact());
}

TEST(CApi, FreeWithTheWrongSizeSetsTheErrorAndKeepsTheBlock) {
  use_sim();
  Bystanders others;
  void* p = stitch_malloc(1000, 0, nullptr);
  ASSERT_NE(p, nullptr);
  fill(p, 1000, 9);
  const std::int64_t invalid = stat("num_invalid_frees");
  stitch_free(p, 999, 0, nullptr);
  EXPECT_TRUE(contains(last_error(), "999")) << last_error();
  EXPECT_TRUE(contains(last_error(), "1000")) << last_error();
  EXPECT_EQ(stat("num_invalid_frees"), invalid + 1);
  EXPECT_TRUE(intact(p, 1000, 9));
  EXPECT_TRUE(others.all_intact());
  stitch_clear_error();
  stitch_free(p, 1000, 0, nullptr);  // the right size still frees it
  EXPECT_EQ(last_error(), "");
}

TEST(CApi, FreeOnANonexistentDeviceSetsTheErrorAndKeepsTheBlock) {
  use_sim();
  void* p = stitch_malloc(1000, 0, nullptr);
  ASSERT_NE(p, nullptr);
  fill(p, 1000, 4);
  stitch_free(p, 1000, 5, nullptr);
  EXPECT_TRUE(contains(last_error(), "device 5")) << last_error();
  EXPECT_TRUE(intact(p, 1000, 4));
  stitch_clear_error();
  stitch_free(p, 1000, 0, nullptr);
  EXPECT_EQ(last_error(), "");
}

TEST(CApi, FreeOnTheWrongDeviceSetsTheErrorAndKeepsTheBlock) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        // A fresh process with two simulated devices.
        if (stitch_configure("backend:sim,sim_capacity_mb:256,sim_devices:2") != 0) std::_Exit(10);
        void* p = stitch_malloc(1000, 1, nullptr);
        if (p == nullptr) std::_Exit(11);
        fill(p, 1000, 3);
        stitch_free(p, 1000, 0, nullptr);
        if (!contains(last_error(), "device 1")) std::_Exit(12);
        if (stitch_stat(1, "num_invalid_frees") + stitch_stat(0, "num_invalid_frees") != 1)
          std::_Exit(13);
        if (stitch_stat(1, "allocation.all.current") != 1 || !intact(p, 1000, 3)) std::_Exit(14);
        stitch_clear_error();
        stitch_free(p, 1000, 1, nullptr);
        if (last_error() != "" || stitch_stat(1, "allocation.all.current") != 0) std::_Exit(15);
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(CApi, HugeAndNegativeSizesFailCleanly) {
  use_sim();
  Bystanders others;
  const std::int64_t live = stat("allocation.all.current");
  const std::int64_t bytes = stat("allocated_bytes.all.current");
  // A negative size from a caller's signed arithmetic arrives as a huge size_t.
  for (const std::size_t size : {static_cast<std::size_t>(-1), static_cast<std::size_t>(-512),
                                 SIZE_MAX / 2 + 1, std::size_t{1} << 50}) {
    const std::int64_t ooms = stat("num_ooms");
    EXPECT_EQ(stitch_malloc(size, 0, stream(1)), nullptr) << size;
    EXPECT_TRUE(contains(last_error(), "out of memory")) << last_error();
    EXPECT_EQ(stat("num_ooms"), ooms + 1);
  }
  EXPECT_EQ(stat("allocation.all.current"), live);
  EXPECT_EQ(stat("allocated_bytes.all.current"), bytes);
  // Freeing with a "negative" size is a wrong size: rejected, the block kept.
  expect_rejected_free(others, others.ptr[0], static_cast<std::size_t>(-1), 0, "nothing was freed");
}

TEST(CApi, NegativeDevicesAreRejectedEverywhere) {
  use_sim();
  Bystanders others;
  const std::int64_t live = stat("allocation.all.current");
  stitch_free(others.ptr[0], Bystanders::kSizes[0], -1, stream(1));
  EXPECT_TRUE(contains(last_error(), "device -1")) << last_error();
  EXPECT_NE(stitch_empty_cache(-2), 0);
  EXPECT_NE(stitch_set_memory_fraction(0.5, -1), 0);
  EXPECT_NE(stitch_reset_peak_stats(-2), 0);
  char buf[16] = "x";
  EXPECT_EQ(stitch_memory_summary(-1, buf, sizeof buf), 0u);
  EXPECT_EQ(buf[0], '\0');
  EXPECT_NE(last_error(), "");
  EXPECT_EQ(stat("allocation.all.current"), live);
  EXPECT_TRUE(others.all_intact());
}

TEST(CApi, RecordStreamOfAnInteriorOrFreedPointerFails) {
  use_sim();
  Bystanders others;
  EXPECT_NE(stitch_record_stream(static_cast<char*>(others.ptr[2]) + 512, stream(2)), 0);
  EXPECT_TRUE(contains(last_error(), "not a live allocation")) << last_error();
  void* p = stitch_malloc(4000, 0, stream(1));
  ASSERT_NE(p, nullptr);
  stitch_free(p, 4000, 0, stream(1));
  EXPECT_NE(stitch_record_stream(p, stream(2)), 0);
  EXPECT_NE(stitch_record_stream(nullptr, stream(2)), 0);
  EXPECT_TRUE(others.all_intact());
}

TEST(CApi, NotANumberMemoryFractionIsRejected) {
  use_sim();
  EXPECT_NE(stitch_set_memory_fraction(std::nan(""), 0), 0);
  EXPECT_TRUE(contains(last_error(), "nan")) << last_error();
  EXPECT_NE(stitch_set_memory_fraction(HUGE_VAL, 0), 0);
  void* p = stitch_malloc(300 * MiB, 0, nullptr);  // no cap was set
  EXPECT_NE(p, nullptr) << last_error();
  stitch_free(p, 300 * MiB, 0, nullptr);
}

TEST(CApi, RecordHistoryWithTheLargestRingDoesNotReserveIt) {
  use_sim();
  // max_entries may be up to 2^32: the ring grows with the entries recorded, not up front.
  ASSERT_EQ(stitch_record_history(1, std::size_t{1} << 32), 0) << last_error();
  void* p = stitch_malloc(1000, 0, nullptr);
  EXPECT_NE(p, nullptr) << last_error();
  stitch_free(p, 1000, 0, nullptr);
  EXPECT_EQ(stitch_record_history(0, 0), 0) << last_error();
}

// ---- configure -------------------------------------------------------------------------------------

TEST(CApi, ConfigureWithAnUnknownKeyFailsAndNamesIt) {
  use_sim();
  EXPECT_NE(stitch_configure("max_split_size_mb:64,no_such_option:1"), 0);
  EXPECT_TRUE(contains(last_error(), "no_such_option")) << last_error();
  EXPECT_TRUE(contains(last_error(), "max_split_size_mb")) << last_error();  // accepted keys
  EXPECT_EQ(stitch_stat(0, "max_split_size"), -1);  // nothing was applied (still unlimited)
}

TEST(CApi, ConfigureWithABadValueFailsAndNamesTheKey) {
  use_sim();
  EXPECT_NE(stitch_configure("garbage_collection_threshold:2"), 0);
  EXPECT_TRUE(contains(last_error(), "garbage_collection_threshold")) << last_error();
}

TEST(CApi, ConfigureWithNullFails) {
  use_sim();
  EXPECT_NE(stitch_configure(nullptr), 0);
  EXPECT_NE(last_error(), "");
}

#ifdef STITCH_CAPI_TEST_CONF
constexpr const char* kOtherBackend = "backend:sim";
constexpr const char* kThisBackend = STITCH_CAPI_TEST_CONF;
#else
constexpr const char* kOtherBackend = "backend:cuda";
constexpr const char* kThisBackend = "backend:sim,sim_capacity_mb:1024";
#endif

TEST(CApi, ConfigureBackendCudaAfterTheFirstAllocationFails) {
  use_sim();
  void* p = stitch_malloc(1000, 0, nullptr);  // the allocator exists now
  ASSERT_NE(p, nullptr);
  EXPECT_NE(stitch_configure(kOtherBackend), 0);
  EXPECT_TRUE(contains(last_error(), "backend")) << last_error();
  EXPECT_TRUE(contains(last_error(), "fixed")) << last_error();
  EXPECT_NE(stitch_configure("sim_capacity_mb:2048"), 0);
  EXPECT_NE(stitch_configure("sim_devices:2"), 0);
  // Still the same device, still working.
  stitch_clear_error();
  stitch_free(p, 1000, 0, nullptr);
  EXPECT_EQ(last_error(), "");
  void* q = stitch_malloc(1000, 0, nullptr);
  EXPECT_NE(q, nullptr);
  stitch_free(q, 1000, 0, nullptr);
}

TEST(CApi, ConfigureCanRepeatTheCurrentBackend) {
  use_sim();
  EXPECT_EQ(stitch_configure(kThisBackend), 0) << last_error();
  EXPECT_EQ(last_error(), "");
}

// ---- statistics ------------------------------------------------------------------------------------

TEST(CApi, StatOfAnUnknownKeyIsMinusOne) {
  use_sim();
  EXPECT_EQ(stitch_stat(0, "allocation.all.latest"), -1);
  EXPECT_TRUE(contains(last_error(), "allocation.all.latest")) << last_error();
  EXPECT_EQ(stitch_stat(0, nullptr), -1);
  EXPECT_NE(last_error(), "");
}

TEST(CApi, StatOfAnUnknownDeviceIsMinusOne) {
  use_sim();
  EXPECT_EQ(stitch_stat(4, "num_ooms"), -1);
  EXPECT_NE(last_error(), "");
  EXPECT_EQ(stitch_stat(-1, "num_ooms"), -1);
}

TEST(CApi, StatsReadsEveryStatisticAtOnceInTheKeysOrder) {
  use_sim();
  const size_t n = stitch_stat_count();
  ASSERT_GT(n, 100u);
  EXPECT_EQ(stitch_stat_key(n, nullptr), nullptr);
  int torch_keys = 0, memory_stats_keys = 0;
  for (size_t i = 0; i < n; ++i) {
    int flags = -1;
    const char* key = stitch_stat_key(i, &flags);
    ASSERT_NE(key, nullptr);
    torch_keys += (flags & STITCH_STAT_TORCH) != 0;
    memory_stats_keys += (flags & STITCH_STAT_MEMORY_STATS) != 0;
    if (std::strcmp(key, "num_invalid_frees") == 0) EXPECT_EQ(flags, STITCH_STAT_MEMORY_STATS);
    if (std::strcmp(key, "num_stitches") == 0) EXPECT_EQ(flags, 0);
    if (std::strcmp(key, "reserved_bytes.all.peak") == 0)
      EXPECT_EQ(flags, STITCH_STAT_TORCH | STITCH_STAT_MEMORY_STATS);
  }
  EXPECT_EQ(torch_keys, 9 * 3 * 4 + 2 * 4 + 6);  // torch.cuda.memory_stats()'s keys
  EXPECT_EQ(memory_stats_keys, torch_keys + 1);   // and num_invalid_frees
  void* p = stitch_malloc(3 * MiB, 0, stream(1));
  ASSERT_NE(p, nullptr);
  std::vector<int64_t> values(n, -7);
  ASSERT_EQ(stitch_stats(0, values.data(), n), static_cast<int64_t>(n));
  for (size_t i = 0; i < n; ++i)  // nothing changed since: each is what stitch_stat reads
    EXPECT_EQ(values[i], stitch_stat(0, stitch_stat_key(i, nullptr))) << stitch_stat_key(i, nullptr);
  // A short buffer: what fits, and the full count (like snprintf).
  std::vector<int64_t> few(3, -7);
  EXPECT_EQ(stitch_stats(0, few.data(), 2), static_cast<int64_t>(n));
  EXPECT_EQ(few[0], values[0]);
  EXPECT_EQ(few[2], -7);
  EXPECT_EQ(stitch_stats(0, nullptr, 0), static_cast<int64_t>(n));
  EXPECT_EQ(stitch_stats(0, nullptr, 5), -1);
  EXPECT_EQ(stitch_stats(7, few.data(), 3), -1);
  EXPECT_TRUE(contains(last_error(), "invalid device 7")) << last_error();
  stitch_free(p, 3 * MiB, 0, stream(1));
}

TEST(CApi, ConfigAndDeviceCountDescribeTheAllocator) {
  use_sim();
  void* p = stitch_malloc(1000, 0, nullptr);  // the allocator exists
  ASSERT_NE(p, nullptr);
  stitch_free(p, 1000, 0, nullptr);
  // The simulated device is one; the fake driver has the devices its environment gives.
  const char* fake_devices = std::getenv("STITCH_FAKE_CUDA_DEVICES");
  const int expected = contains(kThisBackend, "cuda") && fake_devices ? std::atoi(fake_devices) : 1;
  EXPECT_EQ(stitch_device_count(), expected) << last_error();
  const std::size_t n = stitch_config(nullptr, 0);
  ASSERT_GT(n, 0u) << last_error();
  std::string conf(n + 1, '\0');
  EXPECT_EQ(stitch_config(conf.data(), conf.size()), n);
  conf.resize(n);
  EXPECT_TRUE(contains(conf, kThisBackend)) << conf;
  EXPECT_EQ(stitch_configure(conf.c_str()), 0) << conf << ": " << last_error();  // it round-trips
  char small[8];
  EXPECT_EQ(stitch_config(small, sizeof small), n);  // cut, NUL-terminated
  EXPECT_EQ(std::strlen(small), sizeof small - 1);
}

TEST(CApi, StatKnownKeysKeepTheError) {
  use_sim();
  (void)stitch_stat(0, "bogus");
  const std::string bogus = last_error();
  EXPECT_TRUE(contains(bogus, "bogus")) << bogus;
  EXPECT_GE(stitch_stat(0, "reserved_bytes.all.peak"), 0);
  EXPECT_GE(stitch_stat(0, "requested_bytes.large_pool.freed"), 0);
  EXPECT_GE(stitch_stat(0, "num_alloc_retries"), 0);
  EXPECT_EQ(last_error(), bogus);
}

TEST(CApi, ResetPeakStats) {
  use_sim();
  void* p[3];
  for (auto& q : p) {
    q = stitch_malloc(12 * MiB, 0, nullptr);
    ASSERT_NE(q, nullptr);
  }
  stitch_free(p[0], 12 * MiB, 0, nullptr);
  stitch_free(p[1], 12 * MiB, 0, nullptr);
  const std::int64_t current = stat("allocated_bytes.all.current");
  EXPECT_GE(stat("allocated_bytes.all.peak"), current + static_cast<std::int64_t>(24 * MiB));
  EXPECT_EQ(stitch_reset_peak_stats(0), 0) << last_error();
  EXPECT_EQ(stat("allocated_bytes.all.peak"), current);
  EXPECT_EQ(stat("allocation.all.peak"), stat("allocation.all.current"));
  EXPECT_EQ(stitch_reset_peak_stats(-1), 0) << last_error();
  EXPECT_NE(stitch_reset_peak_stats(7), 0);
  EXPECT_NE(last_error(), "");
  stitch_free(p[2], 12 * MiB, 0, nullptr);
}

// ---- empty_cache, memory fraction, record_stream -------------------------------------------------

TEST(CApi, EmptyCacheReturnsCachedSegments) {
  use_sim();
  void* p = stitch_malloc(40 * MiB, 0, stream(2));
  ASSERT_NE(p, nullptr);
  stitch_free(p, 40 * MiB, 0, stream(2));
  const std::int64_t reserved = stat("reserved_bytes.all.current");
  const std::int64_t frees = stat("num_device_free");
  EXPECT_EQ(stitch_empty_cache(0), 0) << last_error();
  EXPECT_LE(stat("reserved_bytes.all.current"), reserved - static_cast<std::int64_t>(40 * MiB));
  EXPECT_GT(stat("num_device_free"), frees);
  EXPECT_EQ(stitch_empty_cache(-1), 0) << last_error();
  EXPECT_NE(stitch_empty_cache(9), 0);
  EXPECT_NE(last_error(), "");
}

TEST(CApi, SetMemoryFractionCapsAllocations) {
  use_sim();
  ASSERT_EQ(stitch_empty_cache(-1), 0);
  ASSERT_EQ(stitch_set_memory_fraction(0.25, 0), 0) << last_error();
  EXPECT_EQ(stitch_malloc(300 * MiB, 0, nullptr), nullptr);
  EXPECT_TRUE(contains(last_error(), "The memory fraction allows")) << last_error();
  ASSERT_EQ(stitch_set_memory_fraction(1.0, 0), 0) << last_error();
  void* p = stitch_malloc(300 * MiB, 0, nullptr);
  EXPECT_NE(p, nullptr) << last_error();
  stitch_free(p, 300 * MiB, 0, nullptr);
}

TEST(CApi, SetMemoryFractionRejectsBadArguments) {
  use_sim();
  EXPECT_NE(stitch_set_memory_fraction(1.5, 0), 0);
  EXPECT_NE(last_error(), "");
  EXPECT_NE(stitch_set_memory_fraction(-1.0, 0), 0);
  EXPECT_NE(stitch_set_memory_fraction(0.5, 3), 0);
  EXPECT_EQ(stitch_set_memory_fraction(1.0, 0), 0);
}

TEST(CApi, RecordStream) {
  use_sim();
  void* p = stitch_malloc(2 * MiB, 0, stream(7));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(stitch_record_stream(p, stream(8)), 0) << last_error();
  EXPECT_EQ(last_error(), "");
  stitch_free(p, 2 * MiB, 0, stream(7));
  EXPECT_EQ(last_error(), "");
  // The freed block waits for stream 2's event; the next malloc sees it completed and reuses it.
  void* q = stitch_malloc(2 * MiB, 0, stream(7));
  EXPECT_EQ(q, p);
  stitch_free(q, 2 * MiB, 0, stream(7));
}

TEST(CApi, RecordStreamOfAnUnknownPointerFails) {
  use_sim();
  int host = 0;
  EXPECT_NE(stitch_record_stream(&host, stream(2)), 0);
  EXPECT_TRUE(contains(last_error(), "record_stream")) << last_error();
}

TEST(CApi, LastErrorIsPerThread) {
  use_sim();
  (void)stitch_stat(0, "bogus");
  ASSERT_NE(last_error(), "");
  std::string other = "unset";
  std::thread([&] { other = stitch_last_error(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_NE(last_error(), "");  // this thread's error is untouched
}

// ---- fresh processes -------------------------------------------------------------------------------

TEST(CApiFreshProcess, DefaultCudaBackendWithoutAGpuFailsWithAClearError) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        unsetenv("STITCH_ALLOC_CONF");
        void* p = stitch_malloc(1000, 0, nullptr);
        if (p != nullptr) {
          // This machine has a GPU: the default backend works, which is right too.
          stitch_free(p, 1000, 0, nullptr);
          std::_Exit(last_error().empty() ? 0 : 20);
        }
        const std::string e = last_error();
        std::fprintf(stderr, "error: %s\n", e.c_str());
        if (!contains(e, "CUDA")) std::_Exit(21);
        if (!contains(e, "backend:sim")) std::_Exit(22);  // says what to use instead
        // Failing does not poison the process: a second call fails the same way...
        if (stitch_malloc(1000, 0, nullptr) != nullptr || !contains(last_error(), "CUDA"))
          std::_Exit(23);
        // ... and the simulated device can still be chosen.
        if (stitch_configure("backend:sim,sim_capacity_mb:64") != 0) std::_Exit(24);
        void* q = stitch_malloc(1000, 0, nullptr);
        if (q == nullptr) std::_Exit(25);
        stitch_free(q, 1000, 0, nullptr);
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(CApiFreshProcess, AllocConfEnvironmentVariableIsRead) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("STITCH_ALLOC_CONF", "backend:sim,sim_capacity_mb:64", 1);
        void* p = stitch_malloc(1000, 0, nullptr);
        if (p == nullptr) std::_Exit(30);
        stitch_free(p, 1000, 0, nullptr);
        // 64 MiB device: 100 MiB cannot fit.
        if (stitch_malloc(100 * MiB, 0, nullptr) != nullptr) std::_Exit(31);
        if (!contains(last_error(), "out of memory")) std::_Exit(32);
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(CApiFreshProcess, ConfigureOverridesTheEnvironmentBeforeFirstUse) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("STITCH_ALLOC_CONF", "backend:sim,sim_capacity_mb:64", 1);
        if (stitch_configure("sim_capacity_mb:512") != 0) std::_Exit(40);
        void* p = stitch_malloc(100 * MiB, 0, nullptr);
        if (p == nullptr) std::_Exit(41);
        stitch_free(p, 100 * MiB, 0, nullptr);
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(CApiFreshProcess, BadAllocConfIsReportedByTheFirstCall) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("STITCH_ALLOC_CONF", "backend:sim,bogus_key:1", 1);
        if (stitch_malloc(1000, 0, nullptr) != nullptr) std::_Exit(50);
        const std::string e = last_error();
        if (!contains(e, "STITCH_ALLOC_CONF") || !contains(e, "bogus_key")) std::_Exit(51);
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(CApiFreshProcess, EveryCallBeforeConfigurationFailsCleanlyWithoutAGpu) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        unsetenv("STITCH_ALLOC_CONF");
        int host = 0;
        char buf[8] = "x";
        // Without configuration the backend is CUDA; without a GPU every call fails and says so.
        // (With a GPU they succeed, which is right too.)
        const bool gpu = stitch_empty_cache(-1) == 0;
        if (!gpu) {
          if (!contains(last_error(), "CUDA")) std::_Exit(70);
          if (stitch_stat(0, "num_ooms") != -1 || !contains(last_error(), "CUDA")) std::_Exit(71);
          if (stitch_set_memory_fraction(0.5, 0) == 0) std::_Exit(72);
          if (stitch_reset_peak_stats(-1) == 0) std::_Exit(73);
          if (stitch_record_stream(&host, stream(1)) == 0) std::_Exit(74);
          if (stitch_memory_summary(0, buf, sizeof buf) != 0 || buf[0] != '\0') std::_Exit(75);
          stitch_free(&host, sizeof host, 0, nullptr);
          if (!contains(last_error(), "CUDA")) std::_Exit(76);
          if (stitch_dump_snapshot("/nonexistent/x.pickle") == 0) std::_Exit(77);
          if (stitch_device_count() != -1 || !contains(last_error(), "no CUDA device")) std::_Exit(81);
          char conf[256];
          if (stitch_config(conf, sizeof conf) == 0 || !contains(conf, "backend:cuda")) std::_Exit(82);
          // Nothing was fixed by the failed calls: the simulated device can still be chosen.
          if (stitch_configure("backend:sim,sim_capacity_mb:64") != 0) std::_Exit(78);
          void* p = stitch_malloc(1000, 0, nullptr);
          if (p == nullptr) std::_Exit(79);
          stitch_clear_error();
          stitch_free(p, 1000, 0, nullptr);
          if (last_error() != "") std::_Exit(80);
        }
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

// The C API has no shutdown: it keeps working while the process exits, e.g. for memory freed by
// static destructors or atexit handlers, after the main thread's thread_local objects (where
// errors are kept) are gone. Under AddressSanitizer a use of destroyed state fails this test.
void* g_exit_block = nullptr;
int g_exit_status = 90;
struct FreesAtExit {
  ~FreesAtExit() {
    // Runs after std::exit() has destroyed the main thread's thread_local objects.
    if (g_exit_block == nullptr) std::_Exit(91);
    stitch_clear_error();
    stitch_free(g_exit_block, 1000, 0, nullptr);
    if (last_error() != "") std::_Exit(92);
    stitch_free(g_exit_block, 1000, 0, nullptr);  // double free: an error, kept and readable
    if (!contains(last_error(), "double free")) std::_Exit(93);
    if (stitch_malloc(std::size_t{1} << 40, 0, nullptr) != nullptr) std::_Exit(94);
    if (!contains(last_error(), "out of memory")) std::_Exit(95);
    void* p = stitch_malloc(5000, 0, nullptr);
    // The report outlives the successful call, in the storage left after the thread's exit.
    if (p == nullptr || !contains(last_error(), "out of memory")) std::_Exit(96);
    stitch_free(p, 5000, 0, nullptr);
    if (stitch_configure("max_split_size_mb:64") != 0) std::_Exit(97);
    if (stitch_stat(0, "allocation.all.current") != 0) std::_Exit(98);
    std::_Exit(g_exit_status);
  }
};

TEST(CApiFreshProcess, CallsWhileTheProcessExitsKeepWorking) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        if (stitch_configure("backend:sim,sim_capacity_mb:64") != 0) std::_Exit(81);
        g_exit_block = stitch_malloc(1000, 0, nullptr);
        // A long error (an OOM report) is on the heap when the thread_local text is destroyed.
        if (stitch_malloc(std::size_t{1} << 40, 0, nullptr) != nullptr) std::_Exit(82);
        static FreesAtExit at_exit;  // destroyed by std::exit, after the thread_locals
        g_exit_status = 0;
        std::exit(83);  // the destructor above decides the exit code
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(CApiFreshProcess, AbortPolicyAbortsOnAnInvalidFree) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        if (stitch_configure("backend:sim,sim_capacity_mb:64,on_invalid_free:abort") != 0)
          std::_Exit(60);
        int host = 0;
        stitch_free(&host, sizeof host, 0, nullptr);
      },
      "on_invalid_free:abort");
}

}  // namespace
