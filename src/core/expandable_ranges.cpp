// core/expandable_ranges.cpp — ExpandableRanges: ranges reserved, grown by mapping pages, and
// shrunk by unmapping free ones.
#include "core/expandable_ranges.hpp"

#include <algorithm>
#include <cstdint>
#include <exception>

#include "core/assert.hpp"
#include "core/constants.hpp"

namespace stitch::detail {

std::size_t ExpandableRanges::page_size(bool small, bool fine) {
  // PyTorch's page sizes (2 MiB small pool, 20 MiB large pool), in granularity multiples:
  // bigger large-pool pages mean fewer map calls, whose cost grows with the number of pages.
  // Fine pages (stitching, when memory runs short) are one granule in both pools: a partly used
  // page is the only memory stitching cannot move, so it bounds the waste at one granule per
  // range edge, at the price of up to 10x more map calls when a large-pool range grows.
  const std::size_t granularity = pages_.granularity();
  if (fine) return granularity;
  return round_up(small ? kSmallBuffer : kLargeBuffer, granularity);
}

bool ExpandableRanges::short_of_memory(std::size_t bytes) {
  // With room, stitching grows as expandable segments do; past stitch_fine_above of what the
  // device (or the memory fraction) allows, it grows in fine pages and reuses free pages.
  if (!config_.stitching) return false;
  if (device_total_ == 0) device_total_ = pages_.device_total();
  std::size_t limit = device_total_;
  if (ledger_.cap()) limit = std::min(limit, *ledger_.cap());
  return static_cast<double>(ledger_.reserved() + bytes) >
         config_.stitch_fine_above * static_cast<double>(limit);
}

Segment* ExpandableRanges::create(BlockPool& pool, stream_t stream, std::size_t min_bytes,
                                  std::size_t page) {
  // Reserve 1 1/8 of the device (as PyTorch does), so holes can be refilled at the end.
  const std::size_t total = pages_.device_total();
  const std::size_t bytes =
      std::max(round_up(total + total / 8, page), round_up(min_bytes, page));
  std::unique_ptr<Segment> space = store_.prepare_segment(stream);  // (before the device)
  char* va = pages_.reserve(bytes, pages_.granularity());
  if (va == nullptr) return nullptr;
  return store_.add_range(std::move(space), pool, stream, va, bytes, page, false, BlockState::unmapped);
}

template <typename Pick>
Block* ExpandableRanges::first_or_new(BlockPool& pool, stream_t stream, std::size_t rounded,
                                      std::size_t slot, Pick&& pick) {
  // The unmapped blocks of `stream` in address order (the pool's unmapped set is ordered by
  // stream, then address): the lowest hole that serves comes first.
  Block probe(nullptr, 0, stream, nullptr, nullptr, pool.small, BlockState::unmapped);
  for (auto it = pool.unmapped.lower_bound(&probe);
       it != pool.unmapped.end() && (*it)->stream == stream; ++it) {
    if ((*it)->segment->page != slot) continue;  // a range of the other kind (stitching or not)
    if (Block* b = pick(*it)) return b;
  }
  Segment* segment = create(pool, stream, rounded, slot);
  return segment == nullptr ? nullptr : segment->head;
}

Block* ExpandableRanges::grow(BlockPool& pool, stream_t stream, std::size_t rounded, bool quiet) {
  const std::size_t coarse = page_size(pool.small, false);
  if (!config_.stitching) return grow_chain(pool, stream, rounded, coarse, coarse);
  // Stitching ranges have one-granule slots. With room they grow as expandable segments do, in
  // coarse pages (one handle over several slots); short of memory, in fine pages, and the
  // stream's free pages elsewhere are reused first.
  const std::size_t slot = page_size(pool.small, true);
  // No free page moves while a stream may capture (stitch_reuse_pages unmaps the pages it moves).
  if (quiet && config_.stitch_reuse_pages) return grow_chain(pool, stream, rounded, slot, coarse);
  if (!short_of_memory(rounded)) {
    if (Block* block = grow_chain(pool, stream, rounded, slot, coarse)) return block;
    // The device (or the memory fraction) could not give whole coarse pages: memory is short
    // after all (another process may hold what the device total suggests is free).
  }
  // The lowest-address unmapped range that, with the free block just before it, covers the
  // request: this fills holes before growing at the end, keeping the segment in one piece.
  // With stitch_reuse_pages (which leaves holes where pages moved out) the free block just after
  // counts too: mapping the whole hole joins the three, and the edge fragments are used again.
  const bool reuse = config_.stitch_reuse_pages;
  Block* target = first_or_new(pool, stream, rounded, slot, [&](Block* u) -> Block* {
    const std::size_t before = u->prev != nullptr && u->prev->is_free() ? u->prev->size : 0;
    const std::size_t after = reuse && u->next != nullptr && u->next->is_free() ? u->next->size : 0;
    return u->size + before + after >= rounded ? u : nullptr;
  });
  if (target == nullptr) return nullptr;
  const std::size_t before =
      target->prev != nullptr && target->prev->is_free() ? target->prev->size : 0;
  const std::size_t need = before < rounded ? rounded - before : slot;
  // (Without the free block after, the hole alone covers `need`: the min changes nothing.)
  const std::size_t bytes = std::min(round_up(need, slot), target->size);
  if (reuse) {
    // stitch_reuse_pages: the stream's free pages elsewhere come first (stitcher.cpp).
    if (!stitcher_.map_reused_pages(target, bytes / slot)) return nullptr;
    ledger_.mapped(*target->segment, target->ptr, bytes);
    return store_.mapped(target, target->ptr, bytes, /*merge=*/true);
  }
  return map_front(target, bytes, slot);
}

Block* ExpandableRanges::grow_chain(BlockPool& pool, stream_t stream, std::size_t rounded,
                                    std::size_t slot, std::size_t unit) {
  // PyTorch's expandable segments (find_expandable_block, try_allocate_expandable_block): the
  // lowest-address unmapped range that, with the free block just before it and every free or
  // unmapped block after it, has room for the request; its unmapped pieces are mapped in turn,
  // in pages of `unit` bytes (one map each), each merging with its free neighbours, until the
  // block holds the request.
  auto allocatable = [](const Block* b) { return b != nullptr && (b->is_free() || !b->is_mapped()); };
  Block* block = first_or_new(pool, stream, rounded, slot, [&](Block* u) -> Block* {
    Block* c = allocatable(u->prev) ? u->prev : u;
    std::size_t room = 0;
    for (const Block* b = c; room < rounded && allocatable(b); b = b->next) room += b->size;
    return room >= rounded ? c : nullptr;
  });
  if (block == nullptr) return nullptr;
  if (!block->is_mapped()) {
    block = map_front(block, std::min(round_up(rounded, unit), block->size), unit);
    if (block == nullptr) return nullptr;
  }
  while (block->size < rounded) {
    Block* next = block->next;  // unmapped: a free neighbour would have merged
    STITCH_ASSERT(next != nullptr && !next->is_mapped(),
                  "grow_chain: the chain continues with an unmapped block");
    if (next == nullptr || next->is_mapped()) return nullptr;
    block = map_front(next, std::min(round_up(rounded - block->size, unit), next->size), unit);
    if (block == nullptr) return nullptr;
  }
  return block;
}

Block* ExpandableRanges::map_front(Block* target, std::size_t bytes, std::size_t unit) {
  // Handles of `unit` bytes, and one-slot handles for what is left of a hole smaller than that.
  Segment* segment = target->segment;
  if (!ledger_.fits(bytes)) return nullptr;
  const std::size_t first = static_cast<std::size_t>(target->ptr - segment->base) / segment->page;
  BlockStore::reserve(segment, 2);  // mapped() below cannot fail (may throw: nothing changed)
  if (!pages_.map(*segment, first, bytes / segment->page, unit / segment->page)) return nullptr;
  ledger_.mapped(*segment, target->ptr, bytes);
  return store_.mapped(target, target->ptr, bytes, /*merge=*/true);
}

void ExpandableRanges::unmap_free_pages(Block* block, std::size_t want) {
  // Unmaps the pages lying entirely inside a free block; its partial pages stay mapped as free
  // blocks of their own on either side.
  Segment* segment = block->segment;
  const std::size_t page = segment->page;
  const auto offset = static_cast<std::size_t>(block->ptr - segment->base);
  std::size_t first = round_up(offset, page) / page;
  std::size_t last = (offset + block->size) / page;
  segment->pages.whole_handles(first, last);  // a coarse page goes whole or not at all
  if (want != SIZE_MAX && first < last && (last - first) * page > want) {
    // The last pages that cover `want`, from the start of the handle holding the first of them.
    first = segment->pages.head_of(last - (want + page - 1) / page);
  }
  const std::size_t start = first * page;
  const std::size_t end = last * page;
  if (end <= start) return;
  pages_.unmap(segment->base + start, end - start);  // throws: nothing changed
  ledger_.unmapped(*segment, segment->base + start, end - start);
  // Borrowed memory among them lost its second mapping: its lent blocks are free again where
  // they lie (and count there), and nothing of it is released here.
  for (auto it = segment->borrows.begin(); it != segment->borrows.end();) {
    if (it->slot < first || it->slot >= last) {
      ++it;
      continue;
    }
    segment->pages.set(it->slot, it->count, 0);
    Block* lent = it->block;
    it = segment->borrows.erase(it);
    ledger_.returned(*lent);
    store_.return_lent(lent);
  }
  const std::exception_ptr release_error = pages_.release(*segment, first, last);
  store_.take_pages(block, start, end, BlockState::unmapped);
  if (release_error) std::rethrow_exception(release_error);
}

bool ExpandableRanges::release_if_unmapped(Segment* segment) {
  if (!segment->wholly_unmapped()) return false;
  pages_.release_reservation(segment->base, segment->size);  // throws: kept
  store_.remove_segment(segment);
  return true;
}

void ExpandableRanges::release_free_pages(std::size_t keep) {
  // First, ranges whose unmap and pages whose release failed before.
  pages_.retry();
  // Two passes: first the stitched ranges that borrowed memory, whose free pages give lent
  // blocks back, which may complete free pages of the ranges that lent them; then the rest.
  for (const bool borrowing : {true, false}) {
    for (Segment* segment = store_.segments(); segment != nullptr;) {
      Segment* next_segment = segment->next;
      // A sleeping range keeps its blocks (and addresses) for its wake: it is never released.
      // A graph pool's free pages stay: a replay of its graph may use them (release_range, once
      // the pool has no use).
      if (segment->expandable && !segment->asleep && segment->private_pool == nullptr &&
          segment->borrows.empty() != borrowing) {
        std::vector<Block*> candidates;
        for (Block* b = segment->head; b != nullptr; b = b->next)
          if (b->is_free() && b->size >= segment->page) candidates.push_back(b);
        if (!candidates.empty()) {
          // Kernels queued on the segment's stream may still use these pages: wait for them.
          pages_.synchronize(segment->stream);
          for (Block* b : candidates) {
            if (keep == 0) {
              unmap_free_pages(b);
              continue;
            }
            if (ledger_.reserved() <= keep) return;
            unmap_free_pages(b, ledger_.reserved() - keep);
          }
        }
        release_if_unmapped(segment);  // wholly unmapped: the range goes back
      }
      segment = next_segment;
    }
  }
}

void ExpandableRanges::release_range(Segment* segment) {
  pages_.retry();
  std::vector<Block*> candidates;
  for (Block* b = segment->head; b != nullptr; b = b->next)
    if (b->is_free() && b->size >= segment->page) candidates.push_back(b);
  if (!candidates.empty()) {
    pages_.synchronize(segment->stream);
    for (Block* b : candidates) unmap_free_pages(b);
  }
  release_if_unmapped(segment);
}

std::vector<Block*> ExpandableRanges::seed(
    BlockPool& pool, stream_t stream, const std::vector<SeedRun>& runs,
    const std::vector<SeedBlock>& blocks,
    const std::function<void(Block*, const SeedBlock&)>& activate) {
  std::size_t span = 0;
  for (const SeedRun& r : runs) span = std::max(span, r.offset + r.size);
  std::vector<Block*> out;
  out.reserve(blocks.size());
  // The recording's pages (coarse), in a range of this configuration's slots.
  const std::size_t unit = page_size(pool.small, false);
  const std::size_t slot = config_.stitching ? page_size(pool.small, true) : unit;
  Segment* segment = span == 0 ? nullptr : create(pool, stream, span, slot);
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
    // The unmapped block holding the run.
    char* at = segment->base + r.offset;
    Block* u = segment->block_at(at);
    if (u == nullptr || u->is_mapped() || u->ptr + u->size < at + r.size) break;
    if (!pages_.map(*segment, r.offset / slot, r.size / slot, unit / slot)) break;
    ledger_.mapped(*segment, at, r.size);
    Block* run = store_.mapped(u, at, r.size, /*merge=*/false);
    std::vector<SeedBlock> inside;
    while (next_block < blocks.size() && blocks[next_block].offset < r.offset + r.size)
      inside.push_back(blocks[next_block++]);
    const std::vector<Block*> placed = store_.place(pool, run, segment->base, inside);
    for (std::size_t i = 0; i < placed.size(); ++i) {
      if (placed[i] != nullptr) activate(placed[i], inside[i]);
      out.push_back(placed[i]);
    }
  }
  skip_blocks_until(SIZE_MAX);
  return out;
}

}  // namespace stitch::detail
