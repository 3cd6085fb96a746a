// tools/tracegen/synthetic_addresses.cpp — fixed device addresses over a simulated device.
#include "tools/tracegen/synthetic_addresses.hpp"

#include "stitch/errors.hpp"

namespace stitch::tracegen::detail {

namespace {
constexpr std::size_t kGap = std::size_t{2} << 20;  // between regions, as a driver leaves them
}

void* SyntheticAddresses::add(void* real, std::size_t bytes, std::size_t alignment) {
  if (real == nullptr) return nullptr;
  const std::size_t align = alignment < kGap ? kGap : alignment;
  const std::uintptr_t start = (next_ + align - 1) / align * align;
  regions_[start] = Region{reinterpret_cast<std::uintptr_t>(real), bytes};
  next_ = start + bytes + kGap;
  return reinterpret_cast<void*>(start);
}

void* SyntheticAddresses::real(void* synthetic) const {
  const auto a = reinterpret_cast<std::uintptr_t>(synthetic);
  auto it = regions_.upper_bound(a);
  if (it == regions_.begin() || a >= std::prev(it)->first + std::prev(it)->second.bytes)
    throw backend_error("synthetic addresses: no device memory at this address");
  --it;
  return reinterpret_cast<void*>(it->second.real + (a - it->first));
}

std::map<std::uintptr_t, SyntheticAddresses::Region>::iterator SyntheticAddresses::find(void* synthetic) {
  auto it = regions_.find(reinterpret_cast<std::uintptr_t>(synthetic));
  if (it == regions_.end()) throw backend_error("synthetic addresses: not the start of a region");
  return it;
}

void* SyntheticAddresses::allocate(int device, std::size_t bytes) {
  return add(sim_->allocate(device, bytes), bytes, 0);
}

void SyntheticAddresses::deallocate(int device, void* ptr, std::size_t bytes) {
  const auto it = find(ptr);
  sim_->deallocate(device, reinterpret_cast<void*>(it->second.real), bytes);
  regions_.erase(it);
}

void* SyntheticAddresses::reserve(int device, std::size_t bytes, std::size_t alignment) {
  return add(sim_->reserve(device, bytes, alignment), bytes, alignment);
}

void SyntheticAddresses::release_reservation(int device, void* va, std::size_t bytes) {
  const auto it = find(va);
  sim_->release_reservation(device, reinterpret_cast<void*>(it->second.real), bytes);
  regions_.erase(it);
}

}  // namespace stitch::tracegen::detail
