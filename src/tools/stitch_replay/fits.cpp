// tools/stitch_replay/fits.cpp — replays on devices of given sizes, shared by --fits and
// --min-capacity.
#include "tools/stitch_replay/fits.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "replay/engine.hpp"
#include "stitch/errors.hpp"
#include "tools/stitch_replay/report.hpp"

namespace stitch::replay_cli {

namespace {
constexpr std::size_t kMiB = std::size_t{1} << 20;
}  // namespace

const std::vector<std::size_t>& common_gpu_sizes() {
  // Reported total memory (MiB) less a 512 MiB CUDA context, rounded down to 2 MiB: the GPUs
  // and the sources are in docs/fragmentation.md ("Fits on which GPU").
  static const std::vector<std::size_t> sizes = {14396 * kMiB, 22066 * kMiB, 40024 * kMiB,
                                                 44974 * kMiB, 80496 * kMiB, 142642 * kMiB};
  return sizes;
}

std::vector<std::size_t> parse_size_list(const std::string& text) {
  std::vector<std::size_t> out;
  std::size_t from = 0;
  while (from <= text.size()) {
    const auto comma = text.find(',', from);
    const std::string item = text.substr(from, comma == std::string::npos ? std::string::npos : comma - from);
    if (item.empty()) throw error(fmt::format("bad size list '{}' (example: 24GiB,40GiB)", text));
    out.push_back(parse_size(item));
    if (out.back() == 0) throw error(fmt::format("bad size '{}' in '{}'", item, text));
    if (comma == std::string::npos) break;
    from = comma + 1;
  }
  return out;
}

CapacityProbe::CapacityProbe(const DeviceWorkload& trace, std::string config)
    : trace_(trace), config_(std::move(config)) {}

const CapacityOutcome& CapacityProbe::at(std::size_t capacity) {
  if (auto it = done_.find(capacity); it != done_.end()) return it->second;
  CapacityOutcome out;
  out.capacity = capacity;
  Setup setup;
  setup.config = Config::parse(config_.empty() ? "backend:sim" : "backend:sim," + config_);
  setup.capacity = capacity;
  setup.on_oom = [&](const Replay& run, const ReplayOom& oom) {
    if (!out.first_oom) out.first_oom = explain_oom(run, oom);
  };
  Replay run(trace_, setup);
  run.run();
  out.ooms = run.failures();
  out.fits = out.ooms == 0;
  out.peak_reserved = static_cast<std::size_t>(run.stats().reserved_bytes[kAll].peak);
  return done_.emplace(capacity, std::move(out)).first->second;
}

std::optional<std::size_t> CapacityProbe::min_capacity(std::size_t upper, std::size_t step,
                                                       std::optional<std::size_t> likely) {
  upper = (upper + step - 1) / step * step;
  if (likely) {
    const std::size_t guess = (*likely + step - 1) / step * step;
    if (guess < upper) (void)at(guess);  // a device that large usually runs as the unlimited one
  }
  // Bounds, in steps: lo fails (or is 0), hi fits. Below peak requested nothing fits.
  std::size_t lo = std::max<std::size_t>(peak_requested(trace_) / step, 1) - 1;
  std::size_t hi = upper / step;
  for (const auto& [capacity, o] : done_) {
    if (capacity % step != 0 || capacity > upper) continue;  // only sizes the bisection could try
    if (o.fits) hi = std::min(hi, capacity / step);
  }
  for (const auto& [capacity, o] : done_)
    if (capacity % step == 0 && !o.fits && capacity / step < hi) lo = std::max(lo, capacity / step);
  if (!at(hi * step).fits) return std::nullopt;  // upper itself, when nothing smaller fitted
  while (hi - lo > 1) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (at(mid * step).fits) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return hi * step;
}

std::optional<std::size_t> min_capacity(const DeviceWorkload& trace, const std::string& config,
                                        std::size_t upper, std::size_t step) {
  return CapacityProbe(trace, config).min_capacity(upper, step);
}

std::string monotonicity_note(const CapacityOutcome& o, std::optional<std::size_t> min) {
  if (!min) return "";
  if (!o.fits && o.capacity >= *min)
    return fmt::format("runs out although the smallest fitting device found is {}: OOM is not "
                       "monotone in capacity here", human_size(*min));
  if (o.fits && o.capacity < *min)
    return fmt::format("fits although below the smallest fitting device found ({}): OOM is not "
                       "monotone in capacity here", human_size(*min));
  return "";
}

std::vector<CapacityOutcome> CapacityProbe::fits(const std::vector<std::size_t>& sizes,
                                                 std::optional<std::size_t> min) {
  std::vector<CapacityOutcome> out;
  for (std::size_t s : sizes) {
    CapacityOutcome o = at(s);
    o.note = monotonicity_note(o, min);
    out.push_back(std::move(o));
  }
  return out;
}

}  // namespace stitch::replay_cli
