// core/private_pools.cpp — DeviceAllocator's private pools (core/private_pool.hpp): routes to
// them, their quiet slow path, deferred events, and giving their memory back.
#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "core/assert.hpp"
#include "core/device_allocator.hpp"
#include "core/size_policy.hpp"
#include "stitch/errors.hpp"

namespace stitch {

namespace {
std::string pool_name(PoolId id) { return fmt::format("({}, {})", id.first, id.second); }
}  // namespace

void DeviceAllocator::begin_allocate_to_pool(PoolId id, StreamFilter filter) {
  if (!filter) throw invalid_argument("begin_allocate_to_pool: the stream filter is empty");
  std::lock_guard lock(mutex_);  // settles the threads' parked frees
  auto it = private_pools_.find(id);
  if (it == private_pools_.end()) {
    it = private_pools_.emplace(id, std::make_unique<detail::PrivatePool>(id, &index_nodes_)).first;
  } else {
    // A released pool that still held memory is in use again (PyTorch shares a pool between
    // graphs with graph_pool_handle()).
    ++it->second->use_count;
  }
  routes_.push_back(detail::PoolRoute{id, std::move(filter), it->second.get()});
  note_fast_ok();  // no unlocked reuse while a route is underway
}

void DeviceAllocator::end_allocate_to_pool(PoolId id) {
  std::lock_guard lock(mutex_);
  auto it = std::find_if(routes_.rbegin(), routes_.rend(),
                         [&](const detail::PoolRoute& r) { return r.id == id; });
  if (it == routes_.rend())
    throw invalid_argument(fmt::format(
        "end_allocate_to_pool: no allocation to pool {} is underway on device {}", pool_name(id),
        device_));
  routes_.erase(std::next(it).base());
  // The deferred events wait for the next allocation: the capture has not ended yet.
  if (routes_.empty()) note_fast_ok();
}

void DeviceAllocator::release_pool(PoolId id) {
  std::lock_guard lock(mutex_);
  auto it = private_pools_.find(id);
  if (it == private_pools_.end() || it->second->use_count == 0)
    throw invalid_argument(
        fmt::format("release_pool: device {} has no pool {} in use", device_, pool_name(id)));
  --it->second->use_count;
  if (it->second->use_count == 0 && routes_.empty()) release_private_pools();
}

DeviceAllocator::Pool& DeviceAllocator::routed_pool(stream_t stream, bool small) {
  for (auto it = routes_.rbegin(); it != routes_.rend(); ++it)
    if (it->filter(stream)) return it->pool->pool(small);
  return pool_for(small);
}

DeviceAllocator::Block* DeviceAllocator::allocate_quiet(Pool& pool, stream_t stream,
                                                        std::size_t rounded,
                                                        std::size_t requested) {
  settle_slots();
  const bool private_pool = pool.owner != nullptr;
  const std::size_t alloc_size = private_pool ? detail::segment_size(rounded)
                                              : growth_size(pool.small, rounded);
  // A private pool grows by plain segments of its own; the device's pools as usual, except that
  // no free page is moved (stitch_reuse_pages unmaps the pages it moves). Nothing is released,
  // synchronized, unmapped or moved: a stream may be capturing.
  Block* block = nullptr;
  if (private_pool) {
    block = alloc_segment(pool, stream, alloc_size);  // the segment is the pool's (link_new_segment)
  } else if (config_.expandable_segments && config_.stitching && config_.stitch_reuse_pages) {
    block = grow_expandable_chain(pool, stream, rounded, page_size(pool.small, true),
                                  page_size(pool.small, false));
  } else {
    block = grow(pool, stream, rounded, alloc_size);
  }
  if (block == nullptr) capture_oom(requested, rounded, alloc_size, pool.small, stream);
  return block;
}

void DeviceAllocator::defer_events(Block* block) {
  // Pending without events: one placeholder count keeps it out of the free index, as an
  // outstanding event would. (A route is underway, or one of its streams captures.)
  deferred_.push_back(block);  // may throw: nothing changed
  block->event_count = 1;
}

bool DeviceAllocator::uses_capturing_stream(const Block* block) {
  if (backend_.is_capturing(device_, block->stream)) return true;
  for (stream_t s : block->stream_uses)
    if (backend_.is_capturing(device_, s)) return true;
  return false;
}

void DeviceAllocator::record_deferred_events() {
  STITCH_ASSERT(routes_.empty(), "record_deferred_events: a route is underway");
  // A block whose streams still capture (a capture without a route) stays deferred.
  std::size_t kept = 0;
  for (std::size_t i = 0; i < deferred_.size(); ++i) {
    Block* block = deferred_[i];
    if (uses_capturing_stream(block)) {
      deferred_[kept++] = block;
      continue;
    }
    block->event_count = 0;
    try {
      events_.record(block);
    } catch (...) {
      block->event_count = 1;  // still deferred, with the rest: recorded at a later allocation
      for (std::size_t j = i; j < deferred_.size(); ++j) deferred_[kept++] = deferred_[j];
      deferred_.resize(kept);
      note_events();
      throw;
    }
  }
  deferred_.resize(kept);
  note_events();
}

void DeviceAllocator::release_private_pools() {
  STITCH_ASSERT(routes_.empty(), "release_private_pools: a route is underway");
  for (auto it = private_pools_.begin(); it != private_pools_.end();) {
    detail::PrivatePool& p = *it->second;
    if (p.use_count == 0) {
      std::vector<Block*> whole;
      for (Pool* pool : {&p.small, &p.large})
        for (Block* b : pool->index)
          if (!b->is_split()) whole.push_back(b);
      for (Block* b : whole) release_segment(b);
    }
    if (p.use_count == 0 && p.segments == 0) {
      it = private_pools_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace stitch
