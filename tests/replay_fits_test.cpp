// Tests of stitch-replay --fits (src/tools/stitch_replay/fits): each size replayed for real and
// agreeing with the bisection of --min-capacity (the smallest fitting device fits, 2 MiB less
// does not, twice it fits), the replays shared between the two, the size list, and the notes
// where the two disagree.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "stitch/errors.hpp"
#include "tools/stitch_replay/fits.hpp"
#include "tools/stitch_replay/trace_file.hpp"
#include "tools/tracegen/tracegen.hpp"
#include "replay_helpers.hpp"

namespace {

namespace rp = stitch::replay_cli;
namespace tg = stitch::tracegen;
using replay_helpers::generated;

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;


TEST(ReplayFits, FitsAgreesWithTheSmallestFittingDevice) {
  const rp::DeviceWorkload t = generated("recompute", 2);
  for (const std::string config : {"", "expandable_segments:True"}) {
    SCOPED_TRACE(config);
    rp::CapacityProbe probe(t, config);
    const auto min = probe.min_capacity(64 * GiB);
    ASSERT_TRUE(min.has_value());
    const std::size_t searched = probe.replays();
    const auto fits = probe.fits({*min, *min - 2 * MiB, 2 * *min}, min);
    EXPECT_LE(probe.replays(), searched + 1) << "the min capacity and 2 MiB below were replayed already";
    ASSERT_EQ(fits.size(), 3u);
    EXPECT_TRUE(fits[0].fits);
    EXPECT_FALSE(fits[1].fits);
    ASSERT_TRUE(fits[1].first_oom.has_value());
    EXPECT_FALSE(fits[1].first_oom->verdict.empty());
    EXPECT_GT(fits[1].ooms, 0u);
    EXPECT_TRUE(fits[2].fits) << fits[2].note;
    for (const rp::CapacityOutcome& f : fits) {
      EXPECT_TRUE(f.note.empty()) << f.note;
      EXPECT_LE(f.peak_reserved, f.capacity);
      EXPECT_EQ(f.headroom(), static_cast<std::int64_t>(f.capacity) - static_cast<std::int64_t>(f.peak_reserved));
    }
    // The standalone search gives the same answer.
    EXPECT_EQ(rp::min_capacity(t, config, 64 * GiB), min);
  }
}

TEST(ReplayFits, SizesThatFitBoundTheBisection) {
  const rp::DeviceWorkload t = generated("recompute", 2);
  rp::CapacityProbe cold(t, "");
  const auto min = cold.min_capacity(64 * GiB);
  ASSERT_TRUE(min.has_value());
  rp::CapacityProbe seeded(t, "");
  (void)seeded.at(*min + 64 * MiB);  // fits
  (void)seeded.at(*min - 64 * MiB);  // does not
  EXPECT_EQ(seeded.min_capacity(64 * GiB), min);
  EXPECT_LT(seeded.replays(), cold.replays() + 2);
}

TEST(ReplayFits, ADisagreementIsNoted) {
  rp::CapacityOutcome o;
  o.capacity = 10 * GiB;
  o.fits = false;
  EXPECT_NE(rp::monotonicity_note(o, 8 * GiB).find("not monotone"), std::string::npos);
  EXPECT_TRUE(rp::monotonicity_note(o, 12 * GiB).empty());
  o.fits = true;
  EXPECT_NE(rp::monotonicity_note(o, 12 * GiB).find("not monotone"), std::string::npos);
  EXPECT_TRUE(rp::monotonicity_note(o, 8 * GiB).empty());
  EXPECT_TRUE(rp::monotonicity_note(o, std::nullopt).empty());
}

TEST(ReplayFits, SizeLists) {
  EXPECT_EQ(rp::parse_size_list("24GiB,40GiB"), (std::vector<std::size_t>{24 * GiB, 40 * GiB}));
  EXPECT_EQ(rp::parse_size_list("512MiB"), (std::vector<std::size_t>{512 * MiB}));
  EXPECT_THROW((void)rp::parse_size_list("24GiB,,40GiB"), stitch::error);
  EXPECT_THROW((void)rp::parse_size_list(""), stitch::error);
  EXPECT_THROW((void)rp::parse_size_list("24GiB,lots"), stitch::error);
  // The common GPUs' sizes: ascending, whole 2 MiB steps, from 14 to 140 GiB.
  const auto& sizes = rp::common_gpu_sizes();
  ASSERT_FALSE(sizes.empty());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(sizes[i] % (2 * MiB), 0u);
    if (i > 0) EXPECT_GT(sizes[i], sizes[i - 1]);
  }
  EXPECT_GT(sizes.front(), 14 * GiB);
  EXPECT_LT(sizes.back(), 141 * GiB);
}

}  // namespace
