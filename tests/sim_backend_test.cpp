// Tests of the simulated device itself (stitch::SimBackend): capacity, real memory, the
// virtual-memory model, stream holding, fault injection, multiple devices and threads.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "stitch/errors.hpp"
#include "stitch/sim_backend.hpp"

namespace stitch {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;
constexpr std::size_t kGran = 2 * kMiB;

SimBackend::Options small(std::size_t capacity = 64 * kMiB, int devices = 1) {
  SimBackend::Options o;
  o.capacity = capacity;
  o.devices = devices;
  return o;
}

bool same(const SimUsage& a, const SimUsage& b) {
  return a.capacity == b.capacity && a.used == b.used && a.allocations == b.allocations &&
         a.physical_handles == b.physical_handles && a.reservations == b.reservations &&
         a.mappings == b.mappings && a.events == b.events;
}

std::string show(const SimUsage& u) {
  return "capacity=" + std::to_string(u.capacity) + " used=" + std::to_string(u.used) +
         " allocations=" + std::to_string(u.allocations) +
         " physical=" + std::to_string(u.physical_handles) +
         " reservations=" + std::to_string(u.reservations) +
         " mappings=" + std::to_string(u.mappings) + " events=" + std::to_string(u.events);
}

/// Expects `stmt` to throw backend_error and to leave device `dev`'s usage unchanged.
#define EXPECT_REJECTED(sim, dev, stmt)                                               \
  do {                                                                                \
    const SimUsage before_ = (sim).usage(dev);                                        \
    EXPECT_THROW(stmt, ::stitch::backend_error);                                      \
    const SimUsage after_ = (sim).usage(dev);                                         \
    EXPECT_TRUE(same(before_, after_)) << show(before_) << "\nvs\n" << show(after_); \
  } while (0)

std::size_t resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long size = 0;
  unsigned long resident = 0;
  const int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)) : 0;
}

TEST(SimBackend, DefaultsDescribeAnEightyGigabyteDevice) {
  SimBackend sim;
  EXPECT_STREQ(sim.name(), "sim");
  EXPECT_EQ(sim.device_count(), 1);
  EXPECT_EQ(sim.memory_info(0).total, std::size_t{80} * kGiB);
  EXPECT_EQ(sim.memory_info(0).free, std::size_t{80} * kGiB);
  EXPECT_EQ(sim.granularity(0), kGran);
  EXPECT_TRUE(sim.supports_virtual_memory(0));
}

TEST(SimBackend, CapacityIsEnforcedAndReported) {
  SimBackend sim(small(64 * kMiB));
  void* a = sim.allocate(0, 40 * kMiB);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(sim.memory_info(0).free, 24 * kMiB);
  EXPECT_EQ(sim.allocate(0, 24 * kMiB + 1), nullptr);  // out of memory: nullptr, no throw
  EXPECT_EQ(sim.create_physical(0, 26 * kMiB), 0u);
  const phys_handle_t h = sim.create_physical(0, 8 * kMiB);  // physical memory counts too
  ASSERT_NE(h, 0u);
  EXPECT_EQ(sim.memory_info(0).free, 16 * kMiB);
  void* b = sim.allocate(0, 16 * kMiB);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(sim.memory_info(0).free, 0u);
  EXPECT_EQ(sim.allocate(0, 1), nullptr);
  // Reservations are free.
  void* va = sim.reserve(0, 1 * kGiB, 0);
  ASSERT_NE(va, nullptr);
  EXPECT_EQ(sim.memory_info(0).free, 0u);

  sim.deallocate(0, b, 16 * kMiB);
  sim.release_physical(0, h);
  sim.release_reservation(0, va, 1 * kGiB);
  EXPECT_EQ(sim.memory_info(0).free, 24 * kMiB);

  // Lowering the capacity below what is in use: free clamps at 0, requests fail.
  sim.set_capacity(0, 32 * kMiB);
  EXPECT_EQ(sim.memory_info(0).total, 32 * kMiB);
  EXPECT_EQ(sim.memory_info(0).free, 0u);
  EXPECT_EQ(sim.usage(0).used, 40 * kMiB);
  EXPECT_EQ(sim.allocate(0, 1), nullptr);
  EXPECT_EQ(sim.create_physical(0, kGran), 0u);
  sim.deallocate(0, a, 40 * kMiB);
  EXPECT_EQ(sim.memory_info(0).free, 32 * kMiB);
  // Raising it beyond the initial size works for physical memory too (the memfd grows).
  sim.set_capacity(0, 128 * kMiB);
  const phys_handle_t big = sim.create_physical(0, 128 * kMiB);
  ASSERT_NE(big, 0u);
  sim.release_physical(0, big);
  EXPECT_EQ(sim.usage(0).used, 0u);
}

