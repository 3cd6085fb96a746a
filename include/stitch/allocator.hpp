// stitch/allocator.hpp — the C++ API: a caching allocator object over one backend.
//
// An Allocator owns its caches and needs no process-wide state; several can coexist (each with
// its own backend). The C API (stitch.h) drives one process-wide Allocator.
#pragma once

#include "stitch/export.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "stitch/backend.hpp"
#include "stitch/block_info.hpp"
#include "stitch/config.hpp"
#include "stitch/errors.hpp"
#include "stitch/private_pool.hpp"
#include "stitch/snapshot.hpp"
#include "stitch/stats.hpp"

namespace stitch {

class DeviceAllocator;
namespace detail {
struct OomCapture;
struct StreamShard;
struct Block;
}  // namespace detail

/// A caching device allocator. Thread-safe: any thread may allocate and free on any device.
class STITCH_EXPORT Allocator {
 public:
  /// Builds the backend named by `config` (see make_backend()).
  explicit Allocator(const Config& config);
  /// Uses `backend` (config.backend and the sim_* keys are then ignored).
  Allocator(const Config& config, std::shared_ptr<Backend> backend);
  /// Returns every cached segment to the device. Blocks still allocated are leaked to the
  /// device (they stay valid until the backend is destroyed).
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  /// Allocates `bytes` on `device` for use on `stream`. Returns nullptr for 0 bytes.
  /// Throws stitch::out_of_memory (a std::bad_alloc) when the request cannot be served, and
  /// stitch::invalid_argument for a bad device.
  [[nodiscard]] void* allocate(std::size_t bytes, stream_t stream = nullptr, int device = 0);
  /// Allocates `bytes` on `device` for `stream` at exactly `addr`, cut from a free cached block
  /// of that stream that holds all of it (PyTorch's allocateWithAddress; cudagraph trees restore
  /// a pool's checkpoint with it). The block is `block_bytes` long (0: `bytes` rounded as
  /// allocate() rounds). Returns nullptr, with nothing changed, where no such free block is.
  /// Throws invalid_argument for an address not 512-byte aligned or a bad device.
  [[nodiscard]] void* allocate_at(void* addr, std::size_t bytes, stream_t stream, int device,
                                  std::size_t block_bytes = 0);
  /// Frees a pointer returned by allocate(); its last use was on its allocation stream. The
  /// device is found from the pointer. Throws stitch::invalid_argument (and counts
  /// num_invalid_frees) for an unknown pointer or a double free, leaving everything else intact.
  /// nullptr is ignored.
  void deallocate(void* ptr);
  /// As deallocate(ptr), where `stream` is the stream of the last use: if it is not the
  /// allocation stream the block is reused only after that stream's work up to now completes.
  void deallocate(void* ptr, stream_t stream);
  /// As deallocate(), also checking that `bytes` is the size requested and `device` the device
  /// the pointer was allocated on (PyTorch's free hook passes both).
  void deallocate(void* ptr, std::size_t bytes, int device, stream_t stream);
  /// Counts num_failed_frees on the device of the live block at `ptr`: a free of it failed where
  /// nothing may throw (a destructor) and the caller leaks the block. False (nothing counted)
  /// where no live block starts at `ptr` or the allocator refuses (a forked child). Never throws.
  bool count_failed_free(void* ptr) noexcept;
  /// Marks `ptr` as used on `stream`: after it is freed, the block is reused only once the work
  /// queued on `stream` up to the free has completed.
  void record_stream(void* ptr, stream_t stream);
  /// Pins the live allocation at `ptr`: until as many unpin() calls, the physical memory under
  /// it never moves (stitch_compact leaves its whole page alone), for memory registered with a
  /// NIC (GPUDirect RDMA) or NCCL, or exported. Throws stitch::invalid_argument for an unknown
  /// pointer, or an unpin without a pin.
  void pin(void* ptr);
  void unpin(void* ptr);

