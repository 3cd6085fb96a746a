/* tests/torch_native/pytorch_side.c — PyTorch's own allocator's side of a CUDA IPC exchange, on
 * the driver STITCH_CUDA_DRIVER names (the strict fake in CI), as PyTorch 2.15's
 * CUDACachingAllocator does it: handles of type 'c' (cudaIpcGetMemHandle of a cudaMalloc'd
 * segment) and 'e' (expandable segments: ShareHeader {pid, segment_size, num_handles,
 * handle_type}, then one POSIX file descriptor per page, which the receiver takes with
 * pidfd_open + pidfd_getfd, imports, and maps in a row). No stitch code: the other process of
 * tests/torch_native/torch_ipc_formats_test.cpp.
 *   pytorch_side receive <hex handle> <offset> <bytes> <expect> <write>
 *       maps the handle, checks `expect` in every byte of the block, writes `write`; exit 0
 *   pytorch_side export-e <version 2|3> <fill> | export-c <fill>
 *       makes 4 MiB (two 2 MiB pages, or one cudaMalloc), fills it, prints the handle in hex and
 *       its block offset; then reads "check <value>" from stdin and exits 0 if the memory holds
 *       `value` at both ends. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

struct ShareHeader { /* PyTorch's (version 3; version 2 ends before handle_type) */
  int32_t pid;
  uint64_t segment_size;
  uint64_t num_handles;
  int32_t handle_type;
};

