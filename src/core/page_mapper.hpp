// core/page_mapper.hpp — the one layer of the core that talks to the device's virtual-memory API:
// address ranges reserved and released, physical pages created, mapped, unmapped and released,
// the streams synchronized before pages under their addresses move, and the remap that replaces
// the memory under a mapping at the same addresses. Multi-step changes are all or nothing (an
// undo on every failure); what an undo could not undo is kept and retried: stray mappings (an
// unmap that failed while undoing a failed map: the bookkeeping already calls the range
// unmapped), orphaned handles (a release that failed after an unmap) and remap's scratch ranges
// whose release failed. They are retried before the next map and before memory goes back to the
// device.
#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/block.hpp"
#include "stitch/backend.hpp"

namespace stitch::detail {

/// A whole mapping of an expandable range: slots [first, first + count) of `segment`, which one
/// map call covered (PageTable::extent at `first`): a coarse page, a granule, or memory borrowed
/// from another range. cuMemUnmap cannot cut a sub-range of a mapping, so the memory under live
/// blocks is replaced mapping by mapping.
struct Mapping {
  Segment* segment;
  std::size_t first;
  std::size_t count;
};

class PageMapper {
 public:
  PageMapper(Backend& backend, int device) noexcept : backend_(backend), device_(device) {}
  /// One more try for stray mappings, orphaned handles and kept reservations (errors dropped).
  ~PageMapper();
  PageMapper(const PageMapper&) = delete;
  PageMapper& operator=(const PageMapper&) = delete;

  // ---- the device ---------------------------------------------------------------------------------
  /// Whether the device has the virtual-memory API.
  [[nodiscard]] bool supported();
  /// The page size of physical memory and mappings (a power of two).
  [[nodiscard]] std::size_t granularity();
  /// The device's capacity, and what it could still hand out.
  [[nodiscard]] std::size_t device_total();
  [[nodiscard]] std::size_t device_free();
  /// Waits for the work queued on `stream`: before pages its kernels may use are unmapped.
  void synchronize(stream_t stream);
  /// Waits for all work on the device and, with `peers`, on every device (which may reach this
  /// one's memory): before memory moves under live addresses.
  void synchronize_device(bool peers);
  /// Whether `stream` has nothing queued that has not completed: an event recorded on it now is
  /// complete at once (no wait). False on any backend error: nothing is known idle then.
  [[nodiscard]] bool stream_idle(stream_t stream) noexcept;

  // ---- address ranges -----------------------------------------------------------------------------
  /// Reserves `bytes` of addresses, `alignment` aligned (granularity multiples); nullptr when no
  /// address space is left. Throws backend_error.
  [[nodiscard]] char* reserve(std::size_t bytes, std::size_t alignment);
  /// Releases a reservation with nothing mapped in it. Throws (keeping it).
  void release_reservation(char* va, std::size_t bytes);

  // ---- pages --------------------------------------------------------------------------------------
  /// Creates and maps page slots [first, first + count) of `segment`, `per` slots to a handle
  /// (the count % per slots at the end one to a handle): one create and one map per handle.
  /// All or nothing: false when the device is out of memory, and on a backend error it rethrows;
  /// either way every handle mapped here was unmapped and released again (or filed as stray /
  /// orphan).
  bool map(Segment& segment, std::size_t first, std::size_t count, std::size_t per = 1);
  /// A fresh handle of `bytes`; 0 when the device is out of memory. Throws backend_error.
  [[nodiscard]] phys_handle_t create(std::size_t bytes);
  /// The page size of host memory the device maps (0: none), and a host page of `bytes` (a
  /// multiple of it); 0 when the host cannot give it. Throws backend_error.
  [[nodiscard]] std::size_t host_granularity();
  [[nodiscard]] phys_handle_t create_host(std::size_t bytes);
  /// Makes a mapped range readable only; false where the back end cannot. Throws backend_error.
  [[nodiscard]] bool protect_read_only(char* at, std::size_t bytes) {
    return backend_.protect_read_only(device_, at, bytes);
  }
  /// Maps `pieces` side by side from `at` (stray ranges there are unmapped first), all or
  /// nothing: false when the device ran out of memory (nothing mapped); throws backend_error.
  [[nodiscard]] bool map_pieces(char* at, const std::vector<MapPiece>& pieces);
  /// Maps `handle` (`bytes` of it) at `at` again, as an undo does; false when that failed too.
  [[nodiscard]] bool map_back(char* at, std::size_t bytes, phys_handle_t handle) noexcept;
  /// Unmaps `bytes` at `at` (whole mappings). Throws, changing nothing.
  void unmap(char* at, std::size_t bytes);
  /// Releases the handles of slots [first, last) of `segment` (just unmapped; whole handles;
  /// slots already cleared are skipped) and zeroes them; a handle whose release fails is kept as
  /// an orphan. Returns the first failure (or null).
  std::exception_ptr release(Segment& segment, std::size_t first, std::size_t last) noexcept;
  /// Releases `handle`, or keeps it as an orphan when that fails.
  void release_or_orphan(phys_handle_t handle) noexcept;
  /// Unmaps `bytes` at `va` while undoing; if that fails too, files the range as stray. A range
  /// the device's reserved memory counts (`booked`: its pool, 1 small, 0 large; -1 none) stays
  /// counted until the stray is unmapped, and the unbooked hook books it then.
  void unmap_or_stray(char* va, std::size_t bytes, int booked = -1) noexcept;
  /// Called when a booked stray range is finally unmapped: (small, va, bytes).
  void on_unbooked(std::function<void(bool small, const char* va, std::size_t bytes)> hook) {
    unbooked_ = std::move(hook);
  }
  /// Bytes of booked stray ranges of the small (`small`) or large pool: still reserved.
  [[nodiscard]] std::size_t booked_strays(bool small) const noexcept;
  /// Before mapping at [va, va + bytes): unmaps the stray ranges that overlap it, and throws
  /// (keeping them) if one fails again; the other strays get one more try, and stay stray if it
  /// fails (a stray that cannot be unmapped blocks only the addresses it covers).
  void unmap_strays_in(char* va, std::size_t bytes);
  /// Releases a reservation of the page mapper's own (remap's scratch range); when that fails,
  /// keeps it for retry().
  void release_or_keep_reservation(char* va, std::size_t bytes) noexcept;
  /// One more try for every stray range, orphaned handle, scratch reservation and displaced page
  /// kept; what fails again is kept for later.
  void retry() noexcept;
  /// Maps displaced pages (a remap whose fresh pages and old page both failed to map) back at
  /// their addresses; false when one overlapping [at, at + bytes) is still displaced. Every map,
  /// unmap and remap of the page mapper tries first.
  bool place_displaced(char* at, std::size_t bytes) noexcept;
  /// Bytes of displaced pages: in the page tables, but not mapped at their addresses yet.
  [[nodiscard]] std::size_t displaced_bytes() const noexcept {
    std::size_t n = 0;
    for (const Displaced& d : displaced_) n += d.bytes;
    return n;
  }
  [[nodiscard]] const std::vector<phys_handle_t>& orphans() const noexcept { return orphans_; }

