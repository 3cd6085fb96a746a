// fuzz/fuzz_capi_ops.cpp — libFuzzer target: the input is a sequence of operations through the C
// API (stitch.h) on simulated devices, checked by the invariant checker after every operation.
//
// How the C API gets a device the fuzzer controls: the C API drives one process-wide allocator
// that it builds itself from the configuration and never destroys, so neither faults nor held
// streams could be reached and every input would inherit the previous input's state. The fuzzer
// therefore builds, for every input, a stitch::Allocator over a SimBackend it owns and installs it
// as the C API's allocator with the internal test hook stitch::detail::capi_exchange_allocator()
// (capi/c_api_testing.hpp; not exported from libstitch.so). Every operation then goes through
// the C entry points exactly as a caller's would (stitch_malloc/stitch_free with PyTorch's
// CUDAPluggableAllocator signatures, stitch_record_stream, stitch_empty_cache,
// stitch_set_memory_fraction, stitch_configure, stitch_stat, ...), while the SimBackend injects
// faults and holds streams, and Allocator::validate() checks the allocator from the inside.
//
// Input: byte 0 picks 1-3 devices and the starting configuration (plain, expandable segments,
// stitching, stitching with stitch_before_grow_mb, stitching with compaction), byte 1 the capacity (64/128/256 MiB); then
// one operation per opcode byte (Op below) with its argument bytes read in order; a missing byte
// reads as 0. fuzz/make_capi_seeds.py writes the seed corpus (fuzz/corpus/capi_ops/).
//
// Checked after every operation (any violation prints what broke and aborts, so libFuzzer
// reports the input): validate() (block chains, free index, page tables, statistics equal a
// recount), no two live allocations overlap, every live allocation still holds the pattern
// written at allocation, the statistics count exactly the live allocations, the device's use
// equals reserved_bytes while no fault has fired, an operation without an injected fault
// succeeds (or reports out of memory), and a bad input fails with an error and changes nothing
// else. At the end of every input everything is freed and the cache emptied: the simulated
// devices must then hold nothing (no memory, handles, mappings, reservations or events).
//
// With compaction on, no fault is injected in the calls a remap makes past its point of no return
// (map, set access, create, copy from host): a failure there aborts by design (docs/stitching.md).
//
// STITCH_FUZZ_TRACE=1 prints one line per operation (to follow a crashing input).
// At exit a line on stderr gives the figures of the run (inputs, operations, faults injected
// and fired, OOMs, bad inputs, anything lost).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "capi/c_api_testing.hpp"
#include "stitch/allocator.hpp"
#include "stitch/config.hpp"
#include "stitch/errors.hpp"
#include "stitch/sim_backend.hpp"
#include "stitch/stitch.h"
#include "support/data_pattern.hpp"
#include "support/live_ranges.hpp"

namespace {

using stitch::SimCall;
using stitch::SimFault;

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t kMaxLive = 64;
constexpr int kStreams = 4;  // S(0) is the default stream (NULL)

void* S(int n) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(n) * 0x10); }

// ---- figures of the run ----------------------------------------------------------------------------

struct Figures {
  std::uint64_t inputs = 0, ops = 0, allocs = 0, frees = 0, faults_injected = 0, faults_fired = 0,
                ooms = 0, bad_inputs = 0, config_changes = 0, lost_bytes = 0, lost_allocations = 0;
};
Figures g_figures;

void print_figures() {
  const Figures& f = g_figures;
  std::fprintf(stderr,
               "fuzz_capi_ops: %llu inputs, %llu operations (%llu allocations, %llu frees), %llu "
               "faults injected (%llu fired), %llu OOMs, %llu bad inputs, %llu configuration "
               "changes; lost at the end of the inputs: %llu bytes, %llu allocations\n",
               static_cast<unsigned long long>(f.inputs), static_cast<unsigned long long>(f.ops),
               static_cast<unsigned long long>(f.allocs), static_cast<unsigned long long>(f.frees),
               static_cast<unsigned long long>(f.faults_injected),
               static_cast<unsigned long long>(f.faults_fired), static_cast<unsigned long long>(f.ooms),
               static_cast<unsigned long long>(f.bad_inputs),
               static_cast<unsigned long long>(f.config_changes),
               static_cast<unsigned long long>(f.lost_bytes),
               static_cast<unsigned long long>(f.lost_allocations));
}

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_capi_ops: INVARIANT BROKEN: %s (last error: '%s')\n", what.c_str(),
               stitch_last_error());
  std::abort();
}

