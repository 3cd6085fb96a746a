// Tests of the size policy (core/size_policy.hpp): request rounding (512 B multiples and
// roundup_power2_divisions), the small/large pool boundary and the size of new segments.
// The expected values are PyTorch's (CUDACachingAllocator round_size / get_allocation_size).
#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdint>

#include "core/constants.hpp"
#include "core/size_policy.hpp"
#include "stitch/config.hpp"

namespace stitch::detail {
namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

using Divisions = std::array<std::uint32_t, 16>;

Divisions none() { return Divisions{}; }

Divisions all(std::uint32_t d) {
  Divisions out{};
  out.fill(d);
  return out;
}

// ---- round_size without divisions ----------------------------------------------------------------

TEST(RoundSize, ZeroBecomesTheMinimumBlock) { EXPECT_EQ(round_size(0, none()), 512u); }

TEST(RoundSize, BelowMinimumBecomesTheMinimumBlock) {
  EXPECT_EQ(round_size(1, none()), 512u);
  EXPECT_EQ(round_size(511, none()), 512u);
}

TEST(RoundSize, ExactMultiplesOf512AreUnchanged) {
  EXPECT_EQ(round_size(512, none()), 512u);
  EXPECT_EQ(round_size(1024, none()), 1024u);
  EXPECT_EQ(round_size(512 * 1001, none()), 512u * 1001);
  EXPECT_EQ(round_size(MiB, none()), MiB);
  EXPECT_EQ(round_size(10 * GiB, none()), 10 * GiB);
}

TEST(RoundSize, RoundsUpToTheNextMultipleOf512) {
  EXPECT_EQ(round_size(513, none()), 1024u);
  EXPECT_EQ(round_size(1000, none()), 1024u);
  EXPECT_EQ(round_size(1200, none()), 1536u);
  EXPECT_EQ(round_size(MiB + 1, none()), MiB + 512);
  EXPECT_EQ(round_size(3 * MiB - 1, none()), 3 * MiB);
}

TEST(RoundSize, ResultIsAlwaysAMultipleOf512AndAtLeastTheRequest) {
  for (std::size_t size = 1; size < 64 * KiB; size += 97) {
    const std::size_t r = round_size(size, none());
    EXPECT_EQ(r % 512, 0u) << size;
    EXPECT_GE(r, size);
    EXPECT_LT(r - size, 512u) << size;
  }
}

TEST(RoundSize, ZeroDivisionsDisableRounding) {
  EXPECT_EQ(round_size(MiB + 512 * 3, all(0)), MiB + 512 * 3);
}

TEST(RoundSize, OneDivisionDisablesRounding) {
  // PyTorch requires divisions > 1 before it rounds to a power-of-two division.
  EXPECT_EQ(round_size(MiB + 512 * 3, all(1)), MiB + 512 * 3);
  EXPECT_EQ(round_size(5 * MiB, all(1)), 5 * MiB);
}

// ---- roundup_power2_divisions --------------------------------------------------------------------

TEST(RoundSizeDivisions, DocsExampleArithmetic1200KiBWith4DivisionsGives1280KiB) {
  // The PyTorch docs' example, at a scale where the division rule applies: 1200 lies between
  // 1024 and 2048, whose 4 divisions are 1024, 1280, 1536, 1792 -> 1280.
  EXPECT_EQ(round_size(1200 * KiB, all(4)), 1280 * KiB);
}

TEST(RoundSizeDivisions, Docs1200BytesWith4DivisionsFollowsPyTorchCode) {
  // The docs say 1200 B with 4 divisions -> 1280 B, but PyTorch's round_size applies divisions
  // only when size > 512 * divisions (2048 here), so 1200 B is rounded to a 512 multiple: 1536.
  // stitch reproduces the code, not the docs' arithmetic at this size.
  EXPECT_EQ(round_size(1200, all(4)), 1536u);
}

TEST(RoundSizeDivisions, DivisionRuleAppliesOnlyAbove512TimesDivisions) {
  // 4 divisions, threshold 2048 B: 4097 B lies in [4096, 8192), steps of 1024 -> 5120
  // (a plain 512 multiple would be 4608).
  EXPECT_EQ(round_size(4097, all(4)), 5120u);
  // 16 divisions, threshold 8192 B: 4097 B is below it, so it stays a 512 multiple (4608), not
  // a 256 B step (4352).
  EXPECT_EQ(round_size(4097, all(16)), 4608u);
  // Just above the threshold the steps are 512 B again.
  EXPECT_EQ(round_size(8193, all(16)), 8704u);
}

TEST(RoundSizeDivisions, RoundsUpToTheNextDivisionBetweenPowersOfTwo) {
  // [1 MiB, 2 MiB) in 4 steps of 256 KiB.
  EXPECT_EQ(round_size(MiB + 1, all(4)), MiB + 256 * KiB);
  EXPECT_EQ(round_size(MiB + 256 * KiB, all(4)), MiB + 256 * KiB);
  EXPECT_EQ(round_size(MiB + 256 * KiB + 1, all(4)), MiB + 512 * KiB);
  EXPECT_EQ(round_size(2 * MiB - 1, all(4)), 2 * MiB);
  // [64 MiB, 128 MiB) in 8 steps of 8 MiB.
  EXPECT_EQ(round_size(65 * MiB, all(8)), 72 * MiB);
  EXPECT_EQ(round_size(100 * MiB, all(8)), 104 * MiB);
  // 2 divisions: half way.
  EXPECT_EQ(round_size(5 * MiB, all(2)), 6 * MiB);
  EXPECT_EQ(round_size(7 * MiB, all(2)), 8 * MiB);
}

TEST(RoundSizeDivisions, PowersOfTwoAreUnchanged) {
  for (std::uint32_t d : {2u, 4u, 8u, 16u}) {
    for (std::size_t p = 4 * KiB; p <= 64 * GiB; p *= 2) {
      EXPECT_EQ(round_size(p, all(d)), p) << "size " << p << " divisions " << d;
    }
  }
}

TEST(RoundSizeDivisions, DivisionPointsAreFixedPoints) {
  const std::size_t base = 256 * MiB;
  for (std::size_t k = 0; k < 8; ++k) {
    const std::size_t point = base + k * (base / 8);
    EXPECT_EQ(round_size(point, all(8)), point) << k;
  }
}

TEST(RoundSizeDivisions, MostDivisionsStillStepIn512Bytes) {
  // 1024 divisions (the maximum): threshold 512 KiB; [512 KiB, 1 MiB) then has 512 B steps.
  EXPECT_EQ(round_size(600 * KiB + 1, all(1024)), 600 * KiB + 512);
}

TEST(RoundSizeDivisions, EachIntervalUsesItsOwnDivisions) {
  // [256:1, 512:2, >:8] -> intervals 0..8 (sizes < 512 MiB) no rounding, interval 9
  // ([512 MiB, 1 GiB)) 2 divisions, intervals 10.. (from 1 GiB) 8 divisions.
  const Config c = Config::parse("roundup_power2_divisions:[256:1,512:2,>:8]");
  const Divisions& d = c.roundup_power2_divisions;
  EXPECT_EQ(round_size(300 * MiB + 512, d), 300 * MiB + 512);          // interval 8: 1 -> none
  EXPECT_EQ(round_size(600 * MiB, d), 768 * MiB);                      // interval 9: halves
  EXPECT_EQ(round_size(GiB + 1, d), GiB + 128 * MiB);                  // interval 10: eighths
  EXPECT_EQ(round_size(40 * GiB + 1, d), 40 * GiB + 4 * GiB);          // interval 15: eighths
  EXPECT_EQ(round_size(3 * MiB + 512, d), 3 * MiB + 512);              // interval 1: none
}

TEST(RoundSizeDivisions, SizesBelow1MiBUseTheFirstInterval) {
  Divisions d{};
  d[0] = 4;
  // 300000 B lies in [256 KiB, 512 KiB): steps of 64 KiB -> 320 KiB.
  EXPECT_EQ(round_size(300000, d), 320 * KiB);
  d[0] = 0;
  d[1] = 4;
  EXPECT_EQ(round_size(300000, d), 300032u);  // interval 0 now off: a 512 multiple
}

TEST(DivisionInterval, IsLog2MinusTwentyClampedToZeroAndFifteen) {
  EXPECT_EQ(division_interval(0), 0);
  EXPECT_EQ(division_interval(512), 0);
  EXPECT_EQ(division_interval(MiB - 1), 0);
  EXPECT_EQ(division_interval(MiB), 0);
  EXPECT_EQ(division_interval(2 * MiB - 1), 0);
  EXPECT_EQ(division_interval(2 * MiB), 1);
  EXPECT_EQ(division_interval(256 * MiB), 8);
  EXPECT_EQ(division_interval(GiB), 10);
  EXPECT_EQ(division_interval(32 * GiB - 1), 14);
  EXPECT_EQ(division_interval(32 * GiB), 15);
  EXPECT_EQ(division_interval(std::size_t{1} << 50), 15);
}

// ---- pools -----------------------------------------------------------------------------------------

TEST(IsSmall, OneMiBIsTheInclusiveUpperBound) {
  EXPECT_TRUE(is_small(512));
  EXPECT_TRUE(is_small(MiB - 512));
  EXPECT_TRUE(is_small(MiB));
  EXPECT_FALSE(is_small(MiB + 512));
  EXPECT_FALSE(is_small(2 * MiB));
}

TEST(IsSmall, ARequestJustAbove1MiBRoundsIntoTheLargePool) {
  EXPECT_TRUE(is_small(round_size(MiB, none())));
  EXPECT_FALSE(is_small(round_size(MiB + 1, none())));
}

// ---- segment sizes ---------------------------------------------------------------------------------

TEST(SegmentSize, SmallPoolRequestsGetA2MiBSegment) {
  EXPECT_EQ(segment_size(512), 2 * MiB);
  EXPECT_EQ(segment_size(MiB), 2 * MiB);
}

TEST(SegmentSize, OneToTenMiBRequestsGetA20MiBSegment) {
  EXPECT_EQ(segment_size(MiB + 512), 20 * MiB);
  EXPECT_EQ(segment_size(5 * MiB), 20 * MiB);
  EXPECT_EQ(segment_size(10 * MiB - 512), 20 * MiB);
}

TEST(SegmentSize, TenMiBAndMoreGetTheirOwnSegmentRoundedTo2MiB) {
  EXPECT_EQ(segment_size(10 * MiB), 10 * MiB);
  EXPECT_EQ(segment_size(10 * MiB + 512), 12 * MiB);
  EXPECT_EQ(segment_size(11 * MiB), 12 * MiB);
  EXPECT_EQ(segment_size(12 * MiB), 12 * MiB);
  EXPECT_EQ(segment_size(19 * MiB), 20 * MiB);
  EXPECT_EQ(segment_size(GiB + 512), GiB + 2 * MiB);
}

TEST(SegmentSize, SegmentAlwaysHoldsTheRoundedRequest) {
  for (std::size_t size = 512; size < 64 * MiB; size = size * 3 / 2 + 512) {
    const std::size_t r = round_size(size, none());
    EXPECT_GE(segment_size(r), r) << size;
    EXPECT_EQ(segment_size(r) % (2 * MiB), 0u) << size;
  }
}

}  // namespace
}  // namespace stitch::detail
