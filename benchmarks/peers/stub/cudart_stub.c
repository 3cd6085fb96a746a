/* cudart_stub.c — a stand-in for libcudart.so.13 with no GPU behind it.
 *
 * It implements just the CUDA runtime entry points that PyTorch's c10_cuda, RMM (built here from
 * source) and stitch's CUDA backend link against, each doing the least that keeps the caller
 * consistent:
 *   - one device (device 0), or STUB_DEVICES (1..8) identical devices, read at the first call;
 *     cudaGetDevice/cudaSetDevice keep a thread-local current device;
 *   - cudaMalloc/cudaMallocAsync: anonymous mmap of the size rounded up to 4 KiB (never touched,
 *     so it costs only virtual memory); cudaFree/cudaFreeAsync: munmap (the size is remembered in
 *     a small open-addressed table, only touched on the allocators' slow paths);
 *   - events and streams are fake non-null handles (a counter); every event is always complete
 *     (cudaEventQuery -> cudaSuccess), every synchronize returns at once;
 *   - cudaStreamGetId returns the handle's value (unique per stub stream);
 *   - no stream is ever capturing; cudaMemGetInfo reports 80 GiB free of 80 GiB;
 *   - cudaGetDriverEntryPoint[ByVersion] answers "symbol not found" (no driver API), logging the
 *     symbol names asked for when STUB_VERBOSE is set.
 * Built twice: plain (the timed runs) and with -DSTUB_COUNT, which counts calls per entry point
 * (relaxed atomics) so the harness can report how many CUDA calls each allocator makes per pair.
 */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <pthread.h>

#define EXPORT __attribute__((visibility("default")))

/* ---- call counting (STUB_COUNT builds only) ------------------------------------------------ */
enum {
#define X(n) C_##n,
#include "stub_fns.def"
#undef X
  C_COUNT
};
static const char* const k_names[] = {
#define X(n) #n,
#include "stub_fns.def"
#undef X
};
#ifdef STUB_COUNT
static _Atomic unsigned long long g_counts[C_COUNT];
#define COUNT(n) atomic_fetch_add_explicit(&g_counts[C_##n], 1, memory_order_relaxed)
#else
#define COUNT(n) ((void)0)
#endif

/* Extra API of the stub (not CUDA): lets the harness read the counters. Returns 0 when the
 * library was built without counting. */
EXPORT int stub_counting(void) {
#ifdef STUB_COUNT
  return 1;
#else
  return 0;
#endif
}
EXPORT int stub_num_functions(void) { return C_COUNT; }
EXPORT const char* stub_function_name(int i) { return (i >= 0 && i < C_COUNT) ? k_names[i] : ""; }
EXPORT unsigned long long stub_count(int i) {
#ifdef STUB_COUNT
  return (i >= 0 && i < C_COUNT) ? atomic_load_explicit(&g_counts[i], memory_order_relaxed) : 0;
#else
  (void)i;
  return 0;
#endif
}

/* ---- state ---------------------------------------------------------------------------------- */
static __thread int t_device = 0;
static __thread cudaError_t t_last_error = cudaSuccess;
static _Atomic uintptr_t g_next_handle = 0x10000;
static const size_t k_total_mem = 80ull << 30;

static void* new_handle(void) {
  return (void*)atomic_fetch_add_explicit(&g_next_handle, 16, memory_order_relaxed);
}

/* pointer -> mapped length, for munmap (slow path only) */
#define TBL 65536
static pthread_mutex_t g_tbl_mu = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t g_tbl_ptr[TBL];
static size_t g_tbl_len[TBL];
static size_t slot_of(uintptr_t p) { return (size_t)((p >> 12) * 0x9E3779B97F4A7C15ull >> 48) % TBL; }
static void tbl_put(void* p, size_t len) {
  pthread_mutex_lock(&g_tbl_mu);
  size_t s = slot_of((uintptr_t)p);
  while (g_tbl_ptr[s] != 0 && g_tbl_ptr[s] != (uintptr_t)-1) s = (s + 1) % TBL;
  g_tbl_ptr[s] = (uintptr_t)p;
  g_tbl_len[s] = len;
  pthread_mutex_unlock(&g_tbl_mu);
}
static size_t tbl_take(void* p) {
  size_t len = 0;
  pthread_mutex_lock(&g_tbl_mu);
  size_t s = slot_of((uintptr_t)p);
  for (size_t n = 0; n < TBL && g_tbl_ptr[s] != 0; ++n, s = (s + 1) % TBL) {
    if (g_tbl_ptr[s] == (uintptr_t)p) {
      len = g_tbl_len[s];
      g_tbl_ptr[s] = (uintptr_t)-1; /* tombstone */
      break;
    }
  }
  pthread_mutex_unlock(&g_tbl_mu);
  return len;
}
static cudaError_t do_malloc(void** p, size_t size) {
  if (!p) return cudaErrorInvalidValue;
  if (size == 0) { *p = NULL; return cudaSuccess; }
  size_t len = (size + 4095) & ~(size_t)4095;
  void* m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) { *p = NULL; return t_last_error = cudaErrorMemoryAllocation; }
  tbl_put(m, len);
  *p = m;
  return cudaSuccess;
}
static cudaError_t do_free(void* p) {
  if (!p) return cudaSuccess;
  size_t len = tbl_take(p);
  if (!len) return t_last_error = cudaErrorInvalidValue;
  munmap(p, len);
  return cudaSuccess;
}

