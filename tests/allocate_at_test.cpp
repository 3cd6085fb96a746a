// tests/allocate_at_test.cpp — Allocator::allocate_at (PyTorch's allocateWithAddress, cudagraph
// trees' checkpoints): a block at exactly the address asked, cut from the free block of the
// stream that holds it, in every configuration; the allocator's invariants and statistics hold.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#include "stitch/allocator.hpp"
#include "stitch/config.hpp"
#include "stitch/errors.hpp"

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
stitch::stream_t S(std::uintptr_t n) { return reinterpret_cast<stitch::stream_t>(n); }

class AllocateAt : public ::testing::TestWithParam<const char*> {};

TEST_P(AllocateAt, ABlockAtTheAddressAskedOrNothing) {
  stitch::Allocator a(stitch::Config::parse(std::string("backend:sim,sim_capacity_mb:512,") + GetParam()));
  void* x = a.allocate(6 * MiB, S(1));
  void* y = a.allocate(1 * MiB, S(1));
  a.deallocate(x);
  const auto before = a.stats(0);
  // Inside the free block, at an offset: the space before it stays free.
  char* at = static_cast<char*>(x) + 2 * MiB;
  void* p = a.allocate_at(at, 3 * MiB + 100, S(1), 0);
  ASSERT_EQ(p, at);
  a.validate();
  const auto info = a.find(p);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->requested, 3 * MiB + 100);
  EXPECT_EQ(info->stream, S(1));
  const auto after = a.stats(0);
  EXPECT_EQ(after.allocation[0].current, before.allocation[0].current + 1);
  EXPECT_EQ(after.requested_bytes[0].current, before.requested_bytes[0].current + static_cast<std::int64_t>(3 * MiB + 100));
  EXPECT_EQ(after.reserved_bytes[0].current, before.reserved_bytes[0].current);  // no new memory
  // Not servable: taken, a live block, another stream's free block, past the free block's end.
  EXPECT_EQ(a.allocate_at(at, 4096, S(1), 0), nullptr);
  EXPECT_EQ(a.allocate_at(y, 4096, S(1), 0), nullptr);
  EXPECT_EQ(a.allocate_at(x, 4096, S(2), 0), nullptr);
  EXPECT_EQ(a.allocate_at(x, 3 * MiB, S(1), 0), nullptr);  // runs into the block at `at`
  EXPECT_THROW((void)a.allocate_at(static_cast<char*>(x) + 100, 4096, S(1), 0), stitch::invalid_argument);
  // An explicit block size (a checkpoint's), at the free block's start.
  void* q = a.allocate_at(x, 1000, S(1), 0, 2 * MiB);
  ASSERT_EQ(q, x);
  EXPECT_EQ(a.find(q)->size, 2 * MiB);
  a.validate();
  a.deallocate(p);
  a.deallocate(q);
  a.deallocate(y);
  a.validate();
  a.empty_cache();
  EXPECT_EQ(a.stats(0).reserved_bytes[0].current, 0);
}

INSTANTIATE_TEST_SUITE_P(Configs, AllocateAt,
                         ::testing::Values("", "expandable_segments:True",
                                           "expandable_segments:True,stitching:True"));

}  // namespace
