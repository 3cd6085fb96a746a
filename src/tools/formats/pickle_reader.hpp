// tools/formats/pickle_reader.hpp — a safe reader for Python pickles of plain data, and the
// conversion of a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot) into a
// stitch::Snapshot.
//
// The reader interprets only the opcodes that build plain data: None, bool, int, float, str,
// bytes, list, tuple, dict, plus the memo and framing opcodes. It never imports, looks up or
// calls anything: GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ(_EX), EXT1/2/4,
// PERSID/BINPERSID and the out-of-band buffer opcodes are rejected with an error naming the
// offset and the opcode. The real PyTorch snapshots this was checked against (protocol 4, written
// by torch's pickler) use no such opcode, so the allow-list of "harmless constructs" is empty.
//
// Hostile input cannot exhaust the process: declared lengths are checked against the input before
// anything is allocated, nesting depth is bounded, and every value the reader builds is charged to
// a memory budget (PickleLimits). Containers fetched from the memo are shared, as in Python; a
// container that is referenced a second time (BINGET, DUP) can no longer be modified, which rules
// out reference cycles.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "diagnostics/py_value.hpp"
#include "stitch/snapshot.hpp"

namespace stitch::formats {

using detail::PyValue;

/// Limits for untrusted input.
struct PickleLimits {
  std::size_t max_depth = 256;                         ///< nesting of containers
  std::size_t max_memory = std::size_t{2} << 30;       ///< bytes charged for values (and the file)
  /// Dict keys whose values the caller never reads (a snapshot's "frames" for a replay): such a
  /// value becomes None as it is stored, and a list or tuple referenced nowhere else is emptied
  /// on the spot, so its memory (and its charge) goes at once. A later reference to that
  /// container sees it empty.
  std::vector<std::string> skip_keys;
};

/// Parses a pickle (protocol 0 to 5) of plain data. `name` prefixes error messages:
/// "NAME: offset N: message". Throws stitch::error.
PyValue read_pickle(std::string_view data, std::string_view name = "<pickle>",
                    const PickleLimits& limits = {});
/// Reads and parses a pickle file.
PyValue read_pickle_file(const std::string& path, const PickleLimits& limits = {});

/// How snapshot_from_pyvalue reads.
struct SnapshotReadOptions {
  /// Fail on trace entries whose action stitch does not model (old 'user_defined', 'annotate')
  /// instead of skipping them.
  bool strict = false;
  /// Convert stack frames (the bulk of a real snapshot's size); false leaves them empty.
  bool frames = true;
  /// Bounds what the conversion materializes (a sub-value shared N times counts N times).
  PickleLimits limits;
};

/// Converts a snapshot dict (PyTorch's schema, or stitch's, which is the same plus a 'stitch'
/// key) into a Snapshot. Missing optional keys (allocator_settings, time_us, frames, a block's
/// address) take defaults; a bare list is taken as the segments (as _memory_viz.py does). Frames
/// become "name (filename)" or "name (filename:line)". Throws stitch::error naming the file and
/// the path of the offending value, e.g. "x.pickle: segments[2].blocks[0].size: expected int,
/// got str".
Snapshot snapshot_from_pyvalue(const PyValue& root, std::string_view name = "<snapshot>",
                               const SnapshotReadOptions& options = {});
/// read_pickle_file + snapshot_from_pyvalue.
Snapshot read_snapshot_file(const std::string& path, const SnapshotReadOptions& options = {});

/// Parses a trace action name ("alloc", "segment_map", ...); false if unknown.
bool parse_trace_action(std::string_view name, TraceAction* out) noexcept;

}  // namespace stitch::formats
