// api/allocator_regions.cpp — Allocator's region tags: the per-thread region stack, the tag
// names, tagged allocations, and sleep, wake, trim and residency over the devices.
#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "core/device_allocator.hpp"
#include "core/region_stack.hpp"
#include "stitch/allocator.hpp"
#include "stitch/errors.hpp"

namespace stitch {

namespace {

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

/// The names of a comma-separated list (empty items skipped).
std::vector<std::string_view> split(std::string_view list) {
  std::vector<std::string_view> out;
  while (!list.empty()) {
    const auto comma = list.find(',');
    const std::string_view item = trimmed(list.substr(0, comma));
    if (!item.empty()) out.push_back(item);
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return out;
}

}  // namespace

std::uint16_t Allocator::tag_id(std::string_view name, bool create) {
  std::lock_guard lock(tags_mutex_);
  for (std::size_t i = 0; i < tag_names_.size(); ++i)
    if (tag_names_[i] == name) return static_cast<std::uint16_t>(i + 1);
  if (!create) return 0;
  if (tag_names_.size() >= 65535) throw invalid_argument("too many region tags (65535 at most)");
  tag_names_.emplace_back(name);
  return static_cast<std::uint16_t>(tag_names_.size());
}

std::string Allocator::tag_name(std::uint16_t id) const {
  std::lock_guard lock(tags_mutex_);
  return id >= 1 && id <= tag_names_.size() ? tag_names_[id - 1] : std::string();
}

void Allocator::begin_region(std::string_view tag, unsigned flags) {
  if (trimmed(tag).empty()) throw invalid_argument("a region needs a tag: it is empty");
  if ((flags & ~(kRegionBackup | kRegionSpill)) != 0)
    throw invalid_argument(fmt::format("region '{}': unknown flags {:#x} (STITCH_REGION_BACKUP 1, "
                                       "STITCH_REGION_SPILL 2)", tag, flags));
  if (tag.find(',') != std::string_view::npos)
    throw invalid_argument(fmt::format("region tag '{}' has a comma (tags are listed with commas)", tag));
  const std::uint16_t id = tag_id(trimmed(tag), true);
  const std::string name = tag_name(id);
  // Each device learns the name (the device lock routes the thread's allocations while a region
  // is open: the cache hit leaves them to it, core/region_stack.hpp).
  const bool spill = (flags & kRegionSpill) != 0;
  for (int d = 0; d < device_count_; ++d)
    devices_[static_cast<std::size_t>(d)]->residency().name_tag(id, name, spill);
  detail::t_regions.frames.push_back(detail::RegionFrame{this, id, (flags & kRegionBackup) != 0});
  detail::t_open_regions = static_cast<int>(detail::t_regions.frames.size());
}

void Allocator::end_region() {
  auto& frames = detail::t_regions.frames;
  const auto it = std::find_if(frames.rbegin(), frames.rend(),
                               [this](const detail::RegionFrame& f) { return f.owner == this; });
  if (it == frames.rend()) throw invalid_argument("no region is open on this thread");
  frames.erase(std::next(it).base());
  detail::t_open_regions = static_cast<int>(frames.size());
}

std::string Allocator::current_region() const {
  const detail::RegionFrame* region = detail::innermost_region(this);
  return region != nullptr ? tag_name(region->tag) : std::string();
}

std::vector<std::uint16_t> Allocator::tag_list(std::optional<std::string_view> names,
                                               const char* what) {
  std::vector<std::uint16_t> out;
  auto used = [&](std::uint16_t id) {
    for (int d = 0; d < device_count_; ++d)
      if (devices_[static_cast<std::size_t>(d)]->residency().used(id)) return true;
    return false;
  };
  if (!names) {
    std::size_t n;
    {
      std::lock_guard lock(tags_mutex_);
      n = tag_names_.size();
    }
    for (std::size_t id = 1; id <= n; ++id)
      if (used(static_cast<std::uint16_t>(id))) out.push_back(static_cast<std::uint16_t>(id));
    return out;
  }
  for (std::string_view name : split(*names)) {
    const std::uint16_t id = tag_id(name, false);
    if (id == 0 || !used(id))
      throw invalid_argument(fmt::format("{}: tag '{}' was never used (no allocation was made "
                                         "under it)", what, name));
    if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  }
  return out;
}

void Allocator::sleep(int device, std::optional<std::string_view> tags, std::string_view backup_tags) {
  if (device != -1) (void)checked_device(device);
  const std::vector<std::uint16_t> ids = tag_list(tags, "stitch_sleep");
  const std::vector<std::uint16_t> backups =
      backup_tags.empty() ? std::vector<std::uint16_t>{} : tag_list(backup_tags, "stitch_sleep backup_tags");
  std::string done;  // the devices put to sleep so far, for the message of a later failure
  for (int d = device == -1 ? 0 : device; d < (device == -1 ? device_count_ : device + 1); ++d) {
    try {
      if (devices_[static_cast<std::size_t>(d)]->residency().sleep(ids, backups))
        done += fmt::format("{}{}", done.empty() ? "" : ", ", d);
    } catch (const out_of_memory& e) {
      throw out_of_memory(fmt::format("{} (devices asleep before this one: {})", e.what(),
                                      done.empty() ? "none" : done));
    } catch (const invalid_argument&) {
      throw;
    } catch (const backend_error& e) {
      throw backend_error(fmt::format("{} (devices asleep before this one: {})", e.what(),
                                      done.empty() ? "none" : done));
    } catch (const error& e) {
      throw error(fmt::format("{} (devices asleep before this one: {})", e.what(),
                              done.empty() ? "none" : done));
    }
  }
}

void Allocator::wake(int device, std::optional<std::string_view> tags) {
  if (device != -1) (void)checked_device(device);
  const std::vector<std::uint16_t> ids = tag_list(tags, "stitch_wake");
  std::string names;
  for (std::uint16_t id : ids) names += fmt::format("{}'{}'", names.empty() ? "" : ", ", tag_name(id));
  std::string done;
  for (int d = device == -1 ? 0 : device; d < (device == -1 ? device_count_ : device + 1); ++d) {
    std::string report;
    try {
      report = devices_[static_cast<std::size_t>(d)]->residency().wake(ids, names);
    } catch (const backend_error& e) {
      throw backend_error(fmt::format("{} (devices woken before this one: {})", e.what(),
                                      done.empty() ? "none" : done));
    } catch (const invalid_argument&) {
      throw;
    } catch (const error& e) {
      throw error(fmt::format("{} (devices woken before this one: {})", e.what(),
                              done.empty() ? "none" : done));
    }
    if (!report.empty())
      throw out_of_memory(fmt::format("{} (devices woken before this one: {})", report,
                                      done.empty() ? "none" : done));
    done += fmt::format("{}{}", done.empty() ? "" : ", ", d);
  }
}

std::size_t Allocator::spill(int device, std::optional<std::string_view> tags, std::size_t bytes) {
  if (device != -1) (void)checked_device(device);
  std::vector<std::uint16_t> ids = tag_list(tags, "stitch_spill");
  if (!tags) {  // every tag that may spill (on some device)
    std::erase_if(ids, [&](std::uint16_t id) {
      for (int d = 0; d < device_count_; ++d)
        if (devices_[static_cast<std::size_t>(d)]->residency().spillable(id)) return false;
      return true;
    });
  }
  std::string names;
  for (std::uint16_t id : ids) names += fmt::format("{}'{}'", names.empty() ? "" : ", ", tag_name(id));
  std::size_t moved = 0;
  std::string done;
  for (int d = device == -1 ? 0 : device; d < (device == -1 ? device_count_ : device + 1); ++d) {
    try {
      moved += devices_[static_cast<std::size_t>(d)]->residency().spill(ids, bytes, names);
    } catch (const invalid_argument&) {
      throw;
    } catch (const out_of_memory& e) {
      throw out_of_memory(fmt::format("{} (devices spilled before this one: {})", e.what(),
                                      done.empty() ? "none" : done));
    } catch (const backend_error& e) {
      throw backend_error(fmt::format("{} (devices spilled before this one: {})", e.what(),
                                      done.empty() ? "none" : done));
    } catch (const error& e) {
      throw error(fmt::format("{} (devices spilled before this one: {})", e.what(),
                              done.empty() ? "none" : done));
    }
    done += fmt::format("{}{}", done.empty() ? "" : ", ", d);
  }
  return moved;
}

void Allocator::unspill(int device, std::optional<std::string_view> tags) {
  if (device != -1) (void)checked_device(device);
  const std::vector<std::uint16_t> ids = tags ? tag_list(tags, "stitch_unspill") : std::vector<std::uint16_t>{};
  std::string done;
  for (int d = device == -1 ? 0 : device; d < (device == -1 ? device_count_ : device + 1); ++d) {
    std::string report;
    try {
      report = devices_[static_cast<std::size_t>(d)]->residency().unspill(ids, !tags);
    } catch (const backend_error& e) {
      throw backend_error(fmt::format("{} (devices unspilled before this one: {})", e.what(),
                                      done.empty() ? "none" : done));
    } catch (const invalid_argument&) {
      throw;
    } catch (const error& e) {
      throw error(fmt::format("{} (devices unspilled before this one: {})", e.what(),
                              done.empty() ? "none" : done));
    }
    if (!report.empty())
      throw out_of_memory(fmt::format("{} (devices unspilled before this one: {})", report,
                                      done.empty() ? "none" : done));
    done += fmt::format("{}{}", done.empty() ? "" : ", ", d);
  }
}

void Allocator::trim(int device, std::size_t keep_bytes) {
  if (device == -1) {
    for (int d = 0; d < device_count_; ++d) devices_[static_cast<std::size_t>(d)]->residency().trim(keep_bytes);
  } else {
    checked_device(device).residency().trim(keep_bytes);
  }
}

Allocator::BackupProgress Allocator::backup_progress(int device) const {
  const detail::BackupProgress& p = checked_device(device).residency().sleeper().progress();
  BackupProgress out;
  out.op = p.op.load(std::memory_order_acquire);
  out.done = p.done.load(std::memory_order_relaxed);
  out.total = p.total.load(std::memory_order_relaxed);
  return out;
}

std::string Allocator::residency(int device) const {
  auto name = [this](std::uint16_t id) { return tag_name(id); };
  if (device != -1) return checked_device(device).residency().report(name);
  std::string out = "{\"devices\": [";
  for (int d = 0; d < device_count_; ++d) {
    if (d != 0) out += ", ";
    out += devices_[static_cast<std::size_t>(d)]->residency().report(name);
  }
  return out + "]}";
}

}  // namespace stitch
