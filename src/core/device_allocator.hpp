// core/device_allocator.hpp — the caching allocator of one device.
//
// Owns the device's segments and blocks, its two block pools (small <= 1 MiB, large), the
// live-allocation table and the statistics, all under one lock. The fast path (a cache hit) is:
// lock, best-fit lookup, optional split, table insert, unlock — no heap allocation, no scan, no
// backend call. The concepts around it are types of their own:
// - device_lock.hpp: the lock, which settles the threads' parked frees of immediate reuse;
// - thread_slots.hpp: immediate reuse per thread (each thread's parked free, the stream epochs);
// - ledger.hpp: what is held from the device, and the memory-fraction cap;
// - stream_events.hpp: cross-stream events;
// - page_table.hpp: an expandable range's page slots;
// - page_mapper.hpp: the physical pages of expandable ranges, mapped all or nothing;
// - stitcher.hpp: virtual-memory stitching.
// Member functions by file: device_allocator.cpp (entry points, fast path), device_growth.cpp
// (the slow-path ladder and its one source of new memory), expandable.cpp (expandable ranges),
// device_oom.cpp (a failed request), device_seed.cpp (replays' start state),
// device_snapshot.cpp, device_validate.cpp.
#pragma once

#include <atomic>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/block.hpp"
#include "core/block_pool.hpp"
#include "core/device_lock.hpp"
#include "core/free_index.hpp"
#include "core/hot_stats.hpp"
#include "core/ledger.hpp"
#include "core/object_pool.hpp"
#include "core/page_mapper.hpp"
#include "core/private_pool.hpp"
#include "core/ptr_map.hpp"
#include "core/spin_lock.hpp"
#include "core/stitcher.hpp"
#include "core/stream_events.hpp"
#include "core/thread_slots.hpp"
#include "core/oom_capture.hpp"
#include "diagnostics/recorder.hpp"
#include "stitch/backend.hpp"
#include "stitch/block_info.hpp"
#include "stitch/config.hpp"
#include "stitch/snapshot.hpp"
#include "stitch/stats.hpp"

namespace stitch {

/// Result of a free attempt on one device.
enum class FreeStatus { freed, not_found, wrong_size };

class DeviceAllocator {
 public:
  DeviceAllocator(int device, Backend& backend, const Config& config);
  ~DeviceAllocator();
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  /// What malloc() returns: the block, or nullptr and, for a request that could not be served,
  /// what the device knew (`failure`, owned by the caller, who reports it after this device's
  /// lock is released; null for 0 bytes). Two registers: the hit path pays nothing for it.
  struct Allocation {
    void* ptr;
    detail::OomCapture* failure;
  };
  /// Allocates `size` bytes for `stream`. Throws backend_error.
  Allocation malloc(std::size_t size, stream_t stream);
  /// Frees `ptr` if this device owns it. `expected_size` (if not null) must equal the requested
  /// size; `stream` (if not null and not the allocation stream) is treated as a last use. The
  /// requested size is stored in `actual_size` when given.
  FreeStatus free(void* ptr, const std::size_t* expected_size, const stream_t* stream,
                  std::size_t* actual_size = nullptr);
  /// Adds `stream` as a user of the live block at `ptr`; false if this device does not own it.
  bool record_stream(void* ptr, stream_t stream);
  /// Returns every entirely free segment to the device (waits for outstanding events first).
  void empty_cache();
  /// Caps reserved memory at `fraction` of the device's capacity (>= 1: no cap).
  void set_memory_fraction(double fraction);
  /// The cap as a fraction of the device's capacity; 1 without a cap.
  [[nodiscard]] double memory_fraction() const;
  /// Applies new tunables (the backend keys are ignored here). The memory fraction is applied
  /// when `apply_fraction` (the key was given) or when it differs from the current setting, so
  /// a fraction set with set_memory_fraction() survives a configure() of other keys.
  void set_config(const Config& config, bool apply_fraction);

