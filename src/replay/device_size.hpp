// replay/device_size.hpp — the device a recording ran on, as far as its trace tells: the rule that
// turns a recorded out-of-memory failure into the size of the simulated device a fidelity replay
// runs on (docs/fragmentation.md, "Runs that ran out of memory").
#pragma once

#include <cstddef>
#include <optional>

#include "replay/workload.hpp"

namespace stitch::replay {

/// The memory the recording allocator could hold on its device, implied by its first failed
/// request (`recorded_ooms`): what it held then plus what the device reported free
/// (cudaMemGetInfo, after PyTorch's out-of-memory ladder had given the cache back), rounded down
/// to `granularity`. Memory the allocator did not own (the CUDA context, other libraries and
/// processes) is in neither figure, so it is left out of the device as it was on the real one.
/// Never less than the most the recording held (it held it, so the device had room for it).
/// nullopt when the trace has no failed request. One rule per device trace.
std::optional<std::size_t> implied_capacity(const DeviceWorkload& workload,
                                            std::size_t granularity = std::size_t{2} << 20);

}  // namespace stitch::replay
