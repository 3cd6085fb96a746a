// tests/support/fixed_address_backend.hpp — what the differential tests share: a simulated device
// whose addresses depend only on the calls made (so two allocators given the same requests can be
// compared block by block), and the two things they compare: the whole block layout and every
// statistic.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <string>

#include "stitch/allocator.hpp"
#include "stitch/backend.hpp"
#include "stitch/sim_backend.hpp"

namespace stitch::test {

/// The simulated device with addresses that depend only on the calls made: each allocation or
/// reservation gets the next free range of a private address space, never reused, and calls are
/// translated to the simulated device's real addresses. Best fit breaks ties by address, so two
/// allocators can be compared only where the same calls give the same addresses (the real
/// ones come from mmap, which also serves the heap). Copies (compaction, sleep) reach the real
/// memory; the tests never read it.
class FixedAddressBackend final : public Backend {
 public:
  explicit FixedAddressBackend(std::shared_ptr<SimBackend> sim) : sim_(std::move(sim)) {}

  const char* name() const noexcept override { return "sim"; }
  int device_count() override { return sim_->device_count(); }
  MemoryInfo memory_info(int d) override { return sim_->memory_info(d); }
  std::size_t granularity(int d) override { return sim_->granularity(d); }
  bool supports_virtual_memory(int d) override { return sim_->supports_virtual_memory(d); }
  void* allocate(int d, std::size_t bytes) override {
    return expose(sim_->allocate(d, bytes), bytes);
  }
  void deallocate(int d, void* ptr, std::size_t bytes) override {
    sim_->deallocate(d, forget(ptr), bytes);
  }
  void* reserve(int d, std::size_t bytes, std::size_t alignment) override {
    return expose(sim_->reserve(d, bytes, alignment), bytes);
  }
  void release_reservation(int d, void* va, std::size_t bytes) override {
    sim_->release_reservation(d, forget(va), bytes);
  }
  phys_handle_t create_physical(int d, std::size_t bytes) override {
    return sim_->create_physical(d, bytes);
  }
  void release_physical(int d, phys_handle_t h) override { sim_->release_physical(d, h); }
  bool map_run(int d, void* va, const MapPiece* pieces, std::size_t count) override {
    return sim_->map_run(d, real(va), pieces, count);
  }
  void unmap(int d, void* va, std::size_t bytes) override { sim_->unmap(d, real(va), bytes); }
  event_t create_event(int d) override { return sim_->create_event(d); }
  void destroy_event(int d, event_t e) override { sim_->destroy_event(d, e); }
  void record_event(int d, event_t e, stream_t s) override { sim_->record_event(d, e, s); }
  bool query_event(int d, event_t e) override { return sim_->query_event(d, e); }
  void synchronize_event(int d, event_t e) override { sim_->synchronize_event(d, e); }
  void synchronize_stream(int d, stream_t s) override { sim_->synchronize_stream(d, s); }
  void synchronize_device(int d) override { sim_->synchronize_device(d); }
  bool is_capturing(int d, stream_t s) override { return sim_->is_capturing(d, s); }
  // Compaction's and sleep's copies (device pointers translated; host ones as they are).
  void copy(int d, void* dst, const void* src, std::size_t bytes, stream_t s) override {
    sim_->copy(d, real(dst), real(const_cast<void*>(src)), bytes, s);
  }
  void copy_to_host(int d, void* dst, const void* src, std::size_t bytes) override {
    sim_->copy_to_host(d, dst, real(const_cast<void*>(src)), bytes);
  }
  void copy_from_host(int d, void* dst, const void* src, std::size_t bytes) override {
    sim_->copy_from_host(d, real(dst), src, bytes);
  }
  void* allocate_host(int d, std::size_t bytes) override { return sim_->allocate_host(d, bytes); }
  void deallocate_host(int d, void* ptr, std::size_t bytes) override {
    sim_->deallocate_host(d, ptr, bytes);
  }
  void copy_to_host_async(int d, void* dst, const void* src, std::size_t bytes, stream_t s) override {
    sim_->copy_to_host_async(d, dst, real(const_cast<void*>(src)), bytes, s);
  }
  void copy_from_host_async(int d, void* dst, const void* src, std::size_t bytes, stream_t s) override {
    sim_->copy_from_host_async(d, real(dst), src, bytes, s);
  }

 private:
  static constexpr std::uintptr_t kAlign = std::uintptr_t{2} << 20;
  void* expose(void* real_ptr, std::size_t bytes) {
    const std::uintptr_t fake = next_;
    next_ += (bytes + 2 * kAlign - 1) / kAlign * kAlign;  // a gap between ranges
    ranges_[fake] = reinterpret_cast<std::uintptr_t>(real_ptr);
    return reinterpret_cast<void*>(fake);
  }
  void* real(void* fake_ptr) const {
    const auto f = reinterpret_cast<std::uintptr_t>(fake_ptr);
    auto it = std::prev(ranges_.upper_bound(f));
    return reinterpret_cast<void*>(it->second + (f - it->first));
  }
  void* forget(void* fake_ptr) {
    void* r = real(fake_ptr);
    ranges_.erase(reinterpret_cast<std::uintptr_t>(fake_ptr));
    return r;
  }

  std::shared_ptr<SimBackend> sim_;
  std::uintptr_t next_ = std::uintptr_t{1} << 44;
  std::map<std::uintptr_t, std::uintptr_t> ranges_;  ///< exposed start -> real start
};

/// The snapshot with addresses as offsets within their segment (two allocators get their memory
/// at different addresses), one line per segment.
inline std::string layout(const Allocator& a) {
  std::string out;
  for (const SegmentSnapshot& s : a.snapshot().segments) {
    out += "segment " + std::to_string(s.total_size) + " " + std::to_string(s.stream) + " " +
           s.segment_type + (s.is_expandable ? " expandable" : "") + ":";
    for (const BlockSnapshot& b : s.blocks)
      out += " " + std::to_string(b.address - s.address) + "+" + std::to_string(b.size) + "/" +
             std::to_string(b.requested_size) + "/" + b.state;
    out += "\n";
  }
  return out;
}

/// Every statistic of device 0, one per line (`peaks`: with the peaks).
inline std::string stats_text(const Allocator& a, bool peaks = true) {
  std::string out;
  a.stats(0).for_each([&](const std::string& key, std::int64_t v) {
    if (!peaks && key.find(".peak") != std::string::npos) return;
    out += key + "=" + std::to_string(v) + "\n";
  });
  return out;
}

/// An allocator over a FixedAddressBackend of `capacity` bytes.
struct FixedSide {
  std::shared_ptr<SimBackend> sim;
  std::unique_ptr<Allocator> alloc;

  FixedSide(const std::string& conf, std::size_t capacity) {
    SimBackend::Options o;
    o.capacity = capacity;
    sim = std::make_shared<SimBackend>(o);
    alloc = std::make_unique<Allocator>(Config::parse(conf), std::make_shared<FixedAddressBackend>(sim));
  }
  /// nullptr on out of memory.
  void* allocate(std::size_t bytes, stream_t stream) {
    try {
      return alloc->allocate(bytes, stream);
    } catch (const out_of_memory&) {
      return nullptr;
    }
  }
};

}  // namespace stitch::test
