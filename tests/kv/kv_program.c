/* tests/kv/kv_program.c — KV pools through stitch.h alone (docs/kv.md), on the simulated device
 * (512 MiB) or, with a back end named in argv[1], on backend:cuda over the fake driver: two pools
 * and ordinary allocations on one device; blocks allocated (lowest free first), written in every
 * buffer and checked; frees that never unmap; limits; trim; the device's memory really coming
 * back (reserved_bytes, kv_bytes and the device's free memory); the trainer beside the pools
 * taking what they free; sleep and wake of a pool's tag with and without backup; bad ids and bad
 * input changing nothing. Exit status 0 = pass. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stitch/stitch.h"
#include "support/c_check.h"

#define MiB ((size_t)1 << 20)

static int64_t stat(const char* key) { return stitch_stat(0, key); }

/* The device's free memory, from stitch_residency's JSON. */
static long long device_free(void) {
  static char buf[1 << 16];
  if (stitch_residency(0, buf, sizeof buf) == 0) return -1;
  const char* p = strstr(buf, "\"device_free_bytes\": ");
  return p == NULL ? -1 : atoll(p + strlen("\"device_free_bytes\": "));
}

static unsigned char pattern(int64_t block, int buffer, size_t i) {
  return (unsigned char)(block * 131 + buffer * 17 + (int64_t)(i * 7u));
}

static void write_block(stitch_kv_pool* pool, int buffers, size_t block_bytes, int64_t id) {
  for (int b = 0; b < buffers; ++b) {
    unsigned char* base = (unsigned char*)stitch_kv_buffer(pool, b) + (size_t)id * block_bytes;
    for (size_t i = 0; i < block_bytes; i += 997) base[i] = pattern(id, b, i);
    base[block_bytes - 1] = pattern(id, b, block_bytes - 1);
  }
}

static int block_intact(stitch_kv_pool* pool, int buffers, size_t block_bytes, int64_t id) {
  for (int b = 0; b < buffers; ++b) {
    const unsigned char* base = (const unsigned char*)stitch_kv_buffer(pool, b) + (size_t)id * block_bytes;
    for (size_t i = 0; i < block_bytes; i += 997)
      if (base[i] != pattern(id, b, i)) return 0;
    if (base[block_bytes - 1] != pattern(id, b, block_bytes - 1)) return 0;
  }
  return 1;
}

