// backends/cuda/driver.cpp — opens the CUDA driver (dlopen), resolves the Driver table through
// cuGetProcAddress, calls cuInit, and formats CUresult codes.
#include "backends/cuda/driver.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>

#if STITCH_CUDA_TYPES_FROM_CUDA_H
#include <cudaTypedefs.h>
#endif

namespace stitch::cuda_driver {
namespace {

// cuGetProcAddress since CUDA 12.0 (cuGetProcAddress_v2) and in CUDA 11.3-11.8.
using GetProcAddressV2 = CUresult (*)(const char* symbol, void** fn, int version,
                                      cuuint64_t flags, CUdriverProcAddressQueryResult* status);
using GetProcAddressV1 = CUresult (*)(const char* symbol, void** fn, int version,
                                      cuuint64_t flags);

#if STITCH_CUDA_TYPES_FROM_CUDA_H
// Each entry point is requested at the ABI version of the prototype it is called through; with
// the toolkit's headers, that prototype must be cudaTypedefs.h's PFN_<name>_v<version>.
#define STITCH_SAME_ABI(member, pfn) \
  static_assert(std::is_same_v<decltype(Driver::member), pfn>, #member " does not match " #pfn)
STITCH_SAME_ABI(init, PFN_cuInit_v2000);
STITCH_SAME_ABI(driver_get_version, PFN_cuDriverGetVersion_v2020);
STITCH_SAME_ABI(get_error_name, PFN_cuGetErrorName_v6000);
STITCH_SAME_ABI(get_error_string, PFN_cuGetErrorString_v6000);
STITCH_SAME_ABI(device_get_count, PFN_cuDeviceGetCount_v2000);
STITCH_SAME_ABI(device_get, PFN_cuDeviceGet_v2000);
STITCH_SAME_ABI(device_get_attribute, PFN_cuDeviceGetAttribute_v2000);
STITCH_SAME_ABI(device_total_mem, PFN_cuDeviceTotalMem_v3020);
STITCH_SAME_ABI(device_can_access_peer, PFN_cuDeviceCanAccessPeer_v4000);
STITCH_SAME_ABI(primary_ctx_retain, PFN_cuDevicePrimaryCtxRetain_v7000);
STITCH_SAME_ABI(ctx_get_current, PFN_cuCtxGetCurrent_v4000);
STITCH_SAME_ABI(ctx_set_current, PFN_cuCtxSetCurrent_v4000);
STITCH_SAME_ABI(ctx_synchronize, PFN_cuCtxSynchronize_v2000);
STITCH_SAME_ABI(mem_get_info, PFN_cuMemGetInfo_v3020);
STITCH_SAME_ABI(mem_alloc, PFN_cuMemAlloc_v3020);
STITCH_SAME_ABI(mem_free, PFN_cuMemFree_v3020);
STITCH_SAME_ABI(mem_get_allocation_granularity, PFN_cuMemGetAllocationGranularity_v10020);
STITCH_SAME_ABI(mem_address_reserve, PFN_cuMemAddressReserve_v10020);
STITCH_SAME_ABI(mem_address_free, PFN_cuMemAddressFree_v10020);
STITCH_SAME_ABI(mem_create, PFN_cuMemCreate_v10020);
STITCH_SAME_ABI(mem_release, PFN_cuMemRelease_v10020);
STITCH_SAME_ABI(mem_map, PFN_cuMemMap_v10020);
STITCH_SAME_ABI(mem_unmap, PFN_cuMemUnmap_v10020);
STITCH_SAME_ABI(mem_set_access, PFN_cuMemSetAccess_v10020);
STITCH_SAME_ABI(mem_get_address_range, PFN_cuMemGetAddressRange_v3020);
STITCH_SAME_ABI(mem_export_to_shareable_handle, PFN_cuMemExportToShareableHandle_v10020);
STITCH_SAME_ABI(mem_import_from_shareable_handle, PFN_cuMemImportFromShareableHandle_v10020);
STITCH_SAME_ABI(ipc_get_mem_handle, PFN_cuIpcGetMemHandle_v4010);
STITCH_SAME_ABI(ipc_open_mem_handle, PFN_cuIpcOpenMemHandle_v11000);
STITCH_SAME_ABI(ipc_close_mem_handle, PFN_cuIpcCloseMemHandle_v4010);
STITCH_SAME_ABI(memcpy_dtod_async, PFN_cuMemcpyDtoDAsync_v3020);
STITCH_SAME_ABI(memcpy_dtoh, PFN_cuMemcpyDtoH_v3020);
STITCH_SAME_ABI(memcpy_htod, PFN_cuMemcpyHtoD_v3020);
STITCH_SAME_ABI(mem_host_alloc, PFN_cuMemHostAlloc_v2020);
STITCH_SAME_ABI(mem_free_host, PFN_cuMemFreeHost_v2000);
STITCH_SAME_ABI(memcpy_dtoh_async, PFN_cuMemcpyDtoHAsync_v3020);
STITCH_SAME_ABI(memcpy_htod_async, PFN_cuMemcpyHtoDAsync_v3020);
STITCH_SAME_ABI(event_create, PFN_cuEventCreate_v2000);
STITCH_SAME_ABI(event_destroy, PFN_cuEventDestroy_v4000);
STITCH_SAME_ABI(event_record, PFN_cuEventRecord_v2000);
STITCH_SAME_ABI(event_query, PFN_cuEventQuery_v2000);
STITCH_SAME_ABI(event_synchronize, PFN_cuEventSynchronize_v2000);
STITCH_SAME_ABI(stream_synchronize, PFN_cuStreamSynchronize_v2000);
STITCH_SAME_ABI(stream_is_capturing, PFN_cuStreamIsCapturing_v10000);
STITCH_SAME_ABI(thread_exchange_stream_capture_mode, PFN_cuThreadExchangeStreamCaptureMode_v10010);
#undef STITCH_SAME_ABI
#endif

std::string version_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

class Loader {
 public:
  explicit Loader(Driver& d) : d_(d) {}

  /// Opens the driver and fills the table; on failure returns why.
  std::string load() {
    const char* env = std::getenv("STITCH_CUDA_DRIVER");
    d_.path = env != nullptr && *env != '\0' ? env : "libcuda.so.1";
    void* lib = ::dlopen(d_.path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* err = ::dlerror();
      return "cannot open the CUDA driver " + d_.path + " (" + (err ? err : "dlopen failed") +
             (env == nullptr ? "; is the NVIDIA driver installed?" : "") + ")";
    }
    if (void* v2 = ::dlsym(lib, "cuGetProcAddress_v2")) {
      std::memcpy(&v2_, &v2, sizeof v2_);
    } else if (void* v1 = ::dlsym(lib, "cuGetProcAddress")) {
      std::memcpy(&v1_, &v1, sizeof v1_);
    } else {
      return "the CUDA driver " + d_.path +
             " has no cuGetProcAddress (it is older than CUDA 11.3)";
    }
    get("cuInit", 2000, d_.init);
    get("cuDriverGetVersion", 2020, d_.driver_get_version);
    get("cuGetErrorName", 6000, d_.get_error_name);
    get("cuGetErrorString", 6000, d_.get_error_string);
    get("cuDeviceGetCount", 2000, d_.device_get_count);
    get("cuDeviceGet", 2000, d_.device_get);
    get("cuDeviceGetAttribute", 2000, d_.device_get_attribute);
    get("cuDeviceTotalMem", 3020, d_.device_total_mem);
    get("cuDeviceCanAccessPeer", 4000, d_.device_can_access_peer);
    get("cuDevicePrimaryCtxRetain", 7000, d_.primary_ctx_retain);
    get("cuCtxGetCurrent", 4000, d_.ctx_get_current);
    get("cuCtxSetCurrent", 4000, d_.ctx_set_current);
    get("cuCtxSynchronize", 2000, d_.ctx_synchronize);
    get("cuMemGetInfo", 3020, d_.mem_get_info);
    get("cuMemAlloc", 3020, d_.mem_alloc);
    get("cuMemFree", 3020, d_.mem_free);
    get("cuMemGetAllocationGranularity", 10020, d_.mem_get_allocation_granularity);
    get("cuMemAddressReserve", 10020, d_.mem_address_reserve);
    get("cuMemAddressFree", 10020, d_.mem_address_free);
    get("cuMemCreate", 10020, d_.mem_create);
    get("cuMemRelease", 10020, d_.mem_release);
    get("cuMemMap", 10020, d_.mem_map);
    get("cuMemUnmap", 10020, d_.mem_unmap);
    get("cuMemSetAccess", 10020, d_.mem_set_access);
    get("cuMemGetAddressRange", 3020, d_.mem_get_address_range);
    get("cuMemExportToShareableHandle", 10020, d_.mem_export_to_shareable_handle);
    get("cuMemImportFromShareableHandle", 10020, d_.mem_import_from_shareable_handle);
    get("cuIpcGetMemHandle", 4010, d_.ipc_get_mem_handle);
    get("cuIpcOpenMemHandle", 11000, d_.ipc_open_mem_handle);
    get("cuIpcCloseMemHandle", 4010, d_.ipc_close_mem_handle);
    get("cuMemcpyDtoDAsync", 3020, d_.memcpy_dtod_async);
    get("cuMemcpyDtoH", 3020, d_.memcpy_dtoh);
    get("cuMemcpyHtoD", 3020, d_.memcpy_htod);
    get("cuMemHostAlloc", 2020, d_.mem_host_alloc);
    get("cuMemFreeHost", 2000, d_.mem_free_host);
    get("cuMemcpyDtoHAsync", 3020, d_.memcpy_dtoh_async);
    get("cuMemcpyHtoDAsync", 3020, d_.memcpy_htod_async);
    get("cuEventCreate", 2000, d_.event_create);
    get("cuEventDestroy", 4000, d_.event_destroy);
    get("cuEventRecord", 2000, d_.event_record);
    get("cuEventQuery", 2000, d_.event_query);
    get("cuEventSynchronize", 2000, d_.event_synchronize);
    get("cuStreamSynchronize", 2000, d_.stream_synchronize);
    get("cuStreamIsCapturing", 10000, d_.stream_is_capturing);
    get("cuThreadExchangeStreamCaptureMode", 10010, d_.thread_exchange_stream_capture_mode);
    if (!missing_.empty()) {
      return "the CUDA driver " + d_.path + " lacks entry points the back end needs (" + missing_ +
             ")";
    }
    const CUresult init = d_.init(0);
    if (init != CUDA_SUCCESS) return "cuInit failed: " + describe_with(d_, init);
    if (d_.driver_get_version(&d_.version) != CUDA_SUCCESS) d_.version = 0;
    return {};
  }

  static std::string describe_with(const Driver& d, CUresult result) {
    const char* name = nullptr;
    const char* text = nullptr;
    if (d.get_error_name == nullptr || d.get_error_name(result, &name) != CUDA_SUCCESS) name = nullptr;
    if (d.get_error_string == nullptr || d.get_error_string(result, &text) != CUDA_SUCCESS) text = nullptr;
    const std::string code = std::to_string(static_cast<int>(result));
    std::string out = name != nullptr ? std::string(name) + " (" + code + ")" : "CUresult " + code;
    if (text != nullptr) out += std::string(": ") + text;
    return out;
  }

 private:
  template <class Fn>
  void get(const char* symbol, int version, Fn& out) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
    // Legacy default-stream semantics: the null stream is the legacy default stream, as the
    // callers' (PyTorch's) is.
    const CUresult result = v2_ != nullptr
                                ? v2_(symbol, &fn, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status)
                                : v1_(symbol, &fn, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM);
    if (result != CUDA_SUCCESS || fn == nullptr) {
      if (!missing_.empty()) missing_ += "; ";
      missing_ += symbol;
      missing_ += status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                      ? " at the CUDA " + version_text(version) + " ABI: the driver is older"
                      : ": not found";
      return;
    }
    static_assert(sizeof(Fn) == sizeof(void*));
    std::memcpy(&out, &fn, sizeof out);  // object pointer -> function pointer, without a cast
  }

  Driver& d_;
  GetProcAddressV2 v2_ = nullptr;
  GetProcAddressV1 v1_ = nullptr;
  std::string missing_;
};

struct Loaded {
  Driver driver;
  std::string error;  ///< empty when the driver is usable
};

}  // namespace

const Driver* driver(std::string* why) noexcept {
  static std::once_flag once;
  static Loaded* loaded = nullptr;  // never freed: used until the process ends
  try {
    std::call_once(once, [] {
      auto* l = new Loaded;
      l->error = Loader(l->driver).load();
      loaded = l;
    });
  } catch (...) {  // out of memory while loading: report it, try again next time
    if (why != nullptr) *why = "out of memory while loading the CUDA driver";
    return nullptr;
  }
  if (loaded == nullptr || !loaded->error.empty()) {
    if (why != nullptr) *why = loaded != nullptr ? loaded->error : "the CUDA driver is not loaded";
    return nullptr;
  }
  return &loaded->driver;
}

std::string describe(CUresult result) {
  const Driver* d = driver();
  if (d == nullptr) return "CUresult " + std::to_string(static_cast<int>(result));
  return Loader::describe_with(*d, result);
}

}  // namespace stitch::cuda_driver