// ---- the input ---------------------------------------------------------------------------------------

class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : p_(data), n_(size) {}
  [[nodiscard]] bool done() const { return n_ == 0; }
  std::uint8_t byte() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  std::uint16_t u16() { return static_cast<std::uint16_t>(byte() | byte() << 8); }

 private:
  const std::uint8_t* p_;
  std::size_t n_;
};

enum Op : std::uint8_t {
  kMalloc,          // device, stream, size class, size (2 bytes)
  kMalloc2,         // the same (allocations are twice as likely as any other operation)
  kFree,            // slot, mode (0: allocation stream, 1: another stream, 2: the default stream)
  kFree2,           // the same
  kRecordStream,    // slot, stream
  kEmptyCache,      // device (or -1)
  kToggleHold,      // stream 1-3: hold it, or release it
  kMemoryFraction,  // device, eighths
  kConfigure,       // entry of kConfigs
  kInjectFault,     // call kind, nth call, flavour
  kBadInput,        // kind (BadInput), argument
  kDiagnostics,     // kind, argument
  kOpCount
};

enum BadInput : std::uint8_t {
  kUnknownPointer, kInteriorPointer, kDoubleFree, kWrongSize, kWrongDevice, kBadDeviceFree,
  kHugeMalloc, kBadDeviceMalloc, kRecordUnknown, kBadEmptyCache, kBadFraction, kBadStat,
  kBadConfigure, kBadDiagnostics, kBadInputCount
};

// Run-time tunables (valid, though some are refused in some states: stitching without
// expandable segments) and strings that must be refused.
const char* const kConfigs[] = {
    "expandable_segments:True",
    "expandable_segments:False",
    "expandable_segments:True,stitching:True",
    "stitching:False",
    "stitching:False,expandable_segments:False",
    "max_split_size_mb:20",
    "max_split_size_mb:64",
    "max_non_split_rounding_mb:40",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:[1:2,4:4,>:8]",
    "roundup_power2_divisions:0",
    "garbage_collection_threshold:0.6",
    "stitch_before_grow_mb:4",
    "stitch_before_grow_mb:0",
    "per_process_memory_fraction:0.5",
    "per_process_memory_fraction:1.0",
    "record_history:True,max_entries:64",
    "record_history:False",
    "backend:sim",
    "stitch_compact:True",
    "stitch_compact:False",
};
const char* const kBadConfigs[] = {
    "backend:cuda", "sim_devices:7", "sim_capacity_mb:1", "no_such_key:1", "max_split_size_mb:1",
    "garbage_collection_threshold:7", "expandable_segments:maybe", "roundup_power2_divisions:3",
    "max_entries:0", ":", "max_split_size_mb", "per_process_memory_fraction:nan",
};
const char* const kStatKeys[] = {
    "allocated_bytes.all.current", "reserved_bytes.all.peak", "active.small_pool.current",
    "requested_bytes.large_pool.freed", "num_ooms", "num_alloc_retries", "num_invalid_frees",
    "inactive_split_bytes.all.current", "num_device_alloc", "max_split_size",
};

// ---- one input ----------------------------------------------------------------------------------------

struct Live {
  void* ptr;
  std::size_t size;  // requested
  int device;
  int stream;
  std::uint64_t seed;
};

struct Freed {
  void* ptr;
  std::size_t size;
  int device;
};

/// The per-device figures a rejected call must leave alone.
struct Fingerprint {
  std::vector<std::int64_t> values;
  bool operator==(const Fingerprint&) const = default;
};