TEST(SimBackend, AllocationsAreRealAlignedMemory) {
  SimBackend sim(small());
  std::vector<std::pair<unsigned char*, std::size_t>> blocks;
  for (std::size_t bytes : {std::size_t{1}, std::size_t{511}, std::size_t{4099}, 3 * kMiB + 7}) {
    auto* p = static_cast<unsigned char*>(sim.allocate(0, bytes));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 512, 0u);
    for (std::size_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(i * 7 + bytes);
    blocks.emplace_back(p, bytes);
  }
  EXPECT_EQ(sim.usage(0).allocations, 4u);
  for (auto [p, bytes] : blocks) {
    for (std::size_t i = 0; i < bytes; ++i) {
      ASSERT_EQ(p[i], static_cast<unsigned char>(i * 7 + bytes)) << i;
    }
    sim.deallocate(0, p, bytes);
  }
  EXPECT_EQ(sim.usage(0).allocations, 0u);
  EXPECT_EQ(sim.usage(0).used, 0u);
  sim.deallocate(0, nullptr, 0);  // like cudaFree(nullptr)
}

TEST(SimBackend, HugeAllocationCostsNothingUntilTouched) {
  SimBackend sim;  // 80 GiB
  const std::size_t rss_before = resident_bytes();
  auto* p = static_cast<unsigned char*>(sim.allocate(0, 64 * kGiB));
  ASSERT_NE(p, nullptr);
  p[0] = 1;
  p[64 * kGiB - 1] = 2;
  EXPECT_EQ(p[0] + p[64 * kGiB - 1], 3);
  EXPECT_EQ(sim.memory_info(0).free, 16 * kGiB);
  EXPECT_LT(resident_bytes(), rss_before + 256 * kMiB);
  // Physical memory is sparse too.
  const phys_handle_t h = sim.create_physical(0, 16 * kGiB);
  ASSERT_NE(h, 0u);
  EXPECT_EQ(sim.memory_info(0).free, 0u);
  sim.release_physical(0, h);
  sim.deallocate(0, p, 64 * kGiB);
  EXPECT_EQ(sim.memory_info(0).free, 80 * kGiB);
}

TEST(SimBackend, TwoRangesMappedToOneHandleShareBytes) {
  SimBackend sim(small());
  auto* a = static_cast<unsigned char*>(sim.reserve(0, 4 * kGran, 0));
  auto* b = static_cast<unsigned char*>(sim.reserve(0, 2 * kGran, 8 * kGran));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % kGran, 0u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b) % (8 * kGran), 0u);
  EXPECT_EQ(sim.usage(0).used, 0u);

  const phys_handle_t h = sim.create_physical(0, 2 * kGran);
  ASSERT_NE(h, 0u);
  EXPECT_EQ(sim.usage(0).used, 2 * kGran);
  ASSERT_TRUE(sim.map(0, a + 2 * kGran, 2 * kGran, h));
  ASSERT_TRUE(sim.map(0, b, 2 * kGran, h));
  EXPECT_EQ(sim.usage(0).mappings, 2u);
  std::memset(a + 2 * kGran, 0x5a, 2 * kGran);
  EXPECT_EQ(b[0], 0x5a);
  EXPECT_EQ(b[2 * kGran - 1], 0x5a);
  b[12345] = 0x11;
  EXPECT_EQ(a[2 * kGran + 12345], 0x11);

  // Unmapping keeps the reservation: the range can be mapped again and the data is still there.
  sim.unmap(0, b, 2 * kGran);
  EXPECT_EQ(sim.usage(0).mappings, 1u);
  EXPECT_EQ(sim.usage(0).reservations, 2u);
  ASSERT_TRUE(sim.map(0, b, 2 * kGran, h));
  EXPECT_EQ(b[12345], 0x11);

  // Released while mapped twice: freed only when the last of the two mappings goes.
  sim.release_physical(0, h);
  sim.unmap(0, a + 2 * kGran, 2 * kGran);
  EXPECT_EQ(sim.usage(0).used, 2 * kGran);
  EXPECT_EQ(b[12345], 0x11);
  sim.unmap(0, b, 2 * kGran);
  EXPECT_EQ(sim.usage(0).used, 0u);
  sim.release_reservation(0, a, 4 * kGran);
  sim.release_reservation(0, b, 2 * kGran);
  EXPECT_TRUE(same(sim.usage(0), SimUsage{64 * kMiB, 0, 0, 0, 0, 0, 0}));
}

TEST(SimBackend, UnmapSpanningSeveralMappings) {
  SimBackend sim(small());
  auto* va = static_cast<unsigned char*>(sim.reserve(0, 3 * kGran, 0));
  ASSERT_NE(va, nullptr);
  phys_handle_t h[3];
  for (int i = 0; i < 3; ++i) {
    h[i] = sim.create_physical(0, kGran);
    ASSERT_NE(h[i], 0u);
    ASSERT_TRUE(sim.map(0, va + i * kGran, kGran, h[i]));
    sim.release_physical(0, h[i]);  // freed when unmapped
  }
  std::memset(va, 1, 3 * kGran);  // one contiguous writable range
  EXPECT_EQ(sim.usage(0).used, 3 * kGran);
  // Partial coverage is rejected: not starting at a mapping, or ending inside one.
  EXPECT_REJECTED(sim, 0, sim.unmap(0, va + kGran / 2, kGran));
  EXPECT_REJECTED(sim, 0, sim.unmap(0, va, kGran + kGran / 2));
  EXPECT_REJECTED(sim, 0, sim.unmap(0, va, 4 * kGran));
  sim.unmap(0, va, 2 * kGran);  // two mappings at once
  EXPECT_EQ(sim.usage(0).mappings, 1u);
  EXPECT_EQ(sim.usage(0).used, kGran);
  EXPECT_EQ(va[2 * kGran], 1);
  sim.unmap(0, va + 2 * kGran, kGran);
  EXPECT_EQ(sim.usage(0).used, 0u);
  EXPECT_EQ(sim.usage(0).physical_handles, 0u);
  sim.release_reservation(0, va, 3 * kGran);
}

