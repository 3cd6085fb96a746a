// core/private_pools.cpp — PrivatePools: routes begun and ended, uses released, and the check of
// the pools against the blocks.
#include "core/private_pools.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "core/assert.hpp"
#include "stitch/errors.hpp"

namespace stitch::detail {

namespace {
std::string pool_name(PoolId id) { return fmt::format("({}, {})", id.first, id.second); }
}  // namespace

void PrivatePools::begin(PoolId id, StreamFilter filter, std::uint16_t tag, bool backup) {
  if (!filter) throw invalid_argument("begin_allocate_to_pool: the stream filter is empty");
  auto it = pools_.find(id);
  if (it == pools_.end()) {
    it = pools_.emplace(id, std::make_unique<PrivatePool>(id, tag, backup)).first;
  } else {
    // A released pool that still held memory is in use again (PyTorch shares a pool between
    // graphs with graph_pool_handle()).
    ++it->second->use_count;
  }
  routes_.push_back(PoolRoute{id, std::move(filter), it->second.get()});
}

void PrivatePools::end(PoolId id) {
  auto it = std::find_if(routes_.rbegin(), routes_.rend(),
                         [&](const PoolRoute& r) { return r.id == id; });
  if (it == routes_.rend())
    throw invalid_argument(fmt::format(
        "end_allocate_to_pool: no allocation to pool {} is underway on device {}", pool_name(id),
        device_));
  routes_.erase(std::next(it).base());
}

void PrivatePools::set_no_split(PoolId id) {
  auto it = pools_.find(id);
  if (it == pools_.end() || it->second->use_count == 0)
    throw invalid_argument(
        fmt::format("set_no_split: device {} has no pool {} in use", device_, pool_name(id)));
  it->second->small.no_split = it->second->large.no_split = true;
}

bool PrivatePools::release(PoolId id) {
  auto it = pools_.find(id);
  if (it == pools_.end() || it->second->use_count == 0)
    throw invalid_argument(
        fmt::format("release_pool: device {} has no pool {} in use", device_, pool_name(id)));
  --it->second->use_count;
  return it->second->use_count == 0 && routes_.empty();
}

BlockPool& PrivatePools::route(stream_t stream, bool small, BlockPool& device_pool) {
  for (auto it = routes_.rbegin(); it != routes_.rend(); ++it)
    if (it->filter(stream)) return it->pool->pool(small);
  return device_pool;
}

bool PrivatePools::may_touch_device(const Block* block) {
  if (!may_touch_device({block->stream})) return false;
  for (stream_t s : block->stream_uses)
    if (backend_.is_capturing(device_, s)) return false;
  return true;
}

void PrivatePools::validate(const StoreCount& count) const {
  auto broken = [this](const char* what) { invariant_broken(device_, what); };
  for (const PrivatePool* p : count.private_segments)
    if (pools_.count(p->id) == 0 || pools_.at(p->id).get() != p)
      broken("a segment belongs to a private pool the device does not have");
  std::size_t indexed = 0;
  std::size_t segments = 0;
  for (const auto& [id, p] : pools_) {
    indexed += p->small.index.size() + p->large.index.size();
    segments += p->segments;
    if (p->use_count < 0) broken("a private pool has a negative use count");
  }
  if (count.private_free != indexed)
    broken("a private pool's free index holds blocks that are not free in its segments");
  if (segments != count.private_segments.size()) broken("a private pool's segment count is wrong");
}

}  // namespace stitch::detail
