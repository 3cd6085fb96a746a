// core/sleeper.hpp — sleep and wake of region-tagged memory on one device (stitch_sleep /
// stitch_wake): which tags are asleep, and for each sleeping range the mappings it had, the
// backup of its live blocks that asked for one — in pinned host memory first, the rest in a
// file of backup_dir (the disk tier, core/backup_files.hpp) — and where each block's bytes wait.
//
// A sleep unmaps and releases every page of the tags' ranges (the free pages and the pages under
// live blocks), keeping the addresses reserved and every block in place, in its state; a wake maps
// fresh pages at the same addresses, mapping by mapping as before, and copies the backups back in.
// Both are all or nothing per call: a sleep places and copies every backup (host memory, files
// written through the staging buffers) before it unmaps anything, and removes what it made when
// any of that fails; a wake creates and maps every page and copies every backup back (files read
// through the staging buffers) before it books anything, and leaves the backups as they were when
// any of that fails. The caller (DeviceAllocator) holds the device lock, has synchronized the
// device and its peers, and has checked that no graph is being captured.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/backup_files.hpp"
#include "core/block_store.hpp"
#include "core/ledger.hpp"
#include "core/page_mapper.hpp"
#include "stitch/backend.hpp"
#include "stitch/config.hpp"
#include "stitch/snapshot.hpp"
#include "stitch/stats.hpp"

namespace stitch::detail {

/// Bytes of one asynchronous backup copy: big enough to run at the link's bandwidth, small
/// enough that the copies of several blocks overlap in the copy engine's queue.
constexpr std::size_t kBackupChunk = std::size_t{64} << 20;
/// With a disk tier, the smallest piece of pinned host memory a backup is split into when the
/// host will not give it whole (the rest goes to a file).
constexpr std::size_t kMinHostPiece = std::size_t{1} << 20;

class Sleeper {
 public:
  /// All must outlive it. `config`: backup_dir, backup_dir_mb, backup_host_mb (read at each
  /// sleep); `tag_names`: the tags' names, for messages (may be shorter than a tag: "tag N").
  Sleeper(Backend& backend, int device, const Config& config, BlockStore& store, PageMapper& pages,
          Ledger& ledger, DeviceStats& stats, const std::vector<std::string>* tag_names = nullptr) noexcept
      : backend_(backend), device_(device), config_(config), store_(store), pages_(pages), ledger_(ledger),
        stats_(stats), tag_names_(tag_names) {}
  /// Gives back the host backups and closes the backup files still held (the allocator goes
  /// away while ranges sleep).
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
  /// `keep(block)` holds are copied to pinned host memory, and what the host (or
  /// backup_host_mb) does not take to files of backup_dir, then every page is unmapped and
  /// released. Throws backend_error (or out_of_memory when the host, the caps or the file system
  /// have no room) with nothing changed when a backup cannot be made: the host memory is given
  /// back and the files are closed (they have no name: nothing stays). Past that point nothing
  /// is undone: a page whose unmap or release fails is kept by the page mapper as a stray or
  /// orphan (retried before the next map and release) and the range is asleep; the call then
  /// throws, saying so.
  void sleep(const std::vector<std::uint16_t>& tags, const std::function<bool(const Block*)>& keep);
  /// Wakes every sleeping range of `tags`: fresh pages at the same addresses, the backups copied
  /// back in (files read through the staging buffers), the host memory given back and the files
  /// closed. False when the device (or the memory fraction) cannot give the pages: nothing
  /// changed, the tags stay asleep. Throws backend_error (a read naming its file, offset and
  /// size), nothing changed: the tags stay asleep with their backups, and the wake may be retried.
  bool wake(const std::vector<std::uint16_t>& tags);
  /// Bytes of fresh pages a wake of `tags` needs.
  [[nodiscard]] std::size_t wake_bytes(const std::vector<std::uint16_t>& tags) const;
  /// The live `block` of a sleeping range is being freed: its backup is dropped (its whole 4 KiB
  /// pages in a file become a hole; the host memory is given back and the file closed once its
  /// range keeps no other), its bytes leave sleeping_bytes and backup_file_bytes.
  void forget(const Block* block) noexcept;

