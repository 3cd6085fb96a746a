/* tests/support/c_check.h — CHECK for the C test programs (c_api_program.c, fake_cuda/
 * outside_program.c, ipc/ipc_hostile.c, ...): reports a failed condition with its file and line, counts it in
 * `failures`, and goes on. Include once per program, after <stdio.h>. */
#ifndef STITCH_TEST_C_CHECK_H
#define STITCH_TEST_C_CHECK_H

#include <stdio.h>

static int failures = 0;
#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                        \
      fprintf(stderr, "\n");                               \
      ++failures;                                          \
    }                                                      \
  } while (0)

#endif
