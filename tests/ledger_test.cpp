// The ledger (core/ledger.hpp): what a device holds from its backend and the memory-fraction cap
// it must stay under (set_memory_fraction, per_process_memory_fraction, the ladder under a cap).
#include <gtest/gtest.h>

#include "core/ledger.hpp"
#include "diagnostics/recorder.hpp"
#include "support/allocator_fixture.hpp"

namespace stitch {
namespace {

using namespace stitch::test;

// ---- memory fraction -----------------------------------------------------------------------------

TEST_F(AllocatorTest, SetMemoryFractionCapsReservedMemory) {
  a().set_memory_fraction(0.25, 0);  // 256 MiB of 1 GiB
  void* p = a().allocate(200 * MiB);
  std::string msg;
  try {
    (void)a().allocate(100 * MiB);
  } catch (const out_of_memory& e) {
    msg = e.what();
  }
  ASSERT_FALSE(msg.empty()) << "expected an OOM";
  EXPECT_TRUE(contains(msg, "The memory fraction allows 256.00 MiB")) << msg;
  EXPECT_LE(st("reserved_bytes.all.current"), I(256 * MiB));
  EXPECT_EQ(sim().usage(0).used, 200 * MiB);
  (void)p;
}

TEST_F(AllocatorTest, SetMemoryFractionOfOneRemovesTheCap) {
  a().set_memory_fraction(0.25, 0);
  (void)a().allocate(200 * MiB);
  EXPECT_THROW((void)a().allocate(100 * MiB), out_of_memory);
  a().set_memory_fraction(1.0, 0);
  EXPECT_NE(a().allocate(100 * MiB), nullptr);
}

TEST_F(AllocatorTest, SetMemoryFractionRejectsBadArguments) {
  EXPECT_THROW(a().set_memory_fraction(1.5, 0), invalid_argument);
  EXPECT_THROW(a().set_memory_fraction(-0.1, 0), invalid_argument);
  EXPECT_THROW(a().set_memory_fraction(0.5, 1), invalid_argument);
  EXPECT_THROW(a().set_memory_fraction(0.5, -1), invalid_argument);
}

TEST_F(AllocatorTest, SetMemoryFractionAppliesToOneDevice) {
  make("", GiB, 2);
  a().set_memory_fraction(0.25, 1);
  EXPECT_NE(a().allocate(500 * MiB, nullptr, 0), nullptr);
  EXPECT_THROW((void)a().allocate(500 * MiB, nullptr, 1), out_of_memory);
}

TEST_F(AllocatorTest, PerProcessMemoryFractionKeyCapsReservedMemory) {
  make("per_process_memory_fraction:0.25");
  (void)a().allocate(200 * MiB);
  std::string msg;
  try {
    (void)a().allocate(100 * MiB);
  } catch (const out_of_memory& e) {
    msg = e.what();
  }
  EXPECT_TRUE(contains(msg, "The memory fraction allows")) << msg;
  EXPECT_LE(st("reserved_bytes.all.current"), I(256 * MiB));
}

TEST_F(AllocatorTest, MemoryFractionLadderReleasesCacheBeforeGivingUp) {
  a().set_memory_fraction(0.25, 0);
  void* p = a().allocate(200 * MiB, S(1));
  a().deallocate(p);
  // 200 cached + 150 > 256 allowed: the cached segment is released and the request served.
  EXPECT_NE(a().allocate(150 * MiB, S(2)), nullptr);
  EXPECT_EQ(st("num_alloc_retries"), 1);
  EXPECT_EQ(st("reserved_bytes.all.current"), I(150 * MiB));
}

TEST_F(AllocatorTest, ConfigureKeepsAMemoryFractionSetAtRunTime) {
  // set_memory_fraction() is a run-time setting; applying an unrelated tunable must not undo it.
  a().set_memory_fraction(0.25, 0);
  a().configure("max_split_size_mb:64");
  EXPECT_THROW((void)a().allocate(500 * MiB), out_of_memory);
}

TEST_F(AllocatorTest, ConfigureAppliesAnExplicitFractionAfterARunTimeChange) {
  // A fraction named in configure() is the cap afterwards, even if it equals the fraction the
  // allocator was built with and set_memory_fraction() changed it in between.
  make("per_process_memory_fraction:0.25");
  a().set_memory_fraction(1.0, 0);
  a().configure("per_process_memory_fraction:0.25");
  EXPECT_THROW((void)a().allocate(500 * MiB), out_of_memory);
}

}  // namespace
}  // namespace stitch

namespace stitch::detail {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

// ---- Ledger ---------------------------------------------------------------------------------

TEST(Ledger, BooksSegmentsAndPagesAndHoldsTheCap) {
  DeviceStats stats;
  Recorder history;
  history.configure(true, 64, false);
  Ledger ledger(stats, history);
  EXPECT_TRUE(ledger.fits(SIZE_MAX / 2));
  EXPECT_EQ(ledger.room(), SIZE_MAX);
  char base[1] = {};
  Segment small_seg, big_seg, range;
  small_seg.base = base;
  small_seg.size = 2 * MiB;
  small_seg.small = true;
  big_seg.base = base;
  big_seg.size = 100 * MiB;
  big_seg.oversize = true;
  range.base = base;
  ledger.segment_allocated(small_seg);
  ledger.segment_allocated(big_seg);
  ledger.mapped(range, base, 40 * MiB);
  EXPECT_EQ(ledger.reserved(), 142 * MiB);
  EXPECT_EQ(stats.segment[kAll].current, 2);
  EXPECT_EQ(stats.reserved_bytes[kSmallPool].current, static_cast<std::int64_t>(2 * MiB));
  EXPECT_EQ(stats.oversize_segments.current, 1);
  EXPECT_EQ(stats.num_device_alloc, 3);
  ledger.set_cap(150 * MiB);
  EXPECT_TRUE(ledger.fits(8 * MiB));
  EXPECT_FALSE(ledger.fits(8 * MiB + 1));
  EXPECT_EQ(ledger.room(), 8 * MiB);
  ledger.unmapped(range, base, 40 * MiB);
  ledger.segment_freed(big_seg);
  EXPECT_EQ(ledger.reserved(), 2 * MiB);
  EXPECT_EQ(stats.oversize_segments.current, 0);
  EXPECT_EQ(stats.num_device_free, 2);
  EXPECT_EQ(stats.reserved_bytes[kAll].peak, static_cast<std::int64_t>(142 * MiB));
  ledger.set_cap(MiB);  // below what is held: no room, nothing fits
  EXPECT_EQ(ledger.room(), 0u);
  EXPECT_FALSE(ledger.fits(1));
  // Every change of what is held is in the history too, in order.
  const std::vector<TraceEntry> h = history.entries(false);
  const std::vector<TraceAction> want = {TraceAction::segment_alloc, TraceAction::segment_alloc,
                                         TraceAction::segment_map, TraceAction::segment_unmap,
                                         TraceAction::segment_free};
  ASSERT_EQ(h.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_EQ(h[i].action, want[i]) << i;
  EXPECT_EQ(h[2].size, 40 * MiB);
}

}  // namespace
}  // namespace stitch::detail
