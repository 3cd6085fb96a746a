// core/block_store.hpp — the blocks and segments of one device and every change of their shape:
// linking and unlinking segments, best fit, taking a free block (split when the policy says so),
// filing a block free (coalesced with its free neighbours), taking whole pages out of a free
// block (to unmap or lend them), mapping pages back in, and placing a recorded start state.
//
// The store owns the blocks, the free index's nodes, the segment list, the device's two block
// pools and the per-stream epochs of the free blocks; it changes a block's state (BlockState) only
// along the transitions block.hpp allows, asserting each, and it keeps the inactive-split
// statistics, which follow the shape. Every change to a stream's free blocks bumps that stream's
// epoch (free_changed), which is what tells immediate reuse that a parked block's verdict is void
// (core/immediate_reuse.hpp). Nothing here calls the device: the callers map, unmap and allocate
// (core/page_mapper.hpp, core/plain_segments.hpp) and book it (core/ledger.hpp).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <string>
#include <utility>
#include <vector>

#include "core/assert.hpp"
#include "core/constants.hpp"
#include "core/block.hpp"
#include "core/block_pool.hpp"
#include "core/hot_stats.hpp"
#include "core/object_pool.hpp"
#include "core/private_pool.hpp"
#include "stitch/config.hpp"
#include "stitch/snapshot.hpp"

namespace stitch::detail {

/// Holds blocks outside the store (immediate reuse: a thread's extents). The store asks it to
/// let go of one when the block's neighbour is filed.
class BlockHolder {
 public:
  /// `block` (parked) lies next to a block being filed: its extent is settled first (filed if
  /// free), so that the two merge as they would have.
  virtual void file_if_freed(Block& block) = 0;
  /// `block` (parked) now follows a free block, which a parked block never does: it leaves its
  /// slot (filed if freed, an ordinary allocation if handed out again).
  virtual void release(Block& block) = 0;

 protected:
  ~BlockHolder() = default;
};

/// A block of a recorded start state (replays): where it lies, from its segment's or range's
/// start, its size (a multiple of 512) and the bytes asked for.
struct SeedBlock {
  std::size_t offset = 0;
  std::size_t size = 0;
  std::size_t requested = 0;
};
/// A mapped run [offset, offset + size) of a recorded expandable range (page multiples).
struct SeedRun {
  std::size_t offset = 0;
  std::size_t size = 0;
};

/// What a recount of the store found, for the allocator's cross-checks (validate).
struct StoreCount {
  /// [pool] with 0 = all, 1 = small pool, 2 = large pool.
  std::int64_t segment[3] = {}, reserved[3] = {}, allocation[3] = {}, allocated_bytes[3] = {},
               active[3] = {}, active_bytes[3] = {}, requested[3] = {}, inactive[3] = {},
               inactive_bytes[3] = {};
  std::size_t allocated = 0;    ///< allocated and parked blocks (the live table holds them)
  std::size_t pending_events = 0;  ///< events pending blocks wait for
  std::size_t deferred = 0;     ///< deferred blocks
  std::size_t free_blocks[2] = {};      ///< free blocks of the device's [small, large] pool
  std::size_t unmapped_blocks[2] = {};  ///< unmapped blocks of the device's [small, large] pool
  /// The private pool of each segment that has one, and the free blocks in those segments.
  std::vector<const PrivatePool*> private_segments;
  std::size_t private_free = 0;
  std::size_t tag_free = 0;      ///< free blocks of tagged segments (not a private pool's)
  std::size_t tag_unmapped = 0;  ///< unmapped blocks of tagged segments (not a private pool's)
  std::vector<phys_handle_t> handles;  ///< every mapped page's handle (not borrowed), sorted
};

class BlockStore {
 public:
  using NodeStorage = PoolAllocator<Block*>::Storage;

  /// `config` (max_split_size, max_non_split_rounding) and `hot` (the inactive-split counters)
  /// must outlive the store.
  BlockStore(const Config& config, HotStats& hot);
  /// Forgets every segment and block (the memory is the device's or its callers').
  ~BlockStore();
  BlockStore(const BlockStore&) = delete;
  BlockStore& operator=(const BlockStore&) = delete;

  /// Who holds parked blocks (immediate reuse).
  void set_holder(BlockHolder* holder) noexcept { holder_ = holder; }

