// core/region_stack.cpp — the per-thread region stack's storage (core/region_stack.hpp).
#include "core/region_stack.hpp"

namespace stitch::detail {

thread_local RegionStack t_regions;
constinit thread_local int t_open_regions __attribute__((tls_model("initial-exec"))) = 0;

RegionStack::~RegionStack() { t_open_regions = 0; }

}  // namespace stitch::detail
