// core/block_store.hpp — the blocks and segments of one device and every change of their shape:
// linking and unlinking segments, best fit, taking a free block (split when the policy says so),
// filing a block free (coalesced with its free neighbours), taking whole pages out of a free
// block (to unmap or lend them), mapping pages back in, and placing a recorded start state.
//
// The store owns the segment list and the region tags' pools; the device's pools are the stream
// shards' (core/stream_shards.hpp), whose Block objects it draws from the
// segment's shard. It changes a block's state (BlockState) only along the transitions block.hpp
// allows, asserting each, and it keeps the inactive-split statistics, which follow the shape, in
// the block's shard. A change inside one stream's segments (best fit, take, file: the cache hit,
// core/cache_hit.hpp) needs that shard's lock only; everything else the device lock. Nothing here
// calls the device: the callers map, unmap and allocate (core/page_mapper.hpp,
// core/plain_segments.hpp) and book it (core/ledger.hpp).
#pragma once

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
#include "core/stream_shards.hpp"
#include "stitch/config.hpp"
#include "stitch/snapshot.hpp"

namespace stitch::detail {

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
  std::size_t allocated = 0;    ///< allocated blocks (the live table holds them)
  std::size_t pending_events = 0;  ///< events pending blocks wait for
  std::size_t deferred = 0;     ///< deferred blocks
  std::size_t free_blocks[2] = {};      ///< free blocks of the streams' [small, large] pools
  std::size_t unmapped_blocks[2] = {};  ///< unmapped blocks of the streams' [small, large] pools
  /// The private pool of each segment that has one, and the free blocks in those segments.
  std::vector<const PrivatePool*> private_segments;
  std::size_t private_free = 0;
  std::size_t tag_free = 0;      ///< free blocks of tagged segments (not a private pool's)
  std::size_t tag_unmapped = 0;  ///< unmapped blocks of tagged segments (not a private pool's)
  std::vector<phys_handle_t> handles;  ///< every mapped page's handle (not borrowed), sorted
  std::int64_t spilled = 0;      ///< bytes of host pages mapped (spilled slots)
};

class BlockStore {
 public:
  class FreeBlocks;

  /// `config` (max_split_size, max_non_split_rounding, garbage_collection_threshold), `shards`
  /// and `hot` (the inactive-split counters) must outlive the store.
  BlockStore(const Config& config, StreamShards& shards, HotStats& hot);
  /// Forgets every segment and block (the memory is the device's or its callers').
  ~BlockStore();
  BlockStore(const BlockStore&) = delete;
  BlockStore& operator=(const BlockStore&) = delete;

  // ---- pools, segments --------------------------------------------------------------------------
  /// `stream`'s share of the device's small or large pool (its shard, created at its first use:
  /// device lock; throws std::bad_alloc then).
  BlockPool& pool(stream_t stream, bool small) { return shards_.get(stream).pool(small); }
  /// The pool of region tag `tag` (not 0), created at its first use (throws std::bad_alloc then).
  BlockPool& pool(bool small, std::uint16_t tag) {
    STITCH_ASSERT(tag != 0, "the tag pools are of tags");
    if (tag > tag_pools_.size()) tag_pools_.resize(tag);
    std::unique_ptr<TagPools>& t = tag_pools_[tag - 1];
    if (t == nullptr) t = std::make_unique<TagPools>(tag);
    return small ? t->small : t->large;
  }
  /// The pool `segment`'s blocks are filed in: its private pool's, its tag's, or its stream's
  /// share of the device's.
  static BlockPool& pool_of(const Segment* segment) noexcept { return *segment->pool; }
  static BlockPool& pool_of(const Block* block) noexcept { return pool_of(block->segment); }
  /// The newest segment (the list runs newest first through Segment::next).
  [[nodiscard]] Segment* segments() const noexcept { return segments_; }
  /// The free blocks of every stream's share of the device's small or large pool (tag 0), in
  /// (stream, size, address) order, or of region tag `tag`'s pool (device lock).
  [[nodiscard]] FreeBlocks free_blocks(bool small, std::uint16_t tag = 0);
  /// Whether best-fit lookups are counted (garbage_collection_threshold is set: BlockPool::clock).
  [[nodiscard]] bool gc_clock_runs() const noexcept {
    return config_.garbage_collection_threshold > 0.0;
  }

