// stitch/errors.hpp — the exception types thrown by the C++ API.
#pragma once

#include "stitch/export.hpp"

#include <new>
#include <stdexcept>
#include <string>

namespace stitch {

/// Base class of every error stitch throws, except out_of_memory (a std::bad_alloc).
class STITCH_EXPORT error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A request could not be served: the device (or the configured memory limit) has no room left.
/// what() holds the full report (request, capacity, free, reserved, allocated, largest free block).
class STITCH_EXPORT out_of_memory : public std::bad_alloc {
 public:
  explicit out_of_memory(std::string message) : message_(std::move(message)) {}
  [[nodiscard]] const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

/// The caller passed something stitch does not accept: an unknown pointer, a double free,
/// a wrong size or device, a bad stream or an out-of-range argument. Nothing was changed.
class STITCH_EXPORT invalid_argument : public error {
 public:
  using error::error;
};

/// A configuration string was malformed: unknown key, bad value, or a key that can no longer change.
class STITCH_EXPORT config_error : public error {
 public:
  using error::error;
};

/// A device (driver, runtime or simulated) call failed for a reason other than out-of-memory.
class STITCH_EXPORT backend_error : public error {
 public:
  using error::error;
};

}  // namespace stitch