TEST(SimBackend, ReleasePhysicalWhileMappedDefersTheFree) {
  SimBackend sim(small(4 * kGran));
  auto* va = static_cast<unsigned char*>(sim.reserve(0, kGran, 0));
  const phys_handle_t h = sim.create_physical(0, kGran);
  ASSERT_NE(h, 0u);
  ASSERT_TRUE(sim.map(0, va, kGran, h));
  std::memset(va, 0x77, kGran);
  sim.release_physical(0, h);
  EXPECT_EQ(sim.usage(0).used, kGran);
  EXPECT_EQ(sim.usage(0).physical_handles, 1u);
  EXPECT_EQ(va[kGran - 1], 0x77);  // still backed
  // The handle is gone for callers.
  EXPECT_REJECTED(sim, 0, sim.release_physical(0, h));
  auto* other = static_cast<unsigned char*>(sim.reserve(0, kGran, 0));
  EXPECT_REJECTED(sim, 0, (void)sim.map(0, other, kGran, h));
  sim.unmap(0, va, kGran);
  EXPECT_EQ(sim.usage(0).used, 0u);
  EXPECT_EQ(sim.usage(0).physical_handles, 0u);

  // The hole was punched: the next handle over the same range reads zeros.
  const phys_handle_t h2 = sim.create_physical(0, kGran);
  ASSERT_NE(h2, 0u);
  EXPECT_NE(h2, h);
  ASSERT_TRUE(sim.map(0, other, kGran, h2));
  EXPECT_EQ(other[0], 0);
  EXPECT_EQ(other[kGran - 1], 0);
  sim.unmap(0, other, kGran);
  sim.release_physical(0, h2);
  sim.release_reservation(0, va, kGran);
  sim.release_reservation(0, other, kGran);
}

TEST(SimBackend, FragmentedPhysicalMemoryStillServesWholeCapacity) {
  SimBackend sim(small(4 * kGran));
  phys_handle_t h[4];
  for (auto& x : h) {
    x = sim.create_physical(0, kGran);
    ASSERT_NE(x, 0u);
  }
  EXPECT_EQ(sim.create_physical(0, kGran), 0u);
  sim.release_physical(0, h[0]);
  sim.release_physical(0, h[2]);
  // 2 granules free but not contiguous in the memfd.
  const phys_handle_t big = sim.create_physical(0, 2 * kGran);
  ASSERT_NE(big, 0u);
  auto* va = static_cast<unsigned char*>(sim.reserve(0, 2 * kGran, 0));
  ASSERT_TRUE(sim.map(0, va, 2 * kGran, big));
  std::memset(va, 3, 2 * kGran);
  sim.unmap(0, va, 2 * kGran);
  sim.release_reservation(0, va, 2 * kGran);
  sim.release_physical(0, big);
  sim.release_physical(0, h[1]);
  sim.release_physical(0, h[3]);
  EXPECT_EQ(sim.usage(0).used, 0u);
  // Coalesced again: the whole capacity in one handle.
  const phys_handle_t all = sim.create_physical(0, 4 * kGran);
  ASSERT_NE(all, 0u);
  sim.release_physical(0, all);
}

