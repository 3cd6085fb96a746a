// core/device_seed.cpp — for replays: a recorded start state put in place (plain segments and
// expandable ranges with their live blocks where the recording had them), and the release of
// one cached segment, as a recording allocator's garbage collection or oversize release did.
#include "core/device_allocator.hpp"

namespace stitch {

std::size_t DeviceAllocator::expandable_page(bool small) {
  std::lock_guard lock(mutex_);
  return ranges_.page_size(small, false);
}

void DeviceAllocator::seeded(Block* block, const SeedBlock& seed) {
  block->live_slot = live_.claim_excluding_writers(detail::LiveTable::key_of(block->ptr));
  detail::LiveTable::publish(block->live_slot, block);
  activate(block, seed.requested);
  recorder_.trace(TraceAction::alloc, block->ptr, seed.requested, block->stream);
}

std::vector<void*> DeviceAllocator::seed_segment(stream_t stream, bool small, std::size_t bytes,
                                                 const std::vector<SeedBlock>& blocks) {
  std::lock_guard lock(mutex_);
  BlockPool& pool = store_.pool(stream, small);
  Block* head = plain_.allocate(pool, stream, bytes);
  if (head == nullptr) return {};
  const std::vector<Block*> placed = store_.place(pool, head, head->ptr, blocks);
  std::vector<void*> out;
  out.reserve(placed.size());
  for (std::size_t i = 0; i < placed.size(); ++i) {
    if (placed[i] != nullptr) seeded(placed[i], blocks[i]);
    out.push_back(placed[i] != nullptr ? placed[i]->ptr : nullptr);
  }
  return out;
}

std::vector<void*> DeviceAllocator::seed_expandable(stream_t stream, bool small,
                                                    const std::vector<SeedRun>& runs,
                                                    const std::vector<SeedBlock>& blocks) {
  std::lock_guard lock(mutex_);
  const std::vector<Block*> placed = ranges_.seed(
      store_.pool(stream, small), stream, runs, blocks,
      [this](Block* b, const SeedBlock& seed) { seeded(b, seed); });
  std::vector<void*> out;
  out.reserve(placed.size());
  for (Block* b : placed) out.push_back(b != nullptr ? b->ptr : nullptr);
  return out;
}

bool DeviceAllocator::release_free_segment(stream_t stream, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  return plain_.release_one(stream, bytes);
}

}  // namespace stitch
