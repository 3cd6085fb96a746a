// backends/cuda/cuda_backend.cpp — CudaBackend: stitch::Backend over the CUDA runtime
// (cudaMalloc, events, streams) and the driver's virtual-memory API (cuMemAddressReserve,
// cuMemCreate, cuMemMap ...) reached through driver_api(). Owns the current-device guard, the
// per-device capability cache and the translation of CUDA errors into backend_error / nullptr.
#include "backends/cuda/cuda_backend.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

#include "backends/cuda/driver_api.hpp"
#include "stitch/errors.hpp"

namespace stitch {
namespace {

using cuda_driver::describe;
using cuda_driver::driver_api;
using cuda_driver::DriverApi;
using cuda_driver::device_memory_prop;

/// Used when the device has no virtual-memory support (the real value comes from the driver).
constexpr std::size_t kDefaultGranularity = std::size_t{2} << 20;
/// Backend::allocate promises at least this alignment.
constexpr std::uintptr_t kAllocateAlignment = 512;

// ---- message helpers --------------------------------------------------------------------------

/// "cudaErrorInvalidValue (1): invalid argument"
std::string describe(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + " (" + std::to_string(static_cast<int>(err)) +
         "): " + cudaGetErrorString(err);
}

std::string hex(const void* p) {
  char buf[2 + 2 * sizeof(void*) + 1];
  std::snprintf(buf, sizeof buf, "0x%llx",
                static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(p)));
  return buf;
}

std::string bytes_text(std::size_t bytes) { return std::to_string(bytes) + " bytes"; }

std::string on_device(int device) { return " on device " + std::to_string(device); }

/// Throws for a failed runtime call `call` (e.g. "cudaMalloc(2097152 bytes)"), first clearing the
/// thread's last runtime error so our failure does not leak into the caller's error checks.
[[noreturn]] void throw_runtime(const std::string& call, int device, cudaError_t err) {
  (void)cudaGetLastError();
  throw backend_error(call + on_device(device) + " failed: " + describe(err));
}

[[noreturn]] void throw_driver(const std::string& call, int device, CUresult result) {
  throw backend_error(call + on_device(device) + " failed: " + describe(result));
}

// ---- current device ---------------------------------------------------------------------------

/// Makes `device` current for the guard's lifetime and restores the previous device afterwards;
/// does nothing when `device` already is current. With `bind_context`, also makes sure a CUDA
/// context is current on this thread (driver calls do not create one the way runtime calls do).
/// Throws backend_error, having changed nothing, when the device cannot be made current.
class DeviceGuard {
 public:
  DeviceGuard(int device, const std::string& call, bool bind_context = false) {
    cudaError_t err = cudaGetDevice(&previous_);
    if (err != cudaSuccess) throw_runtime("cudaGetDevice (before " + call + ")", device, err);
    bool set = previous_ != device;
    if (!set && bind_context) {
      const DriverApi& api = driver_api();
      CUcontext ctx = nullptr;
      // The runtime's current device can be known while no context is bound to this thread
      // yet; cudaSetDevice binds the device's primary context (CUDA 12+).
      set = api.ctx_get_current != nullptr && api.ctx_get_current(&ctx) == CUDA_SUCCESS &&
            ctx == nullptr;
    }
    if (set) {
      err = cudaSetDevice(device);
      if (err != cudaSuccess) throw_runtime("cudaSetDevice (before " + call + ")", device, err);
      restore_ = previous_ != device;
    }
  }
  ~DeviceGuard() {
    if (restore_ && cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool restore_ = false;
};

// ---- the back end -----------------------------------------------------------------------------

/// What the driver says about one device; filled once, on first use.
struct DeviceCaps {
  std::once_flag once;
  bool vmm = false;
  std::size_t granularity = kDefaultGranularity;
  CUdevice cu_device = 0;
  std::string no_vmm_reason;  ///< why vmm is false
};


CUdeviceptr to_cu(const void* va) {
  return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(va));
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device_count)
      : device_count_(device_count), caps_(std::make_unique<DeviceCaps[]>(device_count)) {}

