// torch/pool_uses.cpp — PyTorch's use counts of private pools over stitch's.
#include "torch/pool_uses.hpp"

#include <c10/util/Exception.h>

#include "stitch/errors.hpp"

namespace stitch::torch_native::detail {

void PoolUses::create_or_incref(int device, PoolId id) {
  std::lock_guard lock(mu_);
  // A use of stitch's pool without a route: a route that takes no stream, ended at once.
  allocator_.begin_allocate_to_pool(device, id, [](stream_t) { return false; });
  allocator_.end_allocate_to_pool(device, id);
  ++uses_[{device, id}].count;
  any_.store(true, std::memory_order_relaxed);
}

void PoolUses::begin(int device, PoolId id, std::function<bool(cudaStream_t)> filter) {
  std::lock_guard lock(mu_);
  auto it = uses_.find({device, id});
  TORCH_CHECK(it == uses_.end() || it->second.routes == 0, "beginAllocateToPool: already recording to mempool_id");
  allocator_.begin_allocate_to_pool(device, id, [f = std::move(filter)](stream_t s) {
    return f(static_cast<cudaStream_t>(s));
  });
  Uses& u = uses_[{device, id}];
  ++u.count;
  ++u.routes;
  any_.store(true, std::memory_order_relaxed);
}

void PoolUses::end(int device, PoolId id) {
  std::lock_guard lock(mu_);
  auto it = uses_.find({device, id});
  TORCH_CHECK(it != uses_.end() && it->second.routes > 0, "endAllocatePool: not currently recording to mempool_id");
  allocator_.end_allocate_to_pool(device, id);
  --it->second.routes;
}

void PoolUses::release(int device, PoolId id) {
  std::lock_guard lock(mu_);
  Uses& u = known(device, id);
  allocator_.release_pool(device, id);
  if (--u.count == 0) uses_.erase({device, id});
}

int PoolUses::use_count(int device, PoolId id) const {
  std::lock_guard lock(mu_);
  auto it = uses_.find({device, id});
  return it == uses_.end() ? 0 : it->second.count;
}

void PoolUses::set_use_on_oom(int device, PoolId id, bool on) {
  std::lock_guard lock(mu_);
  known(device, id).use_on_oom = on;
  if (on) any_on_oom_.store(true, std::memory_order_relaxed);
}

void* PoolUses::allocate_on_oom(int device, std::size_t bytes, stream_t stream) {
  if (!any_on_oom_.load(std::memory_order_relaxed)) return nullptr;
  std::lock_guard lock(mu_);
  for (const auto& [key, uses] : uses_) {
    if (key.first != device || !uses.use_on_oom || uses.count == 0) continue;
    // One route for this stream alone; its use dropped again at once.
    allocator_.begin_allocate_to_pool(device, key.second, [stream](stream_t s) { return s == stream; });
    void* p = nullptr;
    try {
      p = allocator_.allocate(bytes, stream, device);
    } catch (const out_of_memory&) {
    }
    allocator_.end_allocate_to_pool(device, key.second);
    allocator_.release_pool(device, key.second);
    if (p != nullptr) return p;
  }
  return nullptr;
}

void PoolUses::set_no_split(int device, PoolId id) {
  std::lock_guard lock(mu_);
  known(device, id).no_split = true;
  allocator_.set_pool_no_split(device, id);
}

PoolUses::Uses& PoolUses::known(int device, PoolId id) {
  auto it = uses_.find({device, id});
  TORCH_CHECK(it != uses_.end() && it->second.count > 0, "stitch: no private pool (", id.first, ", ",
              id.second, ") in use on device ", device);
  return it->second;
}

}  // namespace stitch::torch_native::detail
