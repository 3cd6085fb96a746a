// benchmarks/gpu/timed_backend.hpp — TimedBackend, the timing back end of stitch_gpu_bench's
// compaction_cost/* and sleep_cost/* benchmarks: a stitch::Backend that forwards every call to an
// inner back end and counts and times (host wall time) the kinds of calls those benchmarks
// report, plus the optional CUDA events around device copies that compaction_cost/copies uses.
// Each benchmark reports its own subset of the kinds (see compaction_cost.cpp, sleep_cost.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "peers.hpp"
#include "stitch/stitch.hpp"

namespace stitch_bench {

/// The back end, forwarded call by call, counting and timing (host wall time) the calls of every
/// Kind; with copy events on, every device copy is bracketed by CUDA events on its stream, so
/// that the copies' device time can be summed afterwards.
class TimedBackend final : public stitch::Backend {
 public:
  /// The calls tallied, in kNames' order (compaction's kinds first, then sleep's own).
  enum class Kind : std::size_t {
    reserve, release_reservation, create, release, map, unmap, copy, copy_to_host,
    copy_from_host, sync_stream, sync_device, allocate_host, deallocate_host,
    copy_to_host_async, copy_from_host_async
  };
  static constexpr std::size_t kKinds = 15;
  /// The kinds' names, as in the benchmarks' <kind>_calls and <kind>_ns counters.
  static constexpr std::array<const char*, kKinds> kNames = {
      "reserve", "release_reservation", "create", "release", "map", "unmap", "copy",
      "copy_to_host", "copy_from_host", "sync_stream", "sync_device", "allocate_host",
      "deallocate_host", "copy_to_host_async", "copy_from_host_async"};
  struct Tally {
    std::int64_t calls = 0;
    double ns = 0;
    std::size_t bytes = 0;
  };
  using Tallies = std::array<Tally, kKinds>;

  static constexpr std::size_t index(Kind k) { return static_cast<std::size_t>(k); }
  static constexpr const char* name_of(Kind k) { return kNames[index(k)]; }

  explicit TimedBackend(std::shared_ptr<stitch::Backend> inner) : inner_(std::move(inner)) {}
  ~TimedBackend() override {
    for (auto& [a, b] : events_) {
      (void)cudaEventDestroy(a);
      (void)cudaEventDestroy(b);
    }
  }
  TimedBackend(const TimedBackend&) = delete;
  TimedBackend& operator=(const TimedBackend&) = delete;