  [[nodiscard]] const char* name() const noexcept override { return "cuda"; }

  [[nodiscard]] int device_count() override { return device_count_; }

  [[nodiscard]] MemoryInfo memory_info(int device) override {
    check_device(device, "cudaMemGetInfo");
    DeviceGuard guard(device, "cudaMemGetInfo");
    MemoryInfo info;
    const cudaError_t err = cudaMemGetInfo(&info.free, &info.total);
    if (err != cudaSuccess) throw_runtime("cudaMemGetInfo", device, err);
    return info;
  }

  [[nodiscard]] std::size_t granularity(int device) override {
    return caps(device, "cuMemGetAllocationGranularity").granularity;
  }

  [[nodiscard]] bool supports_virtual_memory(int device) override {
    return caps(device, "supports_virtual_memory").vmm;
  }

  // ---- plain device memory ----

  [[nodiscard]] void* allocate(int device, std::size_t bytes) override {
    const std::string call = "cudaMalloc(" + bytes_text(bytes) + ")";
    check_device(device, call);
    if (bytes == 0) throw backend_error(call + on_device(device) + ": zero-byte request");
    DeviceGuard guard(device, call);
    void* ptr = nullptr;
    const cudaError_t err = cudaMalloc(&ptr, bytes);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    if (err != cudaSuccess) throw_runtime(call, device, err);
    if (reinterpret_cast<std::uintptr_t>(ptr) % kAllocateAlignment != 0) {
      if (cudaFree(ptr) != cudaSuccess) (void)cudaGetLastError();
      throw backend_error(call + on_device(device) + " returned " + hex(ptr) +
                          ", which is not 512-byte aligned");
    }
    return ptr;
  }

  void deallocate(int device, void* ptr, std::size_t bytes) override {
    const std::string call = "cudaFree(" + hex(ptr) + ", " + bytes_text(bytes) + ")";
    check_device(device, call);
    if (ptr == nullptr) return;
    DeviceGuard guard(device, call);
    const cudaError_t err = cudaFree(ptr);
    if (err != cudaSuccess) throw_runtime(call, device, err);
  }

  // ---- virtual memory ----

  [[nodiscard]] void* reserve(int device, std::size_t bytes, std::size_t alignment) override {
    const std::string call =
        "cuMemAddressReserve(" + bytes_text(bytes) + ", alignment " + std::to_string(alignment) + ")";
    const DriverApi& api = require_vmm(device, call);
    DeviceGuard guard(device, call, /*bind_context=*/true);
    CUdeviceptr va = 0;
    const CUresult result = api.mem_address_reserve(&va, bytes, alignment, 0, 0);
    if (result == CUDA_ERROR_OUT_OF_MEMORY) return nullptr;
    if (result != CUDA_SUCCESS) throw_driver(call, device, result);
    return reinterpret_cast<void*>(static_cast<std::uintptr_t>(va));
  }

  void release_reservation(int device, void* va, std::size_t bytes) override {
    const std::string call = "cuMemAddressFree(" + hex(va) + ", " + bytes_text(bytes) + ")";
    const DriverApi& api = require_vmm(device, call);
    DeviceGuard guard(device, call, /*bind_context=*/true);
    const CUresult result = api.mem_address_free(to_cu(va), bytes);
    if (result != CUDA_SUCCESS) throw_driver(call, device, result);
  }

  [[nodiscard]] phys_handle_t create_physical(int device, std::size_t bytes) override {
    const std::string call = "cuMemCreate(" + bytes_text(bytes) + ")";
    const DriverApi& api = require_vmm(device, call);
    const CUmemAllocationProp prop = device_memory_prop(caps_[device].cu_device);
    DeviceGuard guard(device, call, /*bind_context=*/true);
    CUmemGenericAllocationHandle handle = 0;
    const CUresult result = api.mem_create(&handle, bytes, &prop, 0);
    if (result == CUDA_ERROR_OUT_OF_MEMORY) return 0;
    if (result != CUDA_SUCCESS) throw_driver(call, device, result);
    if (handle == 0) {  // 0 means "out of memory" to the core; never hand it out as a handle
      throw backend_error(call + on_device(device) + " returned the null handle");
    }
    return static_cast<phys_handle_t>(handle);
  }

