// tools/common/arg_reader.hpp — the command-line walk the tools share: one argument at a time,
// an option's value taken from the next argument with a clear error when it is missing.
#pragma once

#include <string>

#include "stitch/errors.hpp"

namespace stitch::tools {

class ArgReader {
 public:
  ArgReader(int argc, char** argv) : argc_(argc), argv_(argv) {}

  /// Moves to the next argument; false when there is none.
  bool next() {
    if (i_ + 1 >= argc_) return false;
    current_ = argv_[++i_];
    return true;
  }
  /// The argument moved to last.
  [[nodiscard]] const std::string& current() const noexcept { return current_; }
  /// The value of the current option: the following argument, consumed.
  std::string value() {
    if (i_ + 1 >= argc_) throw stitch::error(current_ + " needs a value");
    return argv_[++i_];
  }

 private:
  int argc_;
  char** argv_;
  int i_ = 0;
  std::string current_;
};

}  // namespace stitch::tools
