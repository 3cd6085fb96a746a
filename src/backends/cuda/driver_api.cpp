// backends/cuda/driver_api.cpp — loads the driver entry points listed in DriverApi through the
// CUDA runtime's cudaGetDriverEntryPointByVersion, once per process, and formats CUresult codes.
#include "backends/cuda/driver_api.hpp"

#include <cuda_runtime_api.h>

#include <cstring>
#include <mutex>
#include <string>

namespace stitch::cuda_driver {
namespace {

std::string version_text(unsigned version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

// Looks `symbol` up as the ABI introduced in CUDA `version` (the _vNNNN suffix of its PFN_
// typedef, so the pointer always matches the typedef). On failure leaves `out` nullptr and
// appends the reason to `missing`.
template <class Fn>
void load(const char* symbol, unsigned version, Fn& out, std::string& missing) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err =
      cudaGetDriverEntryPointByVersion(symbol, &fn, version, cudaEnableDefault, &status);
  std::string why;
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // do not leave our failure as the thread's last runtime error
    why = std::string("cudaGetDriverEntryPointByVersion failed: ") + cudaGetErrorName(err) + " (" +
          std::to_string(static_cast<int>(err)) + "): " + cudaGetErrorString(err);
  } else if (status == cudaDriverEntryPointVersionNotSufficent) {
    why = "the driver has no version of it compatible with CUDA " + version_text(version);
  } else if (status != cudaDriverEntryPointSuccess || fn == nullptr) {
    why = "not found in the CUDA driver";
  }
  if (!why.empty()) {
    if (!missing.empty()) missing += "; ";
    missing += std::string(symbol) + ": " + why;
    return;
  }
  static_assert(sizeof(Fn) == sizeof(void*));
  std::memcpy(&out, &fn, sizeof out);  // object pointer -> function pointer, without a cast
}

DriverApi load_all() {
  DriverApi api;
  std::string optional_missing;  // error names / context check: nice to have, not required
  load("cuGetErrorName", 6000, api.get_error_name, optional_missing);
  load("cuGetErrorString", 6000, api.get_error_string, optional_missing);
  load("cuCtxGetCurrent", 4000, api.ctx_get_current, optional_missing);

  std::string missing;
  load("cuDeviceGet", 2000, api.device_get, missing);
  load("cuDeviceGetAttribute", 2000, api.device_get_attribute, missing);
  load("cuMemGetAllocationGranularity", 10020, api.mem_get_allocation_granularity, missing);
  load("cuMemAddressReserve", 10020, api.mem_address_reserve, missing);
  load("cuMemAddressFree", 10020, api.mem_address_free, missing);
  load("cuMemCreate", 10020, api.mem_create, missing);
  load("cuMemRelease", 10020, api.mem_release, missing);
  load("cuMemMap", 10020, api.mem_map, missing);
  load("cuMemUnmap", 10020, api.mem_unmap, missing);
  load("cuMemSetAccess", 10020, api.mem_set_access, missing);

  api.vmm_entry_points = missing.empty();
  if (!api.vmm_entry_points) {
    api.unavailable_reason = "driver entry points unavailable (" + missing + ")";
  }
  return api;
}

}  // namespace

const DriverApi& driver_api() noexcept {
  static std::once_flag once;
  static DriverApi api;
  // load_all only fails by leaving pointers null; a bad_alloc while building a message would
  // terminate, which is acceptable for a process that cannot allocate a few hundred bytes.
  std::call_once(once, [] { api = load_all(); });
  return api;
}

std::string describe(CUresult result) {
  const DriverApi& api = driver_api();
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.get_error_name == nullptr || api.get_error_name(result, &name) != CUDA_SUCCESS) {
    name = nullptr;
  }
  if (api.get_error_string == nullptr || api.get_error_string(result, &text) != CUDA_SUCCESS) {
    text = nullptr;
  }
  const std::string code = std::to_string(static_cast<int>(result));
  std::string out = name != nullptr ? std::string(name) + " (" + code + ")" : "CUresult " + code;
  if (text != nullptr) out += std::string(": ") + text;
  return out;
}

}  // namespace stitch::cuda_driver