  /// Host memory held for the backups of `tag` (0: of every tag; the staging buffers not
  /// included).
  [[nodiscard]] std::size_t host_bytes(std::uint16_t tag = 0) const noexcept;
  /// Bytes of live blocks' backups of `tag` (0: of every tag) in files.
  [[nodiscard]] std::size_t file_bytes(std::uint16_t tag = 0) const noexcept;
  /// Where the backups of `tag` lie: "host", "file", "both" or "none".
  [[nodiscard]] const char* backup_place(std::uint16_t tag) const noexcept;
  /// Pinned host memory of the staging buffers (kept while backup files exist).
  [[nodiscard]] std::size_t staging_bytes() const noexcept { return staging_.bytes(); }
  /// The staging buffers for the KV pools' backup files too (core/kv_pools.hpp): one set per
  /// device, within backup_host_mb. kv_staging() makes them for `bytes` where there are none
  /// (nullptr when the host or the cap refuses); they stay while a KV pool's file is open
  /// (kv_file_opened / kv_file_closed) or a range's.
  [[nodiscard]] Staging* kv_staging(std::size_t bytes);
  void kv_file_opened() noexcept { ++kv_files_; }
  void kv_file_closed() noexcept;
  [[nodiscard]] int kv_files() const noexcept { return kv_files_; }
  /// How far the sleep or wake running on this device is (read without the device lock; the KV
  /// pools' files report into it too: a pool's write or read is one operation).
  [[nodiscard]] BackupProgress& progress() noexcept { return progress_; }
  /// Adds where the backups of the sleeping blocks lie to the snapshot segments out[from...]
  /// (backup_host_bytes, backup_file_bytes).
  void annotate(std::vector<SegmentSnapshot>& out, std::size_t from) const;

  /// Checks the sleeping ranges against the store (each asleep segment is recorded once, maps
  /// nothing, and its backups lie on its live blocks). Throws stitch::error.
  /// `other_file_bytes`: the KV pools' bytes in files (backup_file_bytes counts both).
  void validate(std::size_t other_file_bytes) const;

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
  /// Pinned host memory holding the backup's bytes [start, start + bytes).
  struct HostPiece {
    char* at;
    std::size_t bytes;
  };
  /// One sleeping range. Its backup is the saved blocks' bytes side by side (`bytes` in all):
  /// [0, host_bytes) in the host pieces, in order, and the rest in `file` from offset 0.
  struct Slept {
    Segment* segment = nullptr;
    std::vector<SlotRun> mappings;  ///< each map call it had (first slot, slots), in order
    std::vector<HostPiece> host;    ///< pinned host memory of the backup's start
    std::size_t host_bytes = 0;     ///< bytes of the backup in host memory
    std::size_t bytes = 0;          ///< bytes of the backup (the saved blocks' sizes, summed)
    BackupFile file;                ///< the rest (not open: none)
    std::size_t file_data = 0;      ///< bytes of the saved blocks in the file
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
  /// Pinned host memory, backup files and the copies out; all or nothing (throws, giving the
  /// memory back and closing the files).
  void back_up(std::vector<Slept>& plan);
  /// Pinned host memory for as much of each range's backup as the host and backup_host_mb give
  /// (whole; with a disk tier also in pieces); returns the bytes left for files.
  std::size_t place_in_host(std::vector<Slept>& plan, bool disk);
  /// Calls fn(host, block_offset, n) for the parts of `v`'s bytes in `s`'s host pieces.
  template <typename Fn>
  static void host_parts(const Slept& s, const Saved& v, Fn&& fn);
  /// The parts of the saved blocks' bytes in `s`'s file, by file offset.
  static std::vector<Extent> file_extents(const Slept& s);
  /// Backup files on this device (the staging buffers are kept while there are any).
  [[nodiscard]] bool files_open() const noexcept;
  /// The staging buffers go back once no backup file needs them.
  void drop_staging_if_unused() noexcept;
  /// "tag 'weights'".
  [[nodiscard]] std::string tag_text(std::uint16_t tag) const;
  /// Unmaps and releases the ranges' pages and books them; a failure is kept for later, and
  /// its message returned.
  std::string give_back(std::vector<Slept>& plan) noexcept;
  /// Copies `bytes` between a block and host memory in kBackupChunk pieces on the null stream.
  void copy_chunks(char* device_side, char* host_side, std::size_t bytes, bool to_host);
  /// Gives the range's backup up: its host memory back, its file closed.
  void free_host(Slept& s) noexcept;
  static bool listed(const std::vector<std::uint16_t>& tags, std::uint16_t tag) noexcept;

  Backend& backend_;
  const int device_;
  const Config& config_;
  BlockStore& store_;
  PageMapper& pages_;
  Ledger& ledger_;
  DeviceStats& stats_;
  const std::vector<std::string>* tag_names_;
  Staging staging_;             ///< the disk tier's staging buffers (while files exist)
  int kv_files_ = 0;            ///< the KV pools' open backup files
  BackupProgress progress_;
  std::vector<TagState> tags_;  ///< [tag]; tag 0 (untagged) never sleeps
  std::vector<Slept> slept_;    ///< the sleeping ranges
  std::uint64_t tick_ = 0;      ///< counts allocations and wakes of tags (TagState::last)
};

}  // namespace stitch::detail
