// core/sleeper.cpp — Sleeper: backups (pinned host memory, then files), the release of a tag's
// pages, and their return at wake.
#include "core/sleeper.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>
#include <exception>
#include <limits>

#include "core/assert.hpp"
#include "stitch/errors.hpp"

namespace stitch::detail {

Sleeper::~Sleeper() {
  for (Slept& s : slept_) free_host(s);
  staging_.free(backend_, device_);
}

std::string Sleeper::tag_text(std::uint16_t tag) const {
  if (tag_names_ != nullptr && tag < tag_names_->size() && !(*tag_names_)[tag].empty())
    return fmt::format("tag '{}'", (*tag_names_)[tag]);
  return fmt::format("tag {}", tag);
}

Staging* Sleeper::kv_staging(std::size_t bytes) {
  if (staging_.ready() || staging_.make(backend_, device_, bytes, config_.backup_host_bytes)) return &staging_;
  return nullptr;
}

void Sleeper::kv_file_closed() noexcept {
  --kv_files_;
  drop_staging_if_unused();
}

bool Sleeper::files_open() const noexcept {
  if (kv_files_ != 0) return true;
  for (const Slept& s : slept_)
    if (s.file.is_open()) return true;
  return false;
}

void Sleeper::drop_staging_if_unused() noexcept {
  if (staging_.ready() && !files_open()) staging_.free(backend_, device_);
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
        r.saved.push_back(Saved{b, r.bytes});
        r.bytes += b->size;
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
  for (const HostPiece& h : s.host) free_backup_host(backend_, device_, h.at, h.bytes);
  s.host.clear();
  s.host_bytes = 0;
  s.file.close(backend_, device_);
  s.file_data = 0;
}

template <typename Fn>
void Sleeper::host_parts(const Slept& s, const Saved& v, Fn&& fn) {
  const std::size_t end = std::min(v.offset + v.block->size, s.host_bytes);
  std::size_t start = 0;  // of the piece in the backup
  for (const HostPiece& h : s.host) {
    const std::size_t lo = std::max(v.offset, start), hi = std::min(end, start + h.bytes);
    if (lo < hi) fn(h.at + (lo - start), lo - v.offset, hi - lo);
    start += h.bytes;
    if (start >= end) break;
  }
}

std::vector<Extent> Sleeper::file_extents(const Slept& s) {
  std::vector<Extent> out;
  for (const Saved& v : s.saved) {
    const std::size_t lo = std::max(v.offset, s.host_bytes), hi = v.offset + v.block->size;
    if (lo < hi) out.push_back(Extent{const_cast<char*>(v.block->ptr) + (lo - v.offset), hi - lo, lo - s.host_bytes});
  }
  return out;
}

std::size_t Sleeper::place_in_host(std::vector<Slept>& plan, bool disk) {
  const std::size_t cap = config_.backup_host_bytes;
  std::size_t left_over = 0;
  // After the host refused a size, nothing larger is asked for (it is nearly full).
  std::size_t largest = std::numeric_limits<std::size_t>::max();
  for (Slept& s : plan) {
    if (!disk) {
      // Host memory only: the whole backup in one piece, or the sleep fails.
      if (s.bytes == 0) continue;
      void* p = allocate_backup_host(backend_, device_, s.bytes, cap);
      if (p == nullptr) {
        throw out_of_memory(fmt::format(
            "stitch_sleep: device {}: the host cannot give {} of pinned memory for the backups of {}{}; "
            "nothing was put to sleep ({})",
            device_, bytes_text(s.bytes), tag_text(s.segment->tag),
            host_cap_text(cap),
            config_.backup_dir.empty()
                ? "backup_dir sends what the host cannot hold to files: docs/sleep.md"
                : "nor the staging buffers that backup_dir's files need"));
      }
      s.host.push_back(HostPiece{static_cast<char*>(p), s.bytes});
      s.host_bytes = s.bytes;
      continue;
    }
    // With a disk tier: as much as the host gives, whole or in pieces of at least kMinHostPiece.
    while (s.host_bytes < s.bytes && largest >= kMinHostPiece) {
      std::size_t ask = std::min(s.bytes - s.host_bytes, largest);
      if (cap != 0) {
        const std::size_t used = backup_host_in_use();
        ask = std::min(ask, cap > used ? cap - used : 0);
        if (ask < std::min(kMinHostPiece, s.bytes - s.host_bytes)) break;  // the cap is reached
      }
      void* p = nullptr;
      while ((p = allocate_backup_host(backend_, device_, ask, cap)) == nullptr && ask > kMinHostPiece) {
        largest = ask - 1;
        ask = std::max(kMinHostPiece, ask / 2 / Backend::kFileAlignment * Backend::kFileAlignment);
      }
      if (p == nullptr) {
        largest = 0;  // the host gives nothing more
        break;
      }
      s.host.push_back(HostPiece{static_cast<char*>(p), ask});
      s.host_bytes += ask;
    }
    left_over += s.bytes - s.host_bytes;
  }
  return left_over;
}

void Sleeper::back_up(std::vector<Slept>& plan) {
  std::size_t total = 0;
  for (const Slept& s : plan) total += s.bytes;
  if (total == 0) return;
  const std::string what = fmt::format("stitch_sleep: device {}", device_);
  const std::string dir = config_.backup_dir;
  progress_.start(1, total);
  try {
    // The staging buffers first (the host fills up next), when files may be needed; without
    // them, host memory only.
    const bool disk = !dir.empty() && (staging_.ready() ||
                                       staging_.make(backend_, device_, total, config_.backup_host_bytes));
    const std::size_t rest = place_in_host(plan, disk);
    if (rest != 0) {
      // The files: room for them all first, then one per range, written through the staging.
      std::uint64_t padded = 0;
      for (const Slept& s : plan)
        if (s.bytes > s.host_bytes) padded += file_bytes_for(s.bytes - s.host_bytes);
      take_file_budget(dir, padded, config_.backup_dir_bytes,
                       fmt::format("{}: pinned host memory took {} of the {} of backups{}", what,
                                   bytes_text(total - rest), bytes_text(total),
                                   config_.backup_host_bytes != 0
                                       ? fmt::format(" (backup_host_mb: {})", bytes_text(config_.backup_host_bytes))
                                       : std::string()));
      std::uint64_t given = 0;
      try {
        for (Slept& s : plan) {
          if (s.bytes == s.host_bytes) continue;
          s.file.open(backend_, device_, dir, s.bytes - s.host_bytes, what);
          given += s.file.size;
          s.file_data = s.bytes - s.host_bytes;
        }
      } catch (...) {
        give_file_budget(padded - given);
        throw;
      }
    }
    // The host pieces' copies are queued first; the files' streaming waits for them at its first
    // chunk, and one wait ends it all.
    for (Slept& s : plan)
      for (const Saved& v : s.saved)
        host_parts(s, v, [&](char* host, std::size_t at, std::size_t n) {
          copy_chunks(const_cast<char*>(v.block->ptr) + at, host, n, true);
          progress_.add(n);
        });
    for (Slept& s : plan) {
      if (!s.file.is_open()) continue;
      staging_.write(backend_, device_, file_extents(s), s.file, progress_, what);
    }
    backend_.synchronize_stream(device_, nullptr);
  } catch (const std::exception& e) {
    try {
      backend_.synchronize_stream(device_, nullptr);  // no copy into memory about to be freed
    } catch (...) {
    }
    for (Slept& s : plan) free_host(s);
    drop_staging_if_unused();
    progress_.stop();
    // Say that nothing changed (the files had no name: nothing stays in the directory).
    if (std::string_view(e.what()).find("nothing was put to sleep") != std::string_view::npos) throw;
    rethrow_with(e, "; nothing was put to sleep: every block is awake with its data");
  } catch (...) {
    for (Slept& s : plan) free_host(s);
    drop_staging_if_unused();
    progress_.stop();
    throw;
  }
  progress_.stop();
  // No range needed a file: the staging buffers go (unless earlier files keep them).
  bool any = false;
  for (const Slept& s : plan) any = any || s.file.is_open();
  if (!any) drop_staging_if_unused();
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
    stats_.backup_file_bytes.increase(static_cast<std::int64_t>(s.file_data));
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
    // 3. The backups, back in: the host pieces' copies queued, then the files read through the
    // staging buffers (their first wait covers the host pieces'), then the wait for them all.
    std::uint64_t total = 0;
    for (std::size_t i : picked)
      for (const Saved& v : slept_[i].saved) total += v.block->size;
    progress_.start(2, total);
    const std::string what = fmt::format("stitch_wake: device {}", device_);
    for (std::size_t i : picked) {
      Slept& s = slept_[i];
      for (const Saved& v : s.saved)
        host_parts(s, v, [&](char* host, std::size_t at, std::size_t n) {
          copy_chunks(const_cast<char*>(v.block->ptr) + at, host, n, false);
          progress_.add(n);
        });
    }
    for (std::size_t i : picked) {
      Slept& s = slept_[i];
      if (!s.file.is_open()) continue;
      staging_.read(backend_, device_, file_extents(s), s.file, progress_,
                    fmt::format("{}: the backup of {}", what, tag_text(s.segment->tag)));
    }
    backend_.synchronize_stream(device_, nullptr);
    progress_.stop();
  } catch (const backend_error& e) {
    progress_.stop();
    undo();
    throw backend_error(fmt::format(
        "{}; nothing was mapped: the tags stay asleep with their backups, and the wake may be retried", e.what()));
  } catch (...) {
    progress_.stop();
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
    stats_.backup_file_bytes.decrease(static_cast<std::int64_t>(s.file_data));
    free_host(s);
  }
  for (auto it = picked.rbegin(); it != picked.rend(); ++it)
    slept_.erase(slept_.begin() + static_cast<std::ptrdiff_t>(*it));
  drop_staging_if_unused();
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
    const auto v = std::find_if(s.saved.begin(), s.saved.end(), [&](const Saved& x) { return x.block == block; });
    if (v != s.saved.end()) {
      // Its bytes in the file: the whole pages among them become a hole.
      const std::size_t lo = std::max(v->offset, s.host_bytes), hi = v->offset + block->size;
      if (lo < hi) {
        s.file.discard(backend_, device_, lo - s.host_bytes, hi - lo);
        s.file_data -= hi - lo;
        stats_.backup_file_bytes.decrease(static_cast<std::int64_t>(hi - lo));
      }
      s.saved.erase(v);
    }
    if (s.saved.empty()) {
      free_host(s);
      drop_staging_if_unused();
    }
    stats_.sleeping_bytes.decrease(static_cast<std::int64_t>(block->size));
    return;
  }
}

