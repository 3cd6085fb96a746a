// core/page_mapper.cpp — PageMapper: mapping pages all or nothing, the remap under live
// addresses, and the retries of what an undo left behind (displaced old pages included).
#include "core/page_mapper.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/assert.hpp"
#include "core/undo.hpp"
#include "stitch/errors.hpp"

namespace stitch::detail {

namespace {
std::string hex(const void* p) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", p);
  return text;
}
}  // namespace

PageMapper::~PageMapper() {
  for (const Stray& st : strays_) {
    try {
      backend_.unmap(device_, st.va, st.bytes);
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

bool PageMapper::stream_idle(stream_t stream) noexcept {
  event_t event = nullptr;
  bool idle = false;
  try {
    event = backend_.create_event(device_);
    backend_.record_event(device_, event, stream);
    idle = backend_.query_event(device_, event);
  } catch (...) {
    idle = false;
  }
  if (event != nullptr) {
    try {
      backend_.destroy_event(device_, event);
    } catch (...) {  // (an event lost to the process: nothing else depends on it)
    }
  }
  return idle;
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

std::size_t PageMapper::host_granularity() { return backend_.host_granularity(device_); }

phys_handle_t PageMapper::create_host(std::size_t bytes) {
  return backend_.create_host_physical(device_, bytes);
}

void PageMapper::unmap(char* at, std::size_t bytes) {
  if (!place_displaced(at, bytes))
    throw backend_error("unmapping " + std::to_string(bytes) + " bytes at " + hex(at) + ": pages a failed remap " +
                        "left unmapped there could not be mapped back yet (kept, retried)");
  backend_.unmap(device_, at, bytes);
}

bool PageMapper::place_displaced(char* at, std::size_t bytes) noexcept {
  bool placed = true;
  for (auto it = displaced_.begin(); it != displaced_.end();) {
    if (map_back(it->va, it->bytes, it->handle)) {
      it = displaced_.erase(it);
      continue;
    }
    if (it->va < at + bytes && at < it->va + it->bytes) placed = false;
    ++it;
  }
  return placed;
}

bool PageMapper::map(Segment& segment, std::size_t first, std::size_t count, std::size_t per) {
  STITCH_ASSERT(first + count <= segment.pages.slots() && per > 0,
                "PageMapper::map: slots inside the range");
  segment.pages.make_room(first + count);
  char* const at = segment.base + first * segment.page;
  place_displaced(nullptr, 0);
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
  place_displaced(nullptr, 0);
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
      orphans_.push_back(handle);  // retried by retry()
    } catch (...) {
    }
  }
}

void PageMapper::unmap_or_stray(char* va, std::size_t bytes, int booked) noexcept {
  try {
    backend_.unmap(device_, va, bytes);
    if (booked >= 0) unmapped_stray(Stray{va, bytes, booked});
  } catch (...) {  // the caller's first error is what it reports; this one is retried later
    try {
      strays_.push_back(Stray{va, bytes, booked});
    } catch (...) {  // no memory to remember it: the range stays mapped until the device goes
    }
  }
}

void PageMapper::unmapped_stray(const Stray& s) noexcept {
  if (s.booked >= 0 && unbooked_) unbooked_(s.booked == 1, s.va, s.bytes);
}

std::size_t PageMapper::booked_strays(bool small) const noexcept {
  std::size_t n = 0;
  for (const Stray& s : strays_)
    if (s.booked == (small ? 1 : 0)) n += s.bytes;
  return n;
}

void PageMapper::unmap_strays_in(char* va, std::size_t bytes) {
  for (auto it = strays_.begin(); it != strays_.end();) {
    const Stray st = *it;
    const bool overlaps = st.va < va + bytes && va < st.va + st.bytes;
    try {
      backend_.unmap(device_, st.va, st.bytes);
    } catch (...) {
      if (overlaps) throw;  // still stray, retried next time
      ++it;
      continue;
    }
    it = strays_.erase(it);
    unmapped_stray(st);
  }
}

void PageMapper::retry() noexcept {
  place_displaced(nullptr, 0);
  for (auto it = strays_.begin(); it != strays_.end();) {
    try {
      backend_.unmap(device_, it->va, it->bytes);
      const Stray st = *it;
      it = strays_.erase(it);
      unmapped_stray(st);
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
      if (stray_within(it->first, it->second)) throw backend_error("a stray mapping lies inside");
      backend_.release_reservation(device_, it->first, it->second);
      it = lost_reservations_.erase(it);
    } catch (...) {
      ++it;
    }
  }
}

bool PageMapper::stray_within(const char* va, std::size_t bytes) const noexcept {
  for (const Stray& st : strays_)
    if (st.va < va + bytes && va < st.va + st.bytes) return true;
  return false;
}

void PageMapper::release_or_keep_reservation(char* va, std::size_t bytes) noexcept {
  try {
    // A range still mapped inside (a stray: its unmap failed) cannot be released yet.
    if (stray_within(va, bytes)) throw backend_error("a stray mapping lies inside");
    release_reservation(va, bytes);
  } catch (...) {  // kept: it blocks only its own addresses, and retry() releases it later
    try {
      lost_reservations_.emplace_back(va, bytes);
    } catch (...) {  // no memory for the note: the reservation goes with the process
    }
  }
}

bool PageMapper::remap(const Mapping& m, const std::vector<SlotRun>& keep, bool stage,
                       const phys_handle_t* given) {
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
  STITCH_ASSERT(!stage || given == nullptr, "PageMapper::remap: given pages are not staged");
  // Displaced pages go back first; this mapping's own must be back before its data is read.
  if (!place_displaced(s.base + m.first * page, m.count * page))
    throw backend_error("remapping " + std::to_string(m.count * page) + " bytes at " + hex(s.base + m.first * page) +
                        ": their old page, left unmapped by a remap that failed, cannot be mapped back yet (kept, "
                        "retried); nothing changed");
  if (stage) return remap_through_host(m, keep, kept, old);
  displaced_.reserve(displaced_.size() + 1);  // (throws std::bad_alloc: nothing changed)
  // 1-3: fresh pages, mapped at a scratch range, with the kept data copied there. Every step is
  // undone on a failure (the undos run in reverse order of their declaration).
  std::vector<MapPiece> fresh;
  fresh.reserve(kept);
  Undo release_fresh([&] {
    if (given == nullptr)  // (given pages stay the caller's until the remap succeeds)
      for (const MapPiece& p : fresh) release_or_orphan(p.handle);
  });
  for (std::size_t i = 0; i < kept; ++i) {
    const phys_handle_t h = given != nullptr ? given[i] : create(page);
    if (h == 0) return false;
    fresh.push_back(MapPiece{h, page});
  }
  char* scratch = kept == 0 ? nullptr : reserve(kept * page, granularity());
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
  const phys_handle_t original = s.pages.handle(m.first);
  const std::size_t original_piece = s.pages.piece(m.first);
  unmap(s.base + m.first * page, m.count * page);
  s.pages.set(m.first, m.count, 0);
  // 5: the fresh pages over the kept runs. Until then the data is in the old handle (unmapped,
  // not released) and in the fresh pages at the scratch range: on a failure the old handle is
  // mapped back, the undos release the rest, and the error is reported with nothing changed.
  if (std::string error = map_over(s, keep, fresh); !error.empty()) {
    char* const at = s.base + m.first * page;
    s.pages.set(m.first, m.count, original, original_piece);
    if (!map_back(at, m.count * page, original) && !map_back(at, m.count * page, original)) {  // (tried twice)
      // The old page still holds the data (it is never released before the fresh ones hold it):
      // it stays the page table's, and goes back to its address at the page mapper's next call.
      displaced_.push_back(Displaced{at, m.count * page, original});  // (room reserved above)
      throw backend_error("remapping " + std::to_string(m.count * page) + " bytes under live blocks at " +
                          hex(at) + " failed (" + error + "), and mapping their old page back failed too; the "
                          "old page keeps the data and is mapped back at its address at the next page "
                          "operation (until then the address is not mapped)");
    }
    throw backend_error("remapping " + std::to_string(m.count * page) + " bytes under live blocks failed (" +
                        error + "); their old page was mapped back, nothing changed");
  }
  release_fresh.done();
  // 6-7: the scratch range and the old handle go (undos that cannot fail the remap).
  unmap_scratch.done();
  if (kept != 0) unmap_or_stray(scratch, kept * page);
  if (old != 0) release_or_orphan(old);
  return true;  // release_scratch runs: the scratch reservation goes back
}

std::string PageMapper::map_over(Segment& s, const std::vector<SlotRun>& keep,
                                 const std::vector<MapPiece>& fresh) noexcept {
  const std::size_t page = s.page;
  std::size_t next = 0, done = 0;
  std::string error;
  // The message without allocating when host memory is out (a short text fits the string).
  auto note = [&error](const char* what) noexcept {
    try {
      if (error.empty()) {
        error = what;
      } else {
        error += "; taking back a mapped run failed too: ";
        error += what;
      }
    } catch (...) {
      if (error.empty()) error = "map failed";
    }
  };
  for (const SlotRun& r : keep) {
    char* at = s.base + r.first * page;
    try {
      if (!backend_.map_run(device_, at, fresh.data() + next, r.count)) note("out of memory");
    } catch (const std::exception& e) {
      note(e.what());
    } catch (...) {
      note("an unknown error");
    }
    if (!error.empty()) break;
    for (std::size_t k = 0; k < r.count; ++k) s.pages.set(r.first + k, 1, fresh[next + k].handle);
    next += r.count;
    ++done;
  }
  if (error.empty()) return error;
  // Take back the runs mapped: the range is as step 4 left it (a run that cannot be unmapped
  // keeps its fresh pages mapped: the caller finds the range not wholly free and aborts).
  for (std::size_t j = 0; j < done; ++j) {
    const SlotRun& r = keep[j];
    try {
      backend_.unmap(device_, s.base + r.first * page, r.count * page);
      s.pages.set(r.first, r.count, 0);
    } catch (const std::exception& e) {
      note(e.what());
    } catch (...) {
      note("an unknown error");
    }
  }
  return error;
}

bool PageMapper::remap_through_host(const Mapping& m, const std::vector<SlotRun>& keep,
                                    std::size_t kept, phys_handle_t old) {
  // The device has no room for the fresh pages before the old one goes: the kept data waits in
  // host memory. 1. copied out; 2. the whole mapping unmapped (an error here changes nothing);
  // 3. its handle released; 4. fresh pages created and mapped over the kept runs; 5. the data
  // copied back. From 3 on the host copy is the data's only one: when the fresh pages cannot be
  // made or mapped, the mapping is rebuilt whole from one page of the old size (the device just
  // got that much back) and the data copied into it, so nothing changes but the handle; only
  // when the device refuses that too does the process stop, saying where the data was.
  Segment& s = *m.segment;
  const std::size_t page = s.page;
  std::vector<char> host(kept * page);  // throws std::bad_alloc: nothing changed
  std::size_t offset = 0;
  for (const SlotRun& r : keep) {
    backend_.copy_to_host(device_, host.data() + offset, s.base + r.first * page, r.count * page);
    offset += r.count * page;
  }
  std::vector<MapPiece> fresh;
  fresh.reserve(kept);  // throws std::bad_alloc: nothing changed
  const phys_handle_t original = s.pages.handle(m.first);
  const std::size_t original_piece = s.pages.piece(m.first);
  unmap(s.base + m.first * page, m.count * page);  // throws: nothing changed
  s.pages.set(m.first, m.count, 0);
  if (old != 0) release_or_orphan(old);
  std::string error;
  bool out_of_memory = false;
  for (std::size_t i = 0; i < kept; ++i) {
    phys_handle_t h = 0;
    try {
      h = create(page);
    } catch (const std::exception& e) {
      error = e.what();
      break;
    }
    if (h == 0) {
      error = "out of device memory";
      out_of_memory = true;
      break;
    }
    fresh.push_back(MapPiece{h, page});
  }
  if (error.empty()) error = map_over(s, keep, fresh);  // takes back what it mapped on a failure
  const bool rebuilt = !error.empty();
  if (rebuilt) {
    for (const MapPiece& p : fresh) release_or_orphan(p.handle);
    // Borrowed memory is its lender's, still alive: map it back. Else one page of the old size.
    phys_handle_t whole = old == 0 ? original : 0;
    if (whole == 0) {
      try {
        whole = create(m.count * page);
      } catch (...) {
      }
    }
    if (whole == 0 || !map_back(s.base + m.first * page, m.count * page, whole)) {
      std::fprintf(stderr,
                   "stitch: fatal: remapping %zu bytes at %p through host memory: the fresh pages "
                   "failed (%s) and the device gave no page of the old size either; the data's only "
                   "copy is in host memory, with no device memory to put it back\n",
                   m.count * page, static_cast<void*>(s.base + m.first * page), error.c_str());
      std::abort();
    }
    s.pages.set(m.first, m.count, whole, old == 0 ? original_piece : 0);
  }
  offset = 0;
  for (const SlotRun& r : keep) {
    char* at = s.base + r.first * page;
    bool copied = false;
    for (int attempt = 0; attempt < 2 && !copied; ++attempt) {  // the host copy still exists
      try {
        backend_.copy_from_host(device_, at, host.data() + offset, r.count * page);
        copied = true;
      } catch (...) {
      }
    }
    if (!copied) {
      std::fprintf(stderr,
                   "stitch: fatal: copying %zu bytes back to %p failed twice while remapping through "
                   "host memory; the data's only copy is in host memory\n",
                   r.count * page, static_cast<void*>(at));
      std::abort();
    }
    offset += r.count * page;
  }
  if (!rebuilt) return true;
  if (out_of_memory) return false;  // as if there had been no room: the layout is unchanged
  throw backend_error("remapping " + std::to_string(m.count * page) + " bytes through host memory failed (" +
                      error + "); the mapping was rebuilt whole with the data, nothing changed but its page");
}

}  // namespace stitch::detail
