// Cross-stream safety (core/stream_events.hpp): record_stream and frees on other streams make a
// block wait for events, which are pooled, polled and waited for; the active statistics follow
// the pending blocks.
#include <gtest/gtest.h>

#include <new>
#include <vector>

#include "core/stream_events.hpp"
#include "support/allocator_fixture.hpp"

namespace stitch {
namespace {

using namespace stitch::test;

// ---- record_stream and events --------------------------------------------------------------------

TEST_F(AllocatorTest, RecordStreamDefersReuseUntilTheOtherStreamCompletes) {
  const stream_t s = S(1), t = S(2);
  void* p = a().allocate(12 * MiB, s);
  a().record_stream(p, t);
  sim().hold_stream(t);
  a().deallocate(p);
  // Pending: no longer allocated, still active.
  EXPECT_FALSE(a().find(p).has_value());
  EXPECT_EQ(st("allocation.all.current"), 0);
  EXPECT_EQ(st("allocated_bytes.all.current"), 0);
  EXPECT_EQ(st("active.all.current"), 1);
  EXPECT_EQ(st("active_bytes.all.current"), I(12 * MiB));
  EXPECT_EQ(st("requested_bytes.all.current"), I(12 * MiB));
  a().validate();
  void* q = a().allocate(12 * MiB, s);
  EXPECT_NE(q, p);
  EXPECT_EQ(st("segment.all.current"), 2);
  sim().release_stream(t);
  void* r = a().allocate(12 * MiB, s);
  EXPECT_EQ(r, p);
  EXPECT_EQ(st("segment.all.current"), 2);
  EXPECT_EQ(st("active.all.current"), 2);
  a().validate();
}

TEST_F(AllocatorTest, RecordStreamDefersReuseInTheSmallPool) {
  const stream_t s = S(1), t = S(2);
  void* p = a().allocate(1000, s);
  a().record_stream(p, t);
  sim().hold_stream(t);
  a().deallocate(p);
  void* q = a().allocate(1000, s);
  EXPECT_NE(q, p);
  a().deallocate(q);
  sim().release_stream(t);
  // Once the event completes, p's block coalesces with the rest and is the lowest address.
  EXPECT_EQ(a().allocate(1000, s), p);
  a().validate();
}

TEST_F(AllocatorTest, RecordStreamOnSeveralStreamsWaitsForAllOfThem) {
  const stream_t s = S(1), t = S(2), u = S(3);
  void* p = a().allocate(12 * MiB, s);
  a().record_stream(p, t);
  a().record_stream(p, u);
  sim().hold_stream(t);
  sim().hold_stream(u);
  a().deallocate(p);
  EXPECT_EQ(sim().call_count(SimCall::record_event), 2u);
  sim().release_stream(t);
  void* q = a().allocate(12 * MiB, s);
  EXPECT_NE(q, p);  // u still holds it
  sim().release_stream(u);
  EXPECT_EQ(a().allocate(12 * MiB, s), p);
}

TEST_F(AllocatorTest, NoEventForBlocksThatNeverCrossedStreams) {
  std::vector<void*> blocks;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 4; ++i) {
      for (std::size_t size : {std::size_t{1000}, 3 * MiB, 12 * MiB})
        blocks.push_back(a().allocate(size, S(i)));
    }
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      void* p = blocks[i];
      const auto info = a().find(p);
      ASSERT_TRUE(info.has_value());
      if (i % 3 == 0) {
        a().deallocate(p);
      } else if (i % 3 == 1) {
        a().deallocate(p, info->stream);  // last use on its own stream
      } else {
        a().record_stream(p, info->stream);  // own stream: nothing to record
        a().deallocate(p, info->requested, 0, info->stream);
      }
    }
    blocks.clear();
  }
  a().empty_cache();
  EXPECT_EQ(sim().call_count(SimCall::create_event), 0u);
  EXPECT_EQ(sim().call_count(SimCall::record_event), 0u);
  EXPECT_EQ(sim().call_count(SimCall::query_event), 0u);
  EXPECT_EQ(sim().call_count(SimCall::synchronize_event), 0u);
  EXPECT_EQ(st("num_sync_all_streams"), 0);
}

TEST_F(AllocatorTest, DeallocateOnAnotherStreamIsALastUseThere) {
  const stream_t s = S(1), t = S(2);
  void* p = a().allocate(12 * MiB, s);
  sim().hold_stream(t);
  a().deallocate(p, t);
  EXPECT_EQ(sim().call_count(SimCall::record_event), 1u);
  EXPECT_EQ(st("active.all.current"), 1);
  EXPECT_NE(a().allocate(12 * MiB, s), p);
  sim().release_stream(t);
  EXPECT_EQ(a().allocate(12 * MiB, s), p);
}

