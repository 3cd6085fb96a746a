// backends/backend_files.cpp — the Backend interface's default file calls (sleep's disk tier,
// docs/sleep.md): a backup file private to the process (O_TMPFILE, else 0600 and unlinked at
// once; O_DIRECT where the file system takes it), and pwrite / pread / a hole / close on it; and
// check_backup_dir, which makes one to see that backup_dir can hold them.
#include <fmt/format.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "stitch/backend.hpp"
#include "stitch/errors.hpp"

namespace stitch {

namespace {

/// Turns O_DIRECT on or off for `fd`; whether it is on afterwards.
bool set_direct(int fd, bool on) noexcept {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0) return false;
  const int want = on ? (flags | O_DIRECT) : (flags & ~O_DIRECT);
  if (want != flags && ::fcntl(fd, F_SETFL, want) != 0) return (flags & O_DIRECT) != 0;
  return on;
}

/// A file of its own name in `dir`, mode 0600, unlinked at once (where O_TMPFILE is refused).
/// A crash between the create and the unlink leaves it, named stitch-backup-<pid>-XXXXXX.
int open_named(const char* dir) noexcept {
  std::string path;
  try {
    path = std::string(dir) + "/stitch-backup-" + std::to_string(::getpid()) + "-XXXXXX";
  } catch (...) {
    return -ENOMEM;
  }
  const int fd = ::mkostemp(path.data(), O_CLOEXEC);  // mode 0600
  if (fd < 0) return -errno;
  if (::unlink(path.c_str()) != 0) {
    const int e = errno;
    ::close(fd);
    return -e;
  }
  return fd;
}

/// A private file in `dir` (unnamed where the file system allows it), O_DIRECT where it takes it.
int open_private(const char* dir, bool* direct) noexcept {
  if (direct != nullptr) *direct = false;
  if (dir == nullptr || *dir == '\0') return -EINVAL;
  // Unnamed first, with O_DIRECT and then without (a file system may refuse O_DIRECT only).
  for (const int extra : {O_DIRECT, 0}) {
    const int fd = ::open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC | extra, 0600);
    if (fd >= 0) {
      if (direct != nullptr) *direct = extra != 0;
      return fd;
    }
    // EISDIR / EOPNOTSUPP: no O_TMPFILE here; EINVAL: no O_DIRECT (or no O_TMPFILE either).
    if (errno != EINVAL && errno != EISDIR && errno != EOPNOTSUPP) return -errno;
  }
  const int fd = open_named(dir);
  if (fd >= 0 && direct != nullptr) *direct = set_direct(fd, true);
  return fd;
}

/// pwrite or pread, EINTR retried; O_DIRECT refused at the first call (a device whose block is
/// larger than 4 KiB) turns the file buffered and the call is made again.
std::int64_t transfer(int fd, void* buf, std::size_t bytes, std::uint64_t offset, bool write) noexcept {
  for (bool retried = false;;) {
    const ssize_t n = write ? ::pwrite(fd, buf, bytes, static_cast<off_t>(offset))
                            : ::pread(fd, buf, bytes, static_cast<off_t>(offset));
    if (n >= 0) return n;
    if (errno == EINTR) continue;
    if (errno == EINVAL && !retried && (::fcntl(fd, F_GETFL) & O_DIRECT) != 0 && !set_direct(fd, false)) {
      retried = true;
      continue;
    }
    return -errno;
  }
}

}  // namespace

void check_backup_dir(const std::string& path) {
  auto refuse = [&](const std::string& why) {
    throw config_error(fmt::format("stitch config: backup_dir '{}' is not usable: {}", path, why));
  };
  if (path.empty() || path.front() != '/') refuse("it is not an absolute path");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) refuse(fmt::format("it cannot be looked up ({})", std::strerror(errno)));
    // Created with its missing parents, each 0700 (the backups are the process's alone).
    for (std::size_t at = 1; at <= path.size(); ++at) {
      if (at != path.size() && path[at] != '/') continue;
      const std::string prefix = path.substr(0, at);
      if (::mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST)
        refuse(fmt::format("it does not exist and cannot be created ({}: {})", prefix, std::strerror(errno)));
    }
    if (::stat(path.c_str(), &st) != 0) refuse(fmt::format("it was created but is gone ({})", std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) refuse("it is not a directory");
  // The proof: a private file made there (as the backups' are) and closed.
  const int fd = open_private(path.c_str(), nullptr);
  if (fd < 0) refuse(fmt::format("this process cannot create a file in it ({})", std::strerror(-fd)));
  ::close(fd);
}

int Backend::open_file(int, const char* dir, bool* direct) noexcept { return open_private(dir, direct); }

std::int64_t Backend::write_file(int, int fd, const void* src, std::size_t bytes, std::uint64_t offset) noexcept {
  return transfer(fd, const_cast<void*>(src), bytes, offset, /*write=*/true);
}

std::int64_t Backend::read_file(int, int fd, void* dst, std::size_t bytes, std::uint64_t offset) noexcept {
  return transfer(fd, dst, bytes, offset, /*write=*/false);
}

int Backend::discard_file(int, int fd, std::uint64_t offset, std::uint64_t bytes) noexcept {
  if (bytes == 0) return 0;
  if (::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                  static_cast<off_t>(bytes)) != 0)
    return -errno;
  return 0;
}

void Backend::close_file(int, int fd) noexcept {
  if (fd >= 0) ::close(fd);  // (EINTR: Linux has closed the descriptor anyway)
}

}  // namespace stitch
