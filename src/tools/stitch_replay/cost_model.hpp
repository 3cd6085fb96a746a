// tools/stitch_replay/cost_model.hpp — what a replay's device calls would cost on a GPU: each kind of
// call (cudaMalloc, cudaFree, cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease,
// address reservations, stream synchronizations) counted in the replay and charged a cost per
// call plus, where the costs say so, per MiB. The defaults are published figures (sources in
// docs/fragmentation.md); `stitch-replay --costs FILE` takes others, e.g. the GPU check's own.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace stitch {
class SimBackend;
}

namespace stitch::replay_cli {

enum class CostCall : int {
  cuda_malloc,
  cuda_free,
  mem_create,
  mem_release,
  mem_map,
  mem_set_access,
  mem_unmap,
  address_reserve,
  address_free,
  stream_synchronize,
  device_copy,         ///< compaction's copies on the device (cuMemcpyDtoDAsync)
  host_copy,           ///< compaction's staging through the host (cuMemcpyDtoH and HtoD)
  device_synchronize,  ///< before compaction (cuCtxSynchronize)
  bus_copy,            ///< spill's copies to and from host pages, over the bus (cuMemcpyAsync)
  count_
};
inline constexpr std::size_t kCostCalls = static_cast<std::size_t>(CostCall::count_);

/// The name of a call kind in reports and cost files ("cudaMalloc", "cuMemMap", ...).
const char* cost_name(CostCall call) noexcept;

/// How many calls of each kind a replay made, and the bytes they covered.
struct CallCounts {
  std::array<std::uint64_t, kCostCalls> calls{};
  std::array<std::uint64_t, kCostCalls> bytes{};
  /// The simulated device's counters. cuMemSetAccess is charged once per run of maps (its
  /// bytes: the run's), as the CUDA back end grants access once over each run it maps.
  static CallCounts of(const SimBackend& sim);
};

struct CallCost {
  double per_call_us = 0.0;
  double per_mib_us = 0.0;
};

/// Costs per kind of call.
struct CostModel {
  std::array<CallCost, kCostCalls> costs{};
  std::string source;  ///< where the figures come from ("published", or the file)

  /// Published figures: kvcached's bench_vmm on an A100 (cuMemCreate 193.3 µs, cuMemMap 1.45 µs,
  /// cuMemSetAccess 36.0 µs, cuMemUnmap 25.6 µs per 2 MiB call), cudaMalloc about 50 µs and
  /// cudaFree about 10 µs, cuMemAddressReserve 19 µs; cuMemRelease about 5 µs and an idle
  /// stream synchronization 10 µs are estimates (docs/fragmentation.md, "Estimated device
  /// time").
  static CostModel published();
  /// Reads a cost file: a JSON object whose keys are call names, each a number (µs per call)
  /// or {"per_call_us": x, "per_mib_us": y}; calls it leaves out keep the published figure.
  /// Throws stitch::error naming the file for a bad file.
  static CostModel from_json(std::string_view text, std::string_view name);
  static CostModel from_file(const std::string& path);

  /// The estimated device time of `counts`, in microseconds.
  [[nodiscard]] double estimate_us(const CallCounts& counts) const noexcept;
};

}  // namespace stitch::replay_cli