static int ndev(void) {
  static _Atomic int n = 0;
  int v = atomic_load_explicit(&n, memory_order_relaxed);
  if (v == 0) {
    const char* e = getenv("STUB_DEVICES");
    v = e ? atoi(e) : 1;
    if (v < 1 || v > 8) v = 1;
    atomic_store_explicit(&n, v, memory_order_relaxed);
  }
  return v;
}
#define BAD_DEVICE(d) ((d) < 0 || (d) >= ndev())

/* ---- device ---------------------------------------------------------------------------------- */
EXPORT cudaError_t cudaGetDevice(int* device) { COUNT(cudaGetDevice); *device = t_device; return cudaSuccess; }
EXPORT cudaError_t cudaSetDevice(int device) {
  COUNT(cudaSetDevice);
  if (BAD_DEVICE(device)) return t_last_error = cudaErrorInvalidDevice;
  t_device = device;
  return cudaSuccess;
}
EXPORT cudaError_t cudaGetDeviceCount(int* count) { COUNT(cudaGetDeviceCount); *count = ndev(); return cudaSuccess; }
EXPORT cudaError_t cudaDeviceSynchronize(void) { COUNT(cudaDeviceSynchronize); return cudaSuccess; }
EXPORT cudaError_t cudaDeviceReset(void) { COUNT(cudaDeviceReset); return cudaSuccess; }
EXPORT cudaError_t cudaDriverGetVersion(int* v) { COUNT(cudaDriverGetVersion); *v = 13020; return cudaSuccess; }
EXPORT cudaError_t cudaRuntimeGetVersion(int* v) { COUNT(cudaRuntimeGetVersion); *v = 13020; return cudaSuccess; }
EXPORT cudaError_t cudaGetLastError(void) { COUNT(cudaGetLastError); cudaError_t e = t_last_error; t_last_error = cudaSuccess; return e; }
EXPORT cudaError_t cudaPeekAtLastError(void) { COUNT(cudaPeekAtLastError); return t_last_error; }
EXPORT const char* cudaGetErrorString(cudaError_t e) { COUNT(cudaGetErrorString); return e == cudaSuccess ? "no error" : "stub cudart error"; }
EXPORT const char* cudaGetErrorName(cudaError_t e) { COUNT(cudaGetErrorName); return e == cudaSuccess ? "cudaSuccess" : "cudaErrorStub"; }
EXPORT cudaError_t cudaMemGetInfo(size_t* free_b, size_t* total) {
  COUNT(cudaMemGetInfo);
  if (free_b) *free_b = k_total_mem;
  if (total) *total = k_total_mem;
  return cudaSuccess;
}
EXPORT cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* prop, int device) {
  COUNT(cudaGetDeviceProperties);
  if (BAD_DEVICE(device)) return cudaErrorInvalidDevice;
  memset(prop, 0, sizeof *prop);
  strcpy(prop->name, "stub device (host memory)");
  prop->totalGlobalMem = k_total_mem;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->integrated = 0;
  prop->canMapHostMemory = 1;
  prop->unifiedAddressing = 1;
  prop->memoryPoolsSupported = 1;
  return cudaSuccess;
}
EXPORT cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
  COUNT(cudaDeviceGetAttribute);
  if (BAD_DEVICE(device)) return cudaErrorInvalidDevice;
  switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMultiProcessorCount: *value = 132; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMemoryPoolsSupported: *value = 1; break;
    case cudaDevAttrUnifiedAddressing: *value = 1; break;
    default: *value = 0; break;
  }
  return cudaSuccess;
}
EXPORT cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  COUNT(cudaDeviceGetStreamPriorityRange);
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return cudaSuccess;
}
EXPORT cudaError_t cudaDeviceCanAccessPeer(int* can, int d, int p) { COUNT(cudaDeviceCanAccessPeer); (void)d; (void)p; *can = 0; return cudaSuccess; }
EXPORT cudaError_t cudaDeviceEnablePeerAccess(int p, unsigned int f) { COUNT(cudaDeviceEnablePeerAccess); (void)p; (void)f; return cudaErrorInvalidDevice; }

