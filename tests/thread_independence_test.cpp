// The rule of docs/architecture.md: the block layout and every statistic depend only on the order
// of the requests, never on which thread made them. Each test builds a script of requests with a
// role (the thread that makes it) and runs it twice over simulated devices whose addresses
// depend only on the calls made (support/fixed_address_backend.hpp): once on one thread, and once
// with each request made by its role's thread, the threads taking turns in the script's order
// (persistent threads handing over through a condition variable, or a fresh thread for each run
// of one role's requests, so that threads end while others run on). Every out-of-memory result,
// and at checkpoints every statistic (peaks included) and the whole layout, must be the same.
//
// Scenarios: PyTorch's forward and backward (the main thread allocates activations and runs the
// optimizer; the backward thread frees the activations and allocates the gradients; one stream);
// a producer allocating and a consumer freeing on one stream; threads on their own streams with
// cross-thread frees, blocks used on other streams and held streams; a mix of both; coarse
// pages left with a live block at their start, which stitching and compaction serve; and training
// beside tagged inference memory that a third thread puts to sleep and wakes. Configs:
// PyTorch's defaults, expandable segments, stitching and compaction (on a device small enough for
// the out-of-memory ladder to run), and PyTorch's tuning knobs together ("Tuned": power-of-two
// rounding divisions, a max_split_size that makes the fragmentation scenario's largest blocks
// oversize, and a garbage collection threshold).
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdio>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/errors.hpp"
#include "support/fixed_address_backend.hpp"

namespace stitch {
namespace {

using test::FixedSide;

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

stream_t S(int n) { return reinterpret_cast<stream_t>(static_cast<std::uintptr_t>(n) * 0x10); }

/// One request of a script.
struct Op {
  enum Kind : std::uint8_t {
    alloc,           ///< block `id` = allocate(bytes, stream)
    free,            ///< deallocate(block id)
    free_on,         ///< deallocate(block id, stream): `stream` is its last use
    free_sized,      ///< deallocate(block id, bytes, 0, its stream) (the C API's free)
    record,          ///< record_stream(block id, stream)
    hold,            ///< the device holds `stream`'s work
    release,         ///< ... and finishes it
    empty,           ///< empty_cache
    reset_peak,      ///< reset_peak_stats
    cap,             ///< set_memory_fraction: what is reserved now (`bytes` 1: no cap)
    tagged,          ///< block `id` = allocate(bytes, stream) inside a region of tag `tag`
    sleep,           ///< sleep(0, tag `tag`)
    wake,            ///< wake(0, tag `tag`)
    check,           ///< every statistic and the layout, into the results
  } kind;
  int role;
  int id = -1;
  std::size_t bytes = 0;
  stream_t stream = nullptr;
  int tag = 0;  ///< tagged, sleep, wake: "t0" (no backup) or "t1" (backed up to the host)
};

const char* tag_name(int tag) { return tag == 0 ? "t0" : "t1"; }

struct Script {
  std::vector<Op> ops;
  int roles = 1;
  int blocks = 0;
};

/// Builds scripts: blocks are numbered as they are allocated.
class Builder {
 public:
  explicit Builder(std::uint64_t seed, int roles) : rng_(seed) { script_.roles = roles; }
  std::size_t pick(std::size_t n) { return static_cast<std::size_t>(rng_() % n); }
  int alloc(int role, std::size_t bytes, stream_t stream) {
    const int id = script_.blocks++;
    streams_.push_back(stream);
    sizes_.push_back(bytes);
    push({Op::alloc, role, id, bytes, stream});
    return id;
  }
  int tagged(int role, std::size_t bytes, stream_t stream, int tag) {
    const int id = script_.blocks++;
    streams_.push_back(stream);
    sizes_.push_back(bytes);
    push({Op::tagged, role, id, bytes, stream, tag});
    return id;
  }
  /// Frees block `id` one of the three ways (`how`: 0, 1, 2; -1: at random).
  void free(int role, int id, int how = -1) {
    const auto i = static_cast<std::size_t>(id);
    switch (how < 0 ? static_cast<int>(pick(3)) : how) {
      case 0: push({Op::free, role, id}); break;
      case 1: push({Op::free_on, role, id, 0, streams_[i]}); break;
      default: push({Op::free_sized, role, id, sizes_[i], streams_[i]});
    }
  }
  void push(const Op& op) {
    script_.ops.push_back(op);
    // Checkpoints at random, by whichever thread holds the turn.
    if (pick(60) == 0) script_.ops.push_back({Op::check, op.role});
  }
  Script done(int role) {
    script_.ops.push_back({Op::check, role});
    return std::move(script_);
  }