TEST(SimBackend, InvalidCallsThrowAndChangeNothing) {
  SimBackend sim(small());
  void* p = sim.allocate(0, 1000);
  ASSERT_NE(p, nullptr);
  auto* va = static_cast<unsigned char*>(sim.reserve(0, 4 * kGran, 0));
  ASSERT_NE(va, nullptr);
  const phys_handle_t h = sim.create_physical(0, kGran);
  ASSERT_NE(h, 0u);
  ASSERT_TRUE(sim.map(0, va, kGran, h));
  int local = 0;

  // Plain memory.
  EXPECT_REJECTED(sim, 0, sim.deallocate(0, p, 999));
  EXPECT_REJECTED(sim, 0, sim.deallocate(0, &local, 4));
  EXPECT_REJECTED(sim, 0, sim.deallocate(0, static_cast<char*>(p) + 512, 488));
  EXPECT_REJECTED(sim, 0, (void)sim.allocate(0, 0));
  // Double map / overlapping map, map outside a reservation, wrong size, unknown handle.
  EXPECT_REJECTED(sim, 0, (void)sim.map(0, va, kGran, h));
  const phys_handle_t h2 = sim.create_physical(0, 2 * kGran);
  EXPECT_REJECTED(sim, 0, (void)sim.map(0, va, 2 * kGran, h2));          // overlaps [va, va+g)
  EXPECT_REJECTED(sim, 0, (void)sim.map(0, va + 3 * kGran, 2 * kGran, h2));  // runs past the end
  const phys_handle_t h1 = sim.create_physical(0, kGran);
  EXPECT_REJECTED(sim, 0, (void)sim.map(0, va + kGran, 2 * kGran, h1));  // past the handle
  EXPECT_REJECTED(sim, 0, (void)sim.map(0, va + kGran, kGran / 2, h2));  // not whole granules
  EXPECT_REJECTED(sim, 0, (void)sim.map(0, va + kGran, 0, h2));          // nothing
  EXPECT_REJECTED(sim, 0, (void)sim.map(0, va + kGran + 4096, 2 * kGran, h2));  // misaligned
  EXPECT_REJECTED(sim, 0, (void)sim.map(0, &local, 2 * kGran, h2));
  EXPECT_REJECTED(sim, 0, (void)sim.map(0, va + kGran, 2 * kGran, 999999));
  EXPECT_REJECTED(sim, 0, (void)sim.map(0, va + kGran, 2 * kGran, 0));
  sim.release_physical(0, h1);
  // Unmap of unmapped or partially mapped ranges.
  EXPECT_REJECTED(sim, 0, sim.unmap(0, va + kGran, kGran));
  EXPECT_REJECTED(sim, 0, sim.unmap(0, va, 2 * kGran));
  EXPECT_REJECTED(sim, 0, sim.unmap(0, va, 0));
  // Reservations.
  EXPECT_REJECTED(sim, 0, sim.release_reservation(0, va, 4 * kGran));  // still mapped
  EXPECT_REJECTED(sim, 0, sim.release_reservation(0, va, 2 * kGran));  // wrong size
  EXPECT_REJECTED(sim, 0, sim.release_reservation(0, va + kGran, 3 * kGran));
  EXPECT_REJECTED(sim, 0, (void)sim.reserve(0, kGran + 4096, 0));
  EXPECT_REJECTED(sim, 0, (void)sim.reserve(0, kGran, 3 * kGran));
  // Physical memory.
  EXPECT_REJECTED(sim, 0, (void)sim.create_physical(0, kGran / 2));
  EXPECT_REJECTED(sim, 0, (void)sim.create_physical(0, 0));
  EXPECT_REJECTED(sim, 0, sim.release_physical(0, 424242));
  // Events.
  EXPECT_REJECTED(sim, 0, sim.destroy_event(0, &local));
  EXPECT_REJECTED(sim, 0, sim.record_event(0, &local, nullptr));
  EXPECT_REJECTED(sim, 0, (void)sim.query_event(0, &local));
  EXPECT_REJECTED(sim, 0, sim.synchronize_event(0, &local));
  // Bad device.
  EXPECT_REJECTED(sim, 0, (void)sim.allocate(1, 10));
  EXPECT_REJECTED(sim, 0, (void)sim.allocate(-1, 10));
  EXPECT_REJECTED(sim, 0, sim.deallocate(1, p, 1000));
  EXPECT_REJECTED(sim, 0, (void)sim.memory_info(1));
  EXPECT_REJECTED(sim, 0, (void)sim.granularity(7));
  EXPECT_REJECTED(sim, 0, (void)sim.create_event(1));
  EXPECT_REJECTED(sim, 0, (void)sim.reserve(2, kGran, 0));
  EXPECT_REJECTED(sim, 0, sim.synchronize_stream(-3, nullptr));
  EXPECT_THROW((void)sim.usage(1), backend_error);
  EXPECT_THROW(sim.set_capacity(1, 0), backend_error);

  try {
    sim.deallocate(0, p, 999);
    ADD_FAILURE() << "no throw";
  } catch (const backend_error& e) {
    EXPECT_NE(std::string(e.what()).find("1000 bytes, not 999"), std::string::npos) << e.what();
  }
  // Everything still works after the rejected calls.
  va[0] = 9;
  sim.unmap(0, va, kGran);
  sim.release_physical(0, h);
  sim.release_physical(0, h2);
  sim.release_reservation(0, va, 4 * kGran);
  sim.deallocate(0, p, 1000);
  EXPECT_TRUE(same(sim.usage(0), SimUsage{64 * kMiB, 0, 0, 0, 0, 0, 0}));
}

