// tests/fake_cuda/fake_cuda.cpp — the strict fake CUDA driver, libstitch_fake_cuda.so: all
// exported cu* entry points, the fake devices / primary contexts / memory (device and pinned
// host) / streams / events, the contract rules (each check quotes the cuda.h sentence it
// enforces; rule numbers as in README.md) and the test-control API declared in
// fake_cuda_control.h.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

// Everything these headers declare is exported; everything else is hidden (-fvisibility=hidden).
#pragma GCC visibility push(default)
#include <cuda.h>

#include "fake_cuda_control.h"
// cuda.h #defines cuGetProcAddress to cuGetProcAddress_v2 and declares the legacy 4-argument
// symbol only for the driver's own build; the real libcuda exports both, so does the fake.
#undef cuGetProcAddress
extern "C" CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                             cuuint64_t flags);
#pragma GCC visibility pop

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using u64 = unsigned long long;
constexpr size_t kGranularity = size_t{2} << 20;  // minimum == recommended granularity
constexpr size_t kPage = 4096;
constexpr int kMaxDevices = 16;
constexpr int kDriverVersion = 13000;
// Opaque handle values: never dereferenced, never reused (not even across reset).
constexpr u64 kStreamBase = 0x5a0000000000ull, kEventBase = 0x5b0000000000ull,
              kGraphBase = 0x5c0000000000ull, kHandleBase = 0x4a00000000000000ull;
constexpr u64 kLegacyKey = 0x100;  // streams-map key of device d's legacy stream: kLegacyKey + d

// Base names of every entry point (the names cuGetProcAddress, faults and counters use).
#define FAKE_ENTRY_POINTS(X)                                                                     \
  X(cuInit) X(cuDriverGetVersion) X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetAttribute)     \
  X(cuDeviceGetName) X(cuDeviceTotalMem) X(cuDeviceCanAccessPeer) X(cuDevicePrimaryCtxRetain)    \
  X(cuDevicePrimaryCtxRelease) X(cuDevicePrimaryCtxGetState) X(cuCtxSetCurrent)                  \
  X(cuCtxGetCurrent) X(cuCtxGetDevice) X(cuCtxSynchronize) X(cuMemGetInfo) X(cuMemAlloc)         \
  X(cuMemFree) X(cuMemGetAllocationGranularity) X(cuMemAddressReserve) X(cuMemAddressFree)       \
  X(cuMemCreate) X(cuMemRelease) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess) X(cuMemcpyDtoDAsync) \
  X(cuMemcpyDtoH) X(cuMemcpyHtoD) X(cuMemHostAlloc) X(cuMemFreeHost) X(cuMemcpyDtoHAsync)        \
  X(cuMemcpyHtoDAsync) X(cuStreamCreate)                                                         \
  X(cuStreamDestroy) X(cuStreamSynchronize) X(cuStreamQuery) X(cuStreamBeginCapture)             \
  X(cuStreamEndCapture) X(cuStreamIsCapturing) X(cuThreadExchangeStreamCaptureMode)              \
  X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventQuery) X(cuEventSynchronize)      \
  X(cuGetErrorName) X(cuGetErrorString) X(cuGetProcAddress) X(cuMemGetAddressRange)               \
  X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle) X(cuIpcGetMemHandle)         \
  X(cuIpcOpenMemHandle) X(cuIpcCloseMemHandle)
enum Ep {
#define X(n) EP_##n,
  FAKE_ENTRY_POINTS(X)
#undef X
      EP_COUNT
};
const char* const kEpNames[] = {
#define X(n) #n,
    FAKE_ENTRY_POINTS(X)
#undef X
};

enum Rule {
  R_ARG = STITCH_FAKE_CUDA_RULE_ARGUMENT, R_INIT, R_CONTEXT, R_GRANULARITY, R_MAP, R_ACCESS,
  R_UNMAP, R_ADDRESS_FREE, R_RELEASED, R_HANDLE, R_FREE, R_OOM, R_CAPTURE, R_NO_VMM, R_IPC, R_COUNT
};
static_assert(static_cast<int>(R_COUNT) == static_cast<int>(STITCH_FAKE_CUDA_RULE_COUNT));
const char* const kRuleNames[] = {"argument", "init",       "context",      "granularity",
                                  "map",      "access",     "unmap",        "address-free",
                                  "released-handle", "handle", "free", "out-of-memory",
                                  "capture",  "no-vmm", "ipc"};

// Every CUresult of cuda.h 13.0, for cuGetErrorName / cuGetErrorString.
#define FAKE_ERRORS(E)                                                                           \
  E(SUCCESS) E(ERROR_INVALID_VALUE) E(ERROR_OUT_OF_MEMORY) E(ERROR_NOT_INITIALIZED)              \
  E(ERROR_DEINITIALIZED) E(ERROR_PROFILER_DISABLED) E(ERROR_PROFILER_NOT_INITIALIZED)            \
  E(ERROR_PROFILER_ALREADY_STARTED) E(ERROR_PROFILER_ALREADY_STOPPED) E(ERROR_STUB_LIBRARY)      \
  E(ERROR_CALL_REQUIRES_NEWER_DRIVER) E(ERROR_DEVICE_UNAVAILABLE) E(ERROR_NO_DEVICE)             \
  E(ERROR_INVALID_DEVICE) E(ERROR_DEVICE_NOT_LICENSED) E(ERROR_INVALID_IMAGE)                    \
  E(ERROR_INVALID_CONTEXT) E(ERROR_CONTEXT_ALREADY_CURRENT) E(ERROR_MAP_FAILED)                  \
  E(ERROR_UNMAP_FAILED) E(ERROR_ARRAY_IS_MAPPED) E(ERROR_ALREADY_MAPPED)                         \
  E(ERROR_NO_BINARY_FOR_GPU) E(ERROR_ALREADY_ACQUIRED) E(ERROR_NOT_MAPPED)                       \
  E(ERROR_NOT_MAPPED_AS_ARRAY) E(ERROR_NOT_MAPPED_AS_POINTER) E(ERROR_ECC_UNCORRECTABLE)         \
  E(ERROR_UNSUPPORTED_LIMIT) E(ERROR_CONTEXT_ALREADY_IN_USE) E(ERROR_PEER_ACCESS_UNSUPPORTED)    \
  E(ERROR_INVALID_PTX) E(ERROR_INVALID_GRAPHICS_CONTEXT) E(ERROR_NVLINK_UNCORRECTABLE)           \
  E(ERROR_JIT_COMPILER_NOT_FOUND) E(ERROR_UNSUPPORTED_PTX_VERSION)                               \
  E(ERROR_JIT_COMPILATION_DISABLED) E(ERROR_UNSUPPORTED_EXEC_AFFINITY)                           \
  E(ERROR_UNSUPPORTED_DEVSIDE_SYNC) E(ERROR_CONTAINED) E(ERROR_INVALID_SOURCE)                   \
  E(ERROR_FILE_NOT_FOUND) E(ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND)                                \
  E(ERROR_SHARED_OBJECT_INIT_FAILED) E(ERROR_OPERATING_SYSTEM) E(ERROR_INVALID_HANDLE)           \
  E(ERROR_ILLEGAL_STATE) E(ERROR_LOSSY_QUERY) E(ERROR_NOT_FOUND) E(ERROR_NOT_READY)              \
  E(ERROR_ILLEGAL_ADDRESS) E(ERROR_LAUNCH_OUT_OF_RESOURCES) E(ERROR_LAUNCH_TIMEOUT)              \
  E(ERROR_LAUNCH_INCOMPATIBLE_TEXTURING) E(ERROR_PEER_ACCESS_ALREADY_ENABLED)                    \
  E(ERROR_PEER_ACCESS_NOT_ENABLED) E(ERROR_PRIMARY_CONTEXT_ACTIVE) E(ERROR_CONTEXT_IS_DESTROYED) \
  E(ERROR_ASSERT) E(ERROR_TOO_MANY_PEERS) E(ERROR_HOST_MEMORY_ALREADY_REGISTERED)                \
  E(ERROR_HOST_MEMORY_NOT_REGISTERED) E(ERROR_HARDWARE_STACK_ERROR) E(ERROR_ILLEGAL_INSTRUCTION) \
  E(ERROR_MISALIGNED_ADDRESS) E(ERROR_INVALID_ADDRESS_SPACE) E(ERROR_INVALID_PC)                 \
  E(ERROR_LAUNCH_FAILED) E(ERROR_COOPERATIVE_LAUNCH_TOO_LARGE) E(ERROR_TENSOR_MEMORY_LEAK)       \
  E(ERROR_NOT_PERMITTED) E(ERROR_NOT_SUPPORTED) E(ERROR_SYSTEM_NOT_READY)                        \
  E(ERROR_SYSTEM_DRIVER_MISMATCH) E(ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE)                        \
  E(ERROR_MPS_CONNECTION_FAILED) E(ERROR_MPS_RPC_FAILURE) E(ERROR_MPS_SERVER_NOT_READY)          \
  E(ERROR_MPS_MAX_CLIENTS_REACHED) E(ERROR_MPS_MAX_CONNECTIONS_REACHED)                          \
  E(ERROR_MPS_CLIENT_TERMINATED) E(ERROR_CDP_NOT_SUPPORTED) E(ERROR_CDP_VERSION_MISMATCH)        \
  E(ERROR_STREAM_CAPTURE_UNSUPPORTED) E(ERROR_STREAM_CAPTURE_INVALIDATED)                        \
  E(ERROR_STREAM_CAPTURE_MERGE) E(ERROR_STREAM_CAPTURE_UNMATCHED) E(ERROR_STREAM_CAPTURE_UNJOINED) \
  E(ERROR_STREAM_CAPTURE_ISOLATION) E(ERROR_STREAM_CAPTURE_IMPLICIT) E(ERROR_CAPTURED_EVENT)     \
  E(ERROR_STREAM_CAPTURE_WRONG_THREAD) E(ERROR_TIMEOUT) E(ERROR_GRAPH_EXEC_UPDATE_FAILURE)       \
  E(ERROR_EXTERNAL_DEVICE) E(ERROR_INVALID_CLUSTER_SIZE) E(ERROR_FUNCTION_NOT_LOADED)            \
  E(ERROR_INVALID_RESOURCE_TYPE) E(ERROR_INVALID_RESOURCE_CONFIGURATION) E(ERROR_KEY_ROTATION)   \
  E(ERROR_UNKNOWN)
struct ErrorText { CUresult code; const char* name; char text[64]; };
const std::vector<ErrorText>& error_table() {
  static const std::vector<ErrorText> table = [] {
    std::vector<ErrorText> t = {
#define E(n) {CUDA_##n, "CUDA_" #n, {}},
        FAKE_ERRORS(E)
#undef E
    };
    for (ErrorText& e : t) {  // "CUDA_ERROR_OUT_OF_MEMORY" -> "out of memory"
      snprintf(e.text, sizeof e.text, "%s", e.code == CUDA_SUCCESS ? "no error" : e.name + strlen("CUDA_ERROR_"));
      for (char* c = e.text; *c != '\0'; ++c) *c = *c == '_' ? ' ' : static_cast<char>(tolower(*c));
    }
    return t;
  }();
  return table;
}
const ErrorText* find_error(int code) {
  for (const ErrorText& e : error_table())
    if (static_cast<int>(e.code) == code) return &e;
  return nullptr;
}
const char* error_name(int code) {
  const ErrorText* e = find_error(code);
  return e != nullptr ? e->name : "CUresult(?)";
}

// ---- state -------------------------------------------------------------------------------------
struct Device {
  size_t capacity = 0, used = 0;
  int refcount = 0, activated = 0;
  u64 set_access = 0;
};
// cuMemAlloc: a memfd (so that cuIpcGetMemHandle can share it) mapped read-write; its mmap
// length, the bytes asked for, the bytes charged.
struct Alloc { size_t length, bytes, charged; int dev; int fd; };
struct HostAlloc { size_t length, bytes; int dev; unsigned flags; };  // cuMemHostAlloc: mmap length, bytesize
// A cuMemCreate handle (or one cuMemImportFromShareableHandle made, which charges no device).
struct Handle { int fd; size_t size; int dev; bool released; int maps; unsigned types = 0; bool imported = false;
                bool host = false; };  // host: CU_MEM_LOCATION_TYPE_HOST_NUMA memory, charged to no device
// A cuIpcOpenMemHandle mapping of another process's cuMemAlloc memory.
struct IpcOpen { size_t length, bytes; int refs; long pid; int fd; u64 source; int dev; };
struct Reservation { size_t size; int dev; };
struct Mapping { size_t size; CUmemGenericAllocationHandle handle; int prot = PROT_NONE; };
struct Capture {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  std::thread::id thread;
  u64 seq = 0;  // which capture sequence
};
// Work model: a stream counts work items; an item completes at once unless the stream is held.
struct Stream {
  u64 key = 0;
  int dev = 0;
  unsigned flags = 0;
  bool legacy = false, live = true, held = false;
  u64 recorded = 0, completed = 0;
  Capture cap;
};
struct Dep { u64 stream, item; };  // an event waits until streams[stream].completed >= item
struct Event {
  int dev;
  std::vector<Dep> deps;
  bool captured = false;  // last recorded inside a capture sequence
  u64 cap_stream = 0, cap_seq = 0;
};
struct Fault { Ep ep; u64 at; int result; };

