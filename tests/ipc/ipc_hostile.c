/* tests/ipc/ipc_hostile.c — hostile IPC handles sent to a real second process, through stitch.h
 * alone: the exporter (this program) shares a block of expandable segments and one of a plain
 * segment, and writes to an importer (this program run again, by fork and exec: nothing is
 * inherited but the pipe) the true handle and, for each, handles a buggy or hostile peer could
 * send: offsets and sizes that wrap or run past the shared memory, pieces that wrap, lie past the
 * exporter's memfd, are not whole pages or larger than their allocation, descriptors, pids and
 * devices that are bad (negative too), other back ends' text, garbage and trailing bytes. The
 * importer must map the true handle to the same bytes (and write its own, which the exporter
 * sees), refuse every other with an error message, never crash, and leave its heap untouched:
 * malloc'd regions and anonymous mappings around it keep their patterns, and a refused import
 * leaves no descriptor open and no mapping of shared memory (a memfd) behind.
 * On backend:cuda (over the strict fake driver) a few cases can be judged by the driver alone (a
 * descriptor of the exporter that is not a CUDA export, a piece larger than the allocation behind
 * it, bytes of a legacy handle no driver wrote): each of those must fail with exactly the one
 * contract violation the fake counts for that call, and every other case with none.
 * usage: ipc_hostile sim | cuda        exit status 0: every check passed */
#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "stitch/stitch.h"
#include "support/c_check.h"

enum { kBytes = 3 << 20, kMaxHandle = 1 << 17 };
static void* const kStream = NULL;

/* ---- the importer's side ----------------------------------------------------------------------- */

/* The fake driver's violations of `rule` (0 without the fake). */
static unsigned long long rule_violations(int rule) {
  const char* path = getenv("STITCH_CUDA_DRIVER");
  void* lib = path != NULL ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
  if (lib == NULL) return 0;
  unsigned long long (*count)(int) = (unsigned long long (*)(int))dlsym(lib, "stitch_fake_cuda_rule_violations");
  return count != NULL ? count(rule) : 0;
}
enum { kRules = 15 };  /* STITCH_FAKE_CUDA_RULE_COUNT */

static size_t open_descriptors(void) {
  size_t n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (d == NULL) return 0;
  while (readdir(d) != NULL) ++n;
  closedir(d);
  return n;
}

/* Mappings of shared memory files (memfds): what an import maps (the simulated device's memory
 * and the fake driver's allocations are memfds). Counted by path, not in all: a sanitizer's
 * allocator maps anonymous memory of its own at any time. */
static size_t memfd_mappings(void) {
  FILE* f = fopen("/proc/self/maps", "r");
  char line[4096];
  size_t n = 0;
  if (f == NULL) return 0;
  while (fgets(line, sizeof line, f) != NULL) n += strstr(line, "/memfd:") != NULL;
  fclose(f);
  return n;
}

/* Canaries: malloc'd regions and anonymous mappings, each filled with a pattern of its own. */
enum { kHeap = 48, kMaps = 8 };
static unsigned char* heap[kHeap];
static size_t heap_bytes[kHeap];
static unsigned char* maps[kMaps];
static size_t maps_bytes[kMaps];

static unsigned char pattern(size_t region, size_t i) { return (unsigned char)(region * 37 + i * 11 + 5); }

