// Private pools for CUDA graphs and MemPools (core/private_pool.hpp) on the simulated device in
// capture mode, which enforces CUDA's capture rules: an event query or a synchronization on a
// capturing stream, or memory returned while one captures, invalidates the capture.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/config.hpp"
#include "core/private_pools.hpp"
#include "stitch/errors.hpp"
#include "stitch/sim_backend.hpp"

namespace stitch {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

stream_t S(int n) { return reinterpret_cast<stream_t>(static_cast<std::uintptr_t>(n) * 0x10); }

struct PrivatePools : ::testing::TestWithParam<const char*> {
  std::shared_ptr<SimBackend> sim;
  std::unique_ptr<Allocator> alloc;
  const PoolId pool{1, 0};
  void SetUp() override {
    SimBackend::Options o;
    o.capacity = 256 * MiB;
    sim = std::make_shared<SimBackend>(o);
    alloc = std::make_unique<Allocator>(Config::parse(GetParam()), sim);
  }
  std::int64_t reserved() const { return alloc->stats(0).reserved_bytes[kAll].current; }
  /// A capture of stream 1, routed to `id`, as PyTorch's CUDAGraph::capture_begin does it.
  void begin(PoolId id, stream_t captured = S(1)) {
    sim->begin_capture(0, captured);
    alloc->begin_allocate_to_pool(0, id, [captured](stream_t s) { return s == captured; });
  }
  bool end(PoolId id, stream_t captured = S(1)) {
    alloc->end_allocate_to_pool(0, id);
    return sim->end_capture(captured);
  }
};

TEST_P(PrivatePools, CapturedAllocationsComeFromThePoolsOwnSegments) {
  // A free cached block of the default pool that would fit is not used during the capture.
  void* cached = alloc->allocate(4 * MiB, S(1));
  alloc->deallocate(cached, S(1));
  const std::int64_t before = reserved();
  begin(pool);
  void* a = alloc->allocate(4 * MiB, S(1));
  void* other = alloc->allocate(4 * MiB, S(2));  // not the captured stream: the default pool
  EXPECT_NE(a, cached);
  EXPECT_GT(reserved(), before);
  std::memset(a, 0x5A, 4 * MiB);
  // Freed during the capture, reused by the capture's next allocation of the same stream.
  alloc->deallocate(a, S(1));
  void* again = alloc->allocate(4 * MiB, S(1));
  EXPECT_EQ(again, a);
  alloc->validate();
  EXPECT_TRUE(end(pool));
  alloc->deallocate(again, S(1));
  // After the capture the pool's free block is not handed out on its stream.
  void* after = alloc->allocate(4 * MiB, S(1));
  EXPECT_NE(after, a);
  EXPECT_EQ(after, cached);
  alloc->deallocate(after, S(1));
  alloc->deallocate(other, S(2));
  EXPECT_EQ(sim->capture_invalidations(), 0u);
  alloc->validate();
}

TEST_P(PrivatePools, NothingIsQueriedSynchronizedOrReturnedDuringACapture) {
  // A cross-stream block freed before the capture leaves an event outstanding.
  sim->hold_stream(S(3));
  void* crossed = alloc->allocate(2 * MiB, S(1));
  alloc->record_stream(crossed, S(3));
  alloc->deallocate(crossed, S(1));
  begin(pool);
  // Allocations during the capture do not poll that event; the OOM ladder neither waits nor
  // returns memory; empty_cache does nothing.
  void* a = alloc->allocate(8 * MiB, S(1));
  EXPECT_THROW((void)alloc->allocate(1024 * MiB, S(1)), out_of_memory);
  alloc->empty_cache();
  // A block of the capture used on another stream is pending, its event deferred.
  alloc->record_stream(a, S(3));
  const std::uint64_t records = sim->call_count(SimCall::record_event);
  alloc->deallocate(a, S(1));
  EXPECT_EQ(sim->call_count(SimCall::record_event), records);
  alloc->validate();
  // PyTorch ends the route, then the capture: nothing may be recorded in between.
  alloc->end_allocate_to_pool(0, pool);
  EXPECT_EQ(sim->call_count(SimCall::record_event), records);
  EXPECT_TRUE(sim->end_capture(S(1)));
  EXPECT_EQ(sim->capture_invalidations(), 0u);
  // The first allocation after the routes records the deferred event.
  void* next = alloc->allocate(512, S(2));
  EXPECT_EQ(sim->call_count(SimCall::record_event), records + 1);
  alloc->deallocate(next, S(2));
  sim->release_stream(S(3));
  alloc->validate();
}

TEST_P(PrivatePools, ReleasePoolReturnsTheMemoryOnceItsBlocksAreFree) {
  const std::int64_t before = reserved();
  begin(pool);
  void* out = alloc->allocate(6 * MiB, S(1));  // a graph output that outlives the capture
  void* tmp = alloc->allocate(3 * MiB, S(1));
  alloc->deallocate(tmp, S(1));
  ASSERT_TRUE(end(pool));
  // The snapshot names the pool of each segment, as PyTorch's segment_pool_id does.
  int in_pool = 0;
  for (const SegmentSnapshot& s : alloc->snapshot().segments)
    if (s.pool_id == pool) ++in_pool;
  EXPECT_EQ(in_pool, 1);  // one 20 MiB segment serves the 6 MiB and the 3 MiB request
  alloc->release_pool(0, pool);  // the graph is destroyed; its output is still alive
  alloc->empty_cache();
  EXPECT_GT(reserved(), before);
  alloc->deallocate(out, S(1));
  alloc->empty_cache();
  EXPECT_EQ(reserved(), before);
  EXPECT_THROW(alloc->release_pool(0, pool), invalid_argument);  // gone
  alloc->validate();
}

TEST_P(PrivatePools, ASharedPoolLivesUntilItsLastUse) {
  // Two graphs share one pool (torch.cuda.graph_pool_handle()).
  begin(pool);
  void* a = alloc->allocate(2 * MiB, S(1));
  alloc->deallocate(a, S(1));
  ASSERT_TRUE(end(pool));
  begin(pool);
  void* b = alloc->allocate(2 * MiB, S(1));
  EXPECT_EQ(b, a);  // the second capture reuses the first one's free memory
  alloc->deallocate(b, S(1));
  ASSERT_TRUE(end(pool));
  const std::int64_t held = reserved();
  alloc->release_pool(0, pool);
  alloc->empty_cache();
  EXPECT_EQ(reserved(), held);  // one use is left
  alloc->release_pool(0, pool);
  EXPECT_LT(reserved(), held);
  alloc->validate();
}

TEST_P(PrivatePools, NestedRoutesAndBadCalls) {
  const PoolId inner{2, 0};
  begin(pool);
  alloc->begin_allocate_to_pool(0, inner, [](stream_t s) { return s == S(4); });
  void* a = alloc->allocate(1 * MiB, S(1));
  void* b = alloc->allocate(1 * MiB, S(4));
  alloc->end_allocate_to_pool(0, inner);
  EXPECT_THROW(alloc->end_allocate_to_pool(0, inner), invalid_argument);
  EXPECT_THROW(alloc->begin_allocate_to_pool(0, inner, StreamFilter{}), invalid_argument);
  EXPECT_THROW(alloc->release_pool(0, PoolId{9, 9}), invalid_argument);
  EXPECT_THROW(alloc->begin_allocate_to_pool(5, inner, [](stream_t) { return true; }), error);
  EXPECT_TRUE(end(pool));
  alloc->deallocate(a, S(1));
  alloc->deallocate(b, S(4));
  alloc->release_pool(0, pool);
  alloc->release_pool(0, inner);
  alloc->validate();
}

TEST_P(PrivatePools, OtherStreamsGrowWithoutMovingPagesDuringACapture) {
  // Short of memory, with free pages scattered on stream 2: stitching would move them (unmapping
  // them) for a large request, which a capture forbids.
  std::vector<void*> live;
  for (int i = 0; i < 24; ++i) live.push_back(alloc->allocate(10 * MiB, S(2)));
  for (int i = 0; i < 24; i += 2) alloc->deallocate(live[i], S(2));
  begin(pool);
  try {
    void* big = alloc->allocate(40 * MiB, S(2));  // not the captured stream: the default pool
    alloc->deallocate(big, S(2));
  } catch (const out_of_memory&) {  // fine: only moving pages could have served it
  }
  EXPECT_TRUE(end(pool));
  EXPECT_EQ(sim->capture_invalidations(), 0u);
  for (int i = 1; i < 24; i += 2) alloc->deallocate(live[i], S(2));
  alloc->validate();
}

// A capture the allocator was not told about (no route): it asks the back end whether a stream
// captures before recording a cross-stream free's events, polling events, or the slow path.
TEST_P(PrivatePools, WithoutARouteACapturingStreamIsAskedAbout) {
  sim->hold_stream(S(3));
  void* held = alloc->allocate(2 * MiB, S(1));
  alloc->record_stream(held, S(3));
  alloc->deallocate(held, S(1));  // an event outstanding on the held stream
  sim->begin_capture(0, S(2));
  void* p = alloc->allocate(2 * MiB, S(1));
  alloc->record_stream(p, S(2));
  const std::uint64_t records = sim->call_count(SimCall::record_event);
  const std::uint64_t queries = sim->call_count(SimCall::query_event);
  alloc->deallocate(p, S(1));  // its event would be a node of the graph: deferred
  EXPECT_EQ(sim->call_count(SimCall::record_event), records);
  void* q = alloc->allocate(64 * MiB, S(2));  // on the capturing stream: no poll, new memory only
  EXPECT_EQ(sim->call_count(SimCall::query_event), queries);
  EXPECT_THROW((void)alloc->allocate(1024 * MiB, S(2)), out_of_memory);  // nothing returned
  alloc->deallocate(q, S(2));
  alloc->validate();
  EXPECT_TRUE(sim->end_capture(S(2)));
  EXPECT_EQ(sim->capture_invalidations(), 0u);
  void* r = alloc->allocate(512, S(3));  // after the capture: the deferred event is recorded
  EXPECT_EQ(sim->call_count(SimCall::record_event), records + 1);
  alloc->deallocate(r, S(3));
  sim->release_stream(S(3));
  alloc->validate();
}

// The simulator's capture rules are real: what CUDA forbids on a capturing stream fails.
TEST_P(PrivatePools, TheSimulatorEnforcesTheCaptureRules) {
  const event_t e = sim->create_event(0);
  sim->begin_capture(0, S(2));
  sim->record_event(0, e, S(2));  // a node of the graph, not work
  EXPECT_THROW((void)sim->query_event(0, e), backend_error);
  EXPECT_FALSE(sim->end_capture(S(2)));
  sim->begin_capture(0, S(2));
  EXPECT_THROW(sim->synchronize_stream(0, S(2)), backend_error);
  EXPECT_FALSE(sim->end_capture(S(2)));
  void* p = sim->allocate(0, 2 * MiB);  // relaxed: allocating is allowed, returning is not
  sim->begin_capture(0, S(2));
  EXPECT_THROW(sim->deallocate(0, p, 2 * MiB), backend_error);
  EXPECT_FALSE(sim->end_capture(S(2)));
  sim->deallocate(0, p, 2 * MiB);
  EXPECT_EQ(sim->capture_invalidations(), 3u);
  sim->destroy_event(0, e);
}

INSTANTIATE_TEST_SUITE_P(Configs, PrivatePools,
                         ::testing::Values("", "expandable_segments:True",
                                           "expandable_segments:True,stitching:True",
                                           "expandable_segments:True,stitching:True,"
                                           "stitch_reuse_pages:True"));

}  // namespace
}  // namespace stitch

