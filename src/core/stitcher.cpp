// core/stitcher.cpp — virtual-memory stitching (stitching:True, after GMLake, ASPLOS '24).
//
// When no free block fits a request and the device cannot map more pages, the whole pages lying
// inside free blocks of expandable ranges (any pool, any stream) are moved: unmapped where they
// are, without releasing their physical handles, and mapped side by side into a fresh virtual
// range reserved for the request. That range is a `stitched` segment (an expandable segment of
// the requesting stream and pool whose page table holds the moved handles); it serves the request
// through the normal BlockStore::take path, and what is left of it stays cached as a free block.
//
// Pages of the requesting stream are taken first, then fresh pages the device can still give,
// then pages of other streams. Every stream whose pages move is synchronized first (the unmap is
// not stream-ordered: kernels queued earlier may still use the old addresses).
//
// Borrowing. A coarse page (one handle over several slots) that a live block shares cannot move,
// and nothing mapped under a live block is ever unmapped (another thread may be launching work
// on it). When the pages above are too few, a free run at the start of such a page is mapped a
// second time (cuMemMap maps a handle from its start: its offset "currently must be zero"), at
// the end of the new range: the range borrows it, and where it lies it becomes a lent block,
// unusable there, until the borrowed mapping is unmapped (the range's free pages released under
// pressure or by empty_cache) and the lent block is free again. A borrowed mapping moves with
// its lent block when a later stitch takes it. The requesting stream's own borrowed memory
// needs no sync (nothing is unmapped). Free runs in the middle or at the end of a coarse page
// stay where they are.
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

#include "core/stitcher.hpp"

#include "core/assert.hpp"
#include "core/constants.hpp"

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

void Stitcher::map_back(const MovedPage& m) noexcept {
  // Undo of a move: maps the page again where it was in its segment, where an unmapped block
  // now lies, and files it as free (it was free when it left).
  Segment* segment = m.segment;
  const std::size_t page = segment->page * m.slots;
  char* at = segment->base + m.index * segment->page;
  STITCH_ASSERT(m.piece == 0, "map_back: mappings start at their handle's start");
  if (!pages_.map_back(at, page, m.handle)) {
    // The source keeps a hole there: consistent, just smaller.
    if (m.lent != nullptr) {
      ledger_.returned(*m.lent);
      store_.return_lent(m.lent);
    } else {
      pages_.release_or_orphan(m.handle);
    }
    return;
  }
  // Bookkeeping only from here (an allocation failure in it terminates: noexcept).
  Block* u = segment->block_at(at);
  STITCH_ASSERT(u != nullptr && !u->is_mapped(), "map_back: the page's place is an unmapped block");
  segment->pages.set(m.index, m.slots, m.handle, m.piece);
  if (m.lent != nullptr) segment->borrows.push_back(Borrow{m.lent, m.index, m.slots});
  ledger_.mapped(*segment, at, page);
  store_.mapped(u, at, page, /*merge=*/true);
}

void Stitcher::release_or_keep(BlockPool& pool, stream_t stream, void* va, std::size_t bytes,
                               std::size_t page, std::unique_ptr<Segment>& space) noexcept {
  // Gives back an unused, wholly unmapped stitching range. If that fails, the range is kept as
  // an empty stitched segment (one unmapped block), which release_free_pages releases later,
  // like any wholly unmapped range.
  try {
    pages_.release_reservation(static_cast<char*>(va), bytes);
    return;
  } catch (...) {
  }
  store_.add_range(std::move(space), pool, stream, static_cast<char*>(va), bytes, page, true,
                   BlockState::unmapped);
}


