// core/device_allocator.hpp — the caching allocator of one device.
//
// Owns the device's segments, its two block pools (small <= 1 MiB, large), the live-allocation
// table, the cross-stream events and the statistics, all under one mutex. The fast path (a cache
// hit) is: lock, best-fit lookup, optional split, table insert, unlock — no heap allocation, no
// scan, no backend call. Everything that talks to the backend is on the slow path.
#pragma once

#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/block.hpp"
#include "core/free_index.hpp"
#include "core/object_pool.hpp"
#include "core/ptr_map.hpp"
#include "core/spin_lock.hpp"
#include "diagnostics/recorder.hpp"
#include "stitch/allocator.hpp"
#include "stitch/backend.hpp"
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

  /// Allocates `size` bytes for `stream`; throws out_of_memory or backend_error.
  void* malloc(std::size_t size, stream_t stream);
  /// Frees `ptr` if this device owns it. `expected_size` (if given) must equal the requested
  /// size; `stream` (if given and not the allocation stream) is treated as a last use.
  FreeStatus free(void* ptr, std::optional<std::size_t> expected_size,
                  std::optional<stream_t> stream, std::size_t* actual_size = nullptr);
  /// Adds `stream` as a user of the live block at `ptr`; false if this device does not own it.
  bool record_stream(void* ptr, stream_t stream);
  /// Returns every entirely free segment to the device (waits for outstanding events first).
  void empty_cache();
  /// Caps reserved memory at `fraction` of the device's capacity (>= 1: no cap).
  void set_memory_fraction(double fraction);
  /// Applies new tunables (the backend keys are ignored here). The memory fraction is applied
  /// when `apply_fraction` (the key was given) or when it differs from the current setting, so
  /// a fraction set with set_memory_fraction() survives a configure() of other keys.
  void set_config(const Config& config, bool apply_fraction);

  [[nodiscard]] DeviceStats stats() const;
  /// Appends this device's segments to `out` and returns its trace (records a `snapshot`).
  std::vector<TraceEntry> snapshot(std::vector<SegmentSnapshot>& out);
  void reset_peak_stats();
  void reset_accumulated_stats();
  void count_invalid_free();
  [[nodiscard]] std::optional<Allocator::BlockInfo> find(const void* ptr) const;
  /// Throws stitch::error on the first broken invariant (see Allocator::validate).
  void validate() const;

  [[nodiscard]] int device() const noexcept { return device_; }

 private:
  using Block = detail::Block;
  using Segment = detail::Segment;

  using NodeStorage = detail::PoolAllocator<detail::Block*>::Storage;

  struct Pool {
    Pool(NodeStorage* nodes, bool is_small) : index(nodes), small(is_small) {}
    detail::FreeIndex index;
    detail::UnmappedSet unmapped;  ///< expandable segments' unmapped ranges
    bool small;
    std::uint64_t calls = 0;  ///< get_free_block calls: the GC clock
  };

  // fast path (allocator.cpp)
  Block* get_free_block(Pool& pool, stream_t stream, std::size_t rounded);
  Block* alloc_found_block(Pool& pool, Block* block, std::size_t rounded, std::size_t requested);
  [[nodiscard]] bool should_split(const Block* block, std::size_t rounded) const noexcept;
  void free_block(Block* block);
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
    // Expandable segments are never "inactive split": their free pages can always be unmapped.
    if (!block->is_free() || !block->is_split() || block->segment->expandable) return;
    const auto bytes = static_cast<std::int64_t>(block->size);
    const int pool = block->small ? kSmallPool : kLargePool;
    for (int i : {int{kAll}, pool}) {
      if (sign > 0) {
        stats_.inactive_split[i].increase(1);
        stats_.inactive_split_bytes[i].increase(bytes);
      } else {
        stats_.inactive_split[i].decrease(1);
        stats_.inactive_split_bytes[i].decrease(bytes);
      }
    }
  }

  // slow path (device_allocator_slow.cpp)
  Block* allocate_slow(Pool& pool, stream_t stream, std::size_t rounded, std::size_t requested);
  Block* alloc_segment(Pool& pool, stream_t stream, std::size_t bytes);
  void release_segment(Block* block);
  bool release_cached_blocks();
  bool release_available_cached_blocks(stream_t stream, std::size_t rounded);
  void garbage_collect();

  // expandable segments (expandable.cpp)
  Block* grow_expandable(Pool& pool, stream_t stream, std::size_t rounded);
  Segment* create_expandable(Pool& pool, stream_t stream, std::size_t min_bytes);
  bool map_pages(Segment* segment, std::size_t first, std::size_t count);
  /// Unmaps `bytes` at `va` while undoing; if that fails too, files the range as stray.
  void unmap_or_stray(char* va, std::size_t bytes) noexcept;
  /// Retries the unmap of every stray range; throws (keeping the rest) if one fails again.
  void unmap_strays();
  void release_expandable_pages();
  void unmap_free_pages(Block* block);
  /// Bookkeeping only: bytes [start, end) of `block`'s segment (whole pages inside the free
  /// `block`) become an unmapped block; the rest of `block` stays free on either side.
  void mark_unmapped(Block* block, std::size_t start, std::size_t end);
  Block* insert_unmapped(Block* block);
  void split_unmapped_tail(Block* block, std::size_t keep);
  [[nodiscard]] std::size_t page_size(bool small);

  // virtual-memory stitching (stitching.cpp)
  /// Stitches a range for `rounded` bytes from free pages (own stream, fresh, other streams);
  /// with `own_only`, from the stream's own free pages alone. nullptr when they are too few.
  Block* stitch_pages(Pool& pool, stream_t stream, std::size_t rounded, bool own_only);
  void map_back(Segment* segment, std::size_t index, phys_handle_t handle) noexcept;
  bool release_if_unmapped(Segment* segment);
  void release_or_keep(Pool& pool, stream_t stream, void* va, std::size_t bytes,
                       std::size_t page) noexcept;
  void release_or_orphan(phys_handle_t handle) noexcept;
  void insert_events(Block* block);
  void process_events();
  void synchronize_and_free_events();
  event_t get_event();
  [[noreturn]] void raise_oom(std::size_t requested, std::size_t rounded, std::size_t alloc_size,
                              bool small, stream_t stream);
  [[nodiscard]] std::size_t largest_free_block() const;

  // validation (device_allocator_validate.cpp)
  void validate_locked() const;

  void trace(TraceAction action, const void* addr, std::size_t size, stream_t stream) {
    if (recorder_.enabled()) recorder_.record(action, addr, size, stream);
  }

  Pool& pool_for(bool small) noexcept { return small ? small_ : large_; }
  const Pool& pool_for_const(bool small) const noexcept { return small ? small_ : large_; }

  const int device_;
  Backend& backend_;
  Config config_;
  std::optional<std::size_t> allowed_;  ///< memory-fraction cap on reserved bytes
  bool configured_ = false;             ///< set_config() ran once

  mutable detail::SpinLock mutex_;
  NodeStorage index_nodes_;
  detail::ObjectPool<Block> blocks_;
  Pool small_{&index_nodes_, true};
  Pool large_{&index_nodes_, false};
  detail::PtrMap<Block> live_;
  Segment* segments_ = nullptr;  ///< intrusive list of every segment
  DeviceStats stats_;
  detail::Recorder recorder_;

  // cross-stream events (slow path only)
  std::unordered_map<stream_t, std::deque<std::pair<event_t, Block*>>> pending_;
  std::size_t outstanding_events_ = 0;
  std::vector<event_t> event_pool_;
  std::vector<phys_handle_t> orphan_handles_;  ///< pages whose release failed: retried later
  /// Ranges still mapped because their unmap failed while undoing a failed map (the bookkeeping
  /// already calls them unmapped): unmapped again before the next map and before reservations
  /// are released, so that a second failure costs neither a leak nor a stuck reservation.
  std::vector<std::pair<char*, std::size_t>> stray_mappings_;
};

}  // namespace stitch