  /// Zeroes the tallies and forgets the copies bracketed so far (their events are reused).
  void reset() {
    tallies_ = {};
    used_ = 0;
  }
  /// Brackets every device copy (copy()) with CUDA events from now on, or stops.
  void set_copy_events(bool on) { events_on_ = on; }
  [[nodiscard]] const Tallies& tallies() const { return tallies_; }
  [[nodiscard]] const Tally& tally(Kind k) const { return tallies_[index(k)]; }
  /// The summed device time of the copies bracketed since reset() (waits for them).
  double copy_device_ns() {
    double ns = 0;
    for (std::size_t i = 0; i < used_; ++i) {
      check(cudaEventSynchronize(events_[i].second), "cudaEventSynchronize");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, events_[i].first, events_[i].second), "cudaEventElapsedTime");
      ns += static_cast<double>(ms) * 1e6;
    }
    return ns;
  }

  /// Runs `f` (one call of the inner back end) as a call of kind `k` moving `bytes`.
  template <class F>
  decltype(auto) timed(Kind k, std::size_t bytes, F&& f) {
    Tally& t = tallies_[index(k)];
    ++t.calls;
    t.bytes += bytes;
    struct Add {
      Tally& t;
      Clock::time_point t0;
      ~Add() { t.ns += std::chrono::duration<double, std::nano>(Clock::now() - t0).count(); }
    } add{t, Clock::now()};
    return f();
  }

  const char* name() const noexcept override { return inner_->name(); }
  int device_count() override { return inner_->device_count(); }
  stitch::MemoryInfo memory_info(int d) override { return inner_->memory_info(d); }
  std::size_t total_memory(int d) override { return inner_->total_memory(d); }
  std::size_t granularity(int d) override { return inner_->granularity(d); }
  bool supports_virtual_memory(int d) override { return inner_->supports_virtual_memory(d); }
  void* allocate(int d, std::size_t bytes) override { return inner_->allocate(d, bytes); }
  void deallocate(int d, void* p, std::size_t bytes) override { inner_->deallocate(d, p, bytes); }
  void* reserve(int d, std::size_t bytes, std::size_t alignment) override {
    return timed(Kind::reserve, 0, [&] { return inner_->reserve(d, bytes, alignment); });
  }
  void release_reservation(int d, void* va, std::size_t bytes) override {
    timed(Kind::release_reservation, 0, [&] { inner_->release_reservation(d, va, bytes); });
  }
  stitch::phys_handle_t create_physical(int d, std::size_t bytes) override {
    return timed(Kind::create, bytes, [&] { return inner_->create_physical(d, bytes); });
  }
  void release_physical(int d, stitch::phys_handle_t h) override {
    timed(Kind::release, 0, [&] { inner_->release_physical(d, h); });
  }
  bool map_run(int d, void* va, const stitch::MapPiece* pieces, std::size_t count) override {
    return timed(Kind::map, 0, [&] { return inner_->map_run(d, va, pieces, count); });
  }
  void unmap(int d, void* va, std::size_t bytes) override {
    timed(Kind::unmap, bytes, [&] { inner_->unmap(d, va, bytes); });
  }
  stitch::event_t create_event(int d) override { return inner_->create_event(d); }
  void destroy_event(int d, stitch::event_t e) override { inner_->destroy_event(d, e); }
  void record_event(int d, stitch::event_t e, stitch::stream_t s) override { inner_->record_event(d, e, s); }
  bool query_event(int d, stitch::event_t e) override { return inner_->query_event(d, e); }
  void synchronize_event(int d, stitch::event_t e) override { inner_->synchronize_event(d, e); }
  void synchronize_stream(int d, stitch::stream_t s) override {
    timed(Kind::sync_stream, 0, [&] { inner_->synchronize_stream(d, s); });
  }
  void copy(int d, void* dst, const void* src, std::size_t bytes, stitch::stream_t s) override {
    if (!events_on_) {
      timed(Kind::copy, bytes, [&] { inner_->copy(d, dst, src, bytes, s); });
      return;
    }
    auto& [begin, end] = next_events();
    const auto stream = static_cast<cudaStream_t>(s);
    check(cudaEventRecord(begin, stream), "cudaEventRecord");
    timed(Kind::copy, bytes, [&] { inner_->copy(d, dst, src, bytes, s); });
    check(cudaEventRecord(end, stream), "cudaEventRecord");
  }
  void copy_to_host(int d, void* dst, const void* src, std::size_t bytes) override {
    timed(Kind::copy_to_host, bytes, [&] { inner_->copy_to_host(d, dst, src, bytes); });
  }
  void copy_from_host(int d, void* dst, const void* src, std::size_t bytes) override {
    timed(Kind::copy_from_host, bytes, [&] { inner_->copy_from_host(d, dst, src, bytes); });
  }
  void* allocate_host(int d, std::size_t bytes) override {
    return timed(Kind::allocate_host, bytes, [&] { return inner_->allocate_host(d, bytes); });
  }
  void deallocate_host(int d, void* p, std::size_t bytes) override {
    timed(Kind::deallocate_host, bytes, [&] { inner_->deallocate_host(d, p, bytes); });
  }
  void copy_to_host_async(int d, void* dst, const void* src, std::size_t bytes,
                          stitch::stream_t s) override {
    timed(Kind::copy_to_host_async, bytes, [&] { inner_->copy_to_host_async(d, dst, src, bytes, s); });
  }
  void copy_from_host_async(int d, void* dst, const void* src, std::size_t bytes,
                            stitch::stream_t s) override {
    timed(Kind::copy_from_host_async, bytes,
          [&] { inner_->copy_from_host_async(d, dst, src, bytes, s); });
  }
  void synchronize_device(int d) override {
    timed(Kind::sync_device, 0, [&] { inner_->synchronize_device(d); });
  }
  bool is_capturing(int d, stitch::stream_t s) override { return inner_->is_capturing(d, s); }

 private:
  using Clock = std::chrono::steady_clock;

  std::pair<cudaEvent_t, cudaEvent_t>& next_events() {
    if (used_ == events_.size()) {
      cudaEvent_t a = nullptr, b = nullptr;
      check(cudaEventCreate(&a), "cudaEventCreate");
      if (const cudaError_t e = cudaEventCreate(&b); e != cudaSuccess) {
        (void)cudaEventDestroy(a);
        check(e, "cudaEventCreate");
      }
      events_.emplace_back(a, b);
    }
    return events_[used_++];
  }

  std::shared_ptr<stitch::Backend> inner_;
  Tallies tallies_{};
  bool events_on_ = false;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> events_;
  std::size_t used_ = 0;
};

}  // namespace stitch_bench