struct State {
  std::mutex mu;
  u64 generation = 1;  // bumped by reset; stale thread-local state is then ignored
  bool initialized = false, no_vmm = false;
  int ndev = 0;
  Device dev[kMaxDevices];
  size_t pending_capacity[kMaxDevices] = {};  // set_capacity before cuInit (0 = none)
  std::map<uintptr_t, Alloc> allocs;
  std::map<uintptr_t, HostAlloc> host_allocs;  // cuMemHostAlloc, keyed by address
  std::map<u64, Handle> handles;
  std::map<uintptr_t, Reservation> reservations;
  std::map<uintptr_t, Mapping> mappings;
  std::map<uintptr_t, IpcOpen> ipc_opens;  // cuIpcOpenMemHandle, keyed by address
  int fabric = 0;  // STITCH_FAKE_CUDA_FABRIC: 0 unsupported, 1 supported, 2 advertised but refused
  int host_numa = 1;  // STITCH_FAKE_CUDA_HOST_NUMA: 0 unsupported, 1 supported, 2 advertised but refused
  size_t host_granularity = kGranularity;  // STITCH_FAKE_CUDA_HOST_GRANULARITY_MB
  size_t host_bytes = 0, host_capacity = 0;  // HOST_NUMA handles live; STITCH_FAKE_CUDA_HOST_MB (0: no bound)
  std::map<u64, Stream> streams;  // user streams keyed by handle value, legacy by kLegacyKey + d
  std::map<u64, Event> events;    // keyed by handle value
  u64 next_id = 1, capture_seq = 0;
  int active_captures = 0;
  bool ever_held = false;  // no stream has pending work unless one was held
  u64 calls[EP_COUNT] = {};
  std::vector<Fault> faults;
  u64 rule_violations[R_COUNT] = {}, violations = 0, forced = 0;
  u64 handles_created = 0, handles_released = 0;  // cuMemCreate (and imports), cuMemRelease: successes
  char last_violation[768] = {};
};
State& state() {
  static State* s = new State;  // never destroyed: safe to use from other libraries' destructors
  return *s;
}
char g_ctx_tokens[kMaxDevices];  // primary context of device d is &g_ctx_tokens[d]
CUcontext ctx_of(int d) { return reinterpret_cast<CUcontext>(&g_ctx_tokens[d]); }

struct ThreadState {
  u64 generation = 0;
  int dev = -1;  // current context (a device's primary context), -1 = none
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
};
thread_local ThreadState t_state;
ThreadState& me(const State& st) {
  if (t_state.generation != st.generation) t_state = ThreadState{st.generation};
  return t_state;
}

bool env_flag(const char* name) {
  const char* v = getenv(name);
  return v != nullptr && strcmp(v, "1") == 0;
}
// Records a contract violation and returns `code`.
__attribute__((format(printf, 5, 6))) CUresult violation(State& st, Rule rule, Ep ep,
                                                         CUresult code, const char* fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(st.last_violation, sizeof st.last_violation, "[rule %d %s] %s: %s -> %s", rule,
           kRuleNames[rule], kEpNames[ep], msg, error_name(code));
  st.rule_violations[rule]++;
  st.violations++;
  if (env_flag("STITCH_FAKE_CUDA_VERBOSE")) fprintf(stderr, "stitch_fake_cuda: %s\n", st.last_violation);
  if (env_flag("STITCH_FAKE_CUDA_ABORT_ON_VIOLATION")) abort();
  return code;
}
// A failure that is not the caller's fault (out of memory, injected fault, symbol not found).
__attribute__((format(printf, 2, 3))) void note(Ep ep, const char* fmt, ...) {
  if (!env_flag("STITCH_FAKE_CUDA_VERBOSE")) return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "stitch_fake_cuda: note: %s: %s\n", kEpNames[ep], msg);
}

// Counts the call; true (and *result) when an armed fault fires on it.
bool inject(State& st, Ep ep, CUresult* result) {
  const u64 n = ++st.calls[ep];
  for (auto it = st.faults.begin(); it != st.faults.end(); ++it) {
    if (it->ep == ep && it->at == n) {
      note(ep, "injected fault: call %llu returns %s (%d)", n, error_name(it->result), it->result);
      *result = static_cast<CUresult>(it->result);
      st.faults.erase(it);
      return true;
    }
  }
  return false;
}

// Every entry point starts with ENTER (or ENTER_ANY: the calls allowed before cuInit): take the
// lock, count the call, fire an armed fault.
#define ENTER_ANY(ep)                       \
  const Ep ep_ = ep;                        \
  State& st = state();                      \
  std::lock_guard<std::mutex> lock_(st.mu); \
  if (CUresult injected_; inject(st, ep_, &injected_)) return injected_
// Rule 1 — cuda.h, cuInit: "If ::cuInit() has not been called, any function from the driver
// API will return ::CUDA_ERROR_NOT_INITIALIZED."
#define ENTER(ep)    \
  ENTER_ANY(ep);     \
  if (!st.initialized) \
  return violation(st, R_INIT, ep_, CUDA_ERROR_NOT_INITIALIZED, "called before cuInit(0) succeeded")
#define TRY(expr)                                              \
  do {                                                         \
    if (const CUresult r_ = (expr); r_ != CUDA_SUCCESS) return r_; \
  } while (0)
#define NEED_CTX(d) \
  int d;            \
  TRY(need_ctx(st, ep_, &d))
