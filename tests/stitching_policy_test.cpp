// Tests of stitching's policy (docs/stitching.md, "With room"): while the device has room,
// stitching ranges grow in PyTorch's pages, exactly as expandable segments do (same map calls,
// no stream synchronization, no unmaps); past stitch_fine_above, or when the device cannot give
// a whole page, they grow in one-granule pages; under pressure a coarse page moves to a stitched
// range whole, and the free part of a partly used one is borrowed (mapped a second time).
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/errors.hpp"
#include "stitch/sim_backend.hpp"
#include "support/data_pattern.hpp"
#include "tools/stitch_replay/replayer.hpp"
#include "tools/stitch_replay/trace_file.hpp"

namespace {

namespace fs = std::filesystem;
namespace rp = stitch::replay_cli;
using stitch::SimCall;

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr const char* kExpandable = "expandable_segments:True";
constexpr const char* kStitching = "expandable_segments:True,stitching:True";

fs::path shipped_dir() { return fs::path(__FILE__).parent_path().parent_path() / "traces"; }

struct Device {
  explicit Device(std::size_t capacity_mb, const std::string& conf = kStitching) {
    stitch::SimBackend::Options o;
    o.capacity = capacity_mb * kMiB;
    sim = std::make_shared<stitch::SimBackend>(o);
    alloc = std::make_unique<stitch::Allocator>(stitch::Config::parse("backend:sim," + conf), sim);
  }
  std::int64_t stat(const char* key) const { return *alloc->stat(0, key); }
  std::uint64_t maps() const { return sim->call_count(SimCall::map); }
  std::shared_ptr<stitch::SimBackend> sim;
  std::unique_ptr<stitch::Allocator> alloc;
};

TEST(StitchingPolicy, WithRoomStitchingCostsWhatExpandableSegmentsCost) {
  int traces = 0;
  for (const auto& entry : fs::directory_iterator(shipped_dir())) {
    if (entry.path().extension() != ".pickle") continue;
    SCOPED_TRACE(entry.path().filename().string());
    const rp::TraceFile w = rp::read_trace_file(entry.path().string());
    const rp::DeviceWorkload& t = w.devices.at(0);
    rp::ReplayOptions o;  // the 1 TiB device: room all along
    o.config = kExpandable;
    const rp::ReplayResult expandable = rp::replay(t, o);
    o.config = kStitching;
    const rp::ReplayResult stitching = rp::replay(t, o);
    EXPECT_EQ(stitching.maps, expandable.maps);
    EXPECT_EQ(stitching.stream_syncs, 0);
    EXPECT_LE(stitching.unmaps, expandable.unmaps);
    EXPECT_EQ(stitching.peak_reserved, expandable.peak_reserved);
    ++traces;
  }
  EXPECT_EQ(traces, 7);  // the six patterns and the recorded run that overflows its device
}

TEST(StitchingPolicy, PastTheThresholdRangesGrowInFinePages) {
  // stitch_fine_above:0.9: fine pages once reserved would pass 90 MiB.
  Device d(100, std::string(kStitching) + ",stitch_fine_above:0.9");
  auto maps_for = [](Device& dev, std::size_t bytes) {
    const auto before = dev.maps();
    (void)dev.alloc->allocate(bytes);
    return dev.maps() - before;
  };
  EXPECT_EQ(maps_for(d, 30 * kMiB), 2u);  // two 20 MiB pages, as expandable segments map them
  EXPECT_EQ(maps_for(d, 40 * kMiB), 2u);  // 10 MiB left in the last page, two more pages
  EXPECT_EQ(d.stat("reserved_bytes.all.current"), static_cast<std::int64_t>(80 * kMiB));
  // Past 90 MiB: one-granule pages, 3 of them with the 10 MiB left free before.
  EXPECT_EQ(maps_for(d, 15 * kMiB), 3u) << "past 90 MiB: one-granule pages";
  d.alloc->validate();
  Device roomy(1000, std::string(kStitching) + ",stitch_fine_above:0.9");  // room: coarse pages
  EXPECT_EQ(maps_for(roomy, 30 * kMiB) + maps_for(roomy, 40 * kMiB) + maps_for(roomy, 15 * kMiB), 5u);
  Device always(1000, std::string(kStitching) + ",stitch_fine_above:0");
  EXPECT_EQ(maps_for(always, 30 * kMiB), 15u) << "stitch_fine_above:0: fine pages from the first byte";
  Device never(990);  // the default, stitch_fine_above:1
  for (int i = 0; i < 49; ++i) (void)never.alloc->allocate(20 * kMiB);
  EXPECT_EQ(never.maps(), 49u) << "stitch_fine_above:1: coarse pages until the device is full";
  EXPECT_EQ(maps_for(never, 8 * kMiB), 4u) << "then fine pages where a whole page does not fit";
}

TEST(StitchingPolicy, WhenTheDeviceCannotGiveACoarsePageRangesGrowInFinePages) {
  // The device has less left than a 20 MiB page (another process may hold memory the device
  // total counts): fine pages serve what coarse pages cannot.
  Device d(90, std::string(kStitching) + ",stitch_fine_above:1");
  for (int i = 0; i < 4; ++i) (void)d.alloc->allocate(20 * kMiB);
  const auto before = d.maps();
  EXPECT_NE(d.alloc->allocate(8 * kMiB), nullptr);
  EXPECT_EQ(d.maps() - before, 4u) << "four one-granule pages";
  EXPECT_EQ(d.stat("num_ooms"), 0);
  d.alloc->validate();
}

TEST(StitchingPolicy, ShortOfMemoryTheFreePartsOfPartlyUsedPagesAreBorrowed) {
  // Coarse pages all along (the default): ten 10 MiB blocks fill five 20 MiB pages, and every
  // other block is freed, so each page is half free and none can move whole. A 50 MiB request on
  // the full device maps the five free halves a second time into a stitched range: no new
  // physical memory, nothing unmapped (live blocks are never unmapped), live data intact.
  for (const bool reuse : {true, false}) {
    SCOPED_TRACE(reuse ? "page reuse" : "no page reuse");
    Device d(100, std::string(kStitching) + (reuse ? "" : ",stitch_reuse_pages:False"));
    std::vector<void*> blocks;
    for (int i = 0; i < 10; ++i) {
      blocks.push_back(d.alloc->allocate(10 * kMiB));
      stitch::test::write_pattern(blocks.back(), 10 * kMiB, static_cast<std::uint64_t>(i));
    }
    for (int i = 0; i < 10; i += 2) d.alloc->deallocate(blocks[static_cast<std::size_t>(i)]);
    ASSERT_EQ(d.sim->usage(0).physical_handles, 5u);
    const auto unmaps = d.sim->call_count(SimCall::unmap);
    const auto syncs = d.sim->call_count(SimCall::synchronize_stream);
    void* big = d.alloc->allocate(50 * kMiB);
    ASSERT_NE(big, nullptr);
    EXPECT_EQ(d.stat("num_page_borrows"), 5);
    EXPECT_EQ(d.stat("num_stitches"), 1);
    EXPECT_EQ(d.sim->call_count(SimCall::unmap), unmaps) << "nothing unmapped";
    EXPECT_EQ(d.sim->call_count(SimCall::synchronize_stream), syncs) << "own stream: no sync";
    EXPECT_EQ(d.sim->usage(0).physical_handles, 5u) << "no new memory";
    EXPECT_EQ(d.stat("reserved_bytes.all.current"), static_cast<std::int64_t>(100 * kMiB));
    stitch::test::write_pattern(big, 50 * kMiB, 99);
    for (int i = 1; i < 10; i += 2)
      EXPECT_TRUE(stitch::test::pattern_intact(blocks[static_cast<std::size_t>(i)], 10 * kMiB,
                                               static_cast<std::uint64_t>(i)));
    EXPECT_TRUE(stitch::test::pattern_intact(big, 50 * kMiB, 99));
    d.alloc->validate();
    // Snapshots show the lent memory where it is used, so their segments add up to reserved.
    std::size_t shown = 0;
    for (const stitch::SegmentSnapshot& seg : d.alloc->snapshot().segments) shown += seg.total_size;
    EXPECT_EQ(shown, 100 * kMiB);

    // Freed, the stitched range stays cached and serves the next such request as it is.
    d.alloc->deallocate(big);
    const auto maps = d.maps();
    big = d.alloc->allocate(50 * kMiB);
    EXPECT_EQ(d.maps(), maps);
    EXPECT_EQ(d.stat("num_stitches"), 1);
    d.alloc->deallocate(big);
    // empty_cache gives the range back whole; the halves are free again where they are, and
    // their pages stay while the other halves are live.
    d.alloc->empty_cache();
    EXPECT_EQ(d.stat("reserved_bytes.all.current"), static_cast<std::int64_t>(100 * kMiB));
    EXPECT_EQ(d.sim->usage(0).physical_handles, 5u);
    d.alloc->validate();
    void* half = d.alloc->allocate(10 * kMiB);  // a freed half serves it: nothing new
    EXPECT_EQ(d.sim->usage(0).physical_handles, 5u);
    d.alloc->deallocate(half);
    for (int i = 1; i < 10; i += 2) d.alloc->deallocate(blocks[static_cast<std::size_t>(i)]);
    d.alloc->empty_cache();
    EXPECT_EQ(d.stat("reserved_bytes.all.current"), 0);
    EXPECT_EQ(d.sim->usage(0).physical_handles, 0u);
    EXPECT_EQ(d.sim->usage(0).reservations, 0u);
    d.alloc->validate();
  }
}

TEST(StitchingPolicy, AFailedBorrowChangesNothing) {
  Device d(100, std::string(kStitching) + ",stitch_reuse_pages:False");
  std::vector<void*> blocks;
  for (int i = 0; i < 10; ++i) {
    blocks.push_back(d.alloc->allocate(10 * kMiB));
    stitch::test::write_pattern(blocks.back(), 10 * kMiB, static_cast<std::uint64_t>(i));
  }
  for (int i = 0; i < 10; i += 2) d.alloc->deallocate(blocks[static_cast<std::size_t>(i)]);
  // The third free half fails to map a second time: the two mapped before are unmapped again.
  const stitch::SimUsage before = d.sim->usage(0);
  d.sim->inject_fault(SimCall::map, 3, stitch::SimFault::error);
  EXPECT_THROW((void)d.alloc->allocate(50 * kMiB), stitch::backend_error);
  EXPECT_EQ(d.stat("num_page_borrows"), 0);
  EXPECT_EQ(d.sim->usage(0).mappings, before.mappings) << "the second mappings went";
  EXPECT_EQ(d.sim->usage(0).physical_handles, before.physical_handles);
  for (int i = 1; i < 10; i += 2)
    EXPECT_TRUE(stitch::test::pattern_intact(blocks[static_cast<std::size_t>(i)], 10 * kMiB,
                                             static_cast<std::uint64_t>(i)));
  d.alloc->validate();
  // Nothing is lost: the same request succeeds next time.
  void* big = d.alloc->allocate(50 * kMiB);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(d.stat("num_page_borrows"), 5);
  d.alloc->validate();
}

TEST(StitchingPolicy, UnderPressureCoarsePagesMoveWhole) {
  // Coarse pages all along (stitch_fine_above:1), ten blocks of one page each, every other one
  // freed: five whole free 20 MiB pages, none adjacent to another. A 60 MiB request on a full
  // device takes three of them, moved whole (no new physical memory): into the growing range
  // with page reuse, into a stitched range without it.
  for (const bool reuse : {true, false}) {
    SCOPED_TRACE(reuse ? "page reuse" : "stitched range");
    Device d(200, std::string(kStitching) + ",stitch_fine_above:1" +
                      (reuse ? "" : ",stitch_reuse_pages:False"));
    std::vector<void*> blocks;
    for (int i = 0; i < 10; ++i) {
      blocks.push_back(d.alloc->allocate(20 * kMiB));
      stitch::test::write_pattern(blocks.back(), 20 * kMiB, static_cast<std::uint64_t>(i));
    }
    for (int i = 0; i < 10; i += 2) d.alloc->deallocate(blocks[static_cast<std::size_t>(i)]);
    ASSERT_EQ(d.sim->usage(0).physical_handles, 10u);
    void* big = d.alloc->allocate(60 * kMiB);
    EXPECT_EQ(d.stat(reuse ? "num_page_reuses" : "num_stitches"), 1);
    EXPECT_EQ(d.sim->usage(0).physical_handles, 10u) << "pages moved, none made";
    EXPECT_EQ(d.stat("reserved_bytes.all.current"), static_cast<std::int64_t>(200 * kMiB));
    stitch::test::write_pattern(big, 60 * kMiB, 99);
    for (int i = 1; i < 10; i += 2)
      EXPECT_TRUE(stitch::test::pattern_intact(blocks[static_cast<std::size_t>(i)], 20 * kMiB,
                                               static_cast<std::uint64_t>(i)));
    EXPECT_TRUE(stitch::test::pattern_intact(big, 60 * kMiB, 99));
    d.alloc->validate();
    // A coarse page that a live block shares stays mapped through empty_cache: it goes whole
    // or not at all.
    d.alloc->deallocate(big);
    void* part = d.alloc->allocate(5 * kMiB);
    d.alloc->empty_cache();
    EXPECT_GE(d.stat("reserved_bytes.all.current"), static_cast<std::int64_t>(6 * 20 * kMiB));
    d.alloc->validate();
    d.alloc->deallocate(part);
    for (int i = 1; i < 10; i += 2) d.alloc->deallocate(blocks[static_cast<std::size_t>(i)]);
    d.alloc->empty_cache();
    EXPECT_EQ(d.stat("reserved_bytes.all.current"), 0);
    EXPECT_EQ(d.sim->usage(0).physical_handles, 0u);
  }
}

}  // namespace
