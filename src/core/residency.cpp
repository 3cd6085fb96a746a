// core/residency.cpp — Residency: the tags' states, sleep and wake, trim and the residency report
// of one device (core/residency.hpp).
#include "core/residency.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>

#include "core/block_store.hpp"
#include "core/device_lock.hpp"
#include "core/kv_pools.hpp"
#include "core/ledger.hpp"
#include "core/page_mapper.hpp"
#include "core/private_pools.hpp"
#include "core/stream_events.hpp"
#include "stitch/errors.hpp"

namespace stitch::detail {

Residency::Residency(const DeviceView& device, KvPools& kv)
    : d_(device),
      kv_(kv),
      sleeper_{device.backend, device.device, device.config, device.store, device.pages, device.ledger,
               device.stats, &tag_names_},
      spiller_{device.config, device.device, device.store, device.pages, device.ledger, device.stats,
               device.ranges} {}

void Residency::name_tag(std::uint16_t tag, const std::string& name, bool spill) {
  std::lock_guard lock(d_.lock);
  if (tag_names_.size() <= tag) tag_names_.resize(std::size_t{tag} + 1);
  tag_names_[tag] = name;
  if (spill) sleeper_.note_spillable(tag);
}

bool Residency::spillable(std::uint16_t tag) const {
  std::lock_guard lock(d_.lock);
  return sleeper_.spillable(tag);
}

std::string Residency::tag_name(std::uint16_t tag) const {
  return tag < tag_names_.size() && !tag_names_[tag].empty() ? tag_names_[tag]
                                                              : fmt::format("tag {}", tag);
}

bool Residency::used(std::uint16_t tag) const {
  std::lock_guard lock(d_.lock);
  return sleeper_.used(tag);
}

void Residency::refuse_while_capturing(const char* what) {
  if (d_.pools.routing())
    throw error(fmt::format(
        "{}: device {}: a private-pool route (a CUDA graph capture) is underway; synchronizing "
        "the device would break the capture", what, d_.device));
  std::set<stream_t> streams{nullptr};
  for (const detail::Segment* s = d_.store.segments(); s != nullptr; s = s->next)
    streams.insert(s->stream);
  for (stream_t s : streams)
    if (d_.backend.is_capturing(d_.device, s))
      throw error(fmt::format(
          "{}: device {}: stream {} is capturing a CUDA graph; synchronizing the device would "
          "break the capture", what, d_.device, fmt::ptr(s)));
}

bool Residency::sleep(const std::vector<std::uint16_t>& tags,
                            const std::vector<std::uint16_t>& backup_tags) {
  std::lock_guard lock(d_.lock);
  std::vector<std::uint16_t> todo;
  for (std::uint16_t t : tags)
    if (sleeper_.used(t) && !sleeper_.asleep(t)) todo.push_back(t);
  if (todo.empty()) return false;
  refuse_while_capturing("stitch_sleep");
  // A pinned block's pages are registered with a NIC or NCCL, or mapped by another process: they
  // stay where they are, so its tag cannot sleep (nothing was done yet).
  for (detail::Segment* s = d_.store.segments(); s != nullptr; s = s->next) {
    if (std::find(todo.begin(), todo.end(), s->tag) == todo.end()) continue;
    for (const Block* b = s->head; b != nullptr; b = b->next)
      if (b->state == detail::BlockState::allocated && b->pins > 0)
        throw error(fmt::format("cannot put tag '{}' to sleep on device {}: its block at {} ({} bytes) is "
                                "pinned (exported to another process, or pinned with stitch_pin) until "
                                "it is freed or unpinned",
                                tag_name(s->tag), d_.device, fmt::ptr(b->ptr), b->size));
  }
  // Kernels on any stream, of this process or a peer device's, may still use the pages: stitch
  // knows only the streams it was told about, so the whole device and its peers are waited for.
  settle_device(/*peers=*/true);
  // The KV pools of the tags first (their backups all or nothing), then the tags' ranges; a
  // failure before the ranges sleep wakes the pools again.
  kv_.sleep(todo, backup_tags);
  try {
    sleeper_.sleep(todo, [&](const Block* b) {
      return b->backup ||
             std::find(backup_tags.begin(), backup_tags.end(), b->segment->tag) != backup_tags.end();
    });
  } catch (...) {
    if (!sleeper_.asleep(todo.front())) {
      try {
        (void)kv_.wake(todo);
      } catch (...) {  // the pools stay asleep; a wake maps them
      }
    }
    throw;
  }
  return true;
}

std::string Residency::wake(const std::vector<std::uint16_t>& tags, const std::string& names) {
  std::lock_guard lock(d_.lock);
  std::vector<std::uint16_t> todo;
  for (std::uint16_t t : tags)
    if (sleeper_.asleep(t)) todo.push_back(t);
  if (todo.empty()) return {};
  refuse_while_capturing("stitch_wake");
  // The KV pools of the tags, then the tags' ranges; all or nothing.
  auto wake_all = [&] {
    if (!kv_.wake(todo)) return false;
    bool woken = false;
    try {
      woken = sleeper_.wake(todo);
    } catch (...) {  // (a backup's read failed: the pools sleep again with the tags)
      kv_.sleep(todo, {});
      throw;
    }
    if (woken) return true;
    kv_.sleep(todo, {});  // (the pools with backup keep it again)
    return false;
  };
  if (wake_all()) return {};
  // The cached memory of the awake pools goes first, as the out-of-memory ladder's last resort.
  d_.upkeep.release_cached_blocks(0);
  kv_.release_unused(/*all=*/true);
  if (wake_all()) return {};
  const std::size_t need = sleeper_.wake_bytes(todo);
  std::string cap;
  if (d_.ledger.cap())
    cap = fmt::format("; the memory fraction caps it at {} bytes", *d_.ledger.cap());
  return fmt::format(
      "CUDA out of memory. stitch_wake could not wake tag(s) {} on device {}: they need {} bytes "
      "of fresh pages. The device has {} bytes free of {}; this process reserves {} bytes{} and "
      "holds {} bytes of live blocks. The cache was released and the wake tried again. Nothing "
      "was mapped: the tags stay asleep with their backups, and the wake may be retried once "
      "memory is free (stitch_trim, stitch_empty_cache, or another tag's sleep).",
      names, d_.device, need, d_.pages.device_free(), d_.pages.device_total(), d_.ledger.reserved(), cap,
      d_.upkeep.stats_locked().allocated_bytes[kAll].current);
}

void Residency::settle_device(bool peers) {
  ++d_.stats.num_device_syncs;
  d_.pages.synchronize_device(peers);
  // The blocks freed on other streams are free now: their events have completed.
  d_.upkeep.record_deferred_events();
  d_.events.poll([this](Block* b) { d_.upkeep.complete_pending(b); });
  d_.upkeep.note_hit_rules();
}

std::vector<Segment*> Residency::spill_order(Config::Spill mode, const std::vector<std::uint16_t>* tags) {
  std::vector<Segment*> tagged, untagged;
  for (Segment* s = d_.store.segments(); s != nullptr; s = s->next) {
    if (!s->expandable || s->asleep || s->private_pool != nullptr) continue;
    if (s->tag == 0) {
      if (mode == Config::Spill::all && tags == nullptr) untagged.push_back(s);
    } else if (tags != nullptr ? std::find(tags->begin(), tags->end(), s->tag) != tags->end()
                               : sleeper_.spillable(s->tag)) {
      tagged.push_back(s);
    }
  }
  // Coldest tag first; a tag's ranges (and the untagged ones) in the store's order, their pages
  // in address order: the order an expandable range grew in.
  std::stable_sort(tagged.begin(), tagged.end(), [this](const Segment* a, const Segment* b) {
    return sleeper_.last_use(a->tag) < sleeper_.last_use(b->tag);
  });
  tagged.insert(tagged.end(), untagged.begin(), untagged.end());
  return tagged;
}

std::size_t Residency::spill(const std::vector<std::uint16_t>& tags, std::size_t bytes,
                             const std::string& names) {
  std::lock_guard lock(d_.lock);
  if (!d_.pages.supported() || spiller_.host_granularity() == 0)
    throw error(fmt::format("stitch_spill: device {}: backend:{} has no host pages to spill to",
                            d_.device, d_.backend.name()));
  for (std::uint16_t t : tags)
    if (!sleeper_.spillable(t))
      throw invalid_argument(fmt::format(
          "stitch_spill: tag '{}' may not spill: no region opened it with STITCH_REGION_SPILL",
          tag_name(t)));
  std::vector<Segment*> order = spill_order(Config::Spill::tags, &tags);
  bool pools = false;
  for (std::uint16_t t : tags) pools = pools || kv_.has_tag(t);
  if (order.empty() && !pools) return 0;
  refuse_while_capturing("stitch_spill");
  settle_device(/*peers=*/true);
  std::vector<Spiller::Move> plan;
  std::size_t planned = 0;
  for (Segment* s : order) {
    for (Spiller::Move& m : spiller_.moves(*s)) {
      if (bytes != 0 && planned >= bytes) break;
      planned += m.kept * s->page;
      plan.push_back(std::move(m));
    }
  }
  // The KV pools of the tags move whole, first (all or nothing on their own); then the ranges.
  std::size_t pool_bytes = 0;
  if (planned < bytes) planned += kv_.spillable_bytes(tags);  // (the pools move whole)
  if (planned < bytes)
    throw out_of_memory(fmt::format(
        "stitch_spill: device {}: tag(s) {} have {} bytes of live memory that may move (pinned "
        "and exported blocks stay), fewer than the {} bytes asked; nothing moved",
        d_.device, names, planned, bytes));
  if (pools) pool_bytes = kv_.spill(tags, spiller_.room());
  if (plan.empty()) {
    if (pool_bytes != 0) ++d_.stats.num_spills;
    return pool_bytes;
  }
  try {
    spiller_.spill(plan);
  } catch (...) {
    if (pool_bytes != 0) {
      try {
        (void)kv_.unspill(tags, false);
      } catch (...) {  // (what stays is on the host, usable)
      }
    }
    throw;
  }
  ++d_.stats.num_spills;
  return Spiller::host_bytes(plan) + pool_bytes;
}

std::string Residency::unspill(const std::vector<std::uint16_t>& tags, bool all) {
  std::lock_guard lock(d_.lock);
  auto selected = [&](const Segment* s) {
    return s->spilled != 0 && (all || std::find(tags.begin(), tags.end(), s->tag) != tags.end());
  };
  auto left = [&] {
    std::size_t n = 0;
    for (Segment* s = d_.store.segments(); s != nullptr; s = s->next)
      if (selected(s)) n += Spiller::spilled_bytes(*s);
    if (all) {
      n += kv_.spilled_bytes();
    } else {
      for (std::uint16_t t : tags) n += kv_.spilled_bytes(t);
    }
    return n;
  };
  if (left() == 0) return {};
  refuse_while_capturing("stitch_unspill");
  settle_device(/*peers=*/true);
  const std::size_t before = left();
  auto run = [&] {
    bool back = kv_.unspill(tags, all);
    for (Segment* s = d_.store.segments(); s != nullptr; s = s->next)
      if (selected(s)) back = spiller_.unspill(*s) && back;
    return back;
  };
  bool back = run();
  if (!back) {
    // Like a wake: the cached memory goes first, then one more try.
    d_.upkeep.release_cached_blocks(0);
    back = run();
  }
  if (left() < before) ++d_.stats.num_unspills;
  if (back) return {};
  std::string stays;
  std::map<std::uint16_t, std::size_t> by_tag;
  for (Segment* s = d_.store.segments(); s != nullptr; s = s->next)
    if (selected(s)) by_tag[s->tag] += Spiller::spilled_bytes(*s);
  for (const std::uint16_t t : sleeper_.used_tags())
    if (all || std::find(tags.begin(), tags.end(), t) != tags.end())
      if (const std::size_t n = kv_.spilled_bytes(t); n != 0) by_tag[t] += n;
  for (const auto& [tag, n] : by_tag)
    stays += fmt::format("{}{}: {} bytes", stays.empty() ? "" : ", ",
                         tag == 0 ? std::string("untagged memory") : "tag '" + tag_name(tag) + "'", n);
  std::string cap;
  if (d_.ledger.cap()) cap = fmt::format("; the memory fraction caps it at {} bytes", *d_.ledger.cap());
  return fmt::format(
      "CUDA out of memory. stitch_unspill could not bring everything back to device {}: {} stay on "
      "host pages (at the same addresses, still usable). The device has {} bytes free of {}; this "
      "process reserves {} bytes{}. The cache was released and the unspill tried again; it may be "
      "retried once memory is free.",
      d_.device, stays, d_.pages.device_free(), d_.pages.device_total(), d_.ledger.reserved(), cap);
}

Block* Residency::spill_for_request(const std::function<Block*()>& retry) {
  const Config::Spill mode = d_.config.spill;
  if (mode == Config::Spill::off || spiller_.host_granularity() == 0) return nullptr;
  std::vector<Segment*> order = spill_order(mode, nullptr);
  if (order.empty()) return nullptr;
  bool settled = false, moved = false;
  Block* block = nullptr;
  std::vector<stream_t> busy;  // streams with work queued since the sync (docs/spill.md)
  for (Segment* s : order) {
    std::vector<Spiller::Move> moves = spiller_.moves(*s);
    for (Spiller::Move& m : moves) {
      if (!settled) {
        // Kernels of any stream (of any device with peer access) may still use these pages.
        settle_device(d_.config.peer_access);
        settled = true;
      }
      if (!spiller_.idle_since_sync(*s, busy)) break;  // another thread's work: the range stays
      try {
        spiller_.spill({std::move(m)});
      } catch (const std::exception&) {
        // The host (or spill_limit_mb) refused, or the move failed whole: nothing more moves.
        if (moved) ++d_.stats.num_spills;
        return nullptr;
      }
      moved = true;
      block = retry();
      if (block != nullptr) break;
    }
    if (block != nullptr) break;
  }
  if (moved) ++d_.stats.num_spills;
  return block;
}

void Residency::release_freed(Segment& segment) noexcept {
  try {
    spiller_.release_freed(segment);
  } catch (...) {  // kept: host pages under free blocks go back at the next release
  }
}

void Residency::unspill_with_room() noexcept {
  if (d_.stats.spilled_bytes.current == 0) return;
  try {
    if (d_.pools.routing()) return;
    for (const Segment* s = d_.store.segments(); s != nullptr; s = s->next)
      if (d_.backend.is_capturing(d_.device, s->stream)) return;
    settle_device(/*peers=*/true);
    std::size_t before = static_cast<std::size_t>(d_.stats.spilled_bytes.current);
    (void)kv_.unspill({}, /*all=*/true);
    for (Segment* s = d_.store.segments(); s != nullptr; s = s->next) {
      if (s->spilled == 0) continue;
      spiller_.release_freed(*s);
      if (!spiller_.unspill(*s)) break;  // the device is full: the rest stays
    }
    if (static_cast<std::size_t>(d_.stats.spilled_bytes.current) < before) ++d_.stats.num_unspills;
  } catch (...) {  // what could not come back stays spilled, at its address
  }
}

std::size_t Residency::spillable_bytes(Config::Spill mode) {
  if (mode == Config::Spill::off || spiller_.host_granularity() == 0) return 0;
  std::size_t n = 0;
  for (Segment* s : spill_order(mode, nullptr)) n += Spiller::host_bytes(spiller_.moves(*s));
  return std::min(n, spiller_.room());
}

void Residency::trim(std::size_t keep) {
  std::lock_guard lock(d_.lock);
  if (d_.ledger.reserved() <= keep) return;
  if (!d_.pools.may_touch_device({})) return;  // a stream may capture: nothing waited for or freed
  d_.upkeep.release_cached_blocks(keep);  // keep 0: empty_cache itself
}

std::string Residency::report(const std::function<std::string(std::uint16_t)>& tag_name) {
  std::lock_guard lock(d_.lock);
  d_.upkeep.poll_events(nullptr);
  // Per owner: live bytes, cached (free, mapped) bytes, reserved (mapped) bytes.
  struct Sums {
    std::size_t live = 0, cached = 0, reserved = 0, spilled = 0, segments = 0;
  };
  Sums untagged, private_pools;
  std::map<std::uint16_t, Sums> tags;
  for (const detail::Segment* s = d_.store.segments(); s != nullptr; s = s->next) {
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
    // Host pages (spilled) lie under mapped blocks but are not the device's memory.
    sum.reserved -= Spiller::spilled_bytes(*s);
    sum.spilled += Spiller::spilled_bytes(*s);
  }
  auto object = [](const Sums& s) {
    return fmt::format(R"("live_bytes": {}, "cached_bytes": {}, "reserved_bytes": {}, "spilled_bytes": {}, "segments": {})",
                       s.live, s.cached, s.reserved, s.spilled, s.segments);
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
    tag_list += fmt::format(R"({{"tag": {}, "state": "{}", "spill": {}, {}, "sleeping_bytes": {}, "host_backup_bytes": {}, )"
                            R"("backup_file_bytes": {}, "backup": "{}"}})",
                            quoted(tag_name(t)), sleeper_.asleep(t) ? "asleep" : s.spilled != 0 ? "spilled" : "awake",
                            sleeper_.spillable(t) ? "true" : "false", object(s),
                            sleeper_.asleep(t) ? s.live : 0, sleeper_.host_bytes(t), sleeper_.file_bytes(t),
                            sleeper_.backup_place(t));
  }
  std::string kv_list;
  for (const KvPoolInfo& k : kv_.infos([this](std::uint16_t t) { return this->tag_name(t); })) {
    if (!kv_list.empty()) kv_list += ", ";
    kv_list += fmt::format(
        R"({{"pool": {}, "tag": {}, "state": "{}", "buffers": {}, "block_bytes": {}, "max_blocks": {}, )"
        R"("page_bytes": {}, "live_blocks": {}, "mapped_bytes": {}, "used_bytes": {}, "reserve_bytes": {}, )"
        R"("limit_bytes": {}, "peak_bytes": {}, "spilled_bytes": {}, "page_maps": {}, "page_unmaps": {}, )"
        R"("host_backup_bytes": {}, "backup_file_bytes": {}, "backup": "{}"}})",
        k.id, quoted(k.tag), k.asleep ? "asleep" : k.spilled_bytes != 0 ? "spilled" : "awake", k.buffers,
        k.block_bytes, k.max_blocks, k.page, k.live_blocks, k.mapped_bytes, k.used_bytes, k.reserve, k.limit,
        k.peak_bytes, k.spilled_bytes, k.maps, k.unmaps, k.host_backup_bytes, k.backup_file_bytes,
        k.backup_file_bytes != 0 ? "file" : k.host_backup_bytes != 0 ? "host" : "none");
  }
  const MemoryInfo info{d_.pages.device_free(), d_.pages.device_total()};
  return fmt::format(
      R"({{"device": {}, "reserved_bytes": {}, "allocated_bytes": {}, "sleeping_bytes": {}, )"
      R"("spilled_bytes": {}, "kv_bytes": {}, "host_backup_bytes": {}, "backup_file_bytes": {}, "backup_staging_bytes": {}, )"
      R"("device_free_bytes": {}, "device_total_bytes": {}, )"
      R"("untagged": {{{}}}, "private_pools": {{{}}}, "tags": [{}], "kv_pools": [{}]}})",
      d_.device, d_.ledger.reserved(), d_.upkeep.stats_locked().allocated_bytes[kAll].current,
      d_.stats.sleeping_bytes.current, d_.stats.spilled_bytes.current, d_.stats.kv_bytes.current,
      sleeper_.host_bytes() + kv_.backup_host_bytes(), sleeper_.file_bytes() + kv_.backup_file_bytes(),
      sleeper_.staging_bytes(), info.free, info.total, object(untagged),
      object(private_pools), tag_list, kv_list);
}

}  // namespace stitch::detail
