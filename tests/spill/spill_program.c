/* tests/spill/spill_program.c — spill through stitch.h alone, as a C program drives it on the
 * simulated device (256 MiB): `all` overfills the device with untagged and tagged memory under
 * spill:all, `tags` under spill:tags, `host` runs the host budget (sim_host_mb) out. Each checks
 * every byte of every live block at its address after every step (and `all` that the rule spill:all
 * relies on is named on stderr once), that device reserved memory
 * never exceeds the device, that freeing brings everything back (spilled_bytes 0, stitch_unspill
 * 0), and that errors are errors with a message. Exit status 0 = pass. */
#define _POSIX_C_SOURCE 200809L /* dup, dup2 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stitch/stitch.h"
#include "support/c_check.h"

#define MiB ((size_t)1 << 20)
#define DEVICE_MB 256
#define MAX_BLOCKS 256

typedef struct {
  unsigned char* ptr;
  size_t size;
  unsigned seed;
} block_t;

static block_t blocks[MAX_BLOCKS];
static int nblocks = 0;

static void fill(block_t* b) {
  for (size_t i = 0; i < b->size; i += 4093) b->ptr[i] = (unsigned char)(b->seed * 31u + i * 7u);
  b->ptr[b->size - 1] = (unsigned char)(b->seed ^ 0x5a);
}

static int intact(const block_t* b) {
  for (size_t i = 0; i < b->size; i += 4093)
    if (b->ptr[i] != (unsigned char)(b->seed * 31u + i * 7u)) return 0;
  return b->ptr[b->size - 1] == (unsigned char)(b->seed ^ 0x5a);
}

static int64_t stat(const char* key) { return stitch_stat(0, key); }

static const char* backend = "backend:sim,sim_capacity_mb:256";
static int on_sim = 1;

/* Configures `backend` with `keys`. */
static void configure(const char* keys) {
  char conf[512];
  snprintf(conf, sizeof conf, "%s,%s", backend, keys);
  CHECK(stitch_configure(conf) == 0, "configure %s: %s", conf, stitch_last_error());
}

static void check_all(const char* when) {
  for (int i = 0; i < nblocks; ++i)
    CHECK(intact(&blocks[i]), "%s: block %d at %p (%zu bytes) lost its data", when, i,
          (void*)blocks[i].ptr, blocks[i].size);
  CHECK(stat("reserved_bytes.all.current") <= (int64_t)(DEVICE_MB * MiB),
        "%s: reserved %lld bytes on a %d MiB device", when, (long long)stat("reserved_bytes.all.current"),
        DEVICE_MB);
  /* Blocks never overlap: every address is its own. */
  for (int i = 0; i < nblocks; ++i)
    for (int j = i + 1; j < nblocks; ++j)
      CHECK(blocks[i].ptr + blocks[i].size <= blocks[j].ptr || blocks[j].ptr + blocks[j].size <= blocks[i].ptr,
            "%s: blocks %d and %d overlap", when, i, j);
}

/* Allocates `size` bytes (under `tag` with `flags` when not NULL); 0 when it failed. */
static int add(size_t size, const char* tag, int flags) {
  if (nblocks == MAX_BLOCKS) return 0;
  if (tag != NULL) CHECK(stitch_region_begin(tag, flags) == 0, "region_begin: %s", stitch_last_error());
  void* p = stitch_malloc(size, 0, NULL);
  if (tag != NULL) CHECK(stitch_region_end() == 0, "region_end: %s", stitch_last_error());
  if (p == NULL) return 0;
  block_t* b = &blocks[nblocks++];
  b->ptr = (unsigned char*)p;
  b->size = size;
  b->seed = (unsigned)nblocks * 2654435761u;
  fill(b);
  return 1;
}

static void drop(int i) {
  stitch_free(blocks[i].ptr, blocks[i].size, 0, NULL);
  blocks[i] = blocks[--nblocks];
}

static void free_all(void) {
  while (nblocks > 0) drop(nblocks - 1);
}

/* spill:all names its rule on stderr once per process, when the allocator takes it: the first
 * request (which makes the allocator) prints it, a second configuration with spill:all does not. */
