// backends/cuda/cuda_types.hpp — the CUDA driver API types and constants the CUDA back end uses.
// With the CUDA toolkit they come from its cuda.h; without it, from the declarations below, which
// copy cuda.h's (CUDA 13.0) ABI for exactly what the back end touches. The test
// cuda_types_match_cuda_h compiles both and checks that sizes, offsets and values agree.
// Nothing here links or loads anything: the driver itself is opened at run time (driver.cpp).
#pragma once

#include <cstddef>

#if defined(STITCH_CUDA_TYPES_FALLBACK) || !__has_include(<cuda.h>)
#define STITCH_CUDA_TYPES_FROM_CUDA_H 0
#else
#define STITCH_CUDA_TYPES_FROM_CUDA_H 1
#endif

#if STITCH_CUDA_TYPES_FROM_CUDA_H
#include <cuda.h>
#else
#define CUDA_VERSION 13000  // the ABI the fallback declarations copy
#include "backends/cuda/cuda_types_fallback.hpp"
#endif
