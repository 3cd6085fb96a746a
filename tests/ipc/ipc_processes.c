/* tests/ipc/ipc_processes.c — blocks shared between processes through stitch.h (stitch_ipc_export,
 * stitch_ipc_import, stitch_ipc_close) on the simulated device, as two programs use them: the
 * parent exports a block it filled, a second process (this program run again with --peer, by
 * fork and exec, so nothing is inherited) imports it, checks every byte, writes its own pattern and
 * closes it; the parent then sees the peer's bytes (the pages are shared, not copied). Also: the
 * same process imports its own block; errors are clear (a pointer that starts no block, a plain
 * segment, a buffer too small, a malformed handle, a handle of an exporter that ended, a close of
 * another pointer); a tag with an exported block refuses to sleep; the block's pin ends at its free.
 * usage: ipc_processes            exit status 0: every check passed */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "stitch/stitch.h"

static int failures = 0;
#define CHECK(cond, ...)                                     \
  do {                                                       \
    if (!(cond)) {                                           \
      fprintf(stderr, "FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                          \
      fprintf(stderr, "\n");                                 \
      ++failures;                                            \
    }                                                        \
  } while (0)

enum { kBytes = 3 << 20 };

static int run_peer(const char* self, const char* handle, int expect, int write) {
  pid_t pid = fork();
  if (pid == 0) {
    char e[16], w[16];
    snprintf(e, sizeof e, "%d", expect);
    snprintf(w, sizeof w, "%d", write);
    execl(self, self, "--peer", handle, e, w, (char*)NULL);
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

/* The second process: imports, checks `expect` everywhere, writes `write`, closes. */
static int peer(const char* handle, int expect, int write) {
  if (stitch_configure("backend:sim,expandable_segments:True") != 0) return 10;
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
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 5 && strcmp(argv[1], "--peer") == 0) return peer(argv[2], atoi(argv[3]), atoi(argv[4]));
  if (stitch_configure("backend:sim,sim_capacity_mb:512,expandable_segments:True") != 0) {
    fprintf(stderr, "configure: %s\n", stitch_last_error());
    return 1;
  }
  void* stream = (void*)0x10;
  unsigned char* live = stitch_malloc(1 << 20, 0, stream); /* a neighbour in the same range */
  unsigned char* block = stitch_malloc(kBytes, 0, stream);
  CHECK(live != NULL && block != NULL, "%s", stitch_last_error());
  memset(block, 0xA5, kBytes);

  /* The handle, with a buffer too small first. */
  char small[8];
  CHECK(stitch_ipc_export(block, small, sizeof small) == 0, "a small buffer must fail");
  CHECK(strstr(stitch_last_error(), "needs") != NULL, "the error says the length needed: %s", stitch_last_error());
  char handle[512];
  size_t n = stitch_ipc_export(block, handle, sizeof handle);
  CHECK(n > 0 && n == strlen(handle), "export: %s", stitch_last_error());

  /* Another process reads the bytes and writes its own; the parent sees them. */
  CHECK(run_peer(argv[0], handle, 0xA5, 0x3C) == 0, "the peer failed");
  int same = 1;
  for (size_t i = 0; i < kBytes; ++i) same &= block[i] == 0x3C;
  CHECK(same, "the peer's writes are not in the exporter's block");
  /* Twice: a second importer, later. */
  CHECK(run_peer(argv[0], handle, 0x3C, 0x11) == 0, "the second peer failed");
  CHECK(block[kBytes - 1] == 0x11, "second peer's write");

  /* The same process: two addresses, one memory. */
  unsigned char* again = stitch_ipc_import(handle, 0);
  CHECK(again != NULL && again != block, "self import: %s", stitch_last_error());
  if (again != NULL) {
    again[7] = 0x77;
    CHECK(block[7] == 0x77, "self import does not alias");
    CHECK(stitch_ipc_close(again) == 0, "close: %s", stitch_last_error());
  }
  CHECK(stitch_ipc_close(again) != 0, "a second close must fail");
  CHECK(stitch_ipc_close(block) != 0, "closing a block never imported must fail");

  /* Errors. */
  CHECK(stitch_ipc_export(block + 512, handle + 256, 256) == 0, "an interior pointer must fail");
  CHECK(stitch_ipc_import("stitch1:0:0:16:sim:1:1:", 0) == NULL, "a malformed handle must fail");
  CHECK(stitch_ipc_import("hello", 0) == NULL, "not a handle");
  CHECK(strstr(stitch_last_error(), "not a handle") != NULL, "%s", stitch_last_error());

  /* A handle of an exporter that ended: the peer exports and exits; the import fails clearly. */
  /* (the exporter here is this process, so simulate with a pid that cannot exist) */
  char stale[512];
  snprintf(stale, sizeof stale, "stitch1:0:0:4096:sim:%d:3:0+2097152", 0x3fffffff);
  CHECK(stitch_ipc_import(stale, 0) == NULL, "a handle of an ended exporter must fail");
  CHECK(strstr(stitch_last_error(), "exporting process ended") != NULL, "%s", stitch_last_error());

  /* A tag with an exported block refuses to sleep, naming the tag. */
  CHECK(stitch_region_begin("weights", 0) == 0, "%s", stitch_last_error());
  unsigned char* w = stitch_malloc(1 << 20, 0, stream);
  CHECK(stitch_region_end() == 0, "%s", stitch_last_error());
  char wh[512];
  CHECK(stitch_ipc_export(w, wh, sizeof wh) > 0, "export weights: %s", stitch_last_error());
  CHECK(stitch_sleep(0, "weights", NULL) != 0, "sleep must refuse an exported block");
  CHECK(strstr(stitch_last_error(), "weights") != NULL && strstr(stitch_last_error(), "pinned") != NULL,
        "%s", stitch_last_error());
  stitch_free(w, 1 << 20, 0, stream);
  CHECK(stitch_sleep(0, "weights", NULL) == 0, "after the free the tag sleeps: %s", stitch_last_error());
  CHECK(stitch_wake(0, "weights") == 0, "%s", stitch_last_error());

  stitch_free(block, kBytes, 0, stream);
  stitch_free(live, 1 << 20, 0, stream);

  /* Plain segments are shared too: a block in the middle of one. */
  CHECK(stitch_configure("expandable_segments:False") == 0, "%s", stitch_last_error());
  CHECK(stitch_empty_cache(-1) == 0, "%s", stitch_last_error());
  unsigned char* first = stitch_malloc(1000, 0, stream);
  unsigned char* plain = stitch_malloc(5000, 0, stream); /* inside the same 2 MiB segment */
  CHECK(first != NULL && plain != NULL, "%s", stitch_last_error());
  memset(plain, 0xA5, 5000);
  CHECK(stitch_ipc_export(plain, handle, sizeof handle) > 0, "plain export: %s", stitch_last_error());
  unsigned char* seen = stitch_ipc_import(handle, 0);
  CHECK(seen != NULL && seen[0] == 0xA5 && seen[4999] == 0xA5, "plain import: %s", stitch_last_error());
  if (seen != NULL) {
    seen[4999] = 0x01;
    CHECK(plain[4999] == 0x01, "plain import does not alias");
    CHECK(stitch_ipc_close(seen) == 0, "%s", stitch_last_error());
  }
  stitch_free(plain, 5000, 0, stream);
  stitch_free(first, 1000, 0, stream);

  if (failures == 0) printf("ipc_processes: every check passed\n");
  return failures == 0 ? 0 : 1;
}