 private:
  std::mt19937_64 rng_;
  Script script_;
  std::vector<stream_t> streams_;
  std::vector<std::size_t> sizes_;
};

// ---- the scenarios -------------------------------------------------------------------------------

/// A training loop: forward on role 0, backward on role 1, the optimizer on role 0; one stream.
Script forward_backward(std::uint64_t seed) {
  Builder b(seed, 2);
  constexpr int kLayers = 10;
  const stream_t s = nullptr;
  std::vector<int> weights, grads(kLayers, -1), adam;
  for (int l = 0; l < kLayers; ++l) weights.push_back(b.alloc(0, 1 * MiB + 4 * KiB * static_cast<std::size_t>(l), s));
  for (int step = 0; step < 24; ++step) {
    const std::size_t seq = 16 + b.pick(240);
    const std::size_t act[4] = {seq * 2 * KiB, seq * 8 * KiB, seq * seq * 16 + 512, seq * 64 + 512};
    std::vector<std::vector<int>> acts(kLayers);
    for (int l = 0; l < kLayers; ++l) {
      const int scratch = b.alloc(0, act[1] / 2, s);
      for (std::size_t k = 0; k < 4; ++k) acts[static_cast<std::size_t>(l)].push_back(b.alloc(0, act[k], s));
      b.free(0, scratch);
    }
    int grad_out = b.alloc(1, act[0], s);
    for (int l = kLayers - 1; l >= 0; --l) {
      const int grad_in = b.alloc(1, act[0], s);
      const int tmp = b.alloc(1, act[1], s);
      if (grads[static_cast<std::size_t>(l)] < 0) grads[static_cast<std::size_t>(l)] = b.alloc(1, 1 * MiB + 4 * KiB * static_cast<std::size_t>(l), s);
      b.free(1, tmp);
      for (int k = 3; k >= 0; --k) b.free(1, acts[static_cast<std::size_t>(l)][static_cast<std::size_t>(k)]);
      b.free(1, grad_out);
      grad_out = grad_in;
    }
    b.free(1, grad_out);
    for (int l = 0; l < kLayers; ++l) {
      const int tmp = b.alloc(0, 2 * MiB, s);
      if (adam.size() < static_cast<std::size_t>(2 * kLayers)) {
        adam.push_back(b.alloc(0, 2 * MiB + 8 * KiB, s));
        adam.push_back(b.alloc(0, 2 * MiB + 8 * KiB, s));
      }
      b.free(0, tmp);
      b.free(0, grads[static_cast<std::size_t>(l)]);
      grads[static_cast<std::size_t>(l)] = -1;
    }
    if (b.pick(10) == 0) b.push({Op::empty, 0});
    if (b.pick(10) == 0) b.push({Op::reset_peak, 0});
  }
  return b.done(0);
}

/// A producer (role 0) allocating and a consumer (role 1) freeing, first in, first out, on one
/// stream; the consumer's own temporaries too.
Script producer_consumer(std::uint64_t seed) {
  Builder b(seed, 2);
  const stream_t s = S(1);
  std::vector<int> queue;
  std::size_t head = 0;
  for (int round = 0; round < 300; ++round) {
    const int role = static_cast<int>(b.pick(2));
    const std::size_t n = 1 + b.pick(12);
    for (std::size_t i = 0; i < n; ++i) {
      if (role == 0) {
        const std::size_t bytes = b.pick(4) == 0 ? (1 + b.pick(6)) * MiB + b.pick(MiB) : 512 * (1 + b.pick(200));
        queue.push_back(b.alloc(0, bytes, s));
      } else if (head < queue.size()) {
        b.free(1, queue[head++]);
        if (b.pick(4) == 0) b.free(1, b.alloc(1, 512 * (1 + b.pick(64)), s));
      }
    }
  }
  while (head < queue.size()) b.free(1, queue[head++]);
  return b.done(1);
}

/// Four roles on their own streams (or, `shared`, roles 0 and 1 on one stream): pairs, mixes,
/// frees of other roles' blocks, blocks used on other streams whose work is held.
Script streams(std::uint64_t seed, bool shared) {
  Builder b(seed, 4);
  auto stream_of = [&](int role) { return shared && role < 2 ? S(1) : S(role + 1); };
  std::vector<std::vector<int>> live(4);
  std::vector<stream_t> held;
  int role = 0;
  for (int i = 0; i < 4000; ++i) {
    if (b.pick(30) == 0) role = static_cast<int>(b.pick(4));
    auto& mine = live[static_cast<std::size_t>(role)];
    const std::size_t r = b.pick(100);
    if (r < 30 || mine.empty()) {
      const std::size_t bytes = b.pick(4) == 0 ? (1 + b.pick(8)) * MiB + b.pick(MiB) : 512 * (1 + b.pick(64));
      mine.push_back(b.alloc(role, bytes, stream_of(role)));
    } else if (r < 80) {  // the pair a training loop repeats
      const int last = mine.back();
      mine.pop_back();
      b.free(role, last);
      mine.push_back(b.alloc(role, 512 * (1 + b.pick(64)), stream_of(role)));
    } else if (r < 90) {  // a block of another role, freed here
      auto& theirs = live[b.pick(4)];
      if (theirs.empty()) continue;
      const std::size_t k = b.pick(theirs.size());
      b.free(role, theirs[k]);
      theirs.erase(theirs.begin() + static_cast<std::ptrdiff_t>(k));
    } else if (r < 94) {  // used on another stream whose work is held
      const stream_t other = stream_of(static_cast<int>(b.pick(4)));
      b.push({Op::hold, role, -1, 0, other});
      held.push_back(other);
      b.push({Op::record, role, mine[b.pick(mine.size())], 0, other});
    } else if (r < 96) {
      for (stream_t h : held) b.push({Op::release, role, -1, 0, h});
      held.clear();
    } else {
      const std::size_t k = b.pick(mine.size());
      b.free(role, mine[k]);
      mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
  for (stream_t h : held) b.push({Op::release, 0, -1, 0, h});
  for (int r = 0; r < 4; ++r)
    for (int id : live[static_cast<std::size_t>(r)]) b.free(r, id);
  return b.done(0);
}

/// Coarse pages with a live block at their start and a freed rest (role 0 allocates, role 1 frees
/// and, under a cap at what is reserved, asks for more than any free run): stitching cannot move a
/// whole page, and compaction (stitch_compact) serves the request.
Script fragmentation(std::uint64_t seed) {
  Builder b(seed, 2);
  const stream_t s = S(1);
  for (int round = 0; round < 4; ++round) {
    std::vector<int> heads, tails;
    for (int i = 0; i < 6; ++i) {
      heads.push_back(b.alloc(0, 3 * MiB, s));
      tails.push_back(b.alloc(0, 17 * MiB, s));
    }
    for (int t : tails) b.free(1, t);
    b.push({Op::cap, 1});
    b.push({Op::check, 1});
    const int big = b.alloc(1, (48 + 8 * b.pick(5)) * MiB, s);
    b.push({Op::check, 1});
    const int small = b.alloc(0, 512 * (1 + b.pick(100)), s);
    b.push({Op::check, 0});
    b.free(0, big);
    b.free(1, small);
    for (int h : heads) b.free(static_cast<int>(b.pick(2)), h);
    b.push({Op::cap, 0, -1, 1});
    b.push({Op::check, 1});
    b.push({Op::empty, static_cast<int>(b.pick(2))});
  }
  return b.done(0);
}

/// Training and inference sharing a device (RLHF): role 0 trains, untagged, with the pairs of a
/// training loop; role 1 serves, its weights (tag t1, backed up) and KV blocks (tag t0) tagged;
/// role 2 puts the tags to sleep and wakes them while role 0's held and parked blocks are about.
Script sleep_wake(std::uint64_t seed) {
  Builder b(seed, 3);
  const stream_t train = S(1), serve = S(2);
  std::vector<int> weights, kv, live;
  for (int i = 0; i < 6; ++i) weights.push_back(b.tagged(1, (2 + b.pick(3)) * MiB + 512 * b.pick(8), serve, 1));
  bool asleep = false;
  for (int round = 0; round < 40; ++round) {
    for (int i = 0; i < 40; ++i) {  // training: pairs and a few blocks that stay
      const std::size_t bytes = b.pick(5) == 0 ? (1 + b.pick(4)) * MiB + 512 * b.pick(64) : 512 * (1 + b.pick(128));
      if (b.pick(4) == 0 || live.empty()) {
        live.push_back(b.alloc(0, bytes, train));
      } else {
        b.free(0, live.back());
        live.pop_back();
        live.push_back(b.alloc(0, bytes, train));
      }
      if (live.size() > 12) {
        b.free(0, live.front());
        live.erase(live.begin());
      }
    }
    if (!asleep) {  // serving: KV blocks come and go
      for (int i = 0; i < 8; ++i) {
        if (kv.size() > 6 || (b.pick(3) == 0 && !kv.empty())) {
          const std::size_t k = b.pick(kv.size());
          b.free(1, kv[k]);
          kv.erase(kv.begin() + static_cast<std::ptrdiff_t>(k));
        } else {
          kv.push_back(b.tagged(1, 256 * KiB * (1 + b.pick(8)), serve, 0));
        }
      }
    }
    if (b.pick(3) == 0) {  // the controller switches
      asleep = !asleep;
      const Op::Kind kind = asleep ? Op::sleep : Op::wake;
      b.push({kind, 2, -1, 0, nullptr, 1});
      if (!kv.empty()) b.push({kind, 2, -1, 0, nullptr, 0});
      if (asleep && b.pick(2) == 0) b.push({Op::empty, 2});
    }
  }
  if (asleep) {
    b.push({Op::wake, 2, -1, 0, nullptr, 1});
    b.push({Op::wake, 2, -1, 0, nullptr, 0});
  }
  for (int id : live) b.free(0, id);
  for (int id : kv) b.free(1, id);
  for (int id : weights) b.free(1, id);
  return b.done(0);
}

// ---- running a script ----------------------------------------------------------------------------

/// Runs scripts on one allocator; the results (checkpoints, out-of-memory results) in order.
class Runner {
 public:
  Runner(FixedSide& side, const Script& script)
      : side_(side), script_(script), ptrs_(static_cast<std::size_t>(script.blocks), nullptr) {}

  void execute(std::size_t i) {
    const Op& op = script_.ops[i];
    Allocator& a = *side_.alloc;
    void*& p = op.id >= 0 ? ptrs_[static_cast<std::size_t>(op.id)] : scratch_;
    switch (op.kind) {
      case Op::alloc:
        p = side_.allocate(op.bytes, op.stream);
        if (p == nullptr) results_.push_back("out of memory at " + std::to_string(i));
        break;
      case Op::free:
        if (p != nullptr) a.deallocate(p);
        break;
      case Op::free_on:
        if (p != nullptr) a.deallocate(p, op.stream);
        break;
      case Op::free_sized:
        if (p != nullptr) a.deallocate(p, op.bytes, 0, op.stream);
        break;
      case Op::record:
        if (p != nullptr) a.record_stream(p, op.stream);
        break;
      case Op::hold: side_.sim->hold_stream(op.stream); break;
      case Op::release: side_.sim->release_stream(op.stream); break;
      case Op::empty: a.empty_cache(0); break;
      case Op::reset_peak: a.reset_peak_stats(0); break;
      case Op::tagged: {
        const Allocator::Region region(a, tag_name(op.tag), op.tag == 1);
        p = side_.allocate(op.bytes, op.stream);
        if (p == nullptr) results_.push_back("out of memory at " + std::to_string(i));
        break;
      }
      case Op::sleep:
      case Op::wake:
        try {
          if (op.kind == Op::sleep) {
            a.sleep(0, tag_name(op.tag));
          } else {
            a.wake(0, tag_name(op.tag));
          }
        } catch (const stitch::error&) {  // (a wake without room, a sleep of a tag never used)
          results_.push_back(std::string(op.kind == Op::sleep ? "sleep" : "wake") + " failed at " +
                             std::to_string(i));
        }
        break;
      case Op::cap: {
        const double total = static_cast<double>(side_.sim->memory_info(0).total);
        const double reserved = static_cast<double>(a.stats(0).reserved_bytes[kAll].current);
        a.set_memory_fraction(op.bytes == 1 ? 1.0 : reserved / total, 0);
        break;
      }
      case Op::check:
        results_.push_back("at " + std::to_string(i) + "\n" + test::stats_text(a) + test::layout(a));
        break;
    }
  }

  /// Every request on the calling thread.
  std::vector<std::string> one_thread() {
    for (std::size_t i = 0; i < script_.ops.size(); ++i) execute(i);
    return finish();
  }
  /// Each request on its role's thread (one per role, alive throughout), in turn.
  std::vector<std::string> persistent_threads() {
    std::mutex m;
    std::condition_variable cv;
    std::size_t next = 0;
    const std::size_t n = script_.ops.size();
    std::vector<std::thread> threads;
    for (int role = 0; role < script_.roles; ++role) {
      threads.emplace_back([&, role] {
        std::unique_lock lock(m);
        for (;;) {
          cv.wait(lock, [&] { return next == n || script_.ops[next].role == role; });
          if (next == n) return;
          const std::size_t i = next;
          lock.unlock();
          execute(i);
          lock.lock();
          ++next;
          cv.notify_all();
        }
      });
    }
    for (std::thread& t : threads) t.join();
    return finish();
  }
  /// Each run of one role's requests on a thread of its own, which ends after it.
  std::vector<std::string> fresh_threads() {
    for (std::size_t i = 0; i < script_.ops.size();) {
      std::size_t end = i + 1;
      while (end < script_.ops.size() && script_.ops[end].role == script_.ops[i].role) ++end;
      std::thread([&, i, end] {
        for (std::size_t k = i; k < end; ++k) execute(k);
      }).join();
      i = end;
    }
    return finish();
  }

 private:
  std::vector<std::string> finish() {
    side_.alloc->validate();
    return results_;
  }

  FixedSide& side_;
  const Script& script_;
  std::vector<void*> ptrs_;
  void* scratch_ = nullptr;
  std::vector<std::string> results_;
};

using Params = std::tuple<const char* /*config*/, std::size_t /*capacity MiB*/, int /*scenario*/>;

class ThreadIndependence : public ::testing::TestWithParam<Params> {};

TEST_P(ThreadIndependence, TheSameRequestsInTheSameOrderEndInTheSameSnapshot) {
  const auto [config, capacity_mb, scenario] = GetParam();
  const std::string conf = std::string("backend:sim,") + config;
  for (std::uint64_t seed : {1, 2}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const Script script = scenario == 0   ? forward_backward(seed)
                          : scenario == 1 ? producer_consumer(seed)
                          : scenario == 2 ? streams(seed, false)
                          : scenario == 3 ? streams(seed, true)
                          : scenario == 4 ? fragmentation(seed)
                                          : sleep_wake(seed);
    const std::size_t capacity = capacity_mb * MiB;
    FixedSide one(conf, capacity), turns(conf, capacity), fresh(conf, capacity);
    const std::vector<std::string> want = Runner(one, script).one_thread();
    const std::vector<std::string> by_turns = Runner(turns, script).persistent_threads();
    const std::vector<std::string> by_fresh = Runner(fresh, script).fresh_threads();
    ASSERT_GT(want.size(), 10u) << "checkpoints";
    ASSERT_EQ(by_turns.size(), want.size());
    ASSERT_EQ(by_fresh.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(by_turns[i], want[i]) << "threads in turn, result " << i;
      ASSERT_EQ(by_fresh[i], want[i]) << "a fresh thread per run, result " << i;
    }
    // The comparison means something only if the requests were served by both paths.
    const DeviceStats st = one.alloc->stats(0);
    EXPECT_GT(st.num_cache_hits, 0);
    EXPECT_GT(st.num_device_alloc, 0);
    if (scenario == 5) EXPECT_GT(st.num_sleeps, 0) << "the tags went to sleep";
    std::printf("[ script   ] %s seed %llu: %zu requests, %zu results, %lld cache hits, %lld device "
                "allocations, %lld out of memory, %lld stitches, %lld compactions, %lld sleeps\n",
                config, static_cast<unsigned long long>(seed), script.ops.size(), want.size(),
                static_cast<long long>(st.num_cache_hits), static_cast<long long>(st.num_device_alloc),
                static_cast<long long>(st.num_ooms), static_cast<long long>(st.num_stitches),
                static_cast<long long>(st.num_compactions), static_cast<long long>(st.num_sleeps));
  }
}

std::string param_name(const ::testing::TestParamInfo<Params>& info) {
  static const char* const kScenario[] = {"ForwardBackward", "ProducerConsumer", "OwnStreams",
                                          "SharedAndOwnStreams", "Fragmentation", "SleepWake"};
  static const char* const kConfig[] = {"Defaults", "Expandable", "Stitching", "Compaction",
                                        "Tuned"};
  const std::string config = std::get<0>(info.param);
  const int c = config.empty()                                  ? 0
                : config.find("roundup") != std::string::npos   ? 4
                : config.find("compact") != std::string::npos   ? 3
                : config.find("stitching") != std::string::npos ? 2
                                                                : 1;
  return std::string(kScenario[std::get<2>(info.param)]) + kConfig[c];
}

INSTANTIATE_TEST_SUITE_P(
    Scenarios, ThreadIndependence,
    ::testing::Combine(::testing::Values("", "expandable_segments:True",
                                         "expandable_segments:True,stitching:True",
                                         "expandable_segments:True,stitching:True,stitch_compact:True",
                                         "roundup_power2_divisions:4,max_split_size_mb:24,"
                                         "garbage_collection_threshold:0.5"),
                       ::testing::Values(std::size_t{160}), ::testing::Values(0, 1, 2, 3, 4, 5)),
    param_name);

}  // namespace
}  // namespace stitch
