// tools/stitch_replay/fits.hpp — will a trace fit on a device of a given size, and which is the
// smallest that fits (stitch-replay --fits, --min-capacity): each config replayed once per size,
// the replays shared by both questions, and where the answers disagree (running out of memory is
// not always monotone in the device's size: stitch_fine_above is relative to it) both say so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tools/stitch_replay/oom_explain.hpp"
#include "tools/stitch_replay/replayer.hpp"

namespace stitch::replay_cli {

/// The device sizes `--fits` checks without a list: common GPUs' reported total memory less a
/// CUDA context of 512 MiB, in MiB (docs/fragmentation.md names the GPUs and the sources).
const std::vector<std::size_t>& common_gpu_sizes();

/// Parses "24GiB,40GiB,80GiB" (parse_size units). Throws stitch::error.
std::vector<std::size_t> parse_size_list(const std::string& text);

/// One replay of a config on a device of one size.
struct CapacityOutcome {
  std::size_t capacity = 0;
  bool fits = false;               ///< the trace ran without an OOM
  std::size_t peak_reserved = 0;   ///< at its peak
  std::size_t ooms = 0;
  std::optional<OomExplanation> first_oom;  ///< when it did not fit
  /// The answer disagrees with the smallest fitting device found by bisection: it fails at or
  /// above it, or fits below it ("" when they agree or no search was made).
  std::string note;
  /// capacity - peak reserved: the room left at the peak.
  [[nodiscard]] std::int64_t headroom() const {
    return static_cast<std::int64_t>(capacity) - static_cast<std::int64_t>(peak_reserved);
  }
};

/// The replays of one config of one trace on devices of several sizes, each size replayed once.
class CapacityProbe {
 public:
  CapacityProbe(const DeviceWorkload& trace, std::string config);
  /// The replay on a device of `capacity` bytes (made now unless made before).
  const CapacityOutcome& at(std::size_t capacity);
  /// The smallest multiple of `step` on which the trace replays without an OOM, by bisection
  /// between peak requested and `upper`, starting from what the replays made so far say (a
  /// size that fits bounds it from above, one that fails from below); nullopt if it does not
  /// fit in `upper`.
  /// `likely` (e.g. an unlimited replay's peak reserved) is tried first as the upper bound.
  std::optional<std::size_t> min_capacity(std::size_t upper, std::size_t step = std::size_t{2} << 20,
                                          std::optional<std::size_t> likely = std::nullopt);
  /// The outcomes for `sizes`, each checked against `min` (the bisection's answer, if any).
  std::vector<CapacityOutcome> fits(const std::vector<std::size_t>& sizes,
                                    std::optional<std::size_t> min = std::nullopt);
  [[nodiscard]] std::size_t replays() const noexcept { return done_.size(); }

 private:
  const DeviceWorkload& trace_;
  std::string config_;
  std::map<std::size_t, CapacityOutcome> done_;
};

/// CapacityProbe(trace, config).min_capacity(upper, step): the bisection alone.
std::optional<std::size_t> min_capacity(const DeviceWorkload& trace, const std::string& config,
                                        std::size_t upper, std::size_t step = std::size_t{2} << 20);

/// The note of an outcome that disagrees with `min` (see CapacityOutcome::note), or "".
std::string monotonicity_note(const CapacityOutcome& outcome, std::optional<std::size_t> min);

}  // namespace stitch::replay_cli
