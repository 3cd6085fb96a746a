// diagnostics/recorder.cpp — the trace ring buffer and its stack symbolization.
#include "diagnostics/recorder.hpp"

#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <fmt/format.h>

#include <chrono>
#include <new>
#include <cstdlib>
#include <string>

namespace stitch {

const char* to_string(TraceAction action) noexcept {
  switch (action) {
    case TraceAction::alloc: return "alloc";
    case TraceAction::free_requested: return "free_requested";
    case TraceAction::free_completed: return "free_completed";
    case TraceAction::segment_alloc: return "segment_alloc";
    case TraceAction::segment_free: return "segment_free";
    case TraceAction::segment_map: return "segment_map";
    case TraceAction::segment_unmap: return "segment_unmap";
    case TraceAction::oom: return "oom";
    case TraceAction::snapshot: return "snapshot";
  }
  return "unknown";
}

namespace detail {

void Recorder::configure(bool enabled, std::size_t max_entries, bool stacks, bool python_stacks,
                         bool device_empty) {
  const std::size_t capacity = enabled ? (max_entries == 0 ? 1 : max_entries) : 0;
  stacks_ = stacks;
  python_stacks_ = python_stacks;
  if (capacity_ == 0 && capacity != 0) {  // a new history starts
    from_empty_ = device_empty;
    dropped_ = 0;
  }
  if (capacity == capacity_) return;
  // Keep the newest entries that still fit. The ring grows as entries come (max_entries may be
  // up to 2^32: reserving it up front would ask for terabytes).
  std::vector<Raw> kept;
  if (capacity != 0) {
    const std::size_t keep = count_ < capacity ? count_ : capacity;
    dropped_ += count_ - keep;
    kept.reserve(keep);
    for (std::size_t i = count_ - keep; i < count_; ++i)
      kept.push_back(ring_[(next_ + capacity_ - count_ + i) % capacity_]);
    count_ = keep;
    next_ = keep % capacity;
  } else {
    count_ = next_ = 0;
  }
  ring_ = std::move(kept);
  capacity_ = capacity;
}

void Recorder::record(TraceAction action, const void* addr, std::size_t size, stream_t stream) {
  const std::int64_t now = std::chrono::duration_cast<std::chrono::microseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
  if (observed_) {
    try {
      TraceEntry e;
      e.action = action;
      e.addr = reinterpret_cast<std::uintptr_t>(addr);
      e.size = size;
      e.stream = reinterpret_cast<std::uintptr_t>(stream);
      e.time_us = now;
      observer_(e);
    } catch (...) {  // an observer's failure is its own: the allocator goes on
    }
  }
  if (capacity_ == 0) return;
  if (next_ == ring_.size()) {  // still growing (next_ < capacity_)
    try {
      ring_.emplace_back();
    } catch (const std::bad_alloc&) {
      return;  // no host memory for the entry: the history misses it, the allocator goes on
    }
  }
  Raw& r = ring_[next_];
  r.action = action;
  r.addr = reinterpret_cast<std::uintptr_t>(addr);
  r.size = size;
  r.stream = reinterpret_cast<std::uintptr_t>(stream);
  r.time_us = now;
  // With both kinds, native frames take at most half: the Python ones say where in the program.
  const int native_max = python_stacks_ ? kMaxFrames / 2 : kMaxFrames;
  r.frames = stacks_ ? backtrace(r.stack, native_max) : 0;
  if (python_stacks_)
    r.frames += PythonFrames::copy(reinterpret_cast<std::uintptr_t*>(r.stack + r.frames),
                                   kMaxFrames - r.frames);
  next_ = (next_ + 1) % capacity_;
  if (count_ < capacity_) {
    ++count_;
  } else {
    ++dropped_;  // the oldest entry was overwritten
  }
}

namespace {
std::string symbolize(void* pc) {
  Dl_info info{};
  if (dladdr(pc, &info) == 0 || info.dli_sname == nullptr)
    return fmt::format("{} ({})", pc, info.dli_fname != nullptr ? info.dli_fname : "?");
  int status = 0;
  char* demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled != nullptr ? demangled : info.dli_sname;
  std::free(demangled);
  return fmt::format("{} ({})", name, info.dli_fname != nullptr ? info.dli_fname : "?");
}
}  // namespace

std::string Recorder::describe(const Raw& r, int f) const {
  const auto word = reinterpret_cast<std::uintptr_t>(r.stack[f]);
  return PythonFrames::is_python(word) ? PythonFrames::describe(word) : symbolize(r.stack[f]);
}

std::vector<std::string> Recorder::alloc_frames(std::uintptr_t addr) const {
  std::vector<std::string> frames;
  for (std::size_t i = count_; i > 0; --i) {
    const Raw& r = ring_[(next_ + capacity_ - count_ + i - 1) % capacity_];
    if (r.action == TraceAction::alloc && r.addr == addr) {
      for (int f = 0; f < r.frames; ++f) frames.push_back(describe(r, f));
      break;
    }
  }
  return frames;
}

std::vector<TraceEntry> Recorder::entries(bool with_frames) const {
  std::vector<TraceEntry> out;
  out.reserve(count_);
  for (std::size_t i = 0; i < count_; ++i) {
    const Raw& r = ring_[(next_ + capacity_ - count_ + i) % capacity_];
    TraceEntry e;
    e.action = r.action;
    e.addr = r.addr;
    e.size = r.size;
    e.stream = r.stream;
    e.time_us = r.time_us;
    if (with_frames)
      for (int f = 0; f < r.frames; ++f) e.frames.push_back(describe(r, f));
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace detail
}  // namespace stitch