  /// A new segment over [base, base + size) of `pool` and `stream`, linked in as the newest, with
  /// one block over all of it: free (filed in the index) or unmapped (a reserved range: filed in
  /// the unmapped set). Returns the block. `space` is prepare_segment()'s, for `stream`: nothing
  /// here can fail.
  Block* add_segment(std::unique_ptr<Segment> space, BlockPool& pool, stream_t stream, char* base,
                     std::size_t size, BlockState initial) noexcept;
  /// A new expandable range over the reserved [va, va + bytes), in page slots of `page` bytes
  /// (`stitched`: a stitching range), with one block over all of it: unmapped, or free (a range
  /// whose pages the caller has just mapped and enters in its page table). As add_segment().
  Segment* add_range(std::unique_ptr<Segment> space, BlockPool& pool, stream_t stream, char* va,
                     std::size_t bytes, std::size_t page, bool stitched, BlockState initial) noexcept;
  /// The host memory a new segment of `stream` needs (the Segment, its stream's shard and its
  /// first block), taken before the caller changes the device (allocates, reserves, maps), so
  /// that adding the segment after that cannot fail. Throws std::bad_alloc with nothing changed
  /// (the stream's shard may be made).
  [[nodiscard]] std::unique_ptr<Segment> prepare_segment(stream_t stream);
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
  /// Best fit for `rounded` bytes of `stream` in `pool`: the smallest free block that may serve
  /// it, or nullptr. Changes nothing.
  [[nodiscard]] Block* find_fit(BlockPool& pool, stream_t stream, std::size_t rounded) const;
  /// A best-fit lookup in `pool` happened: the GC clock ticks (while it runs).
  void tick(BlockPool& pool) const noexcept {
    if (gc_clock_runs()) pool.clock->fetch_add(1, std::memory_order_relaxed);
  }
  /// tick() and find_fit().
  Block* best_fit(BlockPool& pool, stream_t stream, std::size_t rounded) {
    tick(pool);
    return find_fit(pool, stream, rounded);
  }
  /// The GC clock of the device's small or large pools.
  [[nodiscard]] std::uint64_t gc_clock(bool small) const noexcept {
    return shards_.clocks()[small ? 0 : 1].load(std::memory_order_relaxed);
  }
  /// Takes the free `block` (best_fit's) out of the index for `rounded` bytes, splitting off the
  /// rest when the policy says so; returns the block to hand out, allocated (the caller activates
  /// it). Throws std::bad_alloc with nothing changed.
  [[gnu::always_inline]] Block* take(BlockPool& pool, Block* block, std::size_t rounded);
  /// Files `block` free, coalescing it with free neighbours; returns the block it ended in.
  Block* file(BlockPool& pool, Block* block) noexcept;
  /// A block whose free completed (its caller's free, or its last event): it leaves the active
  /// set (its requested bytes), forgets its other streams and is filed. Returns the free block.
  Block* file_freed(Block* block) noexcept;

