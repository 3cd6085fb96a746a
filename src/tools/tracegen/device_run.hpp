// tools/tracegen/device_run.hpp — a generated program run on a device of a given size, recorded
// the way PyTorch records one (stitch-tracegen --device-memory): the program's requests go through
// stitch with PyTorch's settings (its caching allocator's behaviour) on a simulated device, the
// history recorded, until a request fails; the snapshot is the one an out-of-memory handler
// calling torch.cuda.memory._dump_snapshot() would write: segments and segment events, the
// ladder's releases, the `oom` entry with the device's free memory, and the program's frames.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "stitch/snapshot.hpp"
#include "tools/tracegen/tracegen.hpp"

namespace stitch::tracegen {

struct DeviceRun {
  std::size_t memory = 0;  ///< the device's total memory (cudaMemGetInfo's total)
  /// Held on the device outside the allocator for the whole run: the CUDA context and the
  /// libraries' own memory (512 MiB, about what a context takes on a large GPU).
  std::size_t context = std::size_t{512} << 20;
  std::string alloc_conf;  ///< PYTORCH_CUDA_ALLOC_CONF-style settings ("" PyTorch's defaults)
};

/// Runs `program` (generate()'s requests) as described above. The snapshot is deterministic:
/// fixed device addresses (detail::SyntheticAddresses), no time stamps. If no request fails the
/// whole program runs and the snapshot is taken at its end. Throws stitch::error for a bad
/// alloc_conf.
Snapshot record_on_device(const Snapshot& program, const DeviceRun& run);

/// What the 'stitch' key of a recorded run's file says: snapshot_meta()'s, plus the device.
stitch::detail::SnapshotMeta device_run_meta(std::string_view pattern, std::uint64_t seed,
                                             const Options& options, const DeviceRun& run);

}  // namespace stitch::tracegen
