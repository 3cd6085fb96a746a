// replay/engine.cpp — the replay loop over a DeviceAllocator on a SimBackend.
#include "replay/engine.hpp"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "core/constants.hpp"
#include "core/device_allocator.hpp"
#include "core/size_policy.hpp"
#include "stitch/sim_backend.hpp"

namespace stitch::replay {

namespace {

stream_t as_stream(std::uintptr_t s) { return reinterpret_cast<stream_t>(s); }

}  // namespace

Replay::Replay(const DeviceWorkload& workload, const Setup& setup) : workload_(workload), setup_(setup) {
  SimBackend::Options so;
  so.capacity = setup.capacity;
  so.granularity = setup.granularity;
  so.copy_data = false;  // compaction's copies are counted, not made: the replay holds no data
  sim_ = std::make_shared<SimBackend>(so);
  Config config = setup.config;
  config.backend = BackendKind::sim;
  config.record_stacks = false;
  config.record_python_stacks = false;
  config.oom_snapshot.clear();
  config.oom_what_if = false;
  device_ = std::make_unique<DeviceAllocator>(0, *sim_, config);
  live_.reserve(workload.initial.size() + 64);
}

Replay::~Replay() = default;

void* Replay::allocate(std::size_t size, std::uintptr_t stream, bool recorded) {
  const DeviceAllocator::Allocation a = device_->malloc(size, as_stream(stream));
  const std::unique_ptr<detail::OomCapture> failure(a.failure);
  if (failure && setup_.on_oom) {
    ReplayOom oom;
    oom.event = started_ ? position_ : ReplayOom::kAtStart;
    oom.size = size;
    oom.stream = stream;
    oom.recorded = recorded;
    oom.facts = &failure->facts;
    setup_.on_oom(*this, oom);
  }
  return a.ptr;
}

std::vector<LiveBlock> Replay::largest_live(std::size_t n) const {
  std::vector<LiveBlock> all;
  all.reserve(live_.size());
  for (const auto& [addr, l] : live_) all.push_back(LiveBlock{addr, l.size, l.event});
  const auto larger = [](const LiveBlock& a, const LiveBlock& b) {
    return a.size != b.size ? a.size > b.size : a.addr < b.addr;
  };
  const std::size_t k = std::min(n, all.size());
  std::partial_sort(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(k), all.end(), larger);
  all.resize(k);
  return all;
}

bool Replay::try_allocate(std::size_t size, std::uintptr_t stream) {
  return allocate(size, stream) != nullptr;
}

void Replay::allocate_block(std::uintptr_t addr, std::size_t size, std::uintptr_t stream) {
  void* p = allocate(size, stream);
  if (p == nullptr) {
    ++failures_;
    return;
  }
  live_[addr] = Live{p, size, started_ ? position_ : ReplayOom::kAtStart};
  requested_ += size;
}

void Replay::free_block(std::uintptr_t addr) {
  auto it = live_.find(addr);
  if (it == live_.end()) return;  // its allocation failed, or it was never seen
  (void)device_->free(it->second.ptr, nullptr, nullptr);
  requested_ -= it->second.size;
  live_.erase(it);
}

namespace {

// The initial blocks inside [lo, hi) (indices into `initial`, which is in address order).
std::pair<std::size_t, std::size_t> blocks_in(const std::vector<StartBlock>& initial, std::uintptr_t lo,
                                              std::uintptr_t hi) {
  auto first = std::lower_bound(initial.begin(), initial.end(), lo,
                                [](const StartBlock& b, std::uintptr_t a) { return b.addr < a; });
  auto last = std::lower_bound(first, initial.end(), hi,
                               [](const StartBlock& b, std::uintptr_t a) { return b.addr < a; });
  return {static_cast<std::size_t>(first - initial.begin()), static_cast<std::size_t>(last - initial.begin())};
}

}  // namespace

std::vector<bool> Replay::seed_held() {
  const std::vector<StartBlock>& initial = workload_.initial;
  std::vector<bool> placed(initial.size(), false);
  const Config& config = setup_.config;
  // The blocks of [lo, hi), as offsets from `origin`. Where the dump does not show a block's
  // size it is the rounded request, plus a remainder too small to have been split off (<= 1 MiB
  // in the large pool), within the next block or the end.
  auto seeds = [&](std::uintptr_t origin, std::uintptr_t lo, std::uintptr_t hi, bool small,
                   std::vector<std::size_t>& index) {
    std::vector<DeviceAllocator::SeedBlock> out;
    const auto [first, last] = blocks_in(initial, lo, hi);
    for (std::size_t i = first; i < last; ++i) {
      const StartBlock& b = initial[i];
      const std::uintptr_t limit = i + 1 < last ? initial[i + 1].addr : hi;
      std::size_t size = b.block_size != 0 ? b.block_size
                                           : detail::round_size(b.size, config.roundup_power2_divisions);
      if (b.block_size == 0 && !small && limit - b.addr > size && limit - b.addr - size <= detail::kSmallSize)
        size = limit - b.addr;
      size = std::min<std::size_t>(size, limit - b.addr) / detail::kMinBlockSize * detail::kMinBlockSize;
      if (size == 0) continue;
      out.push_back({b.addr - origin, size, b.size});
      index.push_back(i);
    }
    return out;
  };
  auto record = [&](const std::vector<void*>& ptrs, const std::vector<std::size_t>& index) {
    for (std::size_t k = 0; k < ptrs.size() && k < index.size(); ++k) {
      if (ptrs[k] == nullptr) continue;
      const StartBlock& b = initial[index[k]];
      live_[b.addr] = Live{ptrs[k], b.size, ReplayOom::kAtStart};
      requested_ += b.size;
      placed[index[k]] = true;
    }
  };
  // Plain segments one by one; expandable runs by stream and pool, one range each, the runs at
  // their distances from the first.
  std::map<std::pair<std::uintptr_t, bool>, std::vector<const StartSegment*>> ranges;
  for (const StartSegment& s : workload_.held_segments) {
    if (s.expandable) {
      ranges[{s.stream, s.small}].push_back(&s);
      continue;
    }
    std::vector<std::size_t> index;
    const auto blocks = seeds(s.addr, s.addr, s.addr + s.size, s.small, index);
    const std::vector<void*> ptrs = device_->placement().seed_segment(as_stream(s.stream), s.small, s.size, blocks);
    if (ptrs.size() != blocks.size()) {
      ++failures_;
      continue;
    }
    ++seeded_;
    record(ptrs, index);
  }
  for (const auto& [key, runs] : ranges) {
    const bool small = key.second;
    const std::uintptr_t base = runs.front()->addr;
    const std::size_t page = device_->placement().expandable_page(small);
    std::vector<DeviceAllocator::SeedRun> seed_runs;
    std::vector<DeviceAllocator::SeedBlock> blocks;
    std::vector<std::size_t> index;
    bool aligned = true;
    for (const StartSegment* r : runs) {
      aligned = aligned && (r->addr - base) % page == 0 && r->size % page == 0;
      seed_runs.push_back({r->addr - base, r->size});
      const auto inside = seeds(base, r->addr, r->addr + r->size, small, index);
      blocks.insert(blocks.end(), inside.begin(), inside.end());
    }
    if (!aligned) continue;  // another page size than the recording's: blocks allocated below
    const std::vector<void*> ptrs = device_->placement().seed_expandable(as_stream(key.first), small, seed_runs, blocks);
    seeded_ += runs.size();
    record(ptrs, index);
  }
  return placed;
}

void Replay::start() {
  std::vector<bool> placed;
  if (setup_.warm_start) placed = seed_held();
  for (std::size_t i = 0; i < workload_.initial.size(); ++i) {
    const StartBlock& b = workload_.initial[i];
    if ((placed.empty() || !placed[i]) && b.size != 0) allocate_block(b.addr, b.size, b.stream);
  }
  started_ = true;
}

bool Replay::step(const Event& e) {
  struct Advance {  // the position moves past `e` however step() returns
    std::size_t& position;
    ~Advance() { ++position; }
  } advance{position_};
  switch (e.kind) {
    case Event::Kind::alloc: {
      if (e.size == 0) return true;
      const std::size_t before = failures_;
      allocate_block(e.addr, e.size, e.stream);
      return failures_ == before;
    }
    case Event::Kind::free:
      free_block(e.addr);
      return true;
    case Event::Kind::failed:
      if (setup_.retry_failed) {
        if (void* p = allocate(e.size, e.stream, true)) {
          (void)device_->free(p, nullptr, nullptr);
        } else {
          ++failed_retries_;
        }
      }
      return true;
    case Event::Kind::release:
      if (setup_.honour_releases) device_->empty_cache();
      return true;
    case Event::Kind::release_segment:
      if (setup_.honour_releases) (void)device_->placement().release_free_segment(as_stream(e.stream), e.size);
      return true;
    case Event::Kind::none:
      return true;
  }
  return true;
}

DeviceStats Replay::stats() const { return device_->reports().stats(); }

Snapshot Replay::snapshot() const {
  Snapshot snap;
  snap.device_traces.push_back(device_->reports().snapshot(snap.segments));
  return snap;
}

}  // namespace stitch::replay
