// core/block_pool.hpp — BlockPool: the free blocks of one size class (small <= 1 MiB, or large)
// of one owner: a stream's share of the device's pool (core/stream_shard.hpp), a region tag's
// (core/sleeper.hpp) or a private (graph) pool's, best fit by FreeIndex.
#pragma once

#include <atomic>
#include <cstdint>

#include "core/block.hpp"
#include "core/block_tree.hpp"
#include "core/free_index.hpp"
#include "core/pair_verdict.hpp"

namespace stitch::detail {

struct PrivatePool;

struct BlockPool {
  /// `gc_clock`: the clock it shares (the device's, for the streams' pools); nullptr: its own.
  explicit BlockPool(bool is_small, PrivatePool* of = nullptr, std::uint16_t tag_id = 0,
                     std::atomic<std::uint64_t>* gc_clock = nullptr)
      : index(of == nullptr && tag_id == 0),  // (the device's own pools are a stream shard's)
        small(is_small), owner(of), tag(tag_id), clock(gc_clock != nullptr ? gc_clock : &own_clock) {}
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  FreeIndex index;
  BlockTree<AddressOrder> unmapped;  ///< expandable segments' unmapped ranges
  /// A free block of the pool kept out of the index, or nullptr: the free block after the latest
  /// held one (the stream's last free), so that the pairs of a training loop (free, then allocate
  /// the same size or another) split and merge it without touching the tree. Best fit weighs it as if
  /// it were indexed (BlockStore::find_fit), so nothing anyone sees changes. Only the cache hit
  /// parks (BlockStore::file_or_hold, take_held); the device lock puts it back in the index when
  /// it is taken (BlockStore::settle_all), so every path under the device lock sees every free
  /// block indexed.
  Block* parked = nullptr;
  /// A private pool PyTorch marked setNoSplit: its free blocks serve requests whole, unsplit.
  bool no_split = false;
  /// The cache hit's last free of the pool, not filed yet (state held), or no block: the free's
  /// statistics are counted, the inactive-split ones as its filing makes them, and `stamp` is the
  /// GC clock the filing would give the block it ends in. The pool's next request takes it back (BlockStore::take_held: a
  /// request that best fit serves from the free block it would end in, at its address) or files
  /// it (BlockStore::settle) first; the device lock files it (BlockStore::settle_all).
  struct Held {
    Block* block = nullptr;
    std::uint64_t stamp = 0;
  } held;
  /// What the cache hit decided about the held block's pairs (core/pair_verdict.hpp).
  PairVerdict verdict;
  bool small;
  /// The private pool it is part of (its new segments belong to it); nullptr for the device's.
  PrivatePool* owner;
  /// The region tag of its memory (0: untagged). A tagged pool's segments are expandable ranges
  /// of their own: pages never cross tags, so that a sleep frees what it unmaps.
  std::uint16_t tag;
  /// The garbage-collection clock: best-fit lookups, counted while garbage_collection_threshold
  /// is set (BlockStore::best_fit); a freed block is stamped with it. The device's pools of every
  /// stream share one per size class, as PyTorch's one pool does.
  std::atomic<std::uint64_t>* clock;
  std::atomic<std::uint64_t> own_clock{0};
};

}  // namespace stitch::detail
