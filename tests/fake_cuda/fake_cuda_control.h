/* tests/fake_cuda/fake_cuda_control.h — the test-control API of the strict fake CUDA driver
 * (libstitch_fake_cuda.so): fault injection, held streams, counters and reset. These are plain C
 * symbols found with dlsym (or by linking the .so); they are NOT reachable through
 * cuGetProcAddress. Every function is thread-safe. Usable from C99 and C++. */
#ifndef STITCH_FAKE_CUDA_CONTROL_H
#define STITCH_FAKE_CUDA_CONTROL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Same type as CUstream in cuda.h (typedef struct CUstream_st *CUstream), declared here so that
 * this header does not need cuda.h. */
struct CUstream_st;

/* Contract-rule numbers, as listed in tests/fake_cuda/README.md. */
enum stitch_fake_cuda_rule {
  STITCH_FAKE_CUDA_RULE_ARGUMENT = 0,       /* null out-pointer, bad flag/enum, bad device */
  STITCH_FAKE_CUDA_RULE_INIT = 1,           /* call before cuInit(0) succeeded */
  STITCH_FAKE_CUDA_RULE_CONTEXT = 2,        /* no / inactive / wrong current context */
  STITCH_FAKE_CUDA_RULE_GRANULARITY = 3,    /* VMM size/address not a granularity multiple */
  STITCH_FAKE_CUDA_RULE_MAP = 4,            /* bad cuMemMap */
  STITCH_FAKE_CUDA_RULE_ACCESS = 5,         /* bad cuMemSetAccess */
  STITCH_FAKE_CUDA_RULE_UNMAP = 6,          /* cuMemUnmap of a partial mapping / hole */
  STITCH_FAKE_CUDA_RULE_ADDRESS_FREE = 7,   /* cuMemAddressFree not of an exact, empty reservation */
  STITCH_FAKE_CUDA_RULE_RELEASED = 8,       /* unknown or released allocation handle */
  STITCH_FAKE_CUDA_RULE_HANDLE = 9,         /* bad / destroyed / foreign stream or event */
  STITCH_FAKE_CUDA_RULE_FREE = 10,          /* cuMemFree(Host) of an unknown or interior pointer */
  STITCH_FAKE_CUDA_RULE_OUT_OF_MEMORY = 11, /* never counted: running out is not a violation */
  STITCH_FAKE_CUDA_RULE_CAPTURE = 12,       /* stream-capture rule broken */
  STITCH_FAKE_CUDA_RULE_NO_VMM = 13,        /* VMM call while STITCH_FAKE_CUDA_NO_VMM=1 */
  STITCH_FAKE_CUDA_RULE_IPC = 14,           /* export of a handle type not requested at creation,
                                               import of what no export gave, bad IPC open/close */
  STITCH_FAKE_CUDA_RULE_COUNT = 15
};

/* Arms a fault: the nth call (1 = the next one) of `entry_point`, counted from now, returns
 * `result` (a CUresult) without doing anything. `entry_point` is a base name as given to
 * cuGetProcAddress ("cuMemMap", "cuMemAlloc"). Several faults may be armed at once; an injected
 * fault is not a contract violation. Returns 0, or -1 for an unknown name or nth == 0. */
int stitch_fake_cuda_fail(const char* entry_point, unsigned long long nth, int result);
/* Disarms every pending fault (also those read from STITCH_FAKE_CUDA_FAIL). */
void stitch_fake_cuda_clear_faults(void);

/* Holds a stream: it gets in-flight work now, and every event recorded on it from now on stays
 * incomplete (cuEventQuery / cuStreamQuery return CUDA_ERROR_NOT_READY) until
 * stitch_fake_cuda_release_stream. NULL or CU_STREAM_LEGACY means the legacy stream of the
 * calling thread's current context. Returns 0, or -1 (no such stream / no current context). */
int stitch_fake_cuda_hold_stream(struct CUstream_st* stream);
/* Releases a held stream: all its work completes. Also accepts a stream already destroyed with
 * cuStreamDestroy (its work is still pending until released). Returns 0 or -1. */
int stitch_fake_cuda_release_stream(struct CUstream_st* stream);
/* How many cuEventSynchronize / cuStreamSynchronize / cuCtxSynchronize calls had to complete
 * held work (the host "waited" for a held stream). */
unsigned long long stitch_fake_cuda_forced_completions(void);

/* Calls of `entry_point` (base name) since load / reset, failed and injected ones included. */
unsigned long long stitch_fake_cuda_calls(const char* entry_point);
/* Total contract violations since load / reset. */
unsigned long long stitch_fake_cuda_violations(void);
/* Contract violations of one rule (enum stitch_fake_cuda_rule). 0 for a bad rule number. */
unsigned long long stitch_fake_cuda_rule_violations(int rule);
/* Text of the last violation ("" if none), e.g.
 * "[rule 4 map] cuMemMap: range already mapped (...) -> CUDA_ERROR_INVALID_VALUE".
 * The pointer stays valid on the calling thread until its next call of this function. */
const char* stitch_fake_cuda_last_violation(void);

/* Per-device usage. */
struct stitch_fake_cuda_usage {
  unsigned long long capacity_bytes;    /* what cuDeviceTotalMem reports */
  unsigned long long used_bytes;        /* cuMemAlloc (2 MiB rounded) + live physical handles */
  unsigned long long live_allocations;  /* cuMemAlloc not yet freed */
  unsigned long long live_handles;      /* cuMemCreate not yet released */
  unsigned long long live_reservations; /* cuMemAddressReserve not yet freed */
  unsigned long long live_mappings;     /* cuMemMap not yet unmapped (of this device's handles) */
  unsigned long long live_streams;      /* cuStreamCreate not yet destroyed */
  unsigned long long live_events;       /* cuEventCreate not yet destroyed */
  unsigned long long live_host_allocations; /* cuMemHostAlloc in this device's context, not freed */
  unsigned long long host_bytes;        /* their bytes as requested (host memory: not in used_bytes) */
};
/* Fills *out for `device`. Returns 0, or -1 (not initialised / bad device / out == NULL). */
int stitch_fake_cuda_get_usage(int device, struct stitch_fake_cuda_usage* out);
/* How many times the device's primary context went from inactive to active. */
int stitch_fake_cuda_contexts_activated(int device);
/* cuMemSetAccess calls that succeeded while `device`'s context was current. */
unsigned long long stitch_fake_cuda_set_access_calls(int device);

/* Back to the state right after load: frees all memory, forgets all handles, streams, events
 * and counters, disarms faults, and makes the fake uninitialised (cuInit reads the environment
 * again). Threads' current contexts and capture modes are forgotten too. */
void stitch_fake_cuda_reset(void);
/* Sets a device's capacity in bytes. Before cuInit it is remembered and applied by cuInit (and
 * forgotten by reset). Returns 0, or -1 for a bad device. */
int stitch_fake_cuda_set_capacity(int device, size_t bytes);
/* Physical memory handles made (cuMemCreate and cuMemImportFromShareableHandle that succeeded)
 * and released (cuMemRelease that succeeded) since load or reset: a release of a handle released
 * already fails (rule 8) and is not counted, so created - released is what is still held. */
void stitch_fake_cuda_handle_counts(unsigned long long* created, unsigned long long* released);

#ifdef __cplusplus
}
#endif

#endif /* STITCH_FAKE_CUDA_CONTROL_H */