/* ---- memory ---------------------------------------------------------------------------------- */
EXPORT cudaError_t cudaMalloc(void** p, size_t size) { COUNT(cudaMalloc); return do_malloc(p, size); }
EXPORT cudaError_t cudaFree(void* p) { COUNT(cudaFree); return do_free(p); }
EXPORT cudaError_t cudaMallocAsync(void** p, size_t size, cudaStream_t s) { COUNT(cudaMallocAsync); (void)s; return do_malloc(p, size); }
EXPORT cudaError_t cudaFreeAsync(void* p, cudaStream_t s) { COUNT(cudaFreeAsync); (void)s; return do_free(p); }
EXPORT cudaError_t cudaMallocHost(void** p, size_t size) { COUNT(cudaMallocHost); *p = malloc(size); return *p ? cudaSuccess : cudaErrorMemoryAllocation; }
EXPORT cudaError_t cudaFreeHost(void* p) { COUNT(cudaFreeHost); free(p); return cudaSuccess; }
EXPORT cudaError_t cudaMemcpy(void* d, const void* s, size_t n, enum cudaMemcpyKind k) { COUNT(cudaMemcpy); (void)k; memmove(d, s, n); return cudaSuccess; }
EXPORT cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, enum cudaMemcpyKind k, cudaStream_t st) { COUNT(cudaMemcpyAsync); (void)k; (void)st; memmove(d, s, n); return cudaSuccess; }
EXPORT cudaError_t cudaMemcpyPeerAsync(void* d, int dd, const void* s, int sd, size_t n, cudaStream_t st) { COUNT(cudaMemcpyPeerAsync); (void)dd; (void)sd; (void)st; memmove(d, s, n); return cudaSuccess; }
EXPORT cudaError_t cudaMemsetAsync(void* d, int v, size_t n, cudaStream_t st) { COUNT(cudaMemsetAsync); (void)st; memset(d, v, n); return cudaSuccess; }
EXPORT cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* a, const void* p) {
  COUNT(cudaPointerGetAttributes);
  memset(a, 0, sizeof *a);
  a->type = cudaMemoryTypeDevice;
  a->device = 0;
  a->devicePointer = (void*)p;
  return cudaSuccess;
}
EXPORT cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) { COUNT(cudaDeviceGetDefaultMemPool); (void)device; *pool = (cudaMemPool_t)new_handle(); return cudaSuccess; }
EXPORT cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void* value) { COUNT(cudaMemPoolGetAttribute); (void)pool; (void)attr; memset(value, 0, sizeof(unsigned long long)); return cudaSuccess; }
EXPORT cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void* value) { COUNT(cudaMemPoolSetAttribute); (void)pool; (void)attr; (void)value; return cudaSuccess; }
EXPORT cudaError_t cudaMemPoolSetAccess(cudaMemPool_t pool, const struct cudaMemAccessDesc* d, size_t n) { COUNT(cudaMemPoolSetAccess); (void)pool; (void)d; (void)n; return cudaSuccess; }
EXPORT cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t keep) { COUNT(cudaMemPoolTrimTo); (void)pool; (void)keep; return cudaSuccess; }
EXPORT cudaError_t cudaDeviceGetGraphMemAttribute(int device, enum cudaGraphMemAttributeType attr, void* value) { COUNT(cudaDeviceGetGraphMemAttribute); (void)device; (void)attr; memset(value, 0, sizeof(unsigned long long)); return cudaSuccess; }
EXPORT cudaError_t cudaDeviceSetGraphMemAttribute(int device, enum cudaGraphMemAttributeType attr, void* value) { COUNT(cudaDeviceSetGraphMemAttribute); (void)device; (void)attr; (void)value; return cudaSuccess; }
EXPORT cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* h, void* p) { COUNT(cudaIpcGetMemHandle); (void)h; (void)p; return cudaErrorNotSupported; }
EXPORT cudaError_t cudaIpcOpenMemHandle(void** p, cudaIpcMemHandle_t h, unsigned int f) { COUNT(cudaIpcOpenMemHandle); (void)p; (void)h; (void)f; return cudaErrorNotSupported; }
EXPORT cudaError_t cudaIpcCloseMemHandle(void* p) { COUNT(cudaIpcCloseMemHandle); (void)p; return cudaErrorNotSupported; }

