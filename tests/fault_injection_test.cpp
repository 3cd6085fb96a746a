// Fault injection: a fixed workload (sizes from both pools, record_stream, held streams,
// cross-stream frees, empty_cache, the out-of-memory ladder) is run once per position of an
// injected backend fault, for every kind of backend call the allocator makes and for both fault
// flavours. Whatever fails must fail cleanly: the API call throws out_of_memory or
// backend_error (a free that cannot record its events leaves the pointer allocated), the
// allocator's invariants hold, every live block keeps its data, and once everything is freed
// and the cache emptied the device holds nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/config.hpp"
#include "stitch/errors.hpp"
#include "stitch/sim_backend.hpp"
#include "support/data_pattern.hpp"

namespace stitch {
namespace {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

stream_t S(int n) { return reinterpret_cast<stream_t>(static_cast<std::uintptr_t>(n) * 0x10); }

// ---- the workload ----------------------------------------------------------------------------------

enum class Op {
  alloc,       ///< slot = allocate(size, stream)
  free,        ///< deallocate(slot)
  free_on,     ///< deallocate(slot, stream): last use on `stream`
  free_sized,  ///< deallocate(slot, requested size, device 0, allocation stream)
  record,      ///< record_stream(slot, stream)
  hold,        ///< sim: hold `stream`
  release,     ///< sim: release `stream`
  empty_cache
};

struct Step {
  Op op;
  int slot = -1;
  std::size_t size = 0;
  int stream = 0;  ///< S(stream)
};

Step alloc(int slot, std::size_t size, int stream) { return {Op::alloc, slot, size, stream}; }
Step free_(int slot) { return {Op::free, slot, 0, 0}; }
Step free_on(int slot, int stream) { return {Op::free_on, slot, 0, stream}; }
Step free_sized(int slot) { return {Op::free_sized, slot, 0, 0}; }
Step record(int slot, int stream) { return {Op::record, slot, 0, stream}; }
Step hold(int stream) { return {Op::hold, -1, 0, stream}; }
Step release(int stream) { return {Op::release, -1, 0, stream}; }
Step empty_cache() { return {Op::empty_cache, -1, 0, 0}; }

constexpr std::size_t kCapacity = 64 * MiB;
constexpr int kSlots = 17;

// On a 64 MiB device. The comments describe the fault-free run (R = reserved MiB).
const std::vector<Step>& workload() {
  static const std::vector<Step> steps = {
      alloc(0, 1000, 1),             // a 2 MiB small segment of stream 1 (R 2)
      alloc(1, 300 * KiB, 1),
      alloc(2, 3 * MiB, 1),          // a 20 MiB segment, L1 (R 22)
      alloc(3, 18 * MiB, 1),         // its own 18 MiB segment (R 40)
      record(1, 2),
      record(2, 2),
      record(3, 3),
      hold(2),
      free_(1),                      // creates and records an event on held stream 2: pending
      free_(2),                      // pending
      alloc(4, 2000, 1),             // queries the pending events (incomplete)
      free_(3),                      // an event on stream 3, which completes at once
      alloc(5, 18 * MiB, 1),         // processes it: reuses slot 3's block
      alloc(6, 5 * MiB, 2),          // L2, a 20 MiB segment of stream 2 (R 60)
      free_on(0, 3),                 // last use on stream 3: an event from the pool
      release(2),
      alloc(7, 700, 1),              // every pending block becomes free; L1 is entirely free
      empty_cache(),                 // returns L1 (R 40)
      alloc(8, 20 * MiB, 1),         // (R 60)
      free_(8),                      // cached
      alloc(9, 24 * MiB, 3),         // does not fit: the ladder releases slot 8's segment (R 64)
      hold(3),
      record(5, 3),
      record(4, 3),
      free_(5),                      // pending on held stream 3
      free_(4),                      // pending
      empty_cache(),                 // synchronizes (forced), returns slot 5's segment (R 46)
      release(3),
      alloc(10, 40 * MiB, 1),        // out of memory even after the ladder
      free_(6),                      // L2 is entirely free, cached
      alloc(11, 512, 2),             // a small segment of stream 2 (R 48)
      alloc(12, MiB, 1),
      record(12, 2),
      hold(2),
      free_on(12, 3),                // two events: held stream 2 and stream 3
      alloc(13, 6 * MiB, 1),         // ladder: synchronizes, returns L2, then fits (R 48)
      release(2),
      free_(9),
      free_(7),
      free_(11),
      empty_cache(),                 // only slot 13's segment stays (R 20)
      alloc(14, 30 * MiB, 1),        // (R 50)
      alloc(15, 1500, 2),            // (R 52)
      record(14, 2),
      free_sized(15),                // on its own stream: no event
      free_on(13, 2),                // an event that completes at once
      alloc(16, 8 * MiB, 3),         // ladder: returns the segments of slots 13 and 15 (R 50)
      empty_cache(),
  };
  return steps;
}

// ---- the harness -----------------------------------------------------------------------------------

struct Live {
  void* ptr;
  std::size_t size;
  stream_t stream;
  std::uint64_t seed;
};

struct Outcome {
  int backend_errors = 0;
  int ooms = 0;
  int failed_frees = 0;
  std::vector<std::size_t> oom_steps;  ///< 1-based steps that threw out_of_memory
  std::vector<std::string> problems;  ///< anything that breaks the contract
};

class Harness {
 public:
  explicit Harness(bool expandable = false) {
    SimBackend::Options options;
    options.capacity = kCapacity;
    sim_ = std::make_shared<SimBackend>(options);
    a_ = std::make_unique<Allocator>(
        Config::parse(expandable ? "backend:sim,expandable_segments:True" : "backend:sim"), sim_);
  }