class Session {
 public:
  Session(int devices, std::size_t capacity, const char* conf) : devices_(devices) {
    stitch::SimBackend::Options o;
    o.devices = devices;
    o.capacity = capacity;
    sim_ = std::make_shared<stitch::SimBackend>(o);
    auto a = std::make_unique<stitch::Allocator>(stitch::Config::parse(conf), sim_);
    alloc_ = a.get();
    (void)stitch::detail::capi_exchange_allocator(std::move(a));
  }
  ~Session() { (void)stitch::detail::capi_exchange_allocator(nullptr); }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void run(Input& in) {
    static const bool trace = std::getenv("STITCH_FUZZ_TRACE") != nullptr;  // reproducing a crash
    while (!in.done()) {
      const std::uint64_t fired = sim_->faults_fired();
      step(in);
      if (trace)
        std::fprintf(stderr, "op %llu: live %zu, faults fired %llu, error '%s'\n",
                     static_cast<unsigned long long>(g_figures.ops), live_.size(),
                     static_cast<unsigned long long>(sim_->faults_fired()), stitch_last_error());
      ++g_figures.ops;
      if (sim_->faults_fired() != fired) any_fault_fired_ = true;
      g_figures.faults_fired += sim_->faults_fired() - fired;
      check("after an operation");
    }
    drain();
  }

 private:
  // ---- operations ----
  void step(Input& in) {
    stitch_clear_error();  // the error text is kept until cleared: each step reads only its own
    switch (in.byte() % kOpCount) {
      case kMalloc:
      case kMalloc2: return do_malloc(in);
      case kFree:
      case kFree2: return do_free(in);
      case kRecordStream: return do_record(in);
      case kEmptyCache: {
        const int d = in.byte() % (devices_ + 1) - 1;
        expect_ok(stitch_empty_cache(d) == 0, "stitch_empty_cache");
        return;
      }
      case kToggleHold: {
        const int s = 1 + in.byte() % (kStreams - 1);
        held_[s] = !held_[s];
        if (held_[s]) sim_->hold_stream(S(s)); else sim_->release_stream(S(s));
        return;
      }
      case kMemoryFraction: {
        const int d = in.byte() % devices_;
        const double f = (1 + in.byte() % 8) / 8.0;
        expect_ok(stitch_set_memory_fraction(f, d) == 0, "stitch_set_memory_fraction");
        return;
      }
      case kConfigure: return do_configure(kConfigs[in.byte() % std::size(kConfigs)]);
      case kInjectFault: {
        const auto call = static_cast<SimCall>(in.byte() % static_cast<int>(SimCall::count_));
        const std::uint64_t nth = 1 + in.byte() % 8;
        const SimFault fault = in.byte() % 2 == 0 ? SimFault::out_of_memory : SimFault::error;
        // With compaction, a map that fails after a page's old handle went (remap's step 5)
        // aborts by design (docs/stitching.md): not a fault this checker may inject.
        if (alloc_->config().stitch_compact && remaps(call)) return;
        sim_->inject_fault(call, nth, fault);
        ++g_figures.faults_injected;
        return;
      }
      case kBadInput: return do_bad_input(in);
      case kDiagnostics: return do_diagnostics(in);
      default: return;
    }
  }

  std::size_t size_of(Input& in) {
    const std::uint8_t cls = in.byte();
    const std::uint16_t v = in.u16();
    switch (cls % 4) {
      case 0: return 1 + v % (4 * KiB);                 // small, odd sizes too
      case 1: return 1 + v % 16 * 64 * KiB + v % 7;     // up to 1 MiB (the small pool's limit)
      case 2: return (1 + v % 160) * 64 * KiB;          // up to 10 MiB (20 MiB segments)
      default: return (1 + v % 64) * MiB - v % 3 * 512; // up to 64 MiB (own segments)
    }
  }

