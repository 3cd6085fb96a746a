// diagnostics/python_frames.hpp — the Python frames of an allocation, for recorded stacks
// (record_stacks:python|all, as PyTorch's _record_memory_history(stacks=...)).
//
// CPython's C API is found at run time with dlsym in the running process: libstitch never links
// libpython, and in a process without Python no frame is taken. As PyTorch does, the frames are
// gathered before the allocator takes its device lock (gather() takes the GIL, which a Python
// thread waiting for the device lock may hold), kept for the calling thread, and copied into the
// history entries that allocation records.
//
// A frame is one word, tagged (its top bit set, which no user-space code address has on the
// platforms stitch supports): the index of its code object in a process-wide cache, and its
// line. The cache keeps each code object it has seen alive (one reference, never dropped) so
// that its address stays its identity, and keeps its file and function names.
#pragma once

#include <cstdint>
#include <string>

namespace stitch::detail {

class PythonFrames {
 public:
  static constexpr int kMaxFrames = 24;

  /// Whether `word` is a Python frame (else a native return address).
  static bool is_python(std::uintptr_t word) noexcept { return (word >> 63) != 0; }
  /// Gathers the calling thread's Python stack (innermost first) and keeps it for this thread
  /// until release(); nothing without Python. Holds the GIL meanwhile: call it with no lock of
  /// the allocator held.
  static void gather() noexcept;
  /// Forgets this thread's gathered frames.
  static void release() noexcept;
  /// Copies up to `max` of this thread's gathered frames into `out`; returns how many.
  static int copy(std::uintptr_t* out, int max) noexcept;
  /// "function (file:line)" for a frame word.
  static std::string describe(std::uintptr_t word);
};

/// Gathers this thread's Python frames for the length of one allocation when `on`.
class GatheredPythonFrames {
 public:
  explicit GatheredPythonFrames(bool on) noexcept : on_(on) {
    if (on_) PythonFrames::gather();
  }
  ~GatheredPythonFrames() {
    if (on_) PythonFrames::release();
  }
  GatheredPythonFrames(const GatheredPythonFrames&) = delete;
  GatheredPythonFrames& operator=(const GatheredPythonFrames&) = delete;

 private:
  bool on_;
};

}  // namespace stitch::detail
