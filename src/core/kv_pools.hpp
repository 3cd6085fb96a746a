// core/kv_pools.hpp — the elastic paged KV caches of one device (stitch_kv_*, docs/kv.md): each
// pool reserves `buffers` virtual ranges (K and V of every layer) of max_blocks * block_bytes,
// and maps physical pages only under the blocks in use, the same page index in every buffer at
// once. Its pages are device memory stitch holds (reserved_bytes, and kv_bytes), drawn from the
// same budget as the caching allocator's: a block allocation maps what it needs (no sync), a free
// keeps its pages mapped (it never waits, never unmaps), and pages without live blocks go back at
// stitch_kv_trim, empty_cache / stitch_trim (beyond kv_reserve_mb) and in the out-of-memory
// ladder (all of them), each after one device synchronization. The pool's tag sleeps and wakes
// with the caching allocator's tags (its pages unmapped, the live blocks' pages kept in pinned
// host memory when the pool was made with backup, or in a file of backup_dir when the host
// refuses: the disk tier, core/backup_files.hpp, through the Sleeper's staging buffers).
//
// Each entry point takes the device lock, over the view of the device it is handed
// (core/device_view.hpp) and the tags' residency (a spill of a pool's tag).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/backup_files.hpp"
#include "core/device_view.hpp"
#include "stitch/backend.hpp"

namespace stitch::detail {

class Residency;

/// One pool.
struct KvPool {
  int id = 0;
  std::uint16_t tag = 0;
  bool backup = false;         ///< STITCH_REGION_BACKUP: live blocks survive a sleep
  int buffers = 0;
  std::size_t block_bytes = 0, max_blocks = 0;
  std::size_t page = 0;        ///< bytes of a page (per buffer)
  std::size_t pages = 0;       ///< page slots per buffer
  std::size_t span = 0;        ///< bytes reserved per buffer (pages * page)
  std::size_t reserve = 0;     ///< bytes of unused pages kept at empty_cache / stitch_trim
  std::size_t limit = 0;       ///< bytes of pages under live blocks it may hold (0: no limit)
  std::vector<char*> base;                 ///< [buffer]
  std::vector<phys_handle_t> handle;       ///< [page * buffers + buffer], 0: unmapped
  std::vector<std::uint32_t> refs;         ///< [page]: live blocks touching it
  /// [page * buffers + buffer]: the slot is a host page (spilled). A page's buffers move together;
  /// only an undo that failed too leaves a page with some of them on each side.
  std::vector<std::uint8_t> on_host;
  bool spill = false;                      ///< STITCH_REGION_SPILL: its pages may move to the host
  /// kv_zero_page: the device's shared read-only zero page is mapped under every slot without a
  /// page of its own ([page * buffers + buffer] says where it is).
  bool zero = false;
  std::vector<std::uint8_t> zeroed;
  std::size_t host_pages = 0;              ///< pages with a slot on a host page
  std::size_t host_slots = 0;              ///< slots on host pages, over every buffer
  std::vector<std::uint64_t> live;         ///< bitmap of live blocks
  std::size_t live_blocks = 0, mapped_pages = 0, used_pages = 0;
  std::size_t peak_mapped_pages = 0;
  std::uint64_t maps = 0, unmaps = 0;      ///< page maps and unmaps (each over every buffer)
  bool asleep = false;
  // A sleep with backup: the live pages' bytes in pinned host memory, or where the host refused
  // them, in a file of backup_dir (file_data bytes: those of the saved pages still live, booked
  // in backup_file_bytes while asleep).
  char* host = nullptr;
  std::size_t host_bytes = 0;
  BackupFile file;
  std::size_t file_data = 0;
  std::vector<std::size_t> saved;          ///< page indices saved, in backup order