  // ---- memory other processes map (IPC; docs/ipc.md) ------------------------------------------
  /// A printable handle for the live block at `ptr`, which import_block() maps in another process
  /// (or in this one): the block's pages are shared, not copied. From now until it is freed the
  /// block is pinned (compaction never moves it, sleep refuses its tag). The exporter must keep
  /// it allocated until every importer has closed it. Throws invalid_argument when `ptr` does not
  /// start a live block, or when the handle would take `max_chars` characters or more (then the
  /// block is not pinned), backend_error where its memory cannot be shared.
  [[nodiscard]] std::string export_block(void* ptr, std::size_t max_chars = SIZE_MAX);
  /// The most characters export_block's handle for `ptr` can take: a size query that pins nothing
  /// and exports nothing. Throws as export_block does for a pointer that starts no live block.
  [[nodiscard]] std::size_t export_size(void* ptr);
  /// Maps the block `handle` names on `device` of this process; returns its address here.
  /// Throws invalid_argument for a malformed handle, backend_error when the memory cannot be
  /// mapped (the exporter ended, another back end wrote the handle).
  [[nodiscard]] void* import_block(std::string_view handle, int device);
  /// Unmaps a block import_block() returned. Throws invalid_argument for any other pointer.
  void close_block(void* ptr);

  /// Returns every entirely free cached segment of `device` (-1: of every device) to the device,
  /// after waiting for the streams that used them.
  void empty_cache(int device = -1);
  /// Gives back cached free memory of `device` (-1: of every device) until its reserved memory
  /// is at most `keep_bytes`, or nothing more can go: empty_cache() that stops when enough has
  /// gone (in whole free segments, and in the whole pages of free blocks).
  void trim(int device, std::size_t keep_bytes);

  // ---- region tags, sleep and wake (docs/sleep.md) ---------------------------------------------
  /// Opens a region on the calling thread: until its end_region(), the thread's allocations from
  /// this allocator, on every device, carry `tag`. Regions nest (the innermost wins); other
  /// threads' allocations are not tagged. Tagged memory lies in expandable ranges of its own,
  /// whatever the configuration says for untagged memory, and its pages never serve another tag.
  /// `flags` (a bit set, as stitch_region_begin's): kRegionBackup: the live blocks allocated in
  /// it are copied to host memory at every sleep and back at the wake (per allocation);
  /// kRegionSpill: the tag's memory may move to host pages (stitch_spill, spill:tags): once a
  /// region opens a tag with it, the whole tag may spill, whichever region allocated its blocks.
  /// Throws invalid_argument for an empty tag, one with a comma, or unknown flags.
  void begin_region(std::string_view tag, unsigned flags = 0);
  static constexpr unsigned kRegionBackup = 1;  ///< STITCH_REGION_BACKUP
  static constexpr unsigned kRegionSpill = 2;   ///< STITCH_REGION_SPILL
  /// Closes the calling thread's innermost region of this allocator. Throws invalid_argument
  /// when none is open.
  void end_region();
  /// A region for the life of a scope.
  class Region {
   public:
    Region(Allocator& allocator, std::string_view tag, unsigned flags = 0) : allocator_(allocator) {
      allocator.begin_region(tag, flags);
    }
    ~Region() {
      try {
        allocator_.end_region();
      } catch (...) {
      }
    }
    Region(const Region&) = delete;
    Region& operator=(const Region&) = delete;