  void do_malloc(Input& in) {
    const int d = in.byte() % devices_;
    const int s = in.byte() % kStreams;
    const std::size_t size = size_of(in);
    if (live_.size() >= kMaxLive) return;
    void* p = stitch_malloc(size, d, S(s));
    if (p == nullptr) {
      const std::string e = stitch_last_error();
      if (e.rfind("CUDA out of memory", 0) == 0) {
        ++g_figures.ooms;
      } else if (!fault_pending()) {
        fail("stitch_malloc failed without an injected fault: " + e);
      }
      return;
    }
    ++g_figures.allocs;
    if (reinterpret_cast<std::uintptr_t>(p) % 512 != 0) fail("misaligned pointer");
    if (!ranges_.add(p, size)) fail("a new allocation overlaps a live one");
    const Live b{p, size, d, s, stitch::test::mix(++seed_)};
    stitch::test::write_pattern(p, size, b.seed);
    live_.push_back(b);
  }

  void do_free(Input& in) {
    const std::uint8_t slot = in.byte();
    const std::uint8_t mode = in.byte();
    if (live_.empty()) return;
    const std::size_t i = slot % live_.size();
    const Live b = live_[i];
    check_pattern(b);
    const int s = mode % 3 == 0 ? b.stream : mode % 3 == 1 ? (b.stream + 1) % kStreams : 0;
    stitch_free(b.ptr, b.size, b.device, S(s));
    const bool ok = *stitch_last_error() == '\0';
    if (!ok && !fault_pending()) fail("stitch_free failed without an injected fault");
    if (alloc_->find(b.ptr)) {
      if (ok) fail("stitch_free succeeded but the block is still live");
      return;  // a failed free leaves the block allocated
    }
    ++g_figures.frees;
    ranges_.remove(b.ptr);
    live_[i] = live_.back();
    live_.pop_back();
    freed_[freed_next_++ % freed_.size()] = Freed{b.ptr, b.size, b.device};
  }

  void do_record(Input& in) {
    const std::uint8_t slot = in.byte();
    const int s = in.byte() % kStreams;
    if (live_.empty()) return;
    const Live& b = live_[slot % live_.size()];
    expect_ok(stitch_record_stream(b.ptr, S(s)) == 0, "stitch_record_stream");
  }

  /// The calls a remap makes past its point of no return (core/page_mapper.hpp).
  static bool remaps(SimCall call) {
    return call == SimCall::map || call == SimCall::set_access || call == SimCall::create_physical ||
           call == SimCall::copy_from_host;
  }

  void do_configure(const char* conf) {
    const stitch::Config before = alloc_->config();
    std::string predicted;
    try {
      predicted = stitch::Config::parse(conf, before).to_string();
    } catch (const stitch::config_error&) {
    }
    if (stitch_configure(conf) == 0) {
      ++g_figures.config_changes;
      // Compaction turned on: the faults armed for its fatal steps go (see kInjectFault).
      if (!before.stitch_compact && alloc_->config().stitch_compact) sim_->clear_faults();
      if (alloc_->config().to_string() != predicted) fail(std::string("configure applied something else: ") + conf);
    } else {
      if (*stitch_last_error() == '\0') fail("stitch_configure failed without an error");
      if (alloc_->config().to_string() != before.to_string())
        fail(std::string("a refused configuration changed the settings: ") + conf);
    }
  }

  void do_diagnostics(Input& in) {
    const std::uint8_t kind = in.byte();
    const std::uint8_t arg = in.byte();
    const int d = arg % devices_;
    switch (kind % 4) {
      case 0: {
        const char* key = kStatKeys[arg % std::size(kStatKeys)];
        const std::int64_t v = stitch_stat(d, key);
        if (v != alloc_->stat(d, key).value_or(-2))
          fail(std::string("stitch_stat disagrees with the allocator: ") + key);
        return;
      }
      case 1: {
        char buf[256];
        const std::size_t n = stitch_memory_summary(d, arg % 2 == 0 ? buf : nullptr, sizeof buf);
        if (n == 0) fail("stitch_memory_summary returned nothing");
        return;
      }
      case 2: expect_ok(stitch_reset_peak_stats(arg % 2 == 0 ? -1 : d) == 0, "stitch_reset_peak_stats"); return;
      default: expect_ok(stitch_record_history(arg % 2, arg % 3 == 0 ? 0 : 32) == 0, "stitch_record_history");
    }
  }

