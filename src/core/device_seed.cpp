// core/device_seed.cpp — for replays: a recorded start state put in place (plain segments and
// expandable ranges with their live blocks where the recording had them), and the release of
// one cached segment, as a recording allocator's garbage collection or oversize release did.
#include <algorithm>

#include "core/assert.hpp"
#include "core/device_allocator.hpp"

namespace stitch {


std::size_t DeviceAllocator::expandable_page(bool small) {
  std::lock_guard lock(mutex_);
  return page_size(small, false);
}

void DeviceAllocator::carve(Pool& pool, Block* free_run, char* origin,
                            const std::vector<SeedBlock>& blocks, std::vector<void*>& out) {
  Block* rest = free_run;
  Segment* segment = free_run->segment;
  const char* begin = free_run->ptr;
  const char* end = free_run->ptr + free_run->size;
  for (const SeedBlock& b : blocks) {
    char* at = origin + b.offset;
    STITCH_ASSERT(rest == nullptr || at >= rest->ptr || b.size == 0, "carve: blocks in address order");
    if (rest == nullptr || b.size == 0 || at < rest->ptr || at + b.size > end) {
      out.push_back(nullptr);
      continue;
    }
    if (at > rest->ptr) {  // the free space before the block
      Block* front = link_new_front(rest, static_cast<std::size_t>(at - rest->ptr));
      rest->ptr = at;
      rest->size -= front->size;
      front->gc_stamp = pool.calls;
      pool.index.insert(front);
    }
    Block* back = nullptr;
    if (b.size < rest->size) back = link_new_back(rest, b.size);
    rest->size = b.size;
    activate_slow(rest, b.requested);
    live_.insert(rest->ptr, rest);
    trace(TraceAction::alloc, rest->ptr, b.requested, rest->stream);
    out.push_back(rest->ptr);
    rest = back;
  }
  if (rest != nullptr) {
    rest->gc_stamp = pool.calls;
    pool.index.insert(rest);
  }
  // Free pieces of a split segment count as inactive_split (no-op for expandable ranges).
  for (Block* b = segment->head; b != nullptr; b = b->next)
    if (b->in_index && b->ptr >= begin && b->ptr < end) account_inactive(b, 1);
}

std::vector<void*> DeviceAllocator::seed_segment(stream_t stream, bool small, std::size_t bytes,
                                                 const std::vector<SeedBlock>& blocks) {
  std::lock_guard lock(mutex_);
  Pool& pool = pool_for(small);
  Block* head = alloc_segment(pool, stream, bytes);
  if (head == nullptr) return {};
  pool.index.erase(head);
  std::vector<void*> out;
  out.reserve(blocks.size());
  carve(pool, head, head->ptr, blocks, out);
  return out;
}

std::vector<void*> DeviceAllocator::seed_expandable(stream_t stream, bool small,
                                                    const std::vector<SeedRun>& runs,
                                                    const std::vector<SeedBlock>& blocks) {
  std::lock_guard lock(mutex_);
  Pool& pool = pool_for(small);
  std::size_t span = 0;
  for (const SeedRun& r : runs) span = std::max(span, r.offset + r.size);
  std::vector<void*> out;
  out.reserve(blocks.size());
  // The recording's pages (coarse), in a range of this configuration's slots.
  const std::size_t unit = page_size(small, false);
  const std::size_t slot = config_.stitching ? page_size(small, true) : unit;
  Segment* segment = span == 0 ? nullptr : create_expandable(pool, stream, span, slot);
  std::size_t next_block = 0;
  auto skip_blocks_until = [&](std::size_t offset) {
    while (next_block < blocks.size() && blocks[next_block].offset < offset) {
      out.push_back(nullptr);
      ++next_block;
    }
  };
  for (const SeedRun& r : runs) {
    if (segment == nullptr || r.size == 0 || r.offset % unit != 0 || r.size % unit != 0) break;
    skip_blocks_until(r.offset);
    // The unmapped block holding the run: the last one, as runs come in address order.
    Block* u = segment->head;
    while (u != nullptr && (u->mapped || u->ptr + u->size <= segment->base + r.offset)) u = u->next;
    if (u == nullptr || u->ptr > segment->base + r.offset ||
        u->ptr + u->size < segment->base + r.offset + r.size)
      break;
    if (!pages_.map(*segment, r.offset / slot, r.size / slot, unit / slot)) break;
    pool.unmapped.erase(u);
    char* at = segment->base + r.offset;
    if (at > u->ptr) {  // address space before the run stays unmapped
      Block* front = link_new_front(u, static_cast<std::size_t>(at - u->ptr));
      front->mapped = false;
      u->ptr = at;
      u->size -= front->size;
      pool.unmapped.insert(front);
    }
    split_unmapped_tail(u, r.size);
    u->mapped = true;
    trace(TraceAction::segment_map, u->ptr, r.size, stream);
    ledger_.mapped(pool.small, r.size);
    std::vector<SeedBlock> inside;
    while (next_block < blocks.size() && blocks[next_block].offset < r.offset + r.size)
      inside.push_back(blocks[next_block++]);
    carve(pool, u, segment->base, inside, out);
  }
  skip_blocks_until(SIZE_MAX);
  return out;
}

bool DeviceAllocator::release_free_segment(stream_t stream, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  for (Pool* pool : {&small_, &large_}) {
    for (auto it = pool->index.lower_bound(detail::FreeKey{stream, bytes, nullptr});
         it != pool->index.end() && (*it)->stream == stream && (*it)->size == bytes; ++it) {
      Block* b = *it;
      if (b->is_split() || b->segment->expandable) continue;
      release_segment(b);
      return true;
    }
  }
  return false;
}

}  // namespace stitch