TEST(SimBackend, HeldStreamsKeepEventsIncomplete) {
  SimBackend sim(small());
  int tag1 = 0;
  int tag2 = 0;
  stream_t s1 = &tag1;
  stream_t s2 = &tag2;
  event_t never = sim.create_event(0);
  event_t e1 = sim.create_event(0);
  event_t e2 = sim.create_event(0);
  event_t e3 = sim.create_event(0);
  EXPECT_NE(e1, nullptr);
  EXPECT_NE(e1, e2);
  EXPECT_EQ(sim.usage(0).events, 4u);
  EXPECT_TRUE(sim.query_event(0, never));  // never recorded: complete, as in CUDA

  sim.record_event(0, e1, nullptr);
  EXPECT_TRUE(sim.query_event(0, e1));  // unheld streams complete at once

  sim.hold_stream(s1);
  sim.record_event(0, e1, s1);
  sim.record_event(0, e2, s1);
  sim.record_event(0, e3, s2);
  EXPECT_FALSE(sim.query_event(0, e1));
  EXPECT_FALSE(sim.query_event(0, e2));
  EXPECT_TRUE(sim.query_event(0, e3));
  sim.release_stream(s1);
  EXPECT_TRUE(sim.query_event(0, e1));
  EXPECT_TRUE(sim.query_event(0, e2));

  // Released streams complete at once again; re-holding affects only later records.
  sim.record_event(0, e1, s1);
  EXPECT_TRUE(sim.query_event(0, e1));
  sim.hold_stream(s1);
  EXPECT_TRUE(sim.query_event(0, e1));
  sim.record_event(0, e2, s1);
  EXPECT_FALSE(sim.query_event(0, e2));
  // Re-recording an event moves it to the new position.
  sim.record_event(0, e1, s1);
  EXPECT_FALSE(sim.query_event(0, e1));
  sim.record_event(0, e1, s2);
  EXPECT_TRUE(sim.query_event(0, e1));
  EXPECT_FALSE(sim.query_event(0, e2));
  sim.release_stream(s1);
  EXPECT_TRUE(sim.query_event(0, e2));
  EXPECT_EQ(sim.forced_completions(), 0u);

  for (event_t e : {never, e1, e2, e3}) sim.destroy_event(0, e);
  EXPECT_EQ(sim.usage(0).events, 0u);
  EXPECT_REJECTED(sim, 0, sim.destroy_event(0, e1));  // double destroy
}

TEST(SimBackend, SynchronizeOnAHeldStreamForcesCompletion) {
  SimBackend sim(small());
  int tag = 0;
  stream_t s = &tag;
  event_t e1 = sim.create_event(0);
  event_t e2 = sim.create_event(0);
  sim.hold_stream(s);
  sim.record_event(0, e1, s);
  sim.record_event(0, e2, s);

  sim.synchronize_event(0, e1);  // completes the stream up to e1 only
  EXPECT_TRUE(sim.query_event(0, e1));
  EXPECT_FALSE(sim.query_event(0, e2));
  EXPECT_EQ(sim.forced_completions(), 1u);
  sim.synchronize_event(0, e1);  // nothing left to force
  EXPECT_EQ(sim.forced_completions(), 1u);

  sim.synchronize_stream(0, s);
  EXPECT_TRUE(sim.query_event(0, e2));
  EXPECT_EQ(sim.forced_completions(), 2u);

  // Still held for later records.
  sim.record_event(0, e1, s);
  EXPECT_FALSE(sim.query_event(0, e1));
  sim.synchronize_event(0, e1);
  EXPECT_TRUE(sim.query_event(0, e1));
  EXPECT_EQ(sim.forced_completions(), 3u);

  // Unheld or idle streams never force anything.
  sim.synchronize_stream(0, nullptr);
  sim.synchronize_stream(0, s);
  sim.record_event(0, e2, nullptr);
  sim.synchronize_event(0, e2);
  EXPECT_EQ(sim.forced_completions(), 3u);
  sim.destroy_event(0, e1);
  sim.destroy_event(0, e2);
}

