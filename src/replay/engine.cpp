// replay/engine.cpp — the replay loop over a DeviceAllocator on a SimBackend.
#include "replay/engine.hpp"

#include <vector>

#include "core/device_allocator.hpp"
#include "stitch/sim_backend.hpp"

namespace stitch::replay {

namespace {

stream_t as_stream(std::uintptr_t s) { return reinterpret_cast<stream_t>(s); }

}  // namespace

Replay::Replay(const DeviceWorkload& workload, const Setup& setup) : workload_(workload), setup_(setup) {
  SimBackend::Options so;
  so.capacity = setup.capacity;
  so.granularity = setup.granularity;
  sim_ = std::make_shared<SimBackend>(so);
  Config config = setup.config;
  config.backend = BackendKind::sim;
  config.record_stacks = false;
  config.oom_snapshot.clear();
  config.oom_what_if = false;
  device_ = std::make_unique<DeviceAllocator>(0, *sim_, config);
  live_.reserve(workload.initial.size() + 64);
}

Replay::~Replay() = default;

void* Replay::allocate(std::size_t size, std::uintptr_t stream) {
  const DeviceAllocator::Allocation a = device_->malloc(size, as_stream(stream));
  const std::unique_ptr<detail::OomCapture> failure(a.failure);  // only counted, not reported
  return a.ptr;
}

bool Replay::try_allocate(std::size_t size, std::uintptr_t stream) {
  return allocate(size, stream) != nullptr;
}

void Replay::allocate_block(std::uintptr_t addr, std::size_t size, std::uintptr_t stream) {
  void* p = allocate(size, stream);
  if (p == nullptr) {
    ++failures_;
    return;
  }
  live_[addr] = Live{p, size};
  requested_ += size;
}

void Replay::free_block(std::uintptr_t addr) {
  auto it = live_.find(addr);
  if (it == live_.end()) return;  // its allocation failed, or it was never seen
  (void)device_->free(it->second.ptr, nullptr, nullptr);
  requested_ -= it->second.size;
  live_.erase(it);
}

void Replay::start() {
  if (setup_.warm_start) {
    // Create the segments the recording allocator held, then free them: they stay cached.
    std::vector<void*> held;
    for (const StartSegment& s : workload_.cached_segments) {
      // 1 MiB lands in the small pool's 2 MiB segments; larger sizes get their own segment.
      const std::size_t size = s.small ? (std::size_t{1} << 20) : s.size;
      if (void* p = allocate(size, s.stream)) {
        held.push_back(p);
      } else {
        ++failures_;
      }
    }
    for (void* p : held) (void)device_->free(p, nullptr, nullptr);
  }
  for (const StartBlock& b : workload_.initial) {
    if (b.size != 0) allocate_block(b.addr, b.size, b.stream);
  }
}

bool Replay::step(const Event& e) {
  switch (e.kind) {
    case Event::Kind::alloc: {
      if (e.size == 0) return true;
      const std::size_t before = failures_;
      allocate_block(e.addr, e.size, e.stream);
      return failures_ == before;
    }
    case Event::Kind::free:
      free_block(e.addr);
      return true;
    case Event::Kind::failed:
      if (setup_.retry_failed) {
        if (void* p = allocate(e.size, e.stream)) (void)device_->free(p, nullptr, nullptr);
      }
      return true;
    case Event::Kind::release:
      if (setup_.honour_releases) device_->empty_cache();
      return true;
    case Event::Kind::none:
      return true;
  }
  return true;
}

DeviceStats Replay::stats() const { return device_->stats(); }

Snapshot Replay::snapshot() const {
  Snapshot snap;
  snap.device_traces.push_back(device_->snapshot(snap.segments));
  return snap;
}

}  // namespace stitch::replay
