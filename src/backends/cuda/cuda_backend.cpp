// backends/cuda/cuda_backend.cpp — CudaBackend: stitch::Backend on the CUDA driver API alone
// (cuMemAlloc, events, streams, the virtual-memory calls cuMemAddressReserve, cuMemCreate,
// cuMemMap ..., the copies, and pinned host memory: cuMemHostAlloc and the asynchronous copies
// through it), reached through the Driver table (driver.hpp). Owns the per-device state (the
// primary context, retained once on first use; the capabilities; who may access mapped memory;
// what was mapped where and exported, for IPC), the context scope every call runs in, and the
// translation of driver results into backend_error / nullptr. Messages are formatted only when a
// call fails. IPC: physical memory is created exportable as POSIX file descriptors (and fabric
// handles where the driver allows), cuMemAlloc'd memory shares through the legacy
// cuIpcGetMemHandle; the text of a share is stitch/ipc_handle.hpp's.
#include "backends/cuda/cuda_backend.hpp"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backends/cuda/driver.hpp"
#include "stitch/config.hpp"
#include "stitch/errors.hpp"
#include "stitch/ipc_handle.hpp"

// Older C libraries lack the names (Linux 5.6 added the calls; one number on every architecture).
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

namespace stitch {
namespace {

using cuda_driver::describe;
using cuda_driver::device_memory_prop;
using cuda_driver::Driver;

/// Used when the device has no virtual-memory support (the real value comes from the driver).
constexpr std::size_t kDefaultGranularity = std::size_t{2} << 20;
/// Backend::allocate promises at least this alignment.
constexpr std::uintptr_t kAllocateAlignment = 512;
/// cuMemHostAlloc's flags for Backend::allocate_host: none. Not CU_MEMHOSTALLOC_PORTABLE
/// ("considered as pinned memory by all CUDA contexts, not just the one that performed the
/// allocation"): a block of allocate_host(device) is copied and freed only by calls for that
/// device, in the one context that allocated it. (DEVICEMAP and WRITECOMBINED serve other uses,
/// kernels reading it in place and CPU-side write combining; the copies need neither.)
constexpr unsigned int kHostAllocFlags = 0;

// ---- message helpers (failure paths only) -----------------------------------------------------

std::string hex(const void* p) {
  char buf[2 + 2 * sizeof(void*) + 1];
  std::snprintf(buf, sizeof buf, "0x%llx",
                static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(p)));
  return buf;
}

std::string bytes_text(std::size_t bytes) { return std::to_string(bytes) + " bytes"; }

std::string on_device(int device) { return " on device " + std::to_string(device); }

/// A call's description: `call` is the text, or a function that builds it (only when needed).
template <class Call>
std::string call_text(const Call& call) {
  if constexpr (std::is_invocable_v<const Call&>) {
    return std::string(call());
  } else {
    return std::string(call);
  }
}

/// Throws for a failed driver call; `call` builds its description (e.g. "cuMemAlloc(2097152
/// bytes)") only now.
template <class Call>
[[noreturn]] void fail(const Call& call, int device, CUresult result) {
  throw backend_error(call_text(call) + on_device(device) + " failed: " + describe(result));
}

CUdeviceptr to_cu(const void* va) {
  return static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(va));
}

void* from_cu(CUdeviceptr p) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)); }

// ---- per-device state ---------------------------------------------------------------------------

/// What the back end knows of one device. Capabilities are queried once, without a context;
/// the primary context is retained once, when a call first needs it.
struct DeviceState {
  std::once_flag caps_once;
  CUdevice cu_device = 0;
  bool vmm = false;
  std::size_t granularity = kDefaultGranularity;
  std::string no_vmm_reason;           ///< why vmm is false
  std::vector<CUmemAccessDesc> access;  ///< who may read and write mapped memory
  /// CUmemAllocationHandleType mask cuMemCreate requests (0 with ipc:False or no support); the
  /// fabric bit is dropped for good when the driver refuses it.
  std::atomic<unsigned> handle_types{0};
  bool rdma = false;  ///< gpuDirectRDMACapable is requested

  /// Host pages (spill): found once, on first use: the host NUMA node closest to the device and
  /// the granularity of its memory, 0 when the device cannot map host memory.
  std::once_flag host_once;
  int host_numa = 0;
  std::size_t host_granularity = 0;
  std::string no_host_reason;  ///< why host_granularity is 0

  /// IPC bookkeeping, kept only when handle_types != 0: each mapping map_run made (its handle
  /// and mapped bytes, by address), the descriptors exported (closed when the handle is
  /// released), and the ranges import_memory mapped.
  struct Imported {
    std::size_t bytes = 0;
    bool legacy = false;  ///< cuIpcOpenMemHandle (else reserved, imported and mapped)
    /// Legacy: the opens of the same handle, which the driver counts and maps at one address
    /// (each needs its own cuIpcCloseMemHandle; the last unmaps).
    std::size_t opens = 0;
  };
  std::mutex ipc_mutex;
  std::map<CUdeviceptr, std::pair<CUmemGenericAllocationHandle, std::size_t>> mapped;
  std::unordered_map<CUmemGenericAllocationHandle, int> exported_fds;
  std::map<CUdeviceptr, Imported> imported;

  std::mutex context_mutex;
  CUcontext context = nullptr;  ///< the primary context, once retained

  /// Runs a map_run could not take back (its undo's cuMemUnmap failed): retried before every
  /// map_run and release_reservation; a stray blocks only the addresses it covers.
  std::mutex strays_mutex;
  std::vector<std::pair<CUdeviceptr, std::size_t>> strays;
};

/// Makes `context` current on this thread for the scope's lifetime and then restores the
/// caller's (possibly none: restoring "no context" creates nothing). Does nothing when it is
/// current already.
class ContextScope {
 public:
  ContextScope(const Driver& d, CUcontext context, int device) : d_(d) {
    CUresult r = d_.ctx_get_current(&previous_);
    if (r != CUDA_SUCCESS) fail([] { return std::string("cuCtxGetCurrent"); }, device, r);
    if (previous_ == context) return;
    r = d_.ctx_set_current(context);
    if (r != CUDA_SUCCESS) fail([] { return std::string("cuCtxSetCurrent"); }, device, r);
    restore_ = true;
  }
  ~ContextScope() {
    if (restore_) (void)d_.ctx_set_current(previous_);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  const Driver& d_;
  CUcontext previous_ = nullptr;
  bool restore_ = false;
};

// cuMemAlloc is a "potentially unsafe API call" (cuThreadExchangeStreamCaptureMode): while a stream
// captures a graph in global mode, it fails and invalidates the capture unless the calling thread
// is in relaxed mode. PyTorch allocates graph memory during capture this way; so does stitch,
// for its private pools (core/private_pool.hpp). The thread's mode is restored afterwards.
class RelaxedCapture {
 public:
  explicit RelaxedCapture(const Driver& d) : d_(d) {
    mode_ = CU_STREAM_CAPTURE_MODE_RELAXED;
    swapped_ = d_.thread_exchange_stream_capture_mode(&mode_) == CUDA_SUCCESS;
  }
  ~RelaxedCapture() {
    if (swapped_) (void)d_.thread_exchange_stream_capture_mode(&mode_);
  }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  const Driver& d_;
  CUstreamCaptureMode mode_;
  bool swapped_ = false;
};

// ---- the back end -------------------------------------------------------------------------------

class CudaBackend final : public Backend {
 public:
  CudaBackend(const Driver& d, int device_count, bool peer_access, bool ipc)
      : d_(d),
        device_count_(device_count),
        peer_access_(peer_access),
        ipc_(ipc),
        devices_(std::make_unique<DeviceState[]>(static_cast<std::size_t>(device_count))) {}

