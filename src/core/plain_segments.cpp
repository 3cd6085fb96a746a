// core/plain_segments.cpp — PlainSegments: cudaMalloc'd segments obtained and given back.
#include "core/plain_segments.hpp"

#include <algorithm>
#include <vector>

#include "core/assert.hpp"

namespace stitch::detail {

Block* PlainSegments::allocate(BlockPool& pool, stream_t stream, std::size_t bytes) {
  if (!ledger_.fits(bytes)) return nullptr;
  std::unique_ptr<Segment> space = store_.prepare_segment(stream);  // (before the device)
  void* ptr = backend_.allocate(device_, bytes);  // throws backend_error for non-OOM failures
  if (ptr == nullptr) return nullptr;
  Block* block =
      store_.add_segment(std::move(space), pool, stream, static_cast<char*>(ptr), bytes, BlockState::free);
  Segment* segment = block->segment;
  segment->oversize = bytes >= config_.max_split_size;
  ledger_.segment_allocated(*segment);
  return block;  // free until take() takes it
}

void PlainSegments::release(Block* block) {
  STITCH_ASSERT(block->is_free() && whole_plain(block),
                "PlainSegments::release: a free block over a whole plain segment");
  Segment* segment = block->segment;
  backend_.deallocate(device_, segment->base, segment->size);  // throws: nothing changed
  ledger_.segment_freed(*segment);
  store_.remove_segment(segment);
}

void PlainSegments::release_free(bool small, std::size_t keep) {
  std::vector<Block*> whole;
  for (Block* b : store_.free_blocks(small))
    if (whole_plain(b)) whole.push_back(b);
  for (Block* b : whole) {
    if (keep != 0 && ledger_.reserved() <= keep) return;
    release(b);
  }
}

bool PlainSegments::release_oversize(stream_t stream, std::size_t rounded) {
  // Only with max_split_size set: free cached oversize segments of this stream, one big enough
  // or, failing that, the largest ones until they add up to the request.
  const std::size_t max_split = config_.max_split_size;
  if (max_split == Config::kUnlimited) return false;
  const std::size_t want = std::max(rounded, max_split);
  auto& index = store_.pool(stream, false).index;
  auto it = index.lower_bound(FreeKey{stream, want, nullptr});
  if (it != index.end() && (*it)->stream == stream && whole_plain(*it)) {
    release(*it);
    return true;
  }
  std::vector<Block*> victims;
  std::size_t total = 0;
  while (it != index.begin() && total < want) {
    --it;
    Block* b = *it;
    if (b->stream != stream || b->size < max_split) break;
    if (!whole_plain(b)) continue;
    victims.push_back(b);
    total += b->size;
  }
  if (total < want) return false;
  for (Block* b : victims) release(b);
  return true;
}

void PlainSegments::collect_garbage() {
  // PyTorch's garbage_collection_threshold: once reserved memory passes threshold x allowed,
  // free unsplit large-pool segments that have sat unused longer than average, oldest first.
  const auto reserved = static_cast<double>(ledger_.reserved());
  const double limit = config_.garbage_collection_threshold * static_cast<double>(*ledger_.cap());
  if (reserved <= limit) return;
  const double target = reserved - limit;
  double reclaimed = 0;
  const std::uint64_t clock = store_.gc_clock(false);
  std::vector<Block*> candidates;
  for (Block* b : store_.free_blocks(false))
    if (whole_plain(b)) candidates.push_back(b);
  while (reclaimed < target && !candidates.empty()) {
    double total_age = 0;
    for (Block* b : candidates) total_age += static_cast<double>(clock - b->gc_stamp);
    const double mean_age = total_age / static_cast<double>(candidates.size());
    std::vector<Block*> keep;
    bool freed = false;
    for (Block* b : candidates) {
      if (reclaimed < target && static_cast<double>(clock - b->gc_stamp) >= mean_age) {
        reclaimed += static_cast<double>(b->size);
        release(b);
        freed = true;
      } else {
        keep.push_back(b);
      }
    }
    if (!freed) break;
    candidates.swap(keep);
  }
}

bool PlainSegments::release_one(stream_t stream, std::size_t bytes) {
  for (bool small : {true, false}) {
    BlockPool& pool = store_.pool(stream, small);
    for (auto it = pool.index.lower_bound(FreeKey{stream, bytes, nullptr});
         it != pool.index.end() && (*it)->stream == stream && (*it)->size == bytes; ++it) {
      Block* b = *it;
      if (!whole_plain(b)) continue;
      release(b);
      return true;
    }
  }
  return false;
}

}  // namespace stitch::detail