static void plant_canaries(void) {
  for (size_t r = 0; r < kHeap; ++r) {
    heap_bytes[r] = (size_t)16 << (r % 17);  /* 16 B .. 1 MiB */
    heap[r] = malloc(heap_bytes[r]);
    for (size_t i = 0; heap[r] != NULL && i < heap_bytes[r]; ++i) heap[r][i] = pattern(r, i);
  }
  for (size_t r = 0; r < kMaps; ++r) {
    maps_bytes[r] = (size_t)(64 << 10) << r;  /* 64 KiB .. 8 MiB */
    void* p = mmap(NULL, maps_bytes[r], PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    maps[r] = p == MAP_FAILED ? NULL : p;
    for (size_t i = 0; maps[r] != NULL && i < maps_bytes[r]; i += 64) maps[r][i] = pattern(r + 100, i);
  }
}

static int canaries_intact(void) {
  for (size_t r = 0; r < kHeap; ++r)
    for (size_t i = 0; heap[r] != NULL && i < heap_bytes[r]; ++i)
      if (heap[r][i] != pattern(r, i)) return 0;
  for (size_t r = 0; r < kMaps; ++r)
    for (size_t i = 0; maps[r] != NULL && i < maps_bytes[r]; i += 64)
      if (maps[r][i] != pattern(r + 100, i)) return 0;
  return 1;
}

static int unhex(const char* text, char* out, size_t cap) {
  size_t n = strlen(text) / 2;
  if (n + 1 > cap) return -1;
  for (size_t i = 0; i < n; ++i) {
    unsigned v = 0;
    if (sscanf(text + 2 * i, "%2x", &v) != 1) return -1;
    out[i] = (char)v;
  }
  out[n] = '\0';
  return (int)n;
}

/* Reads "<rule> <device> <hex handle>" lines: rule -1 is a true handle (it must map `expect` in
 * every byte; `write` is written there, and expected from then on), any other a handle that must be refused, with a fake
 * driver's violation of that rule (0: none). */
static int importer(const char* conf, int expect, int write) {
  if (stitch_configure(conf) != 0) {
    fprintf(stderr, "importer: configure: %s\n", stitch_last_error());
    return 10;
  }
  plant_canaries();
  static char line[2 * kMaxHandle + 64], handle[kMaxHandle];
  int cases = 0, refused = 0;
  while (fgets(line, sizeof line, stdin) != NULL) {
    int rule = 0, device = 0, used = 0;
    if (sscanf(line, "%d %d %n", &rule, &device, &used) != 2) return 11;
    char* hex = line + used;
    hex[strcspn(hex, "\n")] = '\0';
    if (unhex(hex, handle, sizeof handle) < 0) return 12;
    ++cases;
    unsigned long long before[kRules];
    for (int r = 0; r < kRules; ++r) before[r] = rule_violations(r);
    const size_t fds = open_descriptors(), maps_before = memfd_mappings();
    unsigned char* p = stitch_ipc_import(handle, device);
    if (rule < 0) {
      CHECK(p != NULL, "the true handle must map: %s", stitch_last_error());
      if (p == NULL) continue;
      int same = 1;
      for (size_t i = 0; i < kBytes; ++i) same &= p[i] == (unsigned char)expect;
      CHECK(same, "the true handle maps other bytes than the exporter's");
      memset(p, write, kBytes);
      expect = write;  /* (what a later true import finds) */
      CHECK(stitch_ipc_close(p) == 0, "close: %s", stitch_last_error());
    } else {
      CHECK(p == NULL, "case %d was imported: %.160s", cases, handle);
      if (p != NULL) {
        (void)stitch_ipc_close(p);
        continue;
      }
      CHECK(stitch_last_error()[0] != '\0', "case %d failed without an error", cases);
      CHECK(open_descriptors() == fds, "case %d left a descriptor open: %.160s", cases, handle);
      CHECK(memfd_mappings() == maps_before, "case %d left a mapping: %.160s", cases, handle);
      for (int r = 0; r < kRules; ++r) {
        const unsigned long long want = before[r] + (r == rule && rule != 0 ? 1 : 0);
        CHECK(rule_violations(r) == want, "case %d: %llu violations of rule %d, %llu expected: %.160s", cases,
              rule_violations(r) - before[r], r, want - before[r], handle);
      }
      ++refused;
    }
    CHECK(canaries_intact(), "the importer's memory changed after case %d: %.160s", cases, handle);
  }
  printf("importer: %d handles, %d refused, canaries intact\n", cases, refused);
  return failures == 0 ? 0 : 13;
}

/* ---- the exporter's side ----------------------------------------------------------------------- */

static FILE* to_importer;

/* One case: `rule` as above, the device to import on, the handle (any bytes but NUL). */
static void send(int rule, int device, const char* handle) {
  fprintf(to_importer, "%d %d ", rule, device);
  for (const char* c = handle; *c != '\0'; ++c) fprintf(to_importer, "%02x", (unsigned char)*c);
  fputc('\n', to_importer);
}

/* A handle from its parts. */
static void sendf(int rule, const char* format, ...) __attribute__((format(printf, 2, 3)));
static void sendf(int rule, const char* format, ...) {
  static char text[kMaxHandle];
  va_list args;
  va_start(args, format);
  vsnprintf(text, sizeof text, format, args);
  va_end(args);
  send(rule, 0, text);
}

/* The cases every back end shares: the block's offset and size, devices, other back ends' text,
 * garbage. `share` is the true handle's back-end text, `total` what it maps. */
static void common_cases(const char* handle, const char* share, size_t total) {
  const char* max = "18446744073709551615";
  sendf(0, "stitch1:0:%s:2:%s", max, share);                 /* the issue's: an offset near 2^64 */
  sendf(0, "stitch1:0:%s:%s:%s", max, max, share);
  sendf(0, "stitch1:0:1:%s:%s", max, share);                  /* a size that wraps */
  sendf(0, "stitch1:0:18446744073709551616:0:%s", share);     /* past 2^64 */
  sendf(0, "stitch1:0:%zu:1:%s", total, share);               /* past the end */
  sendf(0, "stitch1:0:0:%zu:%s", total + 1, share);
  sendf(0, "stitch1:0:%zu:8192:%s", total - 4096, share);
  sendf(0, "stitch1:-1:0:16:%s", share);                      /* devices in the text */
  sendf(0, "stitch1:2147483648:0:16:%s", share);
  sendf(0, "stitch1:0:-16:16:%s", share);                     /* signs, spaces, leading zeros */
  sendf(0, "stitch1:0:+16:16:%s", share);
  sendf(0, "stitch1:0: 16:16:%s", share);
  sendf(0, "stitch1:0:016:16:%s", share);
  send(0, -1, handle);                                         /* bad devices to import on */
  send(0, 7, handle);
  send(0, INT_MIN, handle);
  sendf(0, "%s,", handle);                                      /* trailing bytes */
  sendf(0, "%sx", handle);
  sendf(0, "%s ", handle);
  sendf(0, "%s", "");
  sendf(0, "%s", "hello");
  sendf(0, "%s", "stitch1:");
  sendf(0, "%s", "stitch1:0:0:0:");
  sendf(0, "%s", "stitch2:0:0:16:sim:1:3:0+4096");
  char garbage[4097];
  unsigned seed = 12345;
  for (int round = 0; round < 8; ++round) {
    for (size_t i = 0; i + 1 < sizeof garbage; ++i) {
      seed = seed * 1103515245u + 12345u;
      garbage[i] = (char)(1 + (seed >> 16) % 255);
    }
    garbage[round == 0 ? 4096 : 64u << (round % 6)] = '\0';
    if (round >= 4) memcpy(garbage, "stitch1:0:0:16:", 15);
    send(0, 0, garbage);
  }
  static char digits[70000];
  memcpy(digits, "stitch1:0:", 10);
  memset(digits + 10, '9', sizeof digits - 11);
  digits[sizeof digits - 1] = '\0';
  send(0, 0, digits);
}

/* backend:sim's share: "sim:<pid>:<fd>:<offset>+<length>,..." */
static void sim_cases(const char* handle, const char* share) {
  int pid = 0, fd = 0, used = 0;
  if (sscanf(share, "sim:%d:%d:%n", &pid, &fd, &used) != 2 || used == 0) {
    CHECK(0, "not a sim share: %s", share);
    return;
  }
  const char* pieces = share + used;
  size_t total = 0;
  for (const char* c = pieces; *c != '\0';) {
    size_t off = 0, len = 0;
    int n = 0;
    if (sscanf(c, "%zu+%zu%n", &off, &len, &n) != 2) break;
    total += len;
    c += n + (c[n] == ',');
  }
  common_cases(handle, share, total);
  sendf(0, "stitch1:0:0:16:sim:%d:%d:0+8192,0+18446744073709547520", pid, fd);  /* the issue's */
  sendf(0, "stitch1:0:0:16:sim:%d:%d:18446744073709547520+8192", pid, fd);
  sendf(0, "stitch1:0:0:16:sim:%d:%d:1099511627776+4096", pid, fd);             /* past the memfd */
  sendf(0, "stitch1:0:0:16:sim:%d:%d:%s,1099511627776+1099511627776", pid, fd, pieces);
  sendf(0, "stitch1:0:0:16:sim:%d:%d:100+4096", pid, fd);                       /* not whole pages */
  sendf(0, "stitch1:0:0:16:sim:%d:%d:0+100", pid, fd);
  sendf(0, "stitch1:0:0:16:sim:%d:%d:0+0", pid, fd);
  sendf(0, "stitch1:0:0:16:sim:%d:%d:", pid, fd);
  sendf(0, "stitch1:0:0:16:sim:%d:%d:%s,", pid, fd, pieces);
  const int bad_fds[] = {0, 1, 2, 999999};
  for (size_t i = 0; i < sizeof bad_fds / sizeof *bad_fds; ++i)
    sendf(0, "stitch1:0:0:16:sim:%d:%d:%s", pid, bad_fds[i], pieces);
  sendf(0, "stitch1:0:0:16:sim:%d:-1:%s", pid, pieces);
  sendf(0, "stitch1:0:0:16:sim:%d:2147483648:%s", pid, pieces);
  const char* bad_pids[] = {"0", "-1", "1", "4194305", "2147483647", "99999999999"};
  for (size_t i = 0; i < sizeof bad_pids / sizeof *bad_pids; ++i)
    sendf(0, "stitch1:0:0:16:sim:%s:%d:%s", bad_pids[i], fd, pieces);
  sendf(0, "stitch1:0:0:16:cuda-fd:%d:2097152/%d", pid, fd);                    /* other back ends */
  sendf(0, "stitch1:0:0:16:cuda-ipc:0:%0128d", 0);
  sendf(0, "stitch1:0:0:16:cuda-fabric:2097152/%0128d", 0);
}

/* backend:cuda's share: "cuda-fd:<pid>:<bytes>/<fd>,..." or "cuda-ipc:<bytes>:<hex>". */
static void cuda_cases(const char* handle, const char* share) {
  int pid = 0, fd = 0, used = 0;
  size_t bytes = 0;
  char hex[129] = {0};
  if (sscanf(share, "cuda-fd:%d:%zu/%d%n", &pid, &bytes, &fd, &used) == 3) {
    size_t total = 0;
    for (const char* c = strchr(share + 8, ':') + 1; *c != '\0';) {
      size_t b = 0;
      int f = 0, n = 0;
      if (sscanf(c, "%zu/%d%n", &b, &f, &n) != 2) break;
      total += b;
      c += n + (c[n] == ',');
    }
    common_cases(handle, share, total);
    sendf(0, "stitch1:0:0:16:cuda-fd:%d:18446744073709551615/%d,2097152/%d", pid, fd, fd);  /* wraps */
    sendf(0, "stitch1:0:0:16:cuda-fd:%d:4096/%d", pid, fd);                  /* not whole pages */
    sendf(0, "stitch1:0:0:16:cuda-fd:%d:0/%d", pid, fd);
    sendf(0, "stitch1:0:0:16:cuda-fd:%d:%zu/%d,", pid, bytes, fd);
    sendf(0, "stitch1:0:0:16:cuda-fd:%d:%zu/-1", pid, bytes);                  /* descriptors */
    sendf(0, "stitch1:0:0:16:cuda-fd:%d:%zu/2147483648", pid, bytes);
    sendf(0, "stitch1:0:0:16:cuda-fd:%d:%zu/999999", pid, bytes);
    const char* bad_pids[] = {"0", "-1", "4194305", "2147483647", "99999999999"};
    for (size_t i = 0; i < sizeof bad_pids / sizeof *bad_pids; ++i)
      sendf(0, "stitch1:0:0:16:cuda-fd:%s:%zu/%d", bad_pids[i], bytes, fd);
    /* Only the driver can judge these: a descriptor of the exporter that is no CUDA export
     * (rule 14 in the fake), a piece larger than the allocation behind it (rule 4). */
    sendf(14, "stitch1:0:0:16:cuda-fd:%d:%zu/0", pid, bytes);
    sendf(4, "stitch1:0:0:16:cuda-fd:%d:%zu/%d", pid, 4 * bytes, fd);
    sendf(0, "stitch1:0:0:16:cuda-fabric:2097152/%0128d", 0);  /* (the fake has no fabric here) */
    sendf(0, "stitch1:0:0:16:sim:%d:3:0+4096", pid);
    return;
  }
  if (sscanf(share, "cuda-ipc:%zu:%128s", &bytes, hex) == 2) {
    common_cases(handle, share, bytes);
    sendf(0, "stitch1:0:0:16:cuda-ipc:%zu:%s", 2 * bytes, hex);  /* a size the driver does not give */
    sendf(0, "stitch1:0:0:16:cuda-ipc:%zu:%s", bytes - 512, hex);
    sendf(0, "stitch1:0:0:16:cuda-ipc:18446744073709551615:%s", hex);
    sendf(0, "stitch1:0:%zu:16:cuda-ipc:0:%s", bytes, hex);     /* past the driver's size */
    sendf(0, "stitch1:0:0:16:cuda-ipc:0:%.127s", hex);
    sendf(0, "stitch1:0:0:16:cuda-ipc:0:%sff", hex);
    sendf(14, "stitch1:0:0:16:cuda-ipc:0:%0128d", 0);            /* bytes no driver wrote */
    /* The true handle with the allocation's length and size inflated (the fake driver's layout:
     * bytes 24..31 and 32..39): the driver knows its allocations and refuses it, no violation. */
    char inflated[129];
    memcpy(inflated, hex, sizeof inflated);
    for (int at = 24; at < 40; at += 8) {
      unsigned long long v = 0;
      for (int k = 7; k >= 0; --k) {
        unsigned b = 0;
        sscanf(inflated + 2 * (at + k), "%2x", &b);
        v = v << 8 | b;
      }
      v *= 4;
      for (int k = 0; k < 8; ++k, v >>= 8) {
        inflated[2 * (at + k)] = "0123456789abcdef"[(v >> 4) & 15];
        inflated[2 * (at + k) + 1] = "0123456789abcdef"[v & 15];
      }
    }
    sendf(0, "stitch1:0:0:16:cuda-ipc:0:%s", inflated);
    return;
  }
  CHECK(0, "not a cuda share: %s", share);
}

/* Shares one block under the current configuration with an importer running `conf`. */
static void share_block(const char* self, const char* conf, int cuda) {
  unsigned char* live = stitch_malloc(1 << 20, 0, kStream); /* a neighbour */
  unsigned char* block = stitch_malloc(kBytes, 0, kStream);
  CHECK(live != NULL && block != NULL, "%s", stitch_last_error());
  if (block == NULL) return;
  memset(block, 0xA5, kBytes);
  const size_t need = stitch_ipc_export(block, NULL, 0);
  CHECK(need > 0 && need < kMaxHandle, "size query: %s", stitch_last_error());
  static char handle[kMaxHandle];
  const size_t n = stitch_ipc_export(block, handle, sizeof handle);
  CHECK(n > 0 && n < need, "export: %s", stitch_last_error());
  int p[2];
  if (pipe(p) != 0) return;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(p[0], 0);
    close(p[0]);
    close(p[1]);
    execl(self, self, "--importer", conf, "165", "60", (char*)NULL);
    _exit(127);
  }
  close(p[0]);
  to_importer = fdopen(p[1], "w");
  int d = 0, used = 0;
  size_t off = 0, size = 0;
  if (sscanf(handle, "stitch1:%d:%zu:%zu:%n", &d, &off, &size, &used) == 3 && used > 0) {
    send(-1, 0, handle);
    if (cuda) cuda_cases(handle, handle + used);
    else sim_cases(handle, handle + used);
    send(-1, 0, handle); /* and the true handle still maps */
  } else {
    CHECK(0, "not a stitch1 handle: %s", handle);
  }
  fclose(to_importer);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the importer %s (%d)",
        WIFEXITED(status) ? "failed" : "crashed", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
  int seen = 1;
  for (size_t i = 0; i < kBytes; ++i) seen &= block[i] == 60;
  CHECK(seen, "the importer's writes are not in the exporter's block");
  stitch_free(block, kBytes, 0, kStream);
  stitch_free(live, 1 << 20, 0, kStream);
}