  // ---- bad input: each call must fail with an error and change nothing else ----
  void do_bad_input(Input& in) {
    const auto kind = static_cast<BadInput>(in.byte() % kBadInputCount);
    const std::uint8_t arg = in.byte();
    const Fingerprint before = fingerprint();
    const std::int64_t invalid_before = invalid_frees();
    const std::string config_before = alloc_->config().to_string();
    int expect_invalid = 0;  // num_invalid_frees the call must add
    int host = 0;
    const Live* b = live_.empty() ? nullptr : &live_[arg % live_.size()];
    ++g_figures.bad_inputs;
    switch (kind) {
      case kUnknownPointer:
        stitch_free(&host, sizeof host, arg % devices_, S(0));
        expect_invalid = 1;
        break;
      case kInteriorPointer: {
        if (b == nullptr || b->size <= 512) return skip_bad_input();
        const std::size_t off = 512 * (1 + arg % (b->size / 512 - (b->size % 512 == 0)));
        if (off >= b->size) return skip_bad_input();
        stitch_free(static_cast<char*>(b->ptr) + off, b->size - off, b->device, S(b->stream));
        expect_invalid = 1;
        break;
      }
      case kDoubleFree: {
        const Freed& f = freed_[arg % freed_.size()];
        if (f.ptr == nullptr || ranges_.starts(f.ptr)) return skip_bad_input();  // live again
        stitch_free(f.ptr, f.size, f.device, S(0));
        expect_invalid = 1;
        break;
      }
      case kWrongSize: {
        if (b == nullptr) return skip_bad_input();
        const std::size_t sizes[] = {b->size + 1, b->size - 1, b->size * 2, 0, SIZE_MAX};
        const std::size_t wrong = sizes[arg % std::size(sizes)];
        if (wrong == b->size) return skip_bad_input();
        stitch_free(b->ptr, wrong, b->device, S(b->stream));
        expect_invalid = 1;
        break;
      }
      case kWrongDevice:
        if (b == nullptr || devices_ == 1) return skip_bad_input();
        stitch_free(b->ptr, b->size, (b->device + 1 + arg % (devices_ - 1)) % devices_, S(b->stream));
        expect_invalid = 1;
        break;
      case kBadDeviceFree: {
        const int bad[] = {-1, devices_, 64, std::numeric_limits<int>::min()};
        stitch_free(b != nullptr ? b->ptr : &host, b != nullptr ? b->size : 4, bad[arg % 4], S(0));
        break;
      }
      case kHugeMalloc: {
        const std::size_t huge[] = {SIZE_MAX, SIZE_MAX - 511, SIZE_MAX / 2 + 1, std::size_t{1} << 62,
                                    sim_->usage(0).capacity + 1};
        expect_null(stitch_malloc(huge[arg % std::size(huge)], arg % devices_, S(arg % kStreams)));
        // The out-of-memory ladder may return cached segments: only allocations must not change.
        return check_allocations_unchanged(before);
      }
      case kBadDeviceMalloc: {
        const int bad[] = {-1, devices_, 64, std::numeric_limits<int>::max()};
        expect_null(stitch_malloc(4096, bad[arg % 4], S(0)));
        break;
      }
      case kRecordUnknown:
        expect_failed(stitch_record_stream(b != nullptr && b->size > 512 && arg % 2 != 0
                                               ? static_cast<char*>(b->ptr) + 512
                                               : static_cast<void*>(&host),
                                           S(1)) != 0);
        break;
      case kBadEmptyCache: {
        const int bad[] = {-2, devices_, 1000};
        expect_failed(stitch_empty_cache(bad[arg % 3]) != 0);
        break;
      }
      case kBadFraction: {
        const double bad[] = {std::nan(""), -0.5, 1.5, std::numeric_limits<double>::infinity(), 0.5};
        const double f = bad[arg % std::size(bad)];
        expect_failed(stitch_set_memory_fraction(f, f == 0.5 ? devices_ : arg % devices_) != 0);
        break;
      }
      case kBadStat: {
        const char* keys[] = {"allocation.all.latest", nullptr, "", "num_ooms"};
        const char* key = keys[arg % 4];
        expect_failed(stitch_stat(key != nullptr && std::string(key) == "num_ooms" ? -1 : arg % devices_, key) == -1);
        break;
      }
      case kBadConfigure:
        expect_failed(stitch_configure(arg % 16 == 15 ? nullptr : kBadConfigs[arg % std::size(kBadConfigs)]) != 0);
        break;
      case kBadDiagnostics: {
        char buf[64];
        const int bad = arg % 2 == 0 ? -2 : devices_;  // -1 means every device
        expect_failed(arg % 3 == 0 ? stitch_reset_peak_stats(bad) != 0
                                   : stitch_memory_summary(bad, buf, sizeof buf) == 0 && buf[0] == '\0');
        break;
      }
      case kBadInputCount: break;
    }
    if (*stitch_last_error() == '\0') fail("a bad input left no error");
    if (invalid_frees() - invalid_before != expect_invalid) fail("num_invalid_frees miscounted a bad input");
    if (fingerprint() != before) fail("a bad input changed the allocator");
    if (alloc_->config().to_string() != config_before) fail("a bad input changed the settings");
  }

