// tools/tracegen/synthetic_addresses.hpp — a back end that hands the allocator fixed, synthetic
// device addresses over a SimBackend's real ones, so that a run recorded through stitch
// (stitch-tracegen --device-memory) writes the same snapshot, byte for byte, on every machine.
// Plain segments and address reservations get addresses in the order they are made, never reused;
// every other call is forwarded with its addresses translated. The memory is never touched (no
// copies: compaction and sleep are not for recorded runs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>

#include "stitch/backend.hpp"
#include "stitch/sim_backend.hpp"

namespace stitch::tracegen::detail {

class SyntheticAddresses final : public Backend {
 public:
  explicit SyntheticAddresses(std::shared_ptr<SimBackend> sim) : sim_(std::move(sim)) {}

  [[nodiscard]] const char* name() const noexcept override { return "sim"; }
  [[nodiscard]] int device_count() override { return sim_->device_count(); }
  [[nodiscard]] MemoryInfo memory_info(int device) override { return sim_->memory_info(device); }
  [[nodiscard]] std::size_t granularity(int device) override { return sim_->granularity(device); }
  [[nodiscard]] bool supports_virtual_memory(int device) override { return sim_->supports_virtual_memory(device); }
  [[nodiscard]] void* allocate(int device, std::size_t bytes) override;
  void deallocate(int device, void* ptr, std::size_t bytes) override;
  [[nodiscard]] void* reserve(int device, std::size_t bytes, std::size_t alignment) override;
  void release_reservation(int device, void* va, std::size_t bytes) override;
  [[nodiscard]] phys_handle_t create_physical(int device, std::size_t bytes) override {
    return sim_->create_physical(device, bytes);
  }
  void release_physical(int device, phys_handle_t handle) override { sim_->release_physical(device, handle); }
  [[nodiscard]] bool map_run(int device, void* va, const MapPiece* pieces, std::size_t count) override {
    return sim_->map_run(device, real(va), pieces, count);
  }
  void unmap(int device, void* va, std::size_t bytes) override { sim_->unmap(device, real(va), bytes); }
  [[nodiscard]] event_t create_event(int device) override { return sim_->create_event(device); }
  void destroy_event(int device, event_t event) override { sim_->destroy_event(device, event); }
  void record_event(int device, event_t event, stream_t stream) override { sim_->record_event(device, event, stream); }
  [[nodiscard]] bool query_event(int device, event_t event) override { return sim_->query_event(device, event); }
  void synchronize_event(int device, event_t event) override { sim_->synchronize_event(device, event); }
  void synchronize_stream(int device, stream_t stream) override { sim_->synchronize_stream(device, stream); }
  void synchronize_device(int device) override { sim_->synchronize_device(device); }

 private:
  struct Region {
    std::uintptr_t real = 0;
    std::size_t bytes = 0;
  };
  void* add(void* real, std::size_t bytes, std::size_t alignment);
  void* real(void* synthetic) const;
  std::map<std::uintptr_t, Region>::iterator find(void* synthetic);

  std::shared_ptr<SimBackend> sim_;
  std::map<std::uintptr_t, Region> regions_;  ///< synthetic start -> the sim's memory
  std::uintptr_t next_ = 0x7f4000000000;      ///< where the next region goes
};

}  // namespace stitch::tracegen::detail
