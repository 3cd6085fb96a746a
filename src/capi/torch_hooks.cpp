// capi/torch_hooks.cpp — CUDAPluggableAllocator hooks that throw (see stitch/torch_hooks.h),
// the CUDA graph pool hooks among them.
//
// They sit on the C API rather than on the Allocator so that they share its one process-wide
// allocator, its lazy construction and its error text. Unlike the rest of the C API these
// functions let an exception leave them: PyTorch calls them from C++ through std::function, and an
// exception is the only failure it propagates (a NULL becomes a tensor with a NULL pointer).
#include "stitch/torch_hooks.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "stitch/allocator.hpp"
#include "stitch/errors.hpp"
#include "stitch/stitch.h"

namespace {

// stitch's out-of-memory reports (diagnostics/oom_report.cpp) all start like PyTorch's.
constexpr char kOomPrefix[] = "CUDA out of memory";

// Throws this thread's last stitch error: out_of_memory for an OOM report, error otherwise.
[[noreturn]] void throw_last_error(const char* fallback) {
  std::string message = stitch_last_error();
  if (message.empty()) message = fallback;
  if (message.compare(0, sizeof(kOomPrefix) - 1, kOomPrefix) == 0)
    throw stitch::out_of_memory(std::move(message));
  throw stitch::error(std::move(message));
}

}  // namespace

extern "C" {

void* stitch_torch_malloc(size_t size, int device, void* stream) {
  void* ptr = stitch_malloc(size, device, stream);
  if (ptr == nullptr && size != 0) throw_last_error("stitch: allocation failed");
  return ptr;
}

void stitch_torch_empty_cache(void) {
  if (stitch_empty_cache(-1) != 0)
    std::fprintf(stderr, "stitch: empty_cache failed: %s\n", stitch_last_error());
}

void stitch_torch_set_memory_fraction(double fraction, int device) {
  if (stitch_set_memory_fraction(fraction, device) != 0)
    throw_last_error("stitch: set_memory_fraction failed");
}

void stitch_torch_record_stream(void* ptr, void* stream) {
  if (ptr == nullptr) return;
  if (stitch_record_stream(ptr, stream) != 0) throw_last_error("stitch: record_stream failed");
}

void stitch_torch_begin_allocate_to_pool(int device,
                                         std::pair<unsigned long long, unsigned long long> id,
                                         std::function<bool(CUstream_st*)> filter) {
  if (!filter) throw stitch::invalid_argument("stitch: begin_allocate_to_pool without a filter");
  stitch::process_allocator().begin_allocate_to_pool(
      device, id, [f = std::move(filter)](stitch::stream_t s) {
        return f(static_cast<CUstream_st*>(s));
      });
}

void stitch_torch_end_allocate_to_pool(int device,
                                       std::pair<unsigned long long, unsigned long long> id) {
  stitch::process_allocator().end_allocate_to_pool(device, id);
}

void stitch_torch_release_pool(int device, std::pair<unsigned long long, unsigned long long> id) {
  stitch::process_allocator().release_pool(device, id);
}

}  // extern "C"
