// diagnostics/memory_summary.hpp — torch.cuda.memory_summary()'s table for stitch's statistics,
// followed by stitch's own lines on free memory and fragmentation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "stitch/snapshot.hpp"
#include "stitch/stats.hpp"

namespace stitch::detail {

/// Free cached memory of one stream.
struct StreamFree {
  std::uintptr_t stream = 0;
  std::size_t bytes = 0;    ///< inactive (reusable) block bytes
  std::size_t blocks = 0;
  std::size_t largest = 0;  ///< largest inactive block
};

/// What the statistics do not say: where the free cached memory is, and in how many pieces.
struct SummaryExtras {
  std::size_t free_bytes = 0;           ///< inactive blocks, every stream
  std::size_t free_blocks = 0;
  std::size_t largest_free_block = 0;
  std::size_t pending_free_bytes = 0;   ///< freed, waiting for other streams (active_pending_free)
  std::size_t pending_free_blocks = 0;
  std::size_t segments = 0;             ///< snapshot segments (an expandable segment counts each mapped run)
  std::vector<StreamFree> per_stream;   ///< streams with free blocks, by stream handle
  std::size_t sleeping_segments = 0;    ///< snapshot segments of sleeping ranges (not counted above)
  std::vector<std::string> sleeping_tags;  ///< their tags, in order of appearance
  std::vector<KvPoolSnapshot> kv_pools;    ///< the device's KV pools (docs/kv.md)
};

/// Computes the extras of `device` from snapshot segments (Allocator::snapshot()).
SummaryExtras summary_extras(const std::vector<SegmentSnapshot>& segments, int device);

/// The summary: PyTorch's 75-column table (title "stitch CUDA memory summary, device ID N", the
/// OOM / cudaMalloc-retry line, the nine metric groups with all / large pool / small pool rows,
/// the two oversize rows, PyTorch's number formatting), then stitch's fragmentation section.
std::string memory_summary(const DeviceStats& stats, int device, const SummaryExtras& extras);

/// PyTorch's _format_size(sz, pref_sz): "   123 MiB" (10 characters; the unit follows pref_sz).
std::string summary_size(std::int64_t sz, std::int64_t pref_sz);
/// PyTorch's _format_count(cnt, pref_cnt): "    123   " (10 characters; K/M follow pref_cnt).
std::string summary_count(std::int64_t cnt, std::int64_t pref_cnt);

}  // namespace stitch::detail
