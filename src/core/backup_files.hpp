// core/backup_files.hpp — sleep's disk tier (backup_dir, docs/sleep.md): the process's budget
// for backups (pinned host memory within backup_host_mb, file bytes within backup_dir_mb or the
// file system's free space), a backup file, one device's staging buffers, and the streaming of
// device memory to a file through them and back: chunk n is written while chunk n+1 is copied
// out, and chunk n+1 is read while chunk n is copied back (the file calls on a thread of their
// own, for the length of the call, so that the two overlap even where the back end's copies
// take the calling thread, as the simulated device's do). The Sleeper
// (core/sleeper.hpp) decides what goes where; the KV pools take their pinned backups through the
// same budget. Every file call goes through the Backend (its file calls return -errno), so the
// simulator's fault injection reaches each one.
#pragma once

#include <atomic>
#include <cstddef>
#include <exception>
#include <cstdint>
#include <string>
#include <vector>

#include "stitch/backend.hpp"

namespace stitch::detail {

/// Pinned host memory for backups of `device`, within backup_host_mb (`cap` bytes for the whole
/// process; 0: no cap): nullptr when the cap or the host refuses. Throws backend_error.
void* allocate_backup_host(Backend& backend, int device, std::size_t bytes, std::size_t cap);
/// Gives memory of allocate_backup_host() back (a failure is dropped: the host memory is lost
/// to the process, not to the device).
void free_backup_host(Backend& backend, int device, void* p, std::size_t bytes) noexcept;
/// Pinned host memory and file bytes the backups of the process hold now.
[[nodiscard]] std::size_t backup_host_in_use() noexcept;
[[nodiscard]] std::size_t backup_file_in_use() noexcept;

/// "1.50 GiB (1610612736 bytes)": sizes in messages.
[[nodiscard]] std::string bytes_text(std::uint64_t bytes);
/// " (backup_host_mb caps the backups at 1.00 MiB (...), 1.00 MiB (...) in use)" for a refusal
/// of pinned host memory under `cap`; empty without a cap.
[[nodiscard]] std::string host_cap_text(std::size_t cap);
/// Bytes a file takes for `bytes` of data (whole 4 KiB pages): what its budget counts.
[[nodiscard]] std::uint64_t file_bytes_for(std::uint64_t bytes) noexcept;
/// Inside a catch of `e`: throws it again with `suffix` added to its message, as the same kind
/// (out_of_memory, backend_error); any other exception unchanged.
[[noreturn]] void rethrow_with(const std::exception& e, const std::string& suffix);

/// Takes `bytes` of file space for backups in `dir` from the process's budget: within
/// backup_dir_mb (`cap`; 0: what the file system has free, statvfs). Throws out_of_memory naming
/// the directory, the cap and what is in use when there is no room (nothing taken). `what`
/// begins the message ("stitch_sleep: device 0").
void take_file_budget(const std::string& dir, std::uint64_t bytes, std::size_t cap, const std::string& what);
/// Gives `bytes` of take_file_budget() back.
void give_file_budget(std::uint64_t bytes) noexcept;

/// One backup file: a sleeping range's bytes beyond its host memory, from offset 0, padded to
/// 4 KiB. Closed explicitly (close()): moving it around does not close it.
struct BackupFile {
  int fd = -1;
  bool direct = false;        ///< opened with O_DIRECT (4 KiB aligned I/O only)
  std::uint64_t size = 0;     ///< bytes it holds (data padded to 4 KiB), budgeted
  std::uint64_t held = 0;     ///< of them, still budgeted (not given back by discard())
  std::string dir;            ///< where it lies (it has no name of its own)

  [[nodiscard]] bool is_open() const noexcept { return fd >= 0; }
  /// Opens a new file in `dir` for `bytes` of data whose budget the caller took; throws
  /// backend_error naming the directory and why (nothing open then). `what` begins the message.
  void open(Backend& backend, int device, const std::string& in, std::uint64_t bytes, const std::string& what);
  /// Closes it: its bytes go back to the file system, its budget to the process.
  void close(Backend& backend, int device) noexcept;
  /// The data [offset, offset + bytes) is no longer needed (a sleeping block was freed): the
  /// whole 4 KiB pages inside it become a hole, and leave the budget. A file system without
  /// holes keeps them until the close.
  void discard(Backend& backend, int device, std::uint64_t offset, std::uint64_t bytes) noexcept;
  /// "an unnamed backup file in /dir (descriptor 7)".
  [[nodiscard]] std::string describe() const;
};

/// A run of device memory and where its bytes lie in a file.
struct Extent {
  char* device;
  std::size_t bytes;
  std::uint64_t file_offset;
};

/// How far a sleep or a wake of a device is, readable from any thread while it runs
/// (stitch_backup_progress): the bytes of backups copied out or back so far, of how many.
struct BackupProgress {
  std::atomic<int> op{0};  ///< 0: none running; 1: a sleep; 2: a wake
  std::atomic<std::uint64_t> done{0};
  std::atomic<std::uint64_t> total{0};
  void start(int what, std::uint64_t bytes) noexcept {
    done.store(0, std::memory_order_relaxed);
    total.store(bytes, std::memory_order_relaxed);
    op.store(what, std::memory_order_release);
  }
  void add(std::uint64_t bytes) noexcept { done.fetch_add(bytes, std::memory_order_relaxed); }
  void stop() noexcept { op.store(0, std::memory_order_release); }
};

/// The staging buffers of one device: two pinned buffers of one chunk each, through which file
/// bytes pass. Made by a sleep that may write files and kept while the device has backup files,
/// so that their wake always has them.
class Staging {
 public:
  [[nodiscard]] bool ready() const noexcept { return buffer_[0] != nullptr; }
  /// Pinned bytes held.
  [[nodiscard]] std::size_t bytes() const noexcept { return ready() ? 2 * chunk_ : 0; }
  [[nodiscard]] std::size_t chunk() const noexcept { return chunk_; }
  /// Makes the buffers for backups of `bytes` (a chunk of an eighth of them, 64 KiB to 16 MiB,
  /// less where backup_host_mb (`cap`) leaves less room), within the budget; false (nothing held)
  /// when the host or the cap refuses. Throws backend_error.
  bool make(Backend& backend, int device, std::size_t bytes, std::size_t cap);
  void free(Backend& backend, int device) noexcept;
  /// Writes `extents` (device memory; by file offset, the file's data covered from 0) to
  /// `file` chunk by chunk: chunk n is written (on a thread of its own) while chunk n+1 is
  /// copied into the other buffer. Every copy and write has completed when it returns or
  /// throws. Throws out_of_memory when the file system is full (ENOSPC, EDQUOT, EFBIG),
  /// backend_error for another failure, each naming the file, the offset and the size; the file
  /// then holds part of the data.
  void write(Backend& backend, int device, const std::vector<Extent>& extents, const BackupFile& file,
             BackupProgress& progress, const std::string& what);
  /// Reads `extents` (by file offset) back from `file` to device memory: chunk n+1 is read (on a
  /// thread of its own) while chunk n is copied to the device; chunks without an extent are
  /// skipped. Every copy and read has completed when it returns or throws. Throws backend_error
  /// naming the file, the offset and the size.
  void read(Backend& backend, int device, const std::vector<Extent>& extents, const BackupFile& file,
            BackupProgress& progress, const std::string& what);

 private:
  char* buffer_[2] = {nullptr, nullptr};
  std::size_t chunk_ = 0;
};

}  // namespace stitch::detail
