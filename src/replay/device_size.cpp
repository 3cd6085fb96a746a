// replay/device_size.cpp — the device size a recorded out-of-memory failure implies.
#include "replay/device_size.hpp"

#include <algorithm>

namespace stitch::replay {

std::optional<std::size_t> implied_capacity(const DeviceWorkload& w, std::size_t granularity) {
  if (w.recorded_ooms.empty()) return std::nullopt;
  const RecordedOom& first = w.recorded_ooms.front();
  const std::size_t device = (first.reserved + first.device_free) / granularity * granularity;
  const std::size_t held = w.recorded_peak_reserved.value_or(w.reserved_at_start);
  return std::max(device, (held + granularity - 1) / granularity * granularity);
}

}  // namespace stitch::replay
