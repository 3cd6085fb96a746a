// tests/support/cuda_driver.hpp — the tests' own handle on the CUDA driver that backend:cuda
// opens (libcuda.so.1, or $STITCH_CUDA_DRIVER): the few driver calls a test makes itself
// (streams, contexts, copies), and, when that driver is the strict fake
// (tests/fake_cuda/), its test controls. Header-only; dlopen of the same file returns the handle
// the back end uses, so both see one driver.
#pragma once

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "backends/cuda/cuda_types.hpp"

extern "C" {
struct CUstream_st;
struct stitch_fake_cuda_usage {  // as tests/fake_cuda/fake_cuda_control.h declares it
  unsigned long long capacity_bytes;
  unsigned long long used_bytes;
  unsigned long long live_allocations;
  unsigned long long live_handles;
  unsigned long long live_reservations;
  unsigned long long live_mappings;
  unsigned long long live_streams;
  unsigned long long live_events;
  unsigned long long live_host_allocations;
  unsigned long long host_bytes;
};
}

namespace stitch::test {

struct TestDriver {
  bool loaded = false;  ///< the driver opened and cuInit succeeded
  bool fake = false;    ///< it is the strict fake (its controls below are set)
  std::string why;      ///< why not loaded

  CUresult (*init)(unsigned) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*ctx_get_current)(CUcontext*) = nullptr;
  CUresult (*ctx_set_current)(CUcontext) = nullptr;
  CUresult (*stream_create)(CUstream*, unsigned) = nullptr;
  CUresult (*stream_destroy)(CUstream) = nullptr;
  CUresult (*memcpy)(CUdeviceptr, CUdeviceptr, std::size_t) = nullptr;  // real driver only
  // graph capture (the CUgraph out-parameter as void*: a pointer either way)
  CUresult (*stream_begin_capture)(CUstream, CUstreamCaptureMode) = nullptr;
  CUresult (*stream_end_capture)(CUstream, void**) = nullptr;
  CUresult (*stream_is_capturing)(CUstream, CUstreamCaptureStatus*) = nullptr;

  // The fake's controls (tests/fake_cuda/fake_cuda_control.h).
  int (*fail)(const char*, unsigned long long, int) = nullptr;
  void (*clear_faults)() = nullptr;
  int (*hold_stream)(CUstream_st*) = nullptr;
  int (*release_stream)(CUstream_st*) = nullptr;
  unsigned long long (*calls)(const char*) = nullptr;
  unsigned long long (*violations)() = nullptr;
  const char* (*last_violation)() = nullptr;
  int (*get_usage)(int, stitch_fake_cuda_usage*) = nullptr;
  int (*contexts_activated)(int) = nullptr;
  unsigned long long (*set_access_calls)(int) = nullptr;
  unsigned long long (*forced_completions)() = nullptr;
  void (*handle_counts)(unsigned long long*, unsigned long long*) = nullptr;

  /// Device `d`'s primary context (retained once per call: the tests never release it).
  CUcontext context(int d) const {
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    if (device_get(&dev, d) != CUDA_SUCCESS || primary_ctx_retain(&ctx, dev) != CUDA_SUCCESS)
      return nullptr;
    return ctx;
  }
  /// A new stream on device `d` (nullptr on failure); the caller's context is kept.
  void* make_stream(int d) const {
    CUcontext previous = nullptr, ctx = context(d);
    CUstream s = nullptr;
    if (ctx == nullptr || ctx_get_current(&previous) != CUDA_SUCCESS) return nullptr;
    ctx_set_current(ctx);
    if (stream_create(&s, 0) != CUDA_SUCCESS) s = nullptr;
    ctx_set_current(previous);
    return s;
  }
  void destroy_stream(int d, void* s) const {
    CUcontext previous = nullptr;
    ctx_get_current(&previous);
    ctx_set_current(context(d));
    stream_destroy(static_cast<CUstream>(s));
    ctx_set_current(previous);
  }
  stitch_fake_cuda_usage usage(int d) const {
    stitch_fake_cuda_usage u{};
    if (get_usage != nullptr) get_usage(d, &u);
    return u;
  }
};

template <class Fn>
void resolve(void* lib, const char* name, Fn& out) {
  void* p = ::dlsym(lib, name);
  static_assert(sizeof(Fn) == sizeof(void*));
  std::memcpy(&out, &p, sizeof out);
}

inline const TestDriver& test_driver() {
  static const TestDriver d = [] {
    TestDriver t;
    const char* env = std::getenv("STITCH_CUDA_DRIVER");
    const std::string path = env != nullptr && *env != '\0' ? env : "libcuda.so.1";
    void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* e = ::dlerror();
      t.why = "cannot open " + path + (e != nullptr ? std::string(": ") + e : std::string());
      return t;
    }
    resolve(lib, "cuInit", t.init);
    resolve(lib, "cuDeviceGet", t.device_get);
    resolve(lib, "cuDevicePrimaryCtxRetain", t.primary_ctx_retain);
    resolve(lib, "cuCtxGetCurrent", t.ctx_get_current);
    resolve(lib, "cuCtxSetCurrent", t.ctx_set_current);
    resolve(lib, "cuStreamCreate", t.stream_create);
    resolve(lib, "cuStreamDestroy_v2", t.stream_destroy);
    resolve(lib, "cuMemcpy", t.memcpy);
    resolve(lib, "cuStreamBeginCapture_v2", t.stream_begin_capture);
    resolve(lib, "cuStreamEndCapture", t.stream_end_capture);
    resolve(lib, "cuStreamIsCapturing", t.stream_is_capturing);
    resolve(lib, "stitch_fake_cuda_fail", t.fail);
    resolve(lib, "stitch_fake_cuda_clear_faults", t.clear_faults);
    resolve(lib, "stitch_fake_cuda_hold_stream", t.hold_stream);
    resolve(lib, "stitch_fake_cuda_release_stream", t.release_stream);
    resolve(lib, "stitch_fake_cuda_calls", t.calls);
    resolve(lib, "stitch_fake_cuda_violations", t.violations);
    resolve(lib, "stitch_fake_cuda_last_violation", t.last_violation);
    resolve(lib, "stitch_fake_cuda_get_usage", t.get_usage);
    resolve(lib, "stitch_fake_cuda_contexts_activated", t.contexts_activated);
    resolve(lib, "stitch_fake_cuda_set_access_calls", t.set_access_calls);
    resolve(lib, "stitch_fake_cuda_forced_completions", t.forced_completions);
    resolve(lib, "stitch_fake_cuda_handle_counts", t.handle_counts);
    t.fake = t.fail != nullptr && t.violations != nullptr && t.get_usage != nullptr;
    if (t.init == nullptr || t.device_get == nullptr || t.primary_ctx_retain == nullptr ||
        t.ctx_get_current == nullptr || t.ctx_set_current == nullptr ||
        t.stream_create == nullptr || t.stream_destroy == nullptr) {
      t.why = path + " lacks driver entry points";
      return t;
    }
    if (t.init(0) != CUDA_SUCCESS) {
      t.why = "cuInit failed";
      return t;
    }
    t.loaded = true;
    return t;
  }();
  return d;
}

/// The fake's controls, or nullptr when the driver is not the fake (tests then skip).
inline const TestDriver* fake_driver() {
  const TestDriver& d = test_driver();
  return d.loaded && d.fake ? &d : nullptr;
}

}  // namespace stitch::test
