// stitch/backend.hpp — the one interface between the allocator core and a device.
//
// The core never talks to CUDA directly: everything device-side goes through a Backend.
// Two implementations ship with stitch: SimBackend (host memory that behaves like a GPU) and
// CudaBackend (the CUDA driver API, opened at run time).
//
// Error contract for every method: running out of device memory is reported through the return
// value (nullptr / 0 / false, as documented per method); every other failure throws
// stitch::backend_error with a message naming the call. A method that throws has changed nothing.
#pragma once

#include "stitch/export.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace stitch {

/// A stream handle: a cudaStream_t passed as an opaque pointer. nullptr is the default stream.
using stream_t = void*;
/// An event handle created by Backend::create_event.
using event_t = void*;
/// A handle to physical device memory created by Backend::create_physical (0 is never valid).
using phys_handle_t = std::uint64_t;

/// One piece of a run of mappings (Backend::map_run): the first `bytes` of `handle`.
struct MapPiece {
  phys_handle_t handle = 0;
  std::size_t bytes = 0;
};

/// Device memory as the device reports it.
struct MemoryInfo {
  std::size_t free = 0;   ///< bytes the device could still hand out
  std::size_t total = 0;  ///< device capacity in bytes
};

/// The device-side operations the allocator core needs. Implementations must be thread-safe.
class STITCH_EXPORT Backend {
 public:
  virtual ~Backend() = default;

  /// Short name ("sim", "cuda") used in messages and snapshots.
  [[nodiscard]] virtual const char* name() const noexcept = 0;
  /// Number of devices this backend drives (devices are numbered 0..count-1).
  [[nodiscard]] virtual int device_count() = 0;
  /// Free and total memory of a device.
  [[nodiscard]] virtual MemoryInfo memory_info(int device) = 0;
  /// A device's capacity in bytes, learnt without touching the device where the back end can
  /// (CUDA: cuDeviceTotalMem, which needs no context); by default memory_info(device).total.
  [[nodiscard]] virtual std::size_t total_memory(int device) { return memory_info(device).total; }
  /// Granularity of physical allocations and mappings (2 MiB on current GPUs), a power of two.
  [[nodiscard]] virtual std::size_t granularity(int device) = 0;
  /// Whether the virtual-memory calls (reserve/create_physical/map/unmap) work on this device.
  [[nodiscard]] virtual bool supports_virtual_memory(int device) = 0;

  // ---- plain device memory (cudaMalloc / cudaFree) -------------------------------------------
  /// Allocates `bytes` of device memory, at least 512-byte aligned. Returns nullptr when the
  /// device is out of memory.
  [[nodiscard]] virtual void* allocate(int device, std::size_t bytes) = 0;
  /// Frees memory returned by allocate(); `bytes` is the size that was allocated.
  virtual void deallocate(int device, void* ptr, std::size_t bytes) = 0;

  // ---- virtual memory (cuMemAddressReserve / cuMemCreate / cuMemMap ...) -----------------------
  /// Reserves a range of virtual addresses (no memory behind it). `bytes` and `alignment` are
  /// multiples of granularity(). Returns nullptr when no address space is left.
  [[nodiscard]] virtual void* reserve(int device, std::size_t bytes, std::size_t alignment) = 0;
  /// Releases a reservation made by reserve(); nothing may still be mapped in it.
  virtual void release_reservation(int device, void* va, std::size_t bytes) = 0;
  /// Creates `bytes` (a multiple of granularity()) of physical memory. Returns 0 when the device
  /// is out of memory. Physical memory counts against the device's capacity.
  [[nodiscard]] virtual phys_handle_t create_physical(int device, std::size_t bytes) = 0;
  /// Releases physical memory. If it is still mapped somewhere it is freed when the last mapping
  /// goes away (as cuMemRelease does).
  virtual void release_physical(int device, phys_handle_t handle) = 0;
  /// Maps `count` pieces side by side from `va`, inside a reservation where nothing is mapped,
  /// and makes the whole run readable and writable from `device` (cuMemMap per piece, then one
  /// cuMemSetAccess over the run). A piece is the first `bytes` of its handle (all of it, or a
  /// prefix: a multiple of granularity()); always from the handle's start, as cuMemMap's offset
  /// "currently must be zero". A handle may be mapped at several places at once. All or
  /// nothing: returns false when the device ran out of memory while mapping (nothing mapped).
  [[nodiscard]] virtual bool map_run(int device, void* va, const MapPiece* pieces,
                                     std::size_t count) = 0;
  /// map_run of one piece.
  [[nodiscard]] bool map(int device, void* va, std::size_t bytes, phys_handle_t handle) {
    const MapPiece piece{handle, bytes};
    return map_run(device, va, &piece, 1);
  }
  /// Unmaps `bytes` at `va` (a range previously mapped by one or more map() calls).
  virtual void unmap(int device, void* va, std::size_t bytes) = 0;
  /// Makes the mapped range [va, va + bytes) readable only (cuMemSetAccess with
  /// CU_MEM_ACCESS_FLAGS_PROT_READ): a KV pool's shared zero page under unused slots. False when
  /// this back end cannot (the default); throws backend_error when the call fails.
  [[nodiscard]] virtual bool protect_read_only(int device, void* va, std::size_t bytes);

