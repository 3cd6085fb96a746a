/* benchmarks/train_threads.c — a training loop whose backward pass runs on a second thread, as
 * PyTorch's autograd engine runs it, against the same requests in the same order on one thread:
 * peak reserved memory and CPU time per step, through stitch.h and libstitch.so on the simulated
 * device.
 *
 * The loop (per step, a new sequence length; weights and optimizer states live throughout, all on
 * the default stream): forward on the main thread allocates each layer's activations; backward
 * frees them in reverse and allocates the gradients (and frees each layer's temporaries); the
 * optimizer on the main thread updates every weight through a temporary and frees the
 * gradients. With two threads the backward pass runs on its own thread, which takes its turn
 * between the forward pass and the optimizer (a hand-off through a mutex and a condition
 * variable, as autograd's engine does): the requests, their order and their streams are the same
 * as with one thread.
 *
 * Each case runs in its own process (the C API allocator is process-wide): with no arguments the
 * program runs every configuration x seed x {one thread, two threads} by executing itself, and
 * prints a table. Not a test: docs/benchmarks.md has a run and its command.
 * usage: train_threads                       (the whole table)
 *        train_threads CONF SEED THREADS STEPS (one case: prints one line) */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "stitch/stitch.h"

enum { kLayers = 32, kMaxSeq = 1024 };
static const size_t kHidden = 768, kBatch = 1, kHeads = 16;

