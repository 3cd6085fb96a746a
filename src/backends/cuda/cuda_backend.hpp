// backends/cuda/cuda_backend.hpp — the factory of the CUDA back end (the stitch::Backend over the
// CUDA runtime plus the driver's virtual-memory API). The class itself lives in cuda_backend.cpp.
#pragma once

#include <memory>

#include "stitch/backend.hpp"

namespace stitch {

/// Creates the CUDA back end over every device the CUDA runtime sees. Throws backend_error
/// ("backend:cuda: no CUDA device (...)") when there is no usable driver or no device; never
/// returns a fallback back end.
[[nodiscard]] std::shared_ptr<Backend> make_cuda_backend();

}  // namespace stitch
