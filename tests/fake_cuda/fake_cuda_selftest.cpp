// tests/fake_cuda/fake_cuda_selftest.cpp — standalone self-test of libstitch_fake_cuda.so: dlopens
// the fake (argv[1] or $STITCH_CUDA_DRIVER), resolves every entry point through
// cuGetProcAddress_v2, and checks each contract rule both ways (allowed use succeeds without a
// violation; each violation returns its documented error and counts one violation of its rule).
// Exit 0 on success; prints each failure and exits 1 otherwise.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "fake_cuda_control.h"

namespace {

int g_failures = 0;
#define CHECK(cond)                                                                   \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);        \
      ++g_failures;                                                                   \
    }                                                                                 \
  } while (0)

struct Ctl {
  decltype(&stitch_fake_cuda_fail) fail;
  decltype(&stitch_fake_cuda_clear_faults) clear_faults;
  decltype(&stitch_fake_cuda_hold_stream) hold_stream;
  decltype(&stitch_fake_cuda_release_stream) release_stream;
  decltype(&stitch_fake_cuda_forced_completions) forced_completions;
  decltype(&stitch_fake_cuda_calls) calls;
  decltype(&stitch_fake_cuda_violations) violations;
  decltype(&stitch_fake_cuda_rule_violations) rule_violations;
  decltype(&stitch_fake_cuda_last_violation) last_violation;
  decltype(&stitch_fake_cuda_get_usage) get_usage;
  decltype(&stitch_fake_cuda_contexts_activated) contexts_activated;
  decltype(&stitch_fake_cuda_set_access_calls) set_access_calls;
  decltype(&stitch_fake_cuda_reset) reset;
  decltype(&stitch_fake_cuda_set_capacity) set_capacity;
} ctl;

struct Cu {
  PFN_cuInit_v2000 Init;
  PFN_cuDriverGetVersion_v2020 DriverGetVersion;
  PFN_cuDeviceGet_v2000 DeviceGet;
  PFN_cuDeviceGetCount_v2000 DeviceGetCount;
  PFN_cuDeviceGetAttribute_v2000 DeviceGetAttribute;
  PFN_cuDeviceGetName_v2000 DeviceGetName;
  PFN_cuDeviceTotalMem_v3020 DeviceTotalMem;
  PFN_cuDeviceCanAccessPeer_v4000 DeviceCanAccessPeer;
  PFN_cuDevicePrimaryCtxRetain_v7000 PrimaryCtxRetain;
  PFN_cuDevicePrimaryCtxRelease_v11000 PrimaryCtxRelease;
  PFN_cuDevicePrimaryCtxGetState_v7000 PrimaryCtxGetState;
  PFN_cuCtxSetCurrent_v4000 CtxSetCurrent;
  PFN_cuCtxGetCurrent_v4000 CtxGetCurrent;
  PFN_cuCtxGetDevice_v2000 CtxGetDevice;
  PFN_cuCtxGetDevice_v13000 CtxGetDevice13;
  PFN_cuCtxSynchronize_v2000 CtxSynchronize;
  PFN_cuCtxSynchronize_v13000 CtxSynchronize13;
  PFN_cuMemGetInfo_v3020 MemGetInfo;
  PFN_cuMemAlloc_v3020 MemAlloc;
  PFN_cuMemFree_v3020 MemFree;
  PFN_cuMemGetAllocationGranularity_v10020 MemGetAllocationGranularity;
  PFN_cuMemAddressReserve_v10020 MemAddressReserve;
  PFN_cuMemAddressFree_v10020 MemAddressFree;
  PFN_cuMemCreate_v10020 MemCreate;
  PFN_cuMemRelease_v10020 MemRelease;
  PFN_cuMemMap_v10020 MemMap;
  PFN_cuMemUnmap_v10020 MemUnmap;
  PFN_cuMemSetAccess_v10020 MemSetAccess;
  PFN_cuMemcpyDtoDAsync_v3020 MemcpyDtoDAsync;
  PFN_cuMemHostAlloc_v2020 MemHostAlloc;
  PFN_cuMemFreeHost_v2000 MemFreeHost;
  PFN_cuMemcpyDtoHAsync_v3020 MemcpyDtoHAsync;
  PFN_cuMemcpyHtoDAsync_v3020 MemcpyHtoDAsync;
  PFN_cuStreamCreate_v2000 StreamCreate;
  PFN_cuStreamDestroy_v4000 StreamDestroy;
  PFN_cuStreamSynchronize_v2000 StreamSynchronize;
  PFN_cuStreamQuery_v2000 StreamQuery;
  PFN_cuStreamBeginCapture_v10010 StreamBeginCapture;
  PFN_cuStreamEndCapture_v10000 StreamEndCapture;
  PFN_cuStreamIsCapturing_v10000 StreamIsCapturing;
  PFN_cuThreadExchangeStreamCaptureMode_v10010 ThreadExchangeStreamCaptureMode;
  PFN_cuEventCreate_v2000 EventCreate;
  PFN_cuEventDestroy_v4000 EventDestroy;
  PFN_cuEventRecord_v2000 EventRecord;
  PFN_cuEventQuery_v2000 EventQuery;
  PFN_cuEventSynchronize_v2000 EventSynchronize;
  PFN_cuGetErrorName_v6000 GetErrorName;
  PFN_cuGetErrorString_v6000 GetErrorString;
  PFN_cuGetProcAddress_v12000 GetProcAddress;
  PFN_cuGetProcAddress_v11030 GetProcAddressLegacy;
  PFN_cuMemGetAddressRange_v3020 MemGetAddressRange;
  PFN_cuMemExportToShareableHandle_v10020 MemExportToShareableHandle;
  PFN_cuMemImportFromShareableHandle_v10020 MemImportFromShareableHandle;
  PFN_cuIpcGetMemHandle_v4010 IpcGetMemHandle;
  PFN_cuIpcOpenMemHandle_v11000 IpcOpenMemHandle;
  PFN_cuIpcCloseMemHandle_v4010 IpcCloseMemHandle;
} cu;
void* g_lib = nullptr;

// Expect `expr` to return `want` and to count no violation.
#define OK_AS(expr, want)                                                                     \
  do {                                                                                        \
    const unsigned long long v_ = ctl.violations();                                           \
    const CUresult r_ = (expr);                                                               \
    if (r_ != (want)) {                                                                       \
      fprintf(stderr, "%s:%d: %s returned %d, want %d (last violation: %s)\n", __FILE__,      \
              __LINE__, #expr, static_cast<int>(r_), static_cast<int>(want), ctl.last_violation()); \
      ++g_failures;                                                                           \
    } else if (ctl.violations() != v_) {                                                      \
      fprintf(stderr, "%s:%d: %s counted a violation: %s\n", __FILE__, __LINE__, #expr,       \
              ctl.last_violation());                                                          \
      ++g_failures;                                                                           \
    }                                                                                         \
  } while (0)
#define OK(expr) OK_AS(expr, CUDA_SUCCESS)
// Expect `expr` to return `want` and to count exactly one violation, of `rule`.
#define BAD(expr, want, rule)                                                                   \
  do {                                                                                          \
    const unsigned long long v_ = ctl.violations(), rv_ = ctl.rule_violations(rule);            \
    const CUresult r_ = (expr);                                                                 \
    if (r_ != (want) || ctl.violations() != v_ + 1 || ctl.rule_violations(rule) != rv_ + 1) {   \
      fprintf(stderr, "%s:%d: %s returned %d (want %d), violations +%llu, rule %d +%llu; last: %s\n", \
              __FILE__, __LINE__, #expr, static_cast<int>(r_), static_cast<int>(want),          \
              ctl.violations() - v_, static_cast<int>(rule), ctl.rule_violations(rule) - rv_,   \
              ctl.last_violation());                                                            \
      ++g_failures;                                                                             \
    }                                                                                           \
  } while (0)

enum {
  ARG = STITCH_FAKE_CUDA_RULE_ARGUMENT, INIT = STITCH_FAKE_CUDA_RULE_INIT,
  CTX = STITCH_FAKE_CUDA_RULE_CONTEXT, GRAN = STITCH_FAKE_CUDA_RULE_GRANULARITY,
  MAP = STITCH_FAKE_CUDA_RULE_MAP, ACCESS = STITCH_FAKE_CUDA_RULE_ACCESS,
  UNMAP = STITCH_FAKE_CUDA_RULE_UNMAP, AFREE = STITCH_FAKE_CUDA_RULE_ADDRESS_FREE,
  RELEASED = STITCH_FAKE_CUDA_RULE_RELEASED, HANDLE = STITCH_FAKE_CUDA_RULE_HANDLE,
  FREE = STITCH_FAKE_CUDA_RULE_FREE, CAPTURE = STITCH_FAKE_CUDA_RULE_CAPTURE,
  NOVMM = STITCH_FAKE_CUDA_RULE_NO_VMM, IPC = STITCH_FAKE_CUDA_RULE_IPC
};
constexpr size_t MiB = size_t{1} << 20, G = 2 * MiB;

template <class F>
void load_ctl(F& out, const char* name) {
  void* p = dlsym(g_lib, name);
  if (p == nullptr) {
    fprintf(stderr, "dlsym(%s) failed\n", name);
    exit(1);
  }
  memcpy(&out, &p, sizeof p);
}
template <class F>
void resolve(F& out, const char* name, int version) {
  void* p = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  const CUresult r = cu.GetProcAddress(name, &p, version, CU_GET_PROC_ADDRESS_DEFAULT, &status);
  if (r != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS || p == nullptr) {
    fprintf(stderr, "cuGetProcAddress(%s, %d) failed: %d/%d\n", name, version, r, status);
    exit(1);
  }
  memcpy(&out, &p, sizeof p);
}

// Accessibility without faulting: the kernel returns EFAULT instead of raising SIGSEGV.
int g_pipe[2];
bool readable(const void* p) {
  if (write(g_pipe[1], p, 1) != 1) return false;
  char c;
  CHECK(read(g_pipe[0], &c, 1) == 1);
  return true;
}
bool writable(void* p) {  // overwrites *p with 'w' when it is writable
  const char c = 'w';
  CHECK(write(g_pipe[1], &c, 1) == 1);
  if (read(g_pipe[0], p, 1) == 1) return true;
  char d;
  CHECK(read(g_pipe[0], &d, 1) == 1);
  return false;
}
// The real enforcement: touching memory without access is a SIGSEGV.
bool touching_faults(volatile char* p) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 2);  // keep sanitizer reports of the expected fault quiet
    struct sigaction sa {};
    sa.sa_handler = SIG_DFL;
    sigaction(SIGSEGV, &sa, nullptr);
    sigaction(SIGBUS, &sa, nullptr);
    *p = 1;
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