TEST(SimBackend, InjectedFaultsFireOnTheNthCall) {
  SimBackend sim(small());
  sim.inject_fault(SimCall::allocate, 2, SimFault::out_of_memory);
  sim.inject_fault(SimCall::allocate, 4, SimFault::error);
  void* a = sim.allocate(0, 100);
  EXPECT_NE(a, nullptr);
  const SimUsage before = sim.usage(0);
  EXPECT_EQ(sim.allocate(0, 100), nullptr);  // 2nd: out of memory
  EXPECT_TRUE(same(before, sim.usage(0)));
  void* c = sim.allocate(0, 100);
  EXPECT_NE(c, nullptr);
  try {
    (void)sim.allocate(0, 100);  // 4th: error
    ADD_FAILURE() << "no throw";
  } catch (const backend_error& e) {
    EXPECT_STREQ(e.what(), "sim: injected fault in allocate");
  }
  void* d = sim.allocate(0, 100);
  EXPECT_NE(d, nullptr);
  EXPECT_EQ(sim.call_count(SimCall::allocate), 5u);
  EXPECT_EQ(sim.faults_fired(), 2u);
  EXPECT_EQ(sim.usage(0).allocations, 3u);

  // Counted from the time of arming; out_of_memory on a call that cannot report it throws.
  sim.inject_fault(SimCall::deallocate, 1, SimFault::out_of_memory);
  EXPECT_REJECTED(sim, 0, sim.deallocate(0, a, 100));
  sim.deallocate(0, a, 100);
  EXPECT_EQ(sim.call_count(SimCall::deallocate), 2u);

  // Virtual memory calls.
  sim.inject_fault(SimCall::reserve, 1, SimFault::out_of_memory);
  sim.inject_fault(SimCall::create_physical, 1, SimFault::out_of_memory);
  sim.inject_fault(SimCall::map, 1, SimFault::error);
  EXPECT_EQ(sim.reserve(0, kGran, 0), nullptr);
  EXPECT_EQ(sim.create_physical(0, kGran), 0u);
  void* va = sim.reserve(0, kGran, 0);
  const phys_handle_t h = sim.create_physical(0, kGran);
  ASSERT_NE(va, nullptr);
  ASSERT_NE(h, 0u);
  EXPECT_REJECTED(sim, 0, (void)sim.map(0, va, kGran, h));
  ASSERT_TRUE(sim.map(0, va, kGran, h));
  EXPECT_EQ(sim.faults_fired(), 6u);

  // Several armed faults; clear_faults disarms them all.
  sim.inject_fault(SimCall::unmap, 1, SimFault::error);
  sim.inject_fault(SimCall::query_event, 1, SimFault::error);
  sim.inject_fault(SimCall::create_event, 3, SimFault::error);
  sim.clear_faults();
  sim.unmap(0, va, kGran);
  event_t e = sim.create_event(0);
  EXPECT_TRUE(sim.query_event(0, e));
  // Events and streams too.
  sim.inject_fault(SimCall::record_event, 1, SimFault::error);
  sim.inject_fault(SimCall::synchronize_stream, 2, SimFault::error);
  EXPECT_REJECTED(sim, 0, sim.record_event(0, e, nullptr));
  sim.synchronize_stream(0, nullptr);
  EXPECT_REJECTED(sim, 0, sim.synchronize_stream(0, nullptr));
  EXPECT_EQ(sim.faults_fired(), 8u);
  EXPECT_EQ(sim.call_count(SimCall::synchronize_stream), 2u);
  EXPECT_EQ(sim.call_count(SimCall::record_event), 1u);
  EXPECT_EQ(sim.call_count(SimCall::map), 2u);
  EXPECT_EQ(sim.call_count(SimCall::release_reservation), 0u);

  EXPECT_THROW(sim.inject_fault(SimCall::map, 0, SimFault::error), invalid_argument);
  EXPECT_THROW(sim.inject_fault(SimCall::count_, 1, SimFault::error), invalid_argument);
  sim.destroy_event(0, e);
  sim.release_physical(0, h);
  sim.release_reservation(0, va, kGran);
  sim.deallocate(0, c, 100);
  sim.deallocate(0, d, 100);
  EXPECT_TRUE(same(sim.usage(0), SimUsage{64 * kMiB, 0, 0, 0, 0, 0, 0}));
}

TEST(SimBackend, DevicesAreIndependent) {
  SimBackend sim(small(16 * kMiB, 2));
  ASSERT_EQ(sim.device_count(), 2);
  void* a = sim.allocate(0, 16 * kMiB);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(sim.memory_info(0).free, 0u);
  EXPECT_EQ(sim.memory_info(1).free, 16 * kMiB);
  const phys_handle_t h = sim.create_physical(1, 8 * kMiB);
  ASSERT_NE(h, 0u);
  void* va0 = sim.reserve(0, 8 * kMiB, 0);
  void* va1 = sim.reserve(1, 8 * kMiB, 0);
  event_t e0 = sim.create_event(0);

  // Objects of one device are unknown to the other.
  EXPECT_REJECTED(sim, 1, sim.deallocate(1, a, 16 * kMiB));
  EXPECT_REJECTED(sim, 0, sim.release_physical(0, h));
  EXPECT_REJECTED(sim, 0, (void)sim.map(0, va0, 8 * kMiB, h));
  EXPECT_REJECTED(sim, 1, sim.release_reservation(1, va0, 8 * kMiB));
  EXPECT_REJECTED(sim, 1, sim.destroy_event(1, e0));
  EXPECT_REJECTED(sim, 1, sim.record_event(1, e0, nullptr));
  try {
    sim.deallocate(1, a, 16 * kMiB);
  } catch (const backend_error& e) {
    EXPECT_NE(std::string(e.what()).find("allocated on device 0"), std::string::npos) << e.what();
  }

  ASSERT_TRUE(sim.map(1, va1, 8 * kMiB, h));
  std::memset(va1, 4, 8 * kMiB);
  sim.set_capacity(1, 4 * kMiB);
  EXPECT_EQ(sim.memory_info(0).total, 16 * kMiB);
  EXPECT_EQ(sim.usage(1).capacity, 4 * kMiB);
  sim.unmap(1, va1, 8 * kMiB);
  sim.release_physical(1, h);
  sim.release_reservation(1, va1, 8 * kMiB);
  sim.release_reservation(0, va0, 8 * kMiB);
  sim.destroy_event(0, e0);
  sim.deallocate(0, a, 16 * kMiB);
  EXPECT_EQ(sim.usage(0).used, 0u);
  EXPECT_EQ(sim.usage(1).used, 0u);
}

