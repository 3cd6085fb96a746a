// tools/formats/rmm_csv.hpp — reads the log of RMM's logging_resource_adaptor
// (Thread,Time,Action,Pointer,Size,Stream) as a one-device trace in PyTorch's trace model.
#pragma once

#include <string_view>

#include "stitch/snapshot.hpp"

namespace stitch::formats {

/// Parses RMM CSV text into a snapshot with one device trace (alloc / free_requested; rows of
/// `allocate failure` are skipped) and no segments. `name` prefixes errors ("NAME: line N: ...");
/// throws stitch::error.
Snapshot snapshot_from_rmm_csv(std::string_view text, std::string_view name);

}  // namespace stitch::formats