stitch_fake_cuda_usage usage(int d) {
  stitch_fake_cuda_usage u{};
  CHECK(ctl.get_usage(d, &u) == 0);
  return u;
}

CUcontext ctx[2];
void use(int d) { OK(cu.CtxSetCurrent(d < 0 ? nullptr : ctx[d])); }
CUmemAllocationProp prop_of(int d) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = d;
  return p;
}
CUmemAccessDesc access_of(int d, CUmemAccess_flags f = CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
  CUmemAccessDesc a{};
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = d;
  a.flags = f;
  return a;
}
char* at(CUdeviceptr p) { return reinterpret_cast<char*>(p); }

void test_proc_address() {
  puts("proc address");
  void* p = reinterpret_cast<void*>(1);
  CUdriverProcAddressQueryResult status;
  OK_AS(cu.GetProcAddress("cuNoSuchThing", &p, 13000, 0, &status), CUDA_ERROR_NOT_FOUND);
  CHECK(p == nullptr && status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  OK_AS(cu.GetProcAddress("stitch_fake_cuda_reset", &p, 13000, 0, &status), CUDA_ERROR_NOT_FOUND);
  OK_AS(cu.GetProcAddress("cuMemAlloc", &p, 3010, 0, &status), CUDA_ERROR_NOT_FOUND);
  CHECK(p == nullptr && status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  OK_AS(cu.GetProcAddress("cuMemMap", &p, 10010, 0, &status), CUDA_ERROR_NOT_FOUND);
  CHECK(status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  OK(cu.GetProcAddress("cuMemAlloc", &p, 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status));
  CHECK(p == dlsym(g_lib, "cuMemAlloc_v2") && status == CU_GET_PROC_ADDRESS_SUCCESS);
  OK(cu.GetProcAddress("cuCtxSynchronize", &p, 12090, 0, nullptr));
  CHECK(p == dlsym(g_lib, "cuCtxSynchronize"));
  OK(cu.GetProcAddress("cuCtxSynchronize", &p, 13000, 0, nullptr));  // the 13.0 ABI
  CHECK(p == dlsym(g_lib, "cuCtxSynchronize_v2"));
  OK(cu.GetProcAddress("cuMemcpyDtoHAsync", &p, 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, nullptr));
  CHECK(p == dlsym(g_lib, "cuMemcpyDtoHAsync_v2"));  // the size_t ABI (3.2)
  OK_AS(cu.GetProcAddress("cuMemcpyHtoDAsync", &p, 3010, 0, &status), CUDA_ERROR_NOT_FOUND);
  CHECK(status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  OK(cu.GetProcAddress("cuMemHostAlloc", &p, 2020, 0, nullptr));
  CHECK(p == dlsym(g_lib, "cuMemHostAlloc"));
  OK(cu.GetProcAddress("cuGetProcAddress", &p, 11030, 0, nullptr));
  CHECK(p == dlsym(g_lib, "cuGetProcAddress"));
  OK(cu.GetProcAddressLegacy("cuMemMap", &p, 11040, 0));
  CHECK(p == dlsym(g_lib, "cuMemMap"));
  BAD(cu.GetProcAddress("cuMemMap", &p, 13010, 0, &status), CUDA_ERROR_INVALID_VALUE, ARG);
  BAD(cu.GetProcAddress("cuMemMap", &p, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &status),
      CUDA_ERROR_INVALID_VALUE, ARG);
  BAD(cu.GetProcAddress("cuMemMap", nullptr, 13000, 0, &status), CUDA_ERROR_INVALID_VALUE, ARG);
}

void test_init() {
  puts("init");
  int n = 0;
  BAD(cu.DeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED, INIT);
  CUcontext c;
  BAD(cu.PrimaryCtxRetain(&c, 0), CUDA_ERROR_NOT_INITIALIZED, INIT);
  size_t g;
  CUmemAllocationProp prop = prop_of(0);
  BAD(cu.MemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_ERROR_NOT_INITIALIZED, INIT);
  OK(cu.DriverGetVersion(&n));
  CHECK(n == 13000);
  const char* s = nullptr;
  OK(cu.GetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s));
  CHECK(s != nullptr && strcmp(s, "CUDA_ERROR_OUT_OF_MEMORY") == 0);
  OK(cu.GetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s));
  CHECK(s != nullptr && strcmp(s, "out of memory") == 0);
  OK_AS(cu.GetErrorName(static_cast<CUresult>(1001), &s), CUDA_ERROR_INVALID_VALUE);  // no such code
  CHECK(s == nullptr);
  BAD(cu.Init(1), CUDA_ERROR_INVALID_VALUE, INIT);
  CHECK(strstr(ctl.last_violation(), "cuInit") != nullptr && strstr(ctl.last_violation(), "rule 1") != nullptr);
  OK(cu.Init(0));
  OK(cu.Init(0));
}

void test_devices() {
  puts("devices");
  int n = 0, v = -1;
  OK(cu.DeviceGetCount(&n));
  CHECK(n == 2);
  CUdevice d;
  OK(cu.DeviceGet(&d, 1));
  CHECK(d == 1);
  BAD(cu.DeviceGet(&d, 2), CUDA_ERROR_INVALID_DEVICE, ARG);
  OK(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
  CHECK(v == 1);
  OK(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 1));
  OK_AS(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX_PITCH, 0), CUDA_ERROR_INVALID_VALUE);
  BAD(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 5), CUDA_ERROR_INVALID_DEVICE, ARG);
  char name[64];
  OK(cu.DeviceGetName(name, sizeof name, 1));
  CHECK(strcmp(name, "Stitch Fake GPU 1") == 0);
  size_t total = 0;
  OK(cu.DeviceTotalMem(&total, 0));
  CHECK(total == 64 * MiB);
  OK(cu.DeviceCanAccessPeer(&v, 0, 1));
  CHECK(v == 1);
  OK(cu.DeviceCanAccessPeer(&v, 1, 1));
  CHECK(v == 0);
  BAD(cu.DeviceCanAccessPeer(&v, 0, 2), CUDA_ERROR_INVALID_DEVICE, ARG);
  size_t g = 0;
  CUmemAllocationProp prop = prop_of(1);  // no context needed
  OK(cu.MemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CHECK(g == G);
  OK(cu.MemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  CHECK(g == G);
  // A C caller may pass any int for an enum; C++ cannot form such a value without UB, so call
  // through the C view of the signature.
  using GranularityC = CUresult (*)(size_t*, const CUmemAllocationProp*, int);
  BAD(reinterpret_cast<GranularityC>(cu.MemGetAllocationGranularity)(&g, &prop, 7), CUDA_ERROR_INVALID_VALUE, ARG);
  prop.location.id = 3;
  BAD(cu.MemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_ERROR_INVALID_DEVICE, ARG);
}

void test_contexts() {
  puts("contexts");
  CUdeviceptr p = 0;
  size_t f, t;
  CUstream s;
  CUevent e;
  CUmemGenericAllocationHandle h;
  CUmemAllocationProp prop = prop_of(0);
  CUmemAccessDesc acc = access_of(0);
  BAD(cu.MemAlloc(&p, 4096), CUDA_ERROR_INVALID_CONTEXT, CTX);
  BAD(cu.MemFree(p), CUDA_ERROR_INVALID_CONTEXT, CTX);
  BAD(cu.MemGetInfo(&f, &t), CUDA_ERROR_INVALID_CONTEXT, CTX);
  BAD(cu.CtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT, CTX);
  BAD(cu.CtxGetDevice(&prop.location.id), CUDA_ERROR_INVALID_CONTEXT, CTX);
  BAD(cu.StreamCreate(&s, 0), CUDA_ERROR_INVALID_CONTEXT, CTX);
  BAD(cu.EventCreate(&e, 0), CUDA_ERROR_INVALID_CONTEXT, CTX);
  BAD(cu.StreamSynchronize(nullptr), CUDA_ERROR_INVALID_CONTEXT, CTX);
  BAD(cu.StreamQuery(CU_STREAM_LEGACY), CUDA_ERROR_INVALID_CONTEXT, CTX);
  BAD(cu.MemAddressReserve(&p, G, 0, 0, 0), CUDA_ERROR_INVALID_CONTEXT, CTX);
  BAD(cu.MemAddressFree(G, G), CUDA_ERROR_INVALID_CONTEXT, CTX);
  BAD(cu.MemCreate(&h, G, &prop, 0), CUDA_ERROR_INVALID_CONTEXT, CTX);
  BAD(cu.MemMap(G, G, 0, 1, 0), CUDA_ERROR_INVALID_CONTEXT, CTX);
  BAD(cu.MemUnmap(G, G), CUDA_ERROR_INVALID_CONTEXT, CTX);
  BAD(cu.MemSetAccess(G, G, &acc, 1), CUDA_ERROR_INVALID_CONTEXT, CTX);
  BAD(cu.MemRelease(1), CUDA_ERROR_INVALID_CONTEXT, CTX);
  void* hp = nullptr;
  char buf[64];
  BAD(cu.MemHostAlloc(&hp, 4096, 0), CUDA_ERROR_INVALID_CONTEXT, CTX);
  BAD(cu.MemFreeHost(buf), CUDA_ERROR_INVALID_CONTEXT, CTX);
  BAD(cu.MemcpyDtoHAsync(buf, G, sizeof buf, nullptr), CUDA_ERROR_INVALID_CONTEXT, CTX);
  BAD(cu.MemcpyHtoDAsync(G, buf, sizeof buf, nullptr), CUDA_ERROR_INVALID_CONTEXT, CTX);
  BAD(cu.PrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT, CTX);

  unsigned flags;
  int active = 1;
  OK(cu.PrimaryCtxGetState(0, &flags, &active));
  CHECK(active == 0 && ctl.contexts_activated(0) == 0);
  OK(cu.PrimaryCtxRetain(&ctx[0], 0));
  CHECK(ctx[0] != nullptr && ctl.contexts_activated(0) == 1);
  OK(cu.PrimaryCtxRelease(0));  // back to inactive: binding it is an error
  BAD(cu.CtxSetCurrent(ctx[0]), CUDA_ERROR_INVALID_CONTEXT, CTX);
  BAD(cu.CtxSetCurrent(reinterpret_cast<CUcontext>(&flags)), CUDA_ERROR_INVALID_CONTEXT, CTX);
  OK(cu.PrimaryCtxRetain(&ctx[0], 0));
  OK(cu.PrimaryCtxRetain(&ctx[0], 0));  // refcount 2: still one activation more
  OK(cu.PrimaryCtxRelease(0));
  CHECK(ctl.contexts_activated(0) == 2);
  OK(cu.PrimaryCtxGetState(0, &flags, &active));
  CHECK(active == 1);
  OK(cu.PrimaryCtxRetain(&ctx[1], 1));
  CHECK(ctx[1] != ctx[0]);
  use(0);
  CUcontext cur = nullptr;
  OK(cu.CtxGetCurrent(&cur));
  CHECK(cur == ctx[0]);
  CUdevice d = -1;
  OK(cu.CtxGetDevice(&d));
  CHECK(d == 0);
  OK(cu.CtxGetDevice13(&d, ctx[1]));
  CHECK(d == 1);
  OK(cu.CtxSynchronize13(nullptr));
  BAD(cu.CtxSynchronize13(reinterpret_cast<CUcontext>(&d)), CUDA_ERROR_INVALID_CONTEXT, CTX);
  std::thread([] {  // the current context is per thread
    CUcontext c = reinterpret_cast<CUcontext>(1);
    OK(cu.CtxGetCurrent(&c));
    CHECK(c == nullptr);
    use(1);
    CUdevice dd = -1;
    OK(cu.CtxGetDevice(&dd));
    CHECK(dd == 1);
  }).join();
  OK(cu.CtxGetDevice(&d));
  CHECK(d == 0);
  use(-1);
  OK(cu.CtxGetCurrent(&cur));
  CHECK(cur == nullptr);
  use(0);
}

void test_linear() {
  puts("cuMemAlloc / cuMemFree");
  CUdeviceptr p = 0, q = 0;
  OK(cu.MemAlloc(&p, 1000));
  CHECK(p % 512 == 0);
  memset(at(p), 0xab, 1000);
  CHECK(static_cast<unsigned char>(at(p)[999]) == 0xab);
  CHECK(usage(0).used_bytes == G && usage(0).live_allocations == 1);
  size_t f = 0, t = 0;
  OK(cu.MemGetInfo(&f, &t));
  CHECK(t == 64 * MiB && f == 62 * MiB);
  BAD(cu.MemAlloc(&q, 0), CUDA_ERROR_INVALID_VALUE, ARG);
  BAD(cu.MemFree(p + 512), CUDA_ERROR_INVALID_VALUE, FREE);
  BAD(cu.MemFree(0x1234000), CUDA_ERROR_INVALID_VALUE, FREE);
  use(1);  // the wrong context
  BAD(cu.MemFree(p), CUDA_ERROR_INVALID_VALUE, CTX);
  use(0);
  OK(cu.MemFree(p));
  BAD(cu.MemFree(p), CUDA_ERROR_INVALID_VALUE, FREE);
  OK_AS(cu.MemAlloc(&p, 64 * MiB + 1), CUDA_ERROR_OUT_OF_MEMORY);  // rule 11: not a violation
  OK(cu.MemAlloc(&p, 64 * MiB));
  OK_AS(cu.MemAlloc(&q, 1), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(usage(0).live_allocations == 1 && usage(1).used_bytes == 0);
  OK(cu.MemFree(p));
  CHECK(usage(0).used_bytes == 0);
}

void test_vmm() {
  puts("virtual memory management");
  CUdeviceptr r = 0, r2 = 0, r3 = 0;
  BAD(cu.MemAddressReserve(&r, 0, 0, 0, 0), CUDA_ERROR_INVALID_VALUE, GRAN);
  BAD(cu.MemAddressReserve(&r, MiB, 0, 0, 0), CUDA_ERROR_INVALID_VALUE, GRAN);
  BAD(cu.MemAddressReserve(&r, 4 * G, 3 * MiB, 0, 0), CUDA_ERROR_INVALID_VALUE, GRAN);
  BAD(cu.MemAddressReserve(&r, 4 * G, MiB, 0, 0), CUDA_ERROR_INVALID_VALUE, GRAN);
  BAD(cu.MemAddressReserve(&r, 4 * G, 0, 0, 1), CUDA_ERROR_INVALID_VALUE, ARG);
  OK(cu.MemAddressReserve(&r, 8 * G, 64 * MiB, 0, 0));
  CHECK(r != 0 && r % (64 * MiB) == 0);
  OK(cu.MemAddressFree(r, 8 * G));
  OK(cu.MemAddressReserve(&r2, 8 * G, 0, r, 0));  // the hint is honoured when the range is free
  CHECK(r2 == r);
  OK(cu.MemAddressReserve(&r, 4 * G, 0, 0, 0));  // r = 8 MiB reservation
  CHECK(r % G == 0 && usage(0).live_reservations == 2);

  CUmemGenericAllocationHandle h = 0, h2 = 0, h3 = 0;
  CUmemAllocationProp prop = prop_of(0);
  BAD(cu.MemCreate(&h, MiB, &prop, 0), CUDA_ERROR_INVALID_VALUE, GRAN);
  BAD(cu.MemCreate(&h, 0, &prop, 0), CUDA_ERROR_INVALID_VALUE, GRAN);
  BAD(cu.MemCreate(&h, G, &prop, 1), CUDA_ERROR_INVALID_VALUE, ARG);
  prop.location.id = 1;  // device 1 while device 0's context is current
  BAD(cu.MemCreate(&h, G, &prop, 0), CUDA_ERROR_INVALID_VALUE, CTX);
  prop.location.id = 9;
  BAD(cu.MemCreate(&h, G, &prop, 0), CUDA_ERROR_INVALID_DEVICE, ARG);
  prop.location.id = 0;
  OK_AS(cu.MemCreate(&h, 33 * G, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  OK(cu.MemCreate(&h, 2 * G, &prop, 0));
  OK(cu.MemCreate(&h2, G, &prop, 0));
  CHECK(usage(0).used_bytes == 3 * G && usage(0).live_handles == 2);

  BAD(cu.MemMap(r, 2 * G, G, h, 0), CUDA_ERROR_INVALID_VALUE, MAP);
  BAD(cu.MemMap(r, 2 * G, MiB, h, 0), CUDA_ERROR_INVALID_VALUE, GRAN);
  BAD(cu.MemMap(r + MiB, 2 * G, 0, h, 0), CUDA_ERROR_INVALID_VALUE, GRAN);
  BAD(cu.MemMap(r, 3 * G, 0, h, 0), CUDA_ERROR_INVALID_VALUE, MAP);
  BAD(cu.MemMap(r, 2 * G, 0, h, 1), CUDA_ERROR_INVALID_VALUE, MAP);
  BAD(cu.MemMap(r + 3 * G, 2 * G, 0, h, 0), CUDA_ERROR_INVALID_VALUE, MAP);  // past the reservation
  BAD(cu.MemMap(r, 2 * G, 0, 0x77, 0), CUDA_ERROR_INVALID_VALUE, RELEASED);
  OK(cu.MemMap(r, 2 * G, 0, h, 0));
  BAD(cu.MemMap(r + G, G, 0, h2, 0), CUDA_ERROR_INVALID_VALUE, MAP);  // already mapped
  CHECK(!readable(at(r)) && touching_faults(at(r)));  // no access before cuMemSetAccess

  CUmemAccessDesc acc = access_of(0);
  BAD(cu.MemSetAccess(r, 4 * G, &acc, 1), CUDA_ERROR_INVALID_VALUE, ACCESS);  // half unmapped
  BAD(cu.MemSetAccess(r, 2 * G, &acc, 0), CUDA_ERROR_INVALID_VALUE, ACCESS);
  BAD(cu.MemSetAccess(r, MiB, &acc, 1), CUDA_ERROR_INVALID_VALUE, GRAN);
  CUmemAccessDesc bad = access_of(7);
  BAD(cu.MemSetAccess(r, 2 * G, &bad, 1), CUDA_ERROR_INVALID_DEVICE, ACCESS);
  bad = access_of(0);
  bad.location.type = CU_MEM_LOCATION_TYPE_HOST;
  BAD(cu.MemSetAccess(r, 2 * G, &bad, 1), CUDA_ERROR_INVALID_VALUE, ACCESS);
  const unsigned long long sa = ctl.set_access_calls(0);
  OK(cu.MemSetAccess(r, 2 * G, &acc, 1));
  CHECK(ctl.set_access_calls(0) == sa + 1);
  CHECK(writable(at(r)) && writable(at(r + 2 * G - 1)));
  at(r)[5] = 42;

  // Two VA ranges mapped to one handle alias the same bytes.
  OK(cu.MemAddressReserve(&r3, 2 * G, 0, 0, 0));
  OK(cu.MemMap(r3, 2 * G, 0, h, 0));
  OK(cu.MemSetAccess(r3, 2 * G, &acc, 1));
  CHECK(at(r3)[5] == 42);
  at(r3)[G + 7] = 9;
  CHECK(at(r)[G + 7] == 9);
  CUmemAccessDesc none = access_of(0, CU_MEM_ACCESS_FLAGS_PROT_NONE);
  OK(cu.MemSetAccess(r3, G, &none, 1));  // a sub-range of a mapping is fine for access
  CHECK(!readable(at(r3)) && readable(at(r3 + G)));
  CUmemAccessDesc ro = access_of(0, CU_MEM_ACCESS_FLAGS_PROT_READ);
  OK(cu.MemSetAccess(r3, G, &ro, 1));
  CHECK(readable(at(r3)) && !writable(at(r3)));
  CUmemAccessDesc peer = access_of(1, CU_MEM_ACCESS_FLAGS_PROT_NONE);  // device 1's view only
  OK(cu.MemSetAccess(r3 + G, G, &peer, 1));
  CHECK(readable(at(r3 + G)));

  // cuMemcpyDtoDAsync: between device memory the context may access, ranges apart; the bytes
  // move (r3's first G is read-only now, its second G accessible only to device 1).
  at(r)[G + 100] = 77;
  OK(cu.MemcpyDtoDAsync(r + 3, r + G + 100, 1, nullptr));
  CHECK(at(r)[3] == 77);
  OK(cu.MemcpyDtoDAsync(r, r3, 64, nullptr));  // from read-only memory
  BAD(cu.MemcpyDtoDAsync(r3, r, 64, nullptr), CUDA_ERROR_INVALID_VALUE, ACCESS);  // into it
  BAD(cu.MemcpyDtoDAsync(r, r + 32, 64, nullptr), CUDA_ERROR_INVALID_VALUE, ARG);  // overlap
  BAD(cu.MemcpyDtoDAsync(r + 2 * G, r, 64, nullptr), CUDA_ERROR_INVALID_VALUE, ARG);  // unmapped
  OK(cu.MemcpyDtoDAsync(r, r, 0, nullptr));  // nothing to copy
  OK(cu.CtxSynchronize());

  // cuMemUnmap: whole mappings only; several adjacent ones at once are fine.
  BAD(cu.MemUnmap(r, G), CUDA_ERROR_INVALID_VALUE, UNMAP);
  BAD(cu.MemUnmap(r + G, G), CUDA_ERROR_INVALID_VALUE, UNMAP);
  BAD(cu.MemUnmap(r + 2 * G, G), CUDA_ERROR_INVALID_VALUE, UNMAP);  // reserved, not mapped
  BAD(cu.MemUnmap(r, MiB), CUDA_ERROR_INVALID_VALUE, GRAN);
  OK(cu.MemMap(r + 3 * G, G, 0, h2, 0));
  BAD(cu.MemUnmap(r, 4 * G), CUDA_ERROR_INVALID_VALUE, UNMAP);  // a hole at r + 2G
  OK(cu.MemCreate(&h3, G, &prop, 0));
  OK(cu.MemMap(r + 2 * G, G, 0, h3, 0));
  CHECK(usage(0).live_mappings == 4);
  BAD(cu.MemAddressFree(r, 4 * G), CUDA_ERROR_INVALID_VALUE, AFREE);  // still mapped
  OK(cu.MemUnmap(r, 4 * G));  // three whole adjacent mappings
  CHECK(usage(0).live_mappings == 1 && !readable(at(r)));
  OK(cu.MemMap(r, 2 * G, 0, h, 0));  // the range is a reservation again
  CHECK(!readable(at(r)));
  OK(cu.MemSetAccess(r, 2 * G, &acc, 1));
  CHECK(at(r)[5] == 42);
  OK(cu.MemUnmap(r, 2 * G));

  // cuMemRelease: bytes come back once released and unmapped everywhere.
  const unsigned long long used = usage(0).used_bytes;
  OK(cu.MemRelease(h));  // still mapped at r3
  CHECK(usage(0).used_bytes == used && usage(0).live_handles == 2);
  BAD(cu.MemRelease(h), CUDA_ERROR_INVALID_VALUE, RELEASED);
  BAD(cu.MemMap(r, 2 * G, 0, h, 0), CUDA_ERROR_INVALID_VALUE, RELEASED);
  BAD(cu.MemRelease(0x1234), CUDA_ERROR_INVALID_VALUE, RELEASED);
  CHECK(at(r3)[G + 7] == 9);
  OK(cu.MemUnmap(r3, 2 * G));
  CHECK(usage(0).used_bytes == used - 2 * G);
  OK(cu.MemRelease(h2));
  OK(cu.MemRelease(h3));
  CHECK(usage(0).used_bytes == 0 && usage(0).live_handles == 0);

  BAD(cu.MemAddressFree(r, 2 * G), CUDA_ERROR_INVALID_VALUE, AFREE);  // wrong size
  BAD(cu.MemAddressFree(r + G, 2 * G), CUDA_ERROR_INVALID_VALUE, AFREE);  // not its start
  OK(cu.MemAddressFree(r, 4 * G));
  BAD(cu.MemAddressFree(r, 4 * G), CUDA_ERROR_INVALID_VALUE, AFREE);
  OK(cu.MemAddressFree(r2, 8 * G));
  OK(cu.MemAddressFree(r3, 2 * G));

  // Capacity counts cuMemAlloc and handles together.
  CUdeviceptr p;
  OK(cu.MemAlloc(&p, 60 * MiB));
  OK_AS(cu.MemCreate(&h, 3 * G, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  OK(cu.MemCreate(&h, 2 * G, &prop, 0));
  CUdeviceptr q;
  OK_AS(cu.MemAlloc(&q, 1), CUDA_ERROR_OUT_OF_MEMORY);
  OK(cu.MemRelease(h));
  OK(cu.MemFree(p));
  CHECK(usage(0).used_bytes == 0 && usage(0).live_reservations == 0 && usage(0).live_mappings == 0);
}

void test_streams_events() {
  puts("streams and events");
  CUstream s = nullptr, n = nullptr, s2 = nullptr, s1 = nullptr;
  BAD(cu.StreamCreate(&s, 4), CUDA_ERROR_INVALID_VALUE, ARG);
  OK(cu.StreamCreate(&s, CU_STREAM_DEFAULT));
  OK(cu.StreamCreate(&n, CU_STREAM_NON_BLOCKING));
  CHECK(s != nullptr && n != nullptr && s != n && usage(0).live_streams == 2);
  CUevent e = nullptr, e1 = nullptr, e2 = nullptr;
  BAD(cu.EventCreate(&e, CU_EVENT_INTERPROCESS), CUDA_ERROR_INVALID_VALUE, ARG);
  OK(cu.EventCreate(&e, CU_EVENT_DISABLE_TIMING));
  OK(cu.EventQuery(e));  // never recorded: an empty set of work
  use(-1);
  BAD(cu.EventRecord(e, nullptr), CUDA_ERROR_INVALID_CONTEXT, CTX);  // NULL stream needs a context
  OK(cu.EventRecord(e, s));  // an explicit stream does not
  use(0);
  OK(cu.EventRecord(e, s));
  OK(cu.EventQuery(e));
  OK(cu.StreamQuery(s));

  const unsigned long long forced = ctl.forced_completions();
  CHECK(ctl.hold_stream(s) == 0);
  OK_AS(cu.StreamQuery(s), CUDA_ERROR_NOT_READY);
  OK(cu.EventRecord(e, s));
  OK_AS(cu.EventQuery(e), CUDA_ERROR_NOT_READY);
  CHECK(ctl.release_stream(s) == 0);
  OK(cu.EventQuery(e));
  OK(cu.StreamQuery(s));
  CHECK(ctl.hold_stream(s) == 0);
  OK(cu.EventRecord(e, s));
  OK(cu.EventSynchronize(e));  // the host waited: forced completion
  CHECK(ctl.forced_completions() == forced + 1);
  OK(cu.EventQuery(e));
  OK(cu.EventRecord(e, s));  // re-armed (the stream is still held)
  OK_AS(cu.EventQuery(e), CUDA_ERROR_NOT_READY);
  OK(cu.StreamSynchronize(s));
  CHECK(ctl.forced_completions() == forced + 2);
  OK(cu.EventQuery(e));
  OK(cu.EventRecord(e, s));
  OK(cu.CtxSynchronize());
  CHECK(ctl.forced_completions() == forced + 3);
  OK(cu.EventQuery(e));
  OK(cu.EventRecord(e, s));
  OK(cu.EventRecord(e, n));  // re-recording overwrites the previous state
  OK(cu.EventQuery(e));
  OK(cu.EventRecord(e, nullptr));  // the legacy stream waits for blocking stream s
  OK_AS(cu.EventQuery(e), CUDA_ERROR_NOT_READY);
  CHECK(ctl.release_stream(s) == 0);
  OK(cu.EventQuery(e));
  OK(cu.StreamSynchronize(s));
  CHECK(ctl.forced_completions() == forced + 3);
  CHECK(ctl.hold_stream(nullptr) == 0);  // the current context's legacy stream
  OK(cu.EventRecord(e, CU_STREAM_LEGACY));
  OK_AS(cu.EventQuery(e), CUDA_ERROR_NOT_READY);
  OK_AS(cu.StreamQuery(nullptr), CUDA_ERROR_NOT_READY);
  CHECK(ctl.release_stream(CU_STREAM_LEGACY) == 0);
  OK(cu.EventQuery(e));

  // Streams and events of another context.
  use(1);
  OK(cu.EventCreate(&e1, 0));
  OK(cu.StreamCreate(&s1, 0));
  OK(cu.EventRecord(e1, nullptr));
  OK(cu.StreamSynchronize(s));  // another context's stream: allowed
  BAD(cu.EventRecord(e, s1), CUDA_ERROR_INVALID_HANDLE, HANDLE);
  use(0);
  BAD(cu.EventRecord(e1, s), CUDA_ERROR_INVALID_HANDLE, HANDLE);
  BAD(cu.EventRecord(e1, nullptr), CUDA_ERROR_INVALID_HANDLE, HANDLE);
  OK(cu.EventQuery(e1));
  OK(cu.StreamQuery(s1));

  // Destroyed and unknown handles.
  CUstream bogus = reinterpret_cast<CUstream>(0x5a0000000008ull);
  BAD(cu.StreamQuery(bogus), CUDA_ERROR_INVALID_HANDLE, HANDLE);
  BAD(cu.EventQuery(reinterpret_cast<CUevent>(&bogus)), CUDA_ERROR_INVALID_HANDLE, HANDLE);
  BAD(cu.StreamDestroy(nullptr), CUDA_ERROR_INVALID_HANDLE, HANDLE);
  OK(cu.StreamCreate(&s2, 0));
  OK(cu.EventCreate(&e2, 0));
  CHECK(ctl.hold_stream(s2) == 0);
  OK(cu.EventRecord(e2, s2));
  OK(cu.StreamDestroy(s2));  // work still pending after destroy
  BAD(cu.StreamQuery(s2), CUDA_ERROR_INVALID_HANDLE, HANDLE);
  BAD(cu.StreamDestroy(s2), CUDA_ERROR_INVALID_HANDLE, HANDLE);
  BAD(cu.EventRecord(e2, s2), CUDA_ERROR_INVALID_HANDLE, HANDLE);
  CHECK(ctl.hold_stream(s2) == -1);
  OK_AS(cu.EventQuery(e2), CUDA_ERROR_NOT_READY);
  CHECK(ctl.release_stream(s2) == 0);
  OK(cu.EventQuery(e2));
  OK(cu.EventDestroy(e2));
  BAD(cu.EventDestroy(e2), CUDA_ERROR_INVALID_HANDLE, HANDLE);
  CHECK(usage(0).live_events == 1 && usage(1).live_events == 1 && usage(1).live_streams == 1);

  // The last release of a primary context resets it: its streams and events are gone.
  OK(cu.PrimaryCtxRelease(1));
  CHECK(usage(1).live_streams == 0 && usage(1).live_events == 0);
  BAD(cu.EventQuery(e1), CUDA_ERROR_INVALID_HANDLE, HANDLE);
  OK(cu.PrimaryCtxRetain(&ctx[1], 1));
  CHECK(ctl.contexts_activated(1) == 2);
  OK(cu.EventDestroy(e));
  OK(cu.StreamDestroy(s));
  OK(cu.StreamDestroy(n));
  CHECK(usage(0).live_streams == 0 && usage(0).live_events == 0);
}

void test_capture() {
  puts("stream capture");
  CUstream s, n;
  CUevent e, e2;
  OK(cu.StreamCreate(&s, 0));
  OK(cu.StreamCreate(&n, CU_STREAM_NON_BLOCKING));
  OK(cu.EventCreate(&e, 0));
  OK(cu.EventCreate(&e2, 0));
  CUgraph g = nullptr;
  CUstreamCaptureStatus cs;
  CUdeviceptr p = 0, r = 0;
  CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
  OK(cu.ThreadExchangeStreamCaptureMode(&m));
  CHECK(m == CU_STREAM_CAPTURE_MODE_GLOBAL);  // the default; now restore it
  OK(cu.ThreadExchangeStreamCaptureMode(&m));
  m = static_cast<CUstreamCaptureMode>(3);  // no such mode
  BAD(cu.ThreadExchangeStreamCaptureMode(&m), CUDA_ERROR_INVALID_VALUE, ARG);

  BAD(cu.StreamBeginCapture(nullptr, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CAPTURE);
  BAD(cu.StreamBeginCapture(s, static_cast<CUstreamCaptureMode>(3)), CUDA_ERROR_INVALID_VALUE, ARG);
  BAD(cu.StreamEndCapture(s, &g), CUDA_ERROR_ILLEGAL_STATE, CAPTURE);

  // A clean capture; VMM calls are fine during it, the event becomes "captured".
  OK(cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  BAD(cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_ILLEGAL_STATE, CAPTURE);
  OK(cu.StreamIsCapturing(s, &cs));
  CHECK(cs == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  OK(cu.MemAddressReserve(&r, G, 0, 0, 0));
  OK(cu.MemAddressFree(r, G));
  OK(cu.EventRecord(e, s));
  OK(cu.EventRecord(e2, n));  // another stream, not capturing
  OK(cu.StreamEndCapture(s, &g));
  CHECK(g != nullptr);
  OK(cu.StreamIsCapturing(s, &cs));
  CHECK(cs == CU_STREAM_CAPTURE_STATUS_NONE);
  BAD(cu.EventQuery(e), CUDA_ERROR_CAPTURED_EVENT, CAPTURE);
  BAD(cu.EventSynchronize(e), CUDA_ERROR_CAPTURED_EVENT, CAPTURE);
  OK(cu.EventRecord(e, n));  // recorded outside a capture again
  OK(cu.EventQuery(e));

  // Potentially unsafe calls from the capturing thread invalidate the capture.
  OK(cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  BAD(cu.MemAlloc(&p, 4096), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CAPTURE);
  OK(cu.StreamIsCapturing(s, &cs));
  CHECK(cs == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  OK_AS(cu.EventRecord(e2, s), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  OK_AS(cu.StreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CHECK(g == nullptr);
  OK(cu.StreamIsCapturing(s, &cs));
  CHECK(cs == CU_STREAM_CAPTURE_STATUS_NONE);
  struct { const char* what; CUresult (*call)(CUstream, CUevent); } unsafe[] = {
      {"cuMemFree", [](CUstream, CUevent) { return cu.MemFree(0x1000); }},
      {"cuCtxSynchronize", [](CUstream, CUevent) { return cu.CtxSynchronize(); }},
      {"cuEventQuery", [](CUstream, CUevent ev) { return cu.EventQuery(ev); }},
      {"cuEventSynchronize", [](CUstream, CUevent ev) { return cu.EventSynchronize(ev); }},
      {"cuStreamQuery", [](CUstream st, CUevent) { return cu.StreamQuery(st); }},
      {"cuStreamSynchronize", [](CUstream st, CUevent) { return cu.StreamSynchronize(st); }},
  };
  for (auto& u : unsafe) {
    OK(cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    BAD(u.call(n, e2), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CAPTURE);
    if (strstr(ctl.last_violation(), u.what) == nullptr) fprintf(stderr, "  (while testing %s)\n", u.what);
    OK_AS(cu.StreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  }
  // Independently of mode: waiting on the capturing stream itself, or on a captured event.
  m = CU_STREAM_CAPTURE_MODE_RELAXED;
  OK(cu.ThreadExchangeStreamCaptureMode(&m));
  OK(cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  OK(cu.MemAlloc(&p, 4096));  // relaxed thread: allowed
  OK(cu.MemFree(p));
  BAD(cu.StreamQuery(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CAPTURE);
  OK_AS(cu.StreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  OK(cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  OK(cu.EventRecord(e, s));
  BAD(cu.EventQuery(e), CUDA_ERROR_CAPTURED_EVENT, CAPTURE);
  OK_AS(cu.StreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  OK(cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  BAD(cu.StreamSynchronize(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CAPTURE);
  OK_AS(cu.StreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  OK(cu.ThreadExchangeStreamCaptureMode(&m));  // back to GLOBAL

  // Legacy-stream use while a blocking stream captures: an implicit dependency.
  OK(cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  BAD(cu.StreamIsCapturing(nullptr, &cs), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, CAPTURE);
  OK(cu.StreamIsCapturing(s, &cs));
  CHECK(cs == CU_STREAM_CAPTURE_STATUS_ACTIVE);  // a query does not invalidate
  BAD(cu.EventRecord(e2, nullptr), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, CAPTURE);
  OK(cu.StreamIsCapturing(s, &cs));
  CHECK(cs == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  OK_AS(cu.StreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  OK(cu.StreamBeginCapture(n, CU_STREAM_CAPTURE_MODE_RELAXED));  // non-blocking: no conflict
  OK(cu.EventRecord(e2, nullptr));
  OK(cu.StreamEndCapture(n, &g));

  // Other threads: GLOBAL captures prohibit GLOBAL-mode threads; THREAD_LOCAL/RELAXED do not.
  auto other = [](CUstreamCaptureMode mode) {
    CUresult r = CUDA_SUCCESS;
    std::thread([&] {
      use(0);
      CUstreamCaptureMode mm = mode;
      OK(cu.ThreadExchangeStreamCaptureMode(&mm));
      CUdeviceptr q = 0;
      r = cu.MemAlloc(&q, 4096);
      if (r == CUDA_SUCCESS) OK(cu.MemFree(q));
    }).join();
    return r;
  };
  OK(cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  OK(other(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  OK(other(CU_STREAM_CAPTURE_MODE_RELAXED));
  BAD(other(CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CAPTURE);
  OK_AS(cu.StreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  OK(cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  OK(other(CU_STREAM_CAPTURE_MODE_GLOBAL));
  OK(cu.StreamEndCapture(s, &g));
  OK(cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  OK(cu.MemAlloc(&p, 4096));  // own capture is RELAXED: allowed even in GLOBAL mode
  OK(cu.MemFree(p));
  OK(cu.StreamEndCapture(s, &g));

  // cuStreamEndCapture from another thread.
  OK(cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  std::thread([&] { BAD(cu.StreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, CAPTURE); }).join();
  OK(cu.StreamEndCapture(s, &g));
  OK(cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  std::thread([&] { OK(cu.StreamEndCapture(s, &g)); }).join();
  CHECK(g != nullptr);

  OK(cu.EventDestroy(e));
  OK(cu.EventDestroy(e2));
  OK(cu.StreamDestroy(s));
  OK(cu.StreamDestroy(n));
}

void test_host_memory() {
  puts("pinned host memory and asynchronous host copies");
  void* hp = nullptr;
  void* hq = nullptr;
  BAD(cu.MemHostAlloc(&hp, 0, 0), CUDA_ERROR_INVALID_VALUE, ARG);
  BAD(cu.MemHostAlloc(&hp, 4096, 0x8), CUDA_ERROR_INVALID_VALUE, ARG);  // no such flag
  BAD(cu.MemHostAlloc(nullptr, 4096, 0), CUDA_ERROR_INVALID_VALUE, ARG);
  OK(cu.MemHostAlloc(&hp, 3 * G, 0));  // host memory: beyond no device's capacity matters
  char* const host = static_cast<char*>(hp);
  CHECK(host != nullptr && writable(host) && writable(host + 3 * G - 1));
  CHECK(usage(0).live_host_allocations == 1 && usage(0).host_bytes == 3 * G && usage(0).used_bytes == 0);
  CHECK(usage(1).live_host_allocations == 0);
  OK(cu.MemHostAlloc(&hq, 100, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
  CHECK(usage(0).live_host_allocations == 2 && usage(0).host_bytes == 3 * G + 100);

  // Device memory: [r, r + G) mapped read-write, [r + G, r + 2G) only reserved.
  CUdeviceptr r = 0;
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp prop = prop_of(0);
  CUmemAccessDesc acc = access_of(0), ro = access_of(0, CU_MEM_ACCESS_FLAGS_PROT_READ);
  OK(cu.MemAddressReserve(&r, 2 * G, 0, 0, 0));
  OK(cu.MemCreate(&h, G, &prop, 0));
  OK(cu.MemMap(r, G, 0, h, 0));
  OK(cu.MemSetAccess(r, G, &acc, 1));
  for (size_t i = 0; i < G; i += 4099) at(r)[i] = static_cast<char>(i * 31 + 7);
  CUstream s, s1, bogus = reinterpret_cast<CUstream>(0x5a0000000008ull);
  OK(cu.StreamCreate(&s, 0));

  // Out through the stream in two chunks, back in on the legacy stream; the bytes move.
  OK(cu.MemcpyDtoHAsync(host, r, G / 2, s));
  OK(cu.MemcpyDtoHAsync(host + G / 2, r + G / 2, G / 2, s));
  OK(cu.StreamSynchronize(s));
  CHECK(memcmp(host, at(r), G) == 0);
  for (size_t i = 0; i < G; i += 4099) host[G + i] = static_cast<char>(i * 31 + 9);
  OK(cu.MemcpyHtoDAsync(r, host + G, G, nullptr));
  OK(cu.StreamSynchronize(nullptr));
  CHECK(memcmp(at(r), host + G, G) == 0);
  OK(cu.MemcpyDtoHAsync(nullptr, r, 0, s));  // nothing to copy
  OK(cu.MemcpyHtoDAsync(r + G, nullptr, 0, CU_STREAM_LEGACY));

  // The device side: memory of the current context's device the copy may access.
  BAD(cu.MemcpyDtoHAsync(host, r + G, 64, s), CUDA_ERROR_INVALID_VALUE, ARG);  // reserved, unmapped
  BAD(cu.MemcpyDtoHAsync(host, r + G - 32, 64, s), CUDA_ERROR_INVALID_VALUE, ARG);  // past the mapping
  BAD(cu.MemcpyHtoDAsync(r + G, host, 64, s), CUDA_ERROR_INVALID_VALUE, ARG);
  BAD(cu.MemcpyDtoHAsync(host, 0x1234000, 64, s), CUDA_ERROR_INVALID_VALUE, ARG);  // not device memory
  BAD(cu.MemcpyDtoHAsync(nullptr, r, 64, s), CUDA_ERROR_INVALID_VALUE, ARG);
  BAD(cu.MemcpyHtoDAsync(r, nullptr, 64, s), CUDA_ERROR_INVALID_VALUE, ARG);
  OK(cu.MemSetAccess(r, G, &ro, 1));
  OK(cu.MemcpyDtoHAsync(host, r, 64, s));  // from read-only memory
  BAD(cu.MemcpyHtoDAsync(r, host, 64, s), CUDA_ERROR_INVALID_VALUE, ACCESS);  // into it
  OK(cu.MemSetAccess(r, G, &acc, 1));

  // The stream: live, and of the current context.
  BAD(cu.MemcpyDtoHAsync(host, r, 64, bogus), CUDA_ERROR_INVALID_HANDLE, HANDLE);
  use(1);
  OK(cu.StreamCreate(&s1, 0));
  BAD(cu.MemcpyDtoHAsync(host, r, 64, s), CUDA_ERROR_INVALID_HANDLE, HANDLE);  // device 1's context
  use(0);
  BAD(cu.MemcpyHtoDAsync(r, host, 64, s1), CUDA_ERROR_INVALID_HANDLE, HANDLE);
  // Queued work: on a held stream the copy is in flight until the stream is synchronized.
  const unsigned long long forced = ctl.forced_completions();
  CHECK(ctl.hold_stream(s) == 0);
  OK(cu.MemcpyDtoHAsync(host, r, 64, s));
  OK_AS(cu.StreamQuery(s), CUDA_ERROR_NOT_READY);
  OK(cu.StreamSynchronize(s));
  CHECK(ctl.forced_completions() == forced + 1);
  CHECK(ctl.release_stream(s) == 0);
  // Capture: no copies into a capture, none on the legacy stream while a blocking stream captures.
  CUgraph g = nullptr;
  OK(cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  BAD(cu.MemcpyDtoHAsync(host, r, 64, s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CAPTURE);
  OK(cu.StreamEndCapture(s, &g));  // as for cuMemcpyDtoDAsync: refused, the capture goes on
  OK(cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  BAD(cu.MemcpyHtoDAsync(r, host, 64, nullptr), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, CAPTURE);
  OK_AS(cu.StreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

  // Injected faults: the call returns the result and does nothing.
  host[0] = 1;
  at(r)[0] = 2;
  CHECK(ctl.fail("cuMemHostAlloc", 1, CUDA_ERROR_OUT_OF_MEMORY) == 0);
  CHECK(ctl.fail("cuMemcpyDtoHAsync", 1, CUDA_ERROR_UNKNOWN) == 0);
  CHECK(ctl.fail("cuMemcpyHtoDAsync", 2, CUDA_ERROR_INVALID_VALUE) == 0);
  CHECK(ctl.fail("cuMemFreeHost", 1, CUDA_ERROR_UNKNOWN) == 0);
  const unsigned long long allocs = ctl.calls("cuMemHostAlloc");
  void* hr = nullptr;
  OK_AS(cu.MemHostAlloc(&hr, 4096, 0), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(hr == nullptr && usage(0).live_host_allocations == 2 && ctl.calls("cuMemHostAlloc") == allocs + 1);
  OK_AS(cu.MemcpyDtoHAsync(host, r, 1, s), CUDA_ERROR_UNKNOWN);
  CHECK(host[0] == 1);
  OK(cu.MemcpyHtoDAsync(r + 1, host, 1, s));  // the first call; the second fails
  OK_AS(cu.MemcpyHtoDAsync(r, host, 1, s), CUDA_ERROR_INVALID_VALUE);
  CHECK(at(r)[0] == 2 && at(r)[1] == 1);
  OK_AS(cu.MemFreeHost(hq), CUDA_ERROR_UNKNOWN);
  CHECK(usage(0).live_host_allocations == 2);
  OK(cu.MemcpyDtoHAsync(host, r, 1, s));  // faults fire once
  CHECK(host[0] == 2);

  // cuMemFreeHost: pointers of cuMemHostAlloc only, in its context unless PORTABLE.
  char local[16];
  BAD(cu.MemFreeHost(host + 4096), CUDA_ERROR_INVALID_VALUE, FREE);  // interior
  BAD(cu.MemFreeHost(local), CUDA_ERROR_INVALID_VALUE, FREE);
  BAD(cu.MemFreeHost(nullptr), CUDA_ERROR_INVALID_VALUE, FREE);
  use(1);
  BAD(cu.MemFreeHost(hp), CUDA_ERROR_INVALID_VALUE, CTX);  // device 0's, not portable
  OK(cu.MemFreeHost(hq));  // portable: any context
  use(0);
  OK(cu.MemFreeHost(hp));
  BAD(cu.MemFreeHost(hp), CUDA_ERROR_INVALID_VALUE, FREE);  // twice
  CHECK(usage(0).live_host_allocations == 0 && usage(0).host_bytes == 0);

  // The context's last release frees its host memory (as its cuMemAlloc memory).
  use(1);
  OK(cu.MemHostAlloc(&hq, 4096, 0));
  CHECK(usage(1).live_host_allocations == 1 && usage(1).host_bytes == 4096);
  use(0);
  OK(cu.PrimaryCtxRelease(1));
  CHECK(usage(1).live_host_allocations == 0 && usage(1).host_bytes == 0);
  OK(cu.PrimaryCtxRetain(&ctx[1], 1));

  OK(cu.StreamDestroy(s));
  OK(cu.MemUnmap(r, G));
  OK(cu.MemRelease(h));
  OK(cu.MemAddressFree(r, 2 * G));
}

void test_threads() {
  puts("threads");
  auto worker = [](int d) {
    use(d);
    CUstream st;
    CUevent ev;
    OK(cu.StreamCreate(&st, 0));
    OK(cu.EventCreate(&ev, 0));
    CUmemAllocationProp prop = prop_of(d);
    CUmemAccessDesc acc = access_of(d);
    for (int i = 0; i < 100; ++i) {
      CUdeviceptr p = 0, r = 0;
      CUmemGenericAllocationHandle h = 0;
      OK(cu.MemAlloc(&p, 4096));
      at(p)[0] = 1;
      OK(cu.MemAddressReserve(&r, 2 * G, 0, 0, 0));
      OK(cu.MemCreate(&h, G, &prop, 0));
      OK(cu.MemMap(r + G, G, 0, h, 0));
      OK(cu.MemSetAccess(r + G, G, &acc, 1));
      at(r + G)[i] = static_cast<char>(i);
      OK(cu.EventRecord(ev, st));
      OK(cu.EventQuery(ev));
      OK(cu.MemUnmap(r + G, G));
      OK(cu.MemRelease(h));
      OK(cu.MemAddressFree(r, 2 * G));
      OK(cu.MemFree(p));
    }
    OK(cu.StreamSynchronize(st));
    OK(cu.EventDestroy(ev));
    OK(cu.StreamDestroy(st));
  };
  std::thread threads[4] = {std::thread(worker, 0), std::thread(worker, 1), std::thread(worker, 0),
                            std::thread(worker, 1)};
  for (std::thread& t : threads) t.join();
  for (int d = 0; d < 2; ++d) {
    const stitch_fake_cuda_usage u = usage(d);
    CHECK(u.used_bytes == 0 && u.live_allocations == 0 && u.live_handles == 0 && u.live_reservations == 0 &&
          u.live_mappings == 0 && u.live_streams == 0 && u.live_events == 0);
  }
}

void test_faults_and_reset() {
  puts("fault injection, counters, reset");
  CHECK(ctl.fail("cuNoSuchThing", 1, CUDA_ERROR_UNKNOWN) == -1);
  CHECK(ctl.fail("cuMemMap", 0, CUDA_ERROR_UNKNOWN) == -1);
  CUdeviceptr r;
  CUmemGenericAllocationHandle h;
  CUmemAllocationProp prop = prop_of(0);
  OK(cu.MemAddressReserve(&r, 2 * G, 0, 0, 0));
  OK(cu.MemCreate(&h, G, &prop, 0));
  const unsigned long long calls = ctl.calls("cuMemMap");
  CHECK(ctl.fail("cuMemMap", 2, CUDA_ERROR_OUT_OF_MEMORY) == 0);
  CHECK(ctl.fail("cuMemAlloc", 1, CUDA_ERROR_NOT_READY) == 0);
  OK(cu.MemMap(r, G, 0, h, 0));
  OK_AS(cu.MemMap(r + G, G, 0, h, 0), CUDA_ERROR_OUT_OF_MEMORY);  // injected: nothing done
  CHECK(usage(0).live_mappings == 1);
  OK(cu.MemMap(r + G, G, 0, h, 0));
  CHECK(ctl.calls("cuMemMap") == calls + 3 && usage(0).live_mappings == 2);
  ctl.clear_faults();
  CUdeviceptr p;
  OK(cu.MemAlloc(&p, 1));  // the cuMemAlloc fault was cleared
  OK(cu.MemFree(p));
  CHECK(ctl.calls("cuGetProcAddress") > 40);

  ctl.reset();  // frees everything, uninitialised again
  CHECK(ctl.violations() == 0 && ctl.calls("cuMemMap") == 0 && ctl.contexts_activated(0) == 0);
  CHECK(ctl.last_violation()[0] == '\0' && ctl.get_usage(0, nullptr) == -1);
  int n;
  BAD(cu.DeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED, INIT);
  setenv("STITCH_FAKE_CUDA_FAIL", "cuMemCreate:1:2,bogus,cuMemRelease:2:999", 1);
  setenv("STITCH_FAKE_CUDA_DEVICES", "1", 1);
  CHECK(ctl.set_capacity(0, 8 * MiB) == 0);
  OK(cu.Init(0));
  unsetenv("STITCH_FAKE_CUDA_FAIL");
  OK(cu.DeviceGetCount(&n));
  CHECK(n == 1);
  size_t total;
  OK(cu.DeviceTotalMem(&total, 0));
  CHECK(total == 8 * MiB);
  CUcontext cur = reinterpret_cast<CUcontext>(1);
  OK(cu.CtxGetCurrent(&cur));
  CHECK(cur == nullptr);  // the thread's old current context is forgotten
  OK(cu.PrimaryCtxRetain(&ctx[0], 0));
  use(0);
  OK_AS(cu.MemCreate(&h, G, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);  // from STITCH_FAKE_CUDA_FAIL
  OK(cu.MemCreate(&h, G, &prop, 0));
  OK(cu.MemRelease(h));
  CUmemGenericAllocationHandle h2;
  OK(cu.MemCreate(&h2, G, &prop, 0));
  OK_AS(cu.MemRelease(h2), static_cast<CUresult>(999));
  OK(cu.MemRelease(h2));
  CHECK(ctl.set_capacity(3, 1) == -1);
  CHECK(ctl.set_capacity(0, 64 * MiB) == 0);
  ctl.reset();
}

void test_no_vmm() {
  puts("STITCH_FAKE_CUDA_NO_VMM");
  setenv("STITCH_FAKE_CUDA_NO_VMM", "1", 1);
  OK(cu.Init(0));
  unsetenv("STITCH_FAKE_CUDA_NO_VMM");
  int v = 1;
  OK(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
  CHECK(v == 0);
  size_t g;
  CUmemAllocationProp prop = prop_of(0);
  BAD(cu.MemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_ERROR_NOT_SUPPORTED, NOVMM);
  OK(cu.PrimaryCtxRetain(&ctx[0], 0));
  use(0);
  CUmemGenericAllocationHandle h;
  BAD(cu.MemCreate(&h, G, &prop, 0), CUDA_ERROR_NOT_SUPPORTED, NOVMM);
  CUdeviceptr p;
  OK(cu.MemAlloc(&p, 100));
  OK(cu.MemFree(p));
  ctl.reset();
}

// Rule 14 and the IPC model: an export needs the handle type requested at creation; descriptors
// and fabric handles import to the same bytes; a legacy handle opens in another process only.
void test_ipc() {
  puts("IPC");
  setenv("STITCH_FAKE_CUDA_FABRIC", "1", 1);
  OK(cu.Init(0));
  unsetenv("STITCH_FAKE_CUDA_FABRIC");
  int v = 0;
  OK(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 0));
  CHECK(v == 1);
  OK(cu.PrimaryCtxRetain(&ctx[0], 0));
  use(0);
  CUmemAllocationProp plain = prop_of(0), shareable = prop_of(0);
  shareable.requestedHandleTypes =
      static_cast<CUmemAllocationHandleType>(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_FABRIC);
  CUmemGenericAllocationHandle none, both, imported;
  OK(cu.MemCreate(&none, G, &plain, 0));
  OK(cu.MemCreate(&both, G, &shareable, 0));
  int fd = -1;
  BAD(cu.MemExportToShareableHandle(&fd, none, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), CUDA_ERROR_INVALID_VALUE, IPC);
  BAD(cu.MemExportToShareableHandle(&fd, both, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1), CUDA_ERROR_INVALID_VALUE, ARG);
  OK(cu.MemExportToShareableHandle(&fd, both, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  CHECK(fd >= 0);
  // Two mappings, one of the exporter's handle and one of the imported: the same bytes.
  CUdeviceptr va;
  OK(cu.MemAddressReserve(&va, 2 * G, 0, 0, 0));
  OK(cu.MemImportFromShareableHandle(&imported, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  close(fd);
  OK(cu.MemMap(va, G, 0, both, 0));
  OK(cu.MemMap(va + G, G, 0, imported, 0));
  CUmemAccessDesc rw = access_of(0);
  OK(cu.MemSetAccess(va, 2 * G, &rw, 1));
  at(va)[5] = 42;
  CHECK(at(va + G)[5] == 42);
  CHECK(usage(0).used_bytes == 2 * G);  // the import charges nothing
  CUmemFabricHandle fabric{};
  OK(cu.MemExportToShareableHandle(&fabric, both, CU_MEM_HANDLE_TYPE_FABRIC, 0));
  CUmemGenericAllocationHandle again;
  OK(cu.MemImportFromShareableHandle(&again, &fabric, CU_MEM_HANDLE_TYPE_FABRIC));
  OK(cu.MemRelease(again));
  int bogus = open("/dev/null", O_RDONLY);
  BAD(cu.MemImportFromShareableHandle(&again, reinterpret_cast<void*>(static_cast<uintptr_t>(bogus)),
                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), CUDA_ERROR_INVALID_VALUE, IPC);
  close(bogus);
  OK(cu.MemUnmap(va, 2 * G));
  OK(cu.MemAddressFree(va, 2 * G));
  OK(cu.MemRelease(imported));
  OK(cu.MemRelease(both));
  OK(cu.MemRelease(none));

  // Legacy handles: of a cuMemAlloc base only; another process opens them (this one may not).
  CUdeviceptr p;
  OK(cu.MemAlloc(&p, 3 * MiB));
  CUdeviceptr base = 0;
  size_t size = 0;
  OK(cu.MemGetAddressRange(&base, &size, p + 12345));
  CHECK(base == p && size == 3 * MiB);
  CUipcMemHandle h;
  BAD(cu.IpcGetMemHandle(&h, p + 512), CUDA_ERROR_INVALID_VALUE, IPC);
  OK(cu.IpcGetMemHandle(&h, p));
  CUdeviceptr self;
  BAD(cu.IpcOpenMemHandle(&self, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_ERROR_INVALID_CONTEXT, IPC);
  memset(at(p), 7, 3 * MiB);
  const pid_t child = fork();
  if (child == 0) {
    CUdeviceptr q = 0, q2 = 0;
    int rc = cu.IpcOpenMemHandle(&q, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS ? 0 : 1;
    if (rc == 0 && (at(q)[0] != 7 || at(q)[3 * MiB - 1] != 7)) rc = 2;
    if (rc == 0 && (cu.IpcOpenMemHandle(&q2, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != CUDA_SUCCESS || q2 != q)) rc = 3;
    if (rc == 0) at(q)[100] = 9;
    if (rc == 0 && (cu.IpcCloseMemHandle(q) != CUDA_SUCCESS || cu.IpcCloseMemHandle(q) != CUDA_SUCCESS)) rc = 4;
    if (rc == 0 && cu.IpcCloseMemHandle(q) == CUDA_SUCCESS) rc = 5;  // closed twice already
    _exit(rc);
  }
  int status = 0;
  waitpid(child, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK(at(p)[100] == 9);
  OK(cu.MemFree(p));
  ctl.reset();
}

// Host memory for mapping: CU_MEM_LOCATION_TYPE_HOST_NUMA node 0, charged to no device, mapped
// into device ranges; the location's rules.
void test_host_numa() {
  puts("HOST_NUMA");
  OK(cu.Init(0));
  int v = 0;
  OK(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
  CHECK(v == 1);
  OK(cu.PrimaryCtxRetain(&ctx[0], 0));
  use(0);
  CUmemAllocationProp host{};
  host.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  host.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  host.location.id = 0;
  size_t g = 0;
  OK(cu.MemGetAllocationGranularity(&g, &host, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CHECK(g == G);
  const unsigned long long used = usage(0).used_bytes;
  CUmemGenericAllocationHandle h;
  OK(cu.MemCreate(&h, G, &host, 0));
  CHECK(usage(0).used_bytes == used);  // host memory
  CUmemAllocationProp bad = host;
  bad.location.id = 1;
  BAD(cu.MemCreate(&h, G, &bad, 0), CUDA_ERROR_INVALID_VALUE, ARG);
  bad.location.id = 0;
  bad.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
  BAD(cu.MemCreate(&h, G, &bad, 0), CUDA_ERROR_INVALID_VALUE, ARG);
  CUmemGenericAllocationHandle odd;
  BAD(cu.MemCreate(&odd, G / 2, &host, 0), CUDA_ERROR_INVALID_VALUE, GRAN);
  CUdeviceptr va;
  OK(cu.MemAddressReserve(&va, G, 0, 0, 0));
  OK(cu.MemMap(va, G, 0, h, 0));
  CUmemAccessDesc rw = access_of(0);
  OK(cu.MemSetAccess(va, G, &rw, 1));
  at(va)[7] = 3;
  CHECK(at(va)[7] == 3);
  OK(cu.MemUnmap(va, G));
  OK(cu.MemAddressFree(va, G));
  OK(cu.MemRelease(h));
  ctl.reset();
}

}  // namespace

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : getenv("STITCH_CUDA_DRIVER");
  if (path == nullptr) {
    fprintf(stderr, "usage: %s <libstitch_fake_cuda.so>   (or set STITCH_CUDA_DRIVER)\n", argv[0]);
    return 2;
  }
  setenv("STITCH_FAKE_CUDA_DEVICES", "2", 1);
  setenv("STITCH_FAKE_CUDA_MEMORY_MB", "64", 1);
  unsetenv("STITCH_FAKE_CUDA_NO_VMM");
  unsetenv("STITCH_FAKE_CUDA_FAIL");
  unsetenv("STITCH_FAKE_CUDA_ABORT_ON_VIOLATION");
  g_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (g_lib == nullptr) {
    fprintf(stderr, "dlopen(%s): %s\n", path, dlerror());
    return 1;
  }
  if (pipe(g_pipe) != 0) return 1;
  load_ctl(ctl.fail, "stitch_fake_cuda_fail");
  load_ctl(ctl.clear_faults, "stitch_fake_cuda_clear_faults");
  load_ctl(ctl.hold_stream, "stitch_fake_cuda_hold_stream");
  load_ctl(ctl.release_stream, "stitch_fake_cuda_release_stream");
  load_ctl(ctl.forced_completions, "stitch_fake_cuda_forced_completions");
  load_ctl(ctl.calls, "stitch_fake_cuda_calls");
  load_ctl(ctl.violations, "stitch_fake_cuda_violations");
  load_ctl(ctl.rule_violations, "stitch_fake_cuda_rule_violations");
  load_ctl(ctl.last_violation, "stitch_fake_cuda_last_violation");
  load_ctl(ctl.get_usage, "stitch_fake_cuda_get_usage");
  load_ctl(ctl.contexts_activated, "stitch_fake_cuda_contexts_activated");
  load_ctl(ctl.set_access_calls, "stitch_fake_cuda_set_access_calls");
  load_ctl(ctl.reset, "stitch_fake_cuda_reset");
  load_ctl(ctl.set_capacity, "stitch_fake_cuda_set_capacity");
  load_ctl(cu.GetProcAddress, "cuGetProcAddress_v2");

  // Every entry point through cuGetProcAddress, at the version of its PFN_ typedef.
  resolve(cu.Init, "cuInit", 2000);
  resolve(cu.DriverGetVersion, "cuDriverGetVersion", 2020);
  resolve(cu.DeviceGet, "cuDeviceGet", 2000);
  resolve(cu.DeviceGetCount, "cuDeviceGetCount", 2000);
  resolve(cu.DeviceGetAttribute, "cuDeviceGetAttribute", 2000);
  resolve(cu.DeviceGetName, "cuDeviceGetName", 2000);
  resolve(cu.DeviceTotalMem, "cuDeviceTotalMem", 3020);
  resolve(cu.DeviceCanAccessPeer, "cuDeviceCanAccessPeer", 4000);
  resolve(cu.PrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000);
  resolve(cu.PrimaryCtxRelease, "cuDevicePrimaryCtxRelease", 11000);
  resolve(cu.PrimaryCtxGetState, "cuDevicePrimaryCtxGetState", 7000);
  resolve(cu.CtxSetCurrent, "cuCtxSetCurrent", 4000);
  resolve(cu.CtxGetCurrent, "cuCtxGetCurrent", 4000);
  resolve(cu.CtxGetDevice, "cuCtxGetDevice", 12090);
  resolve(cu.CtxGetDevice13, "cuCtxGetDevice", 13000);
  resolve(cu.CtxSynchronize, "cuCtxSynchronize", 2000);
  resolve(cu.CtxSynchronize13, "cuCtxSynchronize", 13000);
  resolve(cu.MemGetInfo, "cuMemGetInfo", 3020);
  resolve(cu.MemAlloc, "cuMemAlloc", 3020);
  resolve(cu.MemFree, "cuMemFree", 3020);
  resolve(cu.MemGetAllocationGranularity, "cuMemGetAllocationGranularity", 10020);
  resolve(cu.MemAddressReserve, "cuMemAddressReserve", 10020);
  resolve(cu.MemAddressFree, "cuMemAddressFree", 10020);
  resolve(cu.MemCreate, "cuMemCreate", 10020);
  resolve(cu.MemRelease, "cuMemRelease", 10020);
  resolve(cu.MemMap, "cuMemMap", 10020);
  resolve(cu.MemUnmap, "cuMemUnmap", 10020);
  resolve(cu.MemSetAccess, "cuMemSetAccess", 10020);
  resolve(cu.MemcpyDtoDAsync, "cuMemcpyDtoDAsync", 3020);
  resolve(cu.MemHostAlloc, "cuMemHostAlloc", 2020);
  resolve(cu.MemFreeHost, "cuMemFreeHost", 2000);
  resolve(cu.MemcpyDtoHAsync, "cuMemcpyDtoHAsync", 3020);
  resolve(cu.MemcpyHtoDAsync, "cuMemcpyHtoDAsync", 3020);
  resolve(cu.StreamCreate, "cuStreamCreate", 2000);
  resolve(cu.StreamDestroy, "cuStreamDestroy", 4000);
  resolve(cu.StreamSynchronize, "cuStreamSynchronize", 2000);
  resolve(cu.StreamQuery, "cuStreamQuery", 2000);
  resolve(cu.StreamBeginCapture, "cuStreamBeginCapture", 10010);
  resolve(cu.StreamEndCapture, "cuStreamEndCapture", 10000);
  resolve(cu.StreamIsCapturing, "cuStreamIsCapturing", 10000);
  resolve(cu.ThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode", 10010);
  resolve(cu.EventCreate, "cuEventCreate", 2000);
  resolve(cu.EventDestroy, "cuEventDestroy", 4000);
  resolve(cu.EventRecord, "cuEventRecord", 2000);
  resolve(cu.EventQuery, "cuEventQuery", 2000);
  resolve(cu.EventSynchronize, "cuEventSynchronize", 2000);
  resolve(cu.GetErrorName, "cuGetErrorName", 6000);
  resolve(cu.GetErrorString, "cuGetErrorString", 6000);
  resolve(cu.GetProcAddressLegacy, "cuGetProcAddress", 11030);
  CHECK(reinterpret_cast<void*>(cu.GetProcAddressLegacy) == dlsym(g_lib, "cuGetProcAddress"));
  resolve(cu.MemGetAddressRange, "cuMemGetAddressRange", 3020);
  resolve(cu.MemExportToShareableHandle, "cuMemExportToShareableHandle", 10020);
  resolve(cu.MemImportFromShareableHandle, "cuMemImportFromShareableHandle", 10020);
  resolve(cu.IpcGetMemHandle, "cuIpcGetMemHandle", 4010);
  resolve(cu.IpcOpenMemHandle, "cuIpcOpenMemHandle", 11000);
  resolve(cu.IpcCloseMemHandle, "cuIpcCloseMemHandle", 4010);

  test_proc_address();
  test_init();
  test_devices();
  test_contexts();
  test_linear();
  test_vmm();
  test_streams_events();
  test_capture();
  test_host_memory();
  test_threads();
  test_faults_and_reset();
  test_no_vmm();
  test_ipc();
  test_host_numa();
  if (g_failures != 0) {
    fprintf(stderr, "FAILED: %d check(s)\n", g_failures);
    return 1;
  }
  puts("fake_cuda_selftest: all checks passed");
  return 0;
}