TEST(SimBackend, DestructorReleasesEverythingStillLive) {
  // ASan reports the events and the host mappings' bookkeeping if anything leaks.
  auto sim = std::make_unique<SimBackend>(small());
  (void)sim->allocate(0, 4096);
  auto* va = static_cast<unsigned char*>(sim->reserve(0, 2 * kGran, 0));
  const phys_handle_t h = sim->create_physical(0, kGran);
  ASSERT_TRUE(sim->map(0, va, kGran, h));
  (void)sim->create_physical(0, kGran);
  (void)sim->create_event(0);
  va[0] = 1;
  sim.reset();
}

TEST(SimBackend, InvalidOptionsAreRejected) {
  SimBackend::Options o;
  o.devices = 0;
  EXPECT_THROW(SimBackend{o}, backend_error);
  o.devices = 1;
  o.granularity = 3 * kMiB;
  EXPECT_THROW(SimBackend{o}, backend_error);
}

TEST(SimBackend, CallNames) {
  EXPECT_STREQ(to_string(SimCall::allocate), "allocate");
  EXPECT_STREQ(to_string(SimCall::release_reservation), "release_reservation");
  EXPECT_STREQ(to_string(SimCall::synchronize_stream), "synchronize_stream");
  EXPECT_STREQ(to_string(SimCall::count_), "count_");
}

TEST(SimBackend, ConcurrentUseIsSafe) {
  SimBackend sim(small(256 * kMiB, 2));
  constexpr int kThreads = 8;
  constexpr int kIterations = 200;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const int dev = t % 2;
      int tag = 0;
      stream_t stream = (t % 4 == 0) ? nullptr : &tag;
      event_t e = sim.create_event(dev);
      auto* va = static_cast<unsigned char*>(sim.reserve(dev, 2 * kGran, 0));
      for (int i = 0; i < kIterations; ++i) {
        const std::size_t bytes = 4096 + static_cast<std::size_t>((i * 131 + t) % 50000);
        auto* p = static_cast<unsigned char*>(sim.allocate(dev, bytes));
        if (p == nullptr) {
          ++failures;
          continue;
        }
        p[0] = static_cast<unsigned char>(t);
        p[bytes - 1] = static_cast<unsigned char>(i);
        if (i % 10 == 0) {
          const phys_handle_t h = sim.create_physical(dev, kGran);
          if (h != 0) {
            ASSERT_TRUE(sim.map(dev, va, kGran, h));
            ASSERT_TRUE(sim.map(dev, va + kGran, kGran, h));
            // volatile: the two addresses alias through the mapping, which the compiler
            // cannot see; it would otherwise read the second before writing the first.
            volatile unsigned char* v = va;
            v[7] = static_cast<unsigned char>(i);
            if (v[kGran + 7] != static_cast<unsigned char>(i)) ++failures;
            sim.release_physical(dev, h);
            sim.unmap(dev, va, 2 * kGran);
          }
        }
        sim.record_event(dev, e, stream);
        if (!sim.query_event(dev, e)) ++failures;
        if (p[0] != static_cast<unsigned char>(t)) ++failures;
        sim.deallocate(dev, p, bytes);
      }
      sim.release_reservation(dev, va, 2 * kGran);
      sim.destroy_event(dev, e);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  for (int dev = 0; dev < 2; ++dev) {
    EXPECT_TRUE(same(sim.usage(dev), SimUsage{256 * kMiB, 0, 0, 0, 0, 0, 0}))
        << show(sim.usage(dev));
  }
  EXPECT_EQ(sim.call_count(SimCall::allocate), std::uint64_t{kThreads} * kIterations);
}

}  // namespace
}  // namespace stitch

