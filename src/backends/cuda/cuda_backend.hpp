// backends/cuda/cuda_backend.hpp — the factory of the CUDA back end (stitch::Backend on the CUDA
// driver API, which it opens at run time). The class itself lives in cuda_backend.cpp.
#pragma once

#include <memory>

#include "stitch/backend.hpp"

namespace stitch {

struct Config;

/// Creates the CUDA back end over every device the driver sees (libcuda.so.1, or the file
/// named by STITCH_CUDA_DRIVER). Throws backend_error ("backend:cuda: no CUDA device (...)")
/// when there is no usable driver or no device; never returns a fallback back end.
[[nodiscard]] std::shared_ptr<Backend> make_cuda_backend(const Config& config);

/// The number of CUDA devices the driver reports (>= 1), opening and initialising the driver but
/// creating no context. Throws backend_error ("backend:cuda: no CUDA device (...)") otherwise.
[[nodiscard]] int cuda_device_count();

}  // namespace stitch