  [[nodiscard]] const char* name() const noexcept override { return "cuda"; }

  [[nodiscard]] int device_count() override { return device_count_; }

  [[nodiscard]] MemoryInfo memory_info(int device) override {
    ContextScope scope = enter(device, "cuMemGetInfo");
    MemoryInfo info;
    const CUresult r = d_.mem_get_info(&info.free, &info.total);
    if (r != CUDA_SUCCESS) fail([] { return std::string("cuMemGetInfo"); }, device, r);
    return info;
  }

  [[nodiscard]] std::size_t total_memory(int device) override {
    DeviceState& s = caps(device, "cuDeviceTotalMem");
    std::size_t bytes = 0;
    const CUresult r = d_.device_total_mem(&bytes, s.cu_device);  // needs no context
    if (r != CUDA_SUCCESS) fail([] { return std::string("cuDeviceTotalMem"); }, device, r);
    return bytes;
  }

  [[nodiscard]] std::size_t granularity(int device) override {
    return caps(device, "cuMemGetAllocationGranularity").granularity;
  }

  [[nodiscard]] bool supports_virtual_memory(int device) override {
    return caps(device, "supports_virtual_memory").vmm;
  }

  // ---- plain device memory ----

  [[nodiscard]] void* allocate(int device, std::size_t bytes) override {
    auto call = [&] { return "cuMemAlloc(" + bytes_text(bytes) + ")"; };
    check_device(device, call);
    if (bytes == 0) throw backend_error(call_text(call) + on_device(device) + ": zero-byte request");
    ContextScope scope = enter(device, call);
    CUdeviceptr p = 0;
    CUresult r;
    {
      const RelaxedCapture relaxed(d_);
      r = d_.mem_alloc(&p, bytes);
    }
    if (r == CUDA_ERROR_OUT_OF_MEMORY) return nullptr;
    if (r != CUDA_SUCCESS) fail(call, device, r);
    if (p % kAllocateAlignment != 0) {
      (void)d_.mem_free(p);
      throw backend_error(call_text(call) + on_device(device) + " returned " + hex(from_cu(p)) +
                          ", which is not 512-byte aligned");
    }
    return from_cu(p);
  }

  void deallocate(int device, void* ptr, std::size_t bytes) override {
    auto call = [&] { return "cuMemFree(" + hex(ptr) + ", " + bytes_text(bytes) + ")"; };
    check_device(device, call);
    if (ptr == nullptr) return;
    ContextScope scope = enter(device, call);
    const CUresult r = d_.mem_free(to_cu(ptr));
    if (r != CUDA_SUCCESS) fail(call, device, r);
  }

  // ---- virtual memory ----

  [[nodiscard]] void* reserve(int device, std::size_t bytes, std::size_t alignment) override {
    auto call = [&] {
      return "cuMemAddressReserve(" + bytes_text(bytes) + ", alignment " +
             std::to_string(alignment) + ")";
    };
    require_vmm(device, call);
    ContextScope scope = enter(device, call);
    CUdeviceptr va = 0;
    const CUresult r = d_.mem_address_reserve(&va, bytes, alignment, 0, 0);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) return nullptr;
    if (r != CUDA_SUCCESS) fail(call, device, r);
    return from_cu(va);
  }

  void release_reservation(int device, void* va, std::size_t bytes) override {
    auto call = [&] { return "cuMemAddressFree(" + hex(va) + ", " + bytes_text(bytes) + ")"; };
    require_vmm(device, call);
    ContextScope scope = enter(device, call);
    retry_strays(devices_[static_cast<std::size_t>(device)], device, to_cu(va), bytes);
    const CUresult r = d_.mem_address_free(to_cu(va), bytes);
    if (r != CUDA_SUCCESS) fail(call, device, r);
  }

