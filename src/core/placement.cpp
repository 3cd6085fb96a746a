// core/placement.cpp — Placement: blocks put where a recording had them (core/placement.hpp).
#include "core/placement.hpp"

#include <mutex>

#include "core/block_store.hpp"
#include "core/cache_hit.hpp"
#include "core/device_lock.hpp"
#include "core/expandable_ranges.hpp"
#include "core/plain_segments.hpp"
#include "diagnostics/recorder.hpp"

namespace stitch::detail {

std::size_t Placement::expandable_page(bool small) {
  std::lock_guard lock(d_.lock);
  return d_.ranges.page_size(small, false);
}

void Placement::seeded(Block* block, const SeedBlock& seed) {
  block->live_slot = d_.live.claim_excluding_writers(LiveTable::key_of(block->ptr));
  LiveTable::publish(block->live_slot, block);
  d_.upkeep.activate(block, seed.requested);
  d_.recorder.trace(TraceAction::alloc, block->ptr, seed.requested, block->stream);
}

std::vector<void*> Placement::seed_segment(stream_t stream, bool small, std::size_t bytes,
                                                 const std::vector<SeedBlock>& blocks) {
  std::lock_guard lock(d_.lock);
  BlockPool& pool = d_.store.pool(stream, small);
  Block* head = d_.plain.allocate(pool, stream, bytes);
  if (head == nullptr) return {};
  const std::vector<Block*> placed = d_.store.place(pool, head, head->ptr, blocks);
  std::vector<void*> out;
  out.reserve(placed.size());
  for (std::size_t i = 0; i < placed.size(); ++i) {
    if (placed[i] != nullptr) seeded(placed[i], blocks[i]);
    out.push_back(placed[i] != nullptr ? placed[i]->ptr : nullptr);
  }
  return out;
}

std::vector<void*> Placement::seed_expandable(stream_t stream, bool small,
                                                    const std::vector<SeedRun>& runs,
                                                    const std::vector<SeedBlock>& blocks) {
  std::lock_guard lock(d_.lock);
  const std::vector<Block*> placed = d_.ranges.seed(
      d_.store.pool(stream, small), stream, runs, blocks,
      [this](Block* b, const SeedBlock& seed) { seeded(b, seed); });
  std::vector<void*> out;
  out.reserve(placed.size());
  for (Block* b : placed) out.push_back(b != nullptr ? b->ptr : nullptr);
  return out;
}

void* Placement::allocate_at(void* addr, std::size_t block_bytes, std::size_t requested,
                                   stream_t stream) {
  std::lock_guard lock(d_.lock);  // (every held and parked block is in its index now)
  char* at = static_cast<char*>(addr);
  for (Segment* s = d_.store.segments(); s != nullptr; s = s->next) {
    if (s->asleep) continue;
    for (Block* b = s->head; b != nullptr; b = b->next) {
      if (at < b->ptr || at >= b->ptr + b->size) continue;
      if (!b->is_free() || b->stream != stream || block_bytes > b->size - static_cast<std::size_t>(at - b->ptr))
        return nullptr;
      const SeedBlock seed{0, block_bytes, requested};
      Block* placed = d_.store.place(BlockStore::pool_of(b), b, at, {seed}).front();
      seeded(placed, seed);
      return placed->ptr;
    }
  }
  return nullptr;
}

bool Placement::release_free_segment(stream_t stream, std::size_t bytes) {
  std::lock_guard lock(d_.lock);
  return d_.plain.release_one(stream, bytes);
}

}  // namespace stitch::detail