  void release_physical(int device, phys_handle_t handle) override {
    const std::string call = "cuMemRelease(handle " + std::to_string(handle) + ")";
    const DriverApi& api = require_vmm(device, call);
    DeviceGuard guard(device, call, /*bind_context=*/true);
    const CUresult result = api.mem_release(static_cast<CUmemGenericAllocationHandle>(handle));
    if (result != CUDA_SUCCESS) throw_driver(call, device, result);
  }

  void map(int device, void* va, std::size_t bytes, phys_handle_t handle) override {
    const std::string where = hex(va) + ", " + bytes_text(bytes);
    const std::string call = "cuMemMap(" + where + ", handle " + std::to_string(handle) + ")";
    const DriverApi& api = require_vmm(device, call);
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = static_cast<int>(caps_[device].cu_device);
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    DeviceGuard guard(device, call, /*bind_context=*/true);
    CUresult result = api.mem_map(to_cu(va), bytes, 0,
                                  static_cast<CUmemGenericAllocationHandle>(handle), 0);
    if (result != CUDA_SUCCESS) throw_driver(call, device, result);
    result = api.mem_set_access(to_cu(va), bytes, &access, 1);
    if (result != CUDA_SUCCESS) {
      const CUresult undo = api.mem_unmap(to_cu(va), bytes);  // a throwing map changes nothing
      std::string message = "cuMemSetAccess(" + where + ", read-write)" + on_device(device) +
                            " failed: " + describe(result);
      if (undo != CUDA_SUCCESS) {
        message += "; undoing the mapping with cuMemUnmap failed too: " + describe(undo);
      }
      throw backend_error(message);
    }
  }

  void unmap(int device, void* va, std::size_t bytes) override {
    const std::string call = "cuMemUnmap(" + hex(va) + ", " + bytes_text(bytes) + ")";
    const DriverApi& api = require_vmm(device, call);
    DeviceGuard guard(device, call, /*bind_context=*/true);
    const CUresult result = api.mem_unmap(to_cu(va), bytes);
    if (result != CUDA_SUCCESS) throw_driver(call, device, result);
  }

  // ---- events and streams ----

  [[nodiscard]] event_t create_event(int device) override {
    const std::string call = "cudaEventCreateWithFlags(cudaEventDisableTiming)";
    check_device(device, call);
    DeviceGuard guard(device, call);
    cudaEvent_t event = nullptr;
    const cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (err != cudaSuccess) throw_runtime(call, device, err);
    return static_cast<event_t>(event);
  }

  void destroy_event(int device, event_t event) override {
    const std::string call = "cudaEventDestroy(" + hex(event) + ")";
    check_device(device, call);
    DeviceGuard guard(device, call);
    const cudaError_t err = cudaEventDestroy(static_cast<cudaEvent_t>(event));
    if (err != cudaSuccess) throw_runtime(call, device, err);
  }