  [[nodiscard]] std::size_t first_page(std::size_t block) const noexcept { return block * block_bytes / page; }
  [[nodiscard]] std::size_t last_page(std::size_t block) const noexcept {
    return ((block + 1) * block_bytes - 1) / page;
  }
  [[nodiscard]] bool is_live(std::size_t block) const noexcept {
    return (live[block / 64] >> (block % 64) & 1u) != 0;
  }
  /// Pages mapped (on the device or the host) with no live block (0 while asleep).
  [[nodiscard]] std::size_t unused_pages() const noexcept {
    const std::size_t held = mapped_pages + host_pages;
    return asleep || held < used_pages ? 0 : held - used_pages;
  }
  /// Bytes of one page over every buffer.
  [[nodiscard]] std::size_t page_set_bytes() const noexcept { return page * static_cast<std::size_t>(buffers); }
  /// Slots of page `p` on host pages.
  [[nodiscard]] std::size_t hosted(std::size_t p) const noexcept {
    std::size_t n = 0;
    for (std::size_t b = 0; b < static_cast<std::size_t>(buffers); ++b) n += on_host[p * static_cast<std::size_t>(buffers) + b];
    return n;
  }
  /// Bytes of device pages mapped (pages wholly on the device, and the device slots of the others).
  [[nodiscard]] std::size_t device_bytes() const noexcept {
    return (mapped_pages + host_pages) * page_set_bytes() - host_slots * page;
  }
};

/// What a pool says about itself.
struct KvPoolInfo {
  int id = 0;
  std::string tag;
  int buffers = 0;
  std::size_t block_bytes = 0, max_blocks = 0, page = 0;
  std::size_t live_blocks = 0, mapped_bytes = 0, used_bytes = 0, peak_bytes = 0, spilled_bytes = 0;
  std::size_t host_backup_bytes = 0, backup_file_bytes = 0;  ///< where a sleep's backup lies
  std::size_t reserve = 0, limit = 0;
  std::uint64_t maps = 0, unmaps = 0;
  bool asleep = false;
};

class KvPools {
 public:
  KvPools(const DeviceView& device, Residency& residency) : d_(device), residency_(residency) {}
  ~KvPools();
  KvPools(const KvPools&) = delete;
  KvPools& operator=(const KvPools&) = delete;

  // ---- entry points (each takes the device lock) ------------------------------------------------
  /// A new pool; its id. Throws invalid_argument for bad sizes, backend_error where the device has
  /// no virtual-memory API, out_of_memory when no address space is left.
  int create(int buffers, std::size_t block_bytes, std::size_t max_blocks, std::uint16_t tag,
             const std::string& tag_name, bool backup, bool spill = false);
  /// Unmaps every page and releases the ranges. Throws invalid_argument while blocks are live.
  void destroy(int pool);
  [[nodiscard]] char* buffer(int pool, int buffer);
  /// `n` block ids, lowest free first, into `ids`, mapping the pages they need (no sync). All or
  /// nothing: out_of_memory (the limit, or the device after the out-of-memory ladder) or error
  /// (the tag asleep), nothing allocated.
  void alloc(int pool, std::size_t n, std::int64_t* ids);
  /// Frees `n` ids (never waits, never unmaps). invalid_argument for an id out of range, not live,
  /// or twice in the list: nothing freed.
  void free(int pool, const std::int64_t* ids, std::size_t n);
  void set_limit(int pool, std::size_t bytes);
  /// Blocks allocatable now, within the limit and the device's room.
  [[nodiscard]] std::size_t available(int pool);
  /// Unmaps every page of the pool without a live block (one device sync first).
  void trim(int pool);
  [[nodiscard]] KvPoolInfo info(int pool);
  /// The ids of the pools (ascending).
  [[nodiscard]] std::vector<int> ids();

  // ---- for the device, under its lock -----------------------------------------------------------------
  /// Unmaps the unused pages of every pool beyond its reserve (`all`: the reserves too), after one
  /// device sync when there is any; returns the bytes given back. Errors are dropped (the page
  /// stays mapped).
  std::size_t release_unused(bool all) noexcept;
  /// The pools of `tags` go to sleep (their pages unmapped; live pages backed up for pools with
  /// backup, or tags in `backup_tags`: in pinned host memory, else in a file of backup_dir). The
  /// device is synchronized. Throws out_of_memory when neither the host nor backup_dir takes a
  /// backup, backend_error for a failed copy or write, each with nothing changed.
  void sleep(const std::vector<std::uint16_t>& tags, const std::vector<std::uint16_t>& backup_tags);
  /// The sleeping pools of `tags` wake (pages under live blocks mapped, backups copied or read
  /// back). False when the device has no room: nothing changed. Throws backend_error (a read
  /// names the file and the offset), the pools asleep with their backups: a retry may succeed.
  bool wake(const std::vector<std::uint16_t>& tags);
  /// Moves the pages under live blocks of the spillable pools of `tags` to host pages at the same
  /// addresses (core/spiller.hpp's model): every host page made first, all or nothing
  /// (out_of_memory when the host or spill_limit_mb refuses; a failure moves back what moved).
  /// The device is synchronized. Returns the bytes moved.
  std::size_t spill(const std::vector<std::uint16_t>& tags, std::size_t room);
  /// Brings the host pages of the pools of `tags` (`all`: every pool) back to device pages while
  /// the device has room; true when none stays on the host. The device is synchronized.
  bool unspill(const std::vector<std::uint16_t>& tags, bool all);
  /// Bytes a spill of `tags` would move from the pools (pages under live blocks on the device).
  [[nodiscard]] std::size_t spillable_bytes(const std::vector<std::uint16_t>& tags) const noexcept;
  /// Bytes of host pages the pools of `tag` (0: every pool) map.
  [[nodiscard]] std::size_t spilled_bytes(std::uint16_t tag = 0) const noexcept;
  /// Whether any pool has `tag`.
  [[nodiscard]] bool has_tag(std::uint16_t tag) const noexcept;
  /// Bytes of the sleeping pools' backups in pinned host memory and in files.
  [[nodiscard]] std::size_t backup_host_bytes() const noexcept;
  [[nodiscard]] std::size_t backup_file_bytes() const noexcept;
  /// Bytes of pages the pools hold (mapped), and the pools' facts.
  [[nodiscard]] std::size_t mapped_bytes() const noexcept;
  [[nodiscard]] std::vector<KvPoolInfo> infos(const std::function<std::string(std::uint16_t)>& tag_name) const;
  /// Checks each pool's books (pages, refs, bitmap) against each other. Throws stitch::error.
  void validate() const;