  // ---- the cache hit's last free (BlockPool::held; the shard's lock) -----------------------------
  /// The cache hit frees `block` of `pool` (its other statistics counted by the caller, the pool
  /// holding no block): held (BlockPool::held) when no free block precedes it, else filed. Never
  /// allocates.
  [[gnu::always_inline]] void file_or_hold(BlockPool& pool, Block* block) noexcept;
  /// The pool's held block for `rounded` bytes of `stream`, when best fit would take the free
  /// block it ends in (the held block at its front), as take() would make it: allocated (the
  /// caller activates it). nullptr, with nothing changed, otherwise. Throws std::bad_alloc with
  /// nothing changed.
  [[gnu::always_inline]] Block* take_held(BlockPool& pool, stream_t stream, std::size_t rounded);
  /// The size of the last block of `pool`'s index that comes before the free block the held
  /// block `held` ends in (it and its free successor) in best-fit order (stream, size, address),
  /// that successor aside, or 0: best fit for a request of r bytes takes that free block over
  /// every indexed one exactly when r is larger.
  [[nodiscard]] std::size_t best_fit_before(const BlockPool& pool, const Block* held) const;
  /// Parks the pool's free, indexed `block` (BlockPool::parked); the block parked before goes
  /// back into the index.
  void park(BlockPool& pool, Block* block) noexcept;
  /// Files the pool's held block, if any, as its free would have.
  void settle(BlockPool& pool) noexcept;
  /// The device lock's: every stream pool's held block filed and parked block indexed, so that
  /// every path under it sees the free blocks in the index.
  void settle_all() noexcept;
  /// Bytes [start, end) of `block`'s segment, whole pages inside the free `block`, become one
  /// block of state `to` (unmapped: merged with unmapped neighbours; lent); the rest stays free
  /// on either side. Returns the block.
  Block* take_pages(Block* block, std::size_t start, std::size_t end, BlockState to);
  /// The whole mapping at slots [first, first + count) of `segment` was unmapped and only the
  /// `keep` runs (in order, inside it) mapped again (a remap): the free slots between them, each
  /// gap inside one free block, become unmapped (take_pages).
  void unmapped_between(Segment& segment, std::size_t first, std::size_t count,
                        const std::vector<SlotRun>& keep);
  /// [at, at + bytes) of the unmapped `block` (whole pages) was mapped: the unmapped pieces
  /// before and after it stay unmapped, and it becomes free: filed coalesced (`merge`), or alone
  /// in the index (a recorded start state placed next). Returns the block.
  Block* mapped(Block* block, char* at, std::size_t bytes, bool merge);
  /// The next `blocks` new Block objects of `segment` will not fail for want of host memory
  /// (std::bad_alloc here instead, nothing changed): a caller about to change the device first
  /// (map, unmap) asks, so that the store's change that follows cannot fail.
  static void reserve(const Segment* segment, std::size_t blocks) { segment->shard->blocks.reserve(blocks); }
  /// The lent `block`'s second mapping is gone: it is free again where it lies.
  Block* return_lent(Block* block);
  /// A recorded start state: `blocks` (offsets from `origin`, address order) are placed inside
  /// the free `run` and returned allocated (nullptr for one outside it; the caller activates
  /// them), the rest stays free.
  std::vector<Block*> place(BlockPool& pool, Block* run, char* origin,
                            const std::vector<SeedBlock>& blocks);

  // ---- queries ----------------------------------------------------------------------------------
  /// The largest free block of the streams' shares of the device's pools.
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
  /// What coalesce() made: the block the filed one ends in, and the net change it makes to the
  /// inactive-split statistics (not counted yet).
  struct Coalesced {
    Block* survivor;
    std::int64_t inactive_blocks, inactive_bytes;
  };
  /// file() but for the inactive-split statistics: the held block's filing, counted at its free.
  Coalesced coalesce(BlockPool& pool, Block* block) noexcept;

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
  [[gnu::always_inline]] void account_inactive_change(const Block* block, std::int64_t blocks,
                                                      std::int64_t bytes) noexcept {
    // Expandable segments are never "inactive split": their free pages can always be unmapped.
    if (block->segment->expandable) return;
    hot_.inactive_change(block->shard->stats, block->small, blocks, bytes);
  }
  /// Gives `b`'s object back to its shard.
  static void destroy(Block* b) noexcept { b->shard->blocks.destroy(b); }

  const Config& config_;
  StreamShards& shards_;
  HotStats& hot_;
  /// The pools of a region tag (tagged segments that are not a private pool's).
  struct TagPools {
    explicit TagPools(std::uint16_t tag) : small(true, nullptr, tag), large(false, nullptr, tag) {}
    BlockPool small;
    BlockPool large;
  };
  std::vector<std::unique_ptr<TagPools>> tag_pools_;  ///< [tag - 1], created at first use
  Segment* segments_ = nullptr;
};