  void skip_bad_input() { --g_figures.bad_inputs; }

  void expect_null(void* p) {
    if (p != nullptr) fail("a bad allocation succeeded");
  }
  void expect_failed(bool failed) {
    if (!failed) fail("a bad input was accepted");
  }
  void expect_ok(bool ok, const char* what) {
    if (!ok && !fault_pending()) fail(std::string(what) + " failed without an injected fault");
  }

  // ---- checks ----
  /// A call may fail with a backend error only if an injected fault fired during it.
  [[nodiscard]] bool fault_pending() const { return sim_->faults_fired() != fired_seen_; }

  Fingerprint fingerprint() const {
    Fingerprint f;
    for (int d = 0; d < devices_; ++d) {
      const stitch::DeviceStats s = alloc_->stats(d);
      for (const stitch::Stat* st : {&s.allocation[stitch::kAll], &s.allocated_bytes[stitch::kAll],
                                     &s.requested_bytes[stitch::kAll], &s.reserved_bytes[stitch::kAll],
                                     &s.active_bytes[stitch::kAll], &s.segment[stitch::kAll]})
        f.values.push_back(st->current);
      f.values.push_back(s.num_device_alloc);
      f.values.push_back(s.num_device_free);
    }
    return f;
  }

  void check_allocations_unchanged(const Fingerprint& before) {
    const Fingerprint now = fingerprint();
    constexpr std::size_t kPerDevice = 8;
    for (std::size_t i = 0; i < now.values.size(); i += kPerDevice)
      for (std::size_t k : {0, 1})  // allocation, allocated_bytes (the ladder may complete
                                    // pending frees, which changes requested_bytes)
        if (now.values[i + k] != before.values[i + k]) fail("a refused allocation changed the allocations");
    if (*stitch_last_error() == '\0') fail("a refused allocation left no error");
  }

  std::int64_t invalid_frees() const {
    std::int64_t n = 0;
    for (int d = 0; d < devices_; ++d) n += alloc_->stats(d).num_invalid_frees;
    return n;
  }

  void check_pattern(const Live& b) const {
    if (!stitch::test::pattern_intact(b.ptr, b.size, b.seed)) fail("a live allocation's data changed");
  }