std::size_t Stitcher::free_page_runs(stream_t stream, std::vector<Run>& own,
                                     std::map<stream_t, std::vector<Run>>* others,
                                     bool with_borrowed, std::uint16_t tag,
                                     const Block* skip_a, const Block* skip_b) {
  const std::size_t page = pages_.granularity();
  std::size_t total = 0;
  for (bool small : {true, false}) {
    for (Block* b : store_.free_blocks(small, tag)) {
      const Segment* s = b->segment;
      if (!s->expandable || s->page != page || b == skip_a || b == skip_b) continue;
      if (!with_borrowed && !s->borrows.empty()) continue;
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

std::vector<Stitcher::Lendable> Stitcher::lendable_runs(stream_t stream, bool own_only,
                                                        std::uint16_t tag) const {
  // The whole free granules of free blocks that lie on a coarse page reaching out of the block
  // (the part whole_handles leaves behind): at the block's two ends, or the whole block when it
  // lies inside one page. Each run is in one mapping, so it is mapped again with one call.
  const std::size_t page = pages_.granularity();
  std::vector<Lendable> out;
  // Tagged memory neither lends nor borrows: a sleep unmaps and releases its ranges' handles,
  // which must not be mapped anywhere else (docs/sleep.md).
  if (tag != 0) return out;
  for (bool small : {true, false}) {
    for (Block* b : store_.free_blocks(small)) {
      Segment* s = b->segment;
      if (!s->expandable || s->page != page) continue;
      if (own_only && s->stream != stream) continue;
      const auto offset = static_cast<std::size_t>(b->ptr - s->base);
      const std::size_t first = round_up(offset, page) / page;
      const std::size_t last = (offset + b->size) / page;
      if (last <= first) continue;
      const std::size_t heads[2] = {s->pages.head_of(first), s->pages.head_of(last - 1)};
      for (int e = 0; e < 2; ++e) {
        const std::size_t head = heads[e];
        const std::size_t n = s->pages.extent(head);
        if (n <= 1 || (e == 1 && head == heads[0])) continue;
        if (head >= first && head + n <= last) continue;  // inside the block: it moves whole
        // Only from the page's start: cuMemMap maps a handle from offset 0 ("currently must be
        // zero"), so a free run in the middle or at the end of a coarse page cannot be borrowed.
        if (head < first || s->pages.piece(head) != 0) continue;
        out.push_back(Lendable{s, head, std::min(head + n, last) - head});
      }
    }
  }
  return out;
}

void Stitcher::move_out(const std::vector<Run>& plan, std::vector<MovedPage>& moved,
                               std::vector<Segment*>& sources) {
  const std::size_t first_moved = moved.size();
  // Nothing after an unmap may fail (std::bad_alloc here instead, before anything moved): the
  // bookkeeping of every page moved out, and of its way back (map_back) should a later step fail.
  std::size_t pages = 0;
  for (const Run& run : plan) pages += run.count;
  moved.reserve(moved.size() + pages);
  sources.reserve(sources.size() + plan.size());
  for (const Run& run : plan) BlockStore::reserve(run.block->segment, 2 + 2 * pages);
  for (const Run& run : plan) {
    Segment* s = run.block->segment;
    const std::size_t page = s->page;
    char* at = s->base + run.first * page;
    const std::size_t bytes = run.count * page;
    try {
      pages_.unmap(at, bytes);
    } catch (...) {
      for (std::size_t i = moved.size(); i > first_moved; --i)
        map_back(moved[i - 1]);
      moved.resize(first_moved);
      throw;
    }
    for (std::size_t i = run.first; i < run.first + run.count;) {
      const std::size_t slots = s->pages.extent(i);
      MovedPage m{s, i, s->pages.handle(i), slots, s->pages.piece(i), nullptr};
      // Borrowed memory moves on with its lent block (a stitched range takes it over).
      for (auto b = s->borrows.begin(); b != s->borrows.end(); ++b)
        if (b->slot == i) {
          m.lent = b->block;
          s->borrows.erase(b);
          break;
        }
      moved.push_back(m);
      s->pages.set(i, slots, 0);
      i += slots;
    }
    ledger_.unmapped(*s, at, bytes);
    store_.take_pages(run.block, run.first * page, run.first * page + bytes, BlockState::unmapped);
    if (s->stitched && std::find(sources.begin(), sources.end(), s) == sources.end())
      sources.push_back(s);
  }
}

bool Stitcher::map_side_by_side(Segment& dest, std::size_t first,
                                const std::vector<MovedPage>& moved,
                                const std::vector<phys_handle_t>& fresh) {
  const std::size_t page = dest.page;
  char* at = dest.base + first * page;
  auto undo = [&] {
    for (auto it = moved.rbegin(); it != moved.rend(); ++it) map_back(*it);
    for (phys_handle_t h : fresh) pages_.release_or_orphan(h);
  };
  bool mapped = false;
  try {
    std::size_t slots = fresh.size();
    for (const MovedPage& m : moved) slots += m.slots;
    dest.pages.make_room(first + slots);
    std::vector<MapPiece> pieces;
    pieces.reserve(moved.size() + fresh.size());
    std::size_t lent = 0;
    for (const MovedPage& m : moved) lent += m.lent != nullptr;
    dest.borrows.reserve(dest.borrows.size() + lent);  // (the bookkeeping below cannot fail)
    for (const MovedPage& m : moved) {
      STITCH_ASSERT(m.piece == 0, "move: mappings start at their handle's start");
      pieces.push_back(MapPiece{m.handle, m.slots * page});
    }
    for (phys_handle_t h : fresh) pieces.push_back(MapPiece{h, page});
    mapped = pages_.map_pieces(at, pieces);  // (stray ranges where they go are unmapped first)
  } catch (...) {
    undo();
    throw;
  }
  if (!mapped) {  // out of memory while mapping: nothing of the run is mapped
    undo();
    return false;
  }
  std::size_t slot = first;
  for (const MovedPage& m : moved) {
    dest.pages.set(slot, m.slots, m.handle, m.piece);
    if (m.lent != nullptr) dest.borrows.push_back(Borrow{m.lent, slot, m.slots});
    slot += m.slots;
  }
  for (phys_handle_t h : fresh) dest.pages.set(slot++, 1, h);
  return true;
}

void Stitcher::dissolve_emptied(const std::vector<Segment*>& sources) noexcept {
  for (Segment* s : sources) {
    if (!s->wholly_unmapped()) continue;
    try {
      pages_.release_reservation(s->base, s->size);
      store_.remove_segment(s);
    } catch (...) {  // kept, wholly unmapped: release_free_pages retries
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
  const std::size_t have =
      free_page_runs(dest->stream, own, nullptr, false, dest->tag, target->prev, target->next);
  const std::size_t reserved_now = ledger_.reserved();
  if (have * page > reserved_now / kReuseSlack) take(std::move(own), count, plan);
  std::size_t reused = 0;
  for (const Run& r : plan) reused += r.count;
  const std::size_t fresh_pages = count - reused;
  if (!ledger_.fits(fresh_pages * page)) return false;
  const std::size_t first = static_cast<std::size_t>(target->ptr - dest->base) / page;
  if (reused == 0) return pages_.map(*dest, first, count);

  std::vector<phys_handle_t> fresh;
  auto release_fresh = [&] {
    for (phys_handle_t h : fresh) pages_.release_or_orphan(h);
  };
  try {
    fresh.reserve(fresh_pages);  // (a handle made is always kept: no push_back can fail)
    while (fresh.size() < fresh_pages) {
      const phys_handle_t h = pages_.create(page);
      if (h == 0) {
        release_fresh();
        return false;
      }
      fresh.push_back(h);
    }
    // Kernels queued on the stream may still use the pages' old addresses.
    pages_.synchronize(dest->stream);
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
  // `dest`'s pages (unmapped in the bookkeeping) until they can be unmapped.
  if (!map_side_by_side(*dest, first, moved, fresh)) {
    dissolve_emptied(sources);
    return false;  // out of memory while mapping: every page back where it was
  }
  ++stats_.num_page_reuses;
  dissolve_emptied(sources);
  return true;
}

Stitcher::Supply Stitcher::supply(stream_t stream, std::size_t pages, bool own_only,
                                  std::uint16_t tag) {
  Supply sup;
  const std::size_t page = pages_.granularity();
  // 1. Candidates: whole pages inside free blocks of one-granule-page ranges, by stream.
  free_page_runs(stream, sup.own, own_only ? nullptr : &sup.others, true, tag);
  for (const Run& r : sup.own) sup.own_total += r.count;
  for (const auto& [s, runs] : sup.others)
    for (const Run& r : runs) {
      sup.other_pages[s] += r.count;
      sup.other_total += r.count;
    }
  // 2. Fresh pages the device (and the memory fraction) may still give.
  sup.fresh_limit = own_only ? 0 : pages_.device_free() / page;
  sup.fresh_limit = std::min(sup.fresh_limit, ledger_.room() / page);

  // 3. Too few: the free parts of partly used coarse pages are mapped here a second time
  // (borrowed; they cannot move, a live block shares their page). The requesting stream's
  // first, most granules first.
  const std::size_t found = sup.found();
  if (found < pages) {
    std::vector<Lendable> runs = lendable_runs(stream, own_only, tag);
    std::stable_sort(runs.begin(), runs.end(), [&](const Lendable& a, const Lendable& b) {
      const bool a_own = a.segment->stream == stream, b_own = b.segment->stream == stream;
      return a_own != b_own ? a_own : a.count > b.count;
    });
    for (Lendable r : runs) {
      if (found + sup.borrowed >= pages) break;
      r.count = std::min(r.count, pages - found - sup.borrowed);
      sup.borrow.push_back(r);
      sup.borrowed += r.count;
    }
  }
  return sup;
}

std::size_t Stitcher::pages_within_reach(stream_t stream, std::size_t rounded) {
  const std::size_t page = pages_.granularity();
  const Supply sup = supply(stream, round_up(rounded, page) / page, false, 0);
  return sup.found() + sup.borrowed;
}

Block* Stitcher::stitch(BlockPool& pool, stream_t stream, std::size_t rounded, bool own_only) {
  const std::size_t page = pages_.granularity();
  const std::size_t pages = round_up(rounded, page) / page;
  Supply sup = supply(stream, pages, own_only, pool.tag);
  std::vector<Run>& own = sup.own;
  std::map<stream_t, std::vector<Run>>& others = sup.others;
  const std::map<stream_t, std::size_t>& other_pages = sup.other_pages;
  const std::size_t own_total = sup.own_total, other_total = sup.other_total;
  const std::size_t fresh_limit = sup.fresh_limit;
  const std::vector<Lendable>& borrow = sup.borrow;
  const std::size_t borrowed = sup.borrowed;
  const std::size_t found = sup.found();
  if (own_total + other_total + borrowed == 0) return nullptr;  // only fresh pages: growing failed already
  if (own_only && own_total + borrowed < pages) return nullptr;
  if (found + borrowed < pages) return nullptr;

  // 4. The plan for the rest: own pages first, then fresh ones, then other streams', fewest
  // streams first.
  const std::size_t target = pages - borrowed;  // slots moved or fresh; the borrowed ones follow
  std::vector<Run> plan;
  std::size_t planned = take(own, target, plan);
  const bool sync_own = planned > 0;
  // The host memory of every step after the device's first change, taken first (std::bad_alloc
  // here: nothing changed): the new segment, and the lenders' blocks and borrows below.
  std::unique_ptr<Segment> space = store_.prepare_segment(stream);
  for (const Lendable& b : borrow) BlockStore::reserve(b.segment, 2);
  Segment table;  // the new range's page table, filled below and moved into its segment
  table.borrows.reserve(borrow.size() + planned);
  char* va = pages_.reserve(pages * page, page);  // throws: nothing changed
  if (va == nullptr) return nullptr;
  char* const tail = va + target * page;  // where the borrowed slots go
  std::size_t aliased = 0;                                    // borrowed slots mapped so far
  std::vector<phys_handle_t> fresh;
  auto unmap_aliases = [&] {
    if (aliased > 0) pages_.unmap_or_stray(tail, aliased * page);
    aliased = 0;
  };
  auto give_up = [&] {  // nothing of the plan has moved
    unmap_aliases();
    for (phys_handle_t h : fresh) pages_.release_or_orphan(h);
    release_or_keep(pool, stream, va, pages * page, page, space);
  };
  table.base = va;
  table.page = page;
  table.pages.reset(pages);
  try {
    table.pages.make_room(pages);
    const std::size_t want_fresh = std::min(target - planned, fresh_limit);
    fresh.reserve(want_fresh);  // (a handle made is always kept: no push_back can fail)
    while (fresh.size() < want_fresh) {
      const phys_handle_t h = pages_.create(page);
      if (h == 0) break;  // the device gave less than it reported: other streams make it up
      fresh.push_back(h);
    }
    std::vector<stream_t> to_sync;
    if (sync_own) to_sync.push_back(stream);
    if (planned + fresh.size() < target) {
      std::vector<std::pair<std::size_t, stream_t>> by_pages;
      for (const auto& [s, n] : other_pages) by_pages.emplace_back(n, s);
      std::stable_sort(by_pages.begin(), by_pages.end(),
                       [](const auto& a, const auto& b) { return a.first > b.first; });
      std::vector<Run> chosen;
      std::size_t have = 0;
      for (const auto& [n, s] : by_pages) {
        if (planned + fresh.size() + have >= target) break;
        chosen.insert(chosen.end(), others[s].begin(), others[s].end());
        have += n;
        to_sync.push_back(s);
      }
      planned += take(std::move(chosen), target - planned - fresh.size(), plan);
      if (planned + fresh.size() < target) {
        give_up();
        return nullptr;
      }
    }
    // Borrowed memory of another stream may still be in use by kernels queued there before it
    // was freed (the requesting stream's own is stream-ordered: nothing is unmapped).
    for (const Lendable& b : borrow)
      if (b.segment->stream != stream &&
          std::find(to_sync.begin(), to_sync.end(), b.segment->stream) == to_sync.end())
        to_sync.push_back(b.segment->stream);
    // Kernels queued on these streams may still use the pages' old addresses.
    for (stream_t s : to_sync) pages_.synchronize(s);
    // The borrowed memory, mapped a second time at the end of the new range (one map a run:
    // a run lies in one page); its first mapping stays.
    if (!borrow.empty()) {
      std::vector<MapPiece> pieces;
      for (const Lendable& b : borrow) {
        const PageTable& t = b.segment->pages;
        STITCH_ASSERT(t.piece(b.first) == 0, "borrow: a run from its handle's start");
        pieces.push_back(MapPiece{t.handle(b.first), b.count * page});
      }
      if (!pages_.map_pieces(tail, pieces)) {  // (stray ranges there are unmapped first)
        give_up();  // out of memory while mapping: nothing mapped
        return nullptr;
      }
      for (const Lendable& b : borrow) {
        const PageTable& t = b.segment->pages;
        table.pages.set(target + aliased, b.count, t.handle(b.first), t.piece(b.first));
        aliased += b.count;
      }
    }
  } catch (...) {
    give_up();
    throw;
  }

  // 5. Move: unmap each run where it is (the handles stay alive), bookkeeping as we go.
  std::vector<MovedPage> moved;
  moved.reserve(planned);
  std::vector<Segment*> sources;
  try {
    move_out(plan, moved, sources);
  } catch (...) {
    give_up();
    throw;
  }

  // 6. Map the moved pages, then the fresh ones, side by side into the new range.
  bool mapped = false;
  try {
    mapped = map_side_by_side(table, 0, moved, fresh);
  } catch (...) {  // the pages are back where they were, the fresh ones released
    // With stray mappings left (a second failure), release_or_keep keeps the range as an empty
    // stitched segment, given back once the stray unmap succeeds.
    unmap_aliases();
    release_or_keep(pool, stream, va, pages * page, page, space);
    throw;
  }
  if (!mapped) {  // out of memory while mapping: as above, then no stitch
    unmap_aliases();
    release_or_keep(pool, stream, va, pages * page, page, space);
    dissolve_emptied(sources);
    return nullptr;
  }

  // 7. The stitched segment: one free block over the whole range. The borrowed memory becomes
  // lent blocks where it lies (bookkeeping only, whose memory was taken before step 4).
  Segment* segment = store_.add_range(std::move(space), pool, stream, va, pages * page, page, true,
                                      BlockState::free);
  Block* block = segment->head;
  segment->pages = std::move(table.pages);
  segment->borrows = std::move(table.borrows);  // borrowed memory moved here from elsewhere
  std::size_t slot = target;
  for (const Lendable& b : borrow) {
    Segment* s = b.segment;
    char* at = s->base + b.first * page;
    Block* free_block = s->block_at(at);
    STITCH_ASSERT(free_block != nullptr && free_block->is_free(),
                  "stitch: borrowed memory lies in a free block");
    const auto base = static_cast<std::size_t>(at - s->base);
    Block* lent = store_.take_pages(free_block, base, base + b.count * page, BlockState::lent);
    segment->borrows.push_back(Borrow{lent, slot, b.count});
    slot += b.count;
    ledger_.lent(*lent, pool.small);
  }
  ledger_.mapped(*segment, va, segment->size, segment->size - borrowed * page);
  ++stats_.num_stitches;
  stats_.stitched_bytes += static_cast<std::int64_t>(segment->size);
  stats_.num_page_borrows += static_cast<std::int64_t>(borrow.size());

  // Stitched ranges emptied by this move are dissolved: their reservations go back.
  dissolve_emptied(sources);
  block->gc_stamp = pool.clock->load(std::memory_order_relaxed);  // (as filing it stamps it)
  return block;
}

}  // namespace stitch::detail
