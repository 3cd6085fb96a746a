// core/expandable.cpp — expandable segments: per stream and pool, one large reserved virtual
// range whose pages are mapped on demand (at its end or into holes) instead of allocating new
// segments, and unmapped again when entirely free, under memory pressure or on empty_cache.
//
// An expandable segment's blocks tile its whole reservation; ranges with no physical memory are
// `unmapped` blocks kept in the pool's unmapped set (by stream, then address). Each page is one
// physical handle, so pages can later be unmapped individually.
#include <fmt/format.h>

#include <algorithm>
#include <exception>

#include "core/assert.hpp"
#include "core/constants.hpp"
#include "core/device_allocator.hpp"
#include "core/page_mapper.hpp"
#include "stitch/errors.hpp"

namespace stitch {

using detail::PageMapper;
using detail::round_up;

std::size_t DeviceAllocator::page_size(bool small, bool fine) {
  // PyTorch's page sizes (2 MiB small pool, 20 MiB large pool), in granularity multiples:
  // bigger large-pool pages mean fewer map calls, whose cost grows with the number of pages.
  // Fine pages (stitching, when memory runs short) are one granule in both pools: a partly used
  // page is the only memory stitching cannot move, so it bounds the waste at one granule per
  // range edge, at the price of up to 10x more map calls when a large-pool range grows.
  const std::size_t granularity = backend_.granularity(device_);
  if (fine) return granularity;
  return round_up(small ? detail::kSmallBuffer : detail::kLargeBuffer, granularity);
}

bool DeviceAllocator::short_of_memory(std::size_t bytes) {
  // With room, stitching grows as expandable segments do; past stitch_fine_above of what the
  // device (or the memory fraction) allows, it grows in fine pages and reuses free pages.
  if (!config_.stitching) return false;
  if (device_total_ == 0) device_total_ = backend_.total_memory(device_);
  std::size_t limit = device_total_;
  if (ledger_.cap()) limit = std::min(limit, *ledger_.cap());
  return static_cast<double>(ledger_.reserved() + bytes) >
         config_.stitch_fine_above * static_cast<double>(limit);
}

DeviceAllocator::Segment* DeviceAllocator::create_expandable(Pool& pool, stream_t stream,
                                                             std::size_t min_bytes, std::size_t page) {
  // Reserve 1 1/8 of the device (as PyTorch does), so holes can be refilled at the end.
  const std::size_t total = backend_.total_memory(device_);
  const std::size_t bytes =
      std::max(round_up(total + total / 8, page), round_up(min_bytes, page));
  void* va = backend_.reserve(device_, bytes, backend_.granularity(device_));
  if (va == nullptr) return nullptr;
  return adopt_unmapped_range(pool, stream, static_cast<char*>(va), bytes, page, false);
}

DeviceAllocator::Segment* DeviceAllocator::adopt_unmapped_range(Pool& pool, stream_t stream,
                                                                char* va, std::size_t bytes,
                                                                std::size_t page, bool stitched) {
  Block* block = link_new_segment(pool, stream, va, bytes);
  Segment* segment = block->segment;
  segment->expandable = true;
  segment->stitched = stitched;
  segment->page = page;
  segment->pages.reset(bytes / page);
  block->mapped = false;
  pool.unmapped.insert(block);
  return segment;
}

DeviceAllocator::Block* DeviceAllocator::grow_expandable(Pool& pool, stream_t stream,
                                                         std::size_t rounded) {
  const std::size_t coarse = page_size(pool.small, false);
  if (!config_.stitching) return grow_expandable_chain(pool, stream, rounded, coarse, coarse);
  // Stitching ranges have one-granule slots. With room they grow as expandable segments do, in
  // coarse pages (one handle over several slots); short of memory, in fine pages, and the
  // stream's free pages elsewhere are reused first.
  const std::size_t slot = page_size(pool.small, true);
  if (!short_of_memory(rounded)) {
    if (Block* block = grow_expandable_chain(pool, stream, rounded, slot, coarse)) return block;
    // The device (or the memory fraction) could not give whole coarse pages: memory is short
    // after all (another process may hold what the device total suggests is free).
  }
  // The lowest-address unmapped range that, with the free block just before it, covers the
  // request: this fills holes before growing at the end, keeping the segment in one piece.
  // With stitch_reuse_pages (which leaves holes where pages moved out) the free block just after
  // counts too: mapping the whole hole joins the three, and the edge fragments are used again.
  const bool reuse = config_.stitch_reuse_pages;
  Block probe(nullptr, 0, stream, nullptr, pool.small);
  Block* target = nullptr;
  for (auto it = pool.unmapped.lower_bound(&probe);
       it != pool.unmapped.end() && (*it)->stream == stream; ++it) {
    Block* u = *it;
    if (u->segment->page != slot) continue;  // a range made without stitching
    const std::size_t before = u->prev != nullptr && u->prev->in_index ? u->prev->size : 0;
    const std::size_t after =
        reuse && u->next != nullptr && u->next->in_index ? u->next->size : 0;
    if (u->size + before + after >= rounded) {
      target = u;
      break;
    }
  }
  if (target == nullptr) {
    Segment* segment = create_expandable(pool, stream, rounded, slot);
    if (segment == nullptr) return nullptr;
    target = segment->head;
  }
  const std::size_t before =
      target->prev != nullptr && target->prev->in_index ? target->prev->size : 0;
  const std::size_t need = before < rounded ? rounded - before : slot;
  // (Without the free block after, the hole alone covers `need`: the min changes nothing.)
  const std::size_t bytes = std::min(round_up(need, slot), target->size);
  if (reuse) {
    // stitch_reuse_pages: the stream's free pages elsewhere come first (stitcher.cpp).
    if (!stitcher_.map_reused_pages(target, bytes / slot)) return nullptr;
    return file_mapped(pool, target, bytes);
  }
  return map_front(pool, target, bytes, slot);
}

DeviceAllocator::Block* DeviceAllocator::grow_expandable_chain(Pool& pool, stream_t stream,
                                                               std::size_t rounded,
                                                               std::size_t slot, std::size_t unit) {
  // PyTorch's expandable segments (find_expandable_block, try_allocate_expandable_block): the
  // lowest-address unmapped range that, with the free block just before it and every free or
  // unmapped block after it, has room for the request; its unmapped pieces are mapped in turn,
  // in pages of `unit` bytes (one map each), each merging with its free neighbours, until the
  // block holds the request.
  auto allocatable = [](const Block* b) { return b != nullptr && (b->in_index || !b->mapped); };
  Block probe(nullptr, 0, stream, nullptr, pool.small);
  Block* candidate = nullptr;
  for (auto it = pool.unmapped.lower_bound(&probe);
       it != pool.unmapped.end() && (*it)->stream == stream; ++it) {
    if ((*it)->segment->page != slot) continue;  // a range of the other kind (stitching or not)
    Block* c = allocatable((*it)->prev) ? (*it)->prev : *it;
    std::size_t room = 0;
    for (const Block* b = c; room < rounded && allocatable(b); b = b->next) room += b->size;
    if (room >= rounded) {
      candidate = c;
      break;
    }
  }
  if (candidate == nullptr) {
    Segment* segment = create_expandable(pool, stream, rounded, slot);
    if (segment == nullptr) return nullptr;
    candidate = segment->head;
  }
  Block* block = candidate;
  if (!block->mapped) {
    block = map_front(pool, block, std::min(round_up(rounded, unit), block->size), unit);
    if (block == nullptr) return nullptr;
  }
  while (block->size < rounded) {
    Block* next = block->next;  // unmapped: a free neighbour would have merged
    STITCH_ASSERT(next != nullptr && !next->mapped,
                  "grow_expandable_chain: the chain continues with an unmapped block");
    if (next == nullptr || next->mapped) return nullptr;
    block = map_front(pool, next, std::min(round_up(rounded - block->size, unit), next->size), unit);
    if (block == nullptr) return nullptr;
  }
  return block;
}

DeviceAllocator::Block* DeviceAllocator::map_front(Pool& pool, Block* target, std::size_t bytes,
                                                   std::size_t unit) {
  // Handles of `unit` bytes, and one-slot handles for what is left of a hole smaller than that.
  Segment* segment = target->segment;
  if (!ledger_.fits(bytes)) return nullptr;
  const std::size_t first = static_cast<std::size_t>(target->ptr - segment->base) / segment->page;
  if (!pages_.map(*segment, first, bytes / segment->page, unit / segment->page)) return nullptr;
  return file_mapped(pool, target, bytes);
}

DeviceAllocator::Block* DeviceAllocator::file_mapped(Pool& pool, Block* target, std::size_t bytes) {
  // The mapped front of `target` becomes a free block; the rest stays unmapped.
  pool.unmapped.erase(target);
  split_unmapped_tail(target, bytes);
  target->mapped = true;
  trace(TraceAction::segment_map, target->ptr, bytes, target->stream);
  ledger_.mapped(pool.small, bytes);
  return insert_free(pool, target);
}

void DeviceAllocator::split_unmapped_tail(Block* block, std::size_t keep) {
  // `block` (out of the unmapped set, about to be mapped) keeps its first `keep` bytes; the rest
  // becomes an unmapped block of its own.
  STITCH_ASSERT(!block->mapped && keep % block->segment->page == 0,
                "split_unmapped_tail: an unmapped block, split at a page boundary");
  if (keep >= block->size) return;
  Block* rest = link_new_back(block, keep);
  rest->mapped = false;
  block->size = keep;
  pool_of(block).unmapped.insert(rest);
}

DeviceAllocator::Block* DeviceAllocator::insert_unmapped(Block* block) {
  // Coalesces an unmapped block with unmapped neighbours and files it in the unmapped set.
  Pool& pool = pool_of(block);
  for (Block* n : {block->prev, block->next}) {
    if (n == nullptr || n->mapped) continue;
    pool.unmapped.erase(n);
    if (n == block->prev) {
      block->ptr = n->ptr;
      block->prev = n->prev;
      if (block->prev != nullptr) {
        block->prev->next = block;
      } else {
        block->segment->head = block;
      }
    } else {
      block->next = n->next;
      if (block->next != nullptr) block->next->prev = block;
    }
    block->size += n->size;
    blocks_.destroy(n);
  }
  pool.unmapped.insert(block);
  return block;
}

void DeviceAllocator::unmap_free_pages(Block* block) {
  // Unmaps the pages lying entirely inside a free block; its partial pages stay mapped as free
  // blocks of their own on either side.
  Segment* segment = block->segment;
  const std::size_t page = segment->page;
  const auto offset = static_cast<std::size_t>(block->ptr - segment->base);
  std::size_t first = round_up(offset, page) / page;
  std::size_t last = (offset + block->size) / page;
  segment->pages.whole_handles(first, last);  // a coarse page goes whole or not at all
  const std::size_t start = first * page;
  const std::size_t end = last * page;
  if (end <= start) return;
  backend_.unmap(device_, segment->base + start, end - start);  // throws: nothing changed
  trace(TraceAction::segment_unmap, segment->base + start, end - start, segment->stream);
  // Borrowed memory among them lost its second mapping: its lent blocks are free again where
  // they lie (and count there), and nothing of it is released here.
  std::size_t borrowed = 0;
  for (auto it = segment->borrows.begin(); it != segment->borrows.end();) {
    if (it->slot < first || it->slot >= last) {
      ++it;
      continue;
    }
    segment->pages.set(it->slot, it->count, 0);
    borrowed += it->count * page;
    Block* lent = it->block;
    it = segment->borrows.erase(it);
    ledger_.held(segment->small, -static_cast<std::int64_t>(lent->size));
    return_lent(lent);
  }
  const std::exception_ptr release_error = pages_.release(*segment, first, last);

  mark_unmapped(block, start, end);
  ledger_.unmapped(segment->small, end - start - borrowed);
  if (release_error) std::rethrow_exception(release_error);
}

DeviceAllocator::Block* DeviceAllocator::carve(Block* block, std::size_t start, std::size_t end) {
  Segment* segment = block->segment;
  const auto offset = static_cast<std::size_t>(block->ptr - segment->base);
  STITCH_ASSERT(block->in_index && start >= offset && end <= offset + block->size && start < end &&
                    start % segment->page == 0 && end % segment->page == 0,
                "carve: whole pages inside a free block");
  Pool& pool = pool_of(block);
  pool.index.erase(block);
  if (start > offset) {  // the head stays free
    Block* head = link_new_front(block, start - offset);
    head->gc_stamp = block->gc_stamp;
    pool.index.insert(head);
  }
  if (end < offset + block->size) {  // the tail stays free
    Block* tail = link_new_back(block, end - offset);
    tail->gc_stamp = block->gc_stamp;
    pool.index.insert(tail);
  }
  block->ptr = segment->base + start;
  block->size = end - start;
  return block;
}

void DeviceAllocator::mark_unmapped(Block* block, std::size_t start, std::size_t end) {
  block = carve(block, start, end);
  block->mapped = false;
  insert_unmapped(block);
}

void DeviceAllocator::return_lent(Block* lent) noexcept {
  lent->lent = false;
  ledger_.held(lent->small, static_cast<std::int64_t>(lent->size));
  trace(TraceAction::segment_map, lent->ptr, lent->size, lent->stream);
  insert_free(pool_of(lent), lent);
}

bool DeviceAllocator::release_if_unmapped(Segment* segment) {
  Block* head = segment->head;
  if (head->mapped || head->next != nullptr) return false;
  backend_.release_reservation(device_, segment->base, segment->size);  // throws: kept
  pool_of(segment).unmapped.erase(head);
  unlink_segment(segment, head);
  return true;
}

void DeviceAllocator::release_expandable_pages() {
  // First, ranges whose unmap and pages whose release failed before.
  pages_.retry();
  // Two passes: first the stitched ranges that borrowed memory, whose free pages give lent
  // blocks back, which may complete free pages of the ranges that lent them; then the rest.
  for (const bool borrowing : {true, false}) {
    for (Segment* segment = segments_; segment != nullptr;) {
      Segment* next_segment = segment->next;
      if (segment->expandable && segment->borrows.empty() != borrowing) {
        std::vector<Block*> candidates;
        for (Block* b = segment->head; b != nullptr; b = b->next)
          if (b->in_index && b->size >= segment->page) candidates.push_back(b);
        if (!candidates.empty()) {
          // Kernels queued on the segment's stream may still use these pages: wait for them.
          backend_.synchronize_stream(device_, segment->stream);
          for (Block* b : candidates) unmap_free_pages(b);
        }
        release_if_unmapped(segment);  // wholly unmapped: the range goes back
      }
      segment = next_segment;
    }
  }
}

}  // namespace stitch