static void* lib;
#define SYM(name) ((__typeof__(&name))sym(#name))
static void* sym(const char* name) {
  void* p = dlsym(lib, name);
  if (p == NULL) {
    fprintf(stderr, "pytorch_side: the driver has no %s\n", name);
    exit(90);
  }
  return p;
}
#define DRV(call)                                                       \
  do {                                                                  \
    CUresult r_ = (call);                                               \
    if (r_ != CUDA_SUCCESS) {                                           \
      fprintf(stderr, "pytorch_side: %s failed: %d\n", #call, (int)r_); \
      exit(91);                                                         \
    }                                                                   \
  } while (0)

static const size_t kPage = 2u << 20;

static void to_hex(const unsigned char* b, size_t n) {
  for (size_t i = 0; i < n; ++i) printf("%02x", b[i]);
}
static size_t from_hex(const char* s, unsigned char* out, size_t cap) {
  size_t n = 0;
  for (; s[0] && s[1] && n < cap; s += 2) {
    unsigned v;
    if (sscanf(s, "%2x", &v) != 1) break;
    out[n++] = (unsigned char)v;
  }
  return n;
}

static CUcontext context(void) {
  DRV(SYM(cuInit)(0));
  CUcontext ctx;
  DRV(SYM(cuDevicePrimaryCtxRetain)(&ctx, 0));
  DRV(SYM(cuCtxSetCurrent)(ctx));
  return ctx;
}

static CUmemAccessDesc rw(void) {
  CUmemAccessDesc a;
  memset(&a, 0, sizeof a);
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = 0;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return a;
}

/* PyTorch's getIpcDevPtr: the base of what the handle shares. */
static unsigned char* receive(const unsigned char* h, size_t n) {
  if (n < 2) exit(80);
  if (h[1] == 'c') {
    CUipcMemHandle ipc;
    if (n != 2 + sizeof ipc) exit(81);
    memcpy(&ipc, h + 2, sizeof ipc);
    CUdeviceptr p;
    DRV(SYM(cuIpcOpenMemHandle_v2)(&p, ipc, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    return (unsigned char*)(uintptr_t)p;
  }
  if (h[1] != 'e' || h[0] != 3) exit(82);
  struct ShareHeader header;
  if (n < 2 + sizeof header) exit(83);
  memcpy(&header, h + 2, sizeof header);
  if (header.handle_type != 1 || n != 2 + sizeof header + header.num_handles * sizeof(int)) exit(84);
  const int pidfd = (int)syscall(SYS_pidfd_open, header.pid, 0);
  if (pidfd < 0) exit(85);
  CUdeviceptr va;
  DRV(SYM(cuMemAddressReserve)(&va, header.segment_size * header.num_handles, 0, 0, 0));
  for (uint64_t i = 0; i < header.num_handles; ++i) {
    int fd;
    memcpy(&fd, h + 2 + sizeof header + i * sizeof fd, sizeof fd);
    const int mine = (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0);
    if (mine < 0) exit(86);
    CUmemGenericAllocationHandle handle;
    DRV(SYM(cuMemImportFromShareableHandle)(&handle, (void*)(uintptr_t)mine, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(mine);
    DRV(SYM(cuMemMap)(va + i * header.segment_size, header.segment_size, 0, handle, 0));
    DRV(SYM(cuMemRelease)(handle));
  }
  close(pidfd);
  const CUmemAccessDesc a = rw();
  DRV(SYM(cuMemSetAccess)(va, header.segment_size * header.num_handles, &a, 1));
  return (unsigned char*)(uintptr_t)va;
}

static int wait_and_check(const unsigned char* p, size_t bytes) {
  fflush(stdout);
  char line[64];
  int value = -1;
  if (fgets(line, sizeof line, stdin) == NULL || sscanf(line, "check %d", &value) != 1) return 70;
  return p[0] == (unsigned char)value && p[bytes - 1] == (unsigned char)value ? 0 : 71;
}

int main(int argc, char** argv) {
  const char* driver = getenv("STITCH_CUDA_DRIVER");
  lib = driver != NULL ? dlopen(driver, RTLD_NOW) : NULL;
  if (lib == NULL || argc < 2) return 2;
  context();
  if (strcmp(argv[1], "receive") == 0 && argc == 7) {
    static unsigned char h[8192];
    const size_t n = from_hex(argv[2], h, sizeof h);
    const size_t offset = strtoull(argv[3], NULL, 10), bytes = strtoull(argv[4], NULL, 10);
    unsigned char* p = receive(h, n) + offset;
    for (size_t i = 0; i < bytes; ++i)
      if (p[i] != (unsigned char)atoi(argv[5])) return 60;
    memset(p, atoi(argv[6]), bytes);
    return 0;
  }
  if (strcmp(argv[1], "export-e") == 0 && argc == 4) {
    const int version = atoi(argv[2]);
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUdeviceptr va;
    DRV(SYM(cuMemAddressReserve)(&va, 2 * kPage, 0, 0, 0));
    int fds[2];
    for (int i = 0; i < 2; ++i) {
      CUmemGenericAllocationHandle handle;
      DRV(SYM(cuMemCreate)(&handle, kPage, &prop, 0));
      DRV(SYM(cuMemMap)(va + i * kPage, kPage, 0, handle, 0));
      DRV(SYM(cuMemExportToShareableHandle)(&fds[i], handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    }
    const CUmemAccessDesc a = rw();
    DRV(SYM(cuMemSetAccess)(va, 2 * kPage, &a, 1));
    unsigned char* p = (unsigned char*)(uintptr_t)va;
    memset(p, atoi(argv[3]), 2 * kPage);
    struct ShareHeader header = {(int32_t)getpid(), kPage, 2, 1};
    unsigned char out[2 + sizeof header + sizeof fds];
    out[0] = (unsigned char)version;
    out[1] = 'e';
    const size_t hb = version >= 3 ? sizeof header : 24;
    memcpy(out + 2, &header, hb);
    memcpy(out + 2 + hb, fds, sizeof fds);
    to_hex(out, 2 + hb + sizeof fds);
    printf(" 4096\n"); /* the block: 4 KiB into the segment */
    return wait_and_check(p + 4096, 2 * kPage - 4096);
  }
  if (strcmp(argv[1], "export-c") == 0 && argc == 3) {
    CUdeviceptr d;
    DRV(SYM(cuMemAlloc_v2)(&d, 2 * kPage));
    unsigned char* p = (unsigned char*)(uintptr_t)d;
    memset(p, atoi(argv[2]), 2 * kPage);
    CUipcMemHandle ipc;
    DRV(SYM(cuIpcGetMemHandle)(&ipc, d));
    unsigned char out[2 + sizeof ipc];
    out[0] = 3;
    out[1] = 'c';
    memcpy(out + 2, &ipc, sizeof ipc);
    to_hex(out, sizeof out);
    printf(" 512\n");
    return wait_and_check(p + 512, 2 * kPage - 512);
  }
  return 2;
}
