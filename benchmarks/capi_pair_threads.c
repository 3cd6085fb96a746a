/* benchmarks/capi_pair_threads.c — warm pairs through stitch.h and libstitch.so (as a program that
 * links the shared library calls them), from 1 thread and from 2 threads at once, on one device
 * and on two, each thread on its own stream or all on the default stream. Two workloads:
 *   pair  the same 512 B allocated and freed;
 *   mix   4 KiB, 64 KiB, 1 MiB and 512 B in turn, each allocated and freed, with one 1 MiB block
 *         kept live on the thread's stream all along (as every real program has).
 * Prints the wall time per pair of each thread and the ratios to one thread. Last, the mix on one
 * thread after 0, 100 and 1000 more threads have come and gone (each made 100 pairs on the default
 * stream or one of 4 streams, 50 alive at a time): the cost must not grow with the threads that
 * ever ran. Not a test:
 * timings depend on the machine (docs/benchmarks.md has a run).
 * usage: capi_pair_threads [pairs per thread, default 20000000] */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "stitch/stitch.h"

static long pairs = 20000000;
static int shared_stream = 0;
static int two_devices = 0;
static int mix = 0;

static const size_t kMix[4] = {4096, 65536, 1 << 20, 512};

typedef struct {
  int index;
  double ns;
} worker_t;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void* run(void* arg) {
  worker_t* w = (worker_t*)arg;
  void* stream = shared_stream ? NULL : (void*)(uintptr_t)(0x100u * (unsigned)(w->index + 1));
  const int device = two_devices ? w->index % 2 : 0;
  void* live = mix ? stitch_malloc(1 << 20, device, stream) : NULL;
  long i;
  double t0;
  for (i = 0; i < 1000; ++i) {
    const size_t s = mix ? kMix[i & 3] : 512;
    stitch_free(stitch_malloc(s, device, stream), s, device, stream);
  }
  t0 = now();
  for (i = 0; i < pairs; ++i) {
    const size_t s = mix ? kMix[i & 3] : 512;
    void* p = stitch_malloc(s, device, stream);
    stitch_free(p, s, device, stream);
  }
  w->ns = (now() - t0) * 1e9 / (double)pairs;
  if (live != NULL) stitch_free(live, 1 << 20, device, stream);
  return NULL;
}

static double per_thread_ns(int threads) {
  pthread_t t[2];
  worker_t w[2];
  double sum = 0;
  int i;
  for (i = 0; i < threads; ++i) {
    w[i].index = i;
    pthread_create(&t[i], NULL, run, &w[i]);
  }
  for (i = 0; i < threads; ++i) {
    pthread_join(t[i], NULL);
    sum += w[i].ns;
  }
  return sum / threads;
}

static void* short_lived(void* arg) {
  const uintptr_t index = (uintptr_t)arg;
  void* stream = index % 5 == 0 ? NULL : (void*)(uintptr_t)(0x1000u * (unsigned)(index % 5));
  int i;
  for (i = 0; i < 100; ++i) {
    const size_t s = kMix[(unsigned)i & 3];
    stitch_free(stitch_malloc(s, 0, stream), s, 0, stream);
  }
  return NULL;
}

/* `count` more threads come and go, 50 at a time. */
static void threads_come_and_go(int count) {
  pthread_t t[50];
  int done = 0, i, n;
  while (done < count) {
    n = count - done < 50 ? count - done : 50;
    for (i = 0; i < n; ++i) pthread_create(&t[i], NULL, short_lived, (void*)(uintptr_t)(done + i));
    for (i = 0; i < n; ++i) pthread_join(t[i], NULL);
    done += n;
  }
}

int main(int argc, char** argv) {
  double one, same, two, base;
  int ran = 0;
  if (argc > 1) pairs = atol(argv[1]);
  if (stitch_configure("backend:sim,sim_devices:2,sim_capacity_mb:8192") != 0) {
    fprintf(stderr, "configure: %s\n", stitch_last_error());
    return 1;
  }
  for (mix = 0; mix < 2; ++mix) {
    for (shared_stream = 0; shared_stream < 2; ++shared_stream) {
      two_devices = 0;
      one = per_thread_ns(1);
      same = per_thread_ns(2);
      two_devices = 1;
      two = per_thread_ns(2);
      printf("%s, %s: 1 thread %.1f ns; 2 threads on one device %.1f ns (%.2fx); on two devices "
             "%.1f ns (%.2fx)\n",
             mix ? "mix 4K/64K/1M/512 with a 1 MiB block live" : "512 B pair",
             shared_stream ? "default stream shared" : "own streams", one, same, same / one, two,
             two / one);
      fflush(stdout);
    }
  }
  mix = 1;
  shared_stream = 0;
  two_devices = 0;
  base = per_thread_ns(1);
  printf("mix with a 1 MiB block live, 1 thread, own stream: %.1f ns per pair", base);
  for (ran = 100; ran <= 1000; ran *= 10) {
    threads_come_and_go(ran - (ran == 1000 ? 100 : 0));
    one = per_thread_ns(1);
    printf("; after %d threads came and went %.1f ns (%.2fx)", ran, one, one / base);
  }
  printf("\n");
  return 0;
}