namespace stitch {
namespace {

TEST(SimBackendCopy, CopiesMappedMemoryAndRefusesTheRest) {
  SimBackend::Options o;
  o.capacity = 64 << 20;
  SimBackend sim(o);
  const std::size_t g = sim.granularity(0);
  auto* va = static_cast<char*>(sim.reserve(0, 4 * g, g));
  const phys_handle_t h = sim.create_physical(0, 2 * g);
  ASSERT_TRUE(sim.map(0, va, 2 * g, h));
  std::memset(va, 0x5a, g);
  sim.copy(0, va + g, va, g, nullptr);
  EXPECT_EQ(static_cast<unsigned char>(va[g + 123]), 0x5a);
  EXPECT_EQ(sim.call_count(SimCall::copy), 1u);
  EXPECT_EQ(sim.call_bytes(SimCall::copy), g);
  // Unmapped, partly mapped or overlapping ranges are refused, and nothing moves.
  EXPECT_THROW(sim.copy(0, va + 2 * g, va, g, nullptr), backend_error);
  EXPECT_THROW(sim.copy(0, va + g + g / 2, va, g, nullptr), backend_error);
  EXPECT_THROW(sim.copy(0, va + g / 2, va, g, nullptr), backend_error);
  // A copy on a capturing stream, or a device sync while one captures, breaks the capture.
  stream_t s = reinterpret_cast<stream_t>(0x40);
  sim.begin_capture(0, s);
  EXPECT_THROW(sim.copy(0, va + g, va, 4096, s), backend_error);
  EXPECT_FALSE(sim.end_capture(s));
  sim.begin_capture(0, s);
  EXPECT_THROW(sim.synchronize_device(0), backend_error);
  EXPECT_FALSE(sim.end_capture(s));
  // A held stream's work completes at a device sync (and the stream stays held).
  sim.hold_stream(s);
  event_t e = sim.create_event(0);
  sim.record_event(0, e, s);
  EXPECT_FALSE(sim.query_event(0, e));
  sim.synchronize_device(0);
  EXPECT_TRUE(sim.query_event(0, e));
  sim.destroy_event(0, e);
  sim.release_stream(s);
  // Faults reach copies and syncs like every other call.
  sim.inject_fault(SimCall::copy, 1, SimFault::error);
  EXPECT_THROW(sim.copy(0, va + g, va, 4096, nullptr), backend_error);
  sim.inject_fault(SimCall::synchronize_device, 1, SimFault::error);
  EXPECT_THROW(sim.synchronize_device(0), backend_error);
  // A device that moves no data (a replay's) still checks and counts.
  SimBackend::Options quiet = o;
  quiet.copy_data = false;
  SimBackend replay(quiet);
  auto* rv = static_cast<char*>(replay.reserve(0, 2 * g, g));
  const phys_handle_t rh = replay.create_physical(0, 2 * g);
  ASSERT_TRUE(replay.map(0, rv, 2 * g, rh));
  std::memset(rv, 1, 16);
  std::memset(rv + g, 2, 16);
  replay.copy(0, rv + g, rv, 16, nullptr);
  EXPECT_EQ(rv[g], 2);
  EXPECT_EQ(replay.call_count(SimCall::copy), 1u);
  replay.unmap(0, rv, 2 * g);
  replay.release_physical(0, rh);
  replay.release_reservation(0, rv, 2 * g);
  sim.unmap(0, va, 2 * g);
  sim.release_physical(0, h);
  sim.release_reservation(0, va, 4 * g);
}

TEST(SimBackend, HostPagesAndPinnedHostMemoryShareTheHostBudget) {
  SimBackend::Options o;
  o.capacity = std::size_t{8} << 20;
  o.host_capacity = std::size_t{6} << 20;  // sim_host_mb:6
  o.host_granularity = std::size_t{4} << 20;
  SimBackend sim(o);
  const std::size_t hg = sim.host_granularity(0);
  ASSERT_EQ(hg, std::size_t{4} << 20);
  const phys_handle_t h = sim.create_host_physical(0, hg);
  ASSERT_NE(h, 0u);
  EXPECT_EQ(sim.usage(0).host_pages, hg);
  EXPECT_EQ(sim.usage(0).used, 0u) << "host pages are not device memory";
  EXPECT_EQ(sim.memory_info(0).free, o.capacity);
  EXPECT_EQ(sim.create_host_physical(0, hg), 0u) << "past sim_host_mb: out of memory";
  EXPECT_EQ(sim.allocate_host(0, std::size_t{3} << 20), nullptr) << "one budget for both";
  void* pinned = sim.allocate_host(0, std::size_t{2} << 20);
  ASSERT_NE(pinned, nullptr);
  EXPECT_THROW((void)sim.create_host_physical(0, std::size_t{2} << 20), backend_error) << "off the host granularity";
  // Mapped beside device memory in one range: one memory at one address.
  auto* va = static_cast<char*>(sim.reserve(0, 2 * hg, hg));
  const phys_handle_t d = sim.create_physical(0, hg);
  ASSERT_NE(d, 0u);
  const MapPiece pieces[] = {{d, hg}, {h, hg}};
  ASSERT_TRUE(sim.map_run(0, va, pieces, 2));
  std::memset(va + hg, 0x5c, 64);
  EXPECT_EQ(static_cast<unsigned char>(va[hg + 63]), 0x5c);
  sim.unmap(0, va, 2 * hg);
  sim.release_physical(0, h);
  sim.release_physical(0, d);
  sim.release_reservation(0, va, 2 * hg);
  sim.deallocate_host(0, pinned, std::size_t{2} << 20);
  EXPECT_EQ(sim.usage(0).host_pages, 0u);
  EXPECT_EQ(sim.usage(0).used, 0u);
  // Faults at the new call.
  sim.inject_fault(SimCall::create_host_physical, 1, SimFault::out_of_memory);
  EXPECT_EQ(sim.create_host_physical(0, hg), 0u);
  sim.inject_fault(SimCall::create_host_physical, 1, SimFault::error);
  EXPECT_THROW((void)sim.create_host_physical(0, hg), backend_error);
}

}  // namespace
}  // namespace stitch
