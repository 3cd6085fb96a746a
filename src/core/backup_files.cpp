// core/backup_files.cpp — sleep's disk tier: the process's backup budget, backup files, staging
// buffers and the streaming through them (core/backup_files.hpp).
#include "core/backup_files.hpp"

#include <fmt/format.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>

#include "stitch/errors.hpp"

namespace stitch::detail {

namespace {

constexpr std::size_t kAlign = Backend::kFileAlignment;
constexpr std::size_t kMinChunk = std::size_t{64} << 10;
constexpr std::size_t kMaxChunk = std::size_t{16} << 20;
/// Writes or reads in a row that move nothing before the call is taken as failed.
constexpr int kMaxStalls = 3;

std::atomic<std::size_t> g_host{0};  ///< pinned host memory of every device's backups
std::atomic<std::size_t> g_file{0};  ///< file bytes of every device's backups

/// Adds `bytes` to `counter` unless that passes `cap` (0: no cap) or wraps.
bool take(std::atomic<std::size_t>& counter, std::size_t bytes, std::size_t cap) noexcept {
  std::size_t cur = counter.load(std::memory_order_relaxed);
  do {
    if (bytes > std::numeric_limits<std::size_t>::max() - cur) return false;
    if (cap != 0 && cur + bytes > cap) return false;
  } while (!counter.compare_exchange_weak(cur, cur + bytes, std::memory_order_relaxed));
  return true;
}

void give(std::atomic<std::size_t>& counter, std::size_t bytes) noexcept {
  counter.fetch_sub(bytes, std::memory_order_relaxed);
}

/// "No space left on device (ENOSPC)".
std::string errno_text(int e) {
  const char* name = nullptr;
  switch (e) {
    case ENOSPC: name = "ENOSPC"; break;
    case EDQUOT: name = "EDQUOT"; break;
    case EFBIG: name = "EFBIG"; break;
    case EIO: name = "EIO"; break;
    case EROFS: name = "EROFS"; break;
    case EACCES: name = "EACCES"; break;
    case EPERM: name = "EPERM"; break;
    case ENOENT: name = "ENOENT"; break;
    case ENOTDIR: name = "ENOTDIR"; break;
    case EMFILE: name = "EMFILE"; break;
    case ENFILE: name = "ENFILE"; break;
    case EINVAL: name = "EINVAL"; break;
    case EBADF: name = "EBADF"; break;
    case ENOMEM: name = "ENOMEM"; break;
    default: break;
  }
  return name != nullptr ? fmt::format("{} ({})", std::strerror(e), name)
                         : fmt::format("{} (errno {})", std::strerror(e), e);
}

/// The file system is full: the sleep lacks room, as when the host refuses (out_of_memory).
bool full(int e) noexcept { return e == ENOSPC || e == EDQUOT || e == EFBIG; }

[[noreturn]] void io_failed(const std::string& what, const char* verb, const BackupFile& file,
                            std::uint64_t offset, std::size_t bytes, const std::string& why, bool no_room) {
  std::string text = fmt::format("{}: {} {} failed at offset {} ({} bytes): {}", what, verb, file.describe(),
                                 offset, bytes, why);
  if (no_room) throw out_of_memory(std::move(text));
  throw backend_error(std::move(text));
}

/// Writes all of [buf, buf + bytes) at `offset`, or reads all of it; a short write or read goes
/// on from where it stopped (on a 4 KiB boundary with O_DIRECT: a few bytes may move twice). The
/// end of the file before the bytes asked is a failure.
void move_all(Backend& backend, int device, const BackupFile& file, char* buf, std::size_t bytes,
              std::uint64_t offset, const std::string& what, bool write) {
  const char* verb = write ? "writing" : "reading";
  std::size_t done = 0;
  for (int stalls = 0; done < bytes;) {
    const std::int64_t n = write ? backend.write_file(device, file.fd, buf + done, bytes - done, offset + done)
                                 : backend.read_file(device, file.fd, buf + done, bytes - done, offset + done);
    if (n < 0) {
      const int e = static_cast<int>(-n);
      io_failed(what, verb, file, offset + done, bytes - done, errno_text(e), write && full(e));
    }
    if (n == 0 && !write)
      io_failed(what, verb, file, offset + done, bytes - done,
                fmt::format("the file ends there ({} bytes were written to it)", file.size), false);
    std::size_t step = std::min(static_cast<std::size_t>(n), bytes - done);
    if (file.direct) step -= step % kAlign;
    if (step == 0) {
      if (++stalls == kMaxStalls)
        io_failed(what, verb, file, offset + done, bytes - done,
                  fmt::format("{} calls in a row moved nothing", kMaxStalls), false);
      continue;
    }
    stalls = 0;
    done += step;
  }
}

/// Calls fn(device, at, n) for the parts of `extents` inside [lo, hi) of the file (`at`: the
/// part's offset from lo), from extents[*first] on; moves *first past the extents ending by lo.
template <typename Fn>
void in_chunk(const std::vector<Extent>& extents, std::size_t* first, std::uint64_t lo, std::uint64_t hi, Fn&& fn) {
  while (*first < extents.size() && extents[*first].file_offset + extents[*first].bytes <= lo) ++*first;
  for (std::size_t i = *first; i < extents.size() && extents[i].file_offset < hi; ++i) {
    const Extent& e = extents[i];
    const std::uint64_t from = std::max<std::uint64_t>(e.file_offset, lo);
    const std::uint64_t to = std::min<std::uint64_t>(e.file_offset + e.bytes, hi);
    if (to > from)
      fn(e.device + (from - e.file_offset), static_cast<std::size_t>(from - lo), static_cast<std::size_t>(to - from));
  }
}

/// The file half of a pipeline: the writes or reads, in the order given, on a thread of its own,
/// so that the copies of other chunks (the calling thread's) run meanwhile, even on a back end
/// whose copies take the calling thread (the simulated device); a job queued while the one
/// before runs starts when it ends, without waiting for the caller. Without a thread (none could
/// be made), each job runs at once on the caller's. After a failure the jobs queued are dropped
/// and wait() throws it. The destructor waits for the job in flight.
class FileThread {
 public:
  FileThread() noexcept {
    try {
      thread_ = std::thread([this] { loop(); });
    } catch (...) {  // no thread: inline
    }
  }
  ~FileThread() {
    {
      std::lock_guard lock(mutex_);
      quit_ = true;
      jobs_.clear();
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  FileThread(const FileThread&) = delete;
  FileThread& operator=(const FileThread&) = delete;

  /// Queues `job` (runs it at once without a thread; a failure is kept for wait()).
  void submit(std::function<void()> job) {
    if (!thread_.joinable()) {
      if (failure_) return;
      try {
        job();
      } catch (...) {
        failure_ = std::current_exception();
      }
      ++done_;
      return;
    }
    {
      std::lock_guard lock(mutex_);
      if (failure_) return;  // (wait() reports it)
      jobs_.push_back(std::move(job));
    }
    cv_.notify_all();
  }
  /// Waits until the first `n` jobs submitted are done; throws the first failure.
  void wait(std::uint64_t n) {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return done_ >= n || failure_; });
    if (failure_) std::rethrow_exception(failure_);
  }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return !jobs_.empty() || quit_; });
      if (jobs_.empty()) return;  // quit, nothing left
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      std::exception_ptr failed;
      try {
        job();
      } catch (...) {
        failed = std::current_exception();
      }
      lock.lock();
      if (failed && !failure_) {
        failure_ = failed;
        jobs_.clear();  // the rest depends on this one
      }
      ++done_;
      cv_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::uint64_t done_ = 0;
  bool quit_ = false;
  std::exception_ptr failure_;
  std::thread thread_;  // last: started once the rest exists
};

