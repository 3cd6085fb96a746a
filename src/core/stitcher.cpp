// core/stitcher.cpp — virtual-memory stitching (stitching:True, after GMLake, ASPLOS '24).
//
// When no free block fits a request and the device cannot map more pages, the whole pages lying
// inside free blocks of expandable ranges (any pool, any stream) are moved: unmapped where they
// are, without releasing their physical handles, and mapped side by side into a fresh virtual
// range reserved for the request. That range is a `stitched` segment (an expandable segment of
// the requesting stream and pool whose page table holds the moved handles); it serves the request
// through the normal alloc_found_block path, and what is left of it stays cached as a free block.
//
// Pages of the requesting stream are taken first, then fresh pages the device can still give,
// then pages of other streams. Every stream whose pages move is synchronized first (the unmap is
// not stream-ordered: kernels queued earlier may still use the old addresses).
//
// When: in allocate_slow, after growing failed (device or memory-fraction limit) and before the
// last resort (which would unmap and release the very pages reused here). With
// stitch_before_grow_mb, requests of at least that size are also stitched from their own
// stream's free pages before growing (own_only: no fresh pages, no other stream).
//
// All or nothing: the bookkeeping follows each backend call, and on a failure every page moved
// so far is mapped back where it was (or, if even that fails, released: its source range then
// keeps an unmapped hole, which is a consistent state).
#include <algorithm>
#include <cstdint>
#include <exception>
#include <map>
#include <vector>

#include "core/constants.hpp"
#include "core/stitcher.hpp"

#include "core/assert.hpp"
#include "core/device_allocator.hpp"
#include "core/page_mapper.hpp"
#include "core/stat_update.hpp"

