// core/residency.hpp — where one device's memory lives, and the moves between: each range's
// pages are on the device, on the host and mapped (spilled), in a host backup and unmapped
// (asleep), or nowhere. The tags (names, used, asleep, spillable, when last used), sleep and wake
// of their ranges (core/sleeper.hpp does the pages and the backups), spill and unspill of tagged
// and untagged ranges (core/spiller.hpp), trim, and the residency report. The device's entry
// points for them, each under the device lock, over the view of the device it is handed
// (core/device_view.hpp) and its KV pools (whose pages sleep, wake and spill with their tags).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/device_view.hpp"
#include "core/sleeper.hpp"
#include "core/spiller.hpp"

namespace stitch::detail {

class KvPools;

class Residency {
 public:
  Residency(const DeviceView& device, KvPools& kv);
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
  /// thread's slot, as a region opens); `spill`: the region was opened with STITCH_REGION_SPILL,
  /// so the tag's memory may move to host pages from now on.
  void name_tag(std::uint16_t tag, const std::string& name, bool spill = false);
  /// Whether `tag` may spill (was opened with STITCH_REGION_SPILL).
  [[nodiscard]] bool spillable(std::uint16_t tag) const;
  /// Moves the live memory of `tags` (each spillable) to host pages under the same addresses: all
  /// of it (`bytes` 0) or at least `bytes`, coldest tag first; all or nothing (out_of_memory when
  /// the host or spill_limit_mb refuses, or when less than `bytes` can move). Synchronizes the
  /// device and its peers first. Throws error while a graph may be captured, and when the back
  /// end has no host pages. Returns the bytes moved.
  std::size_t spill(const std::vector<std::uint16_t>& tags, std::size_t bytes, const std::string& names);
  /// Brings the spilled memory of `tags` (`all`: of every range, untagged too) back to device
  /// pages, releasing the cache first when the device has no room. The OOM text naming what
  /// stays on the host, or empty when everything is back.
  std::string unspill(const std::vector<std::uint16_t>& tags, bool all);
  /// Whether `tag` was ever used on this device.
  [[nodiscard]] bool used(std::uint16_t tag) const;
  /// Gives back cached free memory until reserved memory is at most `keep` bytes or nothing more
  /// can go (empty_cache that stops when enough has gone).
  void trim(std::size_t keep);
  /// What is resident on this device, as a JSON object; `tag_name(tag)` names a tag.
  [[nodiscard]] std::string report(const std::function<std::string(std::uint16_t)>& tag_name);

  // ---- for the device, under its lock ---------------------------------------------------------------
  /// The out-of-memory ladder's last rung (spill:tags|all): moves cold memory to host pages, a
  /// mapping at a time, until `retry()` serves the request; nullptr when nothing more can move.
  detail::Block* spill_for_request(const std::function<detail::Block*()>& retry);
  /// A free left host pages of `segment` wholly free: they go back to the host.
  void release_freed(Segment& segment) noexcept;
  /// After empty_cache: spilled memory comes back while the device has room (errors dropped).
  void unspill_with_room() noexcept;
  /// Bytes a spill could move now under `mode` (the OOM report's what-if; no device call).
  [[nodiscard]] std::size_t spillable_bytes(Config::Spill mode);
  /// `tag`'s name for messages ("tag N" when it has none).
  [[nodiscard]] std::string tag_name(std::uint16_t tag) const;
  [[nodiscard]] const std::vector<std::string>& tag_names() const noexcept { return tag_names_; }
  [[nodiscard]] Sleeper& sleeper() noexcept { return sleeper_; }
  [[nodiscard]] const Sleeper& sleeper() const noexcept { return sleeper_; }

 private:
  /// Throws error when the device may not be synchronized for `what` (a sleep or a wake): a
  /// private-pool route is underway, or a stream of the device captures a graph.
  void refuse_while_capturing(const char* what);

  /// The ranges a spill under `mode` takes from, in order: spillable tags' ranges, coldest tag
  /// first (least recently allocated or woken), then with `all` the untagged ranges.
  std::vector<Segment*> spill_order(Config::Spill mode, const std::vector<std::uint16_t>* tags);
  /// Waits for the device (and its peers) and retires the events that completed.
  void settle_device(bool peers);

  const DeviceView& d_;
  KvPools& kv_;
  Sleeper sleeper_;
  Spiller spiller_;
  std::vector<std::string> tag_names_;  ///< [tag]: names for messages (name_tag)
};

}  // namespace stitch::detail
