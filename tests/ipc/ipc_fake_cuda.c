/* tests/ipc/ipc_fake_cuda.c — blocks shared between processes through stitch.h on backend:cuda,
 * over the strict fake driver (STITCH_CUDA_DRIVER names it): a block of expandable segments
 * (physical memory exported as POSIX file descriptors that the importer takes with pidfd_getfd),
 * the same as fabric handles (STITCH_FAKE_CUDA_FABRIC=1), fabric refused at creation and retried
 * without (=2), a block of a cudaMalloc'd segment (legacy cuIpcGetMemHandle), and ipc:False,
 * which leaves expandable memory unexportable with a clear error. Each importer is this program
 * run again (fork and exec): it checks every byte, writes its own, closes. Every process ends
 * with no contract violation of the fake driver.
 * usage: ipc_fake_cuda            exit status 0: every check passed */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "stitch/stitch.h"

static int failures = 0;
#define CHECK(cond, ...)                                                \
  do {                                                                  \
    if (!(cond)) {                                                      \
      fprintf(stderr, "FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                     \
      fprintf(stderr, "\n");                                            \
      ++failures;                                                       \
    }                                                                   \
  } while (0)

enum { kBytes = 3 << 20 };
static void* const kStream = NULL; /* the legacy default stream */

/* The fake driver's violation count (its control API, found in the loaded driver). */
static unsigned long long violations(void) {
  void* lib = dlopen(getenv("STITCH_CUDA_DRIVER"), RTLD_NOW | RTLD_NOLOAD);
  if (lib == NULL) return 0;
  unsigned long long (*count)(void) = (unsigned long long (*)(void))dlsym(lib, "stitch_fake_cuda_violations");
  const char* (*last)(void) = (const char* (*)(void))dlsym(lib, "stitch_fake_cuda_last_violation");
  const unsigned long long n = count != NULL ? count() : 0;
  if (n != 0 && last != NULL) fprintf(stderr, "fake driver violation: %s\n", last());
  return n;
}

static int run(const char* self, const char* mode, const char* handle, int expect, int write, const char* fabric) {
  pid_t pid = fork();
  if (pid == 0) {
    char e[16], w[16];
    snprintf(e, sizeof e, "%d", expect);
    snprintf(w, sizeof w, "%d", write);
    if (fabric != NULL) setenv("STITCH_FAKE_CUDA_FABRIC", fabric, 1);
    execl(self, self, mode, handle != NULL ? handle : "-", e, w, (char*)NULL);
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

/* An importer: maps the block, checks `expect` everywhere, writes `write`, closes. */
static int peer(const char* handle, int expect, int write) {
  if (stitch_configure("backend:cuda") != 0) return 10;
  unsigned char* p = stitch_ipc_import(handle, 0);
  if (p == NULL) {
    fprintf(stderr, "peer: import failed: %s\n", stitch_last_error());
    return 11;
  }
  for (size_t i = 0; i < kBytes; ++i)
    if (p[i] != (unsigned char)expect) {
      fprintf(stderr, "peer: byte %zu is %d, not %d\n", i, p[i], expect);
      return 12;
    }
  memset(p, write, kBytes);
  if (stitch_ipc_close(p) != 0) return 13;
  if (stitch_ipc_close(p) == 0) return 14; /* closed already */
  return violations() == 0 ? 0 : 15;
}

/* An exporter of one block under `conf`: its handle must start with `kind`; peers read it. */
static int exporter(const char* self, const char* conf, const char* kind, const char* fabric) {
  if (stitch_configure(conf) != 0) {
    fprintf(stderr, "configure %s: %s\n", conf, stitch_last_error());
    return 20;
  }
  unsigned char* live = stitch_malloc(1 << 20, 0, kStream); /* a neighbour */
  unsigned char* block = stitch_malloc(kBytes, 0, kStream);
  CHECK(live != NULL && block != NULL, "%s", stitch_last_error());
  if (block == NULL) return 21;
  memset(block, 0xA5, kBytes);
  char handle[4096];
  const size_t n = stitch_ipc_export(block, handle, sizeof handle);
  CHECK(n > 0, "export under %s: %s", conf, stitch_last_error());
  CHECK(strstr(handle, kind) != NULL, "the handle under %s is not %s: %s", conf, kind, handle);
  CHECK(run(self, "--peer", handle, 0xA5, 0x3C, fabric) == 0, "the peer of %s failed", conf);
  int same = 1;
  for (size_t i = 0; i < kBytes; ++i) same &= block[i] == 0x3C;
  CHECK(same, "the peer's writes are not in the exporter's block (%s)", conf);
  CHECK(run(self, "--peer", handle, 0x3C, 0x11, fabric) == 0, "a second peer of %s failed", conf);
  CHECK(block[kBytes - 1] == 0x11, "second peer's write (%s)", conf);
  stitch_free(block, kBytes, 0, kStream);
  stitch_free(live, 1 << 20, 0, kStream);
  CHECK(stitch_empty_cache(-1) == 0, "%s", stitch_last_error());
  CHECK(violations() == 0, "the exporter under %s broke the driver's contract", conf);
  return failures == 0 ? 0 : 22;
}

/* ipc:False: expandable memory is created without handle types and does not export. */
static int no_ipc(void) {
  if (stitch_configure("backend:cuda,expandable_segments:True,ipc:False") != 0) return 30;
  void* block = stitch_malloc(kBytes, 0, kStream);
  char handle[4096];
  CHECK(block != NULL && stitch_ipc_export(block, handle, sizeof handle) == 0, "ipc:False must refuse");
  CHECK(strstr(stitch_last_error(), "ipc:False") != NULL, "the error names ipc:False: %s", stitch_last_error());
  stitch_free(block, kBytes, 0, kStream);
  CHECK(violations() == 0, "ipc:False broke the driver's contract");
  return failures == 0 ? 0 : 31;
}

int main(int argc, char** argv) {
  if (getenv("STITCH_CUDA_DRIVER") == NULL) {
    fprintf(stderr, "set STITCH_CUDA_DRIVER to the fake driver (libstitch_fake_cuda.so)\n");
    return 2;
  }
  if (argc == 5 && strcmp(argv[1], "--peer") == 0) return peer(argv[2], atoi(argv[3]), atoi(argv[4]));
  if (argc == 5 && strcmp(argv[1], "--fd") == 0)
    return exporter(argv[0], "backend:cuda,expandable_segments:True", "cuda-fd:", NULL);
  if (argc == 5 && strcmp(argv[1], "--fabric") == 0)
    return exporter(argv[0], "backend:cuda,expandable_segments:True", "cuda-fabric:", "1");
  if (argc == 5 && strcmp(argv[1], "--fabric-refused") == 0)
    return exporter(argv[0], "backend:cuda,expandable_segments:True", "cuda-fd:", "2");
  if (argc == 5 && strcmp(argv[1], "--stitching") == 0)
    return exporter(argv[0], "backend:cuda,expandable_segments:True,stitching:True", "cuda-fd:", NULL);
  if (argc == 5 && strcmp(argv[1], "--legacy") == 0) return exporter(argv[0], "backend:cuda", "cuda-ipc:", NULL);
  if (argc == 5 && strcmp(argv[1], "--no-ipc") == 0) return no_ipc();

  /* Each case in its own process: ipc is fixed when the allocator is made. */
  CHECK(run(argv[0], "--fd", NULL, 0, 0, NULL) == 0, "expandable segments, POSIX descriptors");
  CHECK(run(argv[0], "--fabric", NULL, 0, 0, "1") == 0, "expandable segments, fabric handles");
  CHECK(run(argv[0], "--fabric-refused", NULL, 0, 0, "2") == 0, "fabric refused: retried without");
  CHECK(run(argv[0], "--stitching", NULL, 0, 0, NULL) == 0, "stitching");
  CHECK(run(argv[0], "--legacy", NULL, 0, 0, NULL) == 0, "a cudaMalloc'd segment, legacy handle");
  CHECK(run(argv[0], "--no-ipc", NULL, 0, 0, NULL) == 0, "ipc:False");

  /* Malformed and stale handles fail clearly. */
  CHECK(stitch_configure("backend:cuda") == 0, "%s", stitch_last_error());
  unsigned char* plain = stitch_malloc(5000, 0, kStream);
  char handle[4096];
  CHECK(plain != NULL && stitch_ipc_export(plain, handle, sizeof handle) > 0, "%s", stitch_last_error());
  CHECK(stitch_ipc_import("stitch1:0:0:16:cuda-fd:1:", 0) == NULL, "a malformed handle must fail");
  CHECK(stitch_ipc_import("stitch1:0:0:16:cuda-fd:999999999:2097152/5", 0) == NULL, "an exporter that ended");
  CHECK(strstr(stitch_last_error(), "pidfd_open") != NULL, "%s", stitch_last_error());
  stitch_free(plain, 5000, 0, kStream);

  if (failures == 0) printf("ipc_fake_cuda: every check passed\n");
  return failures == 0 ? 0 : 1;
}
