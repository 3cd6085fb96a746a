// core/sleeper.cpp — Sleeper: backups, the release of a tag's pages, and their return at wake.
#include "core/sleeper.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <exception>

#include "stitch/errors.hpp"

namespace stitch::detail {

Sleeper::~Sleeper() {
  for (Slept& s : slept_) free_host(s);
}

bool Sleeper::listed(const std::vector<std::uint16_t>& tags, std::uint16_t tag) noexcept {
  return std::find(tags.begin(), tags.end(), tag) != tags.end();
}

void Sleeper::note_used(std::uint16_t tag) {
  if (tag >= tags_.size()) tags_.resize(std::size_t{tag} + 1);
  tags_[tag].used = true;
  tags_[tag].last = ++tick_;
}

void Sleeper::note_spillable(std::uint16_t tag) {
  if (tag >= tags_.size()) tags_.resize(std::size_t{tag} + 1);
  tags_[tag].spill = true;
}

std::vector<std::uint16_t> Sleeper::used_tags() const {
  std::vector<std::uint16_t> out;
  for (std::size_t t = 1; t < tags_.size(); ++t)
    if (tags_[t].used) out.push_back(static_cast<std::uint16_t>(t));
  return out;
}

std::vector<Sleeper::Slept> Sleeper::plan(const std::vector<std::uint16_t>& tags,
                                          const std::function<bool(const Block*)>& keep) const {
  std::vector<Slept> out;
  for (Segment* s = store_.segments(); s != nullptr; s = s->next) {
    if (s->tag == 0 || s->asleep || !listed(tags, s->tag)) continue;
    Slept r;
    r.segment = s;
    const PageTable& t = s->pages;
    for (std::size_t i = 0; i < t.stored();) {
      if (t.handle(i) == 0 || t.extent(i) == 0) {
        ++i;
        continue;
      }
      r.mappings.push_back(SlotRun{i, t.extent(i)});
      i += t.extent(i);
    }
    for (const Block* b = s->head; b != nullptr; b = b->next) {
      if (b->state == BlockState::allocated && keep(b)) {
        r.saved.push_back(Saved{b, r.host_bytes});
        r.host_bytes += b->size;
      }
    }
    out.push_back(std::move(r));
  }
  return out;
}

void Sleeper::sleep(const std::vector<std::uint16_t>& tags,
                    const std::function<bool(const Block*)>& keep) {
  std::vector<Slept> ranges = plan(tags, keep);
  // Everything that allocates happens before the pages go (give_back allocates nothing): the
  // tags' states and room for the slept ranges. Throws std::bad_alloc with nothing changed.
  for (std::uint16_t tag : tags)
    if (tag >= tags_.size()) tags_.resize(std::size_t{tag} + 1);
  slept_.reserve(slept_.size() + ranges.size());
  back_up(ranges);  // throws with nothing changed
  const std::string failure = give_back(ranges);
  for (std::uint16_t tag : tags) {
    note_used(tag);  // (sized above: allocates nothing)
    tags_[tag].asleep = true;
  }
  ++stats_.num_sleeps;  // (the caller passes only tags awake here)
  if (!failure.empty()) throw backend_error(failure);
}

void Sleeper::copy_chunks(char* device_side, char* host_side, std::size_t bytes, bool to_host) {
  for (std::size_t done = 0; done < bytes; done += kBackupChunk) {
    const std::size_t n = std::min(kBackupChunk, bytes - done);
    if (to_host) {
      backend_.copy_to_host_async(device_, host_side + done, device_side + done, n, nullptr);
    } else {
      backend_.copy_from_host_async(device_, device_side + done, host_side + done, n, nullptr);
    }
  }
}

void Sleeper::free_host(Slept& s) noexcept {
  if (s.host == nullptr) return;
  try {
    backend_.deallocate_host(device_, s.host, s.host_bytes);
  } catch (...) {  // the host memory is lost to the process, not to the device
  }
  s.host = nullptr;
}

void Sleeper::back_up(std::vector<Slept>& plan) {
  try {
    for (Slept& s : plan) {
      if (s.host_bytes == 0) continue;
      s.host = static_cast<char*>(backend_.allocate_host(device_, s.host_bytes));
      if (s.host == nullptr)
        throw out_of_memory(fmt::format(
            "stitch_sleep: device {}: the host cannot give {} bytes of pinned memory for the "
            "backups; nothing was put to sleep",
            device_, s.host_bytes));
    }
    // Queued on the null stream, chunk by chunk, then one wait for them all.
    for (Slept& s : plan)
      for (const Saved& v : s.saved) copy_chunks(v.block->ptr, s.host + v.offset, v.block->size, true);
    backend_.synchronize_stream(device_, nullptr);
  } catch (...) {
    for (Slept& s : plan) free_host(s);
    throw;
  }
}

std::string Sleeper::give_back(std::vector<Slept>& plan) noexcept {
  std::string failure;
  std::size_t kept = 0;
  for (Slept& s : plan) {
    Segment& seg = *s.segment;
    for (const SlotRun& m : s.mappings) {
      char* at = seg.base + m.first * seg.page;
      const std::size_t bytes = m.count * seg.page;
      // A spilled slot's host page leaves spilled_bytes (a stray host page is not reserved).
      const bool host = seg.pages.host(m.first);
      if (host) {
        ledger_.host_unmapped(at, bytes);
        --seg.spilled;
      }
      try {
        pages_.unmap(at, bytes);
        if (!host) ledger_.unmapped(seg, at, bytes);
      } catch (const std::exception& e) {
        // The range is asleep from here on; its pages stay mapped until the page mapper's retry
        // (before the next map there and before memory goes back to the device), and reserved
        // memory counts them until then (booked: the ledger hears of the unmap when it happens).
        pages_.unmap_or_stray(at, bytes, host ? -1 : (seg.small ? 1 : 0));
        note_failure(failure, e.what());
        ++kept;
      }
      if (std::exception_ptr e = pages_.release(seg, m.first, m.first + m.count); e && failure.empty()) {
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& x) {
          note_failure(failure, x.what());
        } catch (...) {
          note_failure(failure, "a page release failed");
        }
        ++kept;
      }
    }
    seg.asleep = true;
    std::int64_t live = 0;
    for (const Block* b = seg.head; b != nullptr; b = b->next)
      if (b->state == BlockState::allocated) live += static_cast<std::int64_t>(b->size);
    stats_.sleeping_bytes.increase(live);
    slept_.push_back(std::move(s));  // room reserved by sleep(): cannot throw
  }
  if (failure.empty()) return failure;
  try {
    return fmt::format(
        "stitch_sleep: device {}: {} page(s) could not be given back ({}); every range of the tags "
        "is asleep, with its backups: the pages are retried before the next map and at empty_cache",
        device_, kept, failure);
  } catch (...) {  // no memory for the message: the reason alone
    return failure;
  }
}