/// The free blocks of the streams' shares of one of the device's pools, shard after shard in
/// stream order, or of one tag's pool: a forward range over Block* (device lock).
class BlockStore::FreeBlocks {
 public:
  class iterator {
   public:
    using value_type = Block*;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    /// At the first block of `pool` (then of the shards after `shard`, when it is not null).
    iterator(const BlockPool* pool, StreamShard* shard, bool small) noexcept
        : pool_(pool), shard_(shard), small_(small) {
      if (pool_ != nullptr) it_ = pool_->index.begin();
      skip_empty();
    }
    Block* operator*() const noexcept { return *it_; }
    iterator& operator++() noexcept {
      ++it_;
      skip_empty();
      return *this;
    }
    iterator operator++(int) noexcept {
      iterator old = *this;
      ++*this;
      return old;
    }
    bool operator==(const iterator& o) const noexcept {
      return pool_ == o.pool_ && (pool_ == nullptr || it_ == o.it_);
    }

   private:
    /// Past the end of a pool: on to the next shard's, or the end.
    void skip_empty() noexcept {
      while (pool_ != nullptr && it_ == pool_->index.end()) {
        shard_ = shard_ != nullptr ? shard_->next.load(std::memory_order_relaxed) : nullptr;
        pool_ = shard_ != nullptr ? &shard_->pool(small_) : nullptr;
        if (pool_ != nullptr) it_ = pool_->index.begin();
      }
    }
    const BlockPool* pool_ = nullptr;  ///< nullptr: the end
    StreamShard* shard_ = nullptr;      ///< the shard whose pool this is (nullptr: a tag's)
    bool small_ = false;
    FreeIndex::iterator it_{};
  };

  /// `tag_pool`'s blocks, or (nullptr) those of every shard from `first`.
  FreeBlocks(const BlockPool* tag_pool, StreamShard* first, bool small) noexcept
      : begin_(tag_pool != nullptr ? iterator(tag_pool, nullptr, small)
                                   : iterator(first != nullptr ? &first->pool(small) : nullptr,
                                              first, small)) {}
  [[nodiscard]] iterator begin() const noexcept { return begin_; }
  [[nodiscard]] static iterator end() noexcept { return iterator(); }

 private:
  iterator begin_;
};

// ---- the fast path's operations, inline: a cache hit runs them all -----------------------------

inline Block* BlockStore::link_new_front(Block* b, std::size_t bytes, BlockState state) {
  Block* front = b->shard->blocks.create(b->ptr, bytes, b->stream, b->segment, b->shard, b->small, state);
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
  Block* back = b->shard->blocks.create(b->ptr + keep, b->size - keep, b->stream, b->segment,
                                        b->shard, b->small, state);
  back->prev = b;
  back->next = b->next;
  if (back->next != nullptr) back->next->prev = back;
  b->next = back;
  return back;
}

inline Block* BlockStore::find_fit(BlockPool& pool, stream_t stream, std::size_t rounded) const {
  auto it = pool.index.best_fit(stream, rounded);
  Block* block = it != pool.index.end() ? *it : nullptr;
  // The pool's parked block is one of its free blocks, out of the index (BlockPool::parked):
  // best fit weighs it in the same order, (size, address).
  if (Block* p = pool.parked; p != nullptr && p->size >= rounded &&
                              (block == nullptr || p->size < block->size ||
                               (p->size == block->size && p->ptr < block->ptr)))
    block = p;
  if (block == nullptr) return nullptr;
  // Oversize blocks (>= max_split_size) are never split: they serve only requests of at least
  // max_split_size, and only within max_non_split_rounding of their size.
  if (!may_serve(block->size, rounded)) return nullptr;
  return block;  // still in the index (or parked): take() takes it out
}