/// Waits for the copies in flight before a failure leaves (their host side may be freed next).
void settle(Backend& backend, int device) noexcept {
  try {
    backend.synchronize_stream(device, nullptr);
  } catch (...) {  // the first failure is the one reported
  }
}

}  // namespace

std::uint64_t file_bytes_for(std::uint64_t bytes) noexcept { return (bytes + kAlign - 1) / kAlign * kAlign; }

std::string host_cap_text(std::size_t cap) {
  if (cap == 0) return {};
  return fmt::format(" (backup_host_mb caps the backups at {}, {} in use)", bytes_text(cap),
                     bytes_text(backup_host_in_use()));
}

void rethrow_with(const std::exception& e, const std::string& suffix) {
  const std::string message = std::string(e.what()) + suffix;
  if (dynamic_cast<const out_of_memory*>(&e) != nullptr) throw out_of_memory(message);
  if (dynamic_cast<const backend_error*>(&e) != nullptr) throw backend_error(message);
  throw;
}

void* allocate_backup_host(Backend& backend, int device, std::size_t bytes, std::size_t cap) {
  if (!take(g_host, bytes, cap)) return nullptr;
  void* p = nullptr;
  try {
    p = backend.allocate_host(device, bytes);
  } catch (...) {
    give(g_host, bytes);
    throw;
  }
  if (p == nullptr) give(g_host, bytes);
  return p;
}

