// core/device_validate.cpp — the allocator's cross-checks: each type checks its own invariants
// (BlockStore, StreamEvents, PrivatePools), and this checks them against each other, the live
// table, the orphaned pages and the statistics.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <mutex>

#include "core/assert.hpp"
#include "core/device_allocator.hpp"

namespace stitch {

using detail::invariant_broken;

namespace {
void check_stat(int device, const char* name, const StatArray& have, const std::int64_t (&want)[3]) {
  static const char* kPools[3] = {"all", "small_pool", "large_pool"};
  for (int p = 0; p < 3; ++p)
    if (have[p].current != want[p])
      invariant_broken(device, fmt::format("{}.{}.current is {} but a recount gives {}", name, kPools[p],
                                 have[p].current, want[p]));
  for (int p = 0; p < 3; ++p)
    if (have[p].peak < have[p].current)
      invariant_broken(device, fmt::format("{}.{}.peak {} is below its current value {}", name, kPools[p],
                                 have[p].peak, have[p].current));
}
}  // namespace

void DeviceAllocator::validate() const {
  std::lock_guard lock(mutex_);
  const detail::StoreCount c =
      store_.validate(device_, [this](const Block* b) {
        return live_.find(detail::LiveTable::key_of(b->ptr)) == b;
      });
  if (c.allocated != live_.count()) invariant_broken(device_, "the live table holds unknown pointers");
  events_.validate(device_, c.pending_events, c.deferred);
  pools_.validate(c);
  // A handle waiting for its release (orphaned) is mapped nowhere.
  for (phys_handle_t h : pages_.orphans())
    if (std::binary_search(c.handles.begin(), c.handles.end(), h))
      invariant_broken(device_, "an orphaned physical handle is still mapped in a page");
  const DeviceStats stats = stats_locked();
  // Stray ranges a sleep could not unmap are reserved until the retry unmaps them.
  detail::StoreCount counted = c;
  for (bool small : {true, false}) {
    const auto stray = static_cast<std::int64_t>(pages_.booked_strays(small));
    counted.reserved[0] += stray;
    counted.reserved[small ? 1 : 2] += stray;
  }
  // The KV pools' pages are the large pool's reserved memory.
  const auto kv = static_cast<std::int64_t>(kv_.mapped_bytes());
  counted.reserved[0] += kv;
  counted.reserved[2] += kv;
  if (kv != stats.kv_bytes.current)
    invariant_broken(device_, fmt::format("kv_bytes is {}, the pools map {}", stats.kv_bytes.current, kv));
  kv_.validate();
  check_stat(device_, "allocation", stats.allocation, c.allocation);
  check_stat(device_, "segment", stats.segment, c.segment);
  check_stat(device_, "active", stats.active, c.active);
  check_stat(device_, "inactive_split", stats.inactive_split, c.inactive);
  check_stat(device_, "allocated_bytes", stats.allocated_bytes, c.allocated_bytes);
  check_stat(device_, "reserved_bytes", stats.reserved_bytes, counted.reserved);
  check_stat(device_, "active_bytes", stats.active_bytes, c.active_bytes);
  check_stat(device_, "inactive_split_bytes", stats.inactive_split_bytes, c.inactive_bytes);
  check_stat(device_, "requested_bytes", stats.requested_bytes, c.requested);
  residency_.sleeper().validate(kv_.backup_file_bytes());
  // Allocated memory counts sleeping blocks, reserved memory does not.
  if (stats.reserved_bytes[kAll].current + stats.sleeping_bytes.current + stats.spilled_bytes.current <
      stats.allocated_bytes[kAll].current)
    invariant_broken(device_, "reserved + sleeping + spilled bytes are less than allocated bytes");
  const std::int64_t spilled = c.spilled + static_cast<std::int64_t>(kv_.spilled_bytes());
  if (spilled != stats.spilled_bytes.current)
    invariant_broken(device_, fmt::format("spilled_bytes is {}, its recount {}", stats.spilled_bytes.current, spilled));
  std::int64_t sleeping = 0;
  for (const detail::Segment* s = store_.segments(); s != nullptr; s = s->next)
    if (s->asleep)
      for (const Block* b = s->head; b != nullptr; b = b->next)
        if (b->state == detail::BlockState::allocated) sleeping += static_cast<std::int64_t>(b->size);
  if (sleeping != stats.sleeping_bytes.current)
    invariant_broken(device_, fmt::format("sleeping_bytes is {}, its recount {}", stats.sleeping_bytes.current,
                                sleeping));
}

}  // namespace stitch
