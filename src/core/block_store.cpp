// core/block_store.cpp — BlockStore: the operations that change the shape of a device's blocks,
// its snapshot view, and the check of its own invariants.
#include "core/block_store.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/assert.hpp"
#include "core/constants.hpp"

namespace stitch::detail {

BlockStore::BlockStore(const Config& config, StreamShards& shards, HotStats& hot)
    : config_(config), shards_(shards), hot_(hot) {}

BlockStore::~BlockStore() {
  for (Segment* s = segments_; s != nullptr;) {
    Segment* next = s->next;
    for (Block* b = s->head; b != nullptr;) {
      Block* following = b->next;
      destroy(b);
      b = following;
    }
    delete s;
    s = next;
  }
}

BlockStore::FreeBlocks BlockStore::free_blocks(bool small, std::uint16_t tag) {
  if (tag == 0) return FreeBlocks(nullptr, shards_.first(), small);
  if (tag > tag_pools_.size() || tag_pools_[tag - 1] == nullptr) return FreeBlocks(nullptr, nullptr, small);
  TagPools& t = *tag_pools_[tag - 1];
  return FreeBlocks(small ? &t.small : &t.large, nullptr, small);
}

// ---- segments -------------------------------------------------------------------------------------

std::unique_ptr<Segment> BlockStore::prepare_segment(stream_t stream) {
  StreamShard& shard = shards_.get(stream);
  shard.blocks.reserve(1);
  return std::make_unique<Segment>();
}

Block* BlockStore::add_segment(std::unique_ptr<Segment> segment, BlockPool& pool, stream_t stream,
                               char* base, std::size_t size, BlockState initial) noexcept {
  STITCH_ASSERT(initial == BlockState::free || initial == BlockState::unmapped,
                "add_segment: a new segment is free or unmapped");
  STITCH_ASSERT(segment != nullptr && shards_.find(stream) != nullptr,
                "add_segment: the space prepare_segment() took");
  StreamShard& shard = *shards_.find(stream);
  segment->base = base;
  segment->size = size;
  segment->stream = stream;
  segment->shard = &shard;
  segment->pool = &pool;
  segment->small = pool.small;
  segment->private_pool = pool.owner;
  segment->tag = pool.tag;
  // (prepare_segment reserved the block: nothing allocates)
  Block* block = shard.blocks.create(base, size, stream, segment.get(), &shard, pool.small, initial);
  if (initial == BlockState::free) {
    pool.index.insert(block);
  } else {
    pool.unmapped.insert(block);
  }
  Segment* s = segment.release();
  s->head = block;
  if (pool.owner != nullptr) ++pool.owner->segments;
  s->next = segments_;
  if (segments_ != nullptr) segments_->prev = s;
  segments_ = s;
  return block;
}

Segment* BlockStore::add_range(std::unique_ptr<Segment> space, BlockPool& pool, stream_t stream,
                               char* va, std::size_t bytes, std::size_t page, bool stitched,
                               BlockState initial) noexcept {
  Segment* segment = add_segment(std::move(space), pool, stream, va, bytes, initial)->segment;
  segment->expandable = true;
  segment->stitched = stitched;
  segment->page = page;
  segment->pages.reset(bytes / page);
  return segment;
}

void BlockStore::remove_segment(Segment* segment) noexcept {
  Block* head = segment->head;
  STITCH_ASSERT(head->next == nullptr && (head->is_free() || head->state == BlockState::unmapped),
                "remove_segment: one free or unmapped block over the whole segment");
  BlockPool& pool = pool_of(segment);
  if (head->is_free()) {
    pool.index.erase(head);
  } else {
    pool.unmapped.erase(head);
  }
  if (segment->private_pool != nullptr) --segment->private_pool->segments;
  if (segment->prev != nullptr) segment->prev->next = segment->next;
  if (segment->next != nullptr) segment->next->prev = segment->prev;
  if (segments_ == segment) segments_ = segment->next;
  destroy(head);
  delete segment;
}

// ---- blocks ---------------------------------------------------------------------------------------

Block* BlockStore::take_pages(Block* block, std::size_t start, std::size_t end, BlockState to) {
  Segment* segment = block->segment;
  const auto offset = static_cast<std::size_t>(block->ptr - segment->base);
  STITCH_ASSERT(block->is_free() && start >= offset && end <= offset + block->size && start < end &&
                    start % segment->page == 0 && end % segment->page == 0 &&
                    (to == BlockState::unmapped || to == BlockState::lent),
                "take_pages: whole pages inside a free block, to unmap or to lend");
  BlockPool& pool = pool_of(block);
  pool.index.erase(block);
  if (start > offset) {  // the head stays free
    Block* head = link_new_front(block, start - offset, BlockState::free);
    head->gc_stamp = block->gc_stamp;
    pool.index.insert(head);
  }
  if (end < offset + block->size) {  // the tail stays free
    Block* tail = link_new_back(block, end - offset, BlockState::free);
    tail->gc_stamp = block->gc_stamp;
    pool.index.insert(tail);
  }
  block->ptr = segment->base + start;
  block->size = end - start;
  set_state(*block, to);
  if (to == BlockState::unmapped) file_unmapped(block);
  return block;
}

void BlockStore::unmapped_between(Segment& segment, std::size_t first, std::size_t count,
                                  const std::vector<SlotRun>& keep) {
  const std::size_t page = segment.page;
  auto unmap_free = [&](std::size_t from, std::size_t to) {
    if (from >= to) return;
    Block* b = segment.block_at(segment.base + from * page);
    STITCH_ASSERT(b != nullptr && b->is_free() && b->ptr + b->size >= segment.base + to * page,
                  "remap: the free slots between kept runs lie in one free block");
    take_pages(b, from * page, to * page, BlockState::unmapped);
  };
  std::size_t next = first;
  for (const SlotRun& r : keep) {
    unmap_free(next, r.first);
    next = r.first + r.count;
  }
  unmap_free(next, first + count);
}

Block* BlockStore::mapped(Block* block, char* at, std::size_t bytes, bool merge) {
  STITCH_ASSERT(block->state == BlockState::unmapped && at >= block->ptr &&
                    at + bytes <= block->ptr + block->size,
                "mapped: a mapped run inside an unmapped block");
  BlockPool& pool = pool_of(block);
  pool.unmapped.erase(block);
  if (block->ptr < at) {  // the unmapped front stays unmapped
    Block* front = link_new_front(block, static_cast<std::size_t>(at - block->ptr), BlockState::unmapped);
    block->size -= front->size;
    block->ptr = at;
    pool.unmapped.insert(front);
  }
  split_unmapped_tail(block, bytes);  // the unmapped rest stays unmapped
  if (merge) return file(pool, block);
  set_state(*block, BlockState::free);
  pool.index.insert(block);
  return block;
}

Block* BlockStore::return_lent(Block* block) {
  STITCH_ASSERT(block->state == BlockState::lent, "return_lent: a lent block");
  return file(pool_of(block), block);
}

void BlockStore::split_unmapped_tail(Block* block, std::size_t keep) {
  STITCH_ASSERT(block->state == BlockState::unmapped && keep % block->segment->page == 0,
                "split_unmapped_tail: an unmapped block, split at a page boundary");
  if (keep >= block->size) return;
  Block* rest = link_new_back(block, keep, BlockState::unmapped);
  block->size = keep;
  pool_of(block).unmapped.insert(rest);
}

void BlockStore::file_unmapped(Block* block) {
  BlockPool& pool = pool_of(block);
  for (Block* n : {block->prev, block->next}) {
    if (n == nullptr || n->state != BlockState::unmapped) continue;
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
    destroy(n);
  }
  pool.unmapped.insert(block);
}

std::vector<Block*> BlockStore::place(BlockPool& pool, Block* run, char* origin,
                                      const std::vector<SeedBlock>& blocks) {
  STITCH_ASSERT(run->is_free(), "place: a free run");
  // The run's own share of inactive_split, if it was a free piece of a split segment.
  const std::int64_t run_blocks = run->is_split() && !run->segment->expandable ? 1 : 0;
  const std::int64_t run_bytes = run_blocks * static_cast<std::int64_t>(run->size);
  pool.index.erase(run);
  Block* rest = run;
  Segment* segment = run->segment;
  const char* begin = run->ptr;
  const char* end = run->ptr + run->size;
  std::vector<Block*> out;
  out.reserve(blocks.size());
  for (const SeedBlock& b : blocks) {
    const std::size_t size = b.size;
    char* at = origin + b.offset;
    STITCH_ASSERT(rest == nullptr || at >= rest->ptr || size == 0, "place: blocks in address order");
    if (rest == nullptr || size == 0 || at < rest->ptr || at + size > end) {
      out.push_back(nullptr);
      continue;
    }
    if (at > rest->ptr) {  // the free space before the block
      Block* front = link_new_front(rest, static_cast<std::size_t>(at - rest->ptr), BlockState::free);
      rest->ptr = at;
      rest->size -= front->size;
      front->gc_stamp = pool.clock->load(std::memory_order_relaxed);
      pool.index.insert(front);
    }
    Block* back = nullptr;
    if (size < rest->size) back = link_new_back(rest, size, BlockState::free);
    rest->size = size;
    set_state(*rest, BlockState::allocated);
    out.push_back(rest);
    rest = back;
  }
  if (rest != nullptr) {
    rest->gc_stamp = pool.clock->load(std::memory_order_relaxed);
    pool.index.insert(rest);
  }
  // Free pieces of a split segment count as inactive_split (no-op for expandable ranges): the
  // net change, once.
  std::int64_t blocks_now = 0, bytes_now = 0;
  for (Block* b = segment->head; b != nullptr; b = b->next) {
    if (b->is_free() && b->is_split() && b->ptr >= begin && b->ptr < end) {
      ++blocks_now;
      bytes_now += static_cast<std::int64_t>(b->size);
    }
  }
  if (blocks_now != run_blocks || bytes_now != run_bytes)
    account_inactive_change(segment->head, blocks_now - run_blocks, bytes_now - run_bytes);
  return out;
}

// ---- the cache hit's last free ------------------------------------------------------------------

std::size_t BlockStore::best_fit_before(const BlockPool& pool, const Block* held) const {
  const Block* rest = held->next;
  auto it = pool.index.lower_bound(FreeKey{held->stream, held->size + rest->size, held->ptr});
  do {
    if (it == pool.index.begin()) return 0;
    --it;
  } while (*it == rest);  // (the rest is part of the free block, indexed or parked)
  return (*it)->stream == held->stream ? (*it)->size : 0;
}

void BlockStore::park(BlockPool& pool, Block* block) noexcept {
  if (pool.parked == block) return;
  pool.index.erase(block);
  if (pool.parked != nullptr) pool.index.insert(pool.parked);
  pool.parked = block;
}

void BlockStore::settle(BlockPool& pool) noexcept {
  const BlockPool::Held held = pool.held;
  if (held.block == nullptr) return;
  pool.held = BlockPool::Held{};
  // Filed as its free would have filed it (its statistics were counted then), and stamped then.
  coalesce(pool, held.block).survivor->gc_stamp = held.stamp;
}

void BlockStore::settle_all() noexcept {
  for (StreamShard* s = shards_.first(); s != nullptr; s = s->next.load(std::memory_order_relaxed)) {
    for (BlockPool* pool : {&s->small, &s->large}) {
      settle(*pool);
      if (pool->parked != nullptr) {
        pool->index.insert(pool->parked);
        pool->parked = nullptr;
      }
    }
  }
}

// ---- queries --------------------------------------------------------------------------------------

std::size_t BlockStore::largest_free_block() const {
  std::size_t largest = 0;
  for (const StreamShard* s = shards_.first(); s != nullptr; s = s->next.load(std::memory_order_relaxed))
    for (const BlockPool* pool : {&s->small, &s->large})
      for (const Block* b : pool->index) largest = std::max(largest, b->size);
  return largest;
}

namespace {
const char* snapshot_state(const Block* b) {
  switch (b->state) {
    case BlockState::allocated: return "active_allocated";
    case BlockState::pending:
    case BlockState::deferred: return "active_pending_free";
    default: return "inactive";
  }
}
}  // namespace

void BlockStore::snapshot(int device, std::vector<SegmentSnapshot>& out, bool oldest_first,
                          const std::vector<std::string>* tag_names) const {
  const Segment* first = segments_;  // the list is newest first
  if (oldest_first)
    while (first != nullptr && first->next != nullptr) first = first->next;
  for (const Segment* s = first; s != nullptr; s = oldest_first ? s->prev : s->next) {
    // A plain segment is one snapshot segment; an expandable one gives one per mapped run.
    SegmentSnapshot* cur = nullptr;
    const std::size_t runs_before = out.size();
    for (const Block* b = s->head; b != nullptr; b = b->next) {
      if (!b->is_mapped() || b->state == BlockState::lent) {
        cur = nullptr;
        continue;
      }
      if (cur == nullptr) {
        SegmentSnapshot seg;
        seg.device = device;
        seg.address = reinterpret_cast<std::uintptr_t>(b->ptr);
        seg.stream = reinterpret_cast<std::uintptr_t>(s->stream);
        seg.segment_type = s->small ? "small" : "large";
        seg.is_expandable = s->expandable;
        if (s->private_pool != nullptr) seg.pool_id = s->private_pool->id;
        if (s->tag != 0) {
          seg.tag = tag_names != nullptr && s->tag < tag_names->size() && !(*tag_names)[s->tag].empty()
                        ? (*tag_names)[s->tag]
                        : fmt::format("tag {}", s->tag);
          seg.sleeping = s->asleep;
        }
        out.push_back(std::move(seg));
        cur = &out.back();
      }
      const bool allocated = b->state == BlockState::allocated;
      BlockSnapshot block;
      block.address = reinterpret_cast<std::uintptr_t>(b->ptr);
      block.size = b->size;
      block.requested_size = b->is_active() ? b->requested : 0;
      block.state = snapshot_state(b);
      cur->total_size += b->size;
      if (allocated) cur->allocated_size += b->size;
      if (b->is_active()) {
        cur->active_size += b->size;
        cur->requested_size += b->requested;
      }
      cur->blocks.push_back(std::move(block));
    }
    // Host pages (spilled) in each run.
    if (s->spilled != 0) {
      for (std::size_t k = runs_before; k < out.size(); ++k) {
        const auto begin = static_cast<std::size_t>(reinterpret_cast<const char*>(out[k].address) - s->base);
        for (std::size_t i = begin / s->page; i * s->page < begin + out[k].total_size; ++i)
          if (s->pages.host(i)) out[k].spilled_bytes += s->page;
      }
    }
  }
}

StoreCount BlockStore::validate(int device, const std::function<bool(const Block*)>& live) const {
  StoreCount c;
  auto count = [](std::int64_t (&arr)[3], bool small, std::int64_t v) {
    arr[0] += v;
    arr[small ? 1 : 2] += v;
  };
  std::vector<const Block*> lent;      // lent blocks, found in their ranges
  std::vector<const Block*> borrowed;  // lent blocks, as the stitched ranges list them
  for (const Segment* s = segments_; s != nullptr; s = s->next) {
    if (s->stitched && !s->expandable) invariant_broken(device, "a stitched segment is not expandable");
    if (s->shard == nullptr || s->shard->stream != s->stream || shards_.find(s->stream) != s->shard)
      invariant_broken(device, "a segment's stream shard is not its stream's");
    if (s->pool != &const_cast<BlockStore*>(this)->pool_of(s) ||
        (s->private_pool != nullptr && s->pool != &s->private_pool->pool(s->small)) ||
        (s->private_pool == nullptr && s->tag == 0 && s->pool != &s->shard->pool(s->small)))
      invariant_broken(device, "a segment files its blocks in another pool");
    if (s->private_pool != nullptr) {
      c.private_segments.push_back(s->private_pool);
      if (s->expandable != (s->tag != 0))
        invariant_broken(device, "a private pool's segment is expandable without a tag, or plain with one");
    }
    if (!s->borrows.empty() && !s->stitched) invariant_broken(device, "a range that is not stitched borrows");
    if (s->tag != 0 && !s->expandable) invariant_broken(device, "a tagged segment is not expandable");
    if (s->asleep && (s->tag == 0 || !s->borrows.empty()))
      invariant_broken(device, "an asleep segment is untagged or borrows");
    if (s->tag != 0 && s->pages.stored() != 0 && const_cast<BlockStore*>(this)->pool_of(s).tag != s->tag)
      invariant_broken(device, "a tagged segment is filed in another tag's pool");
    // Borrowed slots map a lent block's memory a second time: the same handle, the same pieces.
    for (const Borrow& b : s->borrows) {
      const Block* l = b.block;
      borrowed.push_back(l);
      const Segment* from = l->segment;
      const std::size_t first = static_cast<std::size_t>(l->ptr - from->base) / from->page;
      if (l->state != BlockState::lent || l->size != b.count * s->page || from->page != s->page ||
          s->pages.extent(b.slot) != b.count ||
          s->pages.handle(b.slot) != from->pages.handle(first) ||
          s->pages.piece(b.slot) != from->pages.piece(first))
        invariant_broken(device, "borrowed slots do not map the lent block's memory");
      for (std::size_t k = 0; k < b.count; ++k)
        if (from->pages.handle(first + k) != s->pages.handle(b.slot) ||
            from->pages.piece(first + k) != s->pages.piece(b.slot) + k)
          invariant_broken(device, "borrowed slots do not map the lent block's memory");
    }
    if (s->expandable) {
      const PageTable& t = s->pages;
      std::uint32_t host_slots = 0;
      if (s->page == 0 || s->size % s->page != 0 || t.slots() != s->size / s->page ||
          t.stored() > t.slots())
        invariant_broken(device, "expandable segment page table is wrong");
      for (std::size_t i = 0; i < t.stored();) {
        if (t.handle(i) == 0) {
          if (t.extent(i) != 0) invariant_broken(device, "an unmapped page slot starts a handle");
          ++i;
          continue;
        }
        const std::size_t slots = t.extent(i);
        if (slots == 0 || i + slots > t.stored())
          invariant_broken(device, "a mapped page slot is not covered by a whole handle");
        for (std::size_t k = i + 1; k < i + slots; ++k)
          if (t.handle(k) != t.handle(i) || t.extent(k) != 0)
            invariant_broken(device, "a handle's slots disagree");
        if (t.host(i)) {
          // A spilled slot: a one-slot host page, counted apart from the device's memory.
          if (slots != 1 || s->borrowed_at(i)) invariant_broken(device, "a host page covers more than its slot");
          ++host_slots;
          c.spilled += static_cast<std::int64_t>(s->page);
        } else {
          count(c.reserved, s->small, static_cast<std::int64_t>(slots * s->page));
        }
        if (!s->borrowed_at(i)) c.handles.push_back(t.handle(i));
        i += slots;
      }
      if (host_slots != s->spilled) invariant_broken(device, "a range's count of host pages is wrong");
    } else {
      count(c.segment, s->small, 1);
      count(c.reserved, s->small, static_cast<std::int64_t>(s->size));
    }
    if (s->head == nullptr || s->head->prev != nullptr) invariant_broken(device, "segment head is wrong");
    const BlockPool& pool = const_cast<BlockStore*>(this)->pool_of(s);
    const char* expect = s->base;
    const Block* prev = nullptr;
    for (const Block* b = s->head; b != nullptr; prev = b, b = b->next) {
      if (b->segment != s) invariant_broken(device, "block points at the wrong segment");
      if (b->prev != prev) invariant_broken(device, "block prev link is wrong");
      if (b->ptr != expect)
        invariant_broken(device, fmt::format("blocks do not tile segment {}: gap or overlap at {}",
                                   static_cast<const void*>(s->base),
                                   static_cast<const void*>(b->ptr)));
      if (b->size == 0 || b->size % kMinBlockSize != 0)
        invariant_broken(device, "block size not a multiple of 512");
      if (b->small != s->small || b->stream != s->stream || b->shard != s->shard)
        invariant_broken(device, "block pool, stream or shard differs from its segment");
      if ((b->event_count != 0) != (b->state == BlockState::pending))
        invariant_broken(device, fmt::format("a {} block waits for {} events", to_string(b->state),
                                   b->event_count));
      expect = b->ptr + b->size;
      const auto size = static_cast<std::int64_t>(b->size);
      if (s->expandable) {
        const auto offset = static_cast<std::size_t>(b->ptr - s->base);
        const std::size_t first = offset / s->page;
        const std::size_t last = (offset + b->size - 1) / s->page;
        // Slots without storage are unmapped: an unmapped block is checked up to the storage.
        const std::size_t end = b->is_mapped() ? last + 1 : std::min(last + 1, s->pages.stored());
        for (std::size_t i = first; i < end; ++i) {
          // Asleep, its blocks keep their states over pages given back.
          if (b->is_mapped() && !s->asleep && s->pages.handle(i) == 0)
            invariant_broken(device, "a mapped block lies on an unmapped page");
          if (!b->is_mapped() && s->pages.handle(i) != 0)
            invariant_broken(device, "an unmapped block lies on a mapped page");
          // A host page wholly under a free block goes back at that block's free.
          if (b->is_free() && s->pages.host(i) && b->ptr <= s->base + i * s->page &&
              s->base + (i + 1) * s->page <= b->ptr + b->size)
            invariant_broken(device, "a host page lies wholly under a free block");
        }
      } else if (b->state == BlockState::unmapped || b->state == BlockState::lent) {
        invariant_broken(device, fmt::format("a {} block in a plain segment", to_string(b->state)));
      }
      const bool indexed = b->is_free() && pool.index.contains(const_cast<Block*>(b));
      if (b->is_free() != indexed)
        invariant_broken(device, "a free block is not in its pool's free index");
      if (b->state != BlockState::free && pool.index.contains(const_cast<Block*>(b)))
        invariant_broken(device, fmt::format("a {} block is in the free index", to_string(b->state)));
      if (live(b) != (b->state == BlockState::allocated))
        invariant_broken(device, fmt::format("a {} block {} the live table", to_string(b->state),
                                   live(b) ? "is in" : "is missing from"));
      switch (b->state) {
        case BlockState::held:  // (the device lock files it first)
          invariant_broken(device, "a held block under the device lock");
        case BlockState::lent:
          // Its memory counts where it is used: in the range that borrowed it.
          count(c.reserved, s->small, -size);
          lent.push_back(b);
          break;
        case BlockState::unmapped:
          if ((b->ptr - s->base) % static_cast<std::ptrdiff_t>(s->page) != 0 || b->size % s->page != 0)
            invariant_broken(device, "unmapped block is not page aligned");
          if (prev != nullptr && prev->state == BlockState::unmapped)
            invariant_broken(device, "two adjacent unmapped blocks");
          if (!pool.unmapped.contains(b))
            invariant_broken(device, "unmapped block missing from the unmapped set");
          if (s->private_pool == nullptr) ++(s->tag != 0 ? c.tag_unmapped : c.unmapped_blocks[b->small ? 0 : 1]);
          break;
        case BlockState::allocated:
          ++c.allocated;
          count(c.allocation, b->small, 1);
          count(c.allocated_bytes, b->small, size);
          count(c.active, b->small, 1);
          count(c.active_bytes, b->small, size);
          count(c.requested, b->small, static_cast<std::int64_t>(b->requested));
          break;
        case BlockState::pending:
        case BlockState::deferred:
          c.pending_events += static_cast<std::size_t>(b->event_count);
          if (b->state == BlockState::deferred) ++c.deferred;
          count(c.active, b->small, 1);
          count(c.active_bytes, b->small, size);
          count(c.requested, b->small, static_cast<std::int64_t>(b->requested));
          break;
        case BlockState::free:
          if (s->private_pool != nullptr) {
            ++c.private_free;
          } else if (s->tag != 0) {
            ++c.tag_free;
          } else {
            ++c.free_blocks[b->small ? 0 : 1];
          }
          if (prev != nullptr && prev->is_free())
            invariant_broken(device, "two adjacent free blocks were not coalesced");
          if (b->is_split() && !s->expandable) {
            count(c.inactive, b->small, 1);
            count(c.inactive_bytes, b->small, size);
          }
          break;
      }
    }
    if (expect != s->base + s->size) invariant_broken(device, "blocks do not cover their segment");
  }
  std::sort(lent.begin(), lent.end());
  std::sort(borrowed.begin(), borrowed.end());
  if (lent != borrowed) invariant_broken(device, "a lent block is not borrowed by exactly one range");
  // Stitching moves handles between ranges: each must be mapped in exactly one page (besides
  // the second mapping of borrowed memory).
  std::sort(c.handles.begin(), c.handles.end());
  if (std::adjacent_find(c.handles.begin(), c.handles.end()) != c.handles.end())
    invariant_broken(device, "a physical handle is mapped in two pages");
  std::size_t indexed[2] = {}, unmapped[2] = {};
  for (const StreamShard* sh = shards_.first(); sh != nullptr; sh = sh->next.load(std::memory_order_relaxed)) {
    if (sh->small.owner != nullptr || sh->small.tag != 0 || !sh->small.small || sh->large.small)
      invariant_broken(device, "a stream shard's pools are not the device's");
    if (sh->small.parked != nullptr || sh->large.parked != nullptr)
      invariant_broken(device, "a parked block under the device lock (it is indexed while the lock is held)");
    if (sh->small.held.block != nullptr || sh->large.held.block != nullptr)
      invariant_broken(device, "a held block under the device lock (it is filed while the lock is held)");
    for (const BlockPool* p : {&sh->small, &sh->large}) {
      indexed[p->small ? 0 : 1] += p->index.size();
      unmapped[p->small ? 0 : 1] += p->unmapped.size();
      for (const Block* b : p->index)
        if (b->shard != sh) invariant_broken(device, "a stream shard's index holds another stream's block");
    }
  }
  if (c.free_blocks[0] != indexed[0] || c.free_blocks[1] != indexed[1])
    invariant_broken(device, "the free index holds blocks that are not free in any segment");
  if (c.unmapped_blocks[0] != unmapped[0] || c.unmapped_blocks[1] != unmapped[1])
    invariant_broken(device, "the unmapped set holds blocks that are not unmapped in any segment");
  std::size_t tag_free = 0, tag_unmapped = 0;
  for (const auto& t : tag_pools_) {
    if (t == nullptr) continue;
    tag_free += t->small.index.size() + t->large.index.size();
    tag_unmapped += t->small.unmapped.size() + t->large.unmapped.size();
  }
  if (c.tag_free != tag_free || c.tag_unmapped != tag_unmapped)
    invariant_broken(device, "a region tag's pools hold blocks that are not in its segments");
  return c;
}

}  // namespace stitch::detail