void free_backup_host(Backend& backend, int device, void* p, std::size_t bytes) noexcept {
  if (p == nullptr) return;
  try {
    backend.deallocate_host(device, p, bytes);
  } catch (...) {  // the host memory is lost to the process, not to the device
  }
  give(g_host, bytes);
}

std::size_t backup_host_in_use() noexcept { return g_host.load(std::memory_order_relaxed); }
std::size_t backup_file_in_use() noexcept { return g_file.load(std::memory_order_relaxed); }

std::string bytes_text(std::uint64_t bytes) {
  constexpr double GiB = double(std::uint64_t{1} << 30), MiB = double(std::uint64_t{1} << 20);
  if (bytes >= (std::uint64_t{1} << 30)) return fmt::format("{:.2f} GiB ({} bytes)", double(bytes) / GiB, bytes);
  return fmt::format("{:.2f} MiB ({} bytes)", double(bytes) / MiB, bytes);
}

void take_file_budget(const std::string& dir, std::uint64_t bytes, std::size_t cap, const std::string& what) {
  if (cap == 0) {
    struct statvfs v {};
    if (::statvfs(dir.c_str(), &v) == 0) {
      const std::uint64_t unit = v.f_frsize != 0 ? v.f_frsize : v.f_bsize;
      const std::uint64_t blocks = v.f_bavail;
      const std::uint64_t free_bytes =
          unit != 0 && blocks > std::numeric_limits<std::uint64_t>::max() / unit ? std::numeric_limits<std::uint64_t>::max()
                                                                                  : blocks * unit;
      if (bytes > free_bytes)
        throw out_of_memory(fmt::format("{}: the backups need {} in files, and {} has {} free", what,
                                        bytes_text(bytes), dir, bytes_text(free_bytes)));
    }  // (statvfs failing: the writes will tell)
  }
  if (bytes > std::numeric_limits<std::size_t>::max() || !take(g_file, static_cast<std::size_t>(bytes), cap))
    throw out_of_memory(fmt::format(
        "{}: the backups need {} in files, and backup_dir_mb caps the backup files of the process at {}, "
        "of which {} are in use",
        what, bytes_text(bytes), bytes_text(cap), bytes_text(backup_file_in_use())));
}

void give_file_budget(std::uint64_t bytes) noexcept { give(g_file, static_cast<std::size_t>(bytes)); }

void BackupFile::open(Backend& backend, int device, const std::string& in, std::uint64_t bytes, const std::string& what) {
  bool d = false;
  const int r = backend.open_file(device, in.c_str(), &d);
  if (r < 0) {
    std::string text = fmt::format("{}: a backup file cannot be created in {}: {}", what, in, errno_text(-r));
    if (full(-r)) throw out_of_memory(std::move(text));
    throw backend_error(std::move(text));
  }
  fd = r;
  direct = d;
  dir = in;
  size = file_bytes_for(bytes);
  held = size;
}

void BackupFile::close(Backend& backend, int device) noexcept {
  if (fd >= 0) backend.close_file(device, fd);
  give_file_budget(held);
  fd = -1;
  size = held = 0;
}

void BackupFile::discard(Backend& backend, int device, std::uint64_t offset, std::uint64_t bytes) noexcept {
  if (fd < 0) return;
  const std::uint64_t from = file_bytes_for(offset);
  const std::uint64_t to = (offset + bytes) / kAlign * kAlign;
  if (to <= from) return;
  if (backend.discard_file(device, fd, from, to - from) != 0) return;  // kept until the close
  const std::uint64_t n = std::min(to - from, held);
  give_file_budget(n);
  held -= n;
}

std::string BackupFile::describe() const {
  return fmt::format("the unnamed backup file in {} (descriptor {})", dir, fd);
}

