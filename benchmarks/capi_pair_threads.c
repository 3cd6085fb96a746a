/* benchmarks/capi_pair_threads.c — the warm 512 B pair through stitch.h and libstitch.so (as a
 * program that links the shared library calls it), from 1 thread and from 2 threads at once,
 * on one device and on two, each thread on its own stream or all on the default stream.
 * Prints the wall time per pair of each thread and the ratios to one thread. Not a test:
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
  long i;
  double t0;
  for (i = 0; i < 1000; ++i) stitch_free(stitch_malloc(512, device, stream), 512, device, stream);
  t0 = now();
  for (i = 0; i < pairs; ++i) {
    void* p = stitch_malloc(512, device, stream);
    stitch_free(p, 512, device, stream);
  }
  w->ns = (now() - t0) * 1e9 / (double)pairs;
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

int main(int argc, char** argv) {
  double one, same, two;
  if (argc > 1) pairs = atol(argv[1]);
  if (stitch_configure("backend:sim,sim_devices:2,sim_capacity_mb:8192") != 0) {
    fprintf(stderr, "configure: %s\n", stitch_last_error());
    return 1;
  }
  for (shared_stream = 0; shared_stream < 2; ++shared_stream) {
    two_devices = 0;
    one = per_thread_ns(1);
    same = per_thread_ns(2);
    two_devices = 1;
    two = per_thread_ns(2);
    printf("%s: 1 thread %.1f ns; 2 threads on one device %.1f ns (%.2fx); on two devices %.1f ns (%.2fx)\n",
           shared_stream ? "default stream shared" : "own streams", one, same, same / one, two,
           two / one);
  }
  return 0;
}
