// stitch/sim_backend.hpp — a simulated GPU made of real host memory, for machines without one.
//
// Pointers are host memory that can be read and written. All device memory lives in one sparse
// memfd per device, so an 80 GiB device costs nothing until touched: plain allocations are
// MAP_SHARED mappings of ranges of it, physical memory for the virtual-memory calls is ranges of
// it that map() places with MAP_FIXED (two virtual ranges mapped to one handle see the same
// bytes), and another process can map any of it (export_memory). Capacity is enforced on plain
// allocations plus physical memory; reservations are free.
//
// Streams are opaque non-null handles (nullptr is the default stream). A test may hold a stream:
// events recorded on it stay incomplete until the test releases the stream. Faults can be
// injected into the Nth call of any kind.
#pragma once

#include "stitch/export.hpp"

#include <cstddef>
#include <cstdint>
#include <utility>
#include <memory>
#include <string>

#include "stitch/backend.hpp"

namespace stitch {

/// The kinds of backend call the simulator counts and can make fail.
enum class SimCall : int {
  allocate,
  deallocate,
  reserve,
  release_reservation,
  create_physical,
  release_physical,
  map,
  unmap,
  create_event,
  destroy_event,
  record_event,
  query_event,
  synchronize_event,
  synchronize_stream,
  set_access,  ///< once per map_run, after its maps (cuMemSetAccess over the run)
  copy,        ///< a device-to-device copy (cuMemcpyDtoDAsync)
  copy_to_host,    ///< cuMemcpyDtoH
  copy_from_host,  ///< cuMemcpyHtoD
  synchronize_device,
  allocate_host,         ///< pinned host memory (cuMemHostAlloc); `out_of_memory` returns nullptr
  deallocate_host,       ///< cuMemFreeHost
  copy_to_host_async,    ///< cuMemcpyDtoHAsync
  copy_from_host_async,  ///< cuMemcpyHtoDAsync
  create_host_physical,  ///< host pages for mapping (cuMemCreate, HOST_NUMA); `out_of_memory` returns 0
  // Files (sleep's disk tier): real files, through Backend's POSIX calls; a fault makes the call
  // return -errno (SimFault below: `out_of_memory` is ENOSPC, `error` EIO) instead of throwing.
  open_file,     ///< a backup file in backup_dir
  write_file,    ///< pwrite
  read_file,     ///< pread
  discard_file,  ///< a hole punched (a sleeping block freed)
  close_file,    ///< close (counted; never fails)
  count_  ///< number of kinds (not a call)
};

/// Name of a call kind ("allocate", "map", ...).
STITCH_EXPORT const char* to_string(SimCall call) noexcept;

/// How an injected fault fails a call.
enum class SimFault : int {
  out_of_memory,  ///< the call reports out-of-memory (only for allocate, reserve, create_physical
                  ///< and map; other kinds treat it like `error`; a file call returns -ENOSPC)
  error,          ///< the call throws stitch::backend_error (a file call returns -EIO)
  // File calls only (open_file, write_file, read_file, discard_file):
  short_io,  ///< write_file / read_file move half the bytes (rounded down to 4 KiB where that
             ///< leaves any; else half) and return that count; other file calls: -EIO
  no_space,  ///< -ENOSPC, nothing written
  io_error   ///< -EIO, nothing moved
};

/// Per-device usage figures, for tests and leak checks.
struct SimUsage {
  std::size_t capacity = 0;         ///< configured capacity in bytes
  std::size_t used = 0;             ///< plain allocations + live physical memory, in bytes
  std::size_t allocations = 0;      ///< live plain allocations
  std::size_t physical_handles = 0; ///< live (not yet freed) physical handles
  std::size_t reservations = 0;     ///< live reserved ranges
  std::size_t mappings = 0;         ///< live mapped ranges
  std::size_t events = 0;           ///< live events
  std::size_t host_bytes = 0;       ///< pinned host memory of allocate_host (all devices)
  std::size_t host_allocations = 0; ///< live allocate_host blocks (all devices)
  std::size_t host_pages = 0;       ///< host pages of create_host_physical, in bytes (all devices)
  std::size_t files = 0;            ///< files of open_file not yet closed (all devices)
};

/// The simulated device. Thread-safe.
class STITCH_EXPORT SimBackend : public Backend {
 public:
  struct Options {
    int devices = 1;                                     ///< sim_devices
    std::size_t capacity = std::size_t{81920} << 20;     ///< per device, sim_capacity_mb
    std::size_t granularity = std::size_t{2} << 20;      ///< physical page size
    /// sim_host_mb: the host memory the device's host pages and allocate_host may take together
    /// (all devices); 0: no bound. Past it they report out of memory.
    std::size_t host_capacity = 0;
    /// The page size of host pages (create_host_physical); 0: the device's.
    std::size_t host_granularity = 0;
    /// copy() moves the bytes; false: it checks and counts the copy but moves nothing (a
    /// replay's device holds no contents worth copying).
    bool copy_data = true;
  };

