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
  unmap_strays();  // a stray range may lie where these pages go
  const std::size_t whole = count / per * per;  // slots in handles of `per` slots
  std::size_t done = 0;  // slots mapped
  Undo undo([&] {
    for (std::size_t i = first; i < first + done;) {
      const std::size_t slots = segment.pages.extent(i);
      unmap_or_stray(segment.base + i * segment.page, slots * segment.page);
      release_or_orphan(segment.pages.handle(i));
      segment.pages.set(i, slots, 0);
      i += slots;
    }
  });
  while (done < count) {
    const std::size_t i = first + done;
    const std::size_t slots = done < whole ? per : 1;
    const std::size_t bytes = slots * segment.page;
    const phys_handle_t handle = backend_.create_physical(device_, bytes);
    if (handle == 0) return false;  // out of memory: the undo runs
    Undo release([&] { release_or_orphan(handle); });
    backend_.map(device_, segment.base + i * segment.page, bytes, handle);
    release.done();
    segment.pages.set(i, slots, handle);
    done += slots;
  }
  undo.done();
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

void PageMapper::unmap_strays() {
  while (!strays_.empty()) {
    const auto [va, bytes] = strays_.back();
    backend_.unmap(device_, va, bytes);  // throws: still stray, retried next time
    strays_.pop_back();
  }
}

void PageMapper::release_orphans() {
  for (auto it = orphans_.begin(); it != orphans_.end();) {
    backend_.release_physical(device_, *it);  // throws: still orphaned, retried next time
    it = orphans_.erase(it);
  }
}

}  // namespace stitch::detail