  SimBackend& sim() { return *sim_; }
  Allocator& a() { return *a_; }

  /// Runs the workload; returns what failed and how.
  Outcome run() {
    Outcome out;
    const auto& steps = workload();
    for (std::size_t i = 0; i < steps.size(); ++i) {
      step(i, steps[i], out);
      check(i, out);
    }
    return out;
  }

  /// Frees everything and empties the cache with no faults armed; reports what is left.
  void drain(Outcome& out) {
    sim_->clear_faults();
    for (int s = 1; s <= 3; ++s) sim_->release_stream(S(s));
    for (auto& slot : slots_) {
      if (!slot) continue;
      if (!test::pattern_intact(slot->ptr, slot->size, slot->seed)) problem(out, "drain: data of a block changed");
      try {
        a_->deallocate(slot->ptr);
      } catch (const std::exception& e) {
        problem(out, std::string("drain: free failed: ") + e.what());
      }
      slot.reset();
    }
    try {
      a_->empty_cache();
      a_->validate();
    } catch (const std::exception& e) {
      problem(out, std::string("drain: ") + e.what());
    }
    const SimUsage u = sim_->usage(0);
    if (u.used != 0 || u.allocations != 0 || u.physical_handles != 0 || u.mappings != 0 ||
        u.reservations != 0)
      problem(out, "drain: the device still holds " + std::to_string(u.used) + " bytes: " +
                       std::to_string(u.allocations) + " allocations, " +
                       std::to_string(u.physical_handles) + " physical handles, " +
                       std::to_string(u.mappings) + " mappings, " +
                       std::to_string(u.reservations) + " reservations");
    for (const char* key : {"allocation.all.current", "active.all.current",
                            "reserved_bytes.all.current", "segment.all.current",
                            "requested_bytes.all.current"}) {
      if (a_->stat(0, key).value_or(-1) != 0) problem(out, std::string("drain: ") + key + " != 0");
    }
  }

 private:
  static void problem(Outcome& out, std::string what) { out.problems.push_back(std::move(what)); }

