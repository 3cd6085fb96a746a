// backends/cuda/driver_api.hpp — the CUDA driver API functions the CUDA back end uses, reached
// through cudaGetDriverEntryPointByVersion (libstitch never links libcuda). Loaded lazily, once
// per process; a function the driver does not provide stays nullptr and is named in
// DriverApi::unavailable_reason.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <string>

namespace stitch::cuda_driver {

/// Driver entry points. Member names avoid the cu* spelling because cuda.h maps some of those
/// names to versioned symbols with macros. Every pointer is either valid or nullptr.
struct DriverApi {
  // error reporting (optional: messages fall back to the numeric code without them)
  PFN_cuGetErrorName_v6000 get_error_name = nullptr;
  PFN_cuGetErrorString_v6000 get_error_string = nullptr;
  // context check before driver calls (optional)
  PFN_cuCtxGetCurrent_v4000 ctx_get_current = nullptr;
  // device queries and the virtual-memory API (all required for virtual memory)
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetAttribute_v2000 device_get_attribute = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 mem_get_allocation_granularity = nullptr;
  PFN_cuMemAddressReserve_v10020 mem_address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 mem_address_free = nullptr;
  PFN_cuMemCreate_v10020 mem_create = nullptr;
  PFN_cuMemRelease_v10020 mem_release = nullptr;
  PFN_cuMemMap_v10020 mem_map = nullptr;
  PFN_cuMemUnmap_v10020 mem_unmap = nullptr;
  PFN_cuMemSetAccess_v10020 mem_set_access = nullptr;

  /// True when every entry point needed for virtual memory (and its device queries) was found.
  bool vmm_entry_points = false;
  /// Why vmm_entry_points is false ("" when it is true): which entry points are missing and why.
  std::string unavailable_reason;
};

/// The process-wide entry-point table, loaded on first use (std::call_once). Never throws: a
/// lookup that fails leaves its pointer nullptr and is described in unavailable_reason.
/// Call it only after the CUDA runtime has found a device (the driver is initialised then).
[[nodiscard]] const DriverApi& driver_api() noexcept;

/// The properties of the physical memory stitch creates: pinned device memory on `device`, no
/// shareable handle.
inline CUmemAllocationProp device_memory_prop(CUdevice device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = static_cast<int>(device);
  return prop;
}

/// "CUDA_ERROR_OUT_OF_MEMORY (2): out of memory" — name, numeric code and description of a
/// driver result (falls back to "CUresult 2" when cuGetErrorName is unavailable).
[[nodiscard]] std::string describe(CUresult result);

}  // namespace stitch::cuda_driver