static void check_rule_named_once(void) {
  char text[4096];
  size_t n = 0, named = 0;
  void* p;
  int again;
  FILE* log = tmpfile();
  const int saved = dup(2);
  CHECK(log != NULL && saved >= 0, "tmpfile or dup failed");
  if (log == NULL || saved < 0) return;
  fflush(stderr);
  dup2(fileno(log), 2);
  configure("expandable_segments:True,spill:all");
  p = stitch_malloc(MiB, 0, NULL);
  again = stitch_configure("spill:all");
  stitch_free(p, MiB, 0, NULL);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  rewind(log);
  n = fread(text, 1, sizeof text - 1, log);
  text[n] = '\0';
  fclose(log);
  for (const char* at = text; (at = strstr(at, "stitch: spill:all")) != NULL; ++at) ++named;
  CHECK(p != NULL && again == 0, "the first request or the second configuration failed: %s", stitch_last_error());
  CHECK(named == 1, "spill:all's rule is named %zu times on stderr, not once: %s", named, text);
  CHECK(strstr(text, "docs/spill.md") != NULL, "the rule names where it is explained: %s", text);
}

static void run_all(void) {
  check_rule_named_once();
  configure("expandable_segments:True,spill:all");
  /* Twice the device: tagged weights (spillable), a tagged KV cache (not), untagged activations. */
  size_t live = 0;
  for (int i = 0; i < 4; ++i) {
    CHECK(add(16 * MiB, "weights", STITCH_REGION_SPILL), "weights %d", i);
    live += 16 * MiB;
  }
  CHECK(add(24 * MiB, "kv", 0), "kv");
  live += 24 * MiB;
  for (int i = 0; live < 2 * DEVICE_MB * MiB; ++i) {
    const size_t size = (size_t)(3 + (i * 7) % 29) * MiB + (size_t)(i % 5) * 4096;
    CHECK(add(size, NULL, 0), "untagged %d (%zu bytes live): %s", i, live, stitch_last_error());
    live += size;
    if (i % 6 == 5) {
      live -= blocks[nblocks / 2].size;
      drop(nblocks / 2);
    }
    if (i % 8 == 0) check_all("filling");
  }
  check_all("full");
  CHECK(stat("spilled_bytes.current") > 0, "nothing spilled");
  CHECK(stat("num_spills") > 0, "num_spills is 0");
  CHECK(stat("allocated_bytes.all.current") > (int64_t)(DEVICE_MB * MiB), "live memory does not exceed the device");
  /* The residency report names spilled memory. */
  char buf[8192];
  CHECK(stitch_residency(0, buf, sizeof buf) > 0 && strstr(buf, "\"spilled_bytes\"") != NULL, "residency: %s", buf);
  /* Free every other block: what fits comes back at empty_cache; all of it after the rest. */
  for (int i = nblocks - 1; i >= 0; i -= 2) drop(i);
  check_all("half freed");
  CHECK(stitch_empty_cache(-1) == 0, "empty_cache: %s", stitch_last_error());
  check_all("after empty_cache");
  free_all();
  CHECK(stat("spilled_bytes.current") == 0, "%lld bytes stay spilled with nothing live",
        (long long)stat("spilled_bytes.current"));
  CHECK(stitch_unspill(0, NULL) == 0, "unspill: %s", stitch_last_error());
}

