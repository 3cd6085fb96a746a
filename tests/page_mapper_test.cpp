// tests/page_mapper_test.cpp — the page mapper (core/page_mapper.hpp), the core's one caller of
// the virtual-memory API, on the simulated device: mapping all or nothing, the retries of what an
// undo left behind, and the remap that replaces the memory under a whole mapping at the same
// addresses (the data stays where the pointers are).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/page_mapper.hpp"
#include "stitch/errors.hpp"
#include "stitch/sim_backend.hpp"

namespace stitch::detail {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

TEST(PageMapper, MapsAllOrNothingAndRetriesWhatAnUndoLeft) {
  SimBackend::Options o;
  o.capacity = 10 * MiB;  // five 2 MiB pages
  SimBackend sim(o);
  PageMapper pages(sim, 0);
  Segment seg;
  seg.page = 2 * MiB;
  seg.size = 16 * MiB;
  seg.base = static_cast<char*>(sim.reserve(0, seg.size, seg.page));
  seg.pages.reset(8);
  ASSERT_TRUE(pages.map(seg, 0, 3));
  EXPECT_EQ(sim.usage(0).physical_handles, 3u);
  // One more page than the device has: nothing of it stays.
  EXPECT_FALSE(pages.map(seg, 3, 3));
  EXPECT_EQ(sim.usage(0).physical_handles, 3u);
  EXPECT_EQ(seg.pages.handle(3), 0u);
  // A failed map changes nothing: the run is mapped all or nothing, the handles released.
  sim.inject_fault(SimCall::map, 2, SimFault::error);
  EXPECT_THROW((void)pages.map(seg, 4, 2), stitch::backend_error);
  EXPECT_EQ(seg.pages.handle(4), 0u);
  EXPECT_EQ(sim.usage(0).physical_handles, 3u);
  // A stray mapping (an unmap that failed while undoing) blocks only the addresses it covers.
  const stitch::phys_handle_t h = sim.create_physical(0, 2 * MiB);
  ASSERT_TRUE(sim.map(0, seg.base + 6 * seg.page, 2 * MiB, h));
  sim.release_physical(0, h);  // freed when its mapping goes
  sim.inject_fault(SimCall::unmap, 1, SimFault::error);
  pages.unmap_or_stray(seg.base + 6 * seg.page, 2 * MiB);  // fails: filed as stray
  sim.inject_fault(SimCall::unmap, 1, SimFault::error);    // and its retry fails too
  EXPECT_TRUE(pages.map(seg, 4, 1)) << "elsewhere the range still grows";
  sim.inject_fault(SimCall::unmap, 1, SimFault::error);
  EXPECT_THROW((void)pages.map(seg, 6, 1), stitch::backend_error) << "where the stray lies, not yet";
  EXPECT_TRUE(pages.map(seg, 6, 1)) << "the stray is unmapped first, then the page maps";
  EXPECT_EQ(sim.usage(0).physical_handles, 5u);
  // An orphaned handle is released on the next retry.
  sim.unmap(0, seg.base, 2 * MiB);
  sim.inject_fault(SimCall::release_physical, 1, SimFault::error);
  EXPECT_TRUE(pages.release(seg, 0, 1) != nullptr);
  EXPECT_EQ(pages.orphans().size(), 1u);
  pages.retry();
  EXPECT_TRUE(pages.orphans().empty());
  EXPECT_EQ(sim.usage(0).physical_handles, 4u);
}

/// A range of `slots` 2 MiB slots on `sim`, reserved, with nothing mapped.
Segment reserve_range(SimBackend& sim, std::size_t slots) {
  Segment seg;
  seg.page = 2 * MiB;
  seg.size = slots * seg.page;
  seg.base = static_cast<char*>(sim.reserve(0, seg.size, seg.page));
  seg.expandable = true;
  seg.pages.reset(slots);
  return seg;
}

void fill_slot(const Segment& s, std::size_t slot, unsigned char value) {
  std::memset(s.base + slot * s.page, value, s.page);
}

bool slot_holds(const Segment& s, std::size_t slot, unsigned char value) {
  const unsigned char* p = reinterpret_cast<const unsigned char*>(s.base + slot * s.page);
  for (std::size_t i = 0; i < s.page; i += 4096)
    if (p[i] != value || p[s.page - 1] != value) return false;
  return true;
}

TEST(PageMapper, RemapKeepsTheDataOfTheKeptSlotsAtTheirAddressesAndFreesTheRest) {
  SimBackend sim;
  PageMapper pages(sim, 0);
  Segment seg = reserve_range(sim, 8);
  ASSERT_TRUE(pages.map(seg, 0, 4, 4));  // one coarse page over slots 0-3
  const phys_handle_t coarse = seg.pages.handle(0);
  for (std::size_t i = 0; i < 4; ++i) fill_slot(seg, i, static_cast<unsigned char>(0x10 + i));
  ASSERT_EQ(sim.usage(0).used, 8 * MiB);
  // Slots 0 and 2-3 hold live data; slot 1 is free.
  ASSERT_TRUE(pages.remap(Mapping{&seg, 0, 4}, {SlotRun{0, 1}, SlotRun{2, 2}}));
  EXPECT_TRUE(slot_holds(seg, 0, 0x10));
  EXPECT_TRUE(slot_holds(seg, 2, 0x12));
  EXPECT_TRUE(slot_holds(seg, 3, 0x13));
  // One-slot handles under the kept slots, none under slot 1; the coarse handle is gone.
  for (std::size_t i : {0, 2, 3}) {
    EXPECT_NE(seg.pages.handle(i), 0u) << i;
    EXPECT_NE(seg.pages.handle(i), coarse) << i;
    EXPECT_EQ(seg.pages.extent(i), 1u) << i;
  }
  EXPECT_EQ(seg.pages.handle(1), 0u);
  EXPECT_EQ(sim.usage(0).physical_handles, 3u);
  EXPECT_EQ(sim.usage(0).used, 6 * MiB) << "the free slot's memory went back";
  EXPECT_EQ(sim.usage(0).reservations, 1u) << "the scratch range went back";
  // The free slot is unmapped: it can be mapped again (by a stitch, say).
  EXPECT_TRUE(pages.map(seg, 1, 1));
  fill_slot(seg, 1, 0x77);
  EXPECT_TRUE(slot_holds(seg, 0, 0x10) && slot_holds(seg, 2, 0x12));
}

TEST(PageMapper, AScratchRangeWhoseReleaseFailedIsReleasedLater) {
  // The remap's scratch range: when its release fails, it is kept and released by retry() (and
  // so before the next map and when memory goes back), not leaked.
  SimBackend sim;
  PageMapper pages(sim, 0);
  Segment seg = reserve_range(sim, 8);
  ASSERT_TRUE(pages.map(seg, 0, 4, 4));
  for (std::size_t i = 0; i < 4; ++i) fill_slot(seg, i, static_cast<unsigned char>(0x20 + i));
  sim.inject_fault(SimCall::release_reservation, 1, SimFault::error);
  ASSERT_TRUE(pages.remap(Mapping{&seg, 0, 4}, {SlotRun{0, 1}, SlotRun{2, 2}}));
  EXPECT_TRUE(slot_holds(seg, 0, 0x20) && slot_holds(seg, 2, 0x22) && slot_holds(seg, 3, 0x23));
  EXPECT_EQ(sim.usage(0).reservations, 2u) << "the scratch range stays for now";
  pages.retry();
  EXPECT_EQ(sim.usage(0).reservations, 1u) << "and goes at the next retry";
}

TEST(PageMapper, ARemapThatCannotGetItsPagesChangesNothing) {
  SimBackend::Options o;
  o.capacity = 10 * MiB;  // the coarse page (8 MiB) and one more 2 MiB page
  SimBackend sim(o);
  PageMapper pages(sim, 0);
  Segment seg = reserve_range(sim, 8);
  ASSERT_TRUE(pages.map(seg, 0, 4, 4));
  for (std::size_t i = 0; i < 4; ++i) fill_slot(seg, i, static_cast<unsigned char>(0x20 + i));
  const phys_handle_t coarse = seg.pages.handle(0);
  // Two fresh pages needed, one available: out of memory, and everything as it was.
  EXPECT_FALSE(pages.remap(Mapping{&seg, 0, 4}, {SlotRun{0, 2}}));
  EXPECT_EQ(seg.pages.handle(0), coarse);
  EXPECT_EQ(seg.pages.extent(0), 4u);
  EXPECT_EQ(sim.usage(0).physical_handles, 1u);
  EXPECT_EQ(sim.usage(0).reservations, 1u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_TRUE(slot_holds(seg, i, static_cast<unsigned char>(0x20 + i)));
  // A backend error at the scratch mapping: rethrown, everything as it was.
  sim.inject_fault(SimCall::map, 1, SimFault::error);
  EXPECT_THROW((void)pages.remap(Mapping{&seg, 0, 4}, {SlotRun{1, 1}}), backend_error);
  EXPECT_EQ(seg.pages.handle(0), coarse);
  EXPECT_EQ(sim.usage(0).physical_handles, 1u);
  EXPECT_EQ(sim.usage(0).mappings, 1u);
  // An error in the old mapping's unmap, after the copy: rethrown, everything as it was.
  sim.inject_fault(SimCall::unmap, 1, SimFault::error);
  EXPECT_THROW((void)pages.remap(Mapping{&seg, 0, 4}, {SlotRun{1, 1}}), backend_error);
  EXPECT_EQ(seg.pages.handle(0), coarse);
  EXPECT_EQ(sim.usage(0).physical_handles, 1u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_TRUE(slot_holds(seg, i, static_cast<unsigned char>(0x20 + i)));
  // No address space for the scratch range, a failed device copy, or a failed sync of the copy:
  // each changes nothing.
  SimBackend roomy;
  PageMapper more(roomy, 0);
  Segment big = reserve_range(roomy, 8);
  ASSERT_TRUE(more.map(big, 0, 4, 4));
  fill_slot(big, 1, 0x5c);
  const phys_handle_t coarse2 = big.pages.handle(0);
  for (const auto& [call, fault] : {std::pair{SimCall::reserve, SimFault::out_of_memory},
                                    std::pair{SimCall::copy, SimFault::error},
                                    std::pair{SimCall::synchronize_stream, SimFault::error}}) {
    roomy.inject_fault(call, 1, fault);
    if (fault == SimFault::out_of_memory) {
      EXPECT_FALSE(more.remap(Mapping{&big, 0, 4}, {SlotRun{1, 1}})) << to_string(call);
    } else {
      EXPECT_THROW((void)more.remap(Mapping{&big, 0, 4}, {SlotRun{1, 1}}), backend_error) << to_string(call);
    }
    EXPECT_EQ(big.pages.handle(0), coarse2) << to_string(call);
    EXPECT_TRUE(slot_holds(big, 1, 0x5c)) << to_string(call);
    EXPECT_EQ(roomy.usage(0).physical_handles, 1u) << to_string(call);
    EXPECT_EQ(roomy.usage(0).reservations, 1u) << to_string(call);
    EXPECT_EQ(roomy.usage(0).mappings, 1u) << to_string(call);
  }
  // With nothing kept, the whole mapping goes.
  ASSERT_TRUE(pages.remap(Mapping{&seg, 0, 4}, {}));
  EXPECT_EQ(seg.pages.handle(0), 0u);
  EXPECT_EQ(sim.usage(0).physical_handles, 0u);
  EXPECT_EQ(sim.usage(0).used, 0u);
}

TEST(PageMapper, ARemapOfBorrowedMemoryLeavesTheLendersHandle) {
  SimBackend sim;
  PageMapper pages(sim, 0);
  Segment lender = reserve_range(sim, 4);
  ASSERT_TRUE(pages.map(lender, 0, 4, 4));
  const phys_handle_t coarse = lender.pages.handle(0);
  fill_slot(lender, 2, 0x33);
  // A stitched range maps the lender's first two slots a second time, at its slot 1.
  Segment borrower = reserve_range(sim, 4);
  borrower.stitched = true;
  borrower.pages.make_room(3);
  ASSERT_TRUE(pages.map_pieces(borrower.base + borrower.page, {MapPiece{coarse, 2 * borrower.page}}));
  borrower.pages.set(1, 2, coarse, 0);
  Block lent(lender.base, 2 * lender.page, nullptr, &lender, nullptr, false, BlockState::lent);
  borrower.borrows.push_back(Borrow{&lent, 1, 2});
  fill_slot(borrower, 1, 0x44);  // the lender's slot 0, through the second mapping
  ASSERT_TRUE(slot_holds(lender, 0, 0x44));
  ASSERT_TRUE(pages.remap(Mapping{&borrower, 1, 2}, {SlotRun{1, 1}}));
  EXPECT_TRUE(slot_holds(borrower, 1, 0x44)) << "the data stays at the borrower's address";
  EXPECT_NE(borrower.pages.handle(1), coarse);
  EXPECT_EQ(borrower.pages.handle(2), 0u);
  EXPECT_EQ(lender.pages.handle(0), coarse);
  EXPECT_TRUE(slot_holds(lender, 2, 0x33)) << "the lender's own mapping is untouched";
  EXPECT_EQ(sim.usage(0).physical_handles, 2u) << "the lender's handle stays; one fresh page";
}

TEST(PageMapper, ARemapThroughHostMemoryNeedsNoRoomAndKeepsTheData) {
  SimBackend::Options o;
  o.capacity = 8 * MiB;  // the coarse page and nothing else
  SimBackend sim(o);
  PageMapper pages(sim, 0);
  Segment seg = reserve_range(sim, 4);
  ASSERT_TRUE(pages.map(seg, 0, 4, 4));
  for (std::size_t i = 0; i < 4; ++i) fill_slot(seg, i, static_cast<unsigned char>(0x40 + i));
  ASSERT_EQ(sim.memory_info(0).free, 0u);
  EXPECT_FALSE(pages.remap(Mapping{&seg, 0, 4}, {SlotRun{1, 2}})) << "no room for fresh pages";
  // A failure before the old mapping goes changes nothing.
  sim.inject_fault(SimCall::copy_to_host, 2, SimFault::error);
  EXPECT_THROW((void)pages.remap(Mapping{&seg, 0, 4}, {SlotRun{1, 1}, SlotRun{3, 1}}, true), backend_error);
  sim.inject_fault(SimCall::unmap, 1, SimFault::error);
  EXPECT_THROW((void)pages.remap(Mapping{&seg, 0, 4}, {SlotRun{1, 2}}, true), backend_error);
  EXPECT_EQ(seg.pages.extent(0), 4u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_TRUE(slot_holds(seg, i, static_cast<unsigned char>(0x40 + i)));
  // Through the host: the old page goes first, so the device needs no room.
  ASSERT_TRUE(pages.remap(Mapping{&seg, 0, 4}, {SlotRun{1, 2}}, true));
  EXPECT_TRUE(slot_holds(seg, 1, 0x41));
  EXPECT_TRUE(slot_holds(seg, 2, 0x42));
  EXPECT_EQ(seg.pages.handle(0), 0u);
  EXPECT_EQ(seg.pages.handle(3), 0u);
  EXPECT_EQ(sim.usage(0).used, 4 * MiB);
  EXPECT_EQ(sim.call_count(SimCall::copy_from_host), 1u);
}

/// A 4-granule page of granules 0x60..0x63, with `faults` armed (call, nth) before a remap that
/// keeps granules 1 and 3 (`stage`: through host memory).
struct FaultedRemap {
  SimBackend sim;
  PageMapper pages{sim, 0};
  Segment seg = reserve_range(sim, 4);
  phys_handle_t original = 0;
  FaultedRemap() {
    if (!pages.map(seg, 0, 4, 4)) std::abort();
    for (std::size_t i = 0; i < 4; ++i) fill_slot(seg, i, static_cast<unsigned char>(0x60 + i));
    original = seg.pages.handle(0);
  }
  bool remap(std::initializer_list<std::pair<SimCall, int>> faults, bool stage) {
    for (const auto& [call, nth] : faults) sim.inject_fault(call, static_cast<std::uint64_t>(nth), SimFault::error);
    return pages.remap(Mapping{&seg, 0, 4}, {SlotRun{1, 1}, SlotRun{3, 1}}, stage);
  }
  /// The kept granules hold their data at their addresses.
  [[nodiscard]] bool data_intact() const { return slot_holds(seg, 1, 0x61) && slot_holds(seg, 3, 0x63); }
};

TEST(PageMapper, AFreshMappingThatFailsMapsTheOldPageBackAndChangesNothing) {
  // Fresh pages mapped at the scratch range (map 1), over the first kept run (map 2), over the
  // second (map 3, failing): the first run is taken back and the old page mapped back (map 4).
  FaultedRemap r;
  EXPECT_THROW((void)r.remap({{SimCall::map, 3}}, false), backend_error);
  EXPECT_EQ(r.seg.pages.extent(0), 4u);
  EXPECT_EQ(r.seg.pages.handle(0), r.original);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_TRUE(slot_holds(r.seg, i, static_cast<unsigned char>(0x60 + i)));
  EXPECT_EQ(r.sim.usage(0).physical_handles, 1u) << "the fresh pages went back";
  EXPECT_TRUE(r.pages.orphans().empty());
  // And the same remap then succeeds.
  ASSERT_TRUE(r.pages.remap(Mapping{&r.seg, 0, 4}, {SlotRun{1, 1}, SlotRun{3, 1}}));
  EXPECT_TRUE(r.data_intact());
  EXPECT_EQ(r.sim.usage(0).physical_handles, 2u);
}

TEST(PageMapper, AStagedRemapWhoseFreshPagesFailRebuildsTheMappingWithTheData) {
  {  // the first fresh page cannot be made: one page of the old size takes the data back
    FaultedRemap r;
    EXPECT_THROW((void)r.remap({{SimCall::create_physical, 1}}, true), backend_error);
    EXPECT_EQ(r.seg.pages.extent(0), 4u);
    EXPECT_TRUE(r.data_intact());
    EXPECT_EQ(r.sim.usage(0).physical_handles, 1u);
  }
  {  // the fresh pages are made but cannot be mapped over the second run
    FaultedRemap r;
    EXPECT_THROW((void)r.remap({{SimCall::map, 2}}, true), backend_error);
    EXPECT_EQ(r.seg.pages.extent(0), 4u);
    EXPECT_TRUE(r.data_intact());
    EXPECT_EQ(r.sim.usage(0).physical_handles, 1u);
  }
  {  // a copy back that fails once is tried again: the host copy still exists
    FaultedRemap r;
    EXPECT_TRUE(r.remap({{SimCall::copy_from_host, 1}}, true));
    EXPECT_TRUE(r.data_intact());
    EXPECT_EQ(r.seg.pages.handle(0), 0u);
    EXPECT_EQ(r.sim.usage(0).physical_handles, 2u);
  }
}

/// A remap with faults armed, for the death tests.
void remap_with_faults(std::initializer_list<std::pair<SimCall, int>> faults, bool stage) {
  FaultedRemap r;
  (void)r.remap(faults, stage);
}

TEST(PageMapper, AnOldPageThatCannotBeMappedBackIsKeptAndMappedBackLater) {
  // The fresh pages fail over the kept runs (map 3) and the old page cannot be mapped back either,
  // twice (maps 4 and 5): the old page still holds the data, so this is an error, not an abort.
  // The page table keeps the old page; the page mapper's next call maps it back at its address.
  FaultedRemap r;
  try {
    (void)r.remap({{SimCall::map, 3}, {SimCall::map, 4}, {SimCall::map, 5}}, false);
    ADD_FAILURE() << "the remap must fail";
  } catch (const backend_error& e) {
    EXPECT_NE(std::string(e.what()).find("the old page keeps the data"), std::string::npos) << e.what();
  }
  EXPECT_EQ(r.seg.pages.extent(0), 4u);
  EXPECT_EQ(r.seg.pages.handle(0), r.original) << "the old page stays the page table's";
  EXPECT_EQ(r.pages.displaced_bytes(), 4 * r.seg.page);
  EXPECT_EQ(r.sim.usage(0).physical_handles, 1u) << "the fresh pages went back, the old one stays";
  EXPECT_TRUE(r.pages.orphans().empty());
  r.pages.retry();
  EXPECT_EQ(r.pages.displaced_bytes(), 0u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_TRUE(slot_holds(r.seg, i, static_cast<unsigned char>(0x60 + i)));
  // A displaced page that still cannot be mapped back blocks an unmap of its addresses (which
  // changes nothing) and is mapped back by the unmap after it.
  FaultedRemap again;
  EXPECT_THROW((void)again.remap({{SimCall::map, 3}, {SimCall::map, 4}, {SimCall::map, 5}}, false), backend_error);
  again.sim.inject_fault(SimCall::map, 1, SimFault::error);
  EXPECT_THROW(again.pages.unmap(again.seg.base, 4 * again.seg.page), backend_error);
  EXPECT_EQ(again.pages.displaced_bytes(), 4 * again.seg.page);
  again.sim.inject_fault(SimCall::map, 1, SimFault::error);
  EXPECT_THROW((void)again.pages.remap(Mapping{&again.seg, 0, 4}, {SlotRun{1, 1}}), backend_error)
      << "a remap of a displaced mapping reads nothing until the old page is back";
  EXPECT_EQ(again.pages.displaced_bytes(), 4 * again.seg.page);
  // A map back that fails once more is tried again inside the remap: one fault leaves the
  // mapping in place.
  FaultedRemap once;
  EXPECT_THROW((void)once.remap({{SimCall::map, 3}, {SimCall::map, 4}}, false), backend_error);
  EXPECT_EQ(once.pages.displaced_bytes(), 0u);
  EXPECT_TRUE(once.data_intact());
  ASSERT_TRUE(again.pages.remap(Mapping{&again.seg, 0, 4}, {SlotRun{1, 1}, SlotRun{3, 1}}))
      << "the next remap maps the old page back first, then moves the data";
  EXPECT_EQ(again.pages.displaced_bytes(), 0u);
  EXPECT_TRUE(again.data_intact());
}

TEST(PageMapperDeathTest, AbortsOnlyWhenTheDataCannotBePutBackAndSaysWhy) {
  // Staged: neither fresh pages nor one of the old size: the host copy is the only one.
  EXPECT_DEATH(remap_with_faults({{SimCall::create_physical, 1}, {SimCall::create_physical, 2}}, true),
               "stitch: fatal: remapping .* through host memory: the fresh pages failed .* the data's "
               "only copy is in host memory");
  EXPECT_DEATH(remap_with_faults({{SimCall::copy_from_host, 1}, {SimCall::copy_from_host, 2}}, true),
               "stitch: fatal: copying .* failed twice .* only copy is in host memory");
}

}  // namespace
}  // namespace stitch::detail