inline Block* BlockStore::take(BlockPool& pool, Block* block, std::size_t rounded) {
  STITCH_ASSERT(block->is_free() && block->size >= rounded,
                "take: a free, indexed block that holds the request");
  Block* out = block;
  const bool parked = block == pool.parked;
  if (!pool.no_split && should_split(block->small, block->segment->expandable, block->size, rounded)) {
    // A new block takes the front; `block` keeps the tail and stays in the index, re-keyed in
    // place (no tree rebalancing when its order is unchanged), or parked. An already split free
    // block shrinks; an unsplit one becomes a split remainder.
    const bool was_split = block->is_split();
    out = link_new_front(block, rounded, BlockState::allocated);  // (may throw: nothing changed)
    if (parked) {
      block->ptr += rounded;
      block->size -= rounded;
    } else {
      pool.index.shrink(block, block->ptr + rounded, block->size - rounded);
    }
    if (was_split) {
      account_inactive_change(block, 0, -static_cast<std::int64_t>(rounded));
    } else {
      account_inactive_change(block, 1, static_cast<std::int64_t>(block->size));
    }
  } else {
    account_inactive(block, -1);
    if (parked) {
      pool.parked = nullptr;
    } else {
      pool.index.erase(block);
    }
    set_state(*block, BlockState::allocated);
  }
  return out;
}

inline void BlockStore::file_or_hold(BlockPool& pool, Block* block) noexcept {
  if (block->prev != nullptr && block->prev->is_free()) {  // it ends in the block before it
    file(pool, block);  // (merges: never a tree insert)
    return;
  }
  // Held: counted as the filing would count it (merged with a free successor), and stamped.
  Block* next = block->next;
  if (next != nullptr && next->is_free()) {
    // One free block (the successor) becomes another (the two merged): split unless they make
    // the whole segment.
    if (block->prev != nullptr || next->next != nullptr) {
      account_inactive_change(block, 0, static_cast<std::int64_t>(block->size));
    } else {
      account_inactive_change(block, -1, -static_cast<std::int64_t>(next->size));
    }
    // Its free successor is parked when the pool parks none (once: then the pairs that follow
    // touch no tree).
    if (pool.parked == nullptr) {
      pool.index.erase(next);
      pool.parked = next;
    }
  } else if (block->prev != nullptr || next != nullptr) {
    account_inactive_change(block, 1, static_cast<std::int64_t>(block->size));
  }
  pool.held = BlockPool::Held{block, pool.clock->load(std::memory_order_relaxed)};
  set_state(*block, BlockState::held);
}

inline Block* BlockStore::take_held(BlockPool& pool, stream_t stream, std::size_t rounded) {
  Block* held = pool.held.block;
  // The free block the held one ends in: it and its free successor (its predecessor is not free).
  Block* next = held->next != nullptr && held->next->is_free() ? held->next : nullptr;
  const std::size_t size = held->size + (next != nullptr ? next->size : 0);
  if (size < rounded || !may_serve(size, rounded)) return nullptr;
  // Best fit among the other free blocks: the index without `next`, and the parked block.
  auto it = pool.index.best_fit(stream, rounded);
  if (it != pool.index.end() && *it == next) {
    ++it;
    if (it != pool.index.end() && (*it)->stream != stream) it = pool.index.end();
  }
  auto before = [&](const Block* b) {  // `b` comes first in best-fit order
    return b->size < size || (b->size == size && b->ptr < held->ptr);
  };
  if (it != pool.index.end() && before(*it)) return nullptr;
  if (Block* p = pool.parked;
      p != nullptr && p != next && p->size >= rounded && before(p))
    return nullptr;
  // Best fit takes it: what take() does to that free block, the held block its front.
  const bool split = should_split(held->small, held->segment->expandable, size, rounded);
  const bool was_split =
      held->prev != nullptr || (next != nullptr ? next->next : held->next) != nullptr;
  if (split && next == nullptr) {  // the rest needs a block of its own (may throw: nothing changed)
    held->shard->blocks.reserve(1);
  }
  tick(pool);  // one best-fit lookup
  if (split) {
    Block* rest = next;
    const std::size_t rest_size = size - rounded;
    if (rest == nullptr) {
      rest = link_new_back(held, rounded, BlockState::free);
      rest->size = rest_size;
      if (pool.parked == nullptr) {
        pool.parked = rest;
      } else {
        pool.index.insert(rest);
      }
    } else if (rest == pool.parked) {
      rest->ptr = held->ptr + rounded;
      rest->size = rest_size;
    } else if (rounded < held->size) {
      pool.index.grow(rest, held->ptr + rounded, rest_size);
    } else if (rounded > held->size) {
      pool.index.shrink(rest, held->ptr + rounded, rest_size);
    }
    held->size = rounded;
    rest->gc_stamp = pool.held.stamp;  // (the free block's stamp, which the rest keeps)
    if (was_split) {
      account_inactive_change(held, 0, -static_cast<std::int64_t>(rounded));
    } else {
      account_inactive_change(held, 1, static_cast<std::int64_t>(rest_size));
    }
  } else {
    if (next != nullptr) {  // the whole free block: the held one takes its successor in
      if (next == pool.parked) {
        pool.parked = nullptr;
      } else {
        pool.index.erase(next);
      }
      held->size = size;
      held->next = next->next;
      if (held->next != nullptr) held->next->prev = held;
      destroy(next);
    }
    if (was_split) account_inactive_change(held, -1, -static_cast<std::int64_t>(size));
  }
  pool.held = BlockPool::Held{};
  set_state(*held, BlockState::allocated);
  return held;
}

