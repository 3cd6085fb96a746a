// core/spiller.cpp — Spiller: which mappings move, host pages made before anything moves, the
// remaps and their bookkeeping, the way back, and host pages a free leaves wholly free.
#include "core/spiller.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <new>

#include "core/assert.hpp"
#include "stitch/errors.hpp"

namespace stitch::detail {

bool Spiller::idle_since_sync(const Segment& s, std::vector<stream_t>& busy) {
  std::vector<stream_t> streams{s.stream};
  for (const Block* b = s.head; b != nullptr; b = b->next) {
    if (b->state == BlockState::free || b->state == BlockState::unmapped) continue;
    for (stream_t u : b->stream_uses)
      if (std::find(streams.begin(), streams.end(), u) == streams.end()) streams.push_back(u);
  }
  for (stream_t st : streams) {
    if (std::find(busy.begin(), busy.end(), st) != busy.end()) return false;
    if (!pages_.stream_idle(st)) {
      busy.push_back(st);
      return false;
    }
  }
  return true;
}

std::size_t Spiller::host_granularity() {
  if (host_granularity_ == SIZE_MAX) host_granularity_ = pages_.host_granularity();
  return host_granularity_;
}

bool Spiller::may_spill(const Segment& s) {
  if (!s.expandable || s.asleep || s.private_pool != nullptr || !s.borrows.empty()) return false;
  const std::size_t g = host_granularity();
  return g != 0 && s.page % g == 0;
}

std::vector<Spiller::Move> Spiller::moves(Segment& s) {
  std::vector<Move> out;
  if (!may_spill(s)) return out;
  const PageTable& t = s.pages;
  const std::vector<std::uint8_t> mark = s.slot_marks();
  for (std::size_t i = 0; i < t.stored();) {
    const std::size_t n = t.extent(i);
    if (t.handle(i) == 0 || n == 0) {
      ++i;
      continue;
    }
    Move mv{Mapping{&s, i, n}, {}, 0};
    bool frozen = t.host(i) || s.borrowed_at(i);
    for (std::size_t k = i; k < i + n; ++k) {
      frozen = frozen || (mark[k] & Segment::kSlotFrozen) != 0;
      if ((mark[k] & Segment::kSlotLive) == 0) continue;
      ++mv.kept;
      if (!mv.keep.empty() && mv.keep.back().first + mv.keep.back().count == k) {
        ++mv.keep.back().count;
      } else {
        mv.keep.push_back(SlotRun{k, 1});
      }
    }
    if (!frozen && mv.kept > 0) out.push_back(std::move(mv));
    i += n;
  }
  return out;
}

std::size_t Spiller::host_bytes(const std::vector<Move>& plan) noexcept {
  std::size_t n = 0;
  for (const Move& m : plan) n += m.kept * m.mapping.segment->page;
  return n;
}

std::size_t Spiller::room() const noexcept {
  if (config_.spill_limit == 0) return SIZE_MAX;
  const auto used = static_cast<std::size_t>(stats_.spilled_bytes.current);
  return used < config_.spill_limit ? config_.spill_limit - used : 0;
}

void Spiller::book(const Move& m, bool to_host) noexcept {
  Segment& s = *m.mapping.segment;
  const std::size_t page = s.page;
  char* const at = s.base + m.mapping.first * page;
  if (to_host) {
    // The whole device mapping went; the kept runs are host pages now.
    ledger_.unmapped(s, at, m.mapping.count * page);
    for (const SlotRun& r : m.keep) {
      s.pages.set_host(r.first, r.count, true);
      s.spilled += static_cast<std::uint32_t>(r.count);
      ledger_.host_mapped(s.base + r.first * page, r.count * page);
    }
    // The free slots between the kept runs are unmapped now: they leave their free blocks.
    store_.unmapped_between(s, m.mapping.first, m.mapping.count, m.keep);
  } else {
    // One host slot, back on a fresh device page.
    ledger_.host_unmapped(at, page);
    ledger_.mapped(s, at, page);
    --s.spilled;
  }
}

void Spiller::spill(const std::vector<Move>& plan) {
  if (plan.empty()) return;
  const std::size_t need = host_bytes(plan);
  if (need > room())
    throw out_of_memory(fmt::format(
        "spill: device {}: {} bytes would move to host pages, and spill_limit_mb allows {} more "
        "({} spilled already); nothing moved",
        device_, need, room(), stats_.spilled_bytes.current));
  // 1. Every host page first: the host refuses before anything moves.
  std::vector<std::vector<phys_handle_t>> host(plan.size());
  auto release_host = [&](std::size_t from) noexcept {
    for (std::size_t k = from; k < host.size(); ++k) {
      for (phys_handle_t h : host[k]) pages_.release_or_orphan(h);
      host[k].clear();
    }
  };
  try {
    for (std::size_t k = 0; k < plan.size(); ++k) {
      const std::size_t page = plan[k].mapping.segment->page;
      host[k].reserve(plan[k].kept);
      for (std::size_t i = 0; i < plan[k].kept; ++i) {
        const phys_handle_t h = pages_.create_host(page);
        if (h == 0) {
          std::size_t made = 0;
          for (std::size_t j = 0; j <= k; ++j) made += host[j].size() * plan[j].mapping.segment->page;
          throw out_of_memory(fmt::format(
              "spill: device {}: the host cannot give {} bytes of host pages (it refused after "
              "{}); nothing moved",
              device_, need, made));
        }
        host[k].push_back(h);
      }
    }
  } catch (...) {
    release_host(0);
    throw;
  }
  // 2. The remaps, each whole; a failure brings back the ones done (their data is on the host
  // pages, the device pages they left are free again).
  std::size_t done = 0;
  try {
    for (; done < plan.size(); ++done) {
      const Move& m = plan[done];
      const std::size_t runs = m.keep.size() + 1;
      BlockStore::reserve(m.mapping.segment, 2 * runs);  // book() cannot fail
      if (!pages_.remap(m.mapping, m.keep, false, host[done].data()))
        throw out_of_memory(fmt::format("spill: device {}: no address space or memory for the "
                                        "remap's scratch range; nothing moved", device_));
      host[done].clear();  // the page table's now
      book(m, true);
    }
  } catch (...) {
    release_host(done);
    for (std::size_t k = done; k-- > 0;) {
      for (const SlotRun& r : plan[k].keep) {
        for (std::size_t i = r.first; i < r.first + r.count; ++i) {
          try {
            (void)unspill_slot(*plan[k].mapping.segment, i);
          } catch (...) {  // it stays on the host: a consistent state, reported by the rethrow
          }
        }
      }
    }
    throw;
  }
  // 3. The free device pages of the ranges touched go back to the device.
  std::vector<Segment*> touched;
  for (const Move& m : plan)
    if (std::find(touched.begin(), touched.end(), m.mapping.segment) == touched.end())
      touched.push_back(m.mapping.segment);
  for (Segment* s : touched) {
    try {
      ranges_.release_range(s);
    } catch (...) {  // the pages stay cached; the next release tries again
    }
  }
}

bool Spiller::unspill_slot(Segment& s, std::size_t i) {
  if (!ledger_.fits(s.page)) return false;
  BlockStore::reserve(&s, 2);
  if (!pages_.remap(Mapping{&s, i, 1}, {SlotRun{i, 1}})) return false;
  book(Move{Mapping{&s, i, 1}, {SlotRun{i, 1}}, 1}, false);
  return true;
}

bool Spiller::unspill(Segment& s) {
  for (std::size_t i = 0; i < s.pages.stored() && s.spilled != 0; ++i)
    if (s.pages.host(i) && !unspill_slot(s, i)) return false;
  return s.spilled == 0;
}

std::size_t Spiller::live_bytes_on_host(const Segment& s) noexcept {
  std::size_t n = 0;
  if (s.spilled == 0) return n;
  for (const Block* b = s.head; b != nullptr; b = b->next) {
    if (b->is_free() || b->state == BlockState::unmapped || b->state == BlockState::lent) continue;
    const auto offset = static_cast<std::size_t>(b->ptr - s.base);
    for (std::size_t i = offset / s.page; i * s.page < offset + b->size; ++i) {
      if (!s.pages.host(i)) continue;
      n += std::min(offset + b->size, (i + 1) * s.page) - std::max(offset, i * s.page);
    }
  }
  return n;
}

void Spiller::release_freed(Segment& s) {
  if (s.spilled == 0) return;
  const std::size_t page = s.page;
  // The first run of host slots wholly inside a free block: (block, first slot, end slot).
  auto next_run = [&](Block*& block, std::size_t& first, std::size_t& last) {
    for (Block* b = s.head; b != nullptr; b = b->next) {
      if (!b->is_free()) continue;
      const auto offset = static_cast<std::size_t>(b->ptr - s.base);
      const std::size_t lo = round_up(offset, page) / page;
      const std::size_t hi = (offset + b->size) / page;
      for (std::size_t i = lo; i < hi; ++i) {
        if (!s.pages.host(i)) continue;
        std::size_t j = i + 1;
        while (j < hi && s.pages.host(j)) ++j;
        block = b, first = i, last = j;
        return true;
      }
    }
    return false;
  };
  Block* b = nullptr;
  std::size_t first = 0, last = 0;
  if (!next_run(b, first, last)) return;
  BlockStore::reserve(&s, 2);  // (throws std::bad_alloc: kept until the next release)
  pages_.synchronize(s.stream);  // kernels queued before the free may still use the pages
  do {
    char* at = s.base + first * page;
    const std::size_t bytes = (last - first) * page;
    // An unmap that fails is kept as a stray (retried before the next map there); the host pages
    // leave the range's books either way.
    pages_.unmap_or_stray(at, bytes);
    ledger_.host_unmapped(at, bytes);
    s.spilled -= static_cast<std::uint32_t>(last - first);
    (void)pages_.release(s, first, last);  // (a release that fails is kept as an orphan)
    store_.take_pages(b, first * page, last * page, BlockState::unmapped);
    BlockStore::reserve(&s, 2);
  } while (next_run(b, first, last));
}

}  // namespace stitch::detail
