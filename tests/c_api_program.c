/* tests/c_api_program.c — a C99 program that knows stitch only through stitch.h and
 * libstitch.so. It drives the simulated device with a randomized workload, checks that every
 * block keeps its data, and checks that bad frees get clear errors and change nothing.
 * Exit status 0 = pass. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stitch/stitch.h"
#include "support/c_check.h"

#define SLOTS 512
#define OPS 200000


typedef struct {
  unsigned char* ptr;
  size_t size;
  int device;
  void* stream;
  unsigned char tag;
} slot_t;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t next_random(void) {
  /* xorshift64* */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 2685821657736338717ull;
}

static size_t random_size(void) {
  uint64_t r = next_random() % 100;
  if (r < 60) return 1 + (size_t)(next_random() % 4096);            /* tiny */
  if (r < 90) return 4096 + (size_t)(next_random() % (1u << 20));    /* small pool */
  if (r < 98) return (1u << 20) + (size_t)(next_random() % (9u << 20)); /* 1-10 MiB */
  return (10u << 20) + (size_t)(next_random() % (40u << 20));        /* dedicated */
}

/* Writes the tag into the first and last byte and every 4 KiB; checks the same places. */
static void fill(slot_t* s) {
  size_t i;
  for (i = 0; i < s->size; i += 4096) s->ptr[i] = s->tag;
  s->ptr[s->size - 1] = s->tag;
}
static int intact(const slot_t* s) {
  size_t i;
  for (i = 0; i < s->size; i += 4096)
    if (s->ptr[i] != s->tag) return 0;
  return s->ptr[s->size - 1] == s->tag;
}

int main(void) {
  static slot_t slots[SLOTS];
  void* streams[3];
  long ooms = 0, allocs = 0;
  int i;
  streams[0] = NULL;
  streams[1] = (void*)(uintptr_t)0x1000;
  streams[2] = (void*)(uintptr_t)0x2000;

  CHECK(stitch_configure("backend:sim,sim_devices:2,sim_capacity_mb:2048") == 0,
        "configure failed: %s", stitch_last_error());
  CHECK(stitch_configure("no_such_key:1") != 0, "a bad key was accepted");
  CHECK(strstr(stitch_last_error(), "no_such_key") != NULL, "error does not name the key: %s",
        stitch_last_error());

  for (i = 0; i < OPS; ++i) {
    slot_t* s = &slots[next_random() % SLOTS];
    if (s->ptr == NULL) {
      s->size = random_size();
      s->device = (int)(next_random() % 2);
      s->stream = streams[next_random() % 3];
      s->tag = (unsigned char)(1 + next_random() % 255);
      s->ptr = (unsigned char*)stitch_malloc(s->size, s->device, s->stream);
      if (s->ptr == NULL) {
        CHECK(strstr(stitch_last_error(), "out of memory") != NULL, "NULL without OOM: %s",
              stitch_last_error());
        ++ooms;
        continue;
      }
      CHECK(((uintptr_t)s->ptr % 512) == 0, "pointer %p not 512-byte aligned", (void*)s->ptr);
      fill(s);
      ++allocs;
    } else {
      CHECK(intact(s), "data of block %p (size %zu) was overwritten", (void*)s->ptr, s->size);
      if (next_random() % 16 == 0) {
        CHECK(stitch_record_stream(s->ptr, streams[next_random() % 3]) == 0, "record_stream: %s",
              stitch_last_error());
      }
      stitch_clear_error(); /* free returns nothing: clear, free, read */
      stitch_free(s->ptr, s->size, s->device, s->stream);
      CHECK(stitch_last_error()[0] == '\0', "free failed: %s", stitch_last_error());
      s->ptr = NULL;
    }
    if (i % 50000 == 0) stitch_empty_cache(-1);
  }

  /* Bad frees: each gets a clear error and changes nothing. */
  {
    slot_t keep;
    unsigned char* p;
    int64_t invalid_before = stitch_stat(0, "num_invalid_frees");
    keep.size = 10000;
    keep.device = 0;
    keep.stream = NULL;
    keep.tag = 0x5a;
    keep.ptr = (unsigned char*)stitch_malloc(keep.size, 0, NULL);
    CHECK(keep.ptr != NULL, "malloc failed: %s", stitch_last_error());
    fill(&keep);
    p = (unsigned char*)stitch_malloc(4096, 0, NULL);
    stitch_clear_error();
    stitch_free(p, 4000, 0, NULL); /* wrong size */
    CHECK(strstr(stitch_last_error(), "size") != NULL, "wrong size not reported: %s",
          stitch_last_error());
    stitch_clear_error();
    stitch_free(p, 4096, 1, NULL); /* wrong device */
    CHECK(strstr(stitch_last_error(), "device") != NULL, "wrong device not reported: %s",
          stitch_last_error());
    stitch_clear_error();
    stitch_free(p, 4096, 0, NULL); /* correct */
    CHECK(stitch_last_error()[0] == '\0', "valid free failed: %s", stitch_last_error());
    stitch_clear_error();
    stitch_free(p, 4096, 0, NULL); /* double free */
    CHECK(strstr(stitch_last_error(), "double free") != NULL, "double free not reported: %s",
          stitch_last_error());
    stitch_clear_error();
    stitch_free(keep.ptr + 512, 512, 0, NULL); /* interior pointer */
    CHECK(stitch_last_error()[0] != '\0', "interior pointer accepted");
    stitch_clear_error();
    stitch_free((void*)(uintptr_t)0xdead000, 16, 0, NULL); /* never allocated */
    CHECK(stitch_last_error()[0] != '\0', "unknown pointer accepted");
    CHECK(stitch_stat(0, "num_invalid_frees") == invalid_before + 5, "num_invalid_frees is %lld",
          (long long)stitch_stat(0, "num_invalid_frees"));
    CHECK(intact(&keep), "a bad free damaged a live block");
    stitch_free(keep.ptr, keep.size, 0, NULL);
  }

  for (i = 0; i < SLOTS; ++i) {
    if (slots[i].ptr != NULL) {
      CHECK(intact(&slots[i]), "data of block %p was overwritten", (void*)slots[i].ptr);
      stitch_free(slots[i].ptr, slots[i].size, slots[i].device, slots[i].stream);
    }
  }
  CHECK(stitch_empty_cache(-1) == 0, "empty_cache: %s", stitch_last_error());
  for (i = 0; i < 2; ++i) {
    CHECK(stitch_stat(i, "allocation.all.current") == 0, "device %d has live allocations", i);
    CHECK(stitch_stat(i, "reserved_bytes.all.current") == 0, "device %d still reserves memory", i);
  }
  CHECK(stitch_stat(0, "no.such.key") == -1, "unknown stat key accepted");

  printf("c_api_program: %ld allocations, %ld out-of-memory results, %d failures\n", allocs, ooms,
         failures);
  return failures == 0 ? 0 : 1;
}