inline Block* BlockStore::file(BlockPool& pool, Block* block) noexcept {
  const Coalesced c = coalesce(pool, block);
  account_inactive_change(c.survivor, c.inactive_blocks, c.inactive_bytes);
  return c.survivor;
}

inline BlockStore::Coalesced BlockStore::coalesce(BlockPool& pool, Block* block) noexcept {
  // Coalesces a block with its free neighbours. A free neighbour survives (re-keyed in place, or
  // as the pool's parked block) and `block` is recycled, so the common case needs no tree insert.
  STITCH_ASSERT(may_become(block->state, BlockState::free), "file: a block that may become free");
  // The inactive_split statistics change once, by the net effect (as PyTorch's free_block):
  // each merged neighbour (a free block in a split segment) leaves, the survivor joins.
  Block* prev = block->prev != nullptr && block->prev->is_free() ? block->prev : nullptr;
  Block* next = block->next != nullptr && block->next->is_free() ? block->next : nullptr;
  std::int64_t inactive_blocks = -static_cast<std::int64_t>((prev != nullptr) + (next != nullptr));
  std::int64_t inactive_bytes = -static_cast<std::int64_t>((prev != nullptr ? prev->size : 0) +
                                                           (next != nullptr ? next->size : 0));
  auto leaves = [&](Block* b) {  // a free neighbour merged away
    if (b == pool.parked) {
      pool.parked = nullptr;
    } else {
      pool.index.erase(b);
    }
  };
  Block* survivor = block;
  char* ptr = block->ptr;
  std::size_t size = block->size;
  if (prev != nullptr) {
    survivor = prev;
    ptr = prev->ptr;
    size += prev->size;
    if (next != nullptr) {
      size += next->size;
      leaves(next);
    }
    Block* after = next != nullptr ? next->next : block->next;
    prev->next = after;
    if (after != nullptr) after->prev = prev;
    if (next != nullptr) destroy(next);
    destroy(block);
  } else if (next != nullptr) {
    survivor = next;
    size += next->size;
    next->prev = block->prev;
    if (block->prev != nullptr) {
      block->prev->next = next;
    } else {
      next->segment->head = next;
    }
    destroy(block);
  } else {
    set_state(*block, BlockState::free);
  }
  if (survivor == block) {
    pool.index.insert(block);
  } else if (survivor == pool.parked) {
    survivor->ptr = ptr;
    survivor->size = size;
  } else {
    pool.index.grow(survivor, ptr, size);
  }
  survivor->gc_stamp = pool.clock->load(std::memory_order_relaxed);
  if (survivor->is_split()) {
    inactive_blocks += 1;
    inactive_bytes += static_cast<std::int64_t>(survivor->size);
  }
  return Coalesced{survivor, inactive_blocks, inactive_bytes};
}

inline Block* BlockStore::file_freed(Block* block) noexcept {
  BlockPool& pool = pool_of(block);
  HotStats::inactive_block(block->shard->stats, block->small,
                           static_cast<std::int64_t>(block->requested));
  block->requested = 0;
  block->pins = 0;  // a pin lasts until the free
  block->stream_uses.clear();
  return file(pool, block);
}

}  // namespace stitch::detail
