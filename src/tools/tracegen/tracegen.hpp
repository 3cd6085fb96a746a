// tools/tracegen/tracegen.hpp — a deterministic, seeded generator of synthetic allocation traces
// that imitate real training workloads known to fragment a caching allocator (changing sequence
// lengths, activation recomputation, LoRA, CPU offload, several streams, uneven MoE experts).
//
// The result is a stitch::Snapshot whose device_traces hold alloc / free_requested /
// free_completed events (no segments: it describes what a program asked for, not what some
// allocator did with it), with synthetic but plausible addresses, request sizes and streams. Write
// it with detail::write_snapshot_file to get a pickle in PyTorch's snapshot schema that
// stitch-replay and PyTorch's memory viewer read like a real torch.cuda.memory._dump_snapshot().
//
// Same pattern, seed and options: same events, byte for byte, on every platform (the generator
// uses its own random number generator and integer arithmetic only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "diagnostics/snapshot_writer.hpp"
#include "stitch/snapshot.hpp"

namespace stitch::tracegen {

struct Options {
  /// Training steps (iterations) to generate; 0: the pattern's default (10k-50k events).
  std::size_t steps = 0;
  /// Give every alloc event one stack frame naming the tensor ("transformer.h.3.mlp.c_fc
  /// (tracegen/transformer-varlen)"), so that the memory viewer shows what each block is.
  bool frames = true;
};

struct PatternInfo {
  std::string name;
  std::string summary;          ///< one line: what it imitates
  std::size_t default_steps = 0;
};

/// The patterns, in a fixed order.
const std::vector<PatternInfo>& patterns();

/// Generates `pattern`'s trace. Throws stitch::error for an unknown pattern (naming the known ones).
Snapshot generate(std::string_view pattern, std::uint64_t seed, const Options& options = {});

/// The steps generate() runs with these options (the pattern's default when options.steps is 0).
/// Throws stitch::error for an unknown pattern.
std::size_t steps_for(std::string_view pattern, const Options& options);

/// What the 'stitch' key of a generated file says: version "tracegen-1", backend "none" and, as
/// config, how to regenerate the file: "tracegen pattern:P,seed:N,steps:K" (",frames:False"
/// when frames are off).
stitch::detail::SnapshotMeta snapshot_meta(std::string_view pattern, std::uint64_t seed, const Options& options);

/// generate() written as a pickle with snapshot_meta(): the bytes stitch-tracegen writes.
std::string generate_pickle(std::string_view pattern, std::uint64_t seed, const Options& options = {});

}  // namespace stitch::tracegen