  void step(std::size_t index, const Step& s, Outcome& out) {
    const std::string where = "step " + std::to_string(index + 1) + ": ";
    std::optional<Live>* slot = s.slot >= 0 ? &slots_[static_cast<std::size_t>(s.slot)] : nullptr;
    // Steps on a slot that an earlier failure left empty (or full) are skipped.
    if (s.op == Op::alloc && slot->has_value()) return;
    if ((s.op == Op::free || s.op == Op::free_on || s.op == Op::free_sized || s.op == Op::record) &&
        !slot->has_value())
      return;
    const bool is_free = s.op == Op::free || s.op == Op::free_on || s.op == Op::free_sized;
    try {
      switch (s.op) {
        case Op::alloc: {
          void* p = a_->allocate(s.size, S(s.stream), 0);
          if (p == nullptr) {
            problem(out, where + "allocate returned nullptr");
            return;
          }
          const std::uint64_t seed = ++seed_;
          test::write_pattern(p, s.size, seed);
          *slot = Live{p, s.size, S(s.stream), seed};
          break;
        }
        case Op::free:
        case Op::free_on:
        case Op::free_sized: {
          const Live& l = **slot;
          if (!test::pattern_intact(l.ptr, l.size, l.seed)) problem(out, where + "data changed before free");
          if (s.op == Op::free) a_->deallocate(l.ptr);
          if (s.op == Op::free_on) a_->deallocate(l.ptr, S(s.stream));
          if (s.op == Op::free_sized) a_->deallocate(l.ptr, l.size, 0, l.stream);
          slot->reset();
          break;
        }
        case Op::record:
          a_->record_stream((*slot)->ptr, S(s.stream));
          break;
        case Op::hold:
          sim_->hold_stream(S(s.stream));
          break;
        case Op::release:
          sim_->release_stream(S(s.stream));
          break;
        case Op::empty_cache:
          a_->empty_cache();
          break;
      }
    } catch (const out_of_memory&) {
      ++out.ooms;
      out.oom_steps.push_back(index + 1);
      if (s.op != Op::alloc) problem(out, where + "out_of_memory from a call that does not allocate");
    } catch (const backend_error&) {
      ++out.backend_errors;
      if (is_free) {
        // A free that failed must have changed nothing: the pointer is still allocated.
        ++out.failed_frees;
        const Live& l = **slot;
        const auto info = a_->find(l.ptr);
        if (!info || info->requested != l.size) problem(out, where + "failed free lost the block");
      }
    } catch (const std::exception& e) {
      problem(out, where + "unexpected exception: " + e.what());
    }
  }

  void check(std::size_t index, Outcome& out) {
    const std::string where = "after step " + std::to_string(index + 1) + ": ";
    try {
      a_->validate();
    } catch (const std::exception& e) {
      problem(out, where + e.what());
    }
    for (const auto& slot : slots_) {
      if (!slot) continue;
      if (!test::pattern_intact(slot->ptr, slot->size, slot->seed)) problem(out, where + "a live block lost its data");
      if (!a_->find(slot->ptr)) problem(out, where + "a live block is no longer allocated");
    }
  }