  // ---- events and streams -------------------------------------------------------------------
  /// Creates an event (timing disabled). The core pools events; this is not on any fast path.
  [[nodiscard]] virtual event_t create_event(int device) = 0;
  virtual void destroy_event(int device, event_t event) = 0;
  /// Records `event` on `stream`: it completes once the work queued on the stream so far is done.
  virtual void record_event(int device, event_t event, stream_t stream) = 0;
  /// True when the work captured by the last record_event() has completed.
  [[nodiscard]] virtual bool query_event(int device, event_t event) = 0;
  /// Blocks until the event has completed.
  virtual void synchronize_event(int device, event_t event) = 0;
  /// Blocks until all work queued on `stream` has completed.
  virtual void synchronize_stream(int device, stream_t stream) = 0;
  /// Copies `bytes` from `src` to `dst`, both device memory of `device` (mapped and accessible),
  /// on `stream` (cuMemcpyDtoDAsync): it may return before the copy ends; synchronize the stream
  /// (or the device) before relying on it. Compaction moves live data with it. By default it
  /// throws backend_error: a back end (or a wrapper around one) that does not implement it must
  /// not pretend to have copied.
  virtual void copy(int device, void* dst, const void* src, std::size_t bytes, stream_t stream);
  /// Copies `bytes` of device memory of `device` at `src` into host memory at `dst`
  /// (cuMemcpyDtoH), or host memory into device memory (cuMemcpyHtoD); both return once the copy
  /// is done. Compaction stages live data through the host when the device has no room for
  /// fresh pages. By default they throw backend_error.
  virtual void copy_to_host(int device, void* dst, const void* src, std::size_t bytes);
  virtual void copy_from_host(int device, void* dst, const void* src, std::size_t bytes);
  /// Pinned (page-locked) host memory of `bytes` in `device`'s context (cuMemHostAlloc), which
  /// the asynchronous copies below move at full bandwidth: sleep's backups. Returns nullptr when
  /// the host cannot give it. By default it throws backend_error.
  [[nodiscard]] virtual void* allocate_host(int device, std::size_t bytes);
  /// Frees memory of allocate_host() (cuMemFreeHost). By default it throws backend_error.
  virtual void deallocate_host(int device, void* ptr, std::size_t bytes);
  /// As copy_to_host() and copy_from_host(), but queued on `stream` (cuMemcpyDtoHAsync /
  /// cuMemcpyHtoDAsync): they may return before the copy ends; synchronize the stream before
  /// relying on it. The host side is memory of allocate_host(). By default they throw
  /// backend_error.
  virtual void copy_to_host_async(int device, void* dst, const void* src, std::size_t bytes,
                                  stream_t stream);
  virtual void copy_from_host_async(int device, void* dst, const void* src, std::size_t bytes,
                                    stream_t stream);
  // ---- host pages the device maps (spill) ------------------------------------------------------
  /// The page size of host-located physical memory (create_host_physical), or 0 when this back
  /// end cannot map host memory into the device's ranges. By default 0.
  [[nodiscard]] virtual std::size_t host_granularity(int device);
  /// Host-located physical memory of `bytes` (a positive multiple of host_granularity()) for
  /// `device` (cuMemCreate with CU_MEM_LOCATION_TYPE_HOST_NUMA): map_run maps it into the
  /// device's reserved ranges like device memory and release_physical releases it, so kernels
  /// reach it over the bus at the same addresses. It is host memory: memory_info() does not count
  /// it. Returns 0 when the host cannot give it. By default it throws backend_error.
  [[nodiscard]] virtual phys_handle_t create_host_physical(int device, std::size_t bytes);
  // ---- memory another process maps (IPC) ------------------------------------------------------
  /// A printable handle naming the device memory under [va, va + bytes) of `device` (memory this
  /// back end allocated or mapped), which import_memory() maps in another process (or in this
  /// one); the memory shared may start before `va` (whole pages or the whole allocation), and
  /// `*offset` says where `va` lies in it. Nothing is copied: both sides see the same pages. By
  /// default it throws backend_error (this back end cannot share memory).
  [[nodiscard]] virtual std::string export_memory(int device, const void* va, std::size_t bytes,
                                                  std::size_t* offset);
  /// The most characters export_memory's text for the same memory can take, and `*offset` as it
  /// would set it, without exporting anything (no descriptor, no driver handle): a size query.
  /// Fails where export_memory would fail to find the memory. By default it throws backend_error.
  [[nodiscard]] virtual std::size_t export_size(int device, const void* va, std::size_t bytes, std::size_t* offset);
  /// Maps the memory `handle` names on `device` at a new address; returns it, its size in
  /// `*bytes`. Throws backend_error for a malformed or stale handle (the exporter ended) or one of
  /// another back end.
  [[nodiscard]] virtual void* import_memory(int device, const std::string& handle, std::size_t* bytes);
  /// Unmaps memory import_memory() returned; the exporter's memory stays. Throws backend_error
  /// for a range import_memory() did not return.
  virtual void close_imported(int device, void* va, std::size_t bytes);
  /// Blocks until all work queued on `device`, on every stream, has completed (cuCtxSynchronize).
  /// Before memory moves under live addresses. By default it throws backend_error, so that a
  /// wrapper that does not forward it cannot skip the sync silently.
  virtual void synchronize_device(int device);
  // ---- files: sleep's disk tier (backup_dir, docs/sleep.md) ----------------------------------
  // Unlike the calls above, these never throw: they return -errno, so that the caller can say
  // which file, offset and size failed. By default they are the POSIX calls
  // (src/backends/backend_files.cpp); a back end overrides them to count or fail them (the
  // simulator's fault injection) or to move the bytes another way.
  /// A new file for `device`'s backups in directory `dir`, private to the process: unnamed
  /// (O_TMPFILE) where the file system allows it, else created with mode 0600 and unlinked at
  /// once, so that nothing stays in `dir` once it is closed or the process ends. Close-on-exec.
  /// Opened with O_DIRECT where the file system accepts it: then `*direct` is set, and every
  /// write_file / read_file must use host memory, an offset and a size aligned to 4 KiB
  /// (kFileAlignment). Returns the descriptor, or -errno.
  [[nodiscard]] virtual int open_file(int device, const char* dir, bool* direct) noexcept;
  /// Writes `bytes` of host memory at `src` to `fd` at `offset` (pwrite). Returns the bytes
  /// written (fewer is a short write: the caller writes the rest) or -errno.
  [[nodiscard]] virtual std::int64_t write_file(int device, int fd, const void* src, std::size_t bytes,
                                                std::uint64_t offset) noexcept;
  /// Reads up to `bytes` at `offset` of `fd` into host memory at `dst` (pread). Returns the
  /// bytes read (fewer is a short read; 0 at the end of the file) or -errno.
  [[nodiscard]] virtual std::int64_t read_file(int device, int fd, void* dst, std::size_t bytes,
                                               std::uint64_t offset) noexcept;
  /// Gives [offset, offset + bytes) of `fd` back to the file system (a hole); 0 or -errno
  /// (where the file system has no holes, the bytes go back when the file is closed).
  virtual int discard_file(int device, int fd, std::uint64_t offset, std::uint64_t bytes) noexcept;
  /// Closes a file of open_file(): its bytes go back to the file system.
  virtual void close_file(int device, int fd) noexcept;
  /// Alignment of memory, offsets and sizes for a file opened with O_DIRECT.
  static constexpr std::size_t kFileAlignment = 4096;
  /// Whether `stream` is capturing a CUDA graph (cuStreamIsCapturing); true also when the back
  /// end cannot tell. The core asks before recording the events of a cross-stream free, before
  /// polling events and before the slow path, so that a capture it was not told about (no
  /// private-pool route) is not broken by an event query, a sync or returned memory on that
  /// stream. By default false (a back end without graphs).
  [[nodiscard]] virtual bool is_capturing(int device, stream_t stream) {
    (void)device;
    (void)stream;
    return false;
  }
};

struct Config;

/// Checks that `path` (backup_dir, sleep's disk tier) can hold backup files: a directory,
/// created with mode 0700 (and its missing parents) when it does not exist, in which this
/// process can create a private file (one is made and closed at once, as Backend::open_file
/// makes them). Throws stitch::config_error naming the path and why not.
STITCH_EXPORT void check_backup_dir(const std::string& path);

/// Creates the backend a configuration names (`backend:sim` or `backend:cuda`).
/// Throws stitch::backend_error if it is unavailable (e.g. "no CUDA device"); never substitutes
/// another backend.
STITCH_EXPORT std::shared_ptr<Backend> make_backend(const Config& config);

/// How many devices the backend `config` names has, without creating it: sim_devices for
/// `backend:sim`; for `backend:cuda`, what the driver reports after cuInit (no context is
/// created). Throws stitch::backend_error, as make_backend() would, when the backend is unusable.
STITCH_EXPORT int probe_device_count(const Config& config);

}  // namespace stitch