  void check(const char* when) {
    fired_seen_ = sim_->faults_fired();
    try {
      alloc_->validate();
    } catch (const std::exception& e) {
      fail(std::string(when) + ": validate: " + e.what());
    }
    // requested_bytes and active_* also count freed blocks still waiting for other streams;
    // allocation and allocated_bytes count exactly the live allocations.
    std::vector<std::int64_t> count(static_cast<std::size_t>(devices_)), bytes(count);
    for (const Live& b : live_) {
      check_pattern(b);
      const auto info = alloc_->find(b.ptr);
      if (!info || info->device != b.device || info->requested != b.size)
        fail(std::string(when) + ": a live allocation is unknown to the allocator");
      ++count[static_cast<std::size_t>(b.device)];
      bytes[static_cast<std::size_t>(b.device)] += static_cast<std::int64_t>(info->size);
    }
    for (int d = 0; d < devices_; ++d) {
      const stitch::DeviceStats s = alloc_->stats(d);
      const auto i = static_cast<std::size_t>(d);
      if (s.allocation[stitch::kAll].current != count[i] || s.allocated_bytes[stitch::kAll].current != bytes[i])
        fail(std::string(when) + ": device " + std::to_string(d) + ": the statistics (" +
             std::to_string(s.allocation[stitch::kAll].current) + " allocations, " +
             std::to_string(s.allocated_bytes[stitch::kAll].current) +
             " bytes) differ from a recount of the live allocations (" + std::to_string(count[i]) +
             ", " + std::to_string(bytes[i]) + ")");
      if (!any_fault_fired_ &&
          static_cast<std::int64_t>(sim_->usage(d).used) != s.reserved_bytes[stitch::kAll].current)
        fail(std::string(when) + ": the device's use differs from reserved_bytes");
    }
  }

  /// Frees everything and empties the cache: the devices must then be empty.
  void drain() {
    sim_->clear_faults();
    fired_seen_ = sim_->faults_fired();
    for (int s = 1; s < kStreams; ++s) sim_->release_stream(S(s));
    for (const Live& b : live_) {
      check_pattern(b);
      stitch_clear_error();
      stitch_free(b.ptr, b.size, b.device, S(b.stream));
      if (*stitch_last_error() != '\0') fail("freeing a live allocation at the end failed");
      ++g_figures.frees;
    }
    live_.clear();
    ranges_.clear();
    if (stitch_empty_cache(-1) != 0) fail("empty_cache at the end failed");
    check("after freeing everything");
    for (int d = 0; d < devices_; ++d) {
      const stitch::SimUsage u = sim_->usage(d);
      g_figures.lost_bytes += u.used;
      g_figures.lost_allocations += u.allocations + u.physical_handles;
      if (u.used != 0 || u.allocations != 0 || u.physical_handles != 0 || u.mappings != 0 ||
          u.reservations != 0)
        fail("device " + std::to_string(d) + " still holds memory after everything was freed");
      if (alloc_->stats(d).reserved_bytes[stitch::kAll].current != 0) fail("reserved_bytes is not 0 at the end");
    }
  }

  const int devices_;
  std::shared_ptr<stitch::SimBackend> sim_;
  stitch::Allocator* alloc_ = nullptr;  // owned by the C API until the session ends
  std::vector<Live> live_;
  stitch::test::LiveRanges ranges_;
  std::vector<Freed> freed_ = std::vector<Freed>(8, Freed{nullptr, 0, 0});
  std::size_t freed_next_ = 0;
  bool held_[kStreams] = {};
  std::uint64_t seed_ = 0;
  std::uint64_t fired_seen_ = 0;
  bool any_fault_fired_ = false;
};

const char* const kStartConfigs[] = {
    "backend:sim",
    "backend:sim,expandable_segments:True",
    "backend:sim,expandable_segments:True,stitching:True",
    "backend:sim,expandable_segments:True,stitching:True,stitch_before_grow_mb:8",
    "backend:sim,expandable_segments:True,stitching:True,stitch_compact:True",
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::atexit(print_figures);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Input in(data, size);
  const std::uint8_t head = in.byte();
  const int devices = 1 + head % 3;
  const std::size_t capacity = (64 * MiB) << (in.byte() % 3);
  ++g_figures.inputs;
  Session session(devices, capacity, kStartConfigs[head / 3 % std::size(kStartConfigs)]);
  session.run(in);
  return 0;
}