#define NEED_VMM() TRY(need_vmm(st, ep_))
#define NEED_PTR(p) \
  if ((p) == nullptr) return violation(st, R_ARG, ep_, CUDA_ERROR_INVALID_VALUE, "%s is NULL", #p)
#define NEED_DEVICE(d)                                                                         \
  if (!valid_device(st, d))                                                                    \
  return violation(st, R_ARG, ep_, CUDA_ERROR_INVALID_DEVICE, "device %d is not an ordinal " \
                   "below cuDeviceGetCount() = %d", static_cast<int>(d), st.ndev)

bool valid_device(const State& st, int d) { return d >= 0 && d < st.ndev; }
// Caller-supplied enums are read as ints: a C caller may pass any value, and loading an
// out-of-range value through a C++ enum type would be undefined behaviour.
template <class E>
int raw(const E& e) {
  static_assert(sizeof(E) == sizeof(int));
  int v;
  memcpy(&v, &e, sizeof v);
  return v;
}

// Rule 2 — the current context: cuda.h, cuMemGetInfo: "Returns in \p *total the total amount of
// memory available to the the current context."; cuEventCreate: "Creates an event *phEvent for
// the current context"; cuCtxSynchronize: "Blocks until the current context has completed all
// preceding requested tasks." (and each such call lists ::CUDA_ERROR_INVALID_CONTEXT). Stricter
// than the docs, the VMM calls need one too: the back end must make its device's context current.
CUresult need_ctx(State& st, Ep ep, int* dev) {
  const int d = me(st).dev;
  if (d < 0) return violation(st, R_CONTEXT, ep, CUDA_ERROR_INVALID_CONTEXT, "no current context");
  if (st.dev[d].refcount == 0)
    return violation(st, R_CONTEXT, ep, CUDA_ERROR_INVALID_CONTEXT,
                     "the current context (device %d's primary context) was released", d);
  *dev = d;
  return CUDA_SUCCESS;
}
int device_of_ctx(const State& st, CUcontext ctx) {
  for (int d = 0; d < st.ndev; ++d)
    if (ctx_of(d) == ctx) return d;
  return -1;
}
CUresult need_vmm(State& st, Ep ep) {
  if (!st.no_vmm) return CUDA_SUCCESS;
  return violation(st, R_NO_VMM, ep, CUDA_ERROR_NOT_SUPPORTED,
                   "VMM call although CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0");
}
// Rule 3 — cuda.h, cuMemMap: "Both \p ptr, \p size, and \p offset must be a multiple of the
// value given via ::cuMemGetAllocationGranularity with the ::CU_MEM_ALLOC_GRANULARITY_MINIMUM
// flag." (cuMemCreate: "The \p size of this allocation must be a multiple of the the value given
// via ::cuMemGetAllocationGranularity with the ::CU_MEM_ALLOC_GRANULARITY_MINIMUM flag.")
CUresult need_granular(State& st, Ep ep, const char* what, u64 value, bool nonzero) {
  if (nonzero && value == 0)
    return violation(st, R_GRANULARITY, ep, CUDA_ERROR_INVALID_VALUE, "%s is 0", what);
  if (value % kGranularity != 0)
    return violation(st, R_GRANULARITY, ep, CUDA_ERROR_INVALID_VALUE,
                     "%s = 0x%llx is not a multiple of the 2 MiB granularity", what, value);
  return CUDA_SUCCESS;
}

// ---- streams, events, capture --------------------------------------------------------------------
CUstream stream_handle(const Stream& s) { return reinterpret_cast<CUstream>(s.key); }
Stream& legacy_stream(State& st, int d) { return st.streams[kLegacyKey + d]; }
bool pending(const Stream& s) { return s.completed < s.recorded; }
u64 push_work(Stream& s) {
  ++s.recorded;
  if (!s.held) s.completed = s.recorded;
  return s.recorded;
}
bool complete_stream(Stream& s) {  // true if held work had to be completed
  const bool was = pending(s);
  s.completed = s.recorded;
  return was;
}
bool event_done(State& st, const Event& e) {
  for (const Dep& d : e.deps) {
    auto it = st.streams.find(d.stream);
    if (it != st.streams.end() && it->second.completed < d.item) return false;
  }
  return true;
}
bool complete_event(State& st, const Event& e) {  // true if held work had to be completed
  bool forced = false;
  for (const Dep& d : e.deps) {
    auto it = st.streams.find(d.stream);
    if (it != st.streams.end() && it->second.completed < d.item) {
      it->second.completed = d.item;
      forced = true;
    }
  }
  return forced;
}

bool valid_mode(int m) {
  return m == CU_STREAM_CAPTURE_MODE_GLOBAL || m == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL ||
         m == CU_STREAM_CAPTURE_MODE_RELAXED;
}
bool capturing(const Stream& s) { return s.cap.status != CU_STREAM_CAPTURE_STATUS_NONE; }
void end_capture(State& st, Stream& s) {
  if (!capturing(s)) return;
  s.cap = Capture{};
  st.active_captures--;
}
// cuda.h, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: "the current capture sequence on the stream has
// been invalidated due to a previous error."
void invalidate(Stream& s) {
  if (s.cap.status == CU_STREAM_CAPTURE_STATUS_ACTIVE) s.cap.status = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
}

// Rule 12 — cuda.h, cuThreadExchangeStreamCaptureMode: "CU_STREAM_CAPTURE_MODE_GLOBAL: ... If the
// local thread has an ongoing capture sequence that was not initiated with
// CU_STREAM_CAPTURE_MODE_RELAXED at cuStreamBeginCapture, or if any other thread has a concurrent
// capture sequence initiated with CU_STREAM_CAPTURE_MODE_GLOBAL, this thread is prohibited from
// potentially unsafe API calls." / "CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: If the local thread has
// an ongoing capture sequence not initiated with CU_STREAM_CAPTURE_MODE_RELAXED, it is
// prohibited from potentially unsafe API calls. Concurrent capture sequences in other threads are
// ignored." / "CU_STREAM_CAPTURE_MODE_RELAXED: The local thread is not prohibited from
// potentially unsafe API calls." A prohibited call fails and invalidates the captures that
// prohibited it. Potentially unsafe here: cuMemAlloc, cuMemFree, cuCtxSynchronize,
// cuEventSynchronize, cuEventQuery, cuStreamSynchronize, cuStreamQuery.
CUresult unsafe_call(State& st, Ep ep) {
  const CUstreamCaptureMode mode = me(st).mode;
  if (st.active_captures == 0 || mode == CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_SUCCESS;
  const std::thread::id self = std::this_thread::get_id();
  int prohibiting = 0;
  for (auto& [key, s] : st.streams) {
    if (!capturing(s)) continue;
    const bool mine = s.cap.thread == self;
    if ((mine && s.cap.mode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
        (!mine && mode == CU_STREAM_CAPTURE_MODE_GLOBAL && s.cap.mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
      invalidate(s);
      ++prohibiting;
    }
  }
  if (prohibiting == 0) return CUDA_SUCCESS;
  return violation(st, R_CAPTURE, ep, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                   "potentially unsafe API call during stream capture (thread mode %s; %d "
                   "capture(s) prohibit it and are now invalidated)",
                   mode == CU_STREAM_CAPTURE_MODE_GLOBAL ? "GLOBAL" : "THREAD_LOCAL", prohibiting);
}
// Rule 12 — cuda.h, cuStreamIsCapturing: "When a blocking stream is capturing, the legacy stream
// is in an unusable state until the blocking stream capture is terminated. The legacy stream is
// not supported for stream capture, but attempted use would have an implicit dependency on the
// capturing stream(s)." Returns how many blocking streams of device d capture; invalidates them.
int blocking_captures(State& st, int d, bool invalidate_them) {
  int n = 0;
  if (st.active_captures == 0) return 0;
  for (auto& [key, s] : st.streams) {
    if (s.dev != d || s.legacy || !capturing(s) || (s.flags & CU_STREAM_NON_BLOCKING) != 0) continue;
    ++n;
    if (invalidate_them) invalidate(s);
  }
  return n;
}
// Synchronizing or querying stream s: never allowed while s (or, for the legacy stream, a
// blocking stream of its context) is capturing; cuda.h, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
// "the operation is not permitted when the stream is capturing."
CUresult capture_allows_wait(State& st, Ep ep, Stream& s) {
  if (capturing(s)) {
    invalidate(s);
    return violation(st, R_CAPTURE, ep, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                     "stream %p is capturing (capture invalidated)", static_cast<void*>(stream_handle(s)));
  }
  if (s.legacy && blocking_captures(st, s.dev, true) > 0)
    return violation(st, R_CAPTURE, ep, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
                     "legacy stream used while a blocking stream of its context is capturing "
                     "(capture invalidated)");
  return unsafe_call(st, ep);
}

// Resolves a stream argument; NULL and CU_STREAM_LEGACY are the current context's legacy stream.
CUresult get_stream(State& st, Ep ep, CUstream h, Stream** out) {
  if (h == nullptr || h == CU_STREAM_LEGACY) {
    int d;
    TRY(need_ctx(st, ep, &d));
    *out = &legacy_stream(st, d);
    return CUDA_SUCCESS;
  }
  if (h == CU_STREAM_PER_THREAD)
    return violation(st, R_HANDLE, ep, CUDA_ERROR_NOT_SUPPORTED,
                     "CU_STREAM_PER_THREAD is not modelled by the fake");
  auto it = st.streams.find(reinterpret_cast<u64>(h));
  if (it == st.streams.end() || it->second.legacy || !it->second.live)
    return violation(st, R_HANDLE, ep, CUDA_ERROR_INVALID_HANDLE, "stream %p is unknown or destroyed",
                     static_cast<void*>(h));
  *out = &it->second;
  return CUDA_SUCCESS;
}
CUresult get_event(State& st, Ep ep, CUevent h, Event** out) {
  auto it = st.events.find(reinterpret_cast<u64>(h));
  if (it == st.events.end())
    return violation(st, R_HANDLE, ep, CUDA_ERROR_INVALID_HANDLE, "event %p is unknown or destroyed",
                     static_cast<void*>(h));
  *out = &it->second;
  return CUDA_SUCCESS;
}
// Rule 12 — a captured event; cuda.h, CUDA_ERROR_CAPTURED_EVENT: "the operation is not permitted
// on an event which was last recorded in a capturing stream." (cuThreadExchangeStreamCaptureMode:
// even in relaxed mode "the thread is still prohibited from API calls which necessarily conflict
// with stream capture, for example, attempting ::cuEventQuery on an event that was last recorded
// inside a capture sequence.")
CUresult event_not_captured(State& st, Ep ep, CUevent h, const Event& e) {
  if (!e.captured) return CUDA_SUCCESS;
  auto it = st.streams.find(e.cap_stream);
  if (it != st.streams.end() && it->second.cap.seq == e.cap_seq) invalidate(it->second);
  return violation(st, R_CAPTURE, ep, CUDA_ERROR_CAPTURED_EVENT,
                   "event %p was last recorded inside a stream capture", static_cast<void*>(h));
}

// ---- memory helpers ------------------------------------------------------------------------------
size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
const Reservation* reservation_containing(const State& st, uintptr_t p, size_t size) {
  auto it = st.reservations.upper_bound(p);
  if (it == st.reservations.begin()) return nullptr;
  --it;
  if (p + size < p || p + size > it->first + it->second.size) return nullptr;
  return &it->second;
}
bool any_mapping_in(const State& st, uintptr_t p, size_t size) {
  auto it = st.mappings.lower_bound(p);
  if (it != st.mappings.end() && it->first < p + size) return true;
  if (it == st.mappings.begin()) return false;
  --it;
  return it->first + it->second.size > p;
}
// The mappings that tile [p, p + size) without a hole (the first may start before p, the last
// may end after it); empty if the range is not wholly mapped.
std::vector<std::map<uintptr_t, Mapping>::iterator> covering(State& st, uintptr_t p, size_t size) {
  std::vector<std::map<uintptr_t, Mapping>::iterator> out;
  auto it = st.mappings.upper_bound(p);
  if (it == st.mappings.begin()) return out;
  --it;
  uintptr_t at = p;
  while (at < p + size) {
    if (it == st.mappings.end() || it->first > at || it->first + it->second.size <= at) return {};
    out.push_back(it);
    at = it->first + it->second.size;
    ++it;
  }
  return out;
}
// cuda.h, cuMemRelease: "The memory allocation will be freed when all outstanding mappings to the
// memory are unmapped and when all outstanding references to the handle (including it's
// shareable counterparts) are also released."
void maybe_free_handle(State& st, Handle& h) {
  if (!h.released || h.maps > 0 || h.fd < 0) return;
  close(h.fd);
  h.fd = -1;
  if (h.host) {
    st.host_bytes -= h.size;
  } else if (!h.imported) {
    st.dev[h.dev].used -= h.size;
  }
}
bool fits(const State& st, int d, size_t bytes) {
  return bytes <= st.dev[d].capacity && st.dev[d].used <= st.dev[d].capacity - bytes;
}
void* map_reserved(void* at, size_t size, int extra_flags) {
  return mmap(at, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | extra_flags, -1, 0);
}

// cuda.h, cuDevicePrimaryCtxRelease: "The context is automatically reset once the last reference
// to it is released." The fake then destroys the context's cuMemAlloc and cuMemHostAlloc memory,
// streams and events; VMM handles, reservations and mappings are left alone.
void reset_context(State& st, int d) {
  for (auto it = st.allocs.begin(); it != st.allocs.end();) {
    if (it->second.dev != d) { ++it; continue; }
    munmap(reinterpret_cast<void*>(it->first), it->second.length);
    close(it->second.fd);
    st.dev[d].used -= it->second.charged;
    it = st.allocs.erase(it);
  }
  for (auto it = st.ipc_opens.begin(); it != st.ipc_opens.end();) {
    if (it->second.dev != d) { ++it; continue; }
    munmap(reinterpret_cast<void*>(it->first), it->second.length);
    it = st.ipc_opens.erase(it);
  }
  for (auto it = st.host_allocs.begin(); it != st.host_allocs.end();) {
    if (it->second.dev != d) { ++it; continue; }
    munmap(reinterpret_cast<void*>(it->first), it->second.length);
    it = st.host_allocs.erase(it);
  }
  for (auto& [key, s] : st.streams) {
    if (s.dev != d) continue;
    end_capture(st, s);
    s.held = false;
    s.completed = s.recorded;
    if (!s.legacy) s.live = false;
  }
  std::erase_if(st.events, [d](const auto& kv) { return kv.second.dev == d; });
}

void reset_all(State& st) {
  for (auto& [p, a] : st.allocs) {
    munmap(reinterpret_cast<void*>(p), a.length);
    close(a.fd);
  }
  for (auto& [p, o] : st.ipc_opens) munmap(reinterpret_cast<void*>(p), o.length);
  st.ipc_opens.clear();
  for (auto& [p, a] : st.host_allocs) munmap(reinterpret_cast<void*>(p), a.length);
  for (auto& [p, r] : st.reservations) munmap(reinterpret_cast<void*>(p), r.size);  // + mappings
  for (auto& [id, h] : st.handles)
    if (h.fd >= 0) close(h.fd);
  st.allocs.clear(); st.host_allocs.clear(); st.handles.clear(); st.reservations.clear();
  st.mappings.clear();
  st.streams.clear(); st.events.clear(); st.faults.clear(); st.last_violation[0] = '\0';
  for (Device& d : st.dev) d = Device{};
  std::fill(std::begin(st.pending_capacity), std::end(st.pending_capacity), 0);
  std::fill(std::begin(st.calls), std::end(st.calls), 0);
  std::fill(std::begin(st.rule_violations), std::end(st.rule_violations), 0);
  st.violations = st.forced = 0;
  st.handles_created = st.handles_released = 0;
  st.active_captures = 0;
  st.initialized = st.no_vmm = st.ever_held = false;
  st.ndev = 0;
  st.generation++;
}

int ep_by_name(const char* name) {
  if (name == nullptr) return -1;
  for (int i = 0; i < EP_COUNT; ++i)
    if (strcmp(kEpNames[i], name) == 0) return i;
  return -1;
}
bool arm_fault(State& st, const char* name, u64 nth, int result) {
  const int ep = ep_by_name(name);
  if (ep < 0 || nth == 0) return false;
  st.faults.push_back({static_cast<Ep>(ep), st.calls[ep] + nth, result});
  return true;
}
long env_long(const char* name, long def, long lo, long hi) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') return def;
  char* end = nullptr;
  const long n = strtol(v, &end, 10);
  if (*end == '\0' && n >= lo && n <= hi) return n;
  fprintf(stderr, "stitch_fake_cuda: ignoring %s=%s (want %ld..%ld)\n", name, v, lo, hi);
  return def;
}
// cuInit's first success (after load or reset): reads the environment and builds the devices.
void initialize(State& st) {
  st.ndev = static_cast<int>(env_long("STITCH_FAKE_CUDA_DEVICES", 1, 1, kMaxDevices));
  const size_t mb = static_cast<size_t>(env_long("STITCH_FAKE_CUDA_MEMORY_MB", 2048, 2, 1L << 24));
  st.no_vmm = env_flag("STITCH_FAKE_CUDA_NO_VMM");
  st.fabric = static_cast<int>(env_long("STITCH_FAKE_CUDA_FABRIC", 0, 0, 2));
  st.host_numa = static_cast<int>(env_long("STITCH_FAKE_CUDA_HOST_NUMA", 1, 0, 2));
  st.host_granularity = static_cast<size_t>(env_long("STITCH_FAKE_CUDA_HOST_GRANULARITY_MB", 2, 2, 1024)) << 20;
  if ((st.host_granularity & (st.host_granularity - 1)) != 0) st.host_granularity = kGranularity;
  st.host_capacity = static_cast<size_t>(env_long("STITCH_FAKE_CUDA_HOST_MB", 0, 0, 1L << 24)) << 20;
  for (int d = 0; d < st.ndev; ++d) {
    st.dev[d].capacity = st.pending_capacity[d] != 0 ? st.pending_capacity[d] : mb << 20;
    Stream& s = legacy_stream(st, d);
    s.key = kLegacyKey + d;
    s.dev = d;
    s.legacy = true;
  }
  if (const char* spec = getenv("STITCH_FAKE_CUDA_FAIL")) {  // "cuMemMap:3:2,cuMemCreate:1:2"
    char all[2048];
    snprintf(all, sizeof all, "%s", spec);
    char* save = nullptr;
    for (char* item = strtok_r(all, ",", &save); item != nullptr; item = strtok_r(nullptr, ",", &save)) {
      char name[64];
      u64 nth = 0;
      int result = 0;
      if (sscanf(item, "%63[^:]:%llu:%d", name, &nth, &result) != 3 || !arm_fault(st, name, nth, result))
        fprintf(stderr, "stitch_fake_cuda: ignoring STITCH_FAKE_CUDA_FAIL item '%s'\n", item);
    }
  }
  // One memfd per cuMemCreate handle: allow as many as the devices can hold.
  rlimit lim{};
  const rlim_t want = 1024 + static_cast<rlim_t>(st.ndev) * ((mb << 20) / kGranularity);
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < want) {
    lim.rlim_cur = std::min(want, lim.rlim_max);
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  st.initialized = true;
}

// Device attributes the fake models (an H100-like device); others are CUDA_ERROR_INVALID_VALUE.
struct Attribute { CUdevice_attribute attr; int value; };
const Attribute kAttributes[] = {
    {CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1},  // 0 with STITCH_FAKE_CUDA_NO_VMM=1
    {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 1},  // likewise
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9}, {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
    {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132}, {CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32},
    {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024}, {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 48 << 10},
    {CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 50 << 20}, {CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, 5120},
    {CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, 3}, {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
    {CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1}, {CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 1},
    {CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0x10},  // + the device ordinal
    {CU_DEVICE_ATTRIBUTE_INTEGRATED, 0}, {CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, 0},
    {CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, 0}, {CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, CU_COMPUTEMODE_DEFAULT},
    {CU_DEVICE_ATTRIBUTE_TCC_DRIVER, 0}, {CU_DEVICE_ATTRIBUTE_ECC_ENABLED, 0},
    {CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 0}, {CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, 0},
    {CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 0},  // 1 with STITCH_FAKE_CUDA_FABRIC=1 or 2
    {CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, 0},
    {CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1},  // 0 with STITCH_FAKE_CUDA_HOST_NUMA=0
    {CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 0},  // the fake has no cuMemAllocAsync
};

// Resolves a CUcontext argument; NULL is the current context.
CUresult ctx_arg(State& st, Ep ep, CUcontext ctx, int* dev) {
  if (ctx == nullptr) return need_ctx(st, ep, dev);
  *dev = device_of_ctx(st, ctx);
  if (*dev < 0 || st.dev[*dev].refcount == 0)
    return violation(st, R_CONTEXT, ep, CUDA_ERROR_INVALID_CONTEXT, "%p is not an active context",
                     static_cast<void*>(ctx));
  return CUDA_SUCCESS;
}

CUresult sync_context(State& st, Ep ep, int d) {
  // cuCtxSynchronize must wait for every stream of the context, capturing ones included
  // (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: "the operation is not permitted when the stream is
  // capturing.").
  int capturing_here = 0;
  for (auto& [key, s] : st.streams)
    if (s.dev == d && capturing(s)) { invalidate(s); ++capturing_here; }
  if (capturing_here > 0)
    return violation(st, R_CAPTURE, ep, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                     "%d stream(s) of the context are capturing (captures invalidated)", capturing_here);
  TRY(unsafe_call(st, ep));
  bool forced = false;
  for (auto& [key, s] : st.streams)
    if (s.dev == d) forced |= complete_stream(s);
  if (forced) st.forced++;
  return CUDA_SUCCESS;
}

// The location of a CUmemAllocationProp: a device, or a host NUMA node (cuda.h, cuMemCreate: "To
// create a CPU allocation targeting a specific host NUMA node, applications must set
// ::CUmemAllocationProp::CUmemLocation::type to ::CU_MEM_LOCATION_TYPE_HOST_NUMA and
// ::CUmemAllocationProp::CUmemLocation::id must specify the NUMA ID of the CPU. On systems where
// NUMA is not available ::CUmemAllocationProp::CUmemLocation::id must be set to 0. Specifying
// ::CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT as the ::CUmemLocation::type will result in
// ::CUDA_ERROR_INVALID_VALUE."). The fake's host has one NUMA node, 0.
CUresult location_of(State& st, Ep ep, const CUmemAllocationProp* prop, bool* host) {
  if (raw(prop->type) != CU_MEM_ALLOCATION_TYPE_PINNED)
    return violation(st, R_ARG, ep, CUDA_ERROR_INVALID_VALUE, "prop.type must be CU_MEM_ALLOCATION_TYPE_PINNED");
  const int type = raw(prop->location.type);
  if (type == CU_MEM_LOCATION_TYPE_DEVICE) {
    *host = false;
    return CUDA_SUCCESS;
  }
  if (type != CU_MEM_LOCATION_TYPE_HOST_NUMA)
    return violation(st, R_ARG, ep, CUDA_ERROR_INVALID_VALUE,
                     "prop.location.type = %d (the fake models DEVICE and HOST_NUMA)", type);
  if (prop->location.id != 0)
    return violation(st, R_ARG, ep, CUDA_ERROR_INVALID_VALUE,
                     "prop.location.id = %d is not a host NUMA node (the host has node 0)", prop->location.id);
  if (st.host_numa == 0)
    return violation(st, R_ARG, ep, CUDA_ERROR_NOT_SUPPORTED,
                     "HOST_NUMA although CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0");
  *host = true;
  return CUDA_SUCCESS;
}
// cuMemCreate of host memory: a memfd like device memory, charged to the host (bounded by
// STITCH_FAKE_CUDA_HOST_MB) and owned by the creating context's device for cuMemSetAccess.
CUresult create_host(State& st, Ep ep, CUmemGenericAllocationHandle* handle, size_t size,
                     const CUmemAllocationProp* prop, int d) {
  if (st.host_numa == 2) {  // as in a container without the capability: the create fails
    note(ep, "HOST_NUMA create refused (as without CAP_SYS_NICE) -> CUDA_ERROR_NOT_PERMITTED");
    return CUDA_ERROR_NOT_PERMITTED;
  }
  if (size == 0 || size % st.host_granularity != 0)
    return violation(st, R_GRANULARITY, ep, CUDA_ERROR_INVALID_VALUE,
                     "size 0x%zx is not a positive multiple of the host granularity 0x%zx", size, st.host_granularity);
  if ((static_cast<unsigned>(raw(prop->requestedHandleTypes)) & ~unsigned{CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR}) != 0)
    return violation(st, R_ARG, ep, CUDA_ERROR_NOT_SUPPORTED, "requestedHandleTypes = 0x%x for host memory",
                     raw(prop->requestedHandleTypes));
  if (st.host_capacity != 0 && (st.host_bytes > st.host_capacity || size > st.host_capacity - st.host_bytes)) {
    note(ep, "%zu bytes of host memory do not fit -> CUDA_ERROR_OUT_OF_MEMORY", size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const int fd = memfd_create("stitch_fake_cuda_host", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const CUmemGenericAllocationHandle id = kHandleBase + st.next_id++;
  Handle h{fd, size, d, false, 0, static_cast<unsigned>(raw(prop->requestedHandleTypes)), false};
  h.host = true;
  st.handles[id] = h;
  st.handles_created++;
  st.host_bytes += size;
  *handle = id;
  return CUDA_SUCCESS;
}

CUresult get_proc(State& st, Ep ep_, const char* symbol, void** pfn, int version, cuuint64_t flags,
                  CUdriverProcAddressQueryResult* status);

}  // namespace

// ==== initialisation, version, errors ============================================================
FAKE_EXPORT CUresult CUDAAPI cuInit(unsigned int Flags) {
  ENTER_ANY(EP_cuInit);
  // Rule 1 — cuda.h, cuInit: "Currently, the \p Flags parameter must be 0."
  if (Flags != 0) return violation(st, R_INIT, ep_, CUDA_ERROR_INVALID_VALUE, "Flags = %u, must be 0", Flags);
  if (!st.initialized) initialize(st);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuDriverGetVersion(int* driverVersion) {
  ENTER_ANY(EP_cuDriverGetVersion);
  NEED_PTR(driverVersion);
  *driverVersion = kDriverVersion;
  return CUDA_SUCCESS;
}
// cuda.h, cuGetErrorName: "If the error code is not recognized, ::CUDA_ERROR_INVALID_VALUE will
// be returned and \p *pStr will be set to the NULL address." (same for cuGetErrorString)
FAKE_EXPORT CUresult CUDAAPI cuGetErrorName(CUresult error, const char** pStr) {
  ENTER_ANY(EP_cuGetErrorName);
  NEED_PTR(pStr);
  const ErrorText* e = find_error(raw(error));
  *pStr = e != nullptr ? e->name : nullptr;
  return e != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
FAKE_EXPORT CUresult CUDAAPI cuGetErrorString(CUresult error, const char** pStr) {
  ENTER_ANY(EP_cuGetErrorString);
  NEED_PTR(pStr);
  const ErrorText* e = find_error(raw(error));
  *pStr = e != nullptr ? e->text : nullptr;
  return e != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
FAKE_EXPORT CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                                 cuuint64_t flags, CUdriverProcAddressQueryResult* symbolStatus) {
  ENTER_ANY(EP_cuGetProcAddress);
  return get_proc(st, ep_, symbol, pfn, cudaVersion, flags, symbolStatus);
}
FAKE_EXPORT CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  ENTER_ANY(EP_cuGetProcAddress);
  return get_proc(st, ep_, symbol, pfn, cudaVersion, flags, nullptr);
}

// ==== devices =======================================================================================
FAKE_EXPORT CUresult CUDAAPI cuDeviceGet(CUdevice* device, int ordinal) {
  ENTER(EP_cuDeviceGet);
  NEED_PTR(device);
  NEED_DEVICE(ordinal);
  *device = ordinal;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuDeviceGetCount(int* count) {
  ENTER(EP_cuDeviceGetCount);
  NEED_PTR(count);
  *count = st.ndev;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  ENTER(EP_cuDeviceGetAttribute);
  NEED_PTR(pi);
  NEED_DEVICE(dev);
  const int a = raw(attrib);
  for (const Attribute& e : kAttributes) {
    if (e.attr != a) continue;
    const bool vmm = a == CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED ||
                     a == CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED;
    *pi = vmm && st.no_vmm ? 0 : a == CU_DEVICE_ATTRIBUTE_PCI_BUS_ID ? e.value + dev : e.value;
    if (a == CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED) *pi = st.fabric != 0 && !st.no_vmm ? 1 : 0;
    if (a == CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) *pi = st.host_numa != 0 && !st.no_vmm ? 1 : 0;
    return CUDA_SUCCESS;
  }
  note(ep_, "attribute %d is not modelled -> CUDA_ERROR_INVALID_VALUE", a);  // not a violation
  return CUDA_ERROR_INVALID_VALUE;
}
FAKE_EXPORT CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice dev) {
  ENTER(EP_cuDeviceGetName);
  NEED_PTR(name);
  if (len <= 0) return violation(st, R_ARG, ep_, CUDA_ERROR_INVALID_VALUE, "len = %d", len);
  NEED_DEVICE(dev);
  snprintf(name, static_cast<size_t>(len), "Stitch Fake GPU %d", dev);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  ENTER(EP_cuDeviceTotalMem);
  NEED_PTR(bytes);
  NEED_DEVICE(dev);
  *bytes = st.dev[dev].capacity;
  return CUDA_SUCCESS;
}
// cuda.h, cuDeviceCanAccessPeer: "Returns in \p *canAccessPeer a value of 1 if contexts on \p dev
// are capable of directly accessing memory from contexts on \p peerDev and 0 otherwise."
FAKE_EXPORT CUresult CUDAAPI cuDeviceCanAccessPeer(int* canAccessPeer, CUdevice dev, CUdevice peerDev) {
  ENTER(EP_cuDeviceCanAccessPeer);
  NEED_PTR(canAccessPeer);
  NEED_DEVICE(dev);
  NEED_DEVICE(peerDev);
  *canAccessPeer = dev != peerDev ? 1 : 0;
  return CUDA_SUCCESS;
}

// ==== primary contexts ==============================================================================
FAKE_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  ENTER(EP_cuDevicePrimaryCtxRetain);
  NEED_PTR(pctx);
  NEED_DEVICE(dev);
  if (st.dev[dev].refcount++ == 0) st.dev[dev].activated++;
  *pctx = ctx_of(dev);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  ENTER(EP_cuDevicePrimaryCtxRelease);
  NEED_DEVICE(dev);
  // cuda.h, cuDevicePrimaryCtxRelease: "Releasing a primary context that has not been previously
  // retained will fail with ::CUDA_ERROR_INVALID_CONTEXT."
  if (st.dev[dev].refcount == 0)
    return violation(st, R_CONTEXT, ep_, CUDA_ERROR_INVALID_CONTEXT,
                     "device %d's primary context is not retained", dev);
  if (--st.dev[dev].refcount == 0) reset_context(st, dev);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  ENTER(EP_cuDevicePrimaryCtxGetState);
  NEED_PTR(flags);
  NEED_PTR(active);
  NEED_DEVICE(dev);
  *flags = 0;
  *active = st.dev[dev].refcount > 0 ? 1 : 0;
  return CUDA_SUCCESS;
}
// cuda.h, cuCtxSetCurrent: "If \p ctx is NULL then the CUDA context previously bound to the
// calling CPU thread is unbound and ::CUDA_SUCCESS is returned." The fake has only primary
// contexts; binding one that is not retained (inactive) is CUDA_ERROR_INVALID_CONTEXT.
FAKE_EXPORT CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  ENTER(EP_cuCtxSetCurrent);
  if (ctx == nullptr) {
    me(st).dev = -1;
    return CUDA_SUCCESS;
  }
  const int d = device_of_ctx(st, ctx);
  if (d < 0)
    return violation(st, R_CONTEXT, ep_, CUDA_ERROR_INVALID_CONTEXT, "%p is not a context",
                     static_cast<void*>(ctx));
  if (st.dev[d].refcount == 0)
    return violation(st, R_CONTEXT, ep_, CUDA_ERROR_INVALID_CONTEXT,
                     "device %d's primary context is not retained (inactive)", d);
  me(st).dev = d;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuCtxGetCurrent(CUcontext* pctx) {
  ENTER(EP_cuCtxGetCurrent);
  NEED_PTR(pctx);
  const int d = me(st).dev;
  *pctx = d >= 0 ? ctx_of(d) : nullptr;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuCtxGetDevice(CUdevice* device) {
  ENTER(EP_cuCtxGetDevice);
  NEED_CTX(d);
  NEED_PTR(device);
  *device = d;
  return CUDA_SUCCESS;
}
// The CUDA 13.0 ABI of "cuCtxGetDevice" (PFN_cuCtxGetDevice_v13000); cuda.h: "If the specified
// context is NULL, the API will return the current context's device."
FAKE_EXPORT CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice* device, CUcontext ctx) {
  ENTER(EP_cuCtxGetDevice);
  int d;
  TRY(ctx_arg(st, ep_, ctx, &d));
  NEED_PTR(device);
  *device = d;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuCtxSynchronize(void) {
  ENTER(EP_cuCtxSynchronize);
  NEED_CTX(d);
  return sync_context(st, ep_, d);
}
// The CUDA 13.0 ABI of "cuCtxSynchronize" (PFN_cuCtxSynchronize_v13000); cuda.h: "If the
// specified context is NULL, the API will operate on the current context."
FAKE_EXPORT CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
  ENTER(EP_cuCtxSynchronize);
  int d;
  TRY(ctx_arg(st, ep_, ctx, &d));
  return sync_context(st, ep_, d);
}

// ==== linear memory =================================================================================
FAKE_EXPORT CUresult CUDAAPI cuMemGetInfo_v2(size_t* free, size_t* total) {
  ENTER(EP_cuMemGetInfo);
  NEED_CTX(d);
  NEED_PTR(free);
  NEED_PTR(total);
  *total = st.dev[d].capacity;
  *free = st.dev[d].capacity > st.dev[d].used ? st.dev[d].capacity - st.dev[d].used : 0;
  return CUDA_SUCCESS;
}
// Host memory, read-write, page aligned; charged to the device rounded up to 2 MiB.
FAKE_EXPORT CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  ENTER(EP_cuMemAlloc);
  NEED_CTX(d);
  TRY(unsafe_call(st, ep_));
  NEED_PTR(dptr);
  // cuda.h, cuMemAlloc: "If \p bytesize is 0, ::cuMemAlloc() returns ::CUDA_ERROR_INVALID_VALUE."
  if (bytesize == 0) return violation(st, R_ARG, ep_, CUDA_ERROR_INVALID_VALUE, "bytesize is 0");
  // Rule 11: beyond capacity -> CUDA_ERROR_OUT_OF_MEMORY, nothing allocated (not a violation).
  if (!fits(st, d, bytesize) || !fits(st, d, round_up(bytesize, kGranularity))) {
    note(ep_, "%zu bytes do not fit on device %d -> CUDA_ERROR_OUT_OF_MEMORY", bytesize, d);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const size_t length = round_up(bytesize, kPage), charged = round_up(bytesize, kGranularity);
  const int fd = memfd_create("stitch_fake_cuda_alloc", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  void* p = ftruncate(fd, static_cast<off_t>(length)) != 0
                ? MAP_FAILED
                : mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  st.allocs[reinterpret_cast<uintptr_t>(p)] = {length, bytesize, charged, d, fd};
  st.dev[d].used += charged;
  *dptr = reinterpret_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
  ENTER(EP_cuMemFree);
  NEED_CTX(d);
  TRY(unsafe_call(st, ep_));
  // Rule 10 — cuda.h, cuMemFree: "Frees the memory space pointed to by \p dptr, which must have
  // been returned by a previous call to one of the following memory allocation APIs - ::cuMemAlloc()"
  auto it = st.allocs.find(dptr);
  if (it == st.allocs.end()) {
    auto below = st.allocs.upper_bound(dptr);
    const bool interior = below != st.allocs.begin() && dptr < std::prev(below)->first + std::prev(below)->second.length;
    return violation(st, R_FREE, ep_, CUDA_ERROR_INVALID_VALUE, "0x%llx is %s", dptr,
                     interior ? "an interior pointer of an allocation" : "not from cuMemAlloc (or freed)");
  }
  // Rule 2 (strict): free under the context that allocated it.
  if (it->second.dev != d)
    return violation(st, R_CONTEXT, ep_, CUDA_ERROR_INVALID_VALUE,
                     "wrong context: 0x%llx was allocated on device %d, current context is device %d",
                     dptr, it->second.dev, d);
  munmap(reinterpret_cast<void*>(it->first), it->second.length);
  close(it->second.fd);
  st.dev[d].used -= it->second.charged;
  st.allocs.erase(it);
  return CUDA_SUCCESS;
}

// ==== pinned host memory ============================================================================
// cuda.h, cuMemHostAlloc: "Allocates \p bytesize bytes of host memory that is page-locked and
// accessible to the device." The fake: read-write anonymous mmap (page aligned; not locked),
// owned by the current context (freed with it, as its cuMemAlloc memory is) and charged to no
// device. The host pointer is what every flag gives the copies, so all three are accepted.
FAKE_EXPORT CUresult CUDAAPI cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
  ENTER(EP_cuMemHostAlloc);
  NEED_CTX(d);
  NEED_PTR(pp);
  // cuda.h, cuMemHostAlloc: "The \p Flags parameter enables different options to be specified
  // that affect the allocation, as follows." (CU_MEMHOSTALLOC_PORTABLE, _DEVICEMAP, _WRITECOMBINED)
  const unsigned valid = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  if ((Flags & ~valid) != 0) return violation(st, R_ARG, ep_, CUDA_ERROR_INVALID_VALUE, "Flags = 0x%x", Flags);
  // cuda.h does not say what a 0-byte request gives; stricter, the fake refuses it as cuMemAlloc
  // documents: "If \p bytesize is 0, ::cuMemAlloc() returns ::CUDA_ERROR_INVALID_VALUE."
  if (bytesize == 0) return violation(st, R_ARG, ep_, CUDA_ERROR_INVALID_VALUE, "bytesize is 0");
  const size_t length = round_up(bytesize, kPage);
  void* p = length < bytesize  // the rounding overflowed
                 ? MAP_FAILED
                 : mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {  // rule 11: the host has no room; not a violation
    note(ep_, "%zu bytes of host memory cannot be mapped -> CUDA_ERROR_OUT_OF_MEMORY", bytesize);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  st.host_allocs[reinterpret_cast<uintptr_t>(p)] = {length, bytesize, d, Flags};
  *pp = p;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuMemFreeHost(void* p) {
  ENTER(EP_cuMemFreeHost);
  NEED_CTX(d);
  // Rule 10 — cuda.h, cuMemFreeHost: "Frees the memory space pointed to by \p p, which must have
  // been returned by a previous call to ::cuMemAllocHost()."; cuMemHostAlloc: "The memory
  // allocated by this function must be freed with ::cuMemFreeHost()."
  const auto at = reinterpret_cast<uintptr_t>(p);
  auto it = st.host_allocs.find(at);
  if (it == st.host_allocs.end()) {
    auto below = st.host_allocs.upper_bound(at);
    const bool interior = below != st.host_allocs.begin() && at < std::prev(below)->first + std::prev(below)->second.length;
    return violation(st, R_FREE, ep_, CUDA_ERROR_INVALID_VALUE, "%p is %s", p,
                     interior ? "an interior pointer of a host allocation" : "not from cuMemHostAlloc (or freed)");
  }
  // Rule 2 (strict): free under the context that allocated it, unless it is
  // CU_MEMHOSTALLOC_PORTABLE: "considered as pinned memory by all CUDA contexts, not just the one
  // that performed the allocation."
  if ((it->second.flags & CU_MEMHOSTALLOC_PORTABLE) == 0 && it->second.dev != d)
    return violation(st, R_CONTEXT, ep_, CUDA_ERROR_INVALID_VALUE,
                     "wrong context: %p was allocated on device %d, current context is device %d",
                     p, it->second.dev, d);
  munmap(p, it->second.length);
  st.host_allocs.erase(it);
  return CUDA_SUCCESS;
}

// ==== virtual memory management =====================================================================
FAKE_EXPORT CUresult CUDAAPI cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                                           CUmemAllocationGranularity_flags option) {
  ENTER(EP_cuMemGetAllocationGranularity);
  NEED_VMM();
  NEED_PTR(granularity);
  NEED_PTR(prop);
  if (raw(option) != CU_MEM_ALLOC_GRANULARITY_MINIMUM && raw(option) != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
    return violation(st, R_ARG, ep_, CUDA_ERROR_INVALID_VALUE, "option = %d", raw(option));
  bool host = false;
  TRY(location_of(st, ep_, prop, &host));
  if (!host) NEED_DEVICE(prop->location.id);
  *granularity = host ? st.host_granularity : kGranularity;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                                 CUdeviceptr addr, unsigned long long flags) {
  ENTER(EP_cuMemAddressReserve);
  NEED_CTX(d);
  NEED_VMM();
  NEED_PTR(ptr);
  TRY(need_granular(st, ep_, "size", size, true));
  // cuda.h, cuMemAddressReserve: "The size and address parameters must be a multiple of the host
  // page size and the alignment must be a power of two or zero for default alignment."
  if ((alignment & (alignment - 1)) != 0)
    return violation(st, R_GRANULARITY, ep_, CUDA_ERROR_INVALID_VALUE,
                     "alignment = 0x%zx is not a power of two", alignment);
  TRY(need_granular(st, ep_, "alignment", alignment, false));
  if (addr % kPage != 0)
    return violation(st, R_GRANULARITY, ep_, CUDA_ERROR_INVALID_VALUE,
                     "addr = 0x%llx is not a multiple of the page size", addr);
  // cuda.h, cuMemAddressReserve: "flags - Currently unused, must be zero"
  if (flags != 0) return violation(st, R_ARG, ep_, CUDA_ERROR_INVALID_VALUE, "flags = 0x%llx", flags);
  const size_t align = std::max(alignment, kGranularity);
  uintptr_t base = 0;
  // "when it is non-zero then the driver treats it as a hint about where to place the reservation"
  if (addr != 0 && addr % align == 0) {
    void* q = map_reserved(reinterpret_cast<void*>(addr), size, MAP_FIXED_NOREPLACE);
    if (q == reinterpret_cast<void*>(addr)) base = addr;
    else if (q != MAP_FAILED) munmap(q, size);
  }
  if (base == 0) {  // over-reserve, then trim to the alignment
    if (size > SIZE_MAX - align) return CUDA_ERROR_OUT_OF_MEMORY;
    void* q = map_reserved(nullptr, size + align, 0);
    if (q == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    const uintptr_t raw = reinterpret_cast<uintptr_t>(q);
    base = round_up(raw, align);
    if (base > raw) munmap(q, base - raw);
    if (raw + size + align > base + size) munmap(reinterpret_cast<void*>(base + size), raw + align - base);
  }
  st.reservations[base] = {size, d};
  *ptr = base;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  ENTER(EP_cuMemAddressFree);
  NEED_CTX(d);
  NEED_VMM();
  // Rule 7 — cuda.h, cuMemAddressFree: "The size must match what was given to memAddressReserve
  // and the ptr given must match what was returned from memAddressReserve."
  auto it = st.reservations.find(ptr);
  if (it == st.reservations.end())
    return violation(st, R_ADDRESS_FREE, ep_, CUDA_ERROR_INVALID_VALUE,
                     "0x%llx is not the start of a live reservation", ptr);
  if (it->second.size != size)
    return violation(st, R_ADDRESS_FREE, ep_, CUDA_ERROR_INVALID_VALUE,
                     "size 0x%zx does not match the reserved size 0x%zx", size, it->second.size);
  if (any_mapping_in(st, ptr, size))
    return violation(st, R_ADDRESS_FREE, ep_, CUDA_ERROR_INVALID_VALUE,
                     "reservation 0x%llx still has mappings (cuMemUnmap them first)", ptr);
  munmap(reinterpret_cast<void*>(ptr), size);
  st.reservations.erase(it);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                         const CUmemAllocationProp* prop, unsigned long long flags) {
  ENTER(EP_cuMemCreate);
  NEED_CTX(d);
  NEED_VMM();
  NEED_PTR(handle);
  NEED_PTR(prop);
  // cuda.h, cuMemCreate: "flags - flags for future use, must be zero now."
  if (flags != 0) return violation(st, R_ARG, ep_, CUDA_ERROR_INVALID_VALUE, "flags = 0x%llx", flags);
  // CUmemAllocationProp::allocType: "Currently must be specified as CU_MEM_ALLOCATION_TYPE_PINNED"
  bool host = false;
  TRY(location_of(st, ep_, prop, &host));
  if (host) return create_host(st, ep_, handle, size, prop, d);
  NEED_DEVICE(prop->location.id);
  // Rule 2 (strict): "This creates a memory allocation on the target device specified through
  // the \p prop structure." — the back end must have that device's context current.
  if (prop->location.id != d)
    return violation(st, R_CONTEXT, ep_, CUDA_ERROR_INVALID_VALUE,
                     "wrong context: prop.location.id = %d, current context is device %d", prop->location.id, d);
  const unsigned types = static_cast<unsigned>(raw(prop->requestedHandleTypes));
  if ((types & ~unsigned{CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_FABRIC}) != 0)
    return violation(st, R_ARG, ep_, CUDA_ERROR_NOT_SUPPORTED, "requestedHandleTypes = 0x%x", types);
  // A fabric handle needs the attribute and an IMEX channel; cuda.h: "Applications that intend
  // to use ::CU_MEM_HANDLE_TYPE_FABRIC based memory sharing must ensure: ... (2) the process
  // has been granted access to an IMEX channel". Refusals are the driver's answer, not a misuse.
  if ((types & CU_MEM_HANDLE_TYPE_FABRIC) != 0 && st.fabric != 1) {
    note(ep_, "fabric handle requested: %s", st.fabric == 0 ? "unsupported" : "no IMEX channel");
    return st.fabric == 0 ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_NOT_PERMITTED;
  }
  // CUmemAllocationProp::win32HandleMetaData: "In all other cases, this field is required to be zero."
  if (prop->win32HandleMetaData != nullptr)
    return violation(st, R_ARG, ep_, CUDA_ERROR_INVALID_VALUE, "win32HandleMetaData is not NULL");
  TRY(need_granular(st, ep_, "size", size, true));
  if (!fits(st, d, size)) {  // Rule 11
    note(ep_, "%zu bytes do not fit on device %d -> CUDA_ERROR_OUT_OF_MEMORY", size, d);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const int fd = memfd_create("stitch_fake_cuda", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const CUmemGenericAllocationHandle id = kHandleBase + st.next_id++;
  st.handles[id] = {fd, size, d, false, 0, types, false};
  st.handles_created++;
  st.dev[d].used += size;
  *handle = id;
  return CUDA_SUCCESS;
}
namespace {
// Rule 8 — cuda.h, cuMemRelease: "If \p handle is not a valid handle the behavior is undefined."
// The fake makes it CUDA_ERROR_INVALID_VALUE (also for any use of a released handle).
CUresult live_handle(State& st, Ep ep, CUmemGenericAllocationHandle id, Handle** out) {
  auto it = st.handles.find(id);
  if (it == st.handles.end() || it->second.released)
    return violation(st, R_RELEASED, ep, CUDA_ERROR_INVALID_VALUE, "handle 0x%llx is %s", id,
                     it == st.handles.end() ? "unknown" : "already released (use of a released handle)");
  *out = &it->second;
  return CUDA_SUCCESS;
}
}  // namespace
FAKE_EXPORT CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  ENTER(EP_cuMemRelease);
  NEED_CTX(d);
  NEED_VMM();
  Handle* h;
  TRY(live_handle(st, ep_, handle, &h));
  // cuda.h, cuMemRelease: "The generic memory handle can be freed when there are still
  // outstanding mappings made with this handle."
  h->released = true;
  st.handles_released++;
  maybe_free_handle(st, *h);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                      CUmemGenericAllocationHandle handle, unsigned long long flags) {
  ENTER(EP_cuMemMap);
  NEED_CTX(d);
  NEED_VMM();
  TRY(need_granular(st, ep_, "ptr", ptr, true));
  TRY(need_granular(st, ep_, "size", size, true));
  TRY(need_granular(st, ep_, "offset", offset, false));
  // Rule 4 — cuda.h, cuMemMap: "offset - Offset into the memory represented by handle from which
  // to start mapping - Note: currently must be zero."
  if (offset != 0)
    return violation(st, R_MAP, ep_, CUDA_ERROR_INVALID_VALUE, "offset = 0x%zx, currently must be zero", offset);
  // "flags - flags for future use, must be zero now."
  if (flags != 0) return violation(st, R_MAP, ep_, CUDA_ERROR_INVALID_VALUE, "flags = 0x%llx", flags);
  Handle* h;
  TRY(live_handle(st, ep_, handle, &h));
  // "\p offset + \p size must be less than the size of the memory allocation" (read as <=)
  if (size > h->size)
    return violation(st, R_MAP, ep_, CUDA_ERROR_INVALID_VALUE,
                     "size 0x%zx exceeds the handle's size 0x%zx", size, h->size);
  // "This range must be an address reservation previously reserved with ::cuMemAddressReserve"
  if (reservation_containing(st, ptr, size) == nullptr)
    return violation(st, R_MAP, ep_, CUDA_ERROR_INVALID_VALUE,
                     "[0x%llx, +0x%zx) is not wholly inside one live reservation", ptr, size);
  // "::cuMemMap can only create mappings on VA range reservations that are not currently mapped."
  if (any_mapping_in(st, ptr, size))
    return violation(st, R_MAP, ep_, CUDA_ERROR_INVALID_VALUE, "[0x%llx, +0x%zx) is already (partly) mapped",
                     ptr, size);
  // PROT_NONE until cuMemSetAccess — "Please note calling ::cuMemMap does not make the address
  // accessible, the caller needs to update accessibility of a contiguous mapped VA range by
  // calling ::cuMemSetAccess." (rule 5: touching it before faults for real)
  void* p = mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->fd, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  st.mappings[ptr] = {size, handle};
  h->maps++;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  ENTER(EP_cuMemUnmap);
  NEED_CTX(d);
  NEED_VMM();
  TRY(need_granular(st, ep_, "ptr", ptr, true));
  TRY(need_granular(st, ep_, "size", size, true));
  // Rule 6 — cuda.h, cuMemUnmap: "The range must be the entire contiguous address range that was
  // mapped to.  In other words, ::cuMemUnmap cannot unmap a sub-range of an address range mapped
  // by ::cuMemCreate / ::cuMemMap." Several whole, adjacent mappings at once are allowed.
  const auto cover = covering(st, ptr, size);
  if (cover.empty())
    return violation(st, R_UNMAP, ep_, CUDA_ERROR_INVALID_VALUE, "[0x%llx, +0x%zx) is not wholly mapped", ptr, size);
  const uintptr_t last_end = cover.back()->first + cover.back()->second.size;
  if (cover.front()->first != ptr || last_end != ptr + size)
    return violation(st, R_UNMAP, ep_, CUDA_ERROR_INVALID_VALUE,
                     "[0x%llx, +0x%zx) cuts a mapping (mappings span [0x%lx, 0x%lx))", ptr, size,
                     static_cast<unsigned long>(cover.front()->first), static_cast<unsigned long>(last_end));
  for (auto it : cover) {
    // "When ::cuMemUnmap returns successfully the address range is converted to an address
    // reservation and can be used for a future calls to ::cuMemMap."
    map_reserved(reinterpret_cast<void*>(it->first), it->second.size, MAP_FIXED);
    Handle& h = st.handles.at(it->second.handle);
    h.maps--;
    maybe_free_handle(st, h);
    st.mappings.erase(it);
  }
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  ENTER(EP_cuMemSetAccess);
  NEED_CTX(d);
  NEED_VMM();
  TRY(need_granular(st, ep_, "ptr", ptr, true));
  TRY(need_granular(st, ep_, "size", size, true));
  if (desc == nullptr || count == 0)
    return violation(st, R_ACCESS, ep_, CUDA_ERROR_INVALID_VALUE, "no access descriptors");
  for (size_t i = 0; i < count; ++i) {
    if (raw(desc[i].location.type) != CU_MEM_LOCATION_TYPE_DEVICE)
      return violation(st, R_ACCESS, ep_, CUDA_ERROR_INVALID_VALUE, "desc[%zu].location.type is not DEVICE", i);
    if (!valid_device(st, desc[i].location.id))
      return violation(st, R_ACCESS, ep_, CUDA_ERROR_INVALID_DEVICE, "desc[%zu].location.id = %d", i,
                       desc[i].location.id);
    const int f = raw(desc[i].flags);
    if (f != CU_MEM_ACCESS_FLAGS_PROT_NONE && f != CU_MEM_ACCESS_FLAGS_PROT_READ && f != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      return violation(st, R_ACCESS, ep_, CUDA_ERROR_INVALID_VALUE, "desc[%zu].flags = %d", i, f);
  }
  // Rule 5 — cuda.h, cuMemSetAccess: "The range must be a fully mapped address range containing
  // all allocations created by ::cuMemMap / ::cuMemCreate."
  const auto cover = covering(st, ptr, size);
  if (cover.empty())
    return violation(st, R_ACCESS, ep_, CUDA_ERROR_INVALID_VALUE, "[0x%llx, +0x%zx) is not wholly mapped", ptr, size);
  // The host plays the owning device: each piece gets the protection its handle's device is given.
  for (auto it : cover) {
    const int owner = st.handles.at(it->second.handle).dev;
    for (size_t i = 0; i < count; ++i) {
      if (desc[i].location.id != owner) continue;
      const uintptr_t lo = std::max<uintptr_t>(ptr, it->first);
      const uintptr_t hi = std::min<uintptr_t>(ptr + size, it->first + it->second.size);
      const int prot = desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
                       : desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
                                                                           : PROT_NONE;
      mprotect(reinterpret_cast<void*>(lo), hi - lo, prot);
      it->second.prot = prot;
    }
  }
  st.dev[d].set_access++;
  return CUDA_SUCCESS;
}

// ==== memory other processes map (IPC) ==============================================================
// Shareable handles are real: a POSIX descriptor is a dup of the handle's memfd (another process
// takes it with pidfd_getfd, as PyTorch does); a fabric handle and a CUipcMemHandle name the
// exporting process and its descriptor, which the importer reopens through /proc/<pid>/fd.
namespace {
constexpr char kFabricMagic[8] = {'S', 'F', 'K', 'F', 'A', 'B', '0', '1'};
constexpr char kIpcMagic[8] = {'S', 'F', 'K', 'I', 'P', 'C', '0', '1'};
struct Named { char magic[8]; long long pid; int fd; int pad; u64 length, bytes, source; };
static_assert(sizeof(Named) <= CU_IPC_HANDLE_SIZE);
// Another process's descriptor, reopened read-write (-1 when it is gone).
int reopen(long long pid, int fd) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%lld/fd/%d", pid, fd);
  return open(path, O_RDWR | O_CLOEXEC);
}
bool is_fake_memfd(int fd) {
  char path[64], target[256] = {};
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(path, target, sizeof target - 1);
  return n > 0 && strncmp(target, "/memfd:stitch_fake_cuda", strlen("/memfd:stitch_fake_cuda")) == 0;
}
}  // namespace

// cuda.h, cuMemGetAddressRange: "Returns the base address in \p *pbase and size in \p *psize of
// the allocation by ::cuMemAlloc() or ::cuMemAllocPitch() that contains the input pointer \p dptr."
// The fake answers for cuMemAlloc memory and cuIpcOpenMemHandle mappings, else CUDA_ERROR_NOT_FOUND.
FAKE_EXPORT CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  ENTER(EP_cuMemGetAddressRange);
  NEED_CTX(d);
  (void)d;
  auto find = [&](const auto& table, auto length_of, auto bytes_of) -> bool {
    auto it = table.upper_bound(static_cast<uintptr_t>(dptr));
    if (it == table.begin()) return false;
    --it;
    if (dptr - it->first >= length_of(it->second)) return false;
    if (pbase != nullptr) *pbase = it->first;
    if (psize != nullptr) *psize = bytes_of(it->second);
    return true;
  };
  if (find(st.allocs, [](const Alloc& a) { return a.length; }, [](const Alloc& a) { return a.bytes; }) ||
      find(st.ipc_opens, [](const IpcOpen& o) { return o.length; }, [](const IpcOpen& o) { return o.bytes; }))
    return CUDA_SUCCESS;
  note(ep_, "0x%llx is not cuMemAlloc memory -> CUDA_ERROR_NOT_FOUND", dptr);
  return CUDA_ERROR_NOT_FOUND;
}
FAKE_EXPORT CUresult CUDAAPI cuMemExportToShareableHandle(void* shareableHandle, CUmemGenericAllocationHandle handle,
                                                          CUmemAllocationHandleType handleType, unsigned long long flags) {
  ENTER(EP_cuMemExportToShareableHandle);
  NEED_CTX(d);
  (void)d;
  NEED_VMM();
  NEED_PTR(shareableHandle);
  // "flags - Reserved, must be zero"
  if (flags != 0) return violation(st, R_ARG, ep_, CUDA_ERROR_INVALID_VALUE, "flags = 0x%llx", flags);
  Handle* h;
  TRY(live_handle(st, ep_, handle, &h));
  const int type = raw(handleType);
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && type != CU_MEM_HANDLE_TYPE_FABRIC)
    return violation(st, R_ARG, ep_, CUDA_ERROR_NOT_SUPPORTED, "handleType = 0x%x", type);
  // Rule 14 — CUmemAllocationProp::requestedHandleTypes: "requested handle types ... the
  // application must request which shareable handle types it will export at creation"
  // (cuMemCreate: "If ... the handle type ... was not requested, ... export fails").
  if ((h->types & static_cast<unsigned>(type)) == 0)
    return violation(st, R_IPC, ep_, CUDA_ERROR_INVALID_VALUE,
                     "handle type 0x%x was not requested when handle 0x%llx was made (requestedHandleTypes = 0x%x)",
                     type, handle, h->types);
  if (type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    const int fd = fcntl(h->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    *static_cast<int*>(shareableHandle) = fd;
    return CUDA_SUCCESS;
  }
  CUmemFabricHandle out{};
  Named n{};
  memcpy(n.magic, kFabricMagic, sizeof n.magic);
  n.pid = getpid();
  n.fd = h->fd;
  memcpy(out.data, &n, sizeof n);
  memcpy(shareableHandle, &out, sizeof out);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* osHandle,
                                                            CUmemAllocationHandleType shHandleType) {
  ENTER(EP_cuMemImportFromShareableHandle);
  NEED_CTX(d);
  NEED_VMM();
  NEED_PTR(handle);
  const int type = raw(shHandleType);
  int fd = -1;
  if (type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    const int given = static_cast<int>(reinterpret_cast<uintptr_t>(osHandle));
    if (!is_fake_memfd(given))
      return violation(st, R_IPC, ep_, CUDA_ERROR_INVALID_VALUE,
                       "descriptor %d is not one cuMemExportToShareableHandle returned", given);
    fd = fcntl(given, F_DUPFD_CLOEXEC, 0);  // the caller may close its own
  } else if (type == CU_MEM_HANDLE_TYPE_FABRIC) {
    NEED_PTR(osHandle);
    if (st.fabric != 1) {
      note(ep_, "fabric handle import: %s", st.fabric == 0 ? "unsupported" : "no IMEX channel");
      return st.fabric == 0 ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_NOT_PERMITTED;
    }
    Named n{};
    memcpy(&n, osHandle, sizeof n);
    if (memcmp(n.magic, kFabricMagic, sizeof n.magic) != 0)
      return violation(st, R_IPC, ep_, CUDA_ERROR_INVALID_VALUE, "not a fabric handle cuMemExportToShareableHandle made");
    fd = reopen(n.pid, n.fd);
    if (fd < 0) {  // the exporter released it or exited: a stale handle, not a misuse
      note(ep_, "fabric handle of process %lld is stale -> CUDA_ERROR_INVALID_VALUE", n.pid);
      return CUDA_ERROR_INVALID_VALUE;
    }
  } else {
    return violation(st, R_ARG, ep_, CUDA_ERROR_NOT_SUPPORTED, "shHandleType = 0x%x", type);
  }
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  struct stat sb {};
  if (fstat(fd, &sb) != 0 || sb.st_size <= 0) {
    close(fd);
    return CUDA_ERROR_INVALID_VALUE;
  }
  const CUmemGenericAllocationHandle id = kHandleBase + st.next_id++;
  st.handles[id] = {fd, static_cast<size_t>(sb.st_size), d, false, 0, static_cast<unsigned>(type), true};
  st.handles_created++;
  *handle = id;
  return CUDA_SUCCESS;
}
// cuda.h, cuIpcGetMemHandle: "Takes a pointer to the base of an existing device memory
// allocation created with ::cuMemAlloc and exports it for use in another process."
FAKE_EXPORT CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  ENTER(EP_cuIpcGetMemHandle);
  NEED_CTX(d);
  (void)d;
  NEED_PTR(pHandle);
  auto it = st.allocs.find(static_cast<uintptr_t>(dptr));
  if (it == st.allocs.end())
    return violation(st, R_IPC, ep_, CUDA_ERROR_INVALID_VALUE,
                     "0x%llx is not the base of a cuMemAlloc allocation (VMM memory shares with "
                     "cuMemExportToShareableHandle)", dptr);
  Named n{};
  memcpy(n.magic, kIpcMagic, sizeof n.magic);
  n.pid = getpid();
  n.fd = it->second.fd;
  n.length = it->second.length;
  n.bytes = it->second.bytes;
  n.source = dptr;
  memset(pHandle, 0, sizeof *pHandle);
  memcpy(pHandle->reserved, &n, sizeof n);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags) {
  ENTER(EP_cuIpcOpenMemHandle);
  NEED_CTX(d);
  NEED_PTR(pdptr);
  // "Flags - Flags for this operation. Must be specified as ::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS"
  if (Flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
    return violation(st, R_ARG, ep_, CUDA_ERROR_INVALID_VALUE, "Flags = 0x%x", Flags);
  Named n{};
  memcpy(&n, handle.reserved, sizeof n);
  if (memcmp(n.magic, kIpcMagic, sizeof n.magic) != 0)
    return violation(st, R_IPC, ep_, CUDA_ERROR_INVALID_VALUE, "not a handle cuIpcGetMemHandle made");
  // "::CUipcMemHandles from each ::CUdevice in a given process may only be opened by one
  // ::CUcontext per ::CUdevice per other process."
  if (n.pid == getpid())
    return violation(st, R_IPC, ep_, CUDA_ERROR_INVALID_CONTEXT, "the handle was made in this process");
  // "If the memory handle has already been opened by the current context, the reference count on
  // the handle is incremented by 1 and the existing device pointer is returned."
  for (auto& [p, o] : st.ipc_opens) {
    if (o.pid == n.pid && o.source == n.source && o.dev == d) {
      o.refs++;
      *pdptr = p;
      return CUDA_SUCCESS;
    }
  }
  const int fd = reopen(n.pid, n.fd);
  if (fd < 0) {
    note(ep_, "handle of process %lld is stale -> CUDA_ERROR_INVALID_HANDLE", n.pid);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  // Strict, as a driver knows its allocations: what the handle names must be a cuMemAlloc
  // allocation's memory of that length holding `bytes` (never the handle's word alone: a handle
  // that claims more than its memory holds is refused, not mapped past the memory's end).
  struct stat sb {};
  if (!is_fake_memfd(fd) || fstat(fd, &sb) != 0 || static_cast<u64>(sb.st_size) != n.length || n.bytes == 0 ||
      n.bytes > n.length || round_up(static_cast<size_t>(n.bytes), kPage) != n.length) {
    close(fd);
    note(ep_, "handle of process %lld does not name a cuMemAlloc allocation of its size -> CUDA_ERROR_INVALID_HANDLE",
         n.pid);
    return CUDA_ERROR_INVALID_HANDLE;
  }
  void* p = mmap(nullptr, n.length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return CUDA_ERROR_MAP_FAILED;
  st.ipc_opens[reinterpret_cast<uintptr_t>(p)] = {n.length, n.bytes, 1, n.pid, n.fd, n.source, d};
  *pdptr = reinterpret_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr) {
  ENTER(EP_cuIpcCloseMemHandle);
  NEED_CTX(d);
  (void)d;
  auto it = st.ipc_opens.find(static_cast<uintptr_t>(dptr));
  if (it == st.ipc_opens.end())
    return violation(st, R_IPC, ep_, CUDA_ERROR_INVALID_VALUE, "0x%llx is not a pointer cuIpcOpenMemHandle returned", dptr);
  if (--it->second.refs == 0) {
    munmap(reinterpret_cast<void*>(it->first), it->second.length);
    st.ipc_opens.erase(it);
  }
  return CUDA_SUCCESS;
}

// ==== copies ========================================================================================
// [p, p + bytes) is memory of device `d` the device may access with `prot`: inside one
// cuMemAlloc allocation, or covered by mappings whose access cuMemSetAccess granted.
CUresult device_memory(State& st, Ep ep, const char* what, CUdeviceptr ptr, size_t bytes, int d, int prot) {
  const auto p = static_cast<uintptr_t>(ptr);
  auto a = st.allocs.upper_bound(p);
  if (a != st.allocs.begin()) {
    --a;
    if (p - a->first < a->second.length && bytes <= a->second.length - (p - a->first)) {
      if (a->second.dev != d)
        return violation(st, R_ARG, ep, CUDA_ERROR_INVALID_VALUE, "%s 0x%llx is memory of device %d, not %d",
                         what, ptr, a->second.dev, d);
      return CUDA_SUCCESS;
    }
  }
  const auto cover = covering(st, p, bytes);
  if (cover.empty())
    return violation(st, R_ARG, ep, CUDA_ERROR_INVALID_VALUE, "%s [0x%llx, +0x%zx) is not device memory "
                     "(neither one cuMemAlloc allocation nor wholly mapped)", what, ptr, bytes);
  for (auto it : cover)
    if ((it->second.prot & prot) != prot)
      return violation(st, R_ACCESS, ep, CUDA_ERROR_INVALID_VALUE, "%s [0x%llx, +0x%zx) is mapped without %s "
                       "access (cuMemSetAccess)", what, ptr, bytes, prot & PROT_WRITE ? "read-write" : "read");
  return CUDA_SUCCESS;
}
// The stream of an asynchronous copy in device d's context: a live stream of that context (NULL
// and CU_STREAM_LEGACY are its legacy stream).
CUresult copy_stream(State& st, Ep ep, CUstream h, int d, Stream** out) {
  TRY(get_stream(st, ep, h, out));
  if ((*out)->dev != d)
    return violation(st, R_HANDLE, ep, CUDA_ERROR_INVALID_HANDLE,
                     "a stream of device %d's context in device %d's context", (*out)->dev, d);
  return CUDA_SUCCESS;
}
// Queues an asynchronous copy, its arguments checked, on s: one work item, unless a capture
// rule forbids it.
CUresult queue_copy(State& st, Ep ep, Stream& s) {
  // Rule 12 — legacy-stream work while a blocking stream captures is an implicit dependency.
  if (s.legacy && blocking_captures(st, s.dev, true) > 0)
    return violation(st, R_CAPTURE, ep, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
                     "copy on the legacy stream while a blocking stream of its context is capturing "
                     "(capture invalidated)");
  if (s.cap.status != CU_STREAM_CAPTURE_STATUS_NONE)
    return violation(st, R_CAPTURE, ep, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                     "a copy into a capture (the fake does not model captured copies)");
  push_work(s);
  return CUDA_SUCCESS;
}
// cuda.h, cuMemcpyDtoDAsync: "Copies from device memory to device memory. \p dstDevice and \p
// srcDevice are the base pointers of the destination and source, respectively. \p ByteCount
// specifies the number of bytes to copy. Note that this function is asynchronous and can
// optionally be associated to a stream by passing a non-zero \p hStream argument." The fake
// moves the bytes at once (nothing may read them before a sync of the stream, which the caller
// does).
FAKE_EXPORT CUresult CUDAAPI cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream hStream) {
  ENTER(EP_cuMemcpyDtoDAsync);
  NEED_CTX(d);
  Stream* s;
  TRY(copy_stream(st, ep_, hStream, d, &s));
  if (bytes == 0) return CUDA_SUCCESS;
  TRY(device_memory(st, ep_, "srcDevice", src, bytes, d, PROT_READ));
  TRY(device_memory(st, ep_, "dstDevice", dst, bytes, d, PROT_READ | PROT_WRITE));
  if (src < dst + bytes && dst < src + bytes)
    return violation(st, R_ARG, ep_, CUDA_ERROR_INVALID_VALUE,
                     "the ranges [0x%llx, +0x%zx) and [0x%llx, +0x%zx) overlap", dst, bytes, src, bytes);
  TRY(queue_copy(st, ep_, *s));
  std::memmove(reinterpret_cast<void*>(static_cast<uintptr_t>(dst)),
               reinterpret_cast<const void*>(static_cast<uintptr_t>(src)), bytes);
  return CUDA_SUCCESS;
}
// cuda.h, cuMemcpyDtoHAsync: "Copies from device to host memory. \p dstHost and \p srcDevice
// specify the base pointers of the destination and source, respectively. \p ByteCount specifies
// the number of bytes to copy." / cuMemcpyHtoDAsync: "Copies from host memory to device memory.
// \p dstDevice and \p srcHost are the base addresses of the destination and source,
// respectively." (both list ::CUDA_ERROR_INVALID_CONTEXT, _INVALID_VALUE and _INVALID_HANDLE).
// The device side is checked as for cuMemcpyDtoH / cuMemcpyHtoD, the stream and capture rules
// are cuMemcpyDtoDAsync's, and the bytes move at once (as there).
FAKE_EXPORT CUresult CUDAAPI cuMemcpyDtoHAsync(void* dstHost, CUdeviceptr src, size_t bytes, CUstream hStream) {
  ENTER(EP_cuMemcpyDtoHAsync);
  NEED_CTX(d);
  Stream* s;
  TRY(copy_stream(st, ep_, hStream, d, &s));
  if (bytes == 0) return CUDA_SUCCESS;
  NEED_PTR(dstHost);
  TRY(device_memory(st, ep_, "srcDevice", src, bytes, d, PROT_READ));
  TRY(queue_copy(st, ep_, *s));
  std::memcpy(dstHost, reinterpret_cast<const void*>(static_cast<uintptr_t>(src)), bytes);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr dst, const void* srcHost, size_t bytes, CUstream hStream) {
  ENTER(EP_cuMemcpyHtoDAsync);
  NEED_CTX(d);
  Stream* s;
  TRY(copy_stream(st, ep_, hStream, d, &s));
  if (bytes == 0) return CUDA_SUCCESS;
  NEED_PTR(srcHost);
  TRY(device_memory(st, ep_, "dstDevice", dst, bytes, d, PROT_READ | PROT_WRITE));
  TRY(queue_copy(st, ep_, *s));
  std::memcpy(reinterpret_cast<void*>(static_cast<uintptr_t>(dst)), srcHost, bytes);
  return CUDA_SUCCESS;
}

// cuda.h, cuMemcpyDtoH / cuMemcpyHtoD: "Copies from device to host memory" / "from host memory to
// device memory"; synchronous for the host (pageable memory). The legacy stream's work comes
// first, as the synchronous copies are ordered on it.
FAKE_EXPORT CUresult CUDAAPI cuMemcpyDtoH(void* dstHost, CUdeviceptr src, size_t bytes) {
  ENTER(EP_cuMemcpyDtoH);
  NEED_CTX(d);
  if (bytes == 0) return CUDA_SUCCESS;
  NEED_PTR(dstHost);
  TRY(device_memory(st, ep_, "srcDevice", src, bytes, d, PROT_READ));
  if (blocking_captures(st, d, true) > 0)
    return violation(st, R_CAPTURE, ep_, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
                     "a synchronous copy while a blocking stream of its context is capturing (capture invalidated)");
  std::memcpy(dstHost, reinterpret_cast<const void*>(static_cast<uintptr_t>(src)), bytes);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dst, const void* srcHost, size_t bytes) {
  ENTER(EP_cuMemcpyHtoD);
  NEED_CTX(d);
  if (bytes == 0) return CUDA_SUCCESS;
  NEED_PTR(srcHost);
  TRY(device_memory(st, ep_, "dstDevice", dst, bytes, d, PROT_READ | PROT_WRITE));
  if (blocking_captures(st, d, true) > 0)
    return violation(st, R_CAPTURE, ep_, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
                     "a synchronous copy while a blocking stream of its context is capturing (capture invalidated)");
  std::memcpy(reinterpret_cast<void*>(static_cast<uintptr_t>(dst)), srcHost, bytes);
  return CUDA_SUCCESS;
}

// ==== streams =======================================================================================
FAKE_EXPORT CUresult CUDAAPI cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  ENTER(EP_cuStreamCreate);
  NEED_CTX(d);
  NEED_PTR(phStream);
  // cuda.h, cuStreamCreate: "Valid values for \p Flags are: CU_STREAM_DEFAULT ... CU_STREAM_NON_BLOCKING"
  if ((Flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING)) != 0)
    return violation(st, R_ARG, ep_, CUDA_ERROR_INVALID_VALUE, "Flags = 0x%x", Flags);
  const u64 key = kStreamBase + 16 * st.next_id++;
  Stream& s = st.streams[key];
  s.key = key;
  s.dev = d;
  s.flags = Flags;
  *phStream = stream_handle(s);
  return CUDA_SUCCESS;
}
// Streams and events of another context than the current one may be synchronized, queried and
// destroyed (the docs do not forbid it); only cuEventRecord insists on one context (rule 9).
FAKE_EXPORT CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream) {
  ENTER(EP_cuStreamDestroy);
  if (hStream == nullptr || hStream == CU_STREAM_LEGACY)
    return violation(st, R_HANDLE, ep_, CUDA_ERROR_INVALID_HANDLE, "the legacy stream cannot be destroyed");
  Stream* s;
  TRY(get_stream(st, ep_, hStream, &s));
  // cuda.h, cuStreamDestroy: "the resources associated with \p hStream will be released
  // automatically once the device has completed all work in \p hStream." Held work stays
  // pending (stitch_fake_cuda_release_stream still accepts the handle); a capture is dropped.
  end_capture(st, *s);
  s->live = false;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) {
  ENTER(EP_cuStreamSynchronize);
  Stream* s;
  TRY(get_stream(st, ep_, hStream, &s));
  TRY(capture_allows_wait(st, ep_, *s));
  if (complete_stream(*s)) st.forced++;
  return CUDA_SUCCESS;
}
// cuda.h, cuStreamQuery: "Returns ::CUDA_SUCCESS if all operations in the stream specified by
// \p hStream have completed, or ::CUDA_ERROR_NOT_READY if not."
FAKE_EXPORT CUresult CUDAAPI cuStreamQuery(CUstream hStream) {
  ENTER(EP_cuStreamQuery);
  Stream* s;
  TRY(get_stream(st, ep_, hStream, &s));
  TRY(capture_allows_wait(st, ep_, *s));
  return pending(*s) ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  ENTER(EP_cuStreamBeginCapture);
  // Rule 12 — cuda.h, cuStreamBeginCapture: "Capture may not be initiated if \p stream is
  // CU_STREAM_LEGACY."
  if (hStream == nullptr || hStream == CU_STREAM_LEGACY)
    return violation(st, R_CAPTURE, ep_, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "capture of the legacy stream");
  Stream* s;
  TRY(get_stream(st, ep_, hStream, &s));
  if (!valid_mode(raw(mode))) return violation(st, R_ARG, ep_, CUDA_ERROR_INVALID_VALUE, "mode = %d", raw(mode));
  // "it may only be initiated if the stream is not already in capture mode."
  if (capturing(*s))
    return violation(st, R_CAPTURE, ep_, CUDA_ERROR_ILLEGAL_STATE, "stream %p is already capturing",
                     static_cast<void*>(hStream));
  s->cap = Capture{CU_STREAM_CAPTURE_STATUS_ACTIVE, mode, std::this_thread::get_id(), ++st.capture_seq};
  st.active_captures++;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  ENTER(EP_cuStreamEndCapture);
  NEED_PTR(phGraph);
  Stream* s;
  TRY(get_stream(st, ep_, hStream, &s));
  // cuda.h, cuStreamEndCapture: "Capture must have been initiated on \p hStream via a call to
  // ::cuStreamBeginCapture."
  if (!capturing(*s))
    return violation(st, R_CAPTURE, ep_, CUDA_ERROR_ILLEGAL_STATE, "stream %p is not capturing",
                     static_cast<void*>(hStream));
  // "If the \p mode argument to ::cuStreamBeginCapture was not ::CU_STREAM_CAPTURE_MODE_RELAXED,
  // this call must be from the same thread as ::cuStreamBeginCapture." (the capture goes on)
  if (s->cap.mode != CU_STREAM_CAPTURE_MODE_RELAXED && s->cap.thread != std::this_thread::get_id())
    return violation(st, R_CAPTURE, ep_, CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
                     "capture of stream %p was begun on another thread", static_cast<void*>(hStream));
  // "If capture was invalidated, due to a violation of the rules of stream capture, then a NULL
  // graph will be returned." The capture ends either way.
  const bool invalidated = s->cap.status == CU_STREAM_CAPTURE_STATUS_INVALIDATED;
  end_capture(st, *s);
  *phGraph = invalidated ? nullptr : reinterpret_cast<CUgraph>(kGraphBase + 16 * st.next_id++);
  return invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus* captureStatus) {
  ENTER(EP_cuStreamIsCapturing);
  NEED_PTR(captureStatus);
  Stream* s;
  TRY(get_stream(st, ep_, hStream, &s));
  // cuda.h, cuStreamIsCapturing: "if this is called on ::CU_STREAM_LEGACY (the "null stream")
  // while a blocking stream in the same context is capturing, it will return
  // ::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ... The blocking stream capture is not invalidated."
  if (s->legacy && blocking_captures(st, s->dev, false) > 0)
    return violation(st, R_CAPTURE, ep_, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
                     "legacy stream queried while a blocking stream of its context is capturing");
  *captureStatus = s->cap.status;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  ENTER(EP_cuThreadExchangeStreamCaptureMode);
  NEED_PTR(mode);
  if (!valid_mode(raw(*mode))) return violation(st, R_ARG, ep_, CUDA_ERROR_INVALID_VALUE, "*mode = %d", raw(*mode));
  // "Sets the calling thread's stream capture interaction mode to the value contained in
  // \p *mode, and overwrites \p *mode with the previous mode for the thread."
  std::swap(me(st).mode, *mode);
  return CUDA_SUCCESS;
}

// ==== events ========================================================================================
FAKE_EXPORT CUresult CUDAAPI cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  ENTER(EP_cuEventCreate);
  NEED_CTX(d);
  NEED_PTR(phEvent);
  const unsigned valid = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if ((Flags & ~valid) != 0) return violation(st, R_ARG, ep_, CUDA_ERROR_INVALID_VALUE, "Flags = 0x%x", Flags);
  // cuda.h, cuEventCreate: "::CU_EVENT_INTERPROCESS must be specified along with ::CU_EVENT_DISABLE_TIMING."
  if ((Flags & CU_EVENT_INTERPROCESS) != 0 && (Flags & CU_EVENT_DISABLE_TIMING) == 0)
    return violation(st, R_ARG, ep_, CUDA_ERROR_INVALID_VALUE, "CU_EVENT_INTERPROCESS without CU_EVENT_DISABLE_TIMING");
  const u64 key = kEventBase + 16 * st.next_id++;
  st.events[key] = Event{d, {}, false, 0, 0};
  *phEvent = reinterpret_cast<CUevent>(key);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent) {
  ENTER(EP_cuEventDestroy);
  Event* e;
  TRY(get_event(st, ep_, hEvent, &e));
  st.events.erase(reinterpret_cast<u64>(hEvent));
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream) {
  ENTER(EP_cuEventRecord);
  Event* e;
  TRY(get_event(st, ep_, hEvent, &e));
  Stream* s;
  TRY(get_stream(st, ep_, hStream, &s));
  // Rule 9 — cuda.h, cuEventRecord: "\p hEvent and \p hStream must be from the same context
  // otherwise ::CUDA_ERROR_INVALID_HANDLE is returned."
  if (e->dev != s->dev)
    return violation(st, R_HANDLE, ep_, CUDA_ERROR_INVALID_HANDLE,
                     "event of device %d's context recorded on a stream of device %d's context", e->dev, s->dev);
  // Rule 12 — legacy-stream work while a blocking stream captures is an implicit dependency.
  if (s->legacy && blocking_captures(st, s->dev, true) > 0)
    return violation(st, R_CAPTURE, ep_, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
                     "record on the legacy stream while a blocking stream of its context is capturing "
                     "(capture invalidated)");
  if (s->cap.status == CU_STREAM_CAPTURE_STATUS_INVALIDATED) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  if (s->cap.status == CU_STREAM_CAPTURE_STATUS_ACTIVE) {  // recorded into the graph
    *e = Event{e->dev, {}, true, s->key, s->cap.seq};
    return CUDA_SUCCESS;
  }
  // cuda.h, cuEventRecord: "::cuEventRecord() can be called multiple times on the same event and
  // will overwrite the previously captured state."
  e->captured = false;
  e->deps = {{s->key, push_work(*s)}};
  // Legacy-stream semantics: the legacy stream and blocking streams wait for each other's work.
  for (auto& [key, t] : st.streams) {
    if (!st.ever_held) break;
    if (t.dev != s->dev || &t == s || !pending(t)) continue;
    if (s->legacy ? (!t.legacy && (t.flags & CU_STREAM_NON_BLOCKING) == 0)
                  : (t.legacy && (s->flags & CU_STREAM_NON_BLOCKING) == 0))
      e->deps.push_back({t.key, t.recorded});
  }
  return CUDA_SUCCESS;
}
// cuda.h, cuEventQuery: "Returns ::CUDA_SUCCESS if all captured work has been completed, or
// ::CUDA_ERROR_NOT_READY if any captured work is incomplete."
FAKE_EXPORT CUresult CUDAAPI cuEventQuery(CUevent hEvent) {
  ENTER(EP_cuEventQuery);
  Event* e;
  TRY(get_event(st, ep_, hEvent, &e));
  TRY(event_not_captured(st, ep_, hEvent, *e));
  TRY(unsafe_call(st, ep_));
  return event_done(st, *e) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
FAKE_EXPORT CUresult CUDAAPI cuEventSynchronize(CUevent hEvent) {
  ENTER(EP_cuEventSynchronize);
  Event* e;
  TRY(get_event(st, ep_, hEvent, &e));
  TRY(event_not_captured(st, ep_, hEvent, *e));
  TRY(unsafe_call(st, ep_));
  if (complete_event(st, *e)) st.forced++;
  return CUDA_SUCCESS;
}

// ==== cuGetProcAddress ==============================================================================
namespace {
// Base name -> each exported ABI with the CUDA version that introduced it (the _vNNNN of its
// PFN_ typedef in cudaTypedefs.h). cuda.h, cuGetProcAddress: "if the specified CUDA version is
// greater than or equal to the CUDA version in which the driver symbol was introduced, this API
// will return the function pointer to the corresponding versioned function." — so asking for
// "cuCtxSynchronize" at 13000 gives the 13.0 ABI cuCtxSynchronize_v2(CUcontext), as the real
// driver does.
struct ProcEntry { const char* name; int version; void* fn; };
#define P(name, version, fn) {name, version, reinterpret_cast<void*>(&fn)}
const ProcEntry kProcs[] = {
    P("cuInit", 2000, cuInit), P("cuDriverGetVersion", 2020, cuDriverGetVersion),
    P("cuDeviceGet", 2000, cuDeviceGet), P("cuDeviceGetCount", 2000, cuDeviceGetCount),
    P("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute), P("cuDeviceGetName", 2000, cuDeviceGetName),
    P("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2), P("cuDeviceCanAccessPeer", 4000, cuDeviceCanAccessPeer),
    P("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    P("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    P("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState),
    P("cuCtxSetCurrent", 4000, cuCtxSetCurrent), P("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    P("cuCtxGetDevice", 2000, cuCtxGetDevice), P("cuCtxGetDevice", 13000, cuCtxGetDevice_v2),
    P("cuCtxSynchronize", 2000, cuCtxSynchronize), P("cuCtxSynchronize", 13000, cuCtxSynchronize_v2),
    P("cuMemcpyDtoDAsync", 3020, cuMemcpyDtoDAsync), P("cuMemcpyDtoH", 3020, cuMemcpyDtoH),
    P("cuMemcpyHtoD", 3020, cuMemcpyHtoD), P("cuMemcpyDtoHAsync", 3020, cuMemcpyDtoHAsync),
    P("cuMemcpyHtoDAsync", 3020, cuMemcpyHtoDAsync), P("cuMemHostAlloc", 2020, cuMemHostAlloc),
    P("cuMemFreeHost", 2000, cuMemFreeHost),
    P("cuMemGetInfo", 3020, cuMemGetInfo_v2), P("cuMemAlloc", 3020, cuMemAlloc_v2),
    P("cuMemFree", 3020, cuMemFree_v2),
    P("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
    P("cuMemAddressReserve", 10020, cuMemAddressReserve), P("cuMemAddressFree", 10020, cuMemAddressFree),
    P("cuMemCreate", 10020, cuMemCreate), P("cuMemRelease", 10020, cuMemRelease),
    P("cuMemMap", 10020, cuMemMap), P("cuMemUnmap", 10020, cuMemUnmap),
    P("cuMemSetAccess", 10020, cuMemSetAccess), P("cuStreamCreate", 2000, cuStreamCreate),
    P("cuStreamDestroy", 4000, cuStreamDestroy_v2), P("cuStreamSynchronize", 2000, cuStreamSynchronize),
    P("cuStreamQuery", 2000, cuStreamQuery), P("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2),
    P("cuStreamEndCapture", 10000, cuStreamEndCapture), P("cuStreamIsCapturing", 10000, cuStreamIsCapturing),
    P("cuThreadExchangeStreamCaptureMode", 10010, cuThreadExchangeStreamCaptureMode),
    P("cuEventCreate", 2000, cuEventCreate), P("cuEventDestroy", 4000, cuEventDestroy_v2),
    P("cuEventRecord", 2000, cuEventRecord), P("cuEventQuery", 2000, cuEventQuery),
    P("cuEventSynchronize", 2000, cuEventSynchronize), P("cuGetErrorName", 6000, cuGetErrorName),
    P("cuGetErrorString", 6000, cuGetErrorString), P("cuGetProcAddress", 11030, cuGetProcAddress),
    P("cuGetProcAddress", 12000, cuGetProcAddress_v2), P("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2),
    P("cuMemExportToShareableHandle", 10020, cuMemExportToShareableHandle),
    P("cuMemImportFromShareableHandle", 10020, cuMemImportFromShareableHandle),
    P("cuIpcGetMemHandle", 4010, cuIpcGetMemHandle), P("cuIpcOpenMemHandle", 11000, cuIpcOpenMemHandle_v2),
    P("cuIpcCloseMemHandle", 4010, cuIpcCloseMemHandle),
};
#undef P

CUresult get_proc(State& st, Ep ep_, const char* symbol, void** pfn, int version, cuuint64_t flags,
                  CUdriverProcAddressQueryResult* status) {
  NEED_PTR(symbol);
  NEED_PTR(pfn);
  *pfn = nullptr;
  // cuda.h, cuGetProcAddress: "If the specified CUDA version is greater than the driver version,
  // the API will return ::CUDA_ERROR_INVALID_VALUE."
  if (version > kDriverVersion)
    return violation(st, R_ARG, ep_, CUDA_ERROR_INVALID_VALUE, "cudaVersion %d > driver version %d", version,
                     kDriverVersion);
  // CU_GET_PROC_ADDRESS_DEFAULT / _LEGACY_STREAM only: per-thread default streams are not modelled.
  if ((flags & ~static_cast<cuuint64_t>(CU_GET_PROC_ADDRESS_LEGACY_STREAM)) != 0)
    return violation(st, R_ARG, ep_, CUDA_ERROR_INVALID_VALUE, "flags = 0x%llx", static_cast<u64>(flags));
  const ProcEntry* best = nullptr;
  bool known = false;
  for (const ProcEntry& e : kProcs) {
    if (strcmp(e.name, symbol) != 0) continue;
    known = true;
    if (e.version <= version && (best == nullptr || e.version > best->version)) best = &e;
  }
  if (best == nullptr) {  // probing for a symbol is legitimate: not a violation
    if (status != nullptr)
      *status = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    note(ep_, "%s at CUDA %d: %s -> CUDA_ERROR_NOT_FOUND", symbol, version,
         known ? "version not sufficient" : "symbol not found");
    return CUDA_ERROR_NOT_FOUND;
  }
  *pfn = best->fn;
  if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}
}  // namespace

// ==== test-control API (fake_cuda_control.h) =======================================================
#define CONTROL_LOCK()  \
  State& st = state();  \
  std::lock_guard<std::mutex> lock_(st.mu)
FAKE_EXPORT int stitch_fake_cuda_fail(const char* entry_point, unsigned long long nth, int result) {
  CONTROL_LOCK();
  return arm_fault(st, entry_point, nth, result) ? 0 : -1;
}
FAKE_EXPORT void stitch_fake_cuda_clear_faults(void) { CONTROL_LOCK(); st.faults.clear(); }
namespace {
Stream* control_stream(State& st, CUstream h, bool allow_destroyed) {
  if (!st.initialized) return nullptr;
  if (h == nullptr || h == CU_STREAM_LEGACY) {
    const int d = me(st).dev;
    return d >= 0 && st.dev[d].refcount > 0 ? &legacy_stream(st, d) : nullptr;
  }
  auto it = st.streams.find(reinterpret_cast<u64>(h));
  if (it == st.streams.end() || it->second.legacy || (!it->second.live && !allow_destroyed)) return nullptr;
  return &it->second;
}
}  // namespace
FAKE_EXPORT int stitch_fake_cuda_hold_stream(CUstream stream) {
  CONTROL_LOCK();
  Stream* s = control_stream(st, stream, false);
  if (s == nullptr) return -1;
  s->held = true;
  st.ever_held = true;
  push_work(*s);  // the work that is "running" on it now
  return 0;
}
FAKE_EXPORT int stitch_fake_cuda_release_stream(CUstream stream) {
  CONTROL_LOCK();
  Stream* s = control_stream(st, stream, true);
  if (s == nullptr) return -1;
  s->held = false;
  complete_stream(*s);
  return 0;
}
FAKE_EXPORT unsigned long long stitch_fake_cuda_forced_completions(void) { CONTROL_LOCK(); return st.forced; }
FAKE_EXPORT unsigned long long stitch_fake_cuda_calls(const char* entry_point) {
  CONTROL_LOCK();
  const int ep = ep_by_name(entry_point);
  return ep < 0 ? 0 : st.calls[ep];
}
FAKE_EXPORT unsigned long long stitch_fake_cuda_violations(void) { CONTROL_LOCK(); return st.violations; }
FAKE_EXPORT unsigned long long stitch_fake_cuda_rule_violations(int rule) {
  CONTROL_LOCK();
  return rule >= 0 && rule < R_COUNT ? st.rule_violations[rule] : 0;
}
FAKE_EXPORT const char* stitch_fake_cuda_last_violation(void) {
  thread_local char copy[sizeof State::last_violation];
  CONTROL_LOCK();
  memcpy(copy, st.last_violation, sizeof copy);
  return copy;
}
FAKE_EXPORT int stitch_fake_cuda_get_usage(int device, struct stitch_fake_cuda_usage* out) {
  CONTROL_LOCK();
  if (out == nullptr || !st.initialized || !valid_device(st, device)) return -1;
  *out = stitch_fake_cuda_usage{};
  out->capacity_bytes = st.dev[device].capacity;
  out->used_bytes = st.dev[device].used;
  for (auto& [p, a] : st.allocs) out->live_allocations += a.dev == device;
  for (auto& [p, a] : st.host_allocs) {
    if (a.dev != device) continue;
    out->live_host_allocations++;
    out->host_bytes += a.bytes;
  }
  for (auto& [id, h] : st.handles) out->live_handles += h.dev == device && !h.released;
  for (auto& [p, r] : st.reservations) out->live_reservations += r.dev == device;
  for (auto& [p, m] : st.mappings) out->live_mappings += st.handles.at(m.handle).dev == device;
  for (auto& [k, s] : st.streams) out->live_streams += s.dev == device && s.live && !s.legacy;
  for (auto& [k, e] : st.events) out->live_events += e.dev == device;
  return 0;
}
FAKE_EXPORT int stitch_fake_cuda_contexts_activated(int device) {
  CONTROL_LOCK();
  return device >= 0 && device < kMaxDevices ? st.dev[device].activated : 0;
}
FAKE_EXPORT unsigned long long stitch_fake_cuda_set_access_calls(int device) {
  CONTROL_LOCK();
  return device >= 0 && device < kMaxDevices ? st.dev[device].set_access : 0;
}
FAKE_EXPORT void stitch_fake_cuda_reset(void) { CONTROL_LOCK(); reset_all(st); }
FAKE_EXPORT void stitch_fake_cuda_handle_counts(unsigned long long* created, unsigned long long* released) {
  CONTROL_LOCK();
  if (created != nullptr) *created = st.handles_created;
  if (released != nullptr) *released = st.handles_released;
}
FAKE_EXPORT int stitch_fake_cuda_set_capacity(int device, size_t bytes) {
  CONTROL_LOCK();
  if (st.initialized) {
    if (!valid_device(st, device)) return -1;
    st.dev[device].capacity = bytes;
  } else {
    if (device < 0 || device >= kMaxDevices) return -1;
    st.pending_capacity[device] = bytes;
  }
  return 0;
}
