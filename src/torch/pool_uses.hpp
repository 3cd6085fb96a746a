// torch/pool_uses.hpp — PyTorch's private pools (CUDA graph pools and MemPools) over stitch's: the
// use counts PyTorch reads (getPoolUseCount) and the per-pool flags it sets (setUseOnOOM,
// setNoSplit). Each use PyTorch counts is one use of stitch's pool: createOrIncrefPool and
// beginAllocateToPool add one, releasePool drops one, endAllocateToPool only ends the route (as
// in PyTorch's allocator), so a pool's memory goes back once PyTorch has released it.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <utility>

#include "stitch/allocator.hpp"

namespace stitch::torch_native::detail {

class PoolUses {
 public:
  explicit PoolUses(Allocator& allocator) : allocator_(allocator) {}

  void create_or_incref(int device, PoolId id);
  /// Routes `device`'s allocations on the streams `filter` accepts to pool `id` (created if
  /// new), one more use.
  void begin(int device, PoolId id, std::function<bool(cudaStream_t)> filter);
  void end(int device, PoolId id);
  void release(int device, PoolId id);
  [[nodiscard]] int use_count(int device, PoolId id) const;
  void set_use_on_oom(int device, PoolId id, bool on);
  void set_no_split(int device, PoolId id);
  /// PyTorch's setUseOnOOM fallback: a request of `bytes` on `stream` that the device's own pools
  /// could not serve, served from the pools of `device` marked use-on-OOM (a route for that one
  /// stream while it is tried); nullptr when none can.
  [[nodiscard]] void* allocate_on_oom(int device, std::size_t bytes, stream_t stream);
  /// Whether any pool was ever used (statistics by pool are worth collecting).
  [[nodiscard]] bool any() const noexcept { return any_.load(std::memory_order_relaxed); }

 private:
  struct Uses {
    int count = 0;
    int routes = 0;  ///< begun and not ended
    bool use_on_oom = false;
    bool no_split = false;
  };
  Uses& known(int device, PoolId id);

  Allocator& allocator_;
  mutable std::mutex mu_;  ///< uses_ (taken before a device lock, never inside one)
  std::map<std::pair<int, PoolId>, Uses> uses_;
  std::atomic<bool> any_{false};
  std::atomic<bool> any_on_oom_{false};
};

}  // namespace stitch::torch_native::detail
