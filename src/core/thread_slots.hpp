// core/thread_slots.hpp — the data of immediate reuse (core/immediate_reuse.hpp): each thread's
// slot on a device (its extents of free memory, the requests best fit serves from them, the pairs
// taken since), and the device's registry of slots, with each thread's lookup of its own.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/spin_lock.hpp"
#include "stitch/backend.hpp"

namespace stitch::detail {

struct Block;

/// What one pair (a block of the extent handed out and taken back) does to the inactive-split
/// statistics: the take of the free extent, then the filing that undoes it
/// (ImmediateReuse::apply_pairs).
struct PairEffect {
  enum Kind : std::uint8_t {
    none,
    fall_bytes,  ///< the extent is split already: its bytes fall by the block's and rise back
    rise_split,  ///< a whole segment: one split remainder of `bytes` comes and goes
    fall_whole,  ///< a split extent taken whole: it leaves and comes back
  } kind = none;
  std::int64_t bytes = 0;
};

/// How many extents a thread keeps per device (the free blocks its last frees ended in).
constexpr std::size_t kExtents = 4;
/// How many requests a thread remembers a verdict for (a step's sizes): two per bucket of the
/// request size's hash, so that a lookup reads two entries.
constexpr std::size_t kVerdicts = 32;
/// The first of the two verdict entries a request of `size` bytes may have (a 64-bit mix of the
/// size: training sizes are mostly powers of two and round multiples, whose low bits are zero).
constexpr std::size_t verdict_bucket(std::size_t size) noexcept {
  std::uint64_t x = size;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return static_cast<std::size_t>(x >> 60) * 2;
}
/// Extent::cur when the extent's border is no verdict's.
constexpr std::uint8_t kNoVerdict = 0xFF;

/// A free block a thread holds out of the index (core/immediate_reuse.hpp).
struct Extent {
  Block* head = nullptr;  ///< at its start, in the live table (nullptr: no extent)
  Block* tail = nullptr;  ///< linked after `head` while its verdicts split it, else nullptr
  std::size_t bytes = 0;  ///< its size (head + tail)
  stream_t stream = nullptr;
  const std::atomic<std::uint64_t>* epoch = nullptr;  ///< its stream's epoch
  std::uint64_t seen = 0;  ///< the epoch its verdicts were decided at
  std::uint32_t gen = 0;   ///< its verdicts' generation: bumped to forget them all at once
  bool small = false;      ///< of the small pool
  bool out = false;        ///< `head` is handed out (for verdict `cur`)
  // (head, stream, small and bytes change only under the device lock: other threads read them
  // under it without the slot's lock.)
  /// The verdict the border (head and tail sizes) was last set for (kNoVerdict: none).
  bool paired = false;     ///< a block of it came back without the lock (it earned its keep)
  std::uint8_t cur = kNoVerdict;
};

/// One thread's immediate-reuse state on one device.
struct alignas(64) ThreadSlot {
  // The owner's: taken on every pair.
  SpinLock lock;
  std::uint64_t pairs = 0;  ///< pairs taken since the last flush
  /// The owner's next frees that are filed without keeping an extent: set at a miss (best fit
  /// serves the owner from elsewhere, an extent went without a pair, or another thread needed
  /// it: keeping extents costs and saves nothing there), counted down by each such free, so that
  /// a return to reusable frees is noticed again (ImmediateReuse::cold_free). Owner-only.
  std::uint8_t cold = 0;
  /// What `cold` is set to at the next miss: doubled by each miss in a row (1, 2, 4 ... up to
  /// kColdFrees), back to 0 when a block of an extent comes back without the lock.
  std::uint8_t backoff = 0;
  std::uint8_t outs[2] = {};  ///< extents handed out, [0] small pool, [1] large pool
  std::uint8_t last_verdict = 0;  ///< the verdict of the last block handed out (looked at first)
  std::uint8_t last_out = 0;      ///< the extent of the last block handed out (looked at first)
  /// Since the owner's last locked request, an extent went without a pair taken from it: a miss
  /// for the owner. Under the device lock only.
  bool wasted = false;
  std::uint8_t next_extent = 0;   ///< the extent replaced next
  /// The requests best fit serves from an extent (0: none), then for each: the extent, the
  /// generation, the block's size, what a pair does to inactive split, and the pairs taken since
  /// the last flush.
  std::size_t requested[kVerdicts] = {};
  std::uint8_t extent_of[kVerdicts] = {};
  std::uint32_t vgen[kVerdicts] = {};  ///< live while equal to its extent's `gen`
  std::size_t size[kVerdicts] = {};
  PairEffect effect[kVerdicts] = {};
  std::uint64_t pair_count[kVerdicts] = {};
  Extent extents[kExtents];
  // Read by other threads (a cache line of its own, written once).
  alignas(64) std::atomic<bool> orphaned{false};  ///< its thread has ended

  /// Whether it holds an extent.
  [[nodiscard]] bool holds() const noexcept {
    for (const Extent& e : extents)
      if (e.head != nullptr) return true;
    return false;
  }
};

/// The slots of one device.
class ThreadSlots {
 public:
  ThreadSlots();
  ThreadSlots(const ThreadSlots&) = delete;
  ThreadSlots& operator=(const ThreadSlots&) = delete;

  /// The calling thread's slot, or nullptr if it has none yet. No lock; two thread-local loads.
  [[nodiscard]] ThreadSlot* mine() const noexcept {
    const Cached& c = cached_;
    if (c.owner == id_) [[likely]] return c.slot;
    return find_mine();
  }
  /// The calling thread's slot, created if needed (under the device lock).
  ThreadSlot* mine_or_create();
  /// Every slot (under the device lock).
  template <class F>
  void for_each(F&& f) {
    for (const auto& s : slots_) f(*s);
  }
  /// Empties the calling thread's cache of its slot (a region opens: ThreadSlots::find_mine).
  static void forget_mine() noexcept { cached_ = Cached{}; }
  /// More than one thread has a slot (the locked paths then look at the others).
  [[nodiscard]] bool shared() const noexcept { return slots_.size() > 1; }

 private:
  struct Cached {
    std::uint64_t owner = 0;
    ThreadSlot* slot = nullptr;
  };
  ThreadSlot* find_mine() const noexcept;

  const std::uint64_t id_;  ///< unique per ThreadSlots ever made: a thread's cache never aliases
  std::vector<std::shared_ptr<ThreadSlot>> slots_;
  /// Initial-exec: read on every cache hit, where a shared library's general TLS model would
  /// cost a __tls_get_addr call (16 bytes of the static TLS surplus, which dlopen allows).
  static thread_local Cached cached_ __attribute__((tls_model("initial-exec")));
};

}  // namespace stitch::detail