namespace stitch::detail {


namespace {

using Run = PageRun;

/// stitch_reuse_pages moves free pages into a growing range only while they are more than
/// reserved / kReuseSlack (see map_reused_pages).
constexpr std::size_t kReuseSlack = 64;

/// The most slots, at most `n`, from the start of `run` that end at a handle boundary (a
/// coarse page moves whole or not at all).
std::size_t cut(const Run& run, std::size_t n) {
  const Segment* s = run.block->segment;
  std::size_t pos = run.first;
  while (pos < run.first + run.count && pos + s->pages.extent(pos) <= run.first + n)
    pos += s->pages.extent(pos);
  return pos - run.first;
}

/// Picks runs from `runs` adding up to `want` slots (or all of them when they do not reach it)
/// and appends them to `plan`; returns the slots taken. Largest runs first, and the last piece
/// from the smallest run that covers what is still missing (at a handle boundary): few unmap
/// calls, few broken runs.
std::size_t take(std::vector<Run> runs, std::size_t want, std::vector<Run>& plan) {
  std::stable_sort(runs.begin(), runs.end(),
                   [](const Run& a, const Run& b) { return a.count > b.count; });
  std::size_t taken = 0;
  std::size_t next = 0;  // runs[next..] are untaken
  while (taken < want && next < runs.size()) {
    const std::size_t missing = want - taken;
    // Smallest untaken run covering `missing` exactly (runs are sorted by decreasing size).
    std::size_t cover = runs.size();
    for (std::size_t i = next; i < runs.size() && runs[i].count >= missing; ++i)
      if (cut(runs[i], missing) == missing) cover = i;
    if (cover != runs.size()) {
      plan.push_back(Run{runs[cover].block, runs[cover].first, missing});
      return taken + missing;
    }
    const Run& r = runs[next];
    const std::size_t n = r.count <= missing ? r.count : cut(r, missing);
    if (n > 0) {
      plan.push_back(Run{r.block, r.first, n});
      taken += n;
    }
    ++next;
  }
  return taken;
}
}  // namespace

void Stitcher::map_back(Segment* segment, std::size_t index, phys_handle_t handle,
                        std::size_t slots, std::size_t piece) noexcept {
  // Undo of a move: maps `handle` again at slot `index` of `segment`, where an unmapped block
  // now lies, and files that page as free (it was free when it left).
  const std::size_t page = segment->page * slots;
  char* at = segment->base + index * segment->page;
  try {
    d_.backend_.map(d_.device_, at, page, handle, piece * segment->page);
  } catch (...) {
    // The source keeps a hole there: consistent, just smaller.
    d_.pages_.give_back(Piece{handle, piece}, segment->page);
    return;
  }
  // Bookkeeping only from here (an allocation failure in it terminates: noexcept).
  Block* u = segment->head;
  while (u != nullptr && !(u->ptr <= at && at < u->ptr + u->size)) u = u->next;
  STITCH_ASSERT(u != nullptr && !u->mapped, "map_back: the page's place is an unmapped block");
  DeviceAllocator::Pool& pool = d_.pool_for(segment->small);
  pool.unmapped.erase(u);
  if (u->ptr < at) {  // unmapped front stays unmapped
    Block* front = d_.link_new_front(u, static_cast<std::size_t>(at - u->ptr));
    front->mapped = false;
    u->size -= front->size;
    u->ptr = at;
    pool.unmapped.insert(front);
  }
  d_.split_unmapped_tail(u, page);  // the unmapped rest stays unmapped
  u->mapped = true;
  segment->pages.set(index, slots, handle, piece);
  d_.trace(TraceAction::segment_map, at, page, segment->stream);
  d_.ledger_.mapped(segment->small, page);
  d_.insert_free(pool, u);
}

void Stitcher::release_or_keep(bool small, stream_t stream, void* va, std::size_t bytes,
                                      std::size_t page) noexcept {
  // Gives back an unused, wholly unmapped stitching range. If that fails, the range is kept as
  // an empty stitched segment (one unmapped block), which release_expandable_pages releases
  // later, like any wholly unmapped range.
  try {
    d_.backend_.release_reservation(d_.device_, va, bytes);
    return;
  } catch (...) {
  }
  d_.adopt_unmapped_range(d_.pool_for(small), stream, static_cast<char*>(va), bytes, page, true);
}


std::size_t Stitcher::free_page_runs(stream_t stream, std::vector<Run>& own,
                                           std::map<stream_t, std::vector<Run>>* others,
                                           const Block* skip_a, const Block* skip_b) {
  const std::size_t page = d_.backend_.granularity(d_.device_);
  std::size_t total = 0;
  for (const DeviceAllocator::Pool* p : {&d_.small_, &d_.large_}) {
    for (Block* b : p->index) {
      const Segment* s = b->segment;
      if (!s->expandable || s->page != page || b == skip_a || b == skip_b) continue;
      if (s->stream != stream && others == nullptr) continue;
      const auto offset = static_cast<std::size_t>(b->ptr - s->base);
      std::size_t first = round_up(offset, page) / page;
      std::size_t last = (offset + b->size) / page;
      s->pages.whole_handles(first, last);  // coarse pages move whole
      if (last <= first) continue;
      (s->stream == stream ? own : (*others)[s->stream]).push_back(Run{b, first, last - first});
      total += last - first;
    }
  }
  return total;
}

void Stitcher::move_out(const std::vector<Run>& plan, std::vector<MovedPage>& moved,
                               std::vector<Segment*>& sources) {
  const std::size_t first_moved = moved.size();
  for (const Run& run : plan) {
    Segment* s = run.block->segment;
    const std::size_t page = s->page;
    char* at = s->base + run.first * page;
    const std::size_t bytes = run.count * page;
    try {
      d_.backend_.unmap(d_.device_, at, bytes);
    } catch (...) {
      for (std::size_t i = moved.size(); i > first_moved; --i)
        map_back(moved[i - 1].segment, moved[i - 1].index, moved[i - 1].handle, moved[i - 1].slots,
                 moved[i - 1].piece);
      moved.resize(first_moved);
      throw;
    }
    for (std::size_t i = run.first; i < run.first + run.count;) {
      const std::size_t slots = s->pages.extent(i);
      moved.push_back(MovedPage{s, i, s->pages.handle(i), slots, s->pages.piece(i)});
      s->pages.set(i, slots, 0);
      i += slots;
    }
    d_.trace(TraceAction::segment_unmap, at, bytes, s->stream);
    d_.ledger_.unmapped(s->small, bytes);
    d_.mark_unmapped(run.block, run.first * page, run.first * page + bytes);
    if (s->stitched && std::find(sources.begin(), sources.end(), s) == sources.end())
      sources.push_back(s);
  }
}

void Stitcher::map_side_by_side(Segment& dest, std::size_t first,
                                const std::vector<MovedPage>& moved,
                                const std::vector<Piece>& fresh) {
  const std::size_t page = dest.page;
  char* at = dest.base + first * page;
  std::size_t mapped = 0;  // slots
  try {
    std::size_t slots = fresh.size();
    for (const MovedPage& m : moved) slots += m.slots;
    dest.pages.make_room(first + slots);
    d_.pages_.unmap_strays();  // a stray range may lie where these pages go
    for (const MovedPage& m : moved) {
      d_.backend_.map(d_.device_, at + mapped * page, m.slots * page, m.handle, m.piece * page);
      mapped += m.slots;
    }
    for (const Piece& p : fresh) {
      d_.backend_.map(d_.device_, at + mapped * page, page, p.handle, p.piece * page);
      ++mapped;
    }
  } catch (...) {
    if (mapped > 0) d_.pages_.unmap_or_stray(at, mapped * page);
    for (auto it = moved.rbegin(); it != moved.rend(); ++it)
      map_back(it->segment, it->index, it->handle, it->slots, it->piece);
    for (const Piece& p : fresh) d_.pages_.give_back(p, page);
    throw;
  }
  std::size_t slot = first;
  for (const MovedPage& m : moved) {
    dest.pages.set(slot, m.slots, m.handle, m.piece);
    slot += m.slots;
  }
  for (const Piece& p : fresh) dest.pages.set(slot++, 1, p.handle, p.piece);
}

std::size_t Stitcher::split_partly_free(stream_t stream, bool own_only, std::size_t want) {
  const std::size_t page = d_.backend_.granularity(d_.device_);
  // (segment, first slot of the coarse page) -> its whole free slots.
  std::map<std::pair<Segment*, std::size_t>, std::size_t> gain;
  for (const DeviceAllocator::Pool* p : {&d_.small_, &d_.large_}) {
    for (Block* b : p->index) {
      Segment* s = b->segment;
      if (!s->expandable || s->page != page || (own_only && s->stream != stream)) continue;
      const auto offset = static_cast<std::size_t>(b->ptr - s->base);
      const std::size_t first = round_up(offset, page) / page;
      const std::size_t last = (offset + b->size) / page;
      if (last <= first) continue;
      // The coarse pages at the block's two ends, when they reach out of it.
      const std::size_t heads[2] = {s->pages.head_of(first), s->pages.head_of(last - 1)};
      for (int e = 0; e < 2; ++e) {
        const std::size_t head = heads[e];
        const std::size_t n = s->pages.extent(head);
        if (n <= 1 || (e == 1 && head == heads[0])) continue;
        if (head >= first && head + n <= last) continue;  // inside the block: it moves whole
        gain[{s, head}] += std::min(head + n, last) - std::max(head, first);
      }
    }
  }
  std::vector<std::pair<std::size_t, std::pair<Segment*, std::size_t>>> best;
  std::size_t total = 0;
  for (const auto& [where, slots] : gain) {
    best.emplace_back(slots, where);
    total += slots;
  }
  if (total < want) return 0;  // even all of them would not do
  std::stable_sort(best.begin(), best.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  // Kernels on any stream may use the live blocks on these pages: the device goes idle first.
  d_.backend_.synchronize_device(d_.device_);
  std::size_t gained = 0;
  for (const auto& [slots, where] : best) {
    if (gained >= want) break;
    d_.pages_.split(*where.first, where.second);  // throws: the page stays whole
    ++d_.stats_.num_page_splits;
    gained += slots;
  }
  return gained;
}

void Stitcher::dissolve_emptied(const std::vector<Segment*>& sources) noexcept {
  for (Segment* s : sources) {
    try {
      d_.release_if_unmapped(s);
    } catch (...) {  // kept, wholly unmapped: release_expandable_pages retries
    }
  }
}

bool Stitcher::map_reused_pages(Block* target, std::size_t count) {
  // Like PageMapper::map, but the stream's whole free pages elsewhere (both pools, stitched ranges
  // included) are moved here first: reserved memory grows only by the fresh pages. The free
  // blocks next to `target` are left alone (the caller serves the request from the one before,
  // and moving their pages would merge their holes with `target`).
  Segment* dest = target->segment;
  const std::size_t page = dest->page;
  std::vector<Run> own;
  std::vector<Run> plan;
  // Only when the stream's free pages are more than a slack of 1/64 of reserved memory: a few
  // cached pages are what the next same-sized request reuses in place; taking even those made
  // every grow steal from blocks about to be reused, and slivers of pages piled up between the
  // holes (ftcourse-finetune: 93 MiB of them at its peak, against 7 MiB; docs/stitching.md).
  const std::size_t have = free_page_runs(dest->stream, own, nullptr, target->prev, target->next);
  const std::size_t reserved_now = d_.ledger_.reserved();
  if (have * page > reserved_now / kReuseSlack) take(std::move(own), count, plan);
  std::size_t reused = 0;
  for (const Run& r : plan) reused += r.count;
  const std::size_t fresh_pages = count - reused;
  if (!d_.ledger_.fits(fresh_pages * page)) return false;
  const std::size_t first = static_cast<std::size_t>(target->ptr - dest->base) / page;
  if (reused == 0) return d_.pages_.map(*dest, first, count);

  std::vector<Piece> fresh;
  auto release_fresh = [&] {
    for (const Piece& p : fresh) d_.pages_.give_back(p, page);
  };
  try {
    fresh.reserve(fresh_pages);
    while (fresh.size() < fresh_pages) {
      const Piece p = d_.pages_.fresh_page(page);
      if (p.handle == 0) {
        release_fresh();
        return false;
      }
      fresh.push_back(p);
    }
    // Kernels queued on the stream may still use the pages' old addresses.
    d_.backend_.synchronize_stream(d_.device_, dest->stream);
  } catch (...) {
    release_fresh();
    throw;
  }
  std::vector<MovedPage> moved;
  std::vector<Segment*> sources;
  try {
    move_out(plan, moved, sources);  // on failure, everything is back where it was
  } catch (...) {
    release_fresh();
    throw;
  }
  // On a failure everything is undone; after two faults in a row stray mappings stay in
  // `dest`'s pages (unmapped in the bookkeeping) until unmap_strays() succeeds.
  map_side_by_side(*dest, first, moved, fresh);
  ++d_.stats_.num_page_reuses;
  dissolve_emptied(sources);
  return true;
}

Block* Stitcher::stitch(bool small, stream_t stream,
                                                      std::size_t rounded, bool own_only) {
  using Pool = DeviceAllocator::Pool;
  Pool& pool = d_.pool_for(small);
  const std::size_t page = d_.backend_.granularity(d_.device_);
  const std::size_t pages = round_up(rounded, page) / page;

  // 1. Candidates: whole pages inside free blocks of one-granule-page ranges, by stream.
  std::vector<Run> own;
  std::map<stream_t, std::vector<Run>> others;
  std::map<stream_t, std::size_t> other_pages;
  std::size_t own_total = 0, other_total = 0;
  auto collect = [&] {
    own.clear();
    others.clear();
    other_pages.clear();
    own_total = other_total = 0;
    free_page_runs(stream, own, own_only ? nullptr : &others);
    for (const Run& r : own) own_total += r.count;
    for (const auto& [s, runs] : others)
      for (const Run& r : runs) {
        other_pages[s] += r.count;
        other_total += r.count;
      }
  };
  collect();

  // 2. Fresh pages the device (and the memory fraction) may still give, loose pieces first.
  std::size_t fresh_limit = own_only ? 0 : d_.backend_.memory_info(d_.device_).free / page;
  fresh_limit = std::min(fresh_limit, d_.ledger_.room() / page);
  if (!own_only) fresh_limit += d_.pages_.loose_pieces();
  // Too few: split coarse pages that are partly free, so that their free slots can move too.
  const std::size_t found = own_total + fresh_limit + other_total;
  if (found < pages && split_partly_free(stream, own_only, pages - found) > 0) collect();
  if (own_total + other_total == 0) return nullptr;  // only fresh pages: growing failed already
  if (own_only && own_total < pages) return nullptr;
  if (own_total + fresh_limit + other_total < pages) return nullptr;

  // 3. The plan: own pages first, then fresh ones, then other streams', fewest streams first.
  std::vector<Run> plan;
  std::size_t planned = take(own, pages, plan);
  const bool sync_own = planned > 0;
  void* va = d_.backend_.reserve(d_.device_, pages * page, page);  // throws: nothing changed
  if (va == nullptr) return nullptr;
  std::vector<Piece> fresh;
  auto give_up = [&] {  // nothing is mapped in the new range
    for (const Piece& p : fresh) d_.pages_.give_back(p, page);
    release_or_keep(small, stream, va, pages * page, page);
  };
  try {
    const std::size_t want_fresh = std::min(pages - planned, fresh_limit);
    fresh.reserve(want_fresh);
    while (fresh.size() < want_fresh) {
      const Piece p = d_.pages_.fresh_page(page);
      if (p.handle == 0) break;  // the device gave less than it reported: other streams make it up
      fresh.push_back(p);
    }
    std::vector<stream_t> to_sync;
    if (sync_own) to_sync.push_back(stream);
    if (planned + fresh.size() < pages) {
      std::vector<std::pair<std::size_t, stream_t>> by_pages;
      for (const auto& [s, n] : other_pages) by_pages.emplace_back(n, s);
      std::stable_sort(by_pages.begin(), by_pages.end(),
                       [](const auto& a, const auto& b) { return a.first > b.first; });
      std::vector<Run> chosen;
      std::size_t have = 0;
      for (const auto& [n, s] : by_pages) {
        if (planned + fresh.size() + have >= pages) break;
        chosen.insert(chosen.end(), others[s].begin(), others[s].end());
        have += n;
        to_sync.push_back(s);
      }
      planned += take(std::move(chosen), pages - planned - fresh.size(), plan);
      if (planned + fresh.size() < pages) {
        give_up();
        return nullptr;
      }
    }
    // Kernels queued on these streams may still use the pages' old addresses.
    for (stream_t s : to_sync) d_.backend_.synchronize_stream(d_.device_, s);
  } catch (...) {
    give_up();
    throw;
  }

  // 4. Move: unmap each run where it is (the handles stay alive), bookkeeping as we go.
  std::vector<MovedPage> moved;
  moved.reserve(planned);
  std::vector<Segment*> sources;
  try {
    move_out(plan, moved, sources);
  } catch (...) {
    give_up();
    throw;
  }

  // 5. Map the moved pages, then the fresh ones, side by side into the new range (its page
  // table is filled here and moves into the segment below).
  Segment table;
  table.base = static_cast<char*>(va);
  table.page = page;
  table.pages.reset(pages);
  try {
    map_side_by_side(table, 0, moved, fresh);
  } catch (...) {  // the pages are back where they were, the fresh ones released
    // With stray mappings left (a second failure), release_or_keep keeps the range as an empty
    // stitched segment, given back once the stray unmap succeeds.
    release_or_keep(small, stream, va, pages * page, page);
    throw;
  }

  // 6. The stitched segment: one free block over the whole range.
  Block* block = d_.link_new_segment(pool, stream, static_cast<char*>(va), pages * page);
  Segment* segment = block->segment;
  segment->expandable = true;
  segment->stitched = true;
  segment->page = page;
  segment->pages = std::move(table.pages);
  d_.trace(TraceAction::segment_map, va, segment->size, stream);
  d_.ledger_.mapped(pool.small, segment->size);
  ++d_.stats_.num_stitches;
  d_.stats_.stitched_bytes += static_cast<std::int64_t>(segment->size);

  // Stitched ranges emptied by this move are dissolved: their reservations go back.
  dissolve_emptied(sources);
  return d_.insert_free(pool, block);
}

}  // namespace stitch::detail
