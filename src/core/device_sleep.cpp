// core/device_sleep.cpp — the per-device entry points of region tags: tagged allocations, sleep
// and wake (core/sleeper.hpp does the pages and the backups), trim, and the residency report.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>

#include "core/constants.hpp"
#include "core/device_allocator.hpp"
#include "core/size_policy.hpp"
#include "stitch/errors.hpp"

namespace stitch {

using detail::BlockState;

DeviceAllocator::Allocation DeviceAllocator::malloc_tagged(std::size_t size, stream_t stream,
                                                           std::uint16_t tag, bool backup) {
  if (!pages_.supported())
    throw backend_error(fmt::format(
        "cannot allocate under region tag '{}' on device {}: tagged memory is mapped in pages "
        "that a sleep gives back, and backend:{} has no virtual-memory API on this device",
        tag_name(tag), device_, backend_.name()));
  if (size >= detail::kMaxRequest) {
    capture_oom(size, size, size, false, stream);
    return {nullptr, failed_.release()};
  }
  if (events_.outstanding() != 0 || events_.deferred() != 0) poll_events(&stream);
  const std::size_t rounded = detail::round_size(size, config_.roundup_power2_divisions);
  const bool small = detail::is_small(rounded);
  // A route's private pool takes it (a graph's, tagged by the region its capture began in).
  BlockPool& pool = pools_.routing() ? pools_.route(stream, small, store_.pool(small, tag))
                                     : store_.pool(small, tag);
  if (pool.tag == 0) return allocate_from(pool, size, rounded, stream);  // an untagged graph pool
  const Allocation a = malloc_in_tagged_pool(pool, size, rounded, stream);
  if (a.ptr != nullptr && pool.owner == nullptr) live_.find(detail::LiveTable::key_of(a.ptr))->backup = backup;
  return a;
}

DeviceAllocator::Allocation DeviceAllocator::malloc_in_tagged_pool(BlockPool& pool,
                                                                   std::size_t size,
                                                                   std::size_t rounded,
                                                                   stream_t stream) {
  if (sleeper_.asleep(pool.tag))
    throw error(fmt::format(
        "cannot allocate {} bytes under region tag '{}' on device {}: the tag is asleep "
        "(stitch_wake it first)", size, tag_name(pool.tag), device_));
  sleeper_.note_used(pool.tag);
  const Allocation a = allocate_from(pool, size, rounded, stream);
  // A graph pool's blocks are kept over a sleep as its region asked (the region's own: below).
  if (a.ptr != nullptr)
    live_.find(detail::LiveTable::key_of(a.ptr))->backup = pool.owner != nullptr && pool.owner->backup;
  return a;
}

void DeviceAllocator::name_tag(std::uint16_t tag, const std::string& name) {
  std::lock_guard lock(mutex_);
  if (tag_names_.size() <= tag) tag_names_.resize(std::size_t{tag} + 1);
  tag_names_[tag] = name;
}

std::string DeviceAllocator::tag_name(std::uint16_t tag) const {
  return tag < tag_names_.size() && !tag_names_[tag].empty() ? tag_names_[tag]
                                                              : fmt::format("tag {}", tag);
}

bool DeviceAllocator::tag_asleep(std::uint16_t tag) const {
  std::lock_guard lock(mutex_);
  return sleeper_.asleep(tag);
}

bool DeviceAllocator::tag_used(std::uint16_t tag) const {
  std::lock_guard lock(mutex_);
  return sleeper_.used(tag);
}

void DeviceAllocator::refuse_while_capturing(const char* what) {
  if (pools_.routing())
    throw error(fmt::format(
        "{}: device {}: a private-pool route (a CUDA graph capture) is underway; synchronizing "
        "the device would break the capture", what, device_));
  std::set<stream_t> streams{nullptr};
  for (const detail::Segment* s = store_.segments(); s != nullptr; s = s->next)
    streams.insert(s->stream);
  for (stream_t s : streams)
    if (backend_.is_capturing(device_, s))
      throw error(fmt::format(
          "{}: device {}: stream {} is capturing a CUDA graph; synchronizing the device would "
          "break the capture", what, device_, fmt::ptr(s)));
}

bool DeviceAllocator::sleep(const std::vector<std::uint16_t>& tags,
                            const std::vector<std::uint16_t>& backup_tags) {
  std::lock_guard lock(mutex_);
  std::vector<std::uint16_t> todo;
  for (std::uint16_t t : tags)
    if (sleeper_.used(t) && !sleeper_.asleep(t)) todo.push_back(t);
  if (todo.empty()) return false;
  refuse_while_capturing("stitch_sleep");
  // A pinned block's pages are registered with a NIC or NCCL, or mapped by another process: they
  // stay where they are, so its tag cannot sleep (nothing was done yet).
  for (detail::Segment* s = store_.segments(); s != nullptr; s = s->next) {
    if (std::find(todo.begin(), todo.end(), s->tag) == todo.end()) continue;
    for (const Block* b = s->head; b != nullptr; b = b->next)
      if (b->state == detail::BlockState::allocated && b->pins > 0)
        throw error(fmt::format("cannot put tag '{}' to sleep on device {}: its block at {} ({} bytes) is "
                                "pinned (exported to another process, or pinned with stitch_pin) until "
                                "it is freed or unpinned",
                                tag_name(s->tag), device_, fmt::ptr(b->ptr), b->size));
  }
  // Kernels on any stream, of this process or a peer device's, may still use the pages: stitch
  // knows only the streams it was told about, so the whole device and its peers are waited for.
  ++stats_.num_device_syncs;
  pages_.synchronize_device(/*peers=*/true);
  // The blocks freed on other streams are free now: their events have completed.
  record_deferred_events();
  events_.poll([this](Block* b) { complete_pending(b); });
  note_hit_rules();
  sleeper_.sleep(todo, [&](const Block* b) {
    return b->backup ||
           std::find(backup_tags.begin(), backup_tags.end(), b->segment->tag) != backup_tags.end();
  });
  return true;
}

std::string DeviceAllocator::wake(const std::vector<std::uint16_t>& tags, const std::string& names) {
  std::lock_guard lock(mutex_);
  std::vector<std::uint16_t> todo;
  for (std::uint16_t t : tags)
    if (sleeper_.asleep(t)) todo.push_back(t);
  if (todo.empty()) return {};
  refuse_while_capturing("stitch_wake");
  if (sleeper_.wake(todo)) return {};
  // The cached memory of the awake pools goes first, as the out-of-memory ladder's last resort.
  release_cached_blocks();
  if (sleeper_.wake(todo)) return {};
  const std::size_t need = sleeper_.wake_bytes(todo);
  std::string cap;
  if (ledger_.cap())
    cap = fmt::format("; the memory fraction caps it at {} bytes", *ledger_.cap());
  return fmt::format(
      "CUDA out of memory. stitch_wake could not wake tag(s) {} on device {}: they need {} bytes "
      "of fresh pages. The device has {} bytes free of {}; this process reserves {} bytes{} and "
      "holds {} bytes of live blocks. The cache was released and the wake tried again. Nothing "
      "was mapped: the tags stay asleep with their backups, and the wake may be retried once "
      "memory is free (stitch_trim, stitch_empty_cache, or another tag's sleep).",
      names, device_, need, pages_.device_free(), pages_.device_total(), ledger_.reserved(), cap,
      stats_locked().allocated_bytes[kAll].current);
}

void DeviceAllocator::trim(std::size_t keep) {
  std::lock_guard lock(mutex_);
  if (ledger_.reserved() <= keep) return;
  if (!pools_.may_touch_device({})) return;  // a stream may capture: nothing waited for or freed
  release_cached_blocks(keep);  // keep 0: empty_cache itself
}

std::string DeviceAllocator::residency(const std::function<std::string(std::uint16_t)>& tag_name) {
  std::lock_guard lock(mutex_);
  poll_events(nullptr);
  // Per owner: live bytes, cached (free, mapped) bytes, reserved (mapped) bytes.
  struct Sums {
    std::size_t live = 0, cached = 0, reserved = 0, segments = 0;
  };
  Sums untagged, private_pools;
  std::map<std::uint16_t, Sums> tags;
  for (const detail::Segment* s = store_.segments(); s != nullptr; s = s->next) {
    Sums& sum = s->private_pool != nullptr ? private_pools
                : s->tag != 0              ? tags[s->tag]
                                           : untagged;
    ++sum.segments;
    for (const Block* b = s->head; b != nullptr; b = b->next) {
      if (b->is_active()) sum.live += b->size;
      if (s->asleep) continue;
      if (b->is_free()) sum.cached += b->size;
      if (b->is_mapped() && b->state != BlockState::lent) sum.reserved += b->size;
    }
  }
  auto object = [](const Sums& s) {
    return fmt::format(R"("live_bytes": {}, "cached_bytes": {}, "reserved_bytes": {}, "segments": {})",
                       s.live, s.cached, s.reserved, s.segments);
  };
  auto quoted = [](const std::string& text) {
    std::string out = "\"";
    for (char c : text) {
      if (c == '"' || c == '\\') out += '\\';
      if (static_cast<unsigned char>(c) < 0x20) {
        out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
        continue;
      }
      out += c;
    }
    return out + "\"";
  };
  std::string tag_list;
  for (std::uint16_t t : sleeper_.used_tags()) {
    const Sums& s = tags[t];
    if (!tag_list.empty()) tag_list += ", ";
    tag_list += fmt::format(R"({{"tag": {}, "state": "{}", {}, "sleeping_bytes": {}, "host_backup_bytes": {}}})",
                            quoted(tag_name(t)), sleeper_.asleep(t) ? "asleep" : "awake", object(s),
                            sleeper_.asleep(t) ? s.live : 0, sleeper_.host_bytes(t));
  }
  const MemoryInfo info{pages_.device_free(), pages_.device_total()};
  return fmt::format(
      R"({{"device": {}, "reserved_bytes": {}, "allocated_bytes": {}, "sleeping_bytes": {}, )"
      R"("host_backup_bytes": {}, "device_free_bytes": {}, "device_total_bytes": {}, )"
      R"("untagged": {{{}}}, "private_pools": {{{}}}, "tags": [{}]}})",
      device_, ledger_.reserved(), stats_locked().allocated_bytes[kAll].current,
      stats_.sleeping_bytes.current, sleeper_.host_bytes(), info.free, info.total,
      object(untagged), object(private_pools), tag_list);
}

}  // namespace stitch
