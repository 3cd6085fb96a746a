// core/undo.hpp — a scope guard for all-or-nothing steps: the undo runs when the scope is left by
// an exception (or any early exit) unless done() was called first. Replaces hand-written
// try/catch rollback around backend calls.
#pragma once

#include <utility>

namespace stitch::detail {

template <typename F>
class Undo {
 public:
  explicit Undo(F undo) noexcept : undo_(std::move(undo)) {}
  ~Undo() {
    if (armed_) undo_();
  }
  Undo(const Undo&) = delete;
  Undo& operator=(const Undo&) = delete;
  /// The step succeeded: nothing to undo.
  void done() noexcept { armed_ = false; }

 private:
  F undo_;
  bool armed_ = true;
};

}  // namespace stitch::detail
