// core/page_mapper.cpp — PageMapper: mapping pages all or nothing, the remap under live
// addresses, and the retries of what an undo left behind.
#include "core/page_mapper.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "core/assert.hpp"
#include "core/undo.hpp"

namespace stitch::detail {

PageMapper::~PageMapper() {
  for (const auto& [va, bytes] : strays_) {
    try {
      backend_.unmap(device_, va, bytes);
    } catch (...) {
    }
  }
  for (phys_handle_t h : orphans_) {
    try {
      backend_.release_physical(device_, h);
    } catch (...) {
    }
  }
}

bool PageMapper::supported() { return backend_.supports_virtual_memory(device_); }

std::size_t PageMapper::granularity() { return backend_.granularity(device_); }

std::size_t PageMapper::device_total() { return backend_.total_memory(device_); }

std::size_t PageMapper::device_free() { return backend_.memory_info(device_).free; }

void PageMapper::synchronize(stream_t stream) { backend_.synchronize_stream(device_, stream); }

void PageMapper::synchronize_device(bool peers) {
  if (!peers) {
    backend_.synchronize_device(device_);
    return;
  }
  const int n = backend_.device_count();
  for (int d = 0; d < n; ++d) backend_.synchronize_device(d);
}

char* PageMapper::reserve(std::size_t bytes, std::size_t alignment) {
  return static_cast<char*>(backend_.reserve(device_, bytes, alignment));
}

void PageMapper::release_reservation(char* va, std::size_t bytes) {
  backend_.release_reservation(device_, va, bytes);
}

phys_handle_t PageMapper::create(std::size_t bytes) {
  return backend_.create_physical(device_, bytes);
}

void PageMapper::unmap(char* at, std::size_t bytes) { backend_.unmap(device_, at, bytes); }

bool PageMapper::map(Segment& segment, std::size_t first, std::size_t count, std::size_t per) {
  STITCH_ASSERT(first + count <= segment.pages.slots() && per > 0,
                "PageMapper::map: slots inside the range");
  segment.pages.make_room(first + count);
  char* const at = segment.base + first * segment.page;
  unmap_strays_in(at, count * segment.page);  // a stray range may lie where these pages go
  const std::size_t whole = count / per * per;  // slots in handles of `per` slots
  // Every handle first, then one run: a map per handle and one access grant over them all.
  std::vector<MapPiece> pieces;
  pieces.reserve(whole / per + (count - whole));
  Undo release([&] {
    for (const MapPiece& p : pieces) release_or_orphan(p.handle);
  });
  for (std::size_t done = 0; done < count;) {
    const std::size_t slots = done < whole ? per : 1;
    const std::size_t bytes = slots * segment.page;
    const phys_handle_t handle = backend_.create_physical(device_, bytes);
    if (handle == 0) return false;  // out of memory: the undo releases what was created
    pieces.push_back(MapPiece{handle, bytes});
    done += slots;
  }
  if (!pieces.empty() && !backend_.map_run(device_, at, pieces.data(), pieces.size())) return false;
  release.done();
  std::size_t i = first;
  for (const MapPiece& p : pieces) {
    const std::size_t slots = p.bytes / segment.page;
    segment.pages.set(i, slots, p.handle);
    i += slots;
  }
  return true;
}

bool PageMapper::map_pieces(char* at, const std::vector<MapPiece>& pieces) {
  std::size_t bytes = 0;
  for (const MapPiece& p : pieces) bytes += p.bytes;
  unmap_strays_in(at, bytes);  // a stray range may lie where these pages go
  // One run: a map per piece, one access grant over them all (all or nothing).
  return pieces.empty() || backend_.map_run(device_, at, pieces.data(), pieces.size());
}

bool PageMapper::map_back(char* at, std::size_t bytes, phys_handle_t handle) noexcept {
  try {
    return backend_.map(device_, at, bytes, handle);
  } catch (...) {
    return false;
  }
}

std::exception_ptr PageMapper::release(Segment& segment, std::size_t first, std::size_t last) noexcept {
  std::exception_ptr error;
  for (std::size_t i = first; i < last;) {
    const std::size_t slots = std::max<std::size_t>(segment.pages.extent(i), 1);
    if (segment.pages.handle(i) == 0) {  // not this range's (borrowed memory, cleared)
      ++i;
      continue;
    }
    try {
      backend_.release_physical(device_, segment.pages.handle(i));
    } catch (...) {  // unmapped already: keep the handle and retry on the next release
      try {
        orphans_.push_back(segment.pages.handle(i));
      } catch (...) {
      }
      if (!error) error = std::current_exception();
    }
    segment.pages.set(i, slots, 0);
    i += slots;
  }
  return error;
}

void PageMapper::release_or_orphan(phys_handle_t handle) noexcept {
  try {
    backend_.release_physical(device_, handle);
  } catch (...) {
    try {
      orphans_.push_back(handle);  // retried by release_orphans
    } catch (...) {
    }
  }
}

void PageMapper::unmap_or_stray(char* va, std::size_t bytes) noexcept {
  try {
    backend_.unmap(device_, va, bytes);
  } catch (...) {  // the caller's first error is what it reports; this one is retried later
    try {
      strays_.emplace_back(va, bytes);
    } catch (...) {  // no memory to remember it: the range stays mapped until the device goes
    }
  }
}

void PageMapper::unmap_strays_in(char* va, std::size_t bytes) {
  for (auto it = strays_.begin(); it != strays_.end();) {
    const auto [at, size] = *it;
    const bool overlaps = at < va + bytes && va < at + size;
    try {
      backend_.unmap(device_, at, size);
    } catch (...) {
      if (overlaps) throw;  // still stray, retried next time
      ++it;
      continue;
    }
    it = strays_.erase(it);
  }
}

void PageMapper::retry() noexcept {
  for (auto it = strays_.begin(); it != strays_.end();) {
    try {
      backend_.unmap(device_, it->first, it->second);
      it = strays_.erase(it);
    } catch (...) {
      ++it;
    }
  }
  for (auto it = orphans_.begin(); it != orphans_.end();) {
    try {
      backend_.release_physical(device_, *it);
      it = orphans_.erase(it);
    } catch (...) {
      ++it;
    }
  }
  for (auto it = lost_reservations_.begin(); it != lost_reservations_.end();) {
    try {
      backend_.release_reservation(device_, it->first, it->second);
      it = lost_reservations_.erase(it);
    } catch (...) {
      ++it;
    }
  }
}

void PageMapper::release_or_keep_reservation(char* va, std::size_t bytes) noexcept {
  try {
    release_reservation(va, bytes);
  } catch (...) {  // kept: it blocks only its own addresses, and retry() releases it later
    try {
      lost_reservations_.emplace_back(va, bytes);
    } catch (...) {  // no memory for the note: the reservation goes with the process
    }
  }
}

bool PageMapper::remap(const Mapping& m, const std::vector<SlotRun>& keep, bool stage) {
  Segment& s = *m.segment;
  const std::size_t page = s.page;
  STITCH_ASSERT(m.count > 0 && s.pages.extent(m.first) == m.count,
                "PageMapper::remap: a whole mapping");
  std::size_t kept = 0;
  for (const SlotRun& r : keep) {
    STITCH_ASSERT(r.count > 0 && r.first >= m.first && r.first + r.count <= m.first + m.count,
                  "PageMapper::remap: kept runs inside the mapping");
    kept += r.count;
  }
  // Borrowed memory (mapped here a second time) is its lender's: its handle stays.
  const phys_handle_t old = s.borrowed_at(m.first) ? 0 : s.pages.handle(m.first);
  if (stage) return remap_through_host(m, keep, kept, old);
  // 1-3: fresh pages, mapped at a scratch range, with the kept data copied there. Every step is
  // undone on a failure (the undos run in reverse order of their declaration).
  std::vector<MapPiece> fresh;
  fresh.reserve(kept);
  Undo release_fresh([&] {
    for (const MapPiece& p : fresh) release_or_orphan(p.handle);
  });
  for (std::size_t i = 0; i < kept; ++i) {
    const phys_handle_t h = create(page);
    if (h == 0) return false;
    fresh.push_back(MapPiece{h, page});
  }
  char* scratch = kept == 0 ? nullptr : reserve(kept * page, page);
  if (kept != 0 && scratch == nullptr) return false;  // no address space left
  Undo release_scratch([&] {
    if (scratch == nullptr) return;
    release_or_keep_reservation(scratch, kept * page);
  });
  if (!map_pieces(scratch, fresh)) return false;
  Undo unmap_scratch([&] {
    if (kept != 0) unmap_or_stray(scratch, kept * page);
  });
  std::size_t offset = 0;
  for (const SlotRun& r : keep) {
    backend_.copy(device_, scratch + offset, s.base + r.first * page, r.count * page, nullptr);
    offset += r.count * page;
  }
  if (kept != 0) backend_.synchronize_stream(device_, nullptr);
  // 4: the whole mapping goes (throws: nothing changed, the undos run).
  unmap(s.base + m.first * page, m.count * page);
  release_fresh.done();
  s.pages.set(m.first, m.count, 0);
  // 5: the fresh pages over the kept runs. The data has no address until this succeeds.
  map_over(s, keep, fresh);
  // 6-7: the scratch range and the old handle go (undos that cannot fail the remap).
  unmap_scratch.done();
  if (kept != 0) unmap_or_stray(scratch, kept * page);
  if (old != 0) release_or_orphan(old);
  return true;  // release_scratch runs: the scratch reservation goes back
}

void PageMapper::map_over(Segment& s, const std::vector<SlotRun>& keep,
                          const std::vector<MapPiece>& fresh) noexcept {
  const std::size_t page = s.page;
  std::size_t next = 0;
  for (const SlotRun& r : keep) {
    char* at = s.base + r.first * page;
    bool mapped = false;
    try {
      mapped = backend_.map_run(device_, at, fresh.data() + next, r.count);
    } catch (...) {
    }
    if (!mapped) {
      std::fprintf(stderr,
                   "stitch: fatal: remapping %zu bytes at %p under live blocks failed after their "
                   "old pages were unmapped; their data cannot be reached\n",
                   r.count * page, static_cast<void*>(at));
      std::abort();
    }
    for (std::size_t k = 0; k < r.count; ++k) s.pages.set(r.first + k, 1, fresh[next + k].handle);
    next += r.count;
  }
}

bool PageMapper::remap_through_host(const Mapping& m, const std::vector<SlotRun>& keep,
                                    std::size_t kept, phys_handle_t old) {
  // The device has no room for the fresh pages before the old one goes: the kept data waits in
  // host memory. 1. copied out; 2. the whole mapping unmapped (an error here changes nothing);
  // 3. its handle released; 4. fresh pages created and mapped over the kept runs; 5. the data
  // copied back. From 3 on there is no way back: a failure aborts with a message.
  Segment& s = *m.segment;
  const std::size_t page = s.page;
  std::vector<char> host(kept * page);  // throws std::bad_alloc: nothing changed
  std::size_t offset = 0;
  for (const SlotRun& r : keep) {
    backend_.copy_to_host(device_, host.data() + offset, s.base + r.first * page, r.count * page);
    offset += r.count * page;
  }
  std::vector<MapPiece> fresh;
  fresh.reserve(kept);
  unmap(s.base + m.first * page, m.count * page);  // throws: nothing changed
  s.pages.set(m.first, m.count, 0);
  if (old != 0) release_or_orphan(old);
  auto fatal = [&](const char* what) {
    std::fprintf(stderr,
                 "stitch: fatal: %s while remapping %zu bytes at %p through host memory, after "
                 "their old pages were released; their data cannot be put back\n",
                 what, m.count * page, static_cast<void*>(s.base + m.first * page));
    std::abort();
  };
  for (std::size_t i = 0; i < kept; ++i) {
    phys_handle_t h = 0;
    try {
      h = create(page);
    } catch (...) {
    }
    if (h == 0) fatal("creating a fresh page failed");
    fresh.push_back(MapPiece{h, page});
  }
  map_over(s, keep, fresh);
  offset = 0;
  for (const SlotRun& r : keep) {
    try {
      backend_.copy_from_host(device_, s.base + r.first * page, host.data() + offset, r.count * page);
    } catch (...) {
      fatal("copying the data back failed");
    }
    offset += r.count * page;
  }
  return true;
}

}  // namespace stitch::detail
