// capi/c_api_testing.hpp — the C API's allocator from C++ (not exported from libstitch.so): the
// torch hooks use it, and tests and fuzzers run the C API (stitch.h) over an Allocator they
// built, e.g. on a SimBackend whose faults and held streams they control, and start over with a
// fresh one for every fuzz input.
#pragma once

#include <memory>

#include "stitch/allocator.hpp"

namespace stitch::detail {

/// Makes `next` the C API's process-wide allocator (nullptr: none, so the next call builds one
/// from STITCH_ALLOC_CONF as at start-up), forgets stitch_configure() strings given before any
/// allocator existed, and returns the previous allocator (nullptr if none was built). Not safe
/// while another thread is inside the C API, and pointers from the previous allocator must not
/// be passed to the new one.
std::unique_ptr<Allocator> capi_exchange_allocator(std::unique_ptr<Allocator> next);

}  // namespace stitch::detail