  [[nodiscard]] phys_handle_t create_physical(int device, std::size_t bytes) override {
    auto call = [&] { return "cuMemCreate(" + bytes_text(bytes) + ")"; };
    DeviceState& s = devices_[static_cast<std::size_t>(device)];
    require_vmm(device, call);
    const unsigned types = s.handle_types.load(std::memory_order_relaxed);
    CUmemAllocationProp prop = device_memory_prop(s.cu_device, types, s.rdma);
    ContextScope scope = enter(device, call);
    CUmemGenericAllocationHandle handle = 0;
    CUresult r = d_.mem_create(&handle, bytes, &prop, 0);
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_OUT_OF_MEMORY && (types & CU_MEM_HANDLE_TYPE_FABRIC) != 0) {
      // As ncclMemAlloc and PyTorch do: a fabric handle needs an IMEX channel this process may
      // lack (CUDA_ERROR_NOT_PERMITTED / NOT_SUPPORTED). Retry without it, and stop asking.
      s.handle_types.fetch_and(~unsigned{CU_MEM_HANDLE_TYPE_FABRIC}, std::memory_order_relaxed);
      prop.requestedHandleTypes = static_cast<CUmemAllocationHandleType>(types & ~unsigned{CU_MEM_HANDLE_TYPE_FABRIC});
      r = d_.mem_create(&handle, bytes, &prop, 0);
    }
    if (r == CUDA_ERROR_OUT_OF_MEMORY) return 0;
    if (r != CUDA_SUCCESS) fail(call, device, r);
    if (handle == 0) {  // 0 means "out of memory" to the core; never hand it out as a handle
      throw backend_error(call_text(call) + on_device(device) + " returned the null handle");
    }
    return static_cast<phys_handle_t>(handle);
  }

  void release_physical(int device, phys_handle_t handle) override {
    auto call = [&] { return "cuMemRelease(handle " + std::to_string(handle) + ")"; };
    require_vmm(device, call);
    ContextScope scope = enter(device, call);
    const CUresult r = d_.mem_release(static_cast<CUmemGenericAllocationHandle>(handle));
    if (r != CUDA_SUCCESS) fail(call, device, r);
    DeviceState& s = devices_[static_cast<std::size_t>(device)];
    if (s.handle_types.load(std::memory_order_relaxed) == 0) return;
    // The exported descriptor holds the memory too ("Once all shareable handles are closed and
    // the allocation is released, the allocated memory ... will be released back to the OS").
    std::lock_guard lock(s.ipc_mutex);
    auto it = s.exported_fds.find(static_cast<CUmemGenericAllocationHandle>(handle));
    if (it != s.exported_fds.end()) {
      (void)::close(it->second);
      s.exported_fds.erase(it);
    }
  }

  [[nodiscard]] bool map_run(int device, void* va, const MapPiece* pieces,
                             std::size_t count) override {
    auto call = [&] { return "cuMemMap(" + hex(va) + ", " + std::to_string(count) + " pieces)"; };
    const DeviceState& s = require_vmm(device, call);
    if (count == 0) throw backend_error(call_text(call) + on_device(device) + ": no pieces");
    ContextScope scope = enter(device, call);
    DeviceState& state = devices_[static_cast<std::size_t>(device)];
    std::size_t total = 0;
    for (std::size_t k = 0; k < count; ++k) total += pieces[k].bytes;
    retry_strays(state, device, to_cu(va), total);  // one in the way throws: nothing changed
    char* const base = static_cast<char*>(va);
    std::size_t mapped = 0;  // bytes mapped so far, from `va`
    // All or nothing: one cuMemUnmap takes back what this call mapped (whole mappings only). If
    // that fails too, the run is kept as a stray and unmapped before its addresses are used.
    auto undo = [&](std::string message) -> std::string {
      if (mapped == 0) return message;
      const CUresult u = d_.mem_unmap(to_cu(va), mapped);
      if (u != CUDA_SUCCESS) {
        message += "; undoing the mappings with cuMemUnmap failed too (" + describe(u) +
                   "): retried before the range is used again";
        try {
          std::lock_guard lock(state.strays_mutex);
          state.strays.emplace_back(to_cu(va), mapped);
        } catch (...) {  // no memory to remember it: the range stays mapped
        }
      }
      return message;
    };
    // Out of memory (cuMemMap and cuMemSetAccess may report it): the run is taken back and the
    // caller's OOM path runs; if taking it back failed, that is the error.
    auto out_of_memory = [&](const char* call_name) {
      const std::string left = undo({});
      if (!left.empty()) throw backend_error(std::string(call_name) + " ran out of memory" + left);
      return false;
    };
    for (std::size_t k = 0; k < count; ++k) {
      const MapPiece& p = pieces[k];
      const CUresult r = d_.mem_map(to_cu(base + mapped), p.bytes, 0,
                                    static_cast<CUmemGenericAllocationHandle>(p.handle), 0);
      if (r == CUDA_ERROR_OUT_OF_MEMORY) return out_of_memory("cuMemMap");
      if (r != CUDA_SUCCESS) {
        throw backend_error(undo("cuMemMap(" + hex(base + mapped) + ", " + bytes_text(p.bytes) +
                                 ", handle " + std::to_string(p.handle) + ")" +
                                 on_device(device) + " failed: " + describe(r)));
      }
      mapped += p.bytes;
    }
    // One access grant over the run ("all mappings start with no accessibility setup").
    const CUresult r = d_.mem_set_access(to_cu(va), mapped, s.access.data(), s.access.size());
    if (r == CUDA_ERROR_OUT_OF_MEMORY) return out_of_memory("cuMemSetAccess");
    if (r != CUDA_SUCCESS) {
      throw backend_error(undo("cuMemSetAccess(" + hex(va) + ", " + bytes_text(mapped) +
                               ", read-write)" + on_device(device) + " failed: " + describe(r)));
    }
    if (state.handle_types.load(std::memory_order_relaxed) != 0) {
      try {  // what export_memory reads: which handle lies where
        std::lock_guard lock(state.ipc_mutex);
        std::size_t at = 0;
        for (std::size_t k = 0; k < count; ++k) {
          state.mapped[to_cu(base + at)] = {static_cast<CUmemGenericAllocationHandle>(pieces[k].handle), pieces[k].bytes};
          at += pieces[k].bytes;
        }
      } catch (const std::bad_alloc&) {
        forget_mappings(state, to_cu(va), mapped);
        throw backend_error(undo("cuMemMap(" + hex(va) + ", " + bytes_text(mapped) + ")" + on_device(device) +
                                 ": out of host memory to record the mappings"));
      }
    }
    return true;
  }

  [[nodiscard]] bool protect_read_only(int device, void* va, std::size_t bytes) override {
    auto call = [&] { return "cuMemSetAccess(" + hex(va) + ", " + bytes_text(bytes) + ", PROT_READ)"; };
    const DeviceState& s = require_vmm(device, call);
    ContextScope scope = enter(device, call);
    std::vector<CUmemAccessDesc> read = s.access;
    for (CUmemAccessDesc& a : read) a.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
    const CUresult r = d_.mem_set_access(to_cu(va), bytes, read.data(), read.size());
    if (r != CUDA_SUCCESS) fail(call, device, r);
    return true;
  }

  void unmap(int device, void* va, std::size_t bytes) override {
    auto call = [&] { return "cuMemUnmap(" + hex(va) + ", " + bytes_text(bytes) + ")"; };
    require_vmm(device, call);
    ContextScope scope = enter(device, call);
    const CUresult r = d_.mem_unmap(to_cu(va), bytes);
    if (r != CUDA_SUCCESS) fail(call, device, r);
    forget_mappings(devices_[static_cast<std::size_t>(device)], to_cu(va), bytes);
  }

  // ---- events and streams ----

  [[nodiscard]] event_t create_event(int device) override {
    auto call = [] { return std::string("cuEventCreate(CU_EVENT_DISABLE_TIMING)"); };
    ContextScope scope = enter(device, call);
    CUevent event = nullptr;
    const CUresult r = d_.event_create(&event, CU_EVENT_DISABLE_TIMING);
    if (r != CUDA_SUCCESS) fail(call, device, r);
    return static_cast<event_t>(event);
  }

  void destroy_event(int device, event_t event) override {
    auto call = [&] { return "cuEventDestroy(" + hex(event) + ")"; };
    ContextScope scope = enter(device, call);
    const CUresult r = d_.event_destroy(static_cast<CUevent>(event));
    if (r != CUDA_SUCCESS) fail(call, device, r);
  }

  void record_event(int device, event_t event, stream_t stream) override {
    auto call = [&] { return "cuEventRecord(" + hex(event) + ", stream " + hex(stream) + ")"; };
    ContextScope scope = enter(device, call);  // the null stream: this device's default stream
    const CUresult r = d_.event_record(static_cast<CUevent>(event), static_cast<CUstream>(stream));
    if (r != CUDA_SUCCESS) fail(call, device, r);
  }

  [[nodiscard]] bool query_event(int device, event_t event) override {
    auto call = [&] { return "cuEventQuery(" + hex(event) + ")"; };
    ContextScope scope = enter(device, call);
    const CUresult r = d_.event_query(static_cast<CUevent>(event));
    if (r == CUDA_SUCCESS) return true;
    if (r == CUDA_ERROR_NOT_READY) return false;  // an answer, not an error
    fail(call, device, r);
  }

  void synchronize_event(int device, event_t event) override {
    auto call = [&] { return "cuEventSynchronize(" + hex(event) + ")"; };
    ContextScope scope = enter(device, call);
    const CUresult r = d_.event_synchronize(static_cast<CUevent>(event));
    if (r != CUDA_SUCCESS) fail(call, device, r);
  }

  void synchronize_stream(int device, stream_t stream) override {
    auto call = [&] { return "cuStreamSynchronize(stream " + hex(stream) + ")"; };
    ContextScope scope = enter(device, call);  // the null stream: this device's default stream
    const CUresult r = d_.stream_synchronize(static_cast<CUstream>(stream));
    if (r != CUDA_SUCCESS) fail(call, device, r);
  }

  void copy(int device, void* dst, const void* src, std::size_t bytes, stream_t stream) override {
    auto call = [&] {
      return "cuMemcpyDtoDAsync(" + hex(dst) + ", " + hex(src) + ", " + std::to_string(bytes) +
             ", stream " + hex(stream) + ")";
    };
    ContextScope scope = enter(device, call);  // the null stream: this device's default stream
    const CUresult r = d_.memcpy_dtod_async(reinterpret_cast<CUdeviceptr>(dst),
                                            reinterpret_cast<CUdeviceptr>(src), bytes,
                                            static_cast<CUstream>(stream));
    if (r != CUDA_SUCCESS) fail(call, device, r);
  }

  void copy_to_host(int device, void* dst, const void* src, std::size_t bytes) override {
    auto call = [&] {
      return "cuMemcpyDtoH(" + hex(dst) + ", " + hex(src) + ", " + std::to_string(bytes) + ")";
    };
    ContextScope scope = enter(device, call);
    const CUresult r = d_.memcpy_dtoh(dst, reinterpret_cast<CUdeviceptr>(src), bytes);
    if (r != CUDA_SUCCESS) fail(call, device, r);
  }

  void copy_from_host(int device, void* dst, const void* src, std::size_t bytes) override {
    auto call = [&] {
      return "cuMemcpyHtoD(" + hex(dst) + ", " + hex(src) + ", " + std::to_string(bytes) + ")";
    };
    ContextScope scope = enter(device, call);
    const CUresult r = d_.memcpy_htod(reinterpret_cast<CUdeviceptr>(dst), src, bytes);
    if (r != CUDA_SUCCESS) fail(call, device, r);
  }

  // ---- pinned host memory and the asynchronous copies through it ----

  [[nodiscard]] void* allocate_host(int device, std::size_t bytes) override {
    auto call = [&] { return "cuMemHostAlloc(" + bytes_text(bytes) + ")"; };
    check_device(device, call);
    if (bytes == 0) throw backend_error(call_text(call) + on_device(device) + ": zero-byte request");
    ContextScope scope = enter(device, call);  // the memory belongs to the device's context
    void* p = nullptr;
    const CUresult r = d_.mem_host_alloc(&p, bytes, kHostAllocFlags);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) return nullptr;  // the host cannot pin that much
    if (r != CUDA_SUCCESS) fail(call, device, r);
    return p;
  }

  void deallocate_host(int device, void* ptr, std::size_t bytes) override {
    auto call = [&] { return "cuMemFreeHost(" + hex(ptr) + ", " + bytes_text(bytes) + ")"; };
    check_device(device, call);
    if (ptr == nullptr) return;
    ContextScope scope = enter(device, call);  // the context that allocated it
    const CUresult r = d_.mem_free_host(ptr);
    if (r != CUDA_SUCCESS) fail(call, device, r);
  }

  void copy_to_host_async(int device, void* dst, const void* src, std::size_t bytes,
                          stream_t stream) override {
    async_host_copy(device, "cuMemcpyDtoHAsync", dst, src, bytes, stream, [&] {
      return d_.memcpy_dtoh_async(dst, to_cu(src), bytes, static_cast<CUstream>(stream));
    });
  }

  void copy_from_host_async(int device, void* dst, const void* src, std::size_t bytes,
                            stream_t stream) override {
    async_host_copy(device, "cuMemcpyHtoDAsync", dst, src, bytes, stream, [&] {
      return d_.memcpy_htod_async(to_cu(dst), src, bytes, static_cast<CUstream>(stream));
    });
  }

  /// One of the asynchronous host copies: `copy()` makes the driver call, in `device`'s context
  /// (the null stream: that device's default stream); a failure names `what` and its arguments.
  template <typename Copy>
  void async_host_copy(int device, const char* what, void* dst, const void* src, std::size_t bytes,
                       stream_t stream, Copy&& copy) {
    auto call = [&] {
      return std::string(what) + "(" + hex(dst) + ", " + hex(src) + ", " + std::to_string(bytes) +
             ", stream " + hex(stream) + ")";
    };
    ContextScope scope = enter(device, call);
    const CUresult r = copy();
    if (r != CUDA_SUCCESS) fail(call, device, r);
  }

  void synchronize_device(int device) override {
    auto call = [&] { return std::string("cuCtxSynchronize()"); };
    ContextScope scope = enter(device, call);  // the device's primary context
    const CUresult r = d_.ctx_synchronize();
    if (r != CUDA_SUCCESS) fail(call, device, r);
  }

  [[nodiscard]] bool is_capturing(int device, stream_t stream) override {
    auto call = [&] { return "cuStreamIsCapturing(stream " + hex(stream) + ")"; };
    ContextScope scope = enter(device, call);
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    const CUresult r = d_.stream_is_capturing(static_cast<CUstream>(stream), &status);
    // The legacy stream while a blocking stream captures answers with an error
    // (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT): as good as capturing, for what the core avoids.
    if (r != CUDA_SUCCESS) return true;
    return status != CU_STREAM_CAPTURE_STATUS_NONE;
  }

  // ---- host pages the device maps (spill) ----

  [[nodiscard]] std::size_t host_granularity(int device) override {
    return host_pages(device, [] { return std::string("host_granularity"); }).host_granularity;
  }

  [[nodiscard]] phys_handle_t create_host_physical(int device, std::size_t bytes) override {
    auto call = [&] { return "cuMemCreate(" + bytes_text(bytes) + ", CU_MEM_LOCATION_TYPE_HOST_NUMA)"; };
    const DeviceState& s = host_pages(device, call);
    if (s.host_granularity == 0)
      throw backend_error(call_text(call) + on_device(device) + ": host pages are unavailable: " + s.no_host_reason);
    const CUmemAllocationProp prop = host_memory_prop(s.host_numa);
    ContextScope scope = enter(device, call);
    CUmemGenericAllocationHandle handle = 0;
    const CUresult r = d_.mem_create(&handle, bytes, &prop, 0);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) return 0;
    if (r != CUDA_SUCCESS) fail(call, device, r);
    if (handle == 0) throw backend_error(call_text(call) + on_device(device) + " returned the null handle");
    return static_cast<phys_handle_t>(handle);
  }

  // ---- memory other processes map (IPC) ----

  [[nodiscard]] std::string export_memory(int device, const void* va, std::size_t bytes,
                                          std::size_t* offset) override {
    auto call = [&] { return "export of " + hex(va) + " (" + bytes_text(bytes) + ")"; };
    DeviceState& s = caps(device, call);
    const Shared shared = locate(device, s, va, bytes, call);
    ContextScope scope = enter(device, call);
    if (shared.handles.empty()) return export_allocation(device, va, offset, call);
    ipc::CudaShare share;
    share.pid = static_cast<int>(::getpid());
    for (std::size_t k = 0; k < shared.handles.size(); ++k) share.pieces.push_back({shared.bytes[k], -1, {}});
    share.kind = fabric_handles(device, s, shared.handles, &share) ? ipc::Kind::fabric : ipc::Kind::fd;
    if (share.kind == ipc::Kind::fd) {
      for (std::size_t k = 0; k < shared.handles.size(); ++k)
        share.pieces[k].fd = exported_fd(device, s, shared.handles[k], call);
    }
    *offset = static_cast<std::size_t>(to_cu(va) - shared.start);
    return ipc::encode(share);
  }

  [[nodiscard]] std::size_t export_size(int device, const void* va, std::size_t bytes, std::size_t* offset) override {
    auto call = [&] { return "export of " + hex(va) + " (" + bytes_text(bytes) + ")"; };
    DeviceState& s = caps(device, call);
    const Shared shared = locate(device, s, va, bytes, call);
    ContextScope scope = enter(device, call);
    auto digits = [](std::size_t n) { return std::to_string(n).size(); };
    if (shared.handles.empty()) {
      const auto [base, size] = allocation_of(device, va, call);
      *offset = static_cast<std::size_t>(to_cu(va) - base);
      return std::string_view("cuda-ipc:").size() + digits(size) + 1 + 2 * sizeof(CUipcMemHandle);
    }
    *offset = static_cast<std::size_t>(to_cu(va) - shared.start);
    // The longer of the two forms export_memory may write: descriptors (those not exported yet
    // at their widest) or fabric handles where the memory was created with them.
    std::size_t fds = std::string_view("cuda-fd:").size() + digits(static_cast<std::size_t>(::getpid())) + 1;
    std::size_t fabric = std::string_view("cuda-fabric:").size();
    {
      std::lock_guard lock(s.ipc_mutex);
      for (std::size_t k = 0; k < shared.handles.size(); ++k) {
        const auto it = s.exported_fds.find(shared.handles[k]);
        const std::size_t fd_digits = it != s.exported_fds.end() ? digits(static_cast<std::size_t>(it->second))
                                                                  : digits(static_cast<std::size_t>(INT32_MAX));
        fds += (k > 0 ? 1 : 0) + digits(shared.bytes[k]) + 1 + fd_digits;
        fabric += (k > 0 ? 1 : 0) + digits(shared.bytes[k]) + 1 + 2 * sizeof(CUmemFabricHandle);
      }
    }
    const bool may_fabric = (s.handle_types.load(std::memory_order_relaxed) & CU_MEM_HANDLE_TYPE_FABRIC) != 0;
    return may_fabric ? std::max(fds, fabric) : fds;
  }

  [[nodiscard]] void* import_memory(int device, const std::string& handle, std::size_t* bytes) override {
    auto call = [&] { return "import of '" + handle.substr(0, 96) + "'"; };
    std::string why;
    const std::optional<ipc::CudaShare> share = ipc::decode_cuda(handle, &why);
    if (!share) throw backend_error(call_text(call) + ": not a handle backend:cuda wrote: " + why);
    DeviceState& s = caps(device, call);
    ContextScope scope = enter(device, call);
    std::lock_guard lock(s.ipc_mutex);
    if (share->kind != ipc::Kind::legacy) {
      require_vmm(device, call);
      const CUdeviceptr va = import_pieces(device, s, *share, call);
      *bytes = share->total();
      return from_cu(va);
    }
    CUdeviceptr va = 0;
    CUipcMemHandle h{};
    std::memcpy(&h, share->legacy.data(), sizeof h);
    const CUresult r = d_.ipc_open_mem_handle(&va, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (r != CUDA_SUCCESS) fail([&] { return "cuIpcOpenMemHandle (" + call_text(call) + ")"; }, device, r);
    // The size mapped is the driver's, never the handle's: an inflated size would defeat the
    // importer's bounds check. A handle that names another size is refused.
    CUdeviceptr base = 0;
    std::size_t size = 0;
    const CUresult range = d_.mem_get_address_range(&base, &size, va);
    std::string refused;
    if (range != CUDA_SUCCESS) {
      refused = "cuMemGetAddressRange of the opened allocation failed: " + describe(range);
    } else if (base != va || size == 0) {
      refused = "the driver places the opened allocation at " + hex(from_cu(base)) + " (" + bytes_text(size) + "), not at " +
                hex(from_cu(va));
    } else if (share->bytes != 0 && share->bytes != size) {
      refused = "the handle says " + bytes_text(share->bytes) + " but the allocation has " + bytes_text(size);
    }
    auto known = s.imported.find(va);
    if (refused.empty() && known != s.imported.end() && (!known->second.legacy || known->second.bytes != size))
      refused = "the driver mapped it over an import of another kind";
    if (!refused.empty()) {
      (void)d_.ipc_close_mem_handle(va);  // (this open's reference; an earlier open keeps its own)
      throw backend_error(call_text(call) + on_device(device) + ": " + refused);
    }
    try {
      DeviceState::Imported& imp = s.imported[va];
      imp.bytes = size;
      imp.legacy = true;
      ++imp.opens;
    } catch (...) {
      (void)d_.ipc_close_mem_handle(va);
      throw;
    }
    *bytes = size;
    return from_cu(va);
  }

  void close_imported(int device, void* va, std::size_t bytes) override {
    auto call = [&] { return "close of the imported " + hex(va) + " (" + bytes_text(bytes) + ")"; };
    DeviceState& s = caps(device, call);
    ContextScope scope = enter(device, call);
    std::lock_guard lock(s.ipc_mutex);
    auto it = s.imported.find(to_cu(va));
    if (it == s.imported.end()) throw backend_error(call_text(call) + on_device(device) + ": import_memory did not return it");
    const DeviceState::Imported imp = it->second;
    if (imp.bytes != bytes) throw backend_error(call_text(call) + on_device(device) + ": import_memory mapped " + bytes_text(imp.bytes) + " there");
    if (imp.legacy) {
      const CUresult r = d_.ipc_close_mem_handle(to_cu(va));
      if (r != CUDA_SUCCESS) fail([&] { return "cuIpcCloseMemHandle(" + hex(va) + ")"; }, device, r);
      if (--it->second.opens != 0) return;  // the driver keeps it mapped for the other opens
    } else {
      CUresult r = d_.mem_unmap(to_cu(va), imp.bytes);
      if (r != CUDA_SUCCESS) fail([&] { return "cuMemUnmap(" + hex(va) + ", " + bytes_text(imp.bytes) + ")"; }, device, r);
      r = d_.mem_address_free(to_cu(va), imp.bytes);
      if (r != CUDA_SUCCESS) fail([&] { return "cuMemAddressFree(" + hex(va) + ", " + bytes_text(imp.bytes) + ")"; }, device, r);
    }
    s.imported.erase(it);
  }

 private:
  template <class Call>
  void check_device(int device, const Call& call) const {
    if (device < 0 || device >= device_count_) {
      throw backend_error(call_text(call) + on_device(device) +
                          ": no such device (this process sees " + std::to_string(device_count_) +
                          " CUDA device" + (device_count_ == 1 ? "" : "s") + ")");
    }
  }

  /// With ipc:False, why memory of expandable segments and stitching does not export.
  [[nodiscard]] std::string no_ipc_hint() const {
    return ipc_ ? std::string()
                : std::string("; with ipc:False, memory of expandable segments and stitching is created without a "
                              "shareable handle type and cannot be exported");
  }

  /// Host-located physical memory on NUMA node `numa`, as NCCL's ncclCuMemHostAlloc creates it.
  static CUmemAllocationProp host_memory_prop(int numa) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    prop.location.id = numa;
    return prop;
  }

  /// The device's host-page support, found on first use as NCCL does: the attribute where the
  /// driver knows it, then the granularity and one small create (containers without the right
  /// capability fail only there). Never throws for a device without support: the granularity
  /// is 0 and the reason kept.
  template <class Call>
  DeviceState& host_pages(int device, const Call& call) {
    DeviceState& s = caps(device, call);
    std::call_once(s.host_once, [&] {
      if (!s.vmm) {
        s.no_host_reason = s.no_vmm_reason;
        return;
      }
      int v = 0;
      if (d_.device_get_attribute(&v, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                  s.cu_device) == CUDA_SUCCESS && v == 0) {
        s.no_host_reason = "CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0";
        return;
      }
      int numa = -1;
      if (d_.device_get_attribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, s.cu_device) != CUDA_SUCCESS || numa < 0)
        numa = 0;  // cuda.h: "On systems where NUMA is not available ... id must be set to 0"
      const CUmemAllocationProp prop = host_memory_prop(numa);
      std::size_t g = 0;
      CUresult r = d_.mem_get_allocation_granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      if (r != CUDA_SUCCESS || g == 0 || (g & (g - 1)) != 0) {
        s.no_host_reason = "cuMemGetAllocationGranularity(CU_MEM_LOCATION_TYPE_HOST_NUMA) failed: " + describe(r);
        return;
      }
      ContextScope scope = enter(device, call);
      CUmemGenericAllocationHandle probe = 0;
      r = d_.mem_create(&probe, g, &prop, 0);
      if (r != CUDA_SUCCESS) {
        s.no_host_reason = "a probe cuMemCreate of host memory failed: " + describe(r) +
                           " (in a container, host NUMA memory needs CAP_SYS_NICE)";
        return;
      }
      // The probe's page goes back (a failed release is tried once more: it is host memory).
      if (d_.mem_release(probe) != CUDA_SUCCESS) (void)d_.mem_release(probe);
      s.host_numa = numa;
      s.host_granularity = g;
    });
    return s;
  }

  /// Forgets export_memory's record of the mappings in [va, va + bytes).
  static void forget_mappings(DeviceState& s, CUdeviceptr va, std::size_t bytes) {
    if (s.handle_types.load(std::memory_order_relaxed) == 0) return;
    std::lock_guard lock(s.ipc_mutex);
    s.mapped.erase(s.mapped.lower_bound(va), s.mapped.lower_bound(va + bytes));
  }

  /// The memory export_memory shares for [va, va + bytes): the physical allocations mapped in a
  /// row from the mapping that holds `va` (none: a cuMemAlloc allocation, or not exportable).
  struct Shared {
    CUdeviceptr start = 0;
    std::vector<CUmemGenericAllocationHandle> handles;
    std::vector<std::size_t> bytes;  ///< mapped of each
  };
  template <class Call>
  Shared locate(int device, DeviceState& s, const void* va, std::size_t bytes, const Call& call) {
    Shared out;
    if (s.handle_types.load(std::memory_order_relaxed) == 0) return out;
    std::lock_guard lock(s.ipc_mutex);
    auto it = s.mapped.upper_bound(to_cu(va));
    if (it == s.mapped.begin() || to_cu(va) >= std::prev(it)->first + std::prev(it)->second.second) return out;
    --it;
    out.start = it->first;
    CUdeviceptr end = out.start;
    for (; it != s.mapped.end() && it->first == end && end < to_cu(va) + bytes; ++it) {
      out.handles.push_back(it->second.first);
      out.bytes.push_back(it->second.second);
      end += it->second.second;
    }
    if (end < to_cu(va) + bytes)
      throw backend_error(call_text(call) + on_device(device) + ": the range is not wholly mapped");
    return out;
  }

  /// The cuMemAlloc allocation holding `va`: its base and size (in the device's context).
  template <class Call>
  std::pair<CUdeviceptr, std::size_t> allocation_of(int device, const void* va, const Call& call) {
    CUdeviceptr base = 0;
    std::size_t size = 0;
    const CUresult r = d_.mem_get_address_range(&base, &size, to_cu(va));
    if (r != CUDA_SUCCESS) {
      throw backend_error(call_text(call) + on_device(device) + ": not cuMemAlloc'd memory (cuMemGetAddressRange failed: " +
                          describe(r) + ")" + no_ipc_hint());
    }
    return {base, size};
  }

  /// A cuMemAlloc allocation's legacy IPC handle (cuIpcGetMemHandle of its base), in the
  /// device's context.
  template <class Call>
  std::string export_allocation(int device, const void* va, std::size_t* offset, const Call& call) {
    const std::pair<CUdeviceptr, std::size_t> range = allocation_of(device, va, call);
    const CUdeviceptr base = range.first;  // (no structured binding: a lambda below captures it)
    const std::size_t size = range.second;
    CUipcMemHandle h{};
    const CUresult r = d_.ipc_get_mem_handle(&h, base);
    if (r != CUDA_SUCCESS) {
      fail([&] {
        return "cuIpcGetMemHandle(" + hex(from_cu(base)) + ")" + no_ipc_hint();
      }, device, r);
    }
    ipc::CudaShare share;
    share.kind = ipc::Kind::legacy;
    share.bytes = size;
    std::memcpy(share.legacy.data(), &h, sizeof h);
    *offset = static_cast<std::size_t>(to_cu(va) - base);
    return ipc::encode(share);
  }

  /// Fills the pieces' fabric handles when every handle was created with one and exports as
  /// one; false otherwise (the descriptors serve then).
  bool fabric_handles(int device, const DeviceState& s, const std::vector<CUmemGenericAllocationHandle>& handles,
                      ipc::CudaShare* share) {
    (void)device;
    if ((s.handle_types.load(std::memory_order_relaxed) & CU_MEM_HANDLE_TYPE_FABRIC) == 0) return false;
    for (std::size_t k = 0; k < handles.size(); ++k) {
      CUmemFabricHandle f{};
      if (d_.mem_export_to_shareable_handle(&f, handles[k], CU_MEM_HANDLE_TYPE_FABRIC, 0) != CUDA_SUCCESS) return false;
      std::memcpy(share->pieces[k].fabric.data(), &f, sizeof f);
    }
    return true;
  }

  /// The descriptor `handle` is exported as: made once, kept open until the handle is released
  /// (an importer takes its own copy from this process with pidfd_getfd).
  template <class Call>
  int exported_fd(int device, DeviceState& s, CUmemGenericAllocationHandle handle, const Call& call) {
    std::lock_guard lock(s.ipc_mutex);
    auto it = s.exported_fds.find(handle);
    if (it != s.exported_fds.end()) return it->second;
    if ((s.handle_types.load(std::memory_order_relaxed) & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
      throw backend_error(call_text(call) + on_device(device) +
                          ": the memory was created without a shareable handle type (ipc:False, or the device "
                          "exports no POSIX file descriptors)");
    }
    int fd = -1;
    const CUresult r = d_.mem_export_to_shareable_handle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (r != CUDA_SUCCESS) {
      fail([&] { return "cuMemExportToShareableHandle(handle " + std::to_string(handle) + ", POSIX file descriptor)"; },
           device, r);
    }
    try {
      s.exported_fds.emplace(handle, fd);
    } catch (...) {
      (void)::close(fd);
      throw;
    }
    return fd;
  }

  /// This process's descriptor for `fd` of process `pid` (pidfd_getfd; a dup in the exporter).
  template <class Call>
  static int take_fd(int pid, int pidfd, int fd, const Call& call) {
    if (pid == static_cast<int>(::getpid())) {
      const int mine = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
      if (mine < 0) throw backend_error(call_text(call) + ": descriptor " + std::to_string(fd) + " is not open here");
      return mine;
    }
    const int mine = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, fd, 0));
    if (mine >= 0) return mine;
    const int err = errno;
    std::string why = std::strerror(err);
    if (err == EPERM)
      why += ": this process may not take descriptors of process " + std::to_string(pid) +
             " (ptrace access: Yama ptrace_scope 1 allows it only to an ancestor of the exporter, "
             "CAP_SYS_PTRACE always; or share through fabric handles)";
    if (err == EBADF) why += ": the exporter freed the memory, or the handle is stale";
    if (err == ENOSYS) why += ": the kernel lacks pidfd_getfd (Linux 5.6+)";
    throw backend_error(call_text(call) + ": pidfd_getfd(" + std::to_string(pid) + ", " + std::to_string(fd) +
                        ") failed: " + why);
  }

  /// Reserves a range, imports the pieces' handles and maps them in a row, readable and writable
  /// by the devices stitch grants; undoes everything on failure. Holds s.ipc_mutex.
  template <class Call>
  CUdeviceptr import_pieces(int device, DeviceState& s, const ipc::CudaShare& share, const Call& call) {
    const std::size_t total = share.total();
    // Checked before any driver call: whole pages, and in this process only descriptors this
    // back end exported (another process's are the driver's to refuse).
    for (const ipc::Piece& p : share.pieces) {
      if (p.bytes % s.granularity != 0)
        throw backend_error(call_text(call) + on_device(device) + ": a piece of " + bytes_text(p.bytes) +
                            " is not whole pages of " + bytes_text(s.granularity));
      if (share.kind == ipc::Kind::fd && share.pid == static_cast<int>(::getpid()) &&
          std::none_of(s.exported_fds.begin(), s.exported_fds.end(), [&](const auto& e) { return e.second == p.fd; }))
        throw backend_error(call_text(call) + on_device(device) + ": descriptor " + std::to_string(p.fd) +
                            " is not one this process exported");
    }
    int pidfd = -1;
    CUdeviceptr va = 0;
    std::size_t mapped = 0;
    std::vector<CUmemGenericAllocationHandle> handles;
    auto cleanup = [&] {
      if (mapped > 0) (void)d_.mem_unmap(va, mapped);
      for (CUmemGenericAllocationHandle h : handles) (void)d_.mem_release(h);
      if (va != 0) (void)d_.mem_address_free(va, total);
      if (pidfd >= 0) (void)::close(pidfd);
    };
    try {
      if (share.kind == ipc::Kind::fd && share.pid != static_cast<int>(::getpid())) {
        pidfd = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(share.pid), 0));
        if (pidfd < 0) {
          const int err = errno;
          throw backend_error(call_text(call) + ": pidfd_open(" + std::to_string(share.pid) + ") failed: " +
                              std::strerror(err) + (err == ESRCH ? " (the exporting process has exited)" : ""));
        }
      }
      handles.reserve(share.pieces.size());
      for (const ipc::Piece& p : share.pieces) {
        CUmemGenericAllocationHandle h = 0;
        CUresult r;
        if (share.kind == ipc::Kind::fd) {
          const int fd = take_fd(share.pid, pidfd, p.fd, call);
          r = d_.mem_import_from_shareable_handle(&h, reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd)),
                                                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
          (void)::close(fd);  // the imported handle holds the memory
        } else {
          CUmemFabricHandle f{};
          std::memcpy(&f, p.fabric.data(), sizeof f);
          r = d_.mem_import_from_shareable_handle(&h, &f, CU_MEM_HANDLE_TYPE_FABRIC);
        }
        if (r != CUDA_SUCCESS) fail([] { return std::string("cuMemImportFromShareableHandle"); }, device, r);
        handles.push_back(h);
      }
      CUresult r = d_.mem_address_reserve(&va, total, s.granularity, 0, 0);
      if (r != CUDA_SUCCESS) {
        va = 0;
        fail([&] { return "cuMemAddressReserve(" + bytes_text(total) + ")"; }, device, r);
      }
      for (std::size_t k = 0; k < handles.size(); ++k) {
        r = d_.mem_map(va + mapped, share.pieces[k].bytes, 0, handles[k], 0);
        if (r != CUDA_SUCCESS) fail([&] { return "cuMemMap(" + bytes_text(share.pieces[k].bytes) + ")"; }, device, r);
        mapped += share.pieces[k].bytes;
      }
      r = d_.mem_set_access(va, total, s.access.data(), s.access.size());
      if (r != CUDA_SUCCESS) fail([&] { return "cuMemSetAccess(" + bytes_text(total) + ")"; }, device, r);
      s.imported[va] = {total, false};
    } catch (...) {
      cleanup();
      throw;
    }
    for (CUmemGenericAllocationHandle h : handles) (void)d_.mem_release(h);  // the mappings keep them
    if (pidfd >= 0) (void)::close(pidfd);
    return va;
  }

  /// The scope of a call for `device`: its primary context current, retained on first use.
  template <class Call>
  ContextScope enter(int device, const Call& call) {
    check_device(device, call);
    DeviceState& s = caps(device, call);
    CUcontext context = nullptr;
    {
      std::lock_guard lock(s.context_mutex);
      if (s.context == nullptr) {
        // Retained once and kept: the allocator uses the device until the process ends.
        const CUresult r = d_.primary_ctx_retain(&s.context, s.cu_device);
        if (r != CUDA_SUCCESS) {
          s.context = nullptr;
          fail([] { return std::string("cuDevicePrimaryCtxRetain"); }, device, r);
        }
      }
      context = s.context;
    }
    return ContextScope(d_, context, device);
  }

  /// The device's capabilities, queried from the driver on first use (device queries only: no
  /// context is created). If the query throws, nothing is cached and the next call asks again.
  template <class Call>
  DeviceState& caps(int device, const Call& call) {
    check_device(device, call);
    DeviceState& s = devices_[static_cast<std::size_t>(device)];
    std::call_once(s.caps_once, [&] { query_caps(device, s); });
    return s;
  }

  void query_caps(int device, DeviceState& out) {
    CUdevice cu_device = 0;
    CUresult r = d_.device_get(&cu_device, device);
    if (r != CUDA_SUCCESS) fail([] { return std::string("cuDeviceGet"); }, device, r);
    int supported = 0;
    r = d_.device_get_attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                cu_device);
    if (r != CUDA_SUCCESS) {
      fail([] {
        return std::string("cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)");
      }, device, r);
    }
    std::vector<CUmemAccessDesc> access;
    CUmemAccessDesc self{};
    self.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    self.location.id = static_cast<int>(cu_device);
    self.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    access.push_back(self);
    if (peer_access_) {
      for (int peer = 0; peer < device_count_; ++peer) {
        if (peer == device) continue;
        CUdevice cu_peer = 0;
        int can = 0;
        if (d_.device_get(&cu_peer, peer) != CUDA_SUCCESS ||
            d_.device_can_access_peer(&can, cu_peer, cu_device) != CUDA_SUCCESS || can == 0)
          continue;
        CUmemAccessDesc desc = self;
        desc.location.id = static_cast<int>(cu_peer);
        access.push_back(desc);
      }
    }
    out.cu_device = cu_device;
    out.access = std::move(access);
    if (supported == 0) {
      out.no_vmm_reason =
          "the device does not support virtual memory management "
          "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0)";
      return;
    }
    // IPC (ipc:True): POSIX file descriptors and fabric handles where the device exports them,
    // and GPUDirect RDMA registration where supported, as ncclMemAlloc asks. An attribute the
    // driver does not know reads as unsupported.
    auto attribute = [&](CUdevice_attribute a) {
      int v = 0;
      return d_.device_get_attribute(&v, a, cu_device) == CUDA_SUCCESS && v != 0;
    };
    unsigned types = 0;
    if (ipc_) {
      if (attribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED))
        types |= CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
      if (attribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED)) types |= CU_MEM_HANDLE_TYPE_FABRIC;
      out.rdma = attribute(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED);
    }
    out.handle_types.store(types, std::memory_order_relaxed);
    const CUmemAllocationProp prop = device_memory_prop(cu_device, types, out.rdma);
    std::size_t granularity = 0;
    r = d_.mem_get_allocation_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != CUDA_SUCCESS) {
      fail([] { return std::string("cuMemGetAllocationGranularity(CU_MEM_ALLOC_GRANULARITY_MINIMUM)"); },
           device, r);
    }
    if (granularity == 0 || (granularity & (granularity - 1)) != 0) {
      throw backend_error("cuMemGetAllocationGranularity" + on_device(device) + " returned " +
                          std::to_string(granularity) + ", which is not a power of two");
    }
    out.granularity = granularity;
    out.vmm = true;
  }

  /// Unmaps the stray runs of `s`: those overlapping [at, at + bytes) must go (throws if one
  /// fails again, keeping it); the others get one more try and stay stray if it fails.
  void retry_strays(DeviceState& s, int device, CUdeviceptr at, std::size_t bytes) {
    std::lock_guard lock(s.strays_mutex);
    for (auto it = s.strays.begin(); it != s.strays.end();) {
      const CUdeviceptr va = it->first;  // (not a structured binding: the lambda below uses it)
      const std::size_t size = it->second;
      const CUresult r = d_.mem_unmap(va, size);
      if (r == CUDA_SUCCESS) {
        it = s.strays.erase(it);
        continue;
      }
      if (va < at + bytes && at < va + size) {
        fail([&] { return "cuMemUnmap(" + hex(from_cu(va)) + ", " + bytes_text(size) + ") of a stray run"; },
             device, r);
      }
      ++it;
    }
  }

  /// The device's state, after checking that it supports the virtual-memory calls.
  template <class Call>
  const DeviceState& require_vmm(int device, const Call& call) {
    const DeviceState& s = caps(device, call);
    if (!s.vmm) {
      throw backend_error(call_text(call) + on_device(device) +
                          ": virtual memory management is unavailable: " + s.no_vmm_reason);
    }
    return s;
  }

  const Driver& d_;
  const int device_count_;
  const bool peer_access_;
  const bool ipc_;  ///< ipc:True: physical memory is created exportable
  const std::unique_ptr<DeviceState[]> devices_;
};

}  // namespace

int cuda_device_count() {
  std::string why;
  const Driver* d = cuda_driver::driver(&why);
  if (d == nullptr) {
    throw backend_error("backend:cuda: no CUDA device (" + why +
                        "); use backend:sim for the simulated device");
  }
  int count = 0;
  const CUresult r = d->device_get_count(&count);
  if (r != CUDA_SUCCESS) {
    throw backend_error("backend:cuda: no CUDA device (cuDeviceGetCount failed: " + describe(r) +
                        "); use backend:sim for the simulated device");
  }
  if (count <= 0) {
    throw backend_error(
        "backend:cuda: no CUDA device (the driver " + d->path +
        " reports 0 devices); use backend:sim for the simulated device");
  }
  return count;
}

std::shared_ptr<Backend> make_cuda_backend(const Config& config) {
  const int count = cuda_device_count();  // the driver is loaded once it returns
  return std::make_shared<CudaBackend>(*cuda_driver::driver(), count, config.peer_access, config.ipc);
}

}  // namespace stitch
