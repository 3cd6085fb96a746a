// backends/cuda/driver.hpp — the CUDA driver, opened at run time: libcuda.so.1 (or the file
// named by STITCH_CUDA_DRIVER) with dlopen, cuGetProcAddress found with dlsym, and every other
// entry point the CUDA back end calls resolved through it at the ABI version of the prototype it
// is called through. libstitch links no CUDA library, so one build works inside a process that
// uses any CUDA runtime, or none.
//
// The table is built once per process (std::call_once) and never destroyed: allocators that are
// never destroyed (the C API's) may still call the driver while the process exits.
#pragma once

#include <string>

#include "backends/cuda/cuda_types.hpp"

namespace stitch::cuda_driver {

/// The driver entry points the back end calls. Member names avoid the cu* spelling, which
/// cuda.h maps to versioned symbols with macros. After a successful load every pointer is valid.
struct Driver {
  CUresult (*init)(unsigned int flags) = nullptr;
  CUresult (*driver_get_version)(int* version) = nullptr;
  CUresult (*get_error_name)(CUresult error, const char** name) = nullptr;
  CUresult (*get_error_string)(CUresult error, const char** text) = nullptr;
  // devices (no context needed)
  CUresult (*device_get_count)(int* count) = nullptr;
  CUresult (*device_get)(CUdevice* device, int ordinal) = nullptr;
  CUresult (*device_get_attribute)(int* value, CUdevice_attribute attribute, CUdevice device) = nullptr;
  CUresult (*device_total_mem)(std::size_t* bytes, CUdevice device) = nullptr;
  CUresult (*device_can_access_peer)(int* can, CUdevice device, CUdevice peer) = nullptr;
  // contexts
  CUresult (*primary_ctx_retain)(CUcontext* context, CUdevice device) = nullptr;
  CUresult (*ctx_get_current)(CUcontext* context) = nullptr;
  CUresult (*ctx_set_current)(CUcontext context) = nullptr;
  CUresult (*ctx_synchronize)() = nullptr;
  // plain memory
  CUresult (*mem_get_info)(std::size_t* free, std::size_t* total) = nullptr;
  CUresult (*mem_alloc)(CUdeviceptr* ptr, std::size_t bytes) = nullptr;
  CUresult (*mem_free)(CUdeviceptr ptr) = nullptr;
  // virtual memory
  CUresult (*mem_get_allocation_granularity)(std::size_t* granularity,
                                             const CUmemAllocationProp* prop,
                                             CUmemAllocationGranularity_flags option) = nullptr;
  CUresult (*mem_address_reserve)(CUdeviceptr* ptr, std::size_t size, std::size_t alignment,
                                  CUdeviceptr addr, unsigned long long flags) = nullptr;
  CUresult (*mem_address_free)(CUdeviceptr ptr, std::size_t size) = nullptr;
  CUresult (*mem_create)(CUmemGenericAllocationHandle* handle, std::size_t size,
                         const CUmemAllocationProp* prop, unsigned long long flags) = nullptr;
  CUresult (*mem_release)(CUmemGenericAllocationHandle handle) = nullptr;
  CUresult (*mem_map)(CUdeviceptr ptr, std::size_t size, std::size_t offset,
                      CUmemGenericAllocationHandle handle, unsigned long long flags) = nullptr;
  CUresult (*mem_unmap)(CUdeviceptr ptr, std::size_t size) = nullptr;
  CUresult (*mem_set_access)(CUdeviceptr ptr, std::size_t size, const CUmemAccessDesc* desc,
                             std::size_t count) = nullptr;
  CUresult (*mem_get_address_range)(CUdeviceptr* base, std::size_t* size, CUdeviceptr ptr) = nullptr;
  // memory other processes map (IPC)
  CUresult (*mem_export_to_shareable_handle)(void* shareable, CUmemGenericAllocationHandle handle,
                                             CUmemAllocationHandleType type,
                                             unsigned long long flags) = nullptr;
  CUresult (*mem_import_from_shareable_handle)(CUmemGenericAllocationHandle* handle, void* os_handle,
                                               CUmemAllocationHandleType type) = nullptr;
  CUresult (*ipc_get_mem_handle)(CUipcMemHandle* handle, CUdeviceptr ptr) = nullptr;
  CUresult (*ipc_open_mem_handle)(CUdeviceptr* ptr, CUipcMemHandle handle, unsigned int flags) = nullptr;
  CUresult (*ipc_close_mem_handle)(CUdeviceptr ptr) = nullptr;
  CUresult (*memcpy_dtod_async)(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes,
                                CUstream stream) = nullptr;
  CUresult (*memcpy_dtoh)(void* dst, CUdeviceptr src, std::size_t bytes) = nullptr;
  CUresult (*memcpy_htod)(CUdeviceptr dst, const void* src, std::size_t bytes) = nullptr;
  // pinned host memory and the asynchronous copies through it
  CUresult (*mem_host_alloc)(void** ptr, std::size_t bytes, unsigned int flags) = nullptr;
  CUresult (*mem_free_host)(void* ptr) = nullptr;
  CUresult (*memcpy_dtoh_async)(void* dst, CUdeviceptr src, std::size_t bytes,
                                CUstream stream) = nullptr;
  CUresult (*memcpy_htod_async)(CUdeviceptr dst, const void* src, std::size_t bytes,
                                CUstream stream) = nullptr;
  // events and streams
  CUresult (*event_create)(CUevent* event, unsigned int flags) = nullptr;
  CUresult (*event_destroy)(CUevent event) = nullptr;
  CUresult (*event_record)(CUevent event, CUstream stream) = nullptr;
  CUresult (*event_query)(CUevent event) = nullptr;
  CUresult (*event_synchronize)(CUevent event) = nullptr;
  CUresult (*stream_synchronize)(CUstream stream) = nullptr;
  CUresult (*stream_is_capturing)(CUstream stream, CUstreamCaptureStatus* status) = nullptr;
  CUresult (*thread_exchange_stream_capture_mode)(CUstreamCaptureMode* mode) = nullptr;

  std::string path;        ///< the file opened ("libcuda.so.1" or $STITCH_CUDA_DRIVER)
  int version = 0;         ///< cuDriverGetVersion (e.g. 13000)
};

/// The process-wide driver, loaded and initialised (cuInit) on first use. Never throws; returns
/// nullptr when the driver cannot be used, and `why` (when not null) then says why, e.g.
/// "cannot open the CUDA driver libcuda.so.1 (...)" or "cuInit failed: CUDA_ERROR_NO_DEVICE".
[[nodiscard]] const Driver* driver(std::string* why = nullptr) noexcept;

/// The properties of the physical memory stitch creates: pinned device memory on `device` that
/// can be exported as `handle_types` (a CUmemAllocationHandleType mask: POSIX file descriptors,
/// fabric handles, or none), registrable for GPUDirect RDMA when `rdma`.
inline CUmemAllocationProp device_memory_prop(CUdevice device, unsigned handle_types = 0, bool rdma = false) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = static_cast<CUmemAllocationHandleType>(handle_types);
  prop.allocFlags.gpuDirectRDMACapable = rdma ? 1 : 0;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = static_cast<int>(device);
  return prop;
}

/// "CUDA_ERROR_OUT_OF_MEMORY (2): out of memory" — name, numeric code and description of a
/// driver result ("CUresult 2" when the driver cannot name it).
[[nodiscard]] std::string describe(CUresult result);

}  // namespace stitch::cuda_driver