   private:
    Allocator& allocator_;
  };
  /// Puts the tags in `tags` (comma-separated; nullopt: every tag) to sleep on `device` (-1: every
  /// device): synchronizes the device and its peers, copies the live blocks of regions with
  /// backup, and of the tags in `backup_tags`, to pinned host memory (what the host or
  /// backup_host_mb does not take, to files of backup_dir), then unmaps every page of the tags'
  /// ranges and gives it back; the addresses stay reserved. A tag asleep already is left alone.
  /// Throws invalid_argument for a tag never used, stitch::error while a graph is being captured
  /// on the device, out_of_memory when the host (and the backup files' room) cannot hold the
  /// backups, and backend_error (a file that cannot be written, named with the offset); each
  /// device is all or nothing, and the message says which devices sleep.
  void sleep(int device = -1, std::optional<std::string_view> tags = std::nullopt,
             std::string_view backup_tags = {});
  /// Wakes the tags in `tags` (nullopt: every sleeping tag) on `device` (-1: every device): fresh
  /// pages at the same addresses, the backups copied back. Throws out_of_memory with the report
  /// when the device cannot give the pages, backend_error when a backup file cannot be read
  /// (naming it, the offset and the size): nothing changed on that device, the tags stay asleep
  /// with their backups, and the wake may be retried.
  void wake(int device = -1, std::optional<std::string_view> tags = std::nullopt);
  /// How far the sleep or wake running on a device is: `op` 1 a sleep, 2 a wake, 0 none; the
  /// bytes of backups copied out or back so far, of `total`.
  struct BackupProgress {
    int op = 0;
    std::uint64_t done = 0;
    std::uint64_t total = 0;
  };
  /// The progress of the sleep or wake running on `device` now (read without waiting for it:
  /// from another thread while stitch_sleep runs).
  [[nodiscard]] BackupProgress backup_progress(int device) const;
  /// Moves the live memory of the tags in `tags` (comma-separated; nullopt: every tag opened with
  /// kRegionSpill) on `device` (-1: every device) to host pages under the same addresses: all of
  /// it (`bytes` 0) or at least `bytes` per device, coldest tag first; the free device pages of
  /// their ranges go back to the device. All or nothing per device: out_of_memory when the host
  /// (or spill_limit_mb) cannot take it; invalid_argument for a tag never used or not spillable;
  /// stitch::error while a graph is captured or where the back end has no host pages. Returns
  /// the bytes moved (docs/spill.md).
  std::size_t spill(int device = -1, std::optional<std::string_view> tags = std::nullopt,
                    std::size_t bytes = 0);
  /// Brings the spilled memory of `tags` (nullopt: everything spilled, untagged too) on `device`
  /// (-1: every device) back to device pages, range by range, releasing cached free memory first
  /// when the device has no room. Throws out_of_memory naming what stays on the host.
  void unspill(int device = -1, std::optional<std::string_view> tags = std::nullopt);
  /// What is resident on `device` (-1: every device) as JSON: untagged live and cached memory,
  /// private pools, each tag awake, spilled or asleep, the host pages and backups.
  [[nodiscard]] std::string residency(int device = -1) const;
  /// The tag of the calling thread's innermost region of this allocator ("" when none).
  [[nodiscard]] std::string current_region() const;

  /// Caps what `device` may reserve at `fraction` of its capacity (1.0 removes the cap).
  void set_memory_fraction(double fraction, int device);
  /// Applies tunables from a `key:value,...` string. Keys fixed at construction (backend,
  /// sim_capacity_mb, sim_devices) may only be repeated with their current value. Safe to call
  /// while other threads use the allocator (calls are serialised).
  void configure(std::string_view conf);

  /// A copy of `device`'s statistics.
  [[nodiscard]] DeviceStats stats(int device) const;
  /// One statistic by flat key ("allocated_bytes.all.current"); nullopt if the key is unknown.
  [[nodiscard]] std::optional<std::int64_t> stat(int device, std::string_view key) const;
  void reset_peak_stats(int device);
  void reset_accumulated_stats(int device);
  /// `device`'s reserved-memory cap as a fraction of its capacity (set_memory_fraction, or the
  /// per_process_memory_fraction key); 1 without a cap.
  [[nodiscard]] double memory_fraction(int device) const;

  /// Private pools, as PyTorch's CUDA graphs and MemPools use them (stitch/private_pool.hpp).
  /// Until end_allocate_to_pool(device, id), `device`'s allocations on the streams `filter`
  /// accepts come from private pool `id` (created at the first call, each call one use of it),
  /// and nothing on the device queries an event, synchronizes or returns memory: a stream may be
  /// capturing a CUDA graph. Routes nest; the newest that accepts a stream takes it.
  void begin_allocate_to_pool(int device, PoolId id, StreamFilter filter);
  /// Ends the newest route to `id`; events of blocks freed meanwhile on other streams are
  /// recorded at the first allocation (or empty_cache) once no route is left.
  void end_allocate_to_pool(int device, PoolId id);
  /// Drops one use of pool `id`. Once it has none, its memory goes back to the device whenever
  /// all of its blocks are free and no route is underway (at once, or at a later empty_cache or
  /// out-of-memory retry). Throws invalid_argument for a pool not in use.
  void release_pool(int device, PoolId id);
  /// Pool `id`'s free blocks serve requests whole from now on, never split (PyTorch's
  /// setNoSplit). Throws invalid_argument for a pool not in use.
  void set_pool_no_split(int device, PoolId id);