void Sleeper::note_failure(std::string& failure, const char* what) noexcept {
  if (!failure.empty()) return;
  try {
    failure = what;
  } catch (...) {  // no memory for the text: a short one fits the small-string buffer
    failure = "unmap failed";
  }
}

std::size_t Sleeper::wake_bytes(const std::vector<std::uint16_t>& tags) const {
  std::size_t n = 0;
  for (const Slept& s : slept_)
    if (listed(tags, s.segment->tag)) n += s.mapped_bytes();
  return n;
}

bool Sleeper::wake(const std::vector<std::uint16_t>& tags) {
  std::vector<std::size_t> picked;
  for (std::size_t i = 0; i < slept_.size(); ++i)
    if (listed(tags, slept_[i].segment->tag)) picked.push_back(i);
  const std::size_t need = wake_bytes(tags);
  if (!ledger_.fits(need)) return false;
  // 1. Fresh pages for every mapping, and 2. mapped where the old ones were. Undone whole on
  // any failure: the tags stay asleep with their backups.
  struct Fresh {
    char* at;
    std::size_t bytes;
    phys_handle_t handle;
    bool mapped;
  };
  std::vector<Fresh> fresh;
  auto undo = [&]() noexcept {
    for (const Fresh& f : fresh) {
      if (f.mapped) pages_.unmap_or_stray(f.at, f.bytes);
      pages_.release_or_orphan(f.handle);
    }
  };
  try {
    for (std::size_t i : picked) {
      Slept& s = slept_[i];
      Segment& seg = *s.segment;
      if (!s.mappings.empty())
        seg.pages.make_room(s.mappings.back().first + s.mappings.back().count);
      for (const SlotRun& m : s.mappings) {
        const std::size_t bytes = m.count * seg.page;
        const phys_handle_t h = pages_.create(bytes);
        if (h == 0) {
          undo();
          return false;
        }
        fresh.push_back(Fresh{seg.base + m.first * seg.page, bytes, h, false});
      }
    }
    for (Fresh& f : fresh) {
      pages_.unmap_strays_in(f.at, f.bytes);
      if (!pages_.map_pieces(f.at, {MapPiece{f.handle, f.bytes}})) {
        undo();
        return false;
      }
      f.mapped = true;
    }
    // 3. The backups, back in (then the wait for them all).
    for (std::size_t i : picked) {
      Slept& s = slept_[i];
      for (const Saved& v : s.saved)
        copy_chunks(const_cast<char*>(v.block->ptr), s.host + v.offset, v.block->size, false);
    }
    backend_.synchronize_stream(device_, nullptr);
  } catch (...) {
    undo();
    throw;
  }
  // 4. Booked: the page tables, the ledger, the statistics; the host memory goes back.
  std::size_t k = 0;
  for (std::size_t i : picked) {
    Slept& s = slept_[i];
    Segment& seg = *s.segment;
    for (const SlotRun& m : s.mappings) {
      const Fresh& f = fresh[k++];
      seg.pages.set(m.first, m.count, f.handle);
      ledger_.mapped(seg, f.at, f.bytes);
    }
    seg.asleep = false;
    std::int64_t live = 0;
    for (const Block* b = seg.head; b != nullptr; b = b->next)
      if (b->state == BlockState::allocated) live += static_cast<std::int64_t>(b->size);
    stats_.sleeping_bytes.decrease(live);
    free_host(s);
  }
  for (auto it = picked.rbegin(); it != picked.rend(); ++it)
    slept_.erase(slept_.begin() + static_cast<std::ptrdiff_t>(*it));
  for (std::uint16_t tag : tags) {
    if (tag >= tags_.size()) continue;
    tags_[tag].asleep = false;
    tags_[tag].last = ++tick_;
  }
  ++stats_.num_wakes;
  return true;
}

