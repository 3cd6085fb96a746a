// core/device_validate.cpp — the invariant checker: recounts a device's state from its
// segments and compares it with the free index, the live table and the statistics.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/device_allocator.hpp"
#include "stitch/errors.hpp"

namespace stitch {

namespace {
[[noreturn]] void broken(int device, const std::string& what) {
  throw error(fmt::format("stitch invariant broken on device {}: {}", device, what));
}

void check_stat(int device, const char* name, const StatArray& have, const std::int64_t (&want)[3]) {
  static const char* kPools[3] = {"all", "small_pool", "large_pool"};
  for (int p = 0; p < 3; ++p)
    if (have[p].current != want[p])
      broken(device, fmt::format("{}.{}.current is {} but a recount gives {}", name, kPools[p],
                                 have[p].current, want[p]));
  for (int p = 0; p < 3; ++p)
    if (have[p].peak < have[p].current)
      broken(device, fmt::format("{}.{}.peak {} is below its current value {}", name, kPools[p],
                                 have[p].peak, have[p].current));
}
}  // namespace

void DeviceAllocator::validate_locked() const {
  std::int64_t allocation[3] = {}, segment[3] = {}, active[3] = {}, inactive[3] = {},
               allocated_bytes[3] = {}, reserved[3] = {}, active_bytes[3] = {},
               inactive_bytes[3] = {}, requested[3] = {};
  auto count = [](std::int64_t (&arr)[3], bool small, std::int64_t v) {
    arr[0] += v;
    arr[small ? 1 : 2] += v;
  };
  std::size_t free_blocks[2] = {};  // small, large
  std::size_t unmapped_blocks[2] = {};
  std::size_t live_blocks = 0;
  std::size_t pending_events = 0;
  std::size_t private_free = 0;              // free blocks of private pools' segments
  std::size_t segments_in_private_pools = 0;

  std::vector<phys_handle_t> handles;  // every mapped page's physical handle (not borrowed)
  std::vector<const Block*> lent;      // lent blocks, found in their ranges
  std::vector<const Block*> borrowed;  // lent blocks, as the stitched ranges list them
  for (const Segment* s = segments_; s != nullptr; s = s->next) {
    if (s->stitched && !s->expandable) broken(device_, "a stitched segment is not expandable");
    if (s->private_pool != nullptr) {
      ++segments_in_private_pools;
      if (s->expandable) broken(device_, "a private pool's segment is expandable");
      if (private_pools_.count(s->private_pool->id) == 0 ||
          private_pools_.at(s->private_pool->id).get() != s->private_pool)
        broken(device_, "a segment belongs to a private pool the device does not have");
    }
    if (!s->borrows.empty() && !s->stitched) broken(device_, "a range that is not stitched borrows");
    // Borrowed slots map a lent block's memory a second time: the same handle, the same pieces.
    std::vector<std::size_t> borrowed_slots;
    for (const detail::Borrow& b : s->borrows) {
      const Block* l = b.block;
      borrowed.push_back(l);
      borrowed_slots.push_back(b.slot);
      const Segment* from = l->segment;
      const std::size_t first = static_cast<std::size_t>(l->ptr - from->base) / from->page;
      if (!l->lent || l->size != b.count * s->page || from->page != s->page ||
          s->pages.extent(b.slot) != b.count ||
          s->pages.handle(b.slot) != from->pages.handle(first) ||
          s->pages.piece(b.slot) != from->pages.piece(first))
        broken(device_, "borrowed slots do not map the lent block's memory");
      for (std::size_t k = 0; k < b.count; ++k)
        if (from->pages.handle(first + k) != s->pages.handle(b.slot) ||
            from->pages.piece(first + k) != s->pages.piece(b.slot) + k)
          broken(device_, "borrowed slots do not map the lent block's memory");
    }
    if (s->expandable) {
      const detail::PageTable& t = s->pages;
      if (s->page == 0 || s->size % s->page != 0 || t.slots() != s->size / s->page ||
          t.stored() > t.slots())
        broken(device_, "expandable segment page table is wrong");
      for (std::size_t i = 0; i < t.stored();) {
        if (t.handle(i) == 0) {
          if (t.extent(i) != 0) broken(device_, "an unmapped page slot starts a handle");
          ++i;
          continue;
        }
        const std::size_t slots = t.extent(i);
        if (slots == 0 || i + slots > t.stored())
          broken(device_, "a mapped page slot is not covered by a whole handle");
        for (std::size_t k = i + 1; k < i + slots; ++k)
          if (t.handle(k) != t.handle(i) || t.extent(k) != 0)
            broken(device_, "a handle's slots disagree");
        count(reserved, s->small, static_cast<std::int64_t>(slots * s->page));
        if (std::find(borrowed_slots.begin(), borrowed_slots.end(), i) == borrowed_slots.end())
          handles.push_back(t.handle(i));
        i += slots;
      }
    } else {
      count(segment, s->small, 1);
      count(reserved, s->small, static_cast<std::int64_t>(s->size));
    }
    if (s->head == nullptr || s->head->prev != nullptr) broken(device_, "segment head is wrong");
    const char* expect = s->base;
    const Block* prev = nullptr;
    for (const Block* b = s->head; b != nullptr; prev = b, b = b->next) {
      if (b->segment != s) broken(device_, "block points at the wrong segment");
      if (b->slot != nullptr) broken(device_, "a block is still in a thread's slot after settling");
      if (b->prev != prev) broken(device_, "block prev link is wrong");
      if (b->ptr != expect)
        broken(device_, fmt::format("blocks do not tile segment {}: gap or overlap at {}",
                                    static_cast<const void*>(s->base),
                                    static_cast<const void*>(b->ptr)));
      if (b->size == 0 || b->size % 512 != 0) broken(device_, "block size not a multiple of 512");
      if (b->small != s->small || b->stream != s->stream)
        broken(device_, "block pool or stream differs from its segment");
      expect = b->ptr + b->size;
      const auto size = static_cast<std::int64_t>(b->size);
      if (s->expandable) {
        const auto offset = static_cast<std::size_t>(b->ptr - s->base);
        const std::size_t first = offset / s->page;
        const std::size_t last = (offset + b->size - 1) / s->page;
        // Slots without storage are unmapped: an unmapped block is checked up to the storage.
        const std::size_t end = b->mapped ? last + 1 : std::min(last + 1, s->pages.stored());
        for (std::size_t i = first; i < end; ++i) {
          if (b->mapped && s->pages.handle(i) == 0)
            broken(device_, "a mapped block lies on an unmapped page");
          if (!b->mapped && s->pages.handle(i) != 0)
            broken(device_, "an unmapped block lies on a mapped page");
        }
      } else if (!b->mapped) {
        broken(device_, "unmapped block in a plain segment");
      }
      if (b->lent) {
        if (!b->mapped || b->allocated || b->event_count != 0 || b->in_index || !s->expandable)
          broken(device_, "a lent block is unmapped, allocated, pending or in the free index");
        // Its memory counts where it is used: in the range that borrowed it.
        count(reserved, s->small, -static_cast<std::int64_t>(b->size));
        lent.push_back(b);
        continue;
      }
      if (!b->mapped) {
        if (b->allocated || b->event_count != 0 || b->in_index)
          broken(device_, "unmapped block is allocated, pending or in the free index");
        if ((b->ptr - s->base) % static_cast<std::ptrdiff_t>(s->page) != 0 || b->size % s->page != 0)
          broken(device_, "unmapped block is not page aligned");
        if (prev != nullptr && !prev->mapped) broken(device_, "two adjacent unmapped blocks");
        if (pool_of_const(b).unmapped.count(const_cast<Block*>(b)) != 1)
          broken(device_, "unmapped block missing from the unmapped set");
        ++unmapped_blocks[b->small ? 0 : 1];
        continue;
      }
      if (b->allocated) {
        ++live_blocks;
        if (live_.find(b->ptr) != b) broken(device_, "allocated block missing from the live table");
        if (b->in_index) broken(device_, "allocated block is in the free index");
        count(allocation, b->small, 1);
        count(allocated_bytes, b->small, size);
        count(active, b->small, 1);
        count(active_bytes, b->small, size);
        count(requested, b->small, static_cast<std::int64_t>(b->requested));
      } else if (b->event_count > 0) {
        pending_events += static_cast<std::size_t>(b->event_count);
        if (b->in_index) broken(device_, "pending block is in the free index");
        count(active, b->small, 1);
        count(active_bytes, b->small, size);
        count(requested, b->small, static_cast<std::int64_t>(b->requested));
      } else {
        if (!b->in_index) broken(device_, "free block missing from the free index");
        if (!pool_of_const(b).index.contains(const_cast<Block*>(b)))
          broken(device_, "free block flagged in_index but not found in the index");
        if (s->private_pool != nullptr) {
          ++private_free;
        } else {
          ++free_blocks[b->small ? 0 : 1];
        }
        if (prev != nullptr && prev->in_index)
          broken(device_, "two adjacent free blocks were not coalesced");
        if (b->is_split() && !s->expandable) {
          count(inactive, b->small, 1);
          count(inactive_bytes, b->small, size);
        }
      }
    }
    if (expect != s->base + s->size) broken(device_, "blocks do not cover their segment");
  }
  std::sort(lent.begin(), lent.end());
  std::sort(borrowed.begin(), borrowed.end());
  if (lent != borrowed) broken(device_, "a lent block is not borrowed by exactly one range");
  // Stitching moves handles between ranges: each must be mapped in exactly one page (besides
  // the second mapping of borrowed memory), and a handle waiting for its release (orphaned) in
  // none.
  std::sort(handles.begin(), handles.end());
  if (std::adjacent_find(handles.begin(), handles.end()) != handles.end())
    broken(device_, "a physical handle is mapped in two pages");
  for (phys_handle_t h : pages_.orphans())
    if (std::binary_search(handles.begin(), handles.end(), h))
      broken(device_, "an orphaned physical handle is still mapped in a page");
  std::size_t private_indexed = 0;
  std::size_t private_segments = 0;
  for (const auto& [id, p] : private_pools_) {
    private_indexed += p->small.index.size() + p->large.index.size();
    private_segments += p->segments;
    if (p->use_count < 0) broken(device_, "a private pool has a negative use count");
  }
  if (private_free != private_indexed)
    broken(device_, "a private pool's free index holds blocks that are not free in its segments");
  if (private_segments != segments_in_private_pools)
    broken(device_, "a private pool's segment count is wrong");
  for (const Block* b : deferred_)
    if (b->allocated || b->event_count != 1 || b->in_index)
      broken(device_, "a block whose events are deferred is not pending");
  if (free_blocks[0] != small_.index.size() || free_blocks[1] != large_.index.size())
    broken(device_, "the free index holds blocks that are not free in any segment");
  if (unmapped_blocks[0] != small_.unmapped.size() || unmapped_blocks[1] != large_.unmapped.size())
    broken(device_, "the unmapped set holds blocks that are not unmapped in any segment");
  if (live_blocks != live_.size()) broken(device_, "the live table holds unknown pointers");
  if (pending_events != events_.outstanding() + deferred_.size())
    broken(device_, "pending event count is wrong");

  const DeviceStats stats = stats_locked();
  check_stat(device_, "allocation", stats.allocation, allocation);
  check_stat(device_, "segment", stats.segment, segment);
  check_stat(device_, "active", stats.active, active);
  check_stat(device_, "inactive_split", stats.inactive_split, inactive);
  check_stat(device_, "allocated_bytes", stats.allocated_bytes, allocated_bytes);
  check_stat(device_, "reserved_bytes", stats.reserved_bytes, reserved);
  check_stat(device_, "active_bytes", stats.active_bytes, active_bytes);
  check_stat(device_, "inactive_split_bytes", stats.inactive_split_bytes, inactive_bytes);
  check_stat(device_, "requested_bytes", stats.requested_bytes, requested);
}

}  // namespace stitch
