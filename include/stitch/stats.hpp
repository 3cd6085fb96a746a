// stitch/stats.hpp — per-device statistics under PyTorch's memory_stats() names.
#pragma once

#include "stitch/export.hpp"

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace stitch {

/// One statistic: its current value, its peak, and the running sums of increases and decreases.
struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;
  std::int64_t freed = 0;

  void increase(std::int64_t amount) noexcept {
    current += amount;
    allocated += amount;
    if (current > peak) peak = current;
  }
  void decrease(std::int64_t amount) noexcept {
    current -= amount;
    freed += amount;
  }
  void reset_peak() noexcept { peak = current; }
  void reset_accumulated() noexcept { allocated = freed = 0; }
};

/// Index into a StatArray: all pools, the small pool (<= 1 MiB) or the large pool.
enum StatPool : int { kAll = 0, kSmallPool = 1, kLargePool = 2 };
using StatArray = std::array<Stat, 3>;

/// Everything PyTorch's memory_stats() reports for one device.
struct STITCH_EXPORT DeviceStats {
  StatArray allocation;            ///< live allocations
  StatArray segment;               ///< device segments (cudaMalloc calls; expandable maps excluded)
  StatArray active;                ///< allocated blocks plus blocks waiting on stream events
  StatArray inactive_split;        ///< free blocks inside split segments
  StatArray allocated_bytes;       ///< bytes of allocated blocks (after rounding)
  StatArray reserved_bytes;        ///< bytes held from the device
  StatArray active_bytes;          ///< bytes of active blocks
  StatArray inactive_split_bytes;  ///< bytes of inactive_split blocks
  StatArray requested_bytes;       ///< bytes the callers asked for (before rounding)
  Stat oversize_allocations;       ///< live allocations of at least max_split_size
  Stat oversize_segments;          ///< segments of at least max_split_size
  /// Bytes of live blocks asleep (stitch_sleep): counted in allocated_bytes, not in
  /// reserved_bytes, whose pages went back to the device.
  Stat sleeping_bytes;
  /// Bytes of host pages mapped in the device's ranges (spilled, stitch_spill): the live blocks
  /// on them count in allocated_bytes; the pages count here, not in reserved_bytes.
  Stat spilled_bytes;
  /// Bytes of pages the KV pools (stitch_kv_create) map: device memory stitch holds, part of the
  /// large pool's reserved_bytes; their blocks are not allocations (not in allocated_bytes).
  Stat kv_bytes;
  /// Bytes of sleeping blocks' backups in files (backup_dir, sleep's disk tier): the part of
  /// their backups that pinned host memory did not take (docs/sleep.md).
  Stat backup_file_bytes;

  std::int64_t num_alloc_retries = 0;     ///< allocations that succeeded only after a cache flush
  std::int64_t num_ooms = 0;              ///< out-of-memory failures
  std::int64_t num_sync_all_streams = 0;  ///< times every outstanding event was waited for
  std::int64_t num_device_alloc = 0;      ///< device allocations (segments and page maps)
  std::int64_t num_device_free = 0;       ///< device frees (segments and page unmaps)
  std::int64_t num_invalid_frees = 0;     ///< rejected frees (unknown pointer, double free, ...)
  std::int64_t num_failed_frees = 0;      ///< frees of live blocks that failed with an error where
                                          ///< nothing may throw (PyTorch's DataPtr deleter and
                                          ///< raw_delete): warned about, the block leaked
  std::int64_t num_stitches = 0;          ///< stitched ranges made (stitching:True; each is one
                                          ///< reserve, one unmap per source run, one map per page)
  std::int64_t stitched_bytes = 0;        ///< bytes of the stitched ranges made, summed
  std::int64_t num_page_reuses = 0;       ///< grows served partly by moving the stream's free
                                          ///< pages (stitch_reuse_pages; each is one stream sync,
                                          ///< one unmap per source run, one map per page)
  std::int64_t num_page_borrows = 0;      ///< free parts of partly used coarse pages mapped a
                                          ///< second time into a stitched range (one map each;
                                          ///< lent until that range goes back whole)
  std::int64_t num_cache_hits = 0;        ///< allocations served under their stream's lock
                                          ///< alone (the cache hit: best fit found a free block
                                          ///< of the stream, nothing else was needed)
  std::int64_t num_compactions = 0;       ///< coarse pages emptied by compaction (stitch_compact;
                                          ///< each is one remap of the page's live granules)
  std::int64_t num_staged_compactions = 0;  ///< of those, staged through host memory (the device
                                            ///< had no room for the fresh pages)
  std::int64_t num_compactions_refused = 0;  ///< requests compaction left alone: emptying every
                                             ///< movable page could not have served them
  std::int64_t compacted_bytes = 0;       ///< live bytes compaction copied (whole granules)
  std::int64_t num_device_syncs = 0;      ///< device synchronizations (before compaction or a
                                          ///< sleep)
  std::int64_t num_sleeps = 0;            ///< stitch_sleep calls that put a range to sleep here
  std::int64_t num_wakes = 0;             ///< stitch_wake calls that woke a range here
  std::int64_t num_spills = 0;            ///< spills that moved memory to host pages here
                                          ///< (stitch_spill calls and the OOM ladder's rung)
  std::int64_t num_unspills = 0;          ///< unspills that brought host pages back here
  std::int64_t max_split_size = -1;       ///< the configured max_split_size (-1: unlimited)

  /// Looks a value up by its flat key, e.g. "reserved_bytes.all.peak" or "num_ooms".
  [[nodiscard]] std::optional<std::int64_t> get(std::string_view key) const;
  /// Calls `fn(key, value)` for every key, in a stable order.
  void for_each(const std::function<void(const std::string&, std::int64_t)>& fn) const;
  /// One statistic's key: its name, whether torch.cuda.memory_stats() has it, and whether
  /// stitch's memory_stats() (Python) returns it (PyTorch's keys and num_invalid_frees; stitch's
  /// other counters are read by name).
  struct Key {
    const char* name;
    bool torch;
    bool memory_stats;
  };
  /// Every key, in for_each's order (the one list of statistics).
  [[nodiscard]] static const std::vector<Key>& keys();
  /// Every value, in keys() order, into out[0, keys().size()).
  void values(std::int64_t* out) const;
  /// Sets every peak to its current value.
  void reset_peak() noexcept;
  /// Zeroes the running sums and the event counters (num_*).
  void reset_accumulated() noexcept;
};

}  // namespace stitch