  /// What stitch knows about a live allocation (stitch/block_info.hpp).
  using BlockInfo = stitch::BlockInfo;
  /// The live allocation starting at `ptr` (interior pointers are not found).
  [[nodiscard]] std::optional<BlockInfo> find(const void* ptr) const;

  /// The segments, blocks and recorded history of every device (PyTorch's snapshot model).
  /// Records a `snapshot` trace entry when recording is on.
  [[nodiscard]] Snapshot snapshot() const;
  /// Writes snapshot() to `path` in PyTorch's format: a pickle that pytorch.org/memory_viz and
  /// `python -m torch.cuda._memory_viz` open, or the same structure as JSON when `path` ends in
  /// ".json". Throws stitch::error if the file cannot be written.
  void dump_snapshot(const std::string& path) const;
  /// torch.cuda.memory_summary() for `device` (75-column table of stats(device)), followed by
  /// stitch's lines on free cached memory: reserved-but-unallocated, largest free block, free
  /// bytes per stream, blocks waiting for other streams.
  [[nodiscard]] std::string memory_summary(int device) const;
  /// Calls `observer(device, entry)` with every trace event of every device from now on (frames
  /// left empty), whether or not the history is kept; an empty function stops it. It runs under
  /// the device's lock: it must not call the allocator. What it throws is ignored. While it is
  /// set, every request takes the device lock (as while the history is recorded).
  void set_trace_observer(std::function<void(int device, const TraceEntry& entry)> observer);
  /// The largest request that would succeed on `device` now without freeing live memory: the
  /// largest free block, the room the device and the memory fraction still give, or (stitching)
  /// the pages a stitch would find (PyTorch's cacheInfo, which cuDNN sizes workspaces by).
  [[nodiscard]] std::size_t largest_request(int device) const;
  /// The segments of `device` (-1: of every device) with their blocks, as snapshot() has them,
  /// without a trace entry.
  [[nodiscard]] std::vector<SegmentSnapshot> segments(int device = -1) const;
  /// The segment (device allocation, or mapped run of an expandable range) holding `ptr`: its
  /// base and size; nullopt when no segment of this allocator holds it.
  [[nodiscard]] std::optional<std::pair<void*, std::size_t>> segment_of(const void* ptr) const;

  /// Turns the allocation history on or off on every device (as configure("record_history:...,
  /// max_entries:N") would), keeping up to `max_entries` events per device (0: keep the current
  /// max_entries). Turning it off discards the history.
  void record_history(bool enabled, std::size_t max_entries = 0);

  /// Checks every internal invariant of every device (block chains tile their segments, no two
  /// blocks overlap, the free index holds exactly the free blocks, statistics equal a recount).
  /// Throws stitch::error describing the first violation.
  void validate() const;

  [[nodiscard]] int device_count() const noexcept;
  /// A copy of the current settings (configure() may change them from another thread).
  [[nodiscard]] Config config() const;
  [[nodiscard]] Backend& backend() const noexcept { return *backend_; }

  /// The per-device allocator (for diagnostics).
  [[nodiscard]] DeviceAllocator& device(int device) const;