  // ---- pools, segments, epochs ------------------------------------------------------------------
  BlockPool& pool(bool small) noexcept { return small ? small_ : large_; }
  /// The pool of region tag `tag` (0: the device's), created at its first use (throws
  /// std::bad_alloc then).
  BlockPool& pool(bool small, std::uint16_t tag) {
    if (tag == 0) return pool(small);
    if (tag > tag_pools_.size()) tag_pools_.resize(tag);
    std::unique_ptr<TagPools>& t = tag_pools_[tag - 1];
    if (t == nullptr) t = std::make_unique<TagPools>(&index_nodes_, tag);
    return small ? t->small : t->large;
  }
  /// The pool `segment`'s blocks are filed in: its private pool's, its tag's, or the device's.
  BlockPool& pool_of(const Segment* segment) noexcept {
    if (segment->private_pool != nullptr) return segment->private_pool->pool(segment->small);
    if (segment->tag != 0) {
      TagPools& t = *tag_pools_[segment->tag - 1];
      return segment->small ? t.small : t.large;
    }
    return pool(segment->small);
  }
  BlockPool& pool_of(const Block* block) noexcept { return pool_of(block->segment); }
  /// The free index's node storage, shared with the private pools' indexes.
  NodeStorage* nodes() noexcept { return &index_nodes_; }
  /// The newest segment (the list runs newest first through Segment::next).
  [[nodiscard]] Segment* segments() const noexcept { return segments_; }
  /// What the store keeps for `stream` (its epoch, its extents; created at first use).
  StreamReuse* stream_reuse(stream_t stream);
  /// `segment`'s stream's free blocks changed: the one place their epoch moves.
  static void free_changed(const Segment* segment) noexcept {
    // Written under the device lock only: a load and a store, no read-modify-write.
    std::atomic<std::uint64_t>* e = segment->epoch;
    e->store(e->load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }

  /// A new segment over [base, base + size) of `pool` and `stream`, linked in as the newest, with
  /// one block over all of it: free (filed in the index) or unmapped (a reserved range: filed in
  /// the unmapped set). Returns the block.
  Block* add_segment(BlockPool& pool, stream_t stream, char* base, std::size_t size,
                     BlockState initial);
  /// A new expandable range over the reserved [va, va + bytes), in page slots of `page` bytes
  /// (`stitched`: a stitching range), with one block over all of it: unmapped, or free (a range
  /// whose pages the caller has just mapped and enters in its page table).
  Segment* add_range(BlockPool& pool, stream_t stream, char* va, std::size_t bytes,
                     std::size_t page, bool stitched, BlockState initial);
  /// Unlinks and deletes `segment`, whose one block is free or unmapped.
  void remove_segment(Segment* segment) noexcept;

  // ---- the size policy ----------------------------------------------------------------------------
  /// May a free block of `block_size` serve `rounded` bytes? (Oversize blocks, >= max_split_size,
  /// serve only oversize requests close to their size.)
  [[nodiscard]] bool may_serve(std::size_t block_size, std::size_t rounded) const noexcept {
    const std::size_t max_split = config_.max_split_size;
    if (rounded < max_split) return block_size < max_split;
    return block_size < rounded + config_.max_non_split_rounding;
  }
  /// Is the rest of a block of `block_size` split off when it serves `rounded` bytes?
  [[nodiscard]] bool should_split(bool small, bool expandable, std::size_t block_size,
                                  std::size_t rounded) const noexcept {
    const std::size_t remaining = block_size - rounded;
    if (small || expandable) return remaining >= kMinBlockSize;
    return rounded < config_.max_split_size && remaining > kSmallSize;
  }

  // ---- blocks -----------------------------------------------------------------------------------
  /// Best fit for `rounded` bytes of `stream` in `pool` (counts a pool call, the GC clock): the
  /// smallest free block that may serve it, or nullptr.
  Block* best_fit(BlockPool& pool, stream_t stream, std::size_t rounded);
  /// Takes the free `block` out of the index for `rounded` bytes, splitting off the rest when the
  /// policy says so; returns the block to hand out, allocated (the caller activates it).
  Block* take(BlockPool& pool, Block* block, std::size_t rounded);
  /// Files `block` free, coalescing it with free neighbours; returns the block it ended in.
  Block* file(BlockPool& pool, Block* block);
  /// A block whose free completed (its caller's free, or its last event): it leaves the active
  /// set (its requested bytes), forgets its other streams and is filed. Returns the free block.
  Block* file_freed(Block* block);
  /// Bytes [start, end) of `block`'s segment, whole pages inside the free `block`, become one
  /// block of state `to` (unmapped: merged with unmapped neighbours; lent); the rest stays free
  /// on either side. Returns the block.
  Block* take_pages(Block* block, std::size_t start, std::size_t end, BlockState to);
  /// [at, at + bytes) of the unmapped `block` (whole pages) was mapped: the unmapped pieces
  /// before and after it stay unmapped, and it becomes free: filed coalesced (`merge`), or alone
  /// in the index (a recorded start state placed next). Returns the block.
  Block* mapped(Block* block, char* at, std::size_t bytes, bool merge);
  /// The lent `block`'s second mapping is gone: it is free again where it lies.
  Block* return_lent(Block* block);
  /// A recorded start state: `blocks` (offsets from `origin`, address order) are placed inside
  /// the free `run` and returned allocated (nullptr for one outside it; the caller activates
  /// them), the rest stays free.
  std::vector<Block*> place(BlockPool& pool, Block* run, char* origin,
                            const std::vector<SeedBlock>& blocks);

  // ---- a thread's extent (core/immediate_reuse.hpp) ------------------------------------------------
  // A free block a thread slot holds out of the index (state parked): free to the statistics (its
  // inactive-split share stays counted), handed out and taken back by its owner without the
  // device lock, always split at one place. It is never next to a free block: whoever files its
  // neighbour settles it first (BlockHolder).
  /// Whether a block of `bytes` counts as oversize (>= max_split_size).
  [[nodiscard]] bool oversize(std::size_t bytes) const noexcept {
    return bytes >= config_.max_split_size;
  }
  /// Takes the free `block` out of its pool's index into a slot (parked). The stream's free
  /// memory is unchanged, so its epoch does not move.
  void detach(Block* block) noexcept {
    pool_of(block).index.erase(block);
    set_state(*block, BlockState::parked);
  }
  /// The parked `head` splits after `keep` bytes: a parked tail block for the rest, returned.
  Block* split_extent(Block* head, std::size_t keep) {
    Block* tail = link_new_back(head, keep, BlockState::parked);
    head->size = keep;
    return tail;
  }
  /// The parked `tail` goes back into `head` (its successor).
  void join_extent(Block* head, Block* tail) noexcept {
    head->size += tail->size;
    head->next = tail->next;
    if (head->next != nullptr) head->next->prev = head;
    blocks_.destroy(tail);
  }
  /// Whether the extent from `head` to `last` is part of a larger segment (inactive split).
  [[nodiscard]] static bool extent_split(const Block* head, const Block* last) noexcept {
    return head->prev != nullptr || last->next != nullptr;
  }
  /// The parked extent `head` (its tail joined) is filed again: back into the index as it was,
  /// or merged with a free neighbour that came next to it meanwhile (BlockHolder::release).
  void refile_extent(Block* head) {
    const bool alone = (head->prev == nullptr || !head->prev->is_free()) &&
                       (head->next == nullptr || !head->next->is_free());
    if (alone) {
      pool_of(head).index.insert(head);
      set_state(*head, BlockState::free);
      free_changed(head->segment);
      return;
    }
    if (head->is_split()) account_inactive_change(head, -1, -static_cast<std::int64_t>(head->size));
    file(pool_of(head), head);
  }
  /// The extent `head` (+ `tail`, or none) of `bytes`, handed out as `head`, becomes what a take
  /// of the free extent gives: `head` allocated, `tail` the free rest (filed; never next to a
  /// free block).
  void settle_extent_handout(Block* head, Block* tail, std::size_t bytes) {
    const bool was_split = extent_split(head, tail != nullptr ? tail : head);
    set_state(*head, BlockState::allocated);
    if (tail != nullptr) {
      pool_of(tail).index.insert(tail);
      set_state(*tail, BlockState::free);
      tail->gc_stamp = head->gc_stamp;  // (a take leaves the free rest its stamp)
      if (was_split) {
        account_inactive_change(tail, 0, -static_cast<std::int64_t>(head->size));
      } else {
        account_inactive_change(tail, 1, static_cast<std::int64_t>(tail->size));
      }
    } else if (was_split) {
      account_inactive_change(head, -1, -static_cast<std::int64_t>(bytes));
    }
    free_changed(head->segment);
  }

  // ---- queries ----------------------------------------------------------------------------------
  /// The largest free block of the device's pools.
  [[nodiscard]] std::size_t largest_free_block() const;
  /// Every mapped run of every segment as a snapshot segment of `device` (newest segment first,
  /// or oldest first). Lent memory is shown where it is used: in the range that borrowed it.
  /// A tagged range's segments carry its tag's name from `tag_names` ([tag]; "tag <n>" without).
  void snapshot(int device, std::vector<SegmentSnapshot>& out, bool oldest_first,
                const std::vector<std::string>* tag_names = nullptr) const;
  /// Checks the store's own invariants (tiling, links, states and the sets that hold them,
  /// coalescing, page tables, borrowed memory) and returns the recount; throws stitch::error.
  /// `live(block)`: the block is in the caller's live table.
  [[nodiscard]] StoreCount validate(int device,
                                    const std::function<bool(const Block*)>& live) const;

 private:
  /// A new block for the first `bytes` of `b`, linked in before it, in state `state`. `b` keeps
  /// its address and size: the caller moves them (through the free index when `b` is in it).
  Block* link_new_front(Block* b, std::size_t bytes, BlockState state);
  /// A new block for the bytes of `b` from offset `keep` on, linked in after it. `b` keeps its
  /// size: the caller shrinks it.
  Block* link_new_back(Block* b, std::size_t keep, BlockState state);
  /// `block` (out of the unmapped set) keeps its first `keep` bytes; the rest becomes an unmapped
  /// block of its own, filed.
  void split_unmapped_tail(Block* block, std::size_t keep);
  /// Files the unmapped `block`, coalesced with unmapped neighbours.
  void file_unmapped(Block* block);
  /// Adds (sign > 0) or removes a free block's share of the inactive_split statistics.
  void account_inactive(const Block* block, int sign) noexcept {
    if (!block->is_free() || !block->is_split()) return;
    account_inactive_change(block, sign, sign * static_cast<std::int64_t>(block->size));
  }
  /// Applies a net change of the inactive_split statistics in `block`'s pool, once, as PyTorch
  /// does for a split or a merge (so its running sums count what PyTorch's count).
  void account_inactive_change(const Block* block, std::int64_t blocks,
                               std::int64_t bytes) noexcept {
    // Expandable segments are never "inactive split": their free pages can always be unmapped.
    if (block->segment->expandable) return;
    auto apply = [small = block->small](PoolCounter& c, std::int64_t n) {
      if (n > 0) c.add(small, n);
      if (n < 0) c.sub(small, -n);
    };
    apply(hot_.inactive_split, blocks);
    apply(hot_.inactive_split_bytes, bytes);
  }

  const Config& config_;
  HotStats& hot_;
  BlockHolder* holder_ = nullptr;
  NodeStorage index_nodes_;
  ObjectPool<Block> blocks_;
  BlockPool small_{&index_nodes_, true};
  BlockPool large_{&index_nodes_, false};
  /// The pools of a region tag (tagged segments that are not a private pool's).
  struct TagPools {
    TagPools(NodeStorage* nodes, std::uint16_t tag)
        : small(nodes, true, nullptr, tag), large(nodes, false, nullptr, tag) {}
    BlockPool small;
    BlockPool large;
  };
  std::vector<std::unique_ptr<TagPools>> tag_pools_;  ///< [tag - 1], created at first use
  Segment* segments_ = nullptr;
  std::unordered_map<stream_t, std::unique_ptr<StreamReuse>> streams_;
};

// ---- the fast path's operations, inline: a cache hit runs them all -----------------------------

inline Block* BlockStore::link_new_front(Block* b, std::size_t bytes, BlockState state) {
  Block* front = blocks_.create(b->ptr, bytes, b->stream, b->segment, b->small, state);
  front->prev = b->prev;
  front->next = b;
  if (front->prev != nullptr) {
    front->prev->next = front;
  } else {
    b->segment->head = front;
  }
  b->prev = front;
  return front;
}

inline Block* BlockStore::link_new_back(Block* b, std::size_t keep, BlockState state) {
  Block* back = blocks_.create(b->ptr + keep, b->size - keep, b->stream, b->segment, b->small, state);
  back->prev = b;
  back->next = b->next;
  if (back->next != nullptr) back->next->prev = back;
  b->next = back;
  return back;
}

inline Block* BlockStore::best_fit(BlockPool& pool, stream_t stream, std::size_t rounded) {
  ++pool.calls;
  auto it = pool.index.best_fit(stream, rounded);
  if (it == pool.index.end()) return nullptr;
  Block* block = *it;
  // Oversize blocks (>= max_split_size) are never split: they serve only requests of at least
  // max_split_size, and only within max_non_split_rounding of their size.
  if (!may_serve(block->size, rounded)) return nullptr;
  return block;  // still in the index: take() takes it out
}

inline Block* BlockStore::take(BlockPool& pool, Block* block, std::size_t rounded) {
  STITCH_ASSERT(block->is_free() && block->size >= rounded,
                "take: a free, indexed block that holds the request");
  Block* out = block;
  if (should_split(block->small, block->segment->expandable, block->size, rounded)) {
    // A new block takes the front; `block` keeps the tail and stays in the index, re-keyed in
    // place (no tree rebalancing when its order is unchanged). An already split free block
    // shrinks; an unsplit one becomes a split remainder.
    const bool was_split = block->is_split();
    out = link_new_front(block, rounded, BlockState::allocated);
    pool.index.shrink(block, block->ptr + rounded, block->size - rounded);
    if (was_split) {
      account_inactive_change(block, 0, -static_cast<std::int64_t>(rounded));
    } else {
      account_inactive_change(block, 1, static_cast<std::int64_t>(block->size));
    }
  } else {
    account_inactive(block, -1);
    pool.index.erase(block);
    set_state(*block, BlockState::allocated);
  }
  free_changed(out->segment);
  return out;
}

inline Block* BlockStore::file(BlockPool& pool, Block* block) {
  // Files a block, coalescing it with free neighbours. A free neighbour survives, re-keyed in
  // place, and `block` is recycled, so the common case needs no tree insert.
  STITCH_ASSERT(may_become(block->state, BlockState::free), "file: a block that may become free");
  // A thread's extent next to this block is filed first, so that they merge as they would have.
  if (block->prev != nullptr && block->prev->state == BlockState::parked)
    holder_->file_if_freed(*block->prev);
  if (block->next != nullptr && block->next->state == BlockState::parked)
    holder_->file_if_freed(*block->next);
  // The inactive_split statistics change once, by the net effect (as PyTorch's free_block):
  // each merged neighbour (a free block in a split segment) leaves, the survivor joins.
  Block* prev = block->prev != nullptr && block->prev->is_free() ? block->prev : nullptr;
  Block* next = block->next != nullptr && block->next->is_free() ? block->next : nullptr;
  std::int64_t inactive_blocks = -static_cast<std::int64_t>((prev != nullptr) + (next != nullptr));
  std::int64_t inactive_bytes = -static_cast<std::int64_t>((prev != nullptr ? prev->size : 0) +
                                                           (next != nullptr ? next->size : 0));
  Block* survivor = block;
  if (prev != nullptr) {
    std::size_t size = prev->size + block->size;
    if (next != nullptr) {
      size += next->size;
      pool.index.erase(next);
    }
    Block* after = next != nullptr ? next->next : block->next;
    prev->next = after;
    if (after != nullptr) after->prev = prev;
    if (next != nullptr) blocks_.destroy(next);
    blocks_.destroy(block);
    pool.index.grow(prev, prev->ptr, size);
    survivor = prev;
  } else if (next != nullptr) {
    next->prev = block->prev;
    if (block->prev != nullptr) {
      block->prev->next = next;
    } else {
      next->segment->head = next;
    }
    char* ptr = block->ptr;
    const std::size_t size = block->size + next->size;
    blocks_.destroy(block);
    pool.index.grow(next, ptr, size);
    survivor = next;
  } else {
    pool.index.insert(block);
    set_state(*block, BlockState::free);
  }
  survivor->gc_stamp = pool.calls;
  if (survivor->is_split()) {
    inactive_blocks += 1;
    inactive_bytes += static_cast<std::int64_t>(survivor->size);
  }
  account_inactive_change(survivor, inactive_blocks, inactive_bytes);
  free_changed(survivor->segment);
  // A parked block never follows a free block (core/immediate_reuse.hpp): the one after this
  // one leaves its slot (freed, it is filed now and merges here; handed out, it becomes an
  // ordinary allocation).
  if (survivor->next != nullptr && survivor->next->state == BlockState::parked)
    holder_->release(*survivor->next);  // `survivor` stays, grown if they merged
  return survivor;
}

inline Block* BlockStore::file_freed(Block* block) {
  hot_.inactive_block(block->small, static_cast<std::int64_t>(block->requested));
  block->requested = 0;
  block->stream_uses.clear();
  return file(pool_of(block), block);
}

}  // namespace stitch::detail