std::size_t Sleeper::host_bytes(std::uint16_t tag) const noexcept {
  std::size_t n = 0;
  for (const Slept& s : slept_)
    if (tag == 0 || s.segment->tag == tag) n += s.host_bytes;
  return n;
}

std::size_t Sleeper::file_bytes(std::uint16_t tag) const noexcept {
  std::size_t n = 0;
  for (const Slept& s : slept_)
    if (tag == 0 || s.segment->tag == tag) n += s.file_data;
  return n;
}

const char* Sleeper::backup_place(std::uint16_t tag) const noexcept {
  const bool host = host_bytes(tag) != 0, file = file_bytes(tag) != 0;
  return host && file ? "both" : host ? "host" : file ? "file" : "none";
}

void Sleeper::annotate(std::vector<SegmentSnapshot>& out, std::size_t from) const {
  for (std::size_t k = from; k < out.size(); ++k) {
    SegmentSnapshot& seg = out[k];
    if (!seg.sleeping) continue;
    for (const Slept& s : slept_) {
      const auto base = reinterpret_cast<std::uintptr_t>(s.segment->base);
      if (seg.address < base || seg.address >= base + s.segment->pages.stored() * s.segment->page) continue;
      for (const Saved& v : s.saved) {
        const auto at = reinterpret_cast<std::uintptr_t>(v.block->ptr);
        if (at < seg.address || at >= seg.address + seg.total_size) continue;
        const std::size_t in_host =
            v.offset >= s.host_bytes ? 0 : std::min(v.block->size, s.host_bytes - v.offset);
        seg.backup_host_bytes += in_host;
        seg.backup_file_bytes += v.block->size - in_host;
      }
    }
  }
}