int main(int argc, char** argv) {
  if (argc == 5 && strcmp(argv[1], "--importer") == 0) return importer(argv[2], atoi(argv[3]), atoi(argv[4]));
  if (argc != 2 || (strcmp(argv[1], "sim") != 0 && strcmp(argv[1], "cuda") != 0)) {
    fprintf(stderr, "usage: ipc_hostile sim | cuda\n");
    return 2;
  }
  const int cuda = strcmp(argv[1], "cuda") == 0;
  if (cuda && getenv("STITCH_CUDA_DRIVER") == NULL) {
    fprintf(stderr, "set STITCH_CUDA_DRIVER to the fake driver (libstitch_fake_cuda.so)\n");
    return 2;
  }
  const char* conf = cuda ? "backend:cuda,expandable_segments:True" : "backend:sim,sim_capacity_mb:512,expandable_segments:True";
  if (stitch_configure(conf) != 0) {
    fprintf(stderr, "configure: %s\n", stitch_last_error());
    return 1;
  }
  const char* importer_conf = cuda ? "backend:cuda" : "backend:sim,sim_capacity_mb:64";
  share_block(argv[0], importer_conf, cuda);  /* a block of expandable segments */
  CHECK(stitch_configure("expandable_segments:False") == 0, "%s", stitch_last_error());
  CHECK(stitch_empty_cache(-1) == 0, "%s", stitch_last_error());
  share_block(argv[0], importer_conf, cuda);  /* a block of a plain segment */
  if (failures == 0) printf("ipc_hostile %s: every check passed\n", argv[1]);
  return failures == 0 ? 0 : 1;
}
