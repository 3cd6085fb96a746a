// core/device_snapshot.cpp — a device's segments and blocks in PyTorch's snapshot model.
#include "core/device_allocator.hpp"

namespace stitch {

namespace {
const char* state_of(const detail::Block* b) {
  if (b->allocated) return "active_allocated";
  if (b->event_count > 0) return "active_pending_free";
  return "inactive";
}
}  // namespace

std::vector<TraceEntry> DeviceAllocator::snapshot(std::vector<SegmentSnapshot>& out) {
  std::lock_guard lock(mutex_);
  retire_completed_events();  // blocks whose streams are done are shown free
  trace(TraceAction::snapshot, nullptr, 0, nullptr);
  segments_locked(out, /*oldest_first=*/false);
  return recorder_.entries();
}

void DeviceAllocator::segments_locked(std::vector<SegmentSnapshot>& out, bool oldest_first) const {
  const Segment* first = segments_;  // the list is newest first
  if (oldest_first)
    while (first != nullptr && first->next != nullptr) first = first->next;
  for (const Segment* s = first; s != nullptr; s = oldest_first ? s->prev : s->next) {
    // A plain segment is one snapshot segment; an expandable one gives one per mapped run. Lent
    // memory is shown where it is used: in the stitched range that borrowed it.
    SegmentSnapshot* cur = nullptr;
    for (const Block* b = s->head; b != nullptr; b = b->next) {
      if (!b->mapped || b->lent) {
        cur = nullptr;
        continue;
      }
      if (cur == nullptr) {
        SegmentSnapshot seg;
        seg.device = device_;
        seg.address = reinterpret_cast<std::uintptr_t>(b->ptr);
        seg.stream = reinterpret_cast<std::uintptr_t>(s->stream);
        seg.segment_type = s->small ? "small" : "large";
        seg.is_expandable = s->expandable;
        if (s->private_pool != nullptr) seg.pool_id = s->private_pool->id;
        out.push_back(std::move(seg));
        cur = &out.back();
      }
      BlockSnapshot block;
      block.address = reinterpret_cast<std::uintptr_t>(b->ptr);
      block.size = b->size;
      block.requested_size = b->allocated || b->event_count > 0 ? b->requested : 0;
      block.state = state_of(b);
      cur->total_size += b->size;
      if (b->allocated) cur->allocated_size += b->size;
      if (b->allocated || b->event_count > 0) {
        cur->active_size += b->size;
        cur->requested_size += b->requested;
      }
      cur->blocks.push_back(std::move(block));
    }
  }
}

}  // namespace stitch
