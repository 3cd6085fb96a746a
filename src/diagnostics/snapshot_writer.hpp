// diagnostics/snapshot_writer.hpp — writes a stitch::Snapshot in PyTorch's memory-snapshot schema
// (what torch.cuda.memory._dump_snapshot() writes), as a pickle that PyTorch's memory viewer
// (pytorch.org/memory_viz, python -m torch.cuda._memory_viz) opens unchanged, or as JSON.
//
// Layout (key order as in PyTorch's files):
//   {'segments': [{'device', 'address', 'total_size', 'allocated_size', 'active_size',
//                  'requested_size', 'stream', 'segment_type', 'segment_pool_id': (0, 0),
//                  'is_expandable', 'frames': [...],
//                  'blocks': [{'address', 'size', 'requested_size', 'state', 'frames'}]}],
//    'device_traces': [[{'action', 'addr' (oom: 'device_free'), 'size', 'stream', 'time_us',
//                        'frames': [{'name', 'filename', 'line'}]}], ...],
//    'allocator_settings': {'PYTORCH_CUDA_ALLOC_CONF', 'max_split_size' (-1: unlimited),
//                           'garbage_collection_threshold', 'expandable_segments',
//                           'pinned_num_register_threads', 'release_lock_on_cudamalloc',
//                           'pinned_use_cuda_host_register', 'graph_capture_record_stream_reuse',
//                           'roundup_power2_divisions': {'1': d, '2': d, ..., '32768': d}},
//    'external_annotations': [],
//    'stitch': {'version', 'backend', 'config', 'device_count', 'format'}}   (ignored by viewers)
// Block frames are the stack of the block's allocation, segment frames that of its
// segment_alloc/segment_map, both taken from the trace when it has them. Blocks in the stitch-only
// state "unmapped" are left out (PyTorch does not report unmapped ranges).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "stitch/snapshot.hpp"

namespace stitch {
class Allocator;
}

namespace stitch::detail {

/// What the 'stitch' key says about the writer.
struct SnapshotMeta {
  std::string version = "0.1.0";
  std::string backend;  ///< "sim", "cuda"
  std::string config;   ///< Config::to_string()
  int device_count = 0;
};

/// One stack frame as PyTorch stores it.
struct FrameParts {
  std::string name;
  std::string filename;
  std::int64_t line = 0;
};
/// Splits stitch's "function (file)" / "function (file:line)" frame text. Text without a
/// "(file)" suffix becomes the name, with filename "??".
FrameParts split_frame(std::string_view frame);

/// Appends `raw` to `out` escaped for the inside of a JSON string literal (no quotes added):
/// quote, backslash and control characters escaped; invalid UTF-8 is replaced first.
void append_json_escaped(std::string& out, std::string_view raw);
/// append_json_escaped() into a new string.
inline std::string json_escape(std::string_view raw) {
  std::string out;
  append_json_escaped(out, raw);
  return out;
}

/// The snapshot as pickle bytes.
std::string snapshot_to_pickle(const Snapshot& snap, const SnapshotMeta& meta = {});
/// The snapshot as JSON text (same structure; the pool id tuple becomes a list).
std::string snapshot_to_json(const Snapshot& snap, const SnapshotMeta& meta = {});
/// True when `path` ends in ".json" (any case): dump_snapshot then writes JSON.
bool wants_json(std::string_view path) noexcept;
/// Writes the snapshot to `path` (JSON if wants_json(path), else pickle) through a temporary file
/// renamed into place. Throws stitch::error naming the path on failure.
void write_snapshot_file(const Snapshot& snap, const std::string& path, const SnapshotMeta& meta = {});

/// Called by Allocator::allocate when a request fails with out_of_memory: if the configuration
/// names an oom_snapshot path, dumps a snapshot there. Best effort: never throws; a failure is
/// reported on stderr.
void on_out_of_memory(const Allocator& allocator) noexcept;

}  // namespace stitch::detail
