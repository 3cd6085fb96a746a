/* tests/fake_cuda/outside_program.c — a C99 program that uses stitch as a CUDA program would: it
 * opens the driver itself (dlopen(getenv("STITCH_CUDA_DRIVER"))), calls cuInit, cuDeviceGet,
 * cuDevicePrimaryCtxRetain, cuCtxSetCurrent and cuStreamCreate, and then knows stitch only
 * through stitch.h with backend:cuda: threads on streams of their own, data written through the
 * pointers read back, bad frees refused, an OOM reported and recovered from.
 *
 * usage: outside_program [extra settings, e.g. expandable_segments:True,stitching:True]
 * Run with STITCH_CUDA_DRIVER naming the fake and STITCH_FAKE_CUDA_MEMORY_MB=2048. Exit 0: pass. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stitch/stitch.h"
#include "../support/c_check.h"

typedef int CUresult;
typedef int CUdevice;
typedef void* CUcontext;
typedef void* CUstream;


static CUresult (*cu_init)(unsigned);
static CUresult (*cu_device_get)(CUdevice*, int);
static CUresult (*cu_primary_ctx_retain)(CUcontext*, CUdevice);
static CUresult (*cu_ctx_set_current)(CUcontext);
static CUresult (*cu_stream_create)(CUstream*, unsigned);
static CUcontext context;

#define THREADS 4
#define SLOTS 64
#define OPS 3000

typedef struct {
  int index;
  CUstream stream;
  int failures;
} worker_t;

static uint64_t next_random(uint64_t* s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}

static void fill(unsigned char* p, size_t n, unsigned char tag) {
  size_t i;
  for (i = 0; i < n; i += 4096) p[i] = (unsigned char)(tag + i / 4096);
  p[n - 1] = tag;
}

static int intact(const unsigned char* p, size_t n, unsigned char tag) {
  size_t i;
  for (i = 0; i < n; i += 4096)
    if (p[i] != (unsigned char)(tag + i / 4096)) return 0;
  return p[n - 1] == tag;
}

static void* worker(void* arg) {
  worker_t* w = (worker_t*)arg;
  unsigned char* ptr[SLOTS] = {0};
  size_t size[SLOTS] = {0};
  unsigned char tag[SLOTS] = {0};
  uint64_t rng = 0x9e3779b97f4a7c15ull + (uint64_t)w->index;
  int i, k;
  /* A CUDA program's threads make the context current themselves. */
  if (cu_ctx_set_current(context) != 0) ++w->failures;
  for (i = 0; i < OPS; ++i) {
    k = (int)(next_random(&rng) % SLOTS);
    if (ptr[k] == NULL) {
      const uint64_t r = next_random(&rng);
      size[k] = r % 4 == 0 ? 512 + r % 65536 : 1 + r % (24u << 20);
      ptr[k] = (unsigned char*)stitch_malloc(size[k], 0, w->stream);
      if (ptr[k] == NULL) {
        if (strstr(stitch_last_error(), "out of memory") == NULL) ++w->failures;
        continue;
      }
      tag[k] = (unsigned char)r;
      fill(ptr[k], size[k], tag[k]);
    } else {
      if (!intact(ptr[k], size[k], tag[k])) ++w->failures;
      stitch_clear_error(); /* free returns nothing: clear, free, read */
      stitch_free(ptr[k], size[k], 0, w->stream);
      if (stitch_last_error()[0] != '\0') ++w->failures;
      ptr[k] = NULL;
    }
  }
  for (k = 0; k < SLOTS; ++k) {
    if (ptr[k] == NULL) continue;
    if (!intact(ptr[k], size[k], tag[k])) ++w->failures;
    stitch_free(ptr[k], size[k], 0, w->stream);
  }
  return NULL;
}