  /// The statistics, after retiring the cross-stream events that have completed (so a block
  /// whose streams are done counts as free, not active, whether or not an allocation came since).
  [[nodiscard]] DeviceStats stats();
  /// Appends this device's segments to `out` and returns its trace (records a `snapshot`).
  std::vector<TraceEntry> snapshot(std::vector<SegmentSnapshot>& out);
  void reset_peak_stats();
  void reset_accumulated_stats();
  void count_invalid_free();
  [[nodiscard]] std::optional<BlockInfo> find(const void* ptr) const;
  /// Throws stitch::error on the first broken invariant (see Allocator::validate).
  void validate() const;

  [[nodiscard]] int device() const noexcept { return device_; }

  // ---- private pools: CUDA graphs and MemPools (private_pools.cpp, core/private_pool.hpp) ----
  /// Routes the allocations on the streams `filter` accepts to private pool `id` (created at the
  /// first call; each call is one use) until end_allocate_to_pool(id).
  void begin_allocate_to_pool(PoolId id, StreamFilter filter);
  /// Ends the route to `id` begun last; once no route is left, the events of the blocks freed
  /// meanwhile are recorded at the next allocation (or empty_cache), after the capture itself
  /// has ended. Throws invalid_argument if no route to `id` is underway.
  void end_allocate_to_pool(PoolId id);
  /// Drops one use of pool `id`; at none, its memory goes back to the device as soon as (and
  /// whenever) its blocks are all free and no route is underway. Throws invalid_argument for an
  /// unknown pool.
  void release_pool(PoolId id);

  // ---- for replays: a recorded start state, and releases as the recording made them
  //      (device_seed.cpp) -------------------------------------------------------------------
  /// A block placed by seed_segment() or seed_expandable().
  struct SeedBlock {
    std::size_t offset = 0;     ///< from the segment's start (plain) or the range's (expandable)
    std::size_t size = 0;       ///< bytes of the block (a multiple of 512)
    std::size_t requested = 0;  ///< bytes asked for
  };
  /// A mapped run [offset, offset + size) of an expandable range (page multiples).
  struct SeedRun {
    std::size_t offset = 0;
    std::size_t size = 0;
  };
  /// A plain segment of `bytes` in the small or large pool of `stream`, with `blocks` (address
  /// order, inside it, not overlapping) allocated and the rest free, as if the blocks had been
  /// allocated and their neighbours freed. Returns the blocks' pointers in order; empty when
  /// the device cannot give the segment (nothing changed then).
  std::vector<void*> seed_segment(stream_t stream, bool small, std::size_t bytes,
                                  const std::vector<SeedBlock>& blocks);
  /// A new expandable range of `stream` and pool with `runs` (address order) mapped and
  /// `blocks` allocated in them. Returns the blocks' pointers in order (nullptr for a block of a
  /// run the device could not map; the runs before it stay).
  std::vector<void*> seed_expandable(stream_t stream, bool small, const std::vector<SeedRun>& runs,
                                     const std::vector<SeedBlock>& blocks);
  /// Returns one entirely free plain segment of exactly `bytes` on `stream` to the device (the
  /// one with the lowest address); false if there is none.
  bool release_free_segment(stream_t stream, std::size_t bytes);
  /// The page size of expandable ranges in the small or large pool.
  [[nodiscard]] std::size_t expandable_page(bool small);

  /// Immediate reuse (on by default): a free is completed lazily, parked in the calling
  /// thread's slot, so that the thread's next allocation of the same size on the same stream
  /// takes the block straight back when the completed free would have led to the very same block
  /// (see reuse_effect and core/thread_slots.hpp). Off, every free files its block at once.
  /// Results are identical either way; tests compare the two.
  void set_immediate_reuse(bool on);

 private:
  using Block = detail::Block;
  using Segment = detail::Segment;

  using NodeStorage = detail::PoolAllocator<detail::Block*>::Storage;

  using Pool = detail::BlockPool;

