// backends/backend_factory.cpp — turns a Config's `backend:` key into a Backend instance, and
// the Backend interface's default implementations.
#include <memory>
#include <string>

#include "stitch/backend.hpp"
#include "stitch/config.hpp"
#include "stitch/errors.hpp"
#include "stitch/sim_backend.hpp"

#include "backends/cuda/cuda_backend.hpp"

namespace stitch {

namespace {
[[noreturn]] void not_implemented(const Backend& b, const char* call, int device) {
  throw backend_error(std::string(b.name()) + ": " + call + " (device " + std::to_string(device) +
                      "): this back end does not implement it");
}
}  // namespace

void Backend::copy(int device, void*, const void*, std::size_t, stream_t) {
  not_implemented(*this, "copy", device);
}

void Backend::copy_to_host(int device, void*, const void*, std::size_t) {
  not_implemented(*this, "copy_to_host", device);
}

void Backend::copy_from_host(int device, void*, const void*, std::size_t) {
  not_implemented(*this, "copy_from_host", device);
}

void Backend::synchronize_device(int device) { not_implemented(*this, "synchronize_device", device); }

void* Backend::allocate_host(int device, std::size_t) { not_implemented(*this, "allocate_host", device); }

std::size_t Backend::host_granularity(int) { return 0; }

bool Backend::protect_read_only(int, void*, std::size_t) { return false; }

phys_handle_t Backend::create_host_physical(int device, std::size_t) {
  not_implemented(*this, "create_host_physical (host pages mapped for the device)", device);
}

void Backend::deallocate_host(int device, void*, std::size_t) {
  not_implemented(*this, "deallocate_host", device);
}

void Backend::copy_to_host_async(int device, void*, const void*, std::size_t, stream_t) {
  not_implemented(*this, "copy_to_host_async", device);
}

void Backend::copy_from_host_async(int device, void*, const void*, std::size_t, stream_t) {
  not_implemented(*this, "copy_from_host_async", device);
}

std::string Backend::export_memory(int device, const void*, std::size_t, std::size_t*) {
  not_implemented(*this, "export_memory (memory other processes map)", device);
}

std::size_t Backend::export_size(int device, const void*, std::size_t, std::size_t*) {
  not_implemented(*this, "export_size (memory other processes map)", device);
}

void* Backend::import_memory(int device, const std::string&, std::size_t*) {
  not_implemented(*this, "import_memory (memory another process exported)", device);
}

void Backend::close_imported(int device, void*, std::size_t) {
  not_implemented(*this, "close_imported", device);
}

std::shared_ptr<Backend> make_backend(const Config& config) {
  switch (config.backend) {
    case BackendKind::sim: {
      SimBackend::Options options;
      options.devices = config.sim_devices;
      options.capacity = config.sim_capacity_mb << 20;
      options.host_capacity = config.sim_host_mb << 20;
      return std::make_shared<SimBackend>(options);
    }
    case BackendKind::cuda:
      return make_cuda_backend(config);  // throws backend_error("no CUDA device ...") without one
  }
  throw config_error("unknown backend");
}

int probe_device_count(const Config& config) {
  switch (config.backend) {
    case BackendKind::sim:
      return config.sim_devices;
    case BackendKind::cuda:
      return cuda_device_count();
  }
  throw config_error("unknown backend");
}

}  // namespace stitch