 private:
  KvPool& get(int pool);
  /// Maps page `p` in every buffer; false when the device has no room (nothing mapped).
  bool map_page(KvPool& k, std::size_t p);
  /// Unmaps page `p` in every buffer and releases its handles (an unmap that fails is filed as
  /// stray). Books it.
  void unmap_page(KvPool& k, std::size_t p) noexcept;
  /// Remaps the slots of page `p` not yet there onto host pages (`to_host`: `given`, one per
  /// buffer) or fresh device pages, each through PageMapper::remap (the old page released only
  /// once the new one holds the data). All or nothing per page: false when the device has no room
  /// or address space, backend_error on an error, the slots moved taken back either way. Each
  /// given page it used is set to 0 in `given` (the page table's now, or released by the undo that
  /// took it back); the others stay the caller's. A slot whose undo fails too stays where its data
  /// is, usable at its address, and is booked there.
  bool move_page(KvPool& k, std::size_t p, bool to_host, phys_handle_t* given);
  /// Books page `p` after its slots moved: it had `before` slots on host pages.
  void book_moved(KvPool& k, std::size_t p, std::size_t before) noexcept;
  /// Writes the live pages of `k` (`bytes` of them, in `k.saved`) to a new file of backup_dir
  /// through the device's staging buffers (Sleeper::kv_staging). Throws out_of_memory (no room:
  /// the budget, the file system, the staging buffers) or backend_error; drop_backup() closes
  /// what it opened.
  void back_up_to_file(KvPool& k, std::size_t bytes, const std::string& what);
  /// Streams `k`'s saved pages to its file (`write`) or its live pages back, through the staging
  /// buffers, reporting into stitch_backup_progress. Throws as Staging::write / read.
  void stream_file(KvPool& k, bool write, const std::string& what);
  /// The runs of device memory of `k`'s saved pages and where they lie in its file (`live`: only
  /// the pages with live blocks, to read back).
  [[nodiscard]] static std::vector<Extent> file_extents(const KvPool& k, bool live);
  /// Page `p` of the sleeping `k` lost its last live block: its bytes leave the backup file (a
  /// hole, where the file system makes one) and backup_file_bytes.
  void drop_file_page(KvPool& k, std::size_t p) noexcept;
  /// Gives a sleep's backup of `k` back (host memory, file).
  void drop_backup(KvPool& k) noexcept;
  /// Unmaps unused pages of `k` until at most `keep` bytes of unused pages stay.
  std::size_t unmap_unused(KvPool& k, std::size_t keep) noexcept;
  /// Lowest free id at or after `from` (max_blocks when none).
  [[nodiscard]] static std::size_t next_free(const KvPool& k, std::size_t from) noexcept;

  /// kv_zero_page: maps the shared zero page (made on first use) under every slot of `k`; false
  /// (nothing mapped) where the back end cannot make a mapping read-only or the page is smaller
  /// than the pool's. Throws backend_error (nothing mapped).
  bool map_zero_everywhere(KvPool& k);
  /// Maps the zero page at slot `p` of buffer `b` read-only; false when that failed.
  bool map_zero(KvPool& k, std::size_t p, std::size_t b) noexcept;
  /// Unmaps the zero page under every slot of `k` and gives the page back with its last user.
  void drop_zero(KvPool& k) noexcept;

  const DeviceView& d_;
  Residency& residency_;
  std::map<int, std::unique_ptr<KvPool>> pools_;
  phys_handle_t zero_ = 0;       ///< the shared zero page (kv_zero_page), counted once in kv_bytes
  std::size_t zero_bytes_ = 0;
  int zero_users_ = 0;           ///< pools mapping it
  int next_id_ = 1;
};

}  // namespace stitch::detail
