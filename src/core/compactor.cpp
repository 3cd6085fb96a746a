// core/compactor.cpp — Compactor: choosing the coarse pages to empty, emptying them through the
// page mapper's remap, and the bookkeeping of the granules they free.
#include "core/compactor.hpp"

#include <algorithm>
#include <cstdint>
#include <new>

#include "core/assert.hpp"
#include "stitch/errors.hpp"

namespace stitch::detail {

std::vector<Compactor::Candidate> Compactor::candidates() const {
  std::vector<Candidate> out;
  const std::size_t granule = pages_.granularity();
  for (Segment* s = store_.segments(); s != nullptr; s = s->next) {
    if (!s->expandable || s->page != granule) continue;  // ranges made with stitching only
    if (s->asleep) continue;  // nothing under a sleeping range is mapped
    if (s->private_pool != nullptr) continue;  // a graph's replay may use its free granules
    const PageTable& t = s->pages;
    const std::vector<std::uint8_t> mark = s->slot_marks();
    for (std::size_t i = 0; i < t.stored();) {
      const std::size_t n = t.extent(i);
      if (t.handle(i) == 0 || n == 0) {
        ++i;
        continue;
      }
      Candidate c{Mapping{s, i, n}, {}, 0, 0};
      bool frozen = s->borrowed_at(i);
      for (std::size_t k = i; k < i + n; ++k) {
        frozen = frozen || (mark[k] & Segment::kSlotFrozen) != 0;
        if ((mark[k] & Segment::kSlotLive) == 0) {
          ++c.free;
          continue;
        }
        ++c.live;
        if (!c.keep.empty() && c.keep.back().first + c.keep.back().count == k) {
          ++c.keep.back().count;
        } else {
          c.keep.push_back(SlotRun{k, 1});
        }
      }
      if (n > 1 && !frozen && c.free > 0) out.push_back(std::move(c));
      i += n;
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    // a.free / a.live > b.free / b.live, without dividing (a wholly free page first).
    const std::uint64_t l = static_cast<std::uint64_t>(a.free) * b.live;
    const std::uint64_t r = static_cast<std::uint64_t>(b.free) * a.live;
    if (l != r) return l > r;
    return a.free > b.free;
  });
  return out;
}

bool Compactor::empty(const Candidate& c, bool stage) {
  Segment& s = *c.mapping.segment;
  const std::size_t page = s.page;
  // The store's change after the remap cannot fail (may throw here: nothing changed).
  const std::size_t runs = c.keep.size() + 1;
  BlockStore::reserve(&s, 2 * runs);
  if (!pages_.remap(c.mapping, c.keep, stage)) return false;
  // Booked as what happened: the whole mapping unmapped, the kept runs mapped again.
  ledger_.unmapped(s, s.base + c.mapping.first * page, c.mapping.count * page);
  for (const SlotRun& r : c.keep) ledger_.mapped(s, s.base + r.first * page, r.count * page);
  // The free granules between the kept runs are unmapped now: they leave their free blocks.
  store_.unmapped_between(s, c.mapping.first, c.mapping.count, c.keep);
  ++stats_.num_compactions;
  if (stage) ++stats_.num_staged_compactions;
  stats_.compacted_bytes += static_cast<std::int64_t>(c.live * page);
  return true;
}

bool Compactor::compact(stream_t stream, std::size_t rounded) {
  const std::size_t granule = pages_.granularity();
  const std::size_t needed = round_up(rounded, granule) / granule;
  try {
    std::size_t reach = stitcher_.pages_within_reach(stream, rounded);
    if (reach >= needed) return false;
    // Emptying a page changes no other candidate (a candidate is never lent or borrowed), so
    // the list is made once and each page emptied leaves it.
    std::vector<Candidate> all = candidates();
    if (all.empty()) return false;
    // Nothing moves for a request that emptying every candidate could not serve: each page
    // emptied adds at most its free granules to what a stitch finds (an upper bound: a page's
    // free start may be counted already, as borrowable).
    std::size_t freeable = 0;
    for (const Candidate& c : all) freeable += c.free;
    if (reach + freeable < needed) {
      ++stats_.num_compactions_refused;
      return false;
    }
    // Kernels of any stream (of any device with peer access) may still use these pages.
    pages_.synchronize_device(config_.peer_access);
    ++stats_.num_device_syncs;
    for (; reach < needed; reach = stitcher_.pages_within_reach(stream, rounded)) {
      if (all.empty()) return false;
      // The fresh pages for a page's live granules come from the device (and the fraction).
      const std::size_t room = std::min(pages_.device_free(), ledger_.room()) / granule;
      // The best page whose fresh pages the device can give now; else the best one, its live
      // data staged through host memory (its own release makes the room).
      auto it = std::find_if(all.begin(), all.end(), [&](const Candidate& c) { return c.live <= room; });
      const bool stage = it == all.end();
      if (stage) it = all.begin();
      if (!empty(*it, stage)) return false;
      all.erase(it);
    }
  } catch (const backend_error&) {
    return false;  // the page being emptied is as it was; the request fails with the report
  } catch (const std::bad_alloc&) {
    return false;  // host memory ran out before a page moved, or between two: each is whole
  }
  return true;
}

}  // namespace stitch::detail