TEST_F(AllocatorTest, FourArgumentDeallocateOnAnotherStreamIsALastUseThere) {
  const stream_t s = S(1), t = S(2);
  void* p = a().allocate(12 * MiB, s);
  sim().hold_stream(t);
  a().deallocate(p, 12 * MiB, 0, t);
  EXPECT_EQ(st("active.all.current"), 1);
  EXPECT_NE(a().allocate(12 * MiB, s), p);
  sim().release_stream(t);
  EXPECT_EQ(a().allocate(12 * MiB, s), p);
}

TEST_F(AllocatorTest, EventsArePooled) {
  const stream_t s = S(1), t = S(2);
  for (int i = 0; i < 10; ++i) {
    void* p = a().allocate(1000, s);
    a().record_stream(p, t);
    a().deallocate(p);
  }
  // Each event completes at once (t is not held) and goes back to the pool at the next malloc,
  // or at a read of the statistics (the last one here).
  EXPECT_EQ(sim().call_count(SimCall::record_event), 10u);
  EXPECT_EQ(sim().call_count(SimCall::create_event), 1u);
  EXPECT_EQ(st("active.all.current"), 0);
  void* q = a().allocate(1000, s);
  EXPECT_EQ(st("active.all.current"), 1);
  a().deallocate(q);
  a().validate();
}

TEST_F(AllocatorTest, PendingBlockCannotBeFreedAgain) {
  void* p = a().allocate(1000, S(1));
  a().record_stream(p, S(2));
  sim().hold_stream(S(2));
  a().deallocate(p);
  EXPECT_THROW(a().deallocate(p), invalid_argument);
  EXPECT_EQ(st("num_invalid_frees"), 1);
  a().validate();
}

TEST_F(AllocatorTest, RecordStreamOfAnUnknownPointerThrows) {
  int x = 0;
  EXPECT_THROW(a().record_stream(&x, S(1)), invalid_argument);
  void* p = a().allocate(1000);
  a().deallocate(p);
  EXPECT_THROW(a().record_stream(p, S(1)), invalid_argument);
}


// ---- empty_cache and the statistics -------------------------------------------------------------

TEST_F(AllocatorTest, EmptyCacheWaitsForPendingEvents) {
  const stream_t s = S(1), t = S(2);
  void* p = a().allocate(12 * MiB, s);
  a().record_stream(p, t);
  sim().hold_stream(t);
  a().deallocate(p);
  const auto forced = sim().forced_completions();
  a().empty_cache();
  EXPECT_EQ(sim().forced_completions(), forced + 1);
  EXPECT_EQ(sim().call_count(SimCall::synchronize_event), 1u);
  EXPECT_EQ(st("num_sync_all_streams"), 1);
  EXPECT_EQ(st("active.all.current"), 0);
  EXPECT_EQ(st("reserved_bytes.all.current"), 0);
  EXPECT_EQ(sim().usage(0).used, 0u);
  a().validate();
}



TEST_F(AllocatorTest, ActiveStatisticsFollowPendingBlocksAcrossResets) {
  // active = allocated + pending: its running sums and peaks must behave as if it were counted
  // on its own, including across reset_accumulated_stats and reset_peak_stats.
  const stream_t s = S(1), t = S(2);
  void* p = a().allocate(12 * MiB, s);
  void* q = a().allocate(12 * MiB, s);
  a().record_stream(p, t);
  sim().hold_stream(t);
  a().deallocate(p);  // pending
  a().deallocate(q);  // free at once
  EXPECT_EQ(st("active.all.current"), 1);
  EXPECT_EQ(st("active.all.peak"), 2);
  EXPECT_EQ(st("active.all.allocated"), 2);
  EXPECT_EQ(st("active.all.freed"), 1);
  EXPECT_EQ(st("active.large_pool.freed"), 1);
  a().reset_accumulated_stats(0);
  EXPECT_EQ(st("active.all.allocated"), 0);
  EXPECT_EQ(st("active.all.freed"), 0);
  a().reset_peak_stats(0);
  EXPECT_EQ(st("active.all.peak"), 1);
  EXPECT_EQ(st("active_bytes.all.peak"), I(12 * MiB));
  // While p is pending, a new allocation makes active 2 again: a new peak.
  void* r = a().allocate(12 * MiB, s);
  EXPECT_EQ(st("active.all.current"), 2);
  EXPECT_EQ(st("active.all.peak"), 2);
  EXPECT_EQ(st("active.large_pool.peak"), 2);
  EXPECT_EQ(st("active_bytes.all.peak"), I(24 * MiB));
  EXPECT_EQ(st("allocation.all.peak"), 1);
  sim().release_stream(t);
  a().deallocate(r);
  void* u = a().allocate(1000, s);  // processes the completed event: p leaves active
  EXPECT_EQ(st("active.all.allocated"), 2);
  EXPECT_EQ(st("active.all.freed"), 2);  // p (its event completed) and r
  EXPECT_EQ(st("active.all.current"), 1);
  EXPECT_EQ(st("active.small_pool.current"), 1);
  a().deallocate(u);
  a().validate();
}

}  // namespace
}  // namespace stitch