static void run_tags(void) {
  configure("expandable_segments:True,spill:tags");
  for (int i = 0; i < 6; ++i) CHECK(add(20 * MiB, "optimizer", STITCH_REGION_SPILL), "optimizer %d", i);
  for (int i = 0; i < 2; ++i) CHECK(add(20 * MiB, "kv", 0), "kv %d", i);
  /* Untagged memory past the device: the optimizer states move. */
  int untagged = 0;
  while (add(20 * MiB, NULL, 0)) ++untagged;
  CHECK(untagged >= 8, "only %d untagged blocks fit (the optimizer's 120 MiB could move)", untagged);
  CHECK(strncmp(stitch_last_error(), "CUDA out of memory", 18) == 0, "the last failure: %s", stitch_last_error());
  check_all("tags full");
  CHECK(stat("spilled_bytes.current") >= (int64_t)(100 * MiB), "spilled %lld", (long long)stat("spilled_bytes.current"));
  /* Errors: a tag without the flag, a tag never used, bad flags. */
  CHECK(stitch_spill(0, "kv", 0) != 0 && strstr(stitch_last_error(), "'kv'") != NULL, "spill kv: %s", stitch_last_error());
  CHECK(stitch_spill(0, "nope", 0) != 0 && strstr(stitch_last_error(), "nope") != NULL, "spill nope: %s", stitch_last_error());
  CHECK(stitch_region_begin("x", 8) != 0, "flags 8 accepted");
  /* Unspill with the device full: an OOM error naming the tag; the data stays usable. */
  CHECK(stitch_unspill(0, "optimizer") != 0 && strstr(stitch_last_error(), "optimizer") != NULL,
        "unspill on a full device: %s", stitch_last_error());
  check_all("failed unspill");
  /* Free the untagged blocks, then everything comes back. */
  for (int i = nblocks - 1; i >= 0; --i)
    if (i >= 8) drop(i);
  CHECK(stitch_unspill(0, NULL) == 0, "unspill: %s", stitch_last_error());
  CHECK(stat("spilled_bytes.current") == 0, "spilled after unspill: %lld", (long long)stat("spilled_bytes.current"));
  check_all("unspilled");
  /* Explicit spill of part, then of all, then back. */
  CHECK(stitch_spill(0, "optimizer", 30 * MiB) == 0, "spill 30 MiB: %s", stitch_last_error());
  CHECK(stat("spilled_bytes.current") >= (int64_t)(30 * MiB), "spilled %lld", (long long)stat("spilled_bytes.current"));
  CHECK(stitch_spill(0, NULL, 0) == 0, "spill all: %s", stitch_last_error());
  check_all("spilled again");
  CHECK(stitch_unspill(-1, NULL) == 0, "unspill: %s", stitch_last_error());
  check_all("back");
  free_all();
}

static void run_host(void) {
  configure(on_sim ? "sim_host_mb:64,expandable_segments:True,spill:all" : "expandable_segments:True,spill:all");
  int n = 0;
  while (add(20 * MiB, n % 2 ? "w" : NULL, STITCH_REGION_SPILL)) ++n;
  CHECK(n >= 12 && n < 20, "%d blocks of 20 MiB fit a 256 MiB device with 64 MiB of host", n);
  CHECK(strncmp(stitch_last_error(), "CUDA out of memory", 18) == 0, "the last failure: %s", stitch_last_error());
  CHECK(stat("spilled_bytes.current") <= (int64_t)(64 * MiB), "spilled %lld past the host budget",
        (long long)stat("spilled_bytes.current"));
  check_all("host full");
  /* An explicit spill the host cannot take changes nothing. */
  const int64_t spilled = stat("spilled_bytes.current");
  const int64_t reserved = stat("reserved_bytes.all.current");
  CHECK(stitch_spill(0, "w", 0) != 0, "a spill past the host budget succeeded");
  CHECK(stat("spilled_bytes.current") == spilled && stat("reserved_bytes.all.current") == reserved,
        "a refused spill changed something");
  check_all("refused spill");
  free_all();
  CHECK(stat("spilled_bytes.current") == 0, "spilled with nothing live");
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "all";
  if (argc > 2) {
    backend = argv[2];
    on_sim = strstr(backend, "backend:sim") != NULL;
  }
  if (strcmp(mode, "all") == 0) {
    run_all();
  } else if (strcmp(mode, "tags") == 0) {
    run_tags();
  } else if (strcmp(mode, "host") == 0) {
    run_host();
  } else {
    fprintf(stderr, "usage: spill_program all|tags|host\n");
    return 2;
  }
  if (failures != 0) {
    fprintf(stderr, "spill_program %s: %d check(s) failed\n", mode, failures);
    return 1;
  }
  printf("spill_program %s: ok\n", mode);
  return 0;
}