void Sleeper::validate(std::size_t other_file_bytes) const {
  auto broken = [this](const char* what) { invariant_broken(device_, what); };
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
    std::size_t in_file = 0;
    for (const Saved& v : it->saved) {
      if (v.block->segment != s || v.block->state != BlockState::allocated)
        broken("a backup is kept for a block that is not live in its range");
      if (v.offset + v.block->size > it->bytes) broken("a backup lies outside its range's backup");
      if (v.offset + v.block->size > it->host_bytes) in_file += v.offset + v.block->size - std::max(v.offset, it->host_bytes);
    }
    std::size_t pieces = 0;
    for (const HostPiece& h : it->host) pieces += h.bytes;
    if (pieces != it->host_bytes || it->host_bytes > it->bytes) broken("a backup's host pieces do not add up");
    if (in_file != it->file_data) broken("a backup's bytes in its file do not add up");
    if (in_file != 0 && !it->file.is_open()) broken("backups beyond the host memory without a file");
    if (it->file.is_open() && it->file.size < it->bytes - it->host_bytes) broken("a backup file is too small");
  }
  if (asleep != slept_.size()) broken("a recorded sleeping range is awake or gone");
  std::size_t in_files = 0;
  for (const Slept& r : slept_) in_files += r.file_data;
  if (static_cast<std::int64_t>(in_files + other_file_bytes) != stats_.backup_file_bytes.current)
    broken("backup_file_bytes is not the bytes of the backups in files");
  if (files_open() && !staging_.ready()) broken("backup files without staging buffers");
}

}  // namespace stitch::detail