  SimBackend();
  explicit SimBackend(Options options);
  ~SimBackend() override;
  SimBackend(const SimBackend&) = delete;
  SimBackend& operator=(const SimBackend&) = delete;

  // Backend
  [[nodiscard]] const char* name() const noexcept override { return "sim"; }
  [[nodiscard]] int device_count() override;
  [[nodiscard]] MemoryInfo memory_info(int device) override;
  [[nodiscard]] std::size_t granularity(int device) override;
  [[nodiscard]] bool supports_virtual_memory(int device) override;
  [[nodiscard]] void* allocate(int device, std::size_t bytes) override;
  void deallocate(int device, void* ptr, std::size_t bytes) override;
  [[nodiscard]] void* reserve(int device, std::size_t bytes, std::size_t alignment) override;
  void release_reservation(int device, void* va, std::size_t bytes) override;
  [[nodiscard]] phys_handle_t create_physical(int device, std::size_t bytes) override;
  void release_physical(int device, phys_handle_t handle) override;
  [[nodiscard]] bool map_run(int device, void* va, const MapPiece* pieces,
                             std::size_t count) override;
  void unmap(int device, void* va, std::size_t bytes) override;
  [[nodiscard]] event_t create_event(int device) override;
  void destroy_event(int device, event_t event) override;
  void record_event(int device, event_t event, stream_t stream) override;
  [[nodiscard]] bool query_event(int device, event_t event) override;
  void synchronize_event(int device, event_t event) override;
  void synchronize_stream(int device, stream_t stream) override;
  void copy(int device, void* dst, const void* src, std::size_t bytes, stream_t stream) override;
  void synchronize_device(int device) override;
  void copy_to_host(int device, void* dst, const void* src, std::size_t bytes) override;
  void copy_from_host(int device, void* dst, const void* src, std::size_t bytes) override;
  [[nodiscard]] void* allocate_host(int device, std::size_t bytes) override;
  [[nodiscard]] std::size_t host_granularity(int device) override;
  /// mprotect(PROT_READ) of a mapped range (counted as set_access): a write there faults.
  [[nodiscard]] bool protect_read_only(int device, void* va, std::size_t bytes) override;
  [[nodiscard]] phys_handle_t create_host_physical(int device, std::size_t bytes) override;
  void deallocate_host(int device, void* ptr, std::size_t bytes) override;
  void copy_to_host_async(int device, void* dst, const void* src, std::size_t bytes,
                          stream_t stream) override;
  void copy_from_host_async(int device, void* dst, const void* src, std::size_t bytes,
                            stream_t stream) override;
  [[nodiscard]] bool is_capturing(int device, stream_t stream) override;
  /// The file calls are Backend's own (real files), counted and made to fail by inject_fault.
  [[nodiscard]] int open_file(int device, const char* dir, bool* direct) noexcept override;
  [[nodiscard]] std::int64_t write_file(int device, int fd, const void* src, std::size_t bytes,
                                        std::uint64_t offset) noexcept override;
  [[nodiscard]] std::int64_t read_file(int device, int fd, void* dst, std::size_t bytes,
                                       std::uint64_t offset) noexcept override;
  int discard_file(int device, int fd, std::uint64_t offset, std::uint64_t bytes) noexcept override;
  void close_file(int device, int fd) noexcept override;
  /// Every device memory is a range of the device's memfd: the handle names the exporting
  /// process, its memfd and the pieces; the importer reopens /proc/<pid>/fd/<fd>, which works
  /// where ptrace is restricted (Yama ptrace_scope 1 refuses pidfd_getfd, not this) for processes
  /// of the same user.
  [[nodiscard]] std::string export_memory(int device, const void* va, std::size_t bytes,
                                          std::size_t* offset) override;
  /// The text export_memory writes, measured (on the simulated device writing it exports nothing).
  [[nodiscard]] std::size_t export_size(int device, const void* va, std::size_t bytes, std::size_t* offset) override;
  [[nodiscard]] void* import_memory(int device, const std::string& handle, std::size_t* bytes) override;
  void close_imported(int device, void* va, std::size_t bytes) override;