  // ---- moving memory under live addresses ----------------------------------------------------------
  /// Replaces the physical memory under the whole mapping `m` with fresh one-slot handles for the
  /// slots in `keep` (runs inside it, in address order), at the same addresses, so that the data
  /// there keeps its address while the mapping's handle is released:
  ///  1. creates the fresh handles; 2. maps them side by side at a scratch range;
  ///  3. copies each kept run there (Backend::copy, on the device's null stream, which is then
  ///  synchronized: a device copy returns before it ends); 4. unmaps the whole mapping; 5. maps
  ///  the fresh handles over the kept runs; 6. unmaps and releases the scratch range; 7. releases
  ///  the old handle (its memory goes back once no other mapping of it is left).
  /// The caller has synchronized every stream that could touch the mapping, and no graph is being
  /// captured. All or nothing: false when the device is out of memory, backend_error on a backend
  /// error, nothing changed either way: the old handle is released only after the fresh pages hold
  /// the data at its address, and if mapping them there fails the old handle is mapped back. When
  /// that fails too, the old handle (which holds the data) stays in the page table, displaced: the
  /// error says so, and the page mapper's next call maps it back at its address (place_displaced;
  /// until then the addresses are not mapped). Afterwards the page table maps the kept slots one
  /// to a handle, and the others not.
  /// With `stage` (the device has no room for the fresh pages while the old one lives), the kept
  /// data waits in host memory instead: copied out, the mapping unmapped (all or nothing up to
  /// here) and its handle released, fresh pages created and mapped, the data copied back. If the
  /// fresh pages fail, the mapping is rebuilt whole from one page of the old size with the data
  /// (false or backend_error, the layout unchanged); the process aborts only when the device
  /// refuses that too, or the copy back fails twice: the host copy is then the data's only one.
  /// With `given` (not staged), the fresh pages are those `kept` handles, one a slot (host pages
  /// for a spill): the caller's until the remap succeeds, then the page table's.
  bool remap(const Mapping& m, const std::vector<SlotRun>& keep, bool stage = false,
             const phys_handle_t* given = nullptr);

 private:
  /// Maps `fresh` (one-slot handles, in order) over the kept runs of `s`. On a failure takes
  /// back the runs it mapped and returns the error ("" on success).
  std::string map_over(Segment& s, const std::vector<SlotRun>& keep,
                       const std::vector<MapPiece>& fresh) noexcept;
  /// remap with `stage`: `kept` slots in `keep`; `old` is the handle to release (0: borrowed
  /// memory, whose handle is its lender's).
  bool remap_through_host(const Mapping& m, const std::vector<SlotRun>& keep, std::size_t kept,
                          phys_handle_t old);

  Backend& backend_;
  const int device_;
  std::vector<phys_handle_t> orphans_;
  struct Stray {
    char* va;
    std::size_t bytes;
    int booked;  ///< the pool whose reserved memory still counts it (1 small, 0 large), or -1
  };
  /// A stray range was unmapped at last: its booking ends.
  void unmapped_stray(const Stray& s) noexcept;
  /// Whether a stray range lies in [va, va + bytes) (a reservation there cannot go back yet).
  [[nodiscard]] bool stray_within(const char* va, std::size_t bytes) const noexcept;
  std::vector<Stray> strays_;
  std::function<void(bool, const char*, std::size_t)> unbooked_;
  std::vector<std::pair<char*, std::size_t>> lost_reservations_;  ///< scratch ranges to release
  /// Old pages a remap could not map back (the fresh ones failed too): the page table still names
  /// them and they hold the data; mapped back at the next page operation.
  struct Displaced {
    char* va;
    std::size_t bytes;
    phys_handle_t handle;
  };
  std::vector<Displaced> displaced_;
};

}  // namespace stitch::detail