int main(int argc, char** argv) {
  const char* path = getenv("STITCH_CUDA_DRIVER");
  char conf[512];
  void* lib;
  CUdevice dev = 0;
  CUstream main_stream = NULL;
  pthread_t threads[THREADS];
  worker_t workers[THREADS];
  unsigned char *p, *keep, *big;
  int i;
  int64_t invalid_before;

  if (path == NULL || path[0] == '\0') {
    printf("skipped: STITCH_CUDA_DRIVER names no driver\n");
    return 77;
  }
  lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "cannot open %s: %s\n", path, dlerror());
    return 1;
  }
  *(void**)&cu_init = dlsym(lib, "cuInit");
  *(void**)&cu_device_get = dlsym(lib, "cuDeviceGet");
  *(void**)&cu_primary_ctx_retain = dlsym(lib, "cuDevicePrimaryCtxRetain");
  *(void**)&cu_ctx_set_current = dlsym(lib, "cuCtxSetCurrent");
  *(void**)&cu_stream_create = dlsym(lib, "cuStreamCreate");
  if (!cu_init || !cu_device_get || !cu_primary_ctx_retain || !cu_ctx_set_current || !cu_stream_create) {
    fprintf(stderr, "%s lacks driver entry points\n", path);
    return 1;
  }
  CHECK(cu_init(0) == 0, "cuInit");
  CHECK(cu_device_get(&dev, 0) == 0, "cuDeviceGet");
  CHECK(cu_primary_ctx_retain(&context, dev) == 0, "cuDevicePrimaryCtxRetain");
  CHECK(cu_ctx_set_current(context) == 0, "cuCtxSetCurrent");
  CHECK(cu_stream_create(&main_stream, 0) == 0, "cuStreamCreate");

  snprintf(conf, sizeof conf, "backend:cuda%s%s", argc > 1 && argv[1][0] ? "," : "", argc > 1 ? argv[1] : "");
  CHECK(stitch_configure(conf) == 0, "configure %s: %s", conf, stitch_last_error());

  /* Data written through a pointer reads back. */
  p = (unsigned char*)stitch_malloc(10u << 20, 0, main_stream);
  CHECK(p != NULL, "malloc: %s", stitch_last_error());
  if (p != NULL) {
    fill(p, 10u << 20, 7);
    CHECK(intact(p, 10u << 20, 7), "data lost");
    stitch_clear_error();
    stitch_free(p, 10u << 20, 0, main_stream);
    CHECK(stitch_last_error()[0] == '\0', "free: %s", stitch_last_error());
  }

  /* Threads, each on a stream of its own. */
  for (i = 0; i < THREADS; ++i) {
    workers[i].index = i;
    workers[i].failures = 0;
    CHECK(cu_stream_create(&workers[i].stream, 0) == 0, "cuStreamCreate");
    pthread_create(&threads[i], NULL, worker, &workers[i]);
  }
  for (i = 0; i < THREADS; ++i) {
    pthread_join(threads[i], NULL);
    CHECK(workers[i].failures == 0, "thread %d: %d failures", i, workers[i].failures);
  }

  /* Bad input is refused and changes nothing else. */
  keep = (unsigned char*)stitch_malloc(1u << 20, 0, main_stream);
  CHECK(keep != NULL, "malloc: %s", stitch_last_error());
  if (keep != NULL) {
    fill(keep, 1u << 20, 9);
    invalid_before = stitch_stat(0, "num_invalid_frees");
    stitch_clear_error();
    stitch_free(keep + 512, 512, 0, main_stream);
    CHECK(stitch_last_error()[0] != '\0', "an interior pointer was accepted");
    stitch_clear_error();
    stitch_free(&i, sizeof i, 0, main_stream);
    CHECK(stitch_last_error()[0] != '\0', "a host pointer was accepted");
    CHECK(stitch_stat(0, "num_invalid_frees") == invalid_before + 2, "invalid frees not counted");
    CHECK(intact(keep, 1u << 20, 9), "a bad free changed a live block");
    stitch_clear_error();
    stitch_free(keep, 1u << 20, 0, main_stream);
    CHECK(stitch_last_error()[0] == '\0', "valid free failed: %s", stitch_last_error());
    stitch_clear_error();
    stitch_free(keep, 1u << 20, 0, main_stream);
    CHECK(strstr(stitch_last_error(), "double free") != NULL, "double free: %s", stitch_last_error());
  }

  /* The fake's 2 GiB device: 3 GiB is out of memory, reported as such, and then 1 GiB works. */
  big = (unsigned char*)stitch_malloc((size_t)3 << 30, 0, main_stream);
  CHECK(big == NULL, "3 GiB on a 2 GiB device");
  CHECK(strstr(stitch_last_error(), "out of memory") != NULL, "no OOM report: %s", stitch_last_error());
  CHECK(strstr(stitch_last_error(), "total capacity of 2.00 GiB") != NULL,
        "the report does not see the 2 GiB device: %s", stitch_last_error());
  CHECK(stitch_stat(0, "num_ooms") >= 1, "num_ooms");
  big = (unsigned char*)stitch_malloc((size_t)1 << 30, 0, main_stream);
  CHECK(big != NULL, "1 GiB after the OOM: %s", stitch_last_error());
  if (big != NULL) {
    fill(big, (size_t)1 << 30, 3);
    CHECK(intact(big, (size_t)1 << 30, 3), "data lost");
    stitch_free(big, (size_t)1 << 30, 0, main_stream);
  }
  CHECK(stitch_empty_cache(-1) == 0, "empty_cache: %s", stitch_last_error());
  CHECK(stitch_stat(0, "reserved_bytes.all.current") == 0, "memory still reserved");

  printf("%s (%s)\n", failures == 0 ? "PASSED" : "FAILED", conf);
  return failures == 0 ? 0 : 1;
}