  // ---- for the entry points' cache hit (src/api/entry.hpp): internal, not for programs ------
  /// The per-device allocator of `device`, or nullptr where there is none.
  [[nodiscard]] DeviceAllocator* device_or_null(int device) const noexcept {
    // (one unsigned comparison: a negative device is a large one)
    if (static_cast<unsigned>(device) >= static_cast<unsigned>(device_count_)) [[unlikely]] return nullptr;
    DeviceAllocator* d = devices_[static_cast<std::size_t>(device)].get();
    if (d == nullptr) __builtin_unreachable();  // (every device has one: no test for it)
    return d;
  }
  /// allocate() on `d` after the cache hit declined; `plain`: its plain path ran (else nothing
  /// of it did).
  [[nodiscard]] void* allocate_unhit(DeviceAllocator& d, bool plain, std::size_t bytes, stream_t stream);
  /// deallocate(ptr, bytes, home's device, stream) after the pair declined: the cache hit's plain
  /// path where the pair found the live block `found` (and kept its shard's lock), then the
  /// device lock.
  [[gnu::noinline]] void deallocate_unhit(DeviceAllocator& home, detail::Block* found, void* ptr,
                                          std::size_t bytes, stream_t stream);

  // ---- for stitch::KvPool (src/api/kv_pool.cpp): internal, not for programs -----------------
  /// The id of region tag `name` (1..), registered when `create`; 0 when unknown.
  std::uint16_t tag_id(std::string_view name, bool create);

 private:
  DeviceAllocator& checked_device(int device) const {
    if (DeviceAllocator* d = device_or_null(device)) [[likely]] return *d;
    throw_bad_device(device);
  }
  [[noreturn]] void throw_bad_device(int device) const;
  void free_any_device(void* ptr, const stream_t* stream);
  /// free_any_device() where `device`'s pair found its live block `found` and kept its shard
  /// lock, but declined: the plain path, else free_any_device_locked().
  [[gnu::noinline]] void free_any_device_unhit(void* ptr, const stream_t* stream, int device,
                                               detail::Block* found);
  /// free_any_device() past the cache hit: each device's hit again, waiting for the shard lock
  /// (`hits_again`: no pair found the block, or a shard lock was busy), then each device lock.
  [[gnu::noinline]] void free_any_device_locked(void* ptr, const stream_t* stream, bool hits_again);
  [[noreturn]] void reject_free(DeviceAllocator& counter, std::string message) const;
  /// deallocate(ptr, bytes, device, stream) found no such allocation on `device` (or one of
  /// another size, `wrong_size`): says why (wrong size, another device, unknown) and throws.
  [[noreturn, gnu::noinline]] void reject_sized_free(DeviceAllocator& home, bool wrong_size, void* ptr,
                                                     std::size_t bytes, int device,
                                                     std::size_t actual) const;
  /// allocate() failed: the oom_snapshot dump, the what-if check, then the report is thrown.
  /// (Takes ownership of `failure`.)
  [[noreturn, gnu::noinline]] void fail_allocation(detail::OomCapture* failure);
  /// configure() with config_mutex_ held.
  void configure_locked(std::string_view conf);
  [[nodiscard]] std::string tag_name(std::uint16_t id) const;
  /// The ids of a comma-separated list of tags, each of which must have been used on some
  /// device (nullopt: every tag known). Throws invalid_argument naming an unknown one.
  std::vector<std::uint16_t> tag_list(std::optional<std::string_view> names, const char* what);

  mutable std::mutex config_mutex_;  ///< guards config_ (read by snapshots, OOM and free paths)
  Config config_;
  std::shared_ptr<Backend> backend_;
  std::unique_ptr<std::unique_ptr<DeviceAllocator>[]> devices_;
  struct Imported {
    int device;
    void* base;
    std::size_t bytes;
    std::size_t opens;  ///< imports at this address (a legacy CUDA handle opened again maps there)
  };
  std::mutex imports_mutex_;                 ///< guards imports_
  std::map<void*, Imported> imports_;        ///< import_block() results: address -> mapping
  mutable std::mutex tags_mutex_;        ///< guards tag_names_
  std::vector<std::string> tag_names_;   ///< [id - 1]
  int device_count_ = 0;
};

/// The C API's process-wide allocator (stitch.h), built at first use from STITCH_ALLOC_CONF and
/// the stitch_configure() strings given before it (the one PyTorch's hooks and libstitch_torch
/// serve from). Throws what building it throws.
STITCH_EXPORT Allocator& process_allocator();

}  // namespace stitch
