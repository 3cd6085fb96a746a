// core/sleeper.hpp — sleep and wake of region-tagged memory on one device (stitch_sleep /
// stitch_wake): which tags are asleep, and for each sleeping range the mappings it had, the host
// backup of its live blocks that asked for one, and where each block's bytes wait there.
//
// A sleep unmaps and releases every page of the tags' ranges (the free pages and the pages under
// live blocks), keeping the addresses reserved and every block in place, in its state; a wake maps
// fresh pages at the same addresses, mapping by mapping as before, and copies the backups back in.
// Both are all or nothing per call: a sleep copies every backup before it unmaps anything, and a
// wake creates and maps every page and copies every backup before it books anything. The caller
// (DeviceAllocator) holds the device lock, has synchronized the device and its peers, and has
// checked that no graph is being captured.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/block_store.hpp"
#include "core/ledger.hpp"
#include "core/page_mapper.hpp"
#include "stitch/backend.hpp"
#include "stitch/stats.hpp"

namespace stitch::detail {

/// Bytes of one asynchronous backup copy: big enough to run at the link's bandwidth, small
/// enough that the copies of several blocks overlap in the copy engine's queue.
constexpr std::size_t kBackupChunk = std::size_t{64} << 20;

class Sleeper {
 public:
  /// All must outlive it.
  Sleeper(Backend& backend, int device, BlockStore& store, PageMapper& pages, Ledger& ledger,
          DeviceStats& stats) noexcept
      : backend_(backend), device_(device), store_(store), pages_(pages), ledger_(ledger),
        stats_(stats) {}
  /// Gives back the host backups still held (the allocator goes away while ranges sleep).
  ~Sleeper();
  Sleeper(const Sleeper&) = delete;
  Sleeper& operator=(const Sleeper&) = delete;

  /// Whether `tag` is asleep on this device.
  [[nodiscard]] bool asleep(std::uint16_t tag) const noexcept {
    return tag < tags_.size() && tags_[tag].asleep;
  }
  /// Whether memory of `tag` was ever allocated on this device.
  [[nodiscard]] bool used(std::uint16_t tag) const noexcept {
    return tag < tags_.size() && tags_[tag].used;
  }
  /// Memory of `tag` is allocated on this device (it becomes the tag used last).
  void note_used(std::uint16_t tag);
  /// `tag` was opened with STITCH_REGION_SPILL: its memory may move to host pages from now on.
  void note_spillable(std::uint16_t tag);
  [[nodiscard]] bool spillable(std::uint16_t tag) const noexcept {
    return tag < tags_.size() && tags_[tag].spill;
  }
  /// When `tag` was last allocated or woken here (a device-wide count; higher: more recently).
  [[nodiscard]] std::uint64_t last_use(std::uint16_t tag) const noexcept {
    return tag < tags_.size() ? tags_[tag].last : 0;
  }
  /// Keeps the first failure's text in `failure` (without throwing).
  static void note_failure(std::string& failure, const char* what) noexcept;
  /// The tags ever used here (ascending).
  [[nodiscard]] std::vector<std::uint16_t> used_tags() const;

  /// Puts every range of `tags` (awake ones) to sleep: the live blocks for which
  /// `keep(block)` holds are copied to pinned host memory, then every page is unmapped and
  /// released. Throws backend_error (or out_of_memory for the host memory) with nothing changed
  /// when a backup cannot be made. Past that point nothing is undone: a page whose unmap or
  /// release fails is kept by the page mapper as a stray or orphan (retried before the next
  /// map and release) and the range is asleep; the call then throws, saying so.
  void sleep(const std::vector<std::uint16_t>& tags, const std::function<bool(const Block*)>& keep);
  /// Wakes every sleeping range of `tags`: fresh pages at the same addresses, the backups copied
  /// back in, the host memory given back. False when the device (or the memory fraction) cannot
  /// give the pages: nothing changed, the tags stay asleep. Throws backend_error, nothing changed.
  bool wake(const std::vector<std::uint16_t>& tags);
  /// Bytes of fresh pages a wake of `tags` needs.
  [[nodiscard]] std::size_t wake_bytes(const std::vector<std::uint16_t>& tags) const;
  /// The live `block` of a sleeping range is being freed: its backup is dropped (and the host
  /// memory given back once its range keeps no other), its bytes leave sleeping_bytes.
  void forget(const Block* block) noexcept;

  /// Host memory held for the backups of `tag` (0: of every tag).
  [[nodiscard]] std::size_t host_bytes(std::uint16_t tag = 0) const noexcept;
  /// Bytes of the mappings the sleeping ranges of `tag` had (0: of every tag).
  [[nodiscard]] std::size_t slept_bytes(std::uint16_t tag = 0) const noexcept;

  /// Checks the sleeping ranges against the store (each asleep segment is recorded once, maps
  /// nothing, and its backups lie on its live blocks). Throws stitch::error.
  void validate() const;

 private:
  struct TagState {
    bool used = false;
    bool asleep = false;
    bool spill = false;       ///< opened with STITCH_REGION_SPILL
    std::uint64_t last = 0;   ///< tick_ at its last allocation or wake
  };
  /// A live block's bytes in its range's host backup, from `offset`.
  struct Saved {
    const Block* block;
    std::size_t offset;
  };
  /// One sleeping range.
  struct Slept {
    Segment* segment = nullptr;
    std::vector<SlotRun> mappings;  ///< each map call it had (first slot, slots), in order
    char* host = nullptr;           ///< pinned host memory of the backups (nullptr: none)
    std::size_t host_bytes = 0;
    std::vector<Saved> saved;
    [[nodiscard]] std::size_t mapped_bytes() const noexcept {
      std::size_t n = 0;
      for (const SlotRun& m : mappings) n += m.count * segment->page;
      return n;
    }
  };
  /// The ranges of `tags` to put to sleep, with their mappings and the blocks `keep` selects.
  std::vector<Slept> plan(const std::vector<std::uint16_t>& tags,
                          const std::function<bool(const Block*)>& keep) const;
  /// Pinned host memory and the copies out; all or nothing (throws, giving the memory back).
  void back_up(std::vector<Slept>& plan);
  /// Unmaps and releases the ranges' pages and books them; a failure is kept for later, and
  /// its message returned.
  std::string give_back(std::vector<Slept>& plan) noexcept;
  /// Copies `bytes` between a block and host memory in kBackupChunk pieces on the null stream.
  void copy_chunks(char* device_side, char* host_side, std::size_t bytes, bool to_host);
  void free_host(Slept& s) noexcept;
  static bool listed(const std::vector<std::uint16_t>& tags, std::uint16_t tag) noexcept;

  Backend& backend_;
  const int device_;
  BlockStore& store_;
  PageMapper& pages_;
  Ledger& ledger_;
  DeviceStats& stats_;
  std::vector<TagState> tags_;  ///< [tag]; tag 0 (untagged) never sleeps
  std::vector<Slept> slept_;    ///< the sleeping ranges
  std::uint64_t tick_ = 0;      ///< counts allocations and wakes of tags (TagState::last)
};

}  // namespace stitch::detail
