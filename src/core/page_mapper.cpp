// core/page_mapper.cpp — PageMapper: mapping pages all or nothing, and the retries of what an
// undo left behind.
#include "core/page_mapper.hpp"

#include "core/assert.hpp"
#include "core/undo.hpp"

#include <algorithm>

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
}

}  // namespace stitch::detail
