// stitch/config.hpp — allocator settings and the parser for PyTorch's `key:value,...` syntax.
#pragma once

#include "stitch/export.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace stitch {

/// Which device implementation an allocator drives.
enum class BackendKind { cuda, sim };

/// What happens when the caller frees a pointer stitch does not own (or frees it twice).
enum class InvalidFreePolicy { error, abort };

/// Every setting of an allocator. Defaults match PyTorch's CUDACachingAllocator.
struct STITCH_EXPORT Config {
  static constexpr std::size_t kUnlimited = SIZE_MAX;

  // ---- fixed at construction ----
  BackendKind backend = BackendKind::cuda;          ///< backend:cuda|sim
  std::size_t sim_capacity_mb = 81920;              ///< sim_capacity_mb: per simulated device
  int sim_devices = 1;                              ///< sim_devices

  // ---- tunables (may change at run time) ----
  std::size_t max_split_size = kUnlimited;          ///< max_split_size_mb (>= 20), in bytes
  std::size_t max_non_split_rounding = 20u << 20;   ///< max_non_split_rounding_mb (>= 20), bytes
  /// roundup_power2_divisions per interval: index i covers sizes in [2^(20+i), 2^(21+i)) bytes,
  /// index 0 also everything below 1 MiB, index 15 everything from 32 GiB. 0 = no rounding.
  std::array<std::uint32_t, 16> roundup_power2_divisions{};
  double garbage_collection_threshold = 0.0;        ///< (0,1); 0 = off
  bool expandable_segments = false;                 ///< expandable_segments:True|False
  /// stitching:True|False — virtual-memory stitching (needs expandable_segments:True): pages
  /// are one allocation granule, and under memory pressure free pages from anywhere are
  /// remapped into one new contiguous range instead of failing (docs/stitching.md).
  bool stitching = false;
  /// stitch_before_grow_mb (stitching only; 0 = off): requests of at least this size are also
  /// stitched from their own stream's free pages *before* the device is asked for more, instead
  /// of only when it cannot give more. Lower reserved memory, at the price of a stream sync and
  /// one unmap per source run for each such stitch (docs/stitching.md).
  std::size_t stitch_before_grow = 0;
  /// stitch_reuse_pages:True|False (stitching only; True): when a range must grow, the
  /// stream's whole free pages elsewhere (both pools) are moved into it before fresh pages are
  /// mapped, so reserved memory grows only when no free page is left. Costs one stream sync
  /// and one unmap per source run each time pages move (docs/stitching.md).
  bool stitch_reuse_pages = true;
  /// stitch_fine_above (stitching only; 1): with room, stitching ranges grow in PyTorch's
  /// pages (20 MiB in the large pool), as expandable segments do, at their cost; once reserved
  /// memory would pass this share of what the device (or the memory fraction) allows, or the
  /// device cannot give a whole page, they grow in one-granule pages and reuse free pages
  /// (stitch_reuse_pages). Short of memory, a stitch also borrows the free start of coarse pages
  /// that live blocks share (maps it a second time). 1: fine pages only where a whole page
  /// does not fit; 0: fine pages always (docs/stitching.md).
  double stitch_fine_above = 1.0;
  /// stitch_compact:True|False (stitching only; False): when even the last stitch cannot serve a
  /// request, the live data of partly used coarse pages is copied into fresh one-granule pages
  /// mapped at the same addresses, so the whole coarse page becomes free to stitch
  /// (compaction: a device sync and a device copy, only on the path that would otherwise raise
  /// out of memory). Only ranges made with stitching are compacted. It relies on one rule: while
  /// an allocation runs, no other host thread launches work that touches stitch memory on that
  /// device (docs/stitching.md, "Compaction").
  bool stitch_compact = false;
  /// spill:off|tags|all (off; needs expandable_segments:True and a back end with host pages):
  /// the last rung of the out-of-memory ladder, after compaction. `tags` moves the live memory of
  /// region tags opened with STITCH_REGION_SPILL to host pages under the same addresses, coldest
  /// tag first; `all` may then move untagged live memory too, oldest pages first, never pinned or
  /// exported blocks. Moving untagged memory relies on the compaction rule: while an allocation
  /// runs, no other host thread launches work that touches that device's stitch memory
  /// (docs/spill.md).
  enum class Spill : std::uint8_t { off, tags, all };
  Spill spill = Spill::off;
  /// spill_limit_mb:N (0: no cap): the host memory spilled pages may take on each device.
  std::size_t spill_limit = 0;
  /// kv_page_mb:N (2): the page of a KV pool (stitch_kv_create), rounded up to the device's
  /// granularity. kv_reserve_mb:N (0): bytes of pages without live blocks each pool keeps mapped
  /// at empty_cache and stitch_trim (stitch_kv_trim and the out-of-memory ladder take them too).
  std::size_t kv_page = std::size_t{2} << 20;
  std::size_t kv_reserve = 0;
  /// kv_zero_page:True|False (False): a KV pool created meanwhile maps one shared read-only page
  /// (per device, counted once) under every slot without a page of its own, so that a stray read
  /// of an unused block reads what that page holds instead of faulting; where the back end cannot
  /// make a mapping read-only, pools leave unused slots unmapped (docs/kv.md). One map per slot
  /// and buffer at creation.
  bool kv_zero_page = false;
  /// peer_access:True|False (backend:cuda; False): with True, the memory of expandable
  /// segments and stitching is mapped readable and writable for every device that can access
  /// the owning one peer to peer (cuDeviceCanAccessPeer), so other GPUs' kernels and copies may
  /// use it (cudaDeviceEnablePeerAccess does not cover cuMemMap memory). With False only the
  /// owning device may touch it, as in PyTorch until it adds a peer. Plain cudaMalloc'd memory
  /// (no expandable segments) follows cudaDeviceEnablePeerAccess either way. Fixed at creation.
  bool peer_access = false;
  /// ipc:True|False (backend:cuda; True): physical memory is created exportable to other
  /// processes (POSIX file descriptors, and fabric handles where the driver grants them, retried
  /// without when it refuses; GPUDirect RDMA capable where supported), as PyTorch's expandable
  /// segments and ncclMemAlloc create it, so that IPC (stitch_ipc_export, torch.multiprocessing)
  /// and NCCL buffer registration work for memory of expandable segments and stitching. With
  /// False no handle type is requested and only cuMemAlloc'd memory (legacy cuIpcGetMemHandle)
  /// can be exported. Fixed at creation.
  bool ipc = true;
  /// sim_host_mb:N (backend:sim; 0): the host memory the simulated device's host pages (spill)
  /// and pinned host memory (sleep's backups) may take together, all devices; 0: no bound.
  /// Tests run out of host memory with it.
  std::uint64_t sim_host_mb = 0;
  /// backup_dir:PATH (none): sleep's disk tier (docs/sleep.md). Backups that pinned host memory
  /// cannot take (the host refuses, or backup_host_mb is reached) go to files in this directory,
  /// private to the process and gone when it ends; without it such a sleep fails. An absolute
  /// path: everything up to the next ',' (it may hold ':', brackets and spaces, not ',' or
  /// control characters); `none`: no disk tier. The allocator checks it when it is given (Allocator,
  /// stitch_configure: check_backup_dir in stitch/backend.hpp): a directory, created (0700) when
  /// missing, in which this process can create a file.
  std::string backup_dir;
  /// backup_dir_mb:N (0: the file system's free space): bytes the backup files of the process
  /// may hold, all devices together.
  std::size_t backup_dir_bytes = 0;
  /// backup_host_mb:N (0: no cap, what the host gives): pinned host memory the backups of the
  /// process (and their staging buffers) may take, all devices together; past it they go to
  /// backup_dir.
  std::size_t backup_host_bytes = 0;
  double per_process_memory_fraction = 1.0;         ///< [0,1]; 1 = no limit
  InvalidFreePolicy on_invalid_free = InvalidFreePolicy::error;  ///< on_invalid_free:error|abort