  // fast path (device_allocator.cpp)
  Block* get_free_block(Pool& pool, stream_t stream, std::size_t rounded);
  /// get_free_block's policy: may a free block of `block_size` serve `rounded` bytes?
  /// (Oversize blocks, >= max_split_size, serve only oversize requests close to their size.)
  [[nodiscard]] bool may_serve(std::size_t block_size, std::size_t rounded) const noexcept {
    const std::size_t max_split = config_.max_split_size;
    if (rounded < max_split) return block_size < max_split;
    return block_size < rounded + config_.max_non_split_rounding;
  }
  // immediate reuse, per thread (device_allocator.cpp; core/thread_slots.hpp)
  using PairEffect = detail::PairEffect;
  /// Whether a request of `rounded` bytes on its stream, right after filing the freed `block`,
  /// would get this very block back and leave everything else as it is (the best fit of the
  /// filed block, merged with a free successor); and how the pair moves the inactive-split
  /// statistics. Under the lock; changes nothing.
  [[nodiscard]] std::optional<PairEffect> reuse_effect(const Block* block,
                                                       std::size_t rounded) const;
  /// Applies `times` pairs (a free and the same allocation again) of `block` to the statistics.
  void apply_pairs(const Block* block, const PairEffect& effect, std::uint64_t times) noexcept;
  /// The inactive-split part of `n` pairs.
  void apply_inactive(const Block* block, const PairEffect& effect, std::int64_t n) noexcept;
  /// The slot's parked block, handed out again without the device lock when it is the one best
  /// fit would give; nullptr otherwise.
  [[gnu::always_inline]] inline void* take_parked(detail::ThreadSlot& slot, std::size_t size,
                                                  stream_t stream) noexcept;
  /// Parks the slot's handed-out block again without the device lock when it is `ptr` and the
  /// free needs nothing else (its own stream, the size it was allocated with).
  [[gnu::always_inline]] inline bool park_again(detail::ThreadSlot& slot, void* ptr,
                                                const std::size_t* expected_size,
                                                const stream_t* stream,
                                                std::size_t* actual_size) noexcept;
  /// Parks the freed `block` in the calling thread's slot (under the lock).
  void park(detail::ThreadSlot& slot, Block* block);
  /// Settles `slot` (under the lock): the running sums of its pairs, then its block: a parked
  /// one is freed and filed, a handed-out one becomes an ordinary allocation. True when the
  /// block was parked.
  bool settle_slot(detail::ThreadSlot& slot);
  /// settle_slot when the slot's block is parked (under the lock).
  void settle_if_parked(detail::ThreadSlot& slot);
  /// Adds the running sums of the slot's pairs so far (under the lock), keeping its block.
  void flush_pairs(detail::ThreadSlot& slot) noexcept;
  /// Settles every thread's slot; the device lock calls it (core/device_lock.hpp), so every
  /// path but malloc's and free's sees every free completed. Settling changes the
  /// representation only, never what any query reports, so the const queries may lock too.
  void settle_slots();
  /// Settles the other threads' slots whose block is parked on `stream`: a locked allocation
  /// on `stream` then sees their memory free, as it is.
  void settle_parked_on(stream_t stream, const detail::ThreadSlot* except);
  /// `stream`'s free blocks changed: its parked blocks' reusable verdicts are void.
  static void bump(const Segment* segment) noexcept {
    // Written under the device lock only: a load and a store, no read-modify-write.
    std::atomic<std::uint64_t>* e = segment->epoch;
    if (e != nullptr) e->store(e->load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }
  /// Whether thread slots may take pairs without the lock (immediate reuse on, no recording),
  /// and whether events are outstanding (the locked path polls them first).
  void note_fast_ok() noexcept {
    fast_ok_.store(immediate_reuse_ && !recorder_.enabled() && routes_.empty(),
                   std::memory_order_relaxed);
  }
  void note_events() noexcept {
    events_pending_.store(events_.outstanding() != 0, std::memory_order_relaxed);
  }
  friend class detail::DeviceLock<DeviceAllocator>;
  friend class detail::Stitcher;  // works on the blocks through the operations below
  /// Takes the free, indexed `block` out of the index for `rounded` bytes, splitting off the
  /// rest when the policy says so; returns the block to hand out.
  Block* take_found_block(Pool& pool, Block* block, std::size_t rounded);
  /// Marks `block` allocated for a request of `requested` bytes and counts it.
  [[gnu::always_inline]] inline void activate(Block* block, std::size_t requested) noexcept;
  /// activate, out of line, for the slow paths of other files.
  void activate_slow(Block* block, std::size_t requested) noexcept;
  /// activate without the fast path's statistics (the caller moves those).
  [[gnu::always_inline]] inline void mark_allocated(Block* block, std::size_t requested) noexcept;

  [[nodiscard]] bool should_split(const Block* block, std::size_t rounded) const noexcept {
    return should_split(block->small, block->segment->expandable, block->size, rounded);
  }
  [[nodiscard]] bool should_split(bool small, bool expandable, std::size_t block_size,
                                  std::size_t rounded) const noexcept;
  [[gnu::always_inline]] inline void free_block(Block* block);
  /// free_block's work after the trace: the block leaves the active set and is filed.
  void file_free_block(Block* block);
  /// A new block for the first `bytes` of `b`, linked in before it. `b` keeps its address and
  /// size: the caller moves them (through the free index when `b` is in it).
  Block* link_new_front(Block* b, std::size_t bytes) {
    Block* front = blocks_.create(b->ptr, bytes, b->stream, b->segment, b->small);
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
  /// A new block for the bytes of `b` from offset `keep` on, linked in after it. `b` keeps its
  /// size: the caller shrinks it.
  Block* link_new_back(Block* b, std::size_t keep) {
    Block* back = blocks_.create(b->ptr + keep, b->size - keep, b->stream, b->segment, b->small);
    back->prev = b;
    back->next = b->next;
    if (back->next != nullptr) back->next->prev = back;
    b->next = back;
    return back;
  }
  Block* insert_free(Pool& pool, Block* block);
  /// Adds (sign > 0) or removes a free block's share of the inactive_split statistics.
  void account_inactive(const Block* block, int sign) noexcept {
    if (!block->is_free() || !block->is_split()) return;
    account_inactive_change(block, sign, sign * static_cast<std::int64_t>(block->size));
  }
  /// Applies a net change of the inactive_split statistics in `block`'s pool, once, as PyTorch
  /// does for a split or a merge (so its running sums count what PyTorch's count).
  void account_inactive_change(const Block* block, std::int64_t blocks, std::int64_t bytes) noexcept {
    // Expandable segments are never "inactive split": their free pages can always be unmapped.
    if (block->segment->expandable) return;
    auto apply = [small = block->small](detail::PoolCounter& c, std::int64_t n) {
      if (n > 0) c.add(small, n);
      if (n < 0) c.sub(small, -n);
    };
    apply(hot_.inactive_split, blocks);
    apply(hot_.inactive_split_bytes, bytes);
  }
  /// DeviceStats with the fast path's counters expanded in (the lock is held).
  [[nodiscard]] DeviceStats stats_locked() const noexcept;
  /// A pending block's last event completed: it becomes free.
  void complete_pending(Block* block);
  /// For the readers: retires the completed events, unless a route is underway or a stream with
  /// events outstanding is capturing (querying its events would break the capture).
  void retire_completed_events();

  // slow path (device_growth.cpp)
  /// New memory for a request the cache cannot serve, through the out-of-memory ladder; nullptr
  /// with the failure captured in failed_ when even the last resort fails.
  Block* allocate_slow(Pool& pool, stream_t stream, std::size_t rounded, std::size_t requested);
  /// The device's one source of new memory for a request of `rounded` bytes: a plain segment of
  /// `alloc_size`, or (expandable segments) pages mapped into the stream's range. A free block
  /// (in the index) covering the request, or nullptr when the device or the cap refuses.
  Block* grow(Pool& pool, stream_t stream, std::size_t rounded, std::size_t alloc_size);
  /// What grow() obtains for `rounded` bytes: the segment size, or the request in whole pages.
  [[nodiscard]] std::size_t growth_size(bool small, std::size_t rounded);
  Block* alloc_segment(Pool& pool, stream_t stream, std::size_t bytes);
  /// A new segment over [base, base + size) of `pool` and `stream`, linked into the segment
  /// list, with one block over all of it as its head (returned; its segment is block->segment).
  Block* link_new_segment(Pool& pool, stream_t stream, char* base, std::size_t size);
  /// Takes `segment` out of the segment list and deletes it, with its only block `head`.
  void unlink_segment(Segment* segment, Block* head) noexcept;
  void release_segment(Block* block);
  bool release_cached_blocks();
  bool release_available_cached_blocks(stream_t stream, std::size_t rounded);
  void garbage_collect();

  // expandable segments (expandable.cpp)
  Block* grow_expandable(Pool& pool, stream_t stream, std::size_t rounded);
  /// grow_expandable without stitching: PyTorch's search over chains of free and unmapped blocks.
  /// Mapping pages of `unit` bytes into ranges with slots of `slot` bytes (the same, or one
  /// granule for stitching ranges).
  Block* grow_expandable_chain(Pool& pool, stream_t stream, std::size_t rounded, std::size_t slot,
                               std::size_t unit);
  /// Stitching only: whether a grow by `bytes` would take reserved memory past stitch_fine_above
  /// of what the device and the memory fraction allow (then growth uses fine pages and page
  /// reuse).
  [[nodiscard]] bool short_of_memory(std::size_t bytes);
  /// Maps the first `bytes` (whole slots) of the unmapped block `target`, in handles of `unit`
  /// bytes and one-slot handles for the rest, and files them free, merged with free neighbours;
  /// nullptr (nothing changed) when the device or the memory fraction cannot give them.
  Block* map_front(Pool& pool, Block* target, std::size_t bytes, std::size_t unit);
  /// The bookkeeping after `bytes` at the front of `target` were mapped: returns the free block.
  Block* file_mapped(Pool& pool, Block* target, std::size_t bytes);
  /// A new expandable range of `stream` in `pool`, in pages of `page` bytes.
  Segment* create_expandable(Pool& pool, stream_t stream, std::size_t min_bytes, std::size_t page);
  /// A segment over the reserved, wholly unmapped range [va, va + bytes) in pages of `page`:
  /// one unmapped block, filed in pool.unmapped (expandable; stitched when `stitched`).
  Segment* adopt_unmapped_range(Pool& pool, stream_t stream, char* va, std::size_t bytes,
                                std::size_t page, bool stitched);
  void release_expandable_pages();
  void unmap_free_pages(Block* block);
  /// Bookkeeping only: bytes [start, end) of `block`'s segment (whole pages inside the free
  /// `block`) become an unmapped block; the rest of `block` stays free on either side.
  void mark_unmapped(Block* block, std::size_t start, std::size_t end);
  /// Bookkeeping only: bytes [start, end) of `block`'s segment (whole pages inside the free
  /// `block`) leave the free index as one block, returned; the rest stays free on either side.
  Block* carve(Block* block, std::size_t start, std::size_t end);
  /// A lent block whose memory's second mapping is gone: free again where it lies, counted there.
  void return_lent(Block* lent) noexcept;
  Block* insert_unmapped(Block* block);
  void split_unmapped_tail(Block* block, std::size_t keep);
  /// The page of expandable ranges: coarse (PyTorch's: 2 MiB small pool, 20 MiB large pool) or
  /// fine (one granule).
  [[nodiscard]] std::size_t page_size(bool small, bool fine);
  /// Returns a wholly unmapped expandable range (one unmapped block) to the device.
  bool release_if_unmapped(Segment* segment);

  // a failed request (device_oom.cpp)
  /// Counts a failed request and captures its facts (and a what-if check's input) in failed_.
  void capture_oom(std::size_t requested, std::size_t rounded, std::size_t alloc_size, bool small,
                   stream_t stream);
  [[nodiscard]] std::size_t largest_free_block() const;
  /// The workload's raw material and the device's shape, for a request on `stream` that failed.
  [[nodiscard]] std::shared_ptr<const detail::WhatIfInput> what_if_input(stream_t stream) const;
  /// Appends every mapped run of every segment to `out` as a snapshot segment (newest segment
  /// first, or oldest first); the lock is held.
  void segments_locked(std::vector<SegmentSnapshot>& out, bool oldest_first) const;
  /// Why the recorded history cannot be replayed as the whole workload ("" when it can).
  [[nodiscard]] std::string history_gap() const;

  // seeding (device_seed.cpp)
  /// Allocates `blocks` (offsets from `origin`) inside `free_run`, a free mapped block out of
  /// the index; files what stays free. Appends each block's pointer (nullptr for one that does
  /// not lie in the run) to `out`.
  void carve(Pool& pool, Block* free_run, char* origin, const std::vector<SeedBlock>& blocks,
             std::vector<void*>& out);

  // validation (device_validate.cpp)
  void validate_locked() const;

  void trace(TraceAction action, const void* addr, std::size_t size, stream_t stream) {
    if (recorder_.enabled()) recorder_.record(action, addr, size, stream);
  }

  Pool& pool_for(bool small) noexcept { return small ? small_ : large_; }
  /// The pool a block of `segment` is filed in: its private pool's, or the device's.
  Pool& pool_of(const Segment* segment) noexcept {
    return segment->private_pool != nullptr ? segment->private_pool->pool(segment->small)
                                            : pool_for(segment->small);
  }
  Pool& pool_of(const Block* block) noexcept { return pool_of(block->segment); }
  const Pool& pool_of_const(const Block* block) const noexcept {
    return const_cast<DeviceAllocator*>(this)->pool_of(block->segment);
  }

  // private pools (private_pools.cpp)
  /// The pool an allocation of `small` size on `stream` comes from while routes are underway:
  /// the newest route's that accepts the stream, else the device's.
  Pool& routed_pool(stream_t stream, bool small);
  /// allocate_slow for a private pool, or while a route is underway: new memory only (a plain
  /// segment for a private pool), nothing released, synchronized or moved.
  Block* allocate_quiet(Pool& pool, stream_t stream, std::size_t rounded, std::size_t requested);
  /// A freed block used on other streams while a route is underway or one of its streams
  /// captures: pending, its events recorded at an allocation once neither holds.
  void defer_events(Block* block);
  /// Whether the block's stream or one it was used on is capturing a graph (the back end says).
  bool uses_capturing_stream(const Block* block);
  /// Records the deferred blocks' events (no route underway any more; malloc and
  /// release_cached_blocks call it).
  void record_deferred_events();
  /// Returns the entirely free segments of released private pools, and forgets such a pool once
  /// it holds none (no route underway).
  void release_private_pools();

  const int device_;
  Backend& backend_;
  Config config_;
  bool configured_ = false;             ///< set_config() ran once
  std::size_t device_total_ = 0;        ///< the device's memory, once short_of_memory asked

  mutable detail::DeviceLock<DeviceAllocator> mutex_{this};
  NodeStorage index_nodes_;
  detail::ObjectPool<Block> blocks_;
  Pool small_{&index_nodes_, true};
  Pool large_{&index_nodes_, false};
  /// The live allocations; also the blocks parked in the threads' slots (freed by the caller,
  /// not completed yet: see set_immediate_reuse), which mutex_ settles for every path but
  /// malloc's and free's.
  detail::PtrMap<Block> live_;
  bool immediate_reuse_ = true;
  detail::ThreadSlots slots_;                  ///< immediate reuse, per thread
  std::atomic<bool> fast_ok_{true};            ///< see note_fast_ok
  std::atomic<bool> events_pending_{false};    ///< see note_events
  std::atomic<bool> python_frames_{false};     ///< the history takes Python frames
  Segment* segments_ = nullptr;  ///< intrusive list of every segment
  DeviceStats stats_;      ///< every statistic except the fast path's (hot_)
  detail::Ledger ledger_{stats_};  ///< what is held from the device, and the memory-fraction cap
  detail::HotStats hot_;   ///< allocation, active, requested and inactive-split counters
  detail::Recorder recorder_;
  /// The failure of the request in progress, until malloc hands it to its caller.
  std::unique_ptr<detail::OomCapture> failed_;

  detail::StreamEvents events_{backend_, device_};  ///< cross-stream events (slow path only)
  /// Private pools by id, and the routes underway to them, oldest first (core/private_pool.hpp).
  std::map<PoolId, std::unique_ptr<detail::PrivatePool>> private_pools_;
  std::vector<detail::PoolRoute> routes_;
  std::vector<Block*> deferred_;  ///< freed during a route, used on other streams: no events yet
  /// The physical pages of expandable ranges, and what failed undos left (page_mapper.hpp).
  detail::PageMapper pages_{backend_, device_};
  detail::Stitcher stitcher_{*this};  ///< stitching:True (stitcher.hpp)
};

}  // namespace stitch