  std::shared_ptr<SimBackend> sim_;
  std::unique_ptr<Allocator> a_;
  std::array<std::optional<Live>, kSlots> slots_{};
  std::uint64_t seed_ = 0;
};

std::string describe(const Outcome& out) {
  std::ostringstream os;
  for (const auto& p : out.problems) os << "\n  " << p;
  return os.str();
}

// ---- tests -----------------------------------------------------------------------------------------

TEST(FaultInjection, WorkloadWithoutFaultsIsClean) {
  Harness h;
  Outcome out = h.run();
  EXPECT_EQ(out.backend_errors, 0);
  ASSERT_EQ(out.oom_steps, std::vector<std::size_t>{29});  // the 40 MiB request cannot fit
  // The workload reaches every part of the allocator the sweep is meant to hit.
  EXPECT_GE(h.a().stat(0, "num_alloc_retries").value_or(0), 2);
  EXPECT_GE(h.a().stat(0, "num_sync_all_streams").value_or(0), 2);
  EXPECT_GT(h.sim().forced_completions(), 0u);
  for (SimCall kind : {SimCall::allocate, SimCall::deallocate, SimCall::create_event,
                       SimCall::record_event, SimCall::query_event, SimCall::synchronize_event})
    EXPECT_GT(h.sim().call_count(kind), 0u) << to_string(kind);
  h.drain(out);
  EXPECT_TRUE(out.problems.empty()) << describe(out);
}

struct FaultCase {
  SimCall call;
  SimFault fault;
  bool expandable = false;  ///< expandable_segments:True
};

void PrintTo(const FaultCase& c, std::ostream* os) {
  *os << (c.expandable ? "expandable/" : "") << to_string(c.call) << "/"
      << (c.fault == SimFault::error ? "error" : "out_of_memory");
}

std::string case_name(const ::testing::TestParamInfo<FaultCase>& info) {
  return std::string(to_string(info.param.call)) + "_" +
         (info.param.fault == SimFault::error ? "error" : "oom");
}

/// Both fault flavours for each call kind.
std::vector<FaultCase> cases(std::initializer_list<SimCall> calls, bool expandable) {
  std::vector<FaultCase> out;
  for (SimCall call : calls)
    for (SimFault fault : {SimFault::out_of_memory, SimFault::error})
      out.push_back(FaultCase{call, fault, expandable});
  return out;
}

class FaultSweep : public ::testing::TestWithParam<FaultCase> {};

TEST_P(FaultSweep, EveryPositionFailsCleanly) {
  const FaultCase c = GetParam();
  // A fault that reports out-of-memory is an error for calls that cannot run out of memory.
  const bool reports_oom =
      c.fault == SimFault::out_of_memory &&
      (c.call == SimCall::allocate || c.call == SimCall::reserve ||
       c.call == SimCall::create_physical || c.call == SimCall::map);  // cuMemMap can run out
  std::uint64_t fired_positions = 0;
  constexpr std::uint64_t kMaxPositions = 500;  // far more calls than the workload makes
  for (std::uint64_t pos = 1; pos <= kMaxPositions; ++pos) {
    SCOPED_TRACE("fault at call " + std::to_string(pos) + " of " + to_string(c.call));
    Harness h(c.expandable);
    h.sim().inject_fault(c.call, pos, c.fault);
    Outcome out = h.run();
    const bool fired = h.sim().faults_fired() == 1;
    if (!fired) {
      // The workload makes fewer calls of this kind: the sweep is complete.
      EXPECT_EQ(out.backend_errors, 0);
      h.drain(out);
      EXPECT_TRUE(out.problems.empty()) << describe(out);
      break;
    }
    ++fired_positions;
    if (reports_oom) {
      // The allocator treats it like a full device: the ladder may recover, or the request
      // fails with out_of_memory. Nothing else.
      EXPECT_EQ(out.backend_errors, 0);
    } else {
      // The failing call, and only it, throws backend_error.
      EXPECT_EQ(out.backend_errors, 1);
    }
    h.drain(out);
    EXPECT_TRUE(out.problems.empty()) << describe(out);
    if (HasFailure()) break;  // one detailed failure is enough
  }
  RecordProperty("positions", static_cast<int>(fired_positions));
  std::printf("[ sweep  ] %s%s: faults at %llu positions\n", c.expandable ? "expandable " : "",
              to_string(c.call), static_cast<unsigned long long>(fired_positions));
  EXPECT_GT(fired_positions, 0u) << "the workload never calls " << to_string(c.call);
  EXPECT_LT(fired_positions, kMaxPositions);
}

INSTANTIATE_TEST_SUITE_P(AllCalls, FaultSweep,
                         ::testing::ValuesIn(cases({SimCall::allocate, SimCall::deallocate,
                                                    SimCall::create_event, SimCall::record_event,
                                                    SimCall::query_event,
                                                    SimCall::synchronize_event},
                                                   /*expandable=*/false)),
                         case_name);

// With expandable_segments:True memory comes from reserve/create_physical/map instead, and goes
// back through unmap/release_physical/release_reservation after a synchronize_stream.
INSTANTIATE_TEST_SUITE_P(ExpandableCalls, FaultSweep,
                         ::testing::ValuesIn(cases(
                             {SimCall::reserve, SimCall::release_reservation,
                              SimCall::create_physical, SimCall::release_physical, SimCall::map,
                              SimCall::set_access, SimCall::unmap, SimCall::synchronize_stream,
                              SimCall::create_event,
                              SimCall::record_event, SimCall::query_event,
                              SimCall::synchronize_event},
                             /*expandable=*/true)),
                         case_name);

TEST(FaultInjection, ExpandableWorkloadWithoutFaultsIsClean) {
  Harness h(/*expandable=*/true);
  Outcome out = h.run();
  EXPECT_EQ(out.backend_errors, 0);
  for (SimCall kind : {SimCall::reserve, SimCall::create_physical, SimCall::map, SimCall::unmap,
                       SimCall::release_physical, SimCall::release_reservation,
                       SimCall::synchronize_stream})
    EXPECT_GT(h.sim().call_count(kind), 0u) << to_string(kind);
  EXPECT_EQ(h.sim().call_count(SimCall::allocate), 0u);
  h.drain(out);
  EXPECT_TRUE(out.problems.empty()) << describe(out);
}

TEST(FaultInjection, FailedEventRecordingLeavesThePointerAllocated) {
  Harness h;
  void* p = h.a().allocate(12 * MiB, S(1));
  std::memset(p, 0x5A, 12 * MiB);
  h.a().record_stream(p, S(2));
  h.sim().inject_fault(SimCall::record_event, 1, SimFault::error);
  EXPECT_THROW(h.a().deallocate(p), backend_error);
  ASSERT_TRUE(h.a().find(p).has_value());
  EXPECT_EQ(h.a().stat(0, "allocation.all.current"), 1);
  EXPECT_EQ(static_cast<unsigned char*>(p)[12 * MiB - 1], 0x5A);
  h.a().validate();
  // The block is not handed out again while it is still allocated.
  void* q = h.a().allocate(12 * MiB, S(1));
  EXPECT_NE(q, p);
  // Freeing it again works once the backend recovers.
  h.a().deallocate(p);
  h.a().deallocate(q);
  h.a().empty_cache();
  EXPECT_EQ(h.sim().usage(0).used, 0u);
}

TEST(FaultInjection, FailedSecondEventRecordingLeavesThePointerAllocated) {
  Harness h;
  void* p = h.a().allocate(1000, S(1));
  h.a().record_stream(p, S(2));
  h.a().record_stream(p, S(3));
  h.sim().hold_stream(S(2));
  h.sim().inject_fault(SimCall::record_event, 2, SimFault::error);
  EXPECT_THROW(h.a().deallocate(p), backend_error);
  ASSERT_TRUE(h.a().find(p).has_value());
  EXPECT_EQ(h.a().stat(0, "active.all.current"), 1);
  h.a().validate();
  h.a().deallocate(p);
  EXPECT_EQ(h.a().stat(0, "allocation.all.current"), 0);
  h.sim().release_stream(S(2));
  h.a().empty_cache();
  h.a().validate();
  EXPECT_EQ(h.a().stat(0, "active.all.current"), 0);
  EXPECT_EQ(h.sim().usage(0).used, 0u);
}

TEST(FaultInjection, FailedSegmentReleaseKeepsTheSegmentCached) {
  Harness h;
  void* p = h.a().allocate(12 * MiB, S(1));
  h.a().deallocate(p);
  h.sim().inject_fault(SimCall::deallocate, 1, SimFault::error);
  EXPECT_THROW(h.a().empty_cache(), backend_error);
  EXPECT_EQ(h.a().stat(0, "reserved_bytes.all.current"), static_cast<std::int64_t>(12 * MiB));
  h.a().validate();
  EXPECT_EQ(h.a().allocate(12 * MiB, S(1)), p);  // still cached and usable
  h.a().deallocate(p);
  h.a().empty_cache();
  EXPECT_EQ(h.sim().usage(0).used, 0u);
}

// A map of a run fails after some of its pages were mapped: the back end takes them back (a
// run is mapped all or nothing), so nothing is left mapped behind the bookkeeping's back and
// the same range maps again. (A stray mapping whose unmap fails as well blocks only its own
// addresses: PageMapper.MapsAllOrNothingAndRetriesWhatAnUndoLeft.)
TEST(FaultInjection, FailedMapInARunLeavesNothingMapped) {
  Harness h(/*expandable=*/true);
  h.sim().inject_fault(SimCall::map, 2, SimFault::error);
  EXPECT_THROW((void)h.a().allocate(50 * MiB, S(1)), backend_error);  // three 20 MiB pages
  EXPECT_EQ(h.sim().faults_fired(), 1u);
  h.a().validate();
  EXPECT_EQ(h.a().stat(0, "reserved_bytes.all.current"), 0);
  EXPECT_EQ(h.sim().usage(0).mappings, 0u);
  EXPECT_EQ(h.sim().usage(0).physical_handles, 0u);
  EXPECT_NO_THROW(h.a().empty_cache());
  EXPECT_EQ(h.sim().usage(0).used, 0u);
  EXPECT_EQ(h.sim().usage(0).reservations, 0u);
  // The same range can be mapped again.
  void* p = h.a().allocate(50 * MiB, S(1));
  ASSERT_NE(p, nullptr);
  h.a().deallocate(p);
  h.a().empty_cache();
  EXPECT_EQ(h.sim().usage(0).used, 0u);
}
// The same while stitching: mapping the new range fails; every moved page goes back where it
// was, and everything is released at the end.
TEST(FaultInjection, FailedMapOfAStitchPutsEveryPageBack) {
  SimBackend::Options options;
  options.capacity = 16 * MiB;  // eight 2 MiB pages
  auto sim = std::make_shared<SimBackend>(options);
  Allocator a(Config::parse("backend:sim,expandable_segments:True,stitching:True"), sim);
  void* p[4];
  for (int i = 0; i < 4; ++i) p[i] = a.allocate(4 * MiB, S(1 + i % 2));  // two streams
  a.deallocate(p[0]);
  a.deallocate(p[2]);  // 8 MiB free: only a stitch of both streams' pages can serve 8 MiB
  const auto reserved = a.stat(0, "reserved_bytes.all.current");
  sim->inject_fault(SimCall::map, 2, SimFault::error);
  EXPECT_THROW((void)a.allocate(8 * MiB, S(3)), backend_error);
  EXPECT_EQ(sim->faults_fired(), 1u);
  EXPECT_EQ(a.stat(0, "num_stitches"), 0);
  EXPECT_EQ(a.stat(0, "reserved_bytes.all.current"), reserved) << "every page back in place";
  a.validate();
  void* big = a.allocate(8 * MiB, S(3));  // and the stitch works now
  EXPECT_EQ(a.stat(0, "num_stitches"), 1);
  a.deallocate(big);
  a.deallocate(p[1]);
  a.deallocate(p[3]);
  EXPECT_NO_THROW(a.empty_cache());
  a.validate();
  const SimUsage u = sim->usage(0);
  EXPECT_EQ(u.used, 0u);
  EXPECT_EQ(u.mappings, 0u);
  EXPECT_EQ(u.reservations, 0u);
  EXPECT_EQ(u.physical_handles, 0u);
}
TEST(FaultInjection, BackendErrorDuringAllocationIsNotAnOom) {
  Harness h;
  h.sim().inject_fault(SimCall::allocate, 1, SimFault::error);
  EXPECT_THROW((void)h.a().allocate(1000, S(1)), backend_error);
  EXPECT_EQ(h.a().stat(0, "num_ooms"), 0);
  EXPECT_EQ(h.a().stat(0, "reserved_bytes.all.current"), 0);
  h.a().validate();
  EXPECT_NE(h.a().allocate(1000, S(1)), nullptr);
}

TEST(FaultInjection, InjectedOomIsRetriedAfterReleasingTheCache) {
  Harness h;
  h.sim().inject_fault(SimCall::allocate, 1, SimFault::out_of_memory);
  void* p = h.a().allocate(1000, S(1));  // the ladder's retry succeeds
  EXPECT_NE(p, nullptr);
  EXPECT_EQ(h.a().stat(0, "num_alloc_retries"), 1);
  EXPECT_EQ(h.a().stat(0, "num_ooms"), 0);
}

TEST(FaultInjection, PersistentOomIsReportedOnce) {
  Harness h;
  h.sim().inject_fault(SimCall::allocate, 1, SimFault::out_of_memory);
  h.sim().inject_fault(SimCall::allocate, 2, SimFault::out_of_memory);
  EXPECT_THROW((void)h.a().allocate(1000, S(1)), out_of_memory);
  EXPECT_EQ(h.a().stat(0, "num_ooms"), 1);
  h.a().validate();
  EXPECT_NE(h.a().allocate(1000, S(1)), nullptr);
}

}  // namespace
}  // namespace stitch