/* ---- streams and events ------------------------------------------------------------------------ */
EXPORT cudaError_t cudaStreamCreate(cudaStream_t* s) { COUNT(cudaStreamCreate); *s = (cudaStream_t)new_handle(); return cudaSuccess; }
EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int f) { COUNT(cudaStreamCreateWithFlags); (void)f; *s = (cudaStream_t)new_handle(); return cudaSuccess; }
EXPORT cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned int f, int p) { COUNT(cudaStreamCreateWithPriority); (void)f; (void)p; *s = (cudaStream_t)new_handle(); return cudaSuccess; }
EXPORT cudaError_t cudaStreamDestroy(cudaStream_t s) { COUNT(cudaStreamDestroy); (void)s; return cudaSuccess; }
EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t s) { COUNT(cudaStreamSynchronize); (void)s; return cudaSuccess; }
EXPORT cudaError_t cudaStreamQuery(cudaStream_t s) { COUNT(cudaStreamQuery); (void)s; return cudaSuccess; }
EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int f) { COUNT(cudaStreamWaitEvent); (void)s; (void)e; (void)f; return cudaSuccess; }
EXPORT cudaError_t cudaStreamGetId(cudaStream_t s, unsigned long long* id) {
  COUNT(cudaStreamGetId);
  *id = (unsigned long long)(uintptr_t)s; /* the handle itself: unique per fake stream */
  return cudaSuccess;
}
EXPORT cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus* st) { COUNT(cudaStreamIsCapturing); (void)s; *st = cudaStreamCaptureStatusNone; return cudaSuccess; }
EXPORT cudaError_t cudaStreamGetCaptureInfo(cudaStream_t s, enum cudaStreamCaptureStatus* st, unsigned long long* id,
                                            cudaGraph_t* g, const cudaGraphNode_t** deps, const cudaGraphEdgeData** edges,
                                            size_t* ndeps) {
  COUNT(cudaStreamGetCaptureInfo);
  (void)s;
  if (st) *st = cudaStreamCaptureStatusNone;
  if (id) *id = 0;
  if (g) *g = NULL;
  if (deps) *deps = NULL;
  if (edges) *edges = NULL;
  if (ndeps) *ndeps = 0;
  return cudaSuccess;
}
EXPORT cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode* mode) { COUNT(cudaThreadExchangeStreamCaptureMode); (void)mode; return cudaSuccess; }
EXPORT cudaError_t cudaGraphNodeGetDependencies(cudaGraphNode_t n, cudaGraphNode_t* deps, cudaGraphEdgeData* e, size_t* nd) { COUNT(cudaGraphNodeGetDependencies); (void)n; (void)deps; (void)e; if (nd) *nd = 0; return cudaSuccess; }
EXPORT cudaError_t cudaEventCreate(cudaEvent_t* e) { COUNT(cudaEventCreate); *e = (cudaEvent_t)new_handle(); return cudaSuccess; }
EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int f) { COUNT(cudaEventCreateWithFlags); (void)f; *e = (cudaEvent_t)new_handle(); return cudaSuccess; }
EXPORT cudaError_t cudaEventDestroy(cudaEvent_t e) { COUNT(cudaEventDestroy); (void)e; return cudaSuccess; }
EXPORT cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) { COUNT(cudaEventRecord); (void)e; (void)s; return cudaSuccess; }
EXPORT cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned int f) { COUNT(cudaEventRecordWithFlags); (void)e; (void)s; (void)f; return cudaSuccess; }
EXPORT cudaError_t cudaEventQuery(cudaEvent_t e) { COUNT(cudaEventQuery); (void)e; return cudaSuccess; }
EXPORT cudaError_t cudaEventSynchronize(cudaEvent_t e) { COUNT(cudaEventSynchronize); (void)e; return cudaSuccess; }
EXPORT cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) { COUNT(cudaEventElapsedTime); (void)a; (void)b; *ms = 0.f; return cudaSuccess; }

/* ---- driver entry points: none -------------------------------------------------------------- */
static void log_symbol(const char* fn, const char* symbol) {
  if (getenv("STUB_VERBOSE")) fprintf(stderr, "[cudart-stub] %s(\"%s\") -> not found\n", fn, symbol ? symbol : "(null)");
}
EXPORT cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** fp, unsigned long long flags, enum cudaDriverEntryPointQueryResult* st) {
  COUNT(cudaGetDriverEntryPoint);
  (void)flags;
  log_symbol("cudaGetDriverEntryPoint", symbol);
  if (fp) *fp = NULL;
  if (st) *st = cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}
EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fp, unsigned int ver, unsigned long long flags,
                                                    enum cudaDriverEntryPointQueryResult* st) {
  COUNT(cudaGetDriverEntryPointByVersion);
  (void)ver;
  (void)flags;
  log_symbol("cudaGetDriverEntryPointByVersion", symbol);
  if (fp) *fp = NULL;
  if (st) *st = cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}
