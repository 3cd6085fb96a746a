// core/device_lock.hpp — the device lock and the deferred free it guards.
//
// Immediate reuse leaves the last free uncompleted (DeviceAllocator::set_immediate_reuse): the
// block stays in the live table, not allocated, not filed. Nothing but malloc and free may see
// it that way, so the lock completes it: lock() — what std::lock_guard and every other entry
// point take — settles the deferred free before returning, and only malloc takes the lock
// without that (lock_unsettled). A path added later that locks the device cannot forget it.
#pragma once

#include "core/block.hpp"
#include "core/spin_lock.hpp"

namespace stitch::detail {

/// `Owner::settle_deferred(Block*)` completes a deferred free (its statistics and its filing).
template <typename Owner>
class DeviceLock {
 public:
  explicit DeviceLock(Owner* owner) noexcept : owner_(owner) {}
  DeviceLock(const DeviceLock&) = delete;
  DeviceLock& operator=(const DeviceLock&) = delete;

  /// Takes the lock and completes the deferred free, if any. If completing it throws, the lock
  /// is released and the exception passes on.
  void lock() {
    spin_.lock();
    if (deferred_ != nullptr) settle_or_unlock();
  }
  void unlock() noexcept { spin_.unlock(); }
  /// Takes the lock leaving the deferred free as it is: malloc only, which takes the block
  /// straight back or settles it itself.
  void lock_unsettled() noexcept { spin_.lock(); }

  // ---- the deferred free (held under the lock) ----
  [[nodiscard]] Block* deferred() const noexcept { return deferred_; }
  void defer(Block* block) noexcept { deferred_ = block; }
  /// Hands the deferred block back (to be re-allocated or completed) and clears it.
  Block* take_deferred() noexcept {
    Block* b = deferred_;
    deferred_ = nullptr;
    return b;
  }
  /// Completes the deferred free under a lock taken with lock_unsettled().
  void settle() {
    if (deferred_ != nullptr) owner_->settle_deferred(take_deferred());
  }

 private:
  void settle_or_unlock() {
    try {
      owner_->settle_deferred(take_deferred());
    } catch (...) {
      spin_.unlock();
      throw;
    }
  }

  SpinLock spin_;
  Block* deferred_ = nullptr;
  Owner* owner_;
};

/// malloc's guard: the lock without settling, released at scope exit.
template <typename Lock>
class UnsettledGuard {
 public:
  explicit UnsettledGuard(Lock& lock) noexcept : lock_(lock) { lock_.lock_unsettled(); }
  ~UnsettledGuard() { lock_.unlock(); }
  UnsettledGuard(const UnsettledGuard&) = delete;
  UnsettledGuard& operator=(const UnsettledGuard&) = delete;

 private:
  Lock& lock_;
};

}  // namespace stitch::detail