int main(int argc, char** argv) {
  const char* backend = argc > 1 ? argv[1] : "backend:sim,sim_capacity_mb:512";
  char conf[256];
  snprintf(conf, sizeof conf, "%s,expandable_segments:True", backend);
  CHECK(stitch_configure(conf) == 0, "configure: %s", stitch_last_error());

  /* Pool A: 2 layers (4 buffers), blocks of 1.5 MiB (a block may span two 2 MiB pages), 200 blocks.
   * Pool B: 2 buffers, 256 KiB blocks, with backup, tag "kv-b". */
  const size_t a_block = 3 * MiB / 2, b_block = 256 * 1024;
  stitch_kv_pool* a = stitch_kv_create(0, 4, a_block, 200, NULL, 0);
  CHECK(a != NULL, "create a: %s", stitch_last_error());
  stitch_kv_pool* b = stitch_kv_create(0, 2, b_block, 1024, "kv-b", STITCH_REGION_BACKUP);
  CHECK(b != NULL, "create b: %s", stitch_last_error());
  if (a == NULL || b == NULL) return 1;
  CHECK(stat("kv_bytes.current") == 0, "a new pool maps nothing");
  const long long free0 = device_free();

  /* Bad input. */
  CHECK(stitch_kv_create(0, 0, 4096, 10, NULL, 0) == NULL, "0 buffers accepted");
  CHECK(stitch_kv_create(0, 2, 4096, 10, NULL, 64) == NULL, "bad flags accepted");
  CHECK(stitch_kv_buffer(a, 4) == NULL && strstr(stitch_last_error(), "buffer") != NULL, "buffer 4: %s", stitch_last_error());

  /* Allocation: lowest free first, pages mapped in every buffer. */
  int64_t ids[64];
  CHECK(stitch_kv_alloc(a, 10, ids) == 0, "alloc: %s", stitch_last_error());
  for (int i = 0; i < 10; ++i) CHECK(ids[i] == i, "id %d is %lld (lowest free first)", i, (long long)ids[i]);
  for (int i = 0; i < 10; ++i) write_block(a, 4, a_block, ids[i]);
  /* 10 blocks of 1.5 MiB = 15 MiB: 8 pages of 2 MiB in each of 4 buffers. */
  CHECK(stat("kv_bytes.current") == (int64_t)(8 * 2 * MiB * 4), "kv_bytes %lld", (long long)stat("kv_bytes.current"));
  CHECK(stat("allocated_bytes.all.current") == 0, "KV blocks are not allocations");
  CHECK(stat("reserved_bytes.all.current") == stat("kv_bytes.current"), "a pool's pages are reserved memory");
  CHECK(free0 - device_free() == (long long)stat("kv_bytes.current"), "the device gave the pages");

  int64_t bids[32];
  CHECK(stitch_kv_alloc(b, 32, bids) == 0, "alloc b: %s", stitch_last_error());
  for (int i = 0; i < 32; ++i) write_block(b, 2, b_block, bids[i]);
  /* An ordinary allocation beside them. */
  void* t = stitch_malloc(64 * MiB, 0, NULL);
  CHECK(t != NULL, "a trainer's 64 MiB: %s", stitch_last_error());
  memset(t, 0x5a, 64 * MiB);

  /* Bad ids: nothing freed. */
  int64_t bad[3] = {2, 2, 3};
  CHECK(stitch_kv_free(a, bad, 3) != 0 && strstr(stitch_last_error(), "twice") != NULL, "twice: %s", stitch_last_error());
  bad[0] = 500;
  CHECK(stitch_kv_free(a, bad, 1) != 0 && strstr(stitch_last_error(), "out of range") != NULL, "range: %s", stitch_last_error());
  bad[0] = 150;
  CHECK(stitch_kv_free(a, bad, 1) != 0 && strstr(stitch_last_error(), "not allocated") != NULL, "dead: %s", stitch_last_error());
  bad[0] = -1;
  CHECK(stitch_kv_free(a, bad, 1) != 0, "a negative id was freed");
  for (int i = 0; i < 10; ++i) CHECK(block_intact(a, 4, a_block, i), "block %d after bad frees", i);

  /* Free never unmaps; trim gives the unused pages back; the device has them again. */
  const int64_t before_free = stat("kv_bytes.current");
  const int64_t a_bytes = (int64_t)(8 * 2 * MiB * 4); /* pool A's pages (B holds the rest) */
  int64_t odd[5] = {1, 3, 5, 7, 9};
  CHECK(stitch_kv_free(a, odd, 5) == 0, "free: %s", stitch_last_error());
  CHECK(stat("kv_bytes.current") == before_free, "a free unmapped pages");
  int64_t back[5];
  CHECK(stitch_kv_alloc(a, 5, back) == 0 && back[0] == 1 && back[4] == 9, "lowest free first again");
  CHECK(stat("kv_bytes.current") == before_free, "reusing mapped pages maps nothing");
  CHECK(stitch_kv_free(a, back, 5) == 0, "free again");
  int64_t rest[5] = {0, 2, 4, 6, 8};
  for (int i = 0; i < 5; ++i) CHECK(block_intact(a, 4, a_block, rest[i]), "block %lld", (long long)rest[i]);
  CHECK(stitch_kv_free(a, rest, 5) == 0, "free rest: %s", stitch_last_error());
  const long long free_before_trim = device_free();
  CHECK(stitch_kv_trim(a) == 0, "trim: %s", stitch_last_error());
  CHECK(device_free() - free_before_trim == (long long)a_bytes, "trim gave %lld of %lld bytes back",
        device_free() - free_before_trim, (long long)a_bytes);
  CHECK(stat("kv_bytes.current") == before_free - a_bytes, "kv_bytes after the trim");

  /* Limits: 3 pages over the 4 buffers (24 MiB) hold at most 4 blocks of 1.5 MiB. */
  CHECK(stitch_kv_set_limit(a, 3 * 2 * MiB * 4) == 0, "set_limit");
  CHECK(stitch_kv_available(a) == 4, "available under the limit: %zu", stitch_kv_available(a));
  CHECK(stitch_kv_alloc(a, 5, ids) != 0 && strstr(stitch_last_error(), "limit") != NULL, "5 blocks over the limit: %s",
        stitch_last_error());
  CHECK(stitch_kv_alloc(a, 4, ids) == 0, "4 blocks: %s", stitch_last_error());
  CHECK(stitch_kv_alloc(a, 1, ids + 4) != 0, "a fifth block over the limit");
  CHECK(stitch_kv_set_limit(a, 0) == 0 && stitch_kv_alloc(a, 1, ids + 4) == 0, "no limit: %s", stitch_last_error());
  for (int i = 0; i < 5; ++i) write_block(a, 4, a_block, ids[i]);

  /* The trainer takes what the pools do not use: the out-of-memory ladder takes their unused
   * pages. Pool B frees most of its blocks; the trainer then allocates nearly the whole rest. */
  CHECK(stitch_kv_free(b, bids + 4, 28) == 0, "free b");
  const size_t avail = (size_t)(device_free() + stat("kv_bytes.current") - (int64_t)(5 * 2 * MiB * 4) - (int64_t)(2 * 2 * MiB * 2));
  const size_t big_bytes = avail / (20 * MiB) * (20 * MiB) - 20 * MiB;
  void* big = stitch_malloc(big_bytes, 0, NULL);
  CHECK(big != NULL, "the trainer could not take the pools' unused pages: %s", stitch_last_error());
  for (int i = 0; i < 4; ++i) CHECK(block_intact(b, 2, b_block, bids[i]), "b block %d after the trainer", i);
  for (int i = 0; i < 5; ++i) CHECK(block_intact(a, 4, a_block, ids[i]), "a block %d after the trainer", i);
  /* Now the pool is short: an error with nothing allocated; after the trainer frees, it works. */
  CHECK(stitch_kv_alloc(a, 100, ids) != 0 && strncmp(stitch_last_error(), "CUDA out of memory", 18) == 0,
        "100 blocks on a full device: %s", stitch_last_error());
  stitch_clear_error();
  stitch_free(big, big_bytes, 0, NULL);
  CHECK(stitch_last_error()[0] == '\0', "free big: %s", stitch_last_error());
  static int64_t many[40];
  CHECK(stitch_kv_alloc(a, 40, many) == 0 && many[0] == 5, "40 blocks after the free: %s", stitch_last_error());

  /* Sleep and wake of pool B's tag: backed up, its pages go back, allocations refused meanwhile. */
  const int64_t kv_awake = stat("kv_bytes.current");
  CHECK(stitch_sleep(0, "kv-b", NULL) == 0, "sleep: %s", stitch_last_error());
  CHECK(stat("kv_bytes.current") < kv_awake, "the sleeping pool keeps its pages");
  CHECK(stitch_kv_alloc(b, 1, ids) != 0 && strstr(stitch_last_error(), "kv-b") != NULL, "alloc asleep: %s",
        stitch_last_error());
  CHECK(stitch_wake(0, "kv-b") == 0, "wake: %s", stitch_last_error());
  for (int i = 0; i < 4; ++i) CHECK(block_intact(b, 2, b_block, bids[i]), "b block %d after the wake", i);
  /* Pool A's tag ("kv") without backup: contents dropped, blocks still allocated and usable. */
  CHECK(stitch_sleep(0, "kv", NULL) == 0 && stitch_wake(0, "kv") == 0, "sleep/wake kv: %s", stitch_last_error());
  write_block(a, 4, a_block, ids[0]);
  CHECK(block_intact(a, 4, a_block, ids[0]), "a block written after the wake");

  /* The residency report lists both pools. */
  static char res[1 << 16];
  CHECK(stitch_residency(0, res, sizeof res) > 0 && strstr(res, "\"kv_pools\": [{") != NULL &&
            strstr(res, "\"tag\": \"kv-b\"") != NULL, "residency: %.300s", res);

  /* Destroy: refused while blocks live; then everything goes back. */
  CHECK(stitch_kv_destroy(b) != 0 && strstr(stitch_last_error(), "live") != NULL, "destroy with live blocks");
  CHECK(stitch_kv_free(b, bids, 4) == 0, "free b");
  CHECK(stitch_kv_destroy(b) == 0, "destroy b: %s", stitch_last_error());
  int64_t all_a[45];
  for (int i = 0; i < 45; ++i) all_a[i] = i;
  CHECK(stitch_kv_free(a, all_a, 45) == 0, "free a: %s", stitch_last_error());
  CHECK(stitch_kv_destroy(a) == 0, "destroy a: %s", stitch_last_error());
  stitch_free(t, 64 * MiB, 0, NULL);
  CHECK(stitch_empty_cache(-1) == 0, "empty_cache");
  CHECK(stat("kv_bytes.current") == 0 && stat("reserved_bytes.all.current") == 0, "kv %lld reserved %lld at the end",
        (long long)stat("kv_bytes.current"), (long long)stat("reserved_bytes.all.current"));
  CHECK(device_free() == free0, "the device has %lld of %lld bytes back", device_free(), free0);

  /* kv_zero_page:True: unused slots read as zeros (one shared read-only page, counted once). */
  CHECK(stitch_configure("kv_zero_page:True") == 0, "kv_zero_page: %s", stitch_last_error());
  stitch_kv_pool* z1 = stitch_kv_create(0, 2, 1 * MiB, 64, "kv-z", 0);
  stitch_kv_pool* z2 = stitch_kv_create(0, 3, 1 * MiB, 64, "kv-z", 0);
  CHECK(z1 != NULL && z2 != NULL, "zero-page pools: %s", stitch_last_error());
  if (z1 != NULL && z2 != NULL) {
    CHECK(stat("kv_bytes.current") == (int64_t)(2 * MiB), "the zero page counts once: kv_bytes %lld",
          (long long)stat("kv_bytes.current"));
    const unsigned char* unused = (const unsigned char*)stitch_kv_buffer(z2, 2) + 40 * MiB;
    CHECK(unused[0] == 0 && unused[MiB - 1] == 0, "an unused block reads as zeros");
    int64_t zid[3];
    CHECK(stitch_kv_alloc(z1, 3, zid) == 0, "alloc under the zero page: %s", stitch_last_error());
    write_block(z1, 2, 1 * MiB, zid[2]);
    CHECK(block_intact(z1, 2, 1 * MiB, zid[2]), "a block written where the zero page was");
    CHECK(stitch_kv_free(z1, zid, 3) == 0 && stitch_kv_trim(z1) == 0, "free and trim: %s", stitch_last_error());
    const unsigned char* again = (const unsigned char*)stitch_kv_buffer(z1, 1) + 2 * MiB;
    CHECK(again[0] == 0, "the trimmed slot reads zeros again");
    CHECK(stitch_kv_destroy(z1) == 0 && stitch_kv_destroy(z2) == 0, "destroy: %s", stitch_last_error());
    CHECK(stat("kv_bytes.current") == 0, "the zero page goes with its last pool: %lld", (long long)stat("kv_bytes.current"));
  }
  CHECK(device_free() == free0, "the device has %lld of %lld bytes back after the zero page", device_free(), free0);

  if (failures != 0) {
    fprintf(stderr, "kv_program: %d check(s) failed\n", failures);
    return 1;
  }
  printf("kv_program: ok\n");
  return 0;
}
