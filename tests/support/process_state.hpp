// tests/support/process_state.hpp — what a process holds, as the kernel lists it: open
// descriptors and mappings, for tests (and the fuzz target) that show a refused operation left
// nothing behind. Header-only.
#pragma once

#include <dirent.h>

#include <cstddef>
#include <fstream>
#include <string>

namespace stitch::test {

/// Entries of /proc/self/fd (this process's open descriptors, plus the listing's own).
inline std::size_t open_descriptors() {
  std::size_t n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n;
}

/// Lines of /proc/self/maps (this process's mappings).
inline std::size_t mappings() {
  std::ifstream maps("/proc/self/maps");
  std::size_t n = 0;
  for (std::string line; std::getline(maps, line);) ++n;
  return n;
}

}  // namespace stitch::test