  void record_event(int device, event_t event, stream_t stream) override {
    const std::string call = "cudaEventRecord(" + hex(event) + ", stream " + hex(stream) + ")";
    check_device(device, call);
    DeviceGuard guard(device, call);  // the null stream is the current device's default stream
    const cudaError_t err =
        cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream));
    if (err != cudaSuccess) throw_runtime(call, device, err);
  }

  [[nodiscard]] bool query_event(int device, event_t event) override {
    const std::string call = "cudaEventQuery(" + hex(event) + ")";
    check_device(device, call);
    DeviceGuard guard(device, call);
    const cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (err == cudaSuccess) return true;
    if (err == cudaErrorNotReady) {
      (void)cudaGetLastError();  // "not ready" is an answer, not an error
      return false;
    }
    throw_runtime(call, device, err);
  }

  void synchronize_event(int device, event_t event) override {
    const std::string call = "cudaEventSynchronize(" + hex(event) + ")";
    check_device(device, call);
    DeviceGuard guard(device, call);
    const cudaError_t err = cudaEventSynchronize(static_cast<cudaEvent_t>(event));
    if (err != cudaSuccess) throw_runtime(call, device, err);
  }

  void synchronize_stream(int device, stream_t stream) override {
    const std::string call = "cudaStreamSynchronize(stream " + hex(stream) + ")";
    check_device(device, call);
    DeviceGuard guard(device, call);  // the null stream is the current device's default stream
    const cudaError_t err = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
    if (err != cudaSuccess) throw_runtime(call, device, err);
  }

 private:
  void check_device(int device, const std::string& call) const {
    if (device < 0 || device >= device_count_) {
      throw backend_error(call + on_device(device) + ": no such device (this process sees " +
                          std::to_string(device_count_) + " CUDA device" +
                          (device_count_ == 1 ? "" : "s") + ")");
    }
  }

  /// The device's capabilities, queried from the driver on first use. If the query throws,
  /// nothing is cached and the next call asks again.
  DeviceCaps& caps(int device, const std::string& call) {
    check_device(device, call);
    DeviceCaps& entry = caps_[device];
    std::call_once(entry.once, [&] { query_caps(device, entry); });
    return entry;
  }

  static void query_caps(int device, DeviceCaps& out) {
    const DriverApi& api = driver_api();
    if (!api.vmm_entry_points) {
      out.no_vmm_reason = api.unavailable_reason;
      return;
    }
    CUdevice cu_device = 0;
    CUresult result = api.device_get(&cu_device, device);
    if (result != CUDA_SUCCESS) throw_driver("cuDeviceGet", device, result);
    int supported = 0;
    result = api.device_get_attribute(
        &supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, cu_device);
    if (result != CUDA_SUCCESS) {
      throw_driver("cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)",
                   device, result);
    }
    out.cu_device = cu_device;
    if (supported == 0) {
      out.no_vmm_reason =
          "the device does not support virtual memory management "
          "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0)";
      return;
    }
    const CUmemAllocationProp prop = device_memory_prop(cu_device);
    std::size_t granularity = 0;
    result = api.mem_get_allocation_granularity(&granularity, &prop,
                                                CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (result != CUDA_SUCCESS) {
      throw_driver("cuMemGetAllocationGranularity(CU_MEM_ALLOC_GRANULARITY_MINIMUM)", device,
                   result);
    }
    if (granularity == 0 || (granularity & (granularity - 1)) != 0) {
      throw backend_error("cuMemGetAllocationGranularity" + on_device(device) + " returned " +
                          std::to_string(granularity) + ", which is not a power of two");
    }
    out.granularity = granularity;
    out.vmm = true;
  }

  /// The driver table, after checking that `device` supports the virtual-memory calls.
  const DriverApi& require_vmm(int device, const std::string& call) {
    const DeviceCaps& c = caps(device, call);
    if (!c.vmm) {
      throw backend_error(call + on_device(device) +
                          ": virtual memory management is unavailable: " + c.no_vmm_reason);
    }
    return driver_api();
  }

  const int device_count_;
  const std::unique_ptr<DeviceCaps[]> caps_;
};

}  // namespace

std::shared_ptr<Backend> make_cuda_backend() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    std::string message =
        "backend:cuda: no CUDA device (cudaGetDeviceCount failed: " + describe(err) + ")";
    if (err == cudaErrorInsufficientDriver) {
      message += "; no CUDA driver is loaded, or it is older than the CUDA runtime";
    }
    throw backend_error(message + "; use backend:sim for the simulated device");
  }
  if (count <= 0) {
    throw backend_error(
        "backend:cuda: no CUDA device (cudaGetDeviceCount reported 0 devices); use backend:sim "
        "for the simulated device");
  }
  return std::make_shared<CudaBackend>(count);
}

}  // namespace stitch