// ---- PrivatePools itself: routes, uses, and whether the device may be touched ---------------------

namespace stitch::detail {
namespace {

stream_t S(int n) { return reinterpret_cast<stream_t>(static_cast<std::uintptr_t>(n) * 0x10); }

TEST(PrivatePoolRoutes, TheNewestRouteThatAcceptsAStreamTakesItsAllocations) {
  SimBackend sim;
  PrivatePools pools(sim, 0);
  BlockPool device_small(true);
  const PoolId one{1, 0}, two{2, 0};
  EXPECT_FALSE(pools.routing());
  EXPECT_EQ(&pools.route(S(1), true, device_small), &device_small);
  pools.begin(one, [](stream_t s) { return s == S(1); });
  BlockPool& one_small = pools.route(S(1), true, device_small);
  EXPECT_NE(&one_small, &device_small);
  EXPECT_TRUE(one_small.small);
  EXPECT_NE(one_small.owner, nullptr);
  EXPECT_EQ(one_small.owner->id, one);
  EXPECT_EQ(&pools.route(S(2), true, device_small), &device_small) << "a stream it does not accept";
  pools.begin(two, [](stream_t) { return true; });
  EXPECT_EQ(pools.route(S(1), false, device_small).owner->id, two) << "the newest route first";
  pools.end(one);  // the route to `one`, though begun earlier
  EXPECT_EQ(pools.route(S(1), false, device_small).owner->id, two);
  pools.end(two);
  EXPECT_FALSE(pools.routing());
  EXPECT_THROW(pools.end(two), invalid_argument);
  EXPECT_THROW(pools.begin(one, StreamFilter{}), invalid_argument);
  // Uses: each begin is one; the memory may go back once the last is released and no route is
  // underway.
  pools.begin(one, [](stream_t) { return true; });  // `one` in use twice now
  EXPECT_FALSE(pools.release(one)) << "a route is underway";
  pools.end(one);
  EXPECT_TRUE(pools.release(one));
  EXPECT_THROW(pools.release(one), invalid_argument) << "no use left";
  EXPECT_TRUE(pools.release(two));
  EXPECT_THROW(pools.release(PoolId{9, 9}), invalid_argument);
  int released = 0;
  pools.release_unused([&](Block*) { ++released; });
  EXPECT_EQ(released, 0) << "they held no memory";
  pools.validate(StoreCount{});
}

TEST(PrivatePoolRoutes, TheDeviceIsNotTouchedDuringARouteOrACapture) {
  SimBackend sim;
  PrivatePools pools(sim, 0);
  EXPECT_TRUE(pools.may_touch_device({S(1), S(2)}));
  sim.begin_capture(0, S(2));  // a capture stitch was not told about
  EXPECT_TRUE(pools.may_touch_device({S(1)}));
  EXPECT_FALSE(pools.may_touch_device({S(1), S(2)}));
  Block b(nullptr, 512, S(1), nullptr, nullptr, true, BlockState::allocated);
  EXPECT_TRUE(pools.may_touch_device(&b));
  b.stream_uses = {S(3), S(2)};
  EXPECT_FALSE(pools.may_touch_device(&b)) << "it was used on the capturing stream";
  EXPECT_TRUE(sim.end_capture(S(2)));
  EXPECT_TRUE(pools.may_touch_device(&b));
  pools.begin(PoolId{1, 0}, [](stream_t) { return false; });
  EXPECT_FALSE(pools.may_touch_device({})) << "any route: a stream may be capturing";
  // A segment of a pool the device does not have is caught.
  StoreCount count;
  PrivatePool stranger(PoolId{5, 5});
  count.private_segments.push_back(&stranger);
  EXPECT_THROW(pools.validate(count), stitch::error);
}

}  // namespace
}  // namespace stitch::detail