namespace stitch::detail {
namespace {

stream_t S(std::uintptr_t s) { return reinterpret_cast<stream_t>(s); }

// ---- StreamEvents itself ---------------------------------------------------------------------------

TEST(StreamEvents, ABlockBecomesFreeWhenItsLastStreamIsDone) {
  SimBackend sim;
  StreamEvents events(sim, 0);
  Block b(nullptr, 512, S(1), nullptr, nullptr, true, BlockState::allocated);
  b.stream_uses = {S(2), S(3)};
  sim.hold_stream(S(2));
  events.record(&b);
  EXPECT_EQ(b.event_count, 2);
  EXPECT_EQ(events.outstanding(), 2u);
  std::vector<Block*> done;
  events.poll([&](Block* x) { done.push_back(x); });
  EXPECT_EQ(events.outstanding(), 1u);  // stream 3's event completed, stream 2 is held
  EXPECT_TRUE(done.empty());
  sim.release_stream(S(2));
  events.poll([&](Block* x) { done.push_back(x); });
  EXPECT_EQ(done, std::vector<Block*>{&b});
  EXPECT_EQ(events.outstanding(), 0u);
  EXPECT_FALSE(events.wait_all([&](Block*) { ADD_FAILURE(); }));
  // A failing record puts its events back: nothing is counted.
  Block c(nullptr, 512, S(1), nullptr, nullptr, true, BlockState::allocated);
  c.stream_uses = {S(2), S(4)};
  sim.inject_fault(SimCall::record_event, 2, SimFault::error);
  EXPECT_THROW(events.record(&c), stitch::backend_error);
  EXPECT_EQ(c.event_count, 0);
  EXPECT_EQ(events.outstanding(), 0u);
}

TEST(StreamEvents, DeferredEventsAreRecordedOnceTheirStreamsMayBeTouched) {
  SimBackend sim;
  StreamEvents events(sim, 0);
  Block a(nullptr, 512, S(1), nullptr, nullptr, true, BlockState::allocated);
  Block b(nullptr, 512, S(1), nullptr, nullptr, true, BlockState::allocated);
  a.stream_uses = {S(2)};
  b.stream_uses = {S(3)};
  events.defer(&a);
  events.defer(&b);
  EXPECT_EQ(a.state, BlockState::deferred);
  EXPECT_EQ(events.deferred(), 2u);
  EXPECT_EQ(events.outstanding(), 0u);
  events.validate(0, 0, 2);
  // S(3) still captures: b stays deferred; a is recorded and becomes pending.
  events.record_deferred([](const Block* x) { return x->stream_uses[0] != S(3); });
  EXPECT_EQ(a.state, BlockState::pending);
  EXPECT_EQ(a.event_count, 1);
  EXPECT_EQ(b.state, BlockState::deferred);
  EXPECT_EQ(events.deferred(), 1u);
  events.validate(0, 1, 1);
  EXPECT_THROW(events.validate(0, 2, 1), stitch::error) << "a wrong recount is caught";
  // A failed record keeps the block deferred (and nothing counted); the next try records it.
  sim.inject_fault(SimCall::record_event, 1, SimFault::error);
  EXPECT_THROW(events.record_deferred([](const Block*) { return true; }), stitch::backend_error);
  EXPECT_EQ(b.state, BlockState::deferred);
  EXPECT_EQ(events.outstanding(), 1u);
  events.record_deferred([](const Block*) { return true; });
  EXPECT_EQ(b.state, BlockState::pending);
  std::vector<Block*> done;
  EXPECT_TRUE(events.wait_all([&](Block* x) { done.push_back(x); }));
  EXPECT_EQ(done.size(), 2u);
  EXPECT_EQ(events.outstanding(), 0u);
}

TEST(StreamEvents, ADoneThatFailsLeavesTheLastEventQueuedForTheNextPoll) {
  // `done` files the block; when the host has no memory for that, nothing may be lost: the block
  // stays pending with its last event queued (before, the event left its queue first and the
  // block stayed pending for good, its memory never released).
  SimBackend sim;
  StreamEvents events(sim, 0);
  Block b(nullptr, 512, S(1), nullptr, nullptr, true, BlockState::allocated);
  b.stream_uses = {S(2), S(3)};
  events.record(&b);
  int calls = 0;
  auto failing = [&](Block*) {
    ++calls;
    throw std::bad_alloc();
  };
  EXPECT_THROW(events.poll(failing), std::bad_alloc);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(b.event_count, 1) << "the first event retired, the last stays";
  EXPECT_EQ(events.outstanding(), 1u);
  events.validate(0, 1, 0);
  EXPECT_THROW(events.wait_all(failing), std::bad_alloc);
  EXPECT_EQ(events.outstanding(), 1u);
  std::vector<Block*> done;
  events.poll([&](Block* x) { done.push_back(x); });
  EXPECT_EQ(done, std::vector<Block*>{&b});
  EXPECT_EQ(b.event_count, 0);
  EXPECT_EQ(events.outstanding(), 0u);
}

}  // namespace
}  // namespace stitch::detail
