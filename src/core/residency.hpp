// core/residency.hpp — where one device's region-tagged memory lives, and the moves between:
// the tags (names, used, asleep), sleep and wake of their ranges (core/sleeper.hpp does the pages
// and the backups), trim, and the residency report. The device's entry points for them, each
// under the device lock; it reaches the device's lock, cache and events through `device` (a
// friend of DeviceAllocator), so that DeviceAllocator keeps routing only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/sleeper.hpp"

namespace stitch {
class DeviceAllocator;
}

namespace stitch::detail {

class Residency {
 public:
  explicit Residency(DeviceAllocator& device);
  Residency(const Residency&) = delete;
  Residency& operator=(const Residency&) = delete;

  // ---- entry points (each takes the device lock) ------------------------------------------------
  /// Puts the `tags` used here and awake to sleep (the live blocks of the tags in `backup_tags`
  /// or allocated with backup keep their contents in host memory). Synchronizes the device and
  /// its peers first. Throws error while a graph may be captured (a route is underway, or a
  /// stream of the device captures), or while a block of the tags is pinned; see Sleeper::sleep
  /// for the rest. Returns whether anything was put to sleep.
  bool sleep(const std::vector<std::uint16_t>& tags, const std::vector<std::uint16_t>& backup_tags);
  /// Wakes the `tags` asleep here. On out of memory (after releasing the cache and trying again),
  /// nothing changes and the OOM report is returned (empty: woken, or nothing to wake).
  std::string wake(const std::vector<std::uint16_t>& tags, const std::string& names);
  /// `tag`'s name, for messages about it here (and the device lock taken once: it settles every
  /// thread's slot, as a region opens).
  void name_tag(std::uint16_t tag, const std::string& name);
  /// Whether `tag` is asleep / was ever used on this device.
  [[nodiscard]] bool asleep(std::uint16_t tag) const;
  [[nodiscard]] bool used(std::uint16_t tag) const;
  /// Gives back cached free memory until reserved memory is at most `keep` bytes or nothing more
  /// can go (empty_cache that stops when enough has gone).
  void trim(std::size_t keep);
  /// What is resident on this device, as a JSON object; `tag_name(tag)` names a tag.
  [[nodiscard]] std::string report(const std::function<std::string(std::uint16_t)>& tag_name);

  // ---- for the device, under its lock ---------------------------------------------------------------
  /// `tag`'s name for messages ("tag N" when it has none).
  [[nodiscard]] std::string tag_name(std::uint16_t tag) const;
  [[nodiscard]] const std::vector<std::string>& tag_names() const noexcept { return tag_names_; }
  [[nodiscard]] Sleeper& sleeper() noexcept { return sleeper_; }
  [[nodiscard]] const Sleeper& sleeper() const noexcept { return sleeper_; }

 private:
  /// Throws error when the device may not be synchronized for `what` (a sleep or a wake): a
  /// private-pool route is underway, or a stream of the device captures a graph.
  void refuse_while_capturing(const char* what);

  DeviceAllocator& d_;
  Sleeper sleeper_;
  std::vector<std::string> tag_names_;  ///< [tag]: names for messages (name_tag)
};

}  // namespace stitch::detail