  // ---- diagnostics (may change at run time) ----
  bool record_history = false;                      ///< record_history:True|False
  std::size_t max_entries = 100000;                 ///< max_entries: trace ring-buffer size
  /// record_stacks: the stack stored with each history entry, as PyTorch's
  /// _record_memory_history(stacks=...): native frames (True or cpp), Python frames (python,
  /// taken when the allocating thread holds the GIL), both (all), or none (False).
  bool record_stacks = false;                       ///< native frames
  bool record_python_stacks = false;                ///< Python frames
  std::string oom_snapshot;                         ///< oom_snapshot:PATH — dump on OOM
  /// oom_what_if:True|False — on an out-of-memory failure, replay the device's workload on a
  /// fresh simulated device under other configurations (expandable segments, stitching) and
  /// name in the report those that served the request (docs/diagnostics.md).
  bool oom_what_if = true;

  /// The user's configuration as given: every `key:value` item parsed so far (STITCH_ALLOC_CONF,
  /// then each configure()), a later item for the same key replacing the earlier one in place,
  /// without the recorder's switches (record_history, max_entries, record_stacks). Snapshots
  /// report it as PYTORCH_CUDA_ALLOC_CONF.
  std::string source;

  /// Parses `conf` on top of `base`. Throws stitch::config_error naming the key and the accepted
  /// values for an unknown key or a bad value. An empty string returns `base` unchanged. The
  /// keys `conf` gives are appended to `given` (when not null), in order.
  static Config parse(std::string_view conf, const Config& base,
                      std::vector<std::string>* given = nullptr);
  static Config parse(std::string_view conf) { return parse(conf, Config{}); }

  /// The settings as a `key:value,...` string that parse() accepts.
  [[nodiscard]] std::string to_string() const;
};

/// Name of a backend kind ("cuda", "sim").
STITCH_EXPORT const char* to_string(BackendKind kind) noexcept;

}  // namespace stitch
