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

void Backend::copy(int device, void*, const void*, std::size_t, stream_t) {
  throw backend_error(std::string(name()) + ": copy (device " + std::to_string(device) +
                      "): this back end does not implement device copies");
}

void Backend::copy_to_host(int device, void*, const void*, std::size_t) {
  throw backend_error(std::string(name()) + ": copy_to_host (device " + std::to_string(device) +
                      "): this back end does not implement it");
}

void Backend::copy_from_host(int device, void*, const void*, std::size_t) {
  throw backend_error(std::string(name()) + ": copy_from_host (device " + std::to_string(device) +
                      "): this back end does not implement it");
}

void Backend::synchronize_device(int device) {
  throw backend_error(std::string(name()) + ": synchronize_device (device " +
                      std::to_string(device) + "): this back end does not implement it");
}

std::shared_ptr<Backend> make_backend(const Config& config) {
  switch (config.backend) {
    case BackendKind::sim: {
      SimBackend::Options options;
      options.devices = config.sim_devices;
      options.capacity = config.sim_capacity_mb << 20;
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