static uint64_t rng_state;
static uint64_t next_random(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

static void* must_alloc(size_t bytes) {
  void* p = stitch_malloc(bytes, 0, NULL);
  if (p == NULL) {
    fprintf(stderr, "train_threads: allocation of %zu bytes failed: %s\n", bytes, stitch_last_error());
    exit(2);
  }
  return p;
}
static void release(void** p, size_t bytes) {
  stitch_free(*p, bytes, 0, NULL);
  *p = NULL;
}

/* The model's live memory and one step's activations. */
static void* weights[kLayers][2];
static void* adam[kLayers][2][2];
static void* grads[kLayers][2];
static void* acts[kLayers][4];
static size_t act_bytes[4];
static const size_t kWeight = 768 * 768 * 2 * 2; /* 2 kHidden^2 in bf16 */

static void forward(size_t seq) {
  int l, k;
  act_bytes[0] = kBatch * seq * kHidden * 2;            /* the layer's input */
  act_bytes[1] = kBatch * seq * kHidden * 4 * 2;        /* the MLP's intermediate */
  act_bytes[2] = kBatch * kHeads * seq * seq / 8 * 2;   /* attention scores (blocked) */
  act_bytes[3] = kBatch * seq * 4 + 512 * (1 + seq % 7); /* norms and small statistics */
  for (l = 0; l < kLayers; ++l) {
    void* scratch = must_alloc(act_bytes[1] / 2); /* a temporary of the forward pass */
    for (k = 0; k < 4; ++k) acts[l][k] = must_alloc(act_bytes[k]);
    release(&scratch, act_bytes[1] / 2);
  }
}

static void backward(void) {
  int l, k;
  void* grad_out = must_alloc(act_bytes[0]);
  for (l = kLayers - 1; l >= 0; --l) {
    void* grad_in = must_alloc(act_bytes[0]);
    void* tmp = must_alloc(act_bytes[1]);
    for (k = 0; k < 2; ++k)
      if (grads[l][k] == NULL) grads[l][k] = must_alloc(kWeight);
    release(&tmp, act_bytes[1]);
    for (k = 3; k >= 0; --k) release(&acts[l][k], act_bytes[k]);
    release(&grad_out, act_bytes[0]);
    grad_out = grad_in;
  }
  release(&grad_out, act_bytes[0]);
}

static void optimizer(void) {
  int l, k, m;
  for (l = 0; l < kLayers; ++l)
    for (k = 0; k < 2; ++k) {
      void* tmp = must_alloc(kWeight * 2); /* the update in fp32 */
      for (m = 0; m < 2; ++m)
        if (adam[l][k][m] == NULL) adam[l][k][m] = must_alloc(kWeight * 2);
      release(&tmp, kWeight * 2);
      release(&grads[l][k], kWeight);
    }
}

/* The backward thread and its hand-off. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int turn = 0; /* 0: the main thread's, 1: the backward thread's, 2: stop */

static void* backward_thread(void* arg) {
  (void)arg;
  for (;;) {
    pthread_mutex_lock(&mu);
    while (turn == 0) pthread_cond_wait(&cv, &mu);
    if (turn == 2) {
      pthread_mutex_unlock(&mu);
      return NULL;
    }
    pthread_mutex_unlock(&mu);
    backward();
    pthread_mutex_lock(&mu);
    turn = 0;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
  }
}

static void hand_over(int to) {
  pthread_mutex_lock(&mu);
  turn = to;
  pthread_cond_broadcast(&cv);
  while (turn == 1) pthread_cond_wait(&cv, &mu);
  pthread_mutex_unlock(&mu);
}

static double seconds(clockid_t clock) {
  struct timespec t;
  clock_gettime(clock, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int run_case(const char* conf, unsigned seed, int threads, int steps) {
  char full[512];
  pthread_t bw;
  int l, k, step;
  double cpu0, wall0;
  snprintf(full, sizeof full, "backend:sim,sim_capacity_mb:262144%s%s", conf[0] ? "," : "", conf);
  if (stitch_configure(full) != 0) {
    fprintf(stderr, "train_threads: %s\n", stitch_last_error());
    return 2;
  }
  rng_state = 0x9e3779b97f4a7c15ull * (seed + 1);
  for (l = 0; l < kLayers; ++l)
    for (k = 0; k < 2; ++k) weights[l][k] = must_alloc(kWeight);
  if (threads == 2) pthread_create(&bw, NULL, backward_thread, NULL);
  cpu0 = seconds(CLOCK_PROCESS_CPUTIME_ID);
  wall0 = seconds(CLOCK_MONOTONIC);
  for (step = 0; step < steps; ++step) {
    const size_t seq = 128 + (size_t)(next_random() % (kMaxSeq - 128)) / 32 * 32;
    forward(seq);
    if (threads == 2) {
      hand_over(1);
    } else {
      backward();
    }
    optimizer();
  }
  if (threads == 2) {
    hand_over(2);
    pthread_join(bw, NULL);
  }
  printf("%.4f %.4f %.4f %.3f %.3f\n", stitch_stat(0, "reserved_bytes.all.peak") / 1e9,
         stitch_stat(0, "allocated_bytes.all.peak") / 1e9,
         stitch_stat(0, "reserved_bytes.all.current") / 1e9,
         (seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu0) * 1e6 / steps,
         (seconds(CLOCK_MONOTONIC) - wall0) * 1e6 / steps);
  return 0;
}

/* Runs one case in a child process; its line into `out`. */
static int child_case(const char* self, const char* conf, unsigned seed, int threads, int steps,
                      double out[5]) {
  char seed_s[16], threads_s[4], steps_s[16], line[256];
  int fds[2], status;
  pid_t pid;
  FILE* f;
  snprintf(seed_s, sizeof seed_s, "%u", seed);
  snprintf(threads_s, sizeof threads_s, "%d", threads);
  snprintf(steps_s, sizeof steps_s, "%d", steps);
  if (pipe(fds) != 0) return -1;
  pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    execl(self, self, conf, seed_s, threads_s, steps_s, (char*)NULL);
    _exit(127);
  }
  close(fds[1]);
  f = fdopen(fds[0], "r");
  line[0] = '\0';
  if (f == NULL || fgets(line, sizeof line, f) == NULL) line[0] = '\0';
  if (f != NULL) fclose(f);
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
  return sscanf(line, "%lf %lf %lf %lf %lf", &out[0], &out[1], &out[2], &out[3], &out[4]) == 5 ? 0 : -1;
}

int main(int argc, char** argv) {
  static const char* configs[] = {"", "expandable_segments:True",
                                  "expandable_segments:True,stitching:True",
                                  "expandable_segments:True,stitching:True,stitch_compact:True"};
  const int steps = getenv("TRAIN_STEPS") != NULL ? atoi(getenv("TRAIN_STEPS")) : 40;
  size_t c;
  unsigned seed;
  if (argc == 5) return run_case(argv[1], (unsigned)atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
  printf("| config | seed | peak reserved GB, 1 thread | 2 threads | ratio | peak allocated GB, 1 / 2 "
         "| CPU us per step, 1 / 2 |\n|---|---:|---:|---:|---:|---:|---:|\n");
  for (c = 0; c < sizeof configs / sizeof configs[0]; ++c)
    for (seed = 1; seed <= 2; ++seed) {
      double one[5], two[5];
      if (child_case("/proc/self/exe", configs[c], seed, 1, steps, one) != 0 ||
          child_case("/proc/self/exe", configs[c], seed, 2, steps, two) != 0) {
        fprintf(stderr, "train_threads: a case failed (%s, seed %u)\n", configs[c], seed);
        return 1;
      }
      printf("| `%s` | %u | %.3f | %.3f | %.3f | %.3f / %.3f | %.0f / %.0f |\n",
             configs[c][0] ? configs[c] : "(defaults)", seed, one[0], two[0], two[0] / one[0],
             one[1], two[1], one[3], two[3]);
      fflush(stdout);
    }
  return 0;
}