  // ---- test controls --------------------------------------------------------------------------
  /// From now on, events recorded on `stream` stay incomplete until release_stream(stream).
  void hold_stream(stream_t stream);
  /// Completes all work recorded on `stream` so far and stops holding it.
  void release_stream(stream_t stream);
  /// Graph capture, with CUDA's rules (cudaStreamBeginCapture .. cudaStreamEndCapture): while
  /// `stream` captures on `device`, an event recorded on it is a node of the graph (no work),
  /// and querying or waiting for such an event, or synchronizing the stream, invalidates the
  /// capture and throws backend_error, as does returning device memory (deallocate, unmap) while
  /// any stream of the device captures.
  void begin_capture(int device, stream_t stream);
  /// Ends the capture; false when it was invalidated.
  [[nodiscard]] bool end_capture(stream_t stream);
  /// Captures invalidated so far.
  [[nodiscard]] std::uint64_t capture_invalidations() const;
  /// Number of times a synchronize call had to complete work on a held stream.
  [[nodiscard]] std::uint64_t forced_completions() const;
  /// Makes the `nth` call of kind `call` counted from now (1 = the next one) fail with `fault`.
  /// Several faults may be armed at once, on the same or different kinds. short_io, no_space and
  /// io_error are for the file calls only (invalid_argument elsewhere).
  void inject_fault(SimCall call, std::uint64_t nth, SimFault fault);
  /// Disarms every pending fault.
  void clear_faults();
  /// Calls of a kind made so far (including failed ones).
  [[nodiscard]] std::uint64_t call_count(SimCall call) const;
  /// Bytes those calls asked for (allocate, create_physical, map, unmap; 0 for the others).
  [[nodiscard]] std::uint64_t call_bytes(SimCall call) const;
  /// Of the copy() calls, those with a side on host pages mapped in the device's ranges (spill
  /// and unspill: they cross the bus), and their bytes.
  [[nodiscard]] std::pair<std::uint64_t, std::uint64_t> bus_copies() const;
  /// Faults that fired so far.
  [[nodiscard]] std::uint64_t faults_fired() const;
  /// Usage figures of a device.
  [[nodiscard]] SimUsage usage(int device) const;
  /// Changes a device's capacity (may be below current use: later requests then fail).
  void set_capacity(int device, std::size_t bytes);

 private:
  /// write_file or read_file (`call`) with the faults armed for it.
  std::int64_t file_io(SimCall call, int device, int fd, void* buf, std::size_t bytes, std::uint64_t offset) noexcept;

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace stitch
