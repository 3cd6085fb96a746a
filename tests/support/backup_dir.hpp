// tests/support/backup_dir.hpp — for the disk tier's tests (backup_dir, docs/sleep.md): a fresh
// directory under /tmp, removed with what is in it; what the kernel says stays of the backup
// files (entries in the directory, this process's descriptors on files in it, their blocks); and
// a pattern in every byte of a block, to show that not one byte was lost. Header-only.
#pragma once

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "support/data_pattern.hpp"

namespace stitch::test {

class BackupDir {
 public:
  BackupDir() {
    char name[] = "/tmp/stitch-backup-test-XXXXXX";
    if (::mkdtemp(name) != nullptr) path_ = name;
  }
  ~BackupDir() {
    if (path_.empty()) return;
    if (DIR* d = ::opendir(path_.c_str())) {
      while (const dirent* e = ::readdir(d))
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
          ::unlink((path_ + "/" + e->d_name).c_str());
      ::closedir(d);
    }
    ::rmdir(path_.c_str());
  }
  BackupDir(const BackupDir&) = delete;
  BackupDir& operator=(const BackupDir&) = delete;

  [[nodiscard]] const std::string& path() const { return path_; }
  /// Entries in the directory (what a crash or a failed sleep would leave behind).
  [[nodiscard]] std::size_t entries() const {
    std::size_t n = 0;
    if (DIR* d = ::opendir(path_.c_str())) {
      while (const dirent* e = ::readdir(d))
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) ++n;
      ::closedir(d);
    }
    return n;
  }
  /// This process's descriptors on files in the directory (unnamed ones included: the kernel
  /// shows them as "<dir>/#<inode> (deleted)").
  [[nodiscard]] std::size_t open_files() const { return for_each_open([](int) {}); }
  /// Bytes of disk the open files in the directory hold (st_blocks), summed.
  [[nodiscard]] std::uint64_t disk_bytes() const {
    std::uint64_t n = 0;
    for_each_open([&](int fd) {
      struct stat st {};
      if (::fstat(fd, &st) == 0) n += static_cast<std::uint64_t>(st.st_blocks) * 512;
    });
    return n;
  }

 private:
  template <typename Fn>
  std::size_t for_each_open(Fn&& fn) const {
    std::size_t n = 0;
    DIR* d = ::opendir("/proc/self/fd");
    if (d == nullptr) return 0;
    const std::string prefix = path_ + "/";
    while (const dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      char target[PATH_MAX];
      const std::string link = std::string("/proc/self/fd/") + e->d_name;
      const ssize_t len = ::readlink(link.c_str(), target, sizeof target - 1);
      if (len <= 0) continue;
      target[len] = '\0';
      if (std::strncmp(target, prefix.c_str(), prefix.size()) != 0) continue;
      ++n;
      fn(std::atoi(e->d_name));
    }
    ::closedir(d);
    return n;
  }

  std::string path_;
};

/// Every 8-byte word of [p, p + size) from `seed` (the tail bytes too): a lost or moved byte
/// anywhere shows.
inline void fill_every_byte(void* p, std::size_t size, std::uint64_t seed) {
  auto* b = static_cast<unsigned char*>(p);
  std::size_t off = 0;
  for (; off + 8 <= size; off += 8) {
    const std::uint64_t v = mix(seed + off);
    std::memcpy(b + off, &v, 8);
  }
  for (; off < size; ++off) b[off] = static_cast<unsigned char>(mix(seed + off));
}

/// Whether every byte of [p, p + size) is what fill_every_byte(p, size, seed) wrote.
inline bool every_byte_intact(const void* p, std::size_t size, std::uint64_t seed) {
  const auto* b = static_cast<const unsigned char*>(p);
  std::size_t off = 0;
  for (; off + 8 <= size; off += 8) {
    const std::uint64_t v = mix(seed + off);
    if (std::memcmp(b + off, &v, 8) != 0) return false;
  }
  for (; off < size; ++off)
    if (b[off] != static_cast<unsigned char>(mix(seed + off))) return false;
  return true;
}

}  // namespace stitch::test