void Sleeper::forget(const Block* block) noexcept {
  for (Slept& s : slept_) {
    if (s.segment != block->segment) continue;
    std::erase_if(s.saved, [&](const Saved& v) { return v.block == block; });
    if (s.saved.empty()) free_host(s);
    stats_.sleeping_bytes.decrease(static_cast<std::int64_t>(block->size));
    return;
  }
}

std::size_t Sleeper::host_bytes(std::uint16_t tag) const noexcept {
  std::size_t n = 0;
  for (const Slept& s : slept_)
    if (s.host != nullptr && (tag == 0 || s.segment->tag == tag)) n += s.host_bytes;
  return n;
}

std::size_t Sleeper::slept_bytes(std::uint16_t tag) const noexcept {
  std::size_t n = 0;
  for (const Slept& s : slept_)
    if (tag == 0 || s.segment->tag == tag) n += s.mapped_bytes();
  return n;
}

void Sleeper::validate() const {
  auto broken = [&](const char* what) {
    throw error(fmt::format("stitch invariant broken on device {}: {}", device_, what));
  };
  std::size_t asleep = 0;
  for (const Segment* s = store_.segments(); s != nullptr; s = s->next) {
    if (!s->asleep) continue;
    ++asleep;
    if (!this->asleep(s->tag)) broken("a range sleeps while its tag is awake");
    const auto it = std::find_if(slept_.begin(), slept_.end(),
                                 [&](const Slept& r) { return r.segment == s; });
    if (it == slept_.end()) broken("a sleeping range is not recorded");
    for (std::size_t i = 0; i < s->pages.stored(); ++i)
      if (s->pages.handle(i) != 0) broken("a sleeping range maps a page");
    for (const Saved& v : it->saved) {
      if (v.block->segment != s || v.block->state != BlockState::allocated)
        broken("a backup is kept for a block that is not live in its range");
      if (v.offset + v.block->size > it->host_bytes) broken("a backup lies outside its host memory");
    }
    if (!it->saved.empty() && it->host == nullptr) broken("backups without host memory");
  }
  if (asleep != slept_.size()) broken("a recorded sleeping range is awake or gone");
}

}  // namespace stitch::detail
