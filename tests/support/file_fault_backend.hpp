// tests/support/file_fault_backend.hpp — FilesThroughSim: a Backend that sends every device call
// to another back end (backend:cuda over the strict fake driver) and the file calls of sleep's
// disk tier to a SimBackend of its own, so that the simulator's file faults
// (SimBackend::inject_fault with SimCall::write_file ..., SimFault::short_io / no_space /
// io_error) and counts reach an allocator on the fake driver. Header-only.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "stitch/backend.hpp"
#include "stitch/sim_backend.hpp"

namespace stitch::test {

class FilesThroughSim final : public Backend {
 public:
  explicit FilesThroughSim(std::shared_ptr<Backend> device)
      : device_(std::move(device)), files_(std::make_shared<SimBackend>(options(*device_))) {}

  /// The simulator whose file calls this back end makes (faults, counts, open files).
  [[nodiscard]] SimBackend& files() { return *files_; }

  // Files: the simulator's.
  int open_file(int d, const char* dir, bool* direct) noexcept override { return files_->open_file(d, dir, direct); }
  std::int64_t write_file(int d, int fd, const void* src, std::size_t n, std::uint64_t off) noexcept override {
    return files_->write_file(d, fd, src, n, off);
  }
  std::int64_t read_file(int d, int fd, void* dst, std::size_t n, std::uint64_t off) noexcept override {
    return files_->read_file(d, fd, dst, n, off);
  }
  int discard_file(int d, int fd, std::uint64_t off, std::uint64_t n) noexcept override {
    return files_->discard_file(d, fd, off, n);
  }
  void close_file(int d, int fd) noexcept override { files_->close_file(d, fd); }

  // Everything else: the device's.
  const char* name() const noexcept override { return device_->name(); }
  int device_count() override { return device_->device_count(); }
  MemoryInfo memory_info(int d) override { return device_->memory_info(d); }
  std::size_t total_memory(int d) override { return device_->total_memory(d); }
  std::size_t granularity(int d) override { return device_->granularity(d); }
  bool supports_virtual_memory(int d) override { return device_->supports_virtual_memory(d); }
  void* allocate(int d, std::size_t n) override { return device_->allocate(d, n); }
  void deallocate(int d, void* p, std::size_t n) override { device_->deallocate(d, p, n); }
  void* reserve(int d, std::size_t n, std::size_t a) override { return device_->reserve(d, n, a); }
  void release_reservation(int d, void* va, std::size_t n) override { device_->release_reservation(d, va, n); }
  phys_handle_t create_physical(int d, std::size_t n) override { return device_->create_physical(d, n); }
  void release_physical(int d, phys_handle_t h) override { device_->release_physical(d, h); }
  bool map_run(int d, void* va, const MapPiece* p, std::size_t c) override { return device_->map_run(d, va, p, c); }
  void unmap(int d, void* va, std::size_t n) override { device_->unmap(d, va, n); }
  bool protect_read_only(int d, void* va, std::size_t n) override { return device_->protect_read_only(d, va, n); }
  event_t create_event(int d) override { return device_->create_event(d); }
  void destroy_event(int d, event_t e) override { device_->destroy_event(d, e); }
  void record_event(int d, event_t e, stream_t s) override { device_->record_event(d, e, s); }
  bool query_event(int d, event_t e) override { return device_->query_event(d, e); }
  void synchronize_event(int d, event_t e) override { device_->synchronize_event(d, e); }
  void synchronize_stream(int d, stream_t s) override { device_->synchronize_stream(d, s); }
  void copy(int d, void* dst, const void* src, std::size_t n, stream_t s) override { device_->copy(d, dst, src, n, s); }
  void copy_to_host(int d, void* dst, const void* src, std::size_t n) override { device_->copy_to_host(d, dst, src, n); }
  void copy_from_host(int d, void* dst, const void* src, std::size_t n) override {
    device_->copy_from_host(d, dst, src, n);
  }
  void* allocate_host(int d, std::size_t n) override { return device_->allocate_host(d, n); }
  void deallocate_host(int d, void* p, std::size_t n) override { device_->deallocate_host(d, p, n); }
  void copy_to_host_async(int d, void* dst, const void* src, std::size_t n, stream_t s) override {
    device_->copy_to_host_async(d, dst, src, n, s);
  }
  void copy_from_host_async(int d, void* dst, const void* src, std::size_t n, stream_t s) override {
    device_->copy_from_host_async(d, dst, src, n, s);
  }
  std::size_t host_granularity(int d) override { return device_->host_granularity(d); }
  phys_handle_t create_host_physical(int d, std::size_t n) override { return device_->create_host_physical(d, n); }
  std::string export_memory(int d, const void* va, std::size_t n, std::size_t* off) override {
    return device_->export_memory(d, va, n, off);
  }
  std::size_t export_size(int d, const void* va, std::size_t n, std::size_t* off) override {
    return device_->export_size(d, va, n, off);
  }
  void* import_memory(int d, const std::string& h, std::size_t* n) override { return device_->import_memory(d, h, n); }
  void close_imported(int d, void* va, std::size_t n) override { device_->close_imported(d, va, n); }
  void synchronize_device(int d) override { device_->synchronize_device(d); }
  bool is_capturing(int d, stream_t s) override { return device_->is_capturing(d, s); }

 private:
  static SimBackend::Options options(Backend& device) {
    SimBackend::Options o;
    o.devices = device.device_count();
    o.capacity = std::size_t{64} << 20;  // (its device memory is never used)
    return o;
  }

  std::shared_ptr<Backend> device_;
  std::shared_ptr<SimBackend> files_;
};

}  // namespace stitch::test