bool Staging::make(Backend& backend, int device, std::size_t bytes, std::size_t cap) {
  std::size_t chunk = std::clamp<std::size_t>((bytes / 8 + kMinChunk - 1) / kMinChunk * kMinChunk, kMinChunk, kMaxChunk);
  if (cap != 0) {
    const std::size_t used = backup_host_in_use();
    const std::size_t room = cap > used ? cap - used : 0;
    while (chunk > kMinChunk && 2 * chunk > room) chunk = std::max(kMinChunk, chunk / 2 / kMinChunk * kMinChunk);
  }
  char* a = static_cast<char*>(allocate_backup_host(backend, device, chunk, cap));
  if (a == nullptr) return false;
  char* b = nullptr;
  try {
    b = static_cast<char*>(allocate_backup_host(backend, device, chunk, cap));
  } catch (...) {
    free_backup_host(backend, device, a, chunk);
    throw;
  }
  if (b == nullptr) {
    free_backup_host(backend, device, a, chunk);
    return false;
  }
  buffer_[0] = a;
  buffer_[1] = b;
  chunk_ = chunk;
  return true;
}

void Staging::free(Backend& backend, int device) noexcept {
  for (char*& b : buffer_) {
    free_backup_host(backend, device, b, chunk_);
    b = nullptr;
  }
  chunk_ = 0;
}

void Staging::write(Backend& backend, int device, const std::vector<Extent>& extents, const BackupFile& file,
                    BackupProgress& progress, const std::string& what) {
  if (extents.empty()) return;
  const std::uint64_t end = extents.back().file_offset + extents.back().bytes;
  const std::uint64_t chunks = (end + chunk_ - 1) / chunk_;
  std::size_t first = 0;
  try {
    FileThread files;  // (gone, its writes done, before the handler below runs)
    for (std::uint64_t k = 0; k < chunks; ++k) {
      // Chunk k goes into the buffer chunk k-2's write has left (waited for), is copied there
      // while chunk k-1 is written, and its write is queued behind that one.
      if (k >= 2) files.wait(k - 1);
      char* buf = buffer_[k % 2];
      const std::uint64_t lo = k * chunk_;
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk_, end - lo));
      in_chunk(extents, &first, lo, lo + n, [&](char* dev, std::size_t at, std::size_t len) {
        backend.copy_to_host_async(device, buf + at, dev, len, nullptr);
      });
      backend.synchronize_stream(device, nullptr);
      files.submit([&, buf, lo, n] {
        move_all(backend, device, file, buf, static_cast<std::size_t>(file_bytes_for(n)), lo, what, /*write=*/true);
        progress.add(n);
      });
    }
    files.wait(chunks);
  } catch (...) {
    settle(backend, device);
    throw;
  }
}

void Staging::read(Backend& backend, int device, const std::vector<Extent>& extents, const BackupFile& file,
                   BackupProgress& progress, const std::string& what) {
  if (extents.empty()) return;
  // The chunks that hold a part of an extent, in order (a freed block's bytes are not read).
  std::vector<std::uint64_t> wanted;
  for (const Extent& e : extents) {
    if (e.bytes == 0) continue;
    for (std::uint64_t k = e.file_offset / chunk_; k <= (e.file_offset + e.bytes - 1) / chunk_; ++k)
      if (wanted.empty() || wanted.back() < k) wanted.push_back(k);
  }
  std::size_t first = 0;
  auto fetch = [&](std::size_t i) {  // the read of chunk wanted[i] into its buffer
    const std::uint64_t lo = wanted[i] * chunk_;
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk_, file.size - std::min(lo, file.size)));
    char* buf = buffer_[i % 2];
    return [&, buf, lo, n] { move_all(backend, device, file, buf, n, lo, what, /*write=*/false); };
  };
  try {
    FileThread files;
    for (std::size_t i = 0; i < wanted.size() && i < 2; ++i) files.submit(fetch(i));
    for (std::size_t i = 0; i < wanted.size(); ++i) {
      // Chunk i, read, is copied to the device while chunk i+1 is read; then its buffer takes
      // chunk i+2, whose read is queued behind chunk i+1's.
      files.wait(i + 1);
      const std::uint64_t lo = wanted[i] * chunk_;
      in_chunk(extents, &first, lo, lo + chunk_, [&](char* dev, std::size_t at, std::size_t n) {
        backend.copy_from_host_async(device, dev, buffer_[i % 2] + at, n, nullptr);
        progress.add(n);
      });
      backend.synchronize_stream(device, nullptr);
      if (i + 2 < wanted.size()) files.submit(fetch(i + 2));
    }
  } catch (...) {
    settle(backend, device);
    throw;
  }
}

}  // namespace stitch::detail
