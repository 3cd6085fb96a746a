// stitch/snapshot.hpp — the allocator's state and history in PyTorch's memory-snapshot model
// (torch.cuda.memory._snapshot()): segments with their blocks, per-device traces, settings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "stitch/export.hpp"

namespace stitch {

/// One block of a segment, as memory_viz shows it.
struct BlockSnapshot {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::size_t requested_size = 0;  ///< 0 for free blocks
  /// "active_allocated", "active_pending_free", "inactive", or (stitch only, expandable
  /// segments) "unmapped" — unmapped ranges are not reported as blocks in the PyTorch view.
  std::string state;
};

/// One segment: a device allocation, or one contiguous mapped range of an expandable segment
/// (PyTorch reports expandable segments that way).
struct SegmentSnapshot {
  int device = 0;
  std::uintptr_t address = 0;
  std::size_t total_size = 0;
  std::size_t allocated_size = 0;
  std::size_t active_size = 0;
  std::size_t requested_size = 0;
  std::uintptr_t stream = 0;
  std::string segment_type;  ///< "small" or "large"
  bool is_expandable = false;
  /// The private pool (CUDA graph or MemPool) it belongs to; (0, 0) for the device's own pools.
  std::pair<unsigned long long, unsigned long long> pool_id{0, 0};
  /// stitch only: the region tag of its memory ("" untagged), and whether it sleeps
  /// (stitch_sleep): its pages went back to the device, its blocks keep their addresses. Written
  /// to the snapshot only for tagged segments ("tag", "sleeping").
  std::string tag;
  bool sleeping = false;
  /// stitch only: bytes of it on host pages (spilled, stitch_spill; written as "spilled_bytes"
  /// when not 0). The memory stays at its addresses; reserved memory does not count it.
  std::size_t spilled_bytes = 0;
  /// stitch only: for a sleeping segment, the bytes of its blocks' backups in pinned host memory
  /// and in files of backup_dir (written as "backup_host_bytes" and "backup_file_bytes" when not
  /// 0; docs/sleep.md).
  std::size_t backup_host_bytes = 0;
  std::size_t backup_file_bytes = 0;
  std::vector<BlockSnapshot> blocks;
};

/// The recorder's actions, with PyTorch's names.
enum class TraceAction : int {
  alloc,
  free_requested,
  free_completed,
  segment_alloc,
  segment_free,
  segment_map,
  segment_unmap,
  oom,
  snapshot
};
STITCH_EXPORT const char* to_string(TraceAction action) noexcept;

/// One recorded event.
struct TraceEntry {
  TraceAction action = TraceAction::alloc;
  std::uintptr_t addr = 0;     ///< for oom: the device's free bytes (PyTorch's device_free)
  std::size_t size = 0;
  std::uintptr_t stream = 0;
  std::int64_t time_us = 0;    ///< microseconds since the epoch
  std::vector<std::string> frames;  ///< "function (file:line)" or raw addresses, innermost first
};

/// The whole picture for every device.
/// stitch only: a KV pool (docs/kv.md), written under the snapshot's "stitch" key.
struct KvPoolSnapshot {
  int device = 0;
  int id = 0;
  std::string tag;
  int buffers = 0;
  std::size_t block_bytes = 0, max_blocks = 0, page_bytes = 0;
  std::size_t live_blocks = 0, mapped_bytes = 0, used_bytes = 0;
  bool asleep = false;
};

struct Snapshot {
  std::vector<SegmentSnapshot> segments;
  std::vector<KvPoolSnapshot> kv_pools;  ///< stitch only: the KV pools of every device
  std::vector<std::vector<TraceEntry>> device_traces;  ///< one list per device, oldest first
  /// allocator_settings was present (newer PyTorch and stitch write it): the fields below are
  /// the recording's settings, not defaults.
  bool has_settings = false;
  std::string settings;        ///< the configuration as a `key:value,...` string
  std::size_t max_split_size = 0;   ///< SIZE_MAX when unlimited
  double garbage_collection_threshold = 0.0;
  bool expandable_segments = false;
  std::vector<std::uint32_t> roundup_power2_divisions;  ///< 16 intervals (1 MiB, 2 MiB, ...)
  /// Set when stitch wrote the snapshot (its `stitch` key): stitch's version and its whole
  /// configuration (Config::to_string(), or a generator's description).
  std::string stitch_version;
  std::string stitch_config;
};

}  // namespace stitch
