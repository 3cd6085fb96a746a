// core/device_lock.hpp — the device lock, which settles the threads' extents.
//
// Immediate reuse keeps free blocks in the threads' slots, out of the free index, and hands out
// blocks of them without the lock (core/immediate_reuse.hpp). Nothing but malloc and free may see
// them that way, so the lock settles them: lock() — what std::lock_guard and every other entry point take
// — settles every slot before returning, and only malloc and free take the lock without that
// (lock_unsettled), settling what they need themselves. A path added later that locks the
// device cannot forget it.
#pragma once

#include "core/spin_lock.hpp"

namespace stitch::detail {

/// `Owner::settle_all()` settles every thread's slot (under the lock): ImmediateReuse.
template <typename Owner>
class DeviceLock {
 public:
  explicit DeviceLock(Owner* owner) noexcept : owner_(owner) {}
  DeviceLock(const DeviceLock&) = delete;
  DeviceLock& operator=(const DeviceLock&) = delete;

  /// Takes the lock and settles every extent. If settling throws, the lock is released
  /// and the exception passes on.
  void lock() {
    spin_.lock();
    try {
      owner_->settle_all();
    } catch (...) {
      spin_.unlock();
      throw;
    }
  }
  void unlock() noexcept { spin_.unlock(); }
  /// Takes the lock leaving the slots as they are: malloc and free only.
  void lock_unsettled() noexcept { spin_.lock(); }

 private:
  SpinLock spin_;
  Owner* owner_;
};

/// The lock without settling, released at scope exit.
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
