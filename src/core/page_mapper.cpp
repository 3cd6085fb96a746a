// core/page_mapper.cpp — PageMapper: mapping pages all or nothing, splitting coarse pages and
// keeping their loose pieces, and the retries of what an undo left behind.
#include "core/page_mapper.hpp"

#include <fmt/format.h>

#include "core/assert.hpp"
#include "core/undo.hpp"
#include "stitch/errors.hpp"

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
      give_back(Piece{segment.pages.handle(i), segment.pages.piece(i)}, segment.page);
      segment.pages.set(i, slots, 0);
      i += slots;
    }
  });
  while (done < count) {
    const std::size_t i = first + done;
    const std::size_t slots = done < whole ? per : 1;
    const std::size_t bytes = slots * segment.page;
    const Piece page = slots == 1 ? fresh_page(bytes)
                                  : Piece{backend_.create_physical(device_, bytes), 0};
    if (page.handle == 0) return false;  // out of memory: the undo runs
    Undo release([&] { give_back(page, segment.page); });
    backend_.map(device_, segment.base + i * segment.page, bytes, page.handle,
                 page.piece * segment.page);
    release.done();
    segment.pages.set(i, slots, page.handle, page.piece);
    done += slots;
  }
  undo.done();
  return true;
}

std::exception_ptr PageMapper::release(Segment& segment, std::size_t first, std::size_t last) noexcept {
  std::exception_ptr error;
  for (std::size_t i = first; i < last;) {
    const std::size_t slots = std::max<std::size_t>(segment.pages.extent(i), 1);
    const phys_handle_t handle = segment.pages.handle(i);
    if (is_split(handle)) {
      make_loose(Piece{handle, segment.pages.piece(i)}, segment.page);
      segment.pages.set(i, slots, 0);
      i += slots;
      continue;
    }
    try {
      backend_.release_physical(device_, handle);
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

std::size_t PageMapper::split(Segment& segment, std::size_t head) {
  const std::size_t n = segment.pages.extent(head);
  const phys_handle_t handle = segment.pages.handle(head);
  STITCH_ASSERT(n > 1 && handle != 0 && !is_split(handle) && segment.pages.piece(head) == 0,
                "PageMapper::split: a whole coarse page");
  const std::size_t page = segment.page;
  char* at = segment.base + head * page;
  // Room for the bookkeeping first: from the unmap on only the backend may fail.
  loose_.reserve(split_pieces_ + n);
  split_.try_emplace(handle, SplitPage{n, 0});
  Undo forget([&] { split_.erase(handle); });
  backend_.unmap(device_, at, n * page);  // throws: nothing changed
  std::size_t done = 0;
  try {
    for (; done < n; ++done) backend_.map(device_, at + done * page, page, handle, done * page);
  } catch (const std::exception& e) {
    try {  // whole again, as it was
      for (std::size_t k = 0; k < done; ++k) backend_.unmap(device_, at + k * page, page);
      backend_.map(device_, at, n * page, handle, 0);
    } catch (const std::exception& again) {
      throw backend_error(fmt::format(
          "splitting the page at {} ({} bytes): {}; mapping it whole again failed too: {} (the "
          "blocks on it have lost their memory)",
          static_cast<const void*>(at), n * page, e.what(), again.what()));
    }
    throw;
  }
  forget.done();
  for (std::size_t k = 0; k < n; ++k) segment.pages.set(head + k, 1, handle, k);
  split_pieces_ += n;
  piece_bytes_ = page;
  return n;
}

Piece PageMapper::fresh_page(std::size_t bytes) {
  if (!loose_.empty() && bytes == piece_bytes_) {
    const Piece p = loose_.back();
    loose_.pop_back();
    --split_.at(p.handle).loose;
    ledger_.no_longer_held(bytes);
    return p;
  }
  return Piece{backend_.create_physical(device_, bytes), 0};
}

void PageMapper::give_back(Piece page, std::size_t bytes) noexcept {
  if (is_split(page.handle)) {
    make_loose(page, bytes);
  } else {
    release_or_orphan(page.handle);
  }
}

void PageMapper::make_loose(Piece page, std::size_t bytes) noexcept {
  auto it = split_.find(page.handle);
  STITCH_ASSERT(it != split_.end() && it->second.loose < it->second.pieces,
                "PageMapper::make_loose: a mapped piece of a split page");
  loose_.push_back(page);  // within the capacity split() reserved: no allocation
  ledger_.held_unmapped(bytes);
  SplitPage& s = it->second;
  if (++s.loose < s.pieces) return;
  // Its last piece: the handle goes back.
  loose_.erase(std::remove_if(loose_.begin(), loose_.end(),
                              [&](const Piece& p) { return p.handle == page.handle; }),
               loose_.end());
  ledger_.no_longer_held(s.pieces * bytes);
  split_pieces_ -= s.pieces;
  split_.erase(it);
  release_or_orphan(page.handle);
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
