// core/kv_pools.cpp — KvPools: the pools' ranges, their pages mapped under live blocks, the ids,
// the limit, the releases, sleep and wake (core/kv_pools.hpp).
#include "core/kv_pools.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>
#include <exception>
#include <mutex>

#include "core/assert.hpp"
#include "core/backup_files.hpp"
#include "core/device_lock.hpp"
#include "core/ledger.hpp"
#include "core/page_mapper.hpp"
#include "core/private_pools.hpp"
#include "core/residency.hpp"
#include "core/constants.hpp"
#include "core/undo.hpp"
#include "stitch/errors.hpp"

namespace stitch::detail {

KvPools::~KvPools() {
  // The allocator goes away: every pool's pages and ranges go back (errors dropped).
  for (auto& [id, k] : pools_) {
    for (std::size_t p = 0; p < k->pages; ++p)
      if (k->handle[p * static_cast<std::size_t>(k->buffers)] != 0) unmap_page(*k, p);
    drop_zero(*k);
    for (char* b : k->base) d_.pages.release_or_keep_reservation(b, k->span);
    drop_backup(*k);
  }
}

KvPool& KvPools::get(int pool) {
  const auto it = pools_.find(pool);
  if (it == pools_.end())
    throw invalid_argument(fmt::format("KV pool {} does not exist on device {} (destroyed?)", pool, d_.device));
  return *it->second;
}

int KvPools::create(int buffers, std::size_t block_bytes, std::size_t max_blocks, std::uint16_t tag,
                    const std::string& tag_name, bool backup, bool spill) {
  if (buffers <= 0 || block_bytes == 0 || max_blocks == 0)
    throw invalid_argument(fmt::format("stitch_kv_create: buffers ({}), block_bytes ({}) and max_blocks ({}) "
                                       "must be positive", buffers, block_bytes, max_blocks));
  if (max_blocks > (std::size_t{1} << 40) / block_bytes || buffers > 65536)
    throw invalid_argument(fmt::format("stitch_kv_create: {} buffers of {} blocks of {} bytes is more address "
                                       "space than a device has", buffers, max_blocks, block_bytes));
  std::lock_guard lock(d_.lock);
  if (!d_.pages.supported())
    throw backend_error(fmt::format(
        "stitch_kv_create: device {}: backend:{} has no virtual-memory API here; a KV pool maps "
        "pages under reserved ranges", d_.device, d_.backend.name()));
  auto k = std::make_unique<KvPool>();
  k->id = next_id_;
  k->tag = tag;
  k->backup = backup;
  k->spill = spill;
  k->buffers = buffers;
  k->block_bytes = block_bytes;
  k->max_blocks = max_blocks;
  const std::size_t g = d_.pages.granularity();
  k->page = round_up(std::max<std::size_t>(d_.config.kv_page, 1), g);
  k->pages = (block_bytes * max_blocks + k->page - 1) / k->page;
  k->span = k->pages * k->page;
  k->reserve = d_.config.kv_reserve;
  k->handle.assign(k->pages * static_cast<std::size_t>(buffers), 0);
  k->refs.assign(k->pages, 0);
  k->on_host.assign(k->pages * static_cast<std::size_t>(buffers), 0);
  k->zeroed.assign(k->pages * static_cast<std::size_t>(buffers), 0);
  k->live.assign((max_blocks + 63) / 64, 0);
  try {
    for (int b = 0; b < buffers; ++b) {
      char* va = d_.pages.reserve(k->span, g);
      if (va == nullptr)
        throw out_of_memory(fmt::format("stitch_kv_create: device {}: no address space left for {} "
                                        "buffers of {} bytes", d_.device, buffers, k->span));
      k->base.push_back(va);
    }
  } catch (...) {
    for (char* va : k->base) d_.pages.release_or_keep_reservation(va, k->span);
    throw;
  }
  if (d_.config.kv_zero_page) {
    try {
      (void)map_zero_everywhere(*k);  // (sets k->zero where the back end allows)
    } catch (...) {
      for (char* va : k->base) d_.pages.release_or_keep_reservation(va, k->span);
      throw;
    }
  }
  // The tag is used here from now on: stitch_sleep and stitch_wake name it (its name was given
  // to each device as a region's is).
  (void)tag_name;
  residency_.sleeper().note_used(tag);
  const int id = next_id_++;
  pools_.emplace(id, std::move(k));
  return id;
}

void KvPools::destroy(int pool) {
  std::lock_guard lock(d_.lock);
  KvPool& k = get(pool);
  if (k.live_blocks != 0)
    throw invalid_argument(fmt::format("stitch_kv_destroy: KV pool {} still has {} live block(s); free them first",
                                       pool, k.live_blocks));
  if (k.mapped_pages + k.host_pages != 0) {
    ++d_.stats.num_device_syncs;
    d_.pages.synchronize_device(false);  // kernels may still read the freed blocks
  }
  for (std::size_t p = 0; p < k.pages; ++p)
    if (k.handle[p * static_cast<std::size_t>(k.buffers)] != 0) unmap_page(k, p);
  drop_zero(k);
  for (char* b : k.base) d_.pages.release_or_keep_reservation(b, k.span);
  drop_backup(k);
  pools_.erase(pool);
}

char* KvPools::buffer(int pool, int buffer) {
  std::lock_guard lock(d_.lock);
  KvPool& k = get(pool);
  if (buffer < 0 || buffer >= k.buffers)
    throw invalid_argument(fmt::format("stitch_kv_buffer: buffer {} of a pool with {} buffers", buffer, k.buffers));
  return k.base[static_cast<std::size_t>(buffer)];
}

bool KvPools::map_page(KvPool& k, std::size_t p) {
  const std::size_t nb = static_cast<std::size_t>(k.buffers);
  if (!d_.ledger.fits(k.page_set_bytes())) return false;
  // The zero page leaves the slot first (mapped back on a failure).
  auto zero_back = [&]() noexcept {
    for (std::size_t b = 0; b < nb; ++b)
      if (k.zero && k.handle[p * nb + b] == 0 && k.zeroed[p * nb + b] == 0) k.zeroed[p * nb + b] = map_zero(k, p, b);
  };
  for (std::size_t b = 0; b < nb; ++b) {
    if (k.zeroed[p * nb + b] == 0) continue;
    try {
      d_.pages.unmap(k.base[b] + p * k.page, k.page);
    } catch (...) {
      zero_back();
      throw;
    }
    k.zeroed[p * nb + b] = 0;
  }
  std::size_t done = 0;
  try {
    for (; done < nb; ++done) {
      const phys_handle_t h = d_.pages.create(k.page);
      if (h == 0) break;
      char* at = k.base[done] + p * k.page;
      d_.pages.unmap_strays_in(at, k.page);
      bool mapped = false;
      try {
        mapped = d_.pages.map_pieces(at, {MapPiece{h, k.page}});
      } catch (...) {
        d_.pages.release_or_orphan(h);
        throw;
      }
      if (!mapped) {
        d_.pages.release_or_orphan(h);
        break;
      }
      k.handle[p * nb + done] = h;
    }
  } catch (...) {
    for (std::size_t b = 0; b < done; ++b) {
      d_.pages.unmap_or_stray(k.base[b] + p * k.page, k.page);
      d_.pages.release_or_orphan(k.handle[p * nb + b]);
      k.handle[p * nb + b] = 0;
    }
    zero_back();
    throw;
  }
  if (done < nb) {
    for (std::size_t b = 0; b < done; ++b) {
      d_.pages.unmap_or_stray(k.base[b] + p * k.page, k.page);
      d_.pages.release_or_orphan(k.handle[p * nb + b]);
      k.handle[p * nb + b] = 0;
    }
    zero_back();
    return false;
  }
  ++k.mapped_pages;
  ++k.maps;
  k.peak_mapped_pages = std::max(k.peak_mapped_pages, k.mapped_pages);
  d_.ledger.kv_mapped(k.base[0] + p * k.page, k.page_set_bytes());
  return true;
}

void KvPools::unmap_page(KvPool& k, std::size_t p) noexcept {
  const std::size_t nb = static_cast<std::size_t>(k.buffers);
  const std::size_t hosts = k.hosted(p);
  for (std::size_t b = 0; b < nb; ++b) {
    phys_handle_t& h = k.handle[p * nb + b];
    if (h == 0) continue;
    d_.pages.unmap_or_stray(k.base[b] + p * k.page, k.page);
    d_.pages.release_or_orphan(h);
    h = 0;
    k.on_host[p * nb + b] = 0;
    if (k.zero) k.zeroed[p * nb + b] = map_zero(k, p, b) ? 1 : 0;  // (unmapped if that fails)
  }
  ++k.unmaps;
  char* at = k.base[0] + p * k.page;
  if (hosts != 0) {  // a spilled page: host memory, not the device's (but for slots an undo left)
    --k.host_pages;
    k.host_slots -= hosts;
    d_.ledger.host_unmapped(at, hosts * k.page);
    if (hosts < nb) d_.ledger.kv_unmapped(at, (nb - hosts) * k.page);
    return;
  }
  --k.mapped_pages;
  d_.ledger.kv_unmapped(at, k.page_set_bytes());
}

std::size_t KvPools::next_free(const KvPool& k, std::size_t from) noexcept {
  for (std::size_t w = from / 64; w < k.live.size(); ++w) {
    std::uint64_t bits = ~k.live[w];
    if (w == from / 64) bits &= ~std::uint64_t{0} << (from % 64);
    if (bits == 0) continue;
    const std::size_t i = w * 64 + static_cast<std::size_t>(__builtin_ctzll(bits));
    return std::min(i, k.max_blocks);
  }
  return k.max_blocks;
}

void KvPools::alloc(int pool, std::size_t n, std::int64_t* ids) {
  std::lock_guard lock(d_.lock);
  KvPool& k = get(pool);
  if (n == 0) return;
  if (ids == nullptr) throw invalid_argument("stitch_kv_alloc: ids is NULL");
  if (k.asleep)
    throw error(fmt::format("stitch_kv_alloc: KV pool {}'s tag '{}' is asleep on device {} (stitch_wake it first)",
                            pool, residency_.tag_name(k.tag), d_.device));
  if (n > k.max_blocks - k.live_blocks)
    throw out_of_memory(fmt::format("CUDA out of memory. stitch_kv_alloc: KV pool {} has {} free block(s) of {}, "
                                    "fewer than the {} asked; nothing allocated",
                                    pool, k.max_blocks - k.live_blocks, k.max_blocks, n));
  // The ids, lowest free first, and the pages they need.
  std::vector<std::size_t> chosen;
  chosen.reserve(n);
  std::vector<std::size_t> fresh;  // pages to map
  std::size_t used_after = k.used_pages;
  std::vector<std::uint32_t> extra;  // refs added per page, for the limit (pages newly used)
  for (std::size_t i = next_free(k, 0); chosen.size() < n; i = next_free(k, i + 1)) {
    chosen.push_back(i);
    for (std::size_t p = k.first_page(i); p <= k.last_page(i); ++p) {
      const bool counted = std::find(fresh.begin(), fresh.end(), p) != fresh.end() ||
                           std::find(extra.begin(), extra.end(), static_cast<std::uint32_t>(p)) != extra.end();
      if (k.refs[p] != 0 || counted) continue;
      ++used_after;
      if (k.handle[p * static_cast<std::size_t>(k.buffers)] == 0) {
        fresh.push_back(p);
      } else {
        extra.push_back(static_cast<std::uint32_t>(p));
      }
    }
  }
  if (k.limit != 0 && used_after * k.page_set_bytes() > k.limit)
    throw out_of_memory(fmt::format(
        "CUDA out of memory. stitch_kv_alloc: KV pool {} would hold {} bytes of pages under live blocks, "
        "over its limit of {} bytes (stitch_kv_set_limit); nothing allocated", pool,
        used_after * k.page_set_bytes(), k.limit));
  // Map what is missing: all or nothing. Short of memory, the out-of-memory ladder's releases
  // (cached blocks, every pool's unused pages) once, then every missing page again.
  std::size_t mapped = 0;
  auto undo = [&]() noexcept {
    for (std::size_t j = 0; j < mapped; ++j) unmap_page(k, fresh[j]);
    mapped = 0;
  };
  try {
    bool released = false;
    while (mapped < fresh.size()) {
      if (map_page(k, fresh[mapped])) {
        ++mapped;
        continue;
      }
      undo();
      if (released || !d_.pools.may_touch_device({})) {
        throw out_of_memory(fmt::format(
            "CUDA out of memory. stitch_kv_alloc: device {} cannot give the {} page(s) of {} bytes KV pool {} "
            "needs ({} bytes free of {}; this process reserves {} bytes, {} of them in KV pools); the cache "
            "and every pool's unused pages were released first; nothing allocated",
            d_.device, fresh.size(), k.page_set_bytes(), pool, d_.pages.device_free(),
            d_.pages.device_total(), d_.ledger.reserved(), mapped_bytes()));
      }
      released = true;
      d_.upkeep.release_cached_blocks(0);
      (void)release_unused(/*all=*/true);
      // Every page of the chosen blocks that is unmapped now (this pool's unused ones may have
      // gone too).
      fresh.clear();
      for (std::size_t i : chosen)
        for (std::size_t p = k.first_page(i); p <= k.last_page(i); ++p)
          if (k.handle[p * static_cast<std::size_t>(k.buffers)] == 0 &&
              std::find(fresh.begin(), fresh.end(), p) == fresh.end())
            fresh.push_back(p);
    }
  } catch (const out_of_memory&) {
    throw;
  } catch (...) {
    undo();
    throw;
  }
  // Booked.
  for (std::size_t i : chosen) {
    k.live[i / 64] |= std::uint64_t{1} << (i % 64);
    for (std::size_t p = k.first_page(i); p <= k.last_page(i); ++p)
      if (k.refs[p]++ == 0) ++k.used_pages;
  }
  k.live_blocks += n;
  for (std::size_t j = 0; j < n; ++j) ids[j] = static_cast<std::int64_t>(chosen[j]);
}

void KvPools::free(int pool, const std::int64_t* ids, std::size_t n) {
  std::lock_guard lock(d_.lock);
  KvPool& k = get(pool);
  if (n == 0) return;
  if (ids == nullptr) throw invalid_argument("stitch_kv_free: ids is NULL");
  // Every id checked before anything is freed.
  std::vector<std::int64_t> sorted(ids, ids + n);
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t j = 0; j < n; ++j) {
    const std::int64_t id = sorted[j];
    if (id < 0 || static_cast<std::size_t>(id) >= k.max_blocks)
      throw invalid_argument(fmt::format("stitch_kv_free: block id {} is out of range (KV pool {} has {} blocks); "
                                         "nothing freed", id, pool, k.max_blocks));
    if (j > 0 && sorted[j - 1] == id)
      throw invalid_argument(fmt::format("stitch_kv_free: block id {} is listed twice; nothing freed", id));
    if (!k.is_live(static_cast<std::size_t>(id)))
      throw invalid_argument(fmt::format("stitch_kv_free: block {} of KV pool {} is not allocated (a double "
                                         "free?); nothing freed", id, pool));
  }
  for (std::int64_t id : sorted) {
    const auto i = static_cast<std::size_t>(id);
    k.live[i / 64] &= ~(std::uint64_t{1} << (i % 64));
    for (std::size_t p = k.first_page(i); p <= k.last_page(i); ++p)
      if (--k.refs[p] == 0) {
        --k.used_pages;
        if (k.file_data != 0) drop_file_page(k, p);
      }
  }
  k.live_blocks -= n;
}

void KvPools::drop_file_page(KvPool& k, std::size_t p) noexcept {
  // (saved is in page order: the page's place in the file)
  const auto at = std::lower_bound(k.saved.begin(), k.saved.end(), p);
  if (at == k.saved.end() || *at != p) return;
  const std::size_t bytes = k.page_set_bytes();
  k.file.discard(d_.backend, d_.device, static_cast<std::uint64_t>(at - k.saved.begin()) * bytes, bytes);
  k.file_data -= bytes;
  d_.stats.backup_file_bytes.decrease(static_cast<std::int64_t>(bytes));
}

void KvPools::set_limit(int pool, std::size_t bytes) {
  std::lock_guard lock(d_.lock);
  get(pool).limit = bytes;
}

std::size_t KvPools::available(int pool) {
  std::lock_guard lock(d_.lock);
  KvPool& k = get(pool);
  if (k.asleep) return 0;
  // Blocks in id order, as alloc takes them, while the device, the fraction and the limit allow.
  std::size_t room = std::min(d_.pages.device_free(), d_.ledger.room());
  std::size_t used = k.used_pages;
  std::vector<std::uint8_t> taken(k.pages, 0);
  std::size_t n = 0;
  for (std::size_t i = next_free(k, 0); i < k.max_blocks; i = next_free(k, i + 1)) {
    std::size_t need = 0, newly = 0;
    for (std::size_t p = k.first_page(i); p <= k.last_page(i); ++p) {
      if (k.refs[p] != 0 || taken[p] != 0) continue;
      ++newly;
      if (k.handle[p * static_cast<std::size_t>(k.buffers)] == 0) need += k.page_set_bytes();
    }
    if (need > room) break;
    if (k.limit != 0 && (used + newly) * k.page_set_bytes() > k.limit) break;
    room -= need;
    used += newly;
    for (std::size_t p = k.first_page(i); p <= k.last_page(i); ++p) taken[p] = 1;
    ++n;
  }
  return n;
}

std::size_t KvPools::unmap_unused(KvPool& k, std::size_t keep) noexcept {
  std::size_t unused = k.unused_pages() * k.page_set_bytes();
  std::size_t freed = 0;
  // Highest pages first: lowest-free-first allocation reuses the low ones.
  for (std::size_t p = k.pages; p-- > 0 && unused > keep;) {
    if (k.refs[p] != 0 || k.handle[p * static_cast<std::size_t>(k.buffers)] == 0) continue;
    unmap_page(k, p);
    unused -= k.page_set_bytes();
    freed += k.page_set_bytes();
  }
  return freed;
}

void KvPools::trim(int pool) {
  std::lock_guard lock(d_.lock);
  KvPool& k = get(pool);
  if (k.unused_pages() == 0) return;
  if (!d_.pools.may_touch_device({}))
    throw error("stitch_kv_trim: a CUDA graph capture is underway; pages cannot be unmapped now");
  ++d_.stats.num_device_syncs;
  d_.pages.synchronize_device(d_.config.peer_access);  // kernels may still read freed blocks
  (void)unmap_unused(k, 0);
}

std::size_t KvPools::release_unused(bool all) noexcept {
  bool any = false;
  for (auto& [id, k] : pools_) {
    const std::size_t unused = k->unused_pages() * k->page_set_bytes();
    if (!k->asleep && unused > (all ? 0 : k->reserve)) any = true;
  }
  if (!any) return 0;
  try {
    ++d_.stats.num_device_syncs;
    d_.pages.synchronize_device(d_.config.peer_access);
  } catch (...) {
    return 0;  // nothing unmapped under work that may still run
  }
  std::size_t freed = 0;
  for (auto& [id, k] : pools_)
    if (!k->asleep) freed += unmap_unused(*k, all ? 0 : k->reserve);
  return freed;
}

bool KvPools::has_tag(std::uint16_t tag) const noexcept {
  for (const auto& [id, k] : pools_)
    if (k->tag == tag) return true;
  return false;
}

void KvPools::sleep(const std::vector<std::uint16_t>& tags, const std::vector<std::uint16_t>& backup_tags) {
  auto listed = [](const std::vector<std::uint16_t>& v, std::uint16_t t) {
    return std::find(v.begin(), v.end(), t) != v.end();
  };
  std::vector<KvPool*> todo;
  for (auto& [id, k] : pools_)
    if (!k->asleep && listed(tags, k->tag)) todo.push_back(k.get());
  // 1. Backups of the live pages (all or nothing): pinned host memory, else a file of backup_dir;
  // 2. every page unmapped.
  const std::string what = fmt::format("stitch_sleep: device {}", d_.device);
  std::vector<KvPool*> backed;
  try {
    for (KvPool* k : todo) {
      if (!(k->backup || listed(backup_tags, k->tag)) || k->used_pages == 0) continue;
      std::vector<std::size_t> saved;
      for (std::size_t p = 0; p < k->pages; ++p)
        if (k->refs[p] != 0) saved.push_back(p);
      const std::size_t bytes = saved.size() * k->page_set_bytes();
      k->saved = std::move(saved);
      backed.push_back(k);
      char* host = static_cast<char*>(allocate_backup_host(d_.backend, d_.device, bytes, d_.config.backup_host_bytes));
      if (host == nullptr) {
        if (d_.config.backup_dir.empty())
          throw out_of_memory(fmt::format("{}: the host cannot give {} for KV pool {}'s backup{}; nothing was put to "
                                          "sleep (backup_dir sends what the host cannot hold to files: docs/sleep.md)",
                                          what, bytes_text(bytes), k->id, host_cap_text(d_.config.backup_host_bytes)));
        back_up_to_file(*k, bytes, what);
        continue;
      }
      k->host = host;
      k->host_bytes = bytes;
      std::size_t off = 0;
      for (std::size_t p : k->saved)
        for (int b = 0; b < k->buffers; ++b, off += k->page)
          d_.backend.copy_to_host_async(d_.device, host + off, k->base[static_cast<std::size_t>(b)] + p * k->page,
                                         k->page, nullptr);
    }
    if (!backed.empty()) d_.backend.synchronize_stream(d_.device, nullptr);
  } catch (const std::exception& e) {
    try {
      d_.backend.synchronize_stream(d_.device, nullptr);  // no copy into memory about to be freed
    } catch (...) {
    }
    for (KvPool* k : backed) drop_backup(*k);
    if (std::string_view(e.what()).find("nothing was put to sleep") != std::string_view::npos) throw;
    rethrow_with(e, "; nothing was put to sleep: every KV pool is awake with its data");
  } catch (...) {
    for (KvPool* k : backed) drop_backup(*k);
    throw;
  }
  for (KvPool* k : todo) {
    for (std::size_t p = 0; p < k->pages; ++p)
      if (k->handle[p * static_cast<std::size_t>(k->buffers)] != 0) unmap_page(*k, p);
    k->asleep = true;
    if (k->file.is_open()) {
      k->file_data = k->saved.size() * k->page_set_bytes();
      d_.stats.backup_file_bytes.increase(static_cast<std::int64_t>(k->file_data));
    }
  }
}

void KvPools::back_up_to_file(KvPool& k, std::size_t bytes, const std::string& what) {
  const std::string& dir = d_.config.backup_dir;
  const std::uint64_t padded = file_bytes_for(bytes);
  take_file_budget(dir, padded, d_.config.backup_dir_bytes,
                   fmt::format("{}: KV pool {}'s backup of {} (pinned host memory took none)", what, k.id,
                               bytes_text(bytes)));
  try {
    k.file.open(d_.backend, d_.device, dir, bytes, what);
  } catch (...) {
    give_file_budget(padded);
    throw;
  }
  Sleeper& sleeper = residency_.sleeper();
  sleeper.kv_file_opened();
  Staging* staging = sleeper.kv_staging(bytes);
  if (staging == nullptr)
    throw out_of_memory(fmt::format("{}: the host gives neither {} for KV pool {}'s backup nor the staging buffers "
                                    "its file in {} needs",
                                    what, bytes_text(bytes), k.id, dir));
  stream_file(k, true, what);
}

void KvPools::stream_file(KvPool& k, bool write, const std::string& what) {
  const std::vector<Extent> extents = file_extents(k, !write);
  std::uint64_t total = 0;
  for (const Extent& e : extents) total += e.bytes;
  Sleeper& sleeper = residency_.sleeper();
  Staging* staging = sleeper.kv_staging(0);  // (kept while the file is open)
  if (staging == nullptr) throw error(fmt::format("{}: KV pool {}'s backup file has no staging buffers", what, k.id));
  BackupProgress& progress = sleeper.progress();  // (stitch_backup_progress)
  progress.start(write ? 1 : 2, total);
  try {
    if (write) {
      staging->write(d_.backend, d_.device, extents, k.file, progress, what);
    } else {
      staging->read(d_.backend, d_.device, extents, k.file, progress, what);
    }
  } catch (...) {
    progress.stop();
    throw;
  }
  progress.stop();
}

std::vector<Extent> KvPools::file_extents(const KvPool& k, bool live) {
  std::vector<Extent> out;
  std::uint64_t off = 0;
  for (std::size_t p : k.saved)
    for (std::size_t b = 0; b < static_cast<std::size_t>(k.buffers); ++b, off += k.page)
      if (!live || k.refs[p] != 0) out.push_back(Extent{k.base[b] + p * k.page, k.page, off});
  return out;
}

bool KvPools::wake(const std::vector<std::uint16_t>& tags) {
  std::vector<KvPool*> todo;
  for (auto& [id, k] : pools_)
    if (k->asleep && std::find(tags.begin(), tags.end(), k->tag) != tags.end()) todo.push_back(k.get());
  // Pages under the live blocks, mapped again; all or nothing.
  std::vector<std::pair<KvPool*, std::size_t>> mapped;
  auto undo = [&]() noexcept {
    for (auto& [k, p] : mapped) unmap_page(*k, p);
  };
  // After a failure among the copies: none may still write into pages about to go.
  auto settle = [&]() noexcept {
    try {
      d_.backend.synchronize_stream(d_.device, nullptr);
    } catch (...) {
    }
  };
  try {
    for (KvPool* k : todo)
      for (std::size_t p = 0; p < k->pages; ++p) {
        if (k->refs[p] == 0) continue;
        if (!map_page(*k, p)) {
          undo();
          return false;
        }
        mapped.emplace_back(k, p);
      }
    const std::string what = fmt::format("stitch_wake: device {}", d_.device);
    for (KvPool* k : todo) {
      if (k->file.is_open()) {
        stream_file(*k, false, fmt::format("{}: KV pool {}", what, k->id));
        continue;
      }
      std::size_t off = 0;
      for (std::size_t p : k->saved) {
        for (int b = 0; b < k->buffers; ++b, off += k->page)
          if (k->refs[p] != 0)  // (blocks freed while asleep: their pages stay unmapped)
            d_.backend.copy_from_host_async(d_.device, k->base[static_cast<std::size_t>(b)] + p * k->page,
                                             k->host + off, k->page, nullptr);
      }
    }
    d_.backend.synchronize_stream(d_.device, nullptr);
  } catch (const std::exception& e) {
    settle();
    undo();
    rethrow_with(e, "; nothing was mapped: the KV pools stay asleep with their backups, and the wake may be retried");
  } catch (...) {
    settle();
    undo();
    throw;
  }
  for (KvPool* k : todo) {
    drop_backup(*k);
    k->asleep = false;
  }
  return true;
}

void KvPools::drop_backup(KvPool& k) noexcept {
  free_backup_host(d_.backend, d_.device, k.host, k.host_bytes);  // (within backup_host_mb)
  k.host = nullptr;
  k.host_bytes = 0;
  if (k.file_data != 0) d_.stats.backup_file_bytes.decrease(static_cast<std::int64_t>(k.file_data));
  k.file_data = 0;
  if (k.file.is_open()) {
    k.file.close(d_.backend, d_.device);
    residency_.sleeper().kv_file_closed();  // (the staging buffers go with the last file)
  }
  k.saved.clear();
}

std::size_t KvPools::backup_host_bytes() const noexcept {
  std::size_t n = 0;
  for (const auto& [id, k] : pools_) n += k->host_bytes;
  return n;
}

std::size_t KvPools::backup_file_bytes() const noexcept {
  std::size_t n = 0;
  for (const auto& [id, k] : pools_) n += k->file_data;
  return n;
}

bool KvPools::move_page(KvPool& k, std::size_t p, bool to_host, phys_handle_t* given) {
  const std::size_t nb = static_cast<std::size_t>(k.buffers);
  std::vector<std::size_t> todo;  // the buffers whose slot is not where it goes
  for (std::size_t b = 0; b < nb; ++b)
    if ((k.on_host[p * nb + b] != 0) != to_host) todo.push_back(b);
  if (todo.empty()) return true;
  if (!to_host && !d_.ledger.fits(todo.size() * k.page)) return false;
  const std::size_t before = k.hosted(p);
  // Buffer b's slot through the page mapper's remap, on a one-slot view of the buffer, onto
  // `fresh` (a host page) or, without it, a fresh device page.
  auto remap_one = [&](std::size_t b, const phys_handle_t* fresh) {
    Segment view;
    view.base = k.base[b];
    view.size = k.span;
    view.expandable = true;
    view.page = k.page;
    view.pages.reset(k.pages);
    view.pages.make_room(p + 1);
    view.pages.set(p, 1, k.handle[p * nb + b]);
    if (!d_.pages.remap(Mapping{&view, p, 1}, {SlotRun{p, 1}}, false, fresh)) return false;
    k.handle[p * nb + b] = view.pages.handle(p);
    k.on_host[p * nb + b] = fresh != nullptr ? 1 : 0;
    return true;
  };
  // A slot moved goes back: onto a fresh device page (its host page released by that remap), or
  // onto a host page made for it. If that fails too, it stays where its data is.
  auto undo_one = [&](std::size_t b) noexcept {
    if (to_host) {
      try {
        (void)remap_one(b, nullptr);
      } catch (...) {
      }
      return;
    }
    phys_handle_t h = 0;
    try {
      h = d_.pages.create_host(k.page);
      if (h != 0 && remap_one(b, &h)) return;
    } catch (...) {
    }
    if (h != 0) d_.pages.release_or_orphan(h);
  };
  std::vector<std::size_t> moved;
  moved.reserve(todo.size());
  std::exception_ptr error;
  bool whole = true;
  for (std::size_t b : todo) {
    bool done = false;
    try {
      done = remap_one(b, to_host ? given + b : nullptr);
    } catch (...) {
      error = std::current_exception();
    }
    if (!done) {
      whole = false;
      break;
    }
    if (to_host) given[b] = 0;  // the page table's now
    moved.push_back(b);
  }
  if (!whole)
    for (std::size_t j = moved.size(); j-- > 0;) undo_one(moved[j]);
  book_moved(k, p, before);
  if (error) std::rethrow_exception(error);
  return whole;
}

void KvPools::book_moved(KvPool& k, std::size_t p, std::size_t before) noexcept {
  const std::size_t after = k.hosted(p);
  if (after == before) return;
  (before == 0 ? k.mapped_pages : k.host_pages) -= 1;
  (after == 0 ? k.mapped_pages : k.host_pages) += 1;
  k.host_slots = k.host_slots - before + after;
  char* at = k.base[0] + p * k.page;
  if (after > before) {
    d_.ledger.kv_unmapped(at, (after - before) * k.page);
    d_.ledger.host_mapped(at, (after - before) * k.page);
  } else {
    d_.ledger.host_unmapped(at, (before - after) * k.page);
    d_.ledger.kv_mapped(at, (before - after) * k.page);
  }
}

std::size_t KvPools::spill(const std::vector<std::uint16_t>& tags, std::size_t room) {
  std::vector<std::pair<KvPool*, std::size_t>> plan;  // pages under live blocks with a device slot
  std::size_t need = 0;
  for (auto& [id, k] : pools_) {
    if (!k->spill || k->asleep || std::find(tags.begin(), tags.end(), k->tag) == tags.end()) continue;
    const std::size_t host_granularity = d_.pages.host_granularity();
    if (host_granularity == 0 || k->page % host_granularity != 0) continue;
    for (std::size_t p = 0; p < k->pages; ++p) {
      const std::size_t device_slots = static_cast<std::size_t>(k->buffers) - k->hosted(p);
      if (k->refs[p] == 0 || device_slots == 0) continue;
      plan.emplace_back(k.get(), p);
      need += device_slots * k->page;
    }
  }
  if (plan.empty()) return 0;
  if (need > room)
    throw out_of_memory(fmt::format("spill: device {}: the KV pools' {} bytes would pass spill_limit_mb ({} more "
                                    "allowed); nothing moved", d_.device, need, room));
  // 1. Every host page first: one per buffer of each page (0 where the slot is on one already).
  // Each page a move uses is zeroed here; whatever is left at the end is released, once.
  std::vector<phys_handle_t> host;
  Undo release_unused([&] {
    for (phys_handle_t h : host)
      if (h != 0) d_.pages.release_or_orphan(h);
  });
  for (const auto& [k, p] : plan)
    host.resize(host.size() + static_cast<std::size_t>(k->buffers), 0);
  std::size_t at = 0;
  for (const auto& [k, p] : plan) {
    for (std::size_t b = 0; b < static_cast<std::size_t>(k->buffers); ++b, ++at) {
      if (k->on_host[p * static_cast<std::size_t>(k->buffers) + b] != 0) continue;
      host[at] = d_.pages.create_host(k->page);
      if (host[at] == 0)
        throw out_of_memory(fmt::format("spill: device {}: the host cannot give {} bytes of host pages for the "
                                        "KV pools; nothing moved", d_.device, need));
    }
  }
  // 2. The moves; a failure moves back the pages moved.
  std::size_t done = 0;
  at = 0;
  try {
    for (; done < plan.size(); ++done) {
      KvPool& k = *plan[done].first;
      if (!move_page(k, plan[done].second, true, host.data() + at))
        throw out_of_memory(fmt::format("spill: device {}: no room for a remap (address space for its scratch "
                                        "range); nothing moved", d_.device));
      at += static_cast<std::size_t>(k.buffers);
    }
  } catch (...) {
    for (std::size_t j = done; j-- > 0;) {
      try {
        (void)move_page(*plan[j].first, plan[j].second, false, nullptr);  // (a slot that fails stays spilled)
      } catch (...) {
      }
    }
    throw;  // release_unused gives back the host pages no move kept
  }
  release_unused.done();
  return need;
}

bool KvPools::unspill(const std::vector<std::uint16_t>& tags, bool all) {
  bool back = true;
  for (auto& [id, k] : pools_) {
    if (k->host_pages == 0 || (!all && std::find(tags.begin(), tags.end(), k->tag) == tags.end())) continue;
    for (std::size_t p = 0; p < k->pages && k->host_pages != 0; ++p) {
      if (k->hosted(p) == 0) continue;
      if (!move_page(*k, p, false, nullptr)) {
        back = false;
        break;
      }
    }
  }
  return back;
}

std::size_t KvPools::spillable_bytes(const std::vector<std::uint16_t>& tags) const noexcept {
  std::size_t n = 0;
  for (const auto& [id, k] : pools_) {
    if (!k->spill || k->asleep || std::find(tags.begin(), tags.end(), k->tag) == tags.end()) continue;
    for (std::size_t p = 0; p < k->pages; ++p)
      if (k->refs[p] != 0) n += (static_cast<std::size_t>(k->buffers) - k->hosted(p)) * k->page;
  }
  return n;
}

std::size_t KvPools::spilled_bytes(std::uint16_t tag) const noexcept {
  std::size_t n = 0;
  for (const auto& [id, k] : pools_)
    if (tag == 0 || k->tag == tag) n += k->host_slots * k->page;
  return n;
}

std::size_t KvPools::mapped_bytes() const noexcept {
  std::size_t n = zero_ != 0 ? zero_bytes_ : 0;  // the shared zero page, once
  for (const auto& [id, k] : pools_) n += k->device_bytes();
  return n;
}

std::vector<KvPoolInfo> KvPools::infos(const std::function<std::string(std::uint16_t)>& tag_name) const {
  std::vector<KvPoolInfo> out;
  for (const auto& [id, k] : pools_) {
    KvPoolInfo i;
    i.id = id;
    i.tag = tag_name(k->tag);
    i.buffers = k->buffers;
    i.block_bytes = k->block_bytes;
    i.max_blocks = k->max_blocks;
    i.page = k->page;
    i.live_blocks = k->live_blocks;
    i.mapped_bytes = k->device_bytes();
    i.used_bytes = k->used_pages * k->page_set_bytes();
    i.peak_bytes = k->peak_mapped_pages * k->page_set_bytes();
    i.spilled_bytes = k->host_slots * k->page;
    i.host_backup_bytes = k->host_bytes;
    i.backup_file_bytes = k->file_data;
    i.reserve = k->reserve;
    i.limit = k->limit;
    i.maps = k->maps;
    i.unmaps = k->unmaps;
    i.asleep = k->asleep;
    out.push_back(std::move(i));
  }
  return out;
}

KvPoolInfo KvPools::info(int pool) {
  std::lock_guard lock(d_.lock);
  (void)get(pool);
  for (KvPoolInfo& i : infos([this](std::uint16_t t) { return residency_.tag_name(t); }))
    if (i.id == pool) return i;
  return {};
}

bool KvPools::map_zero(KvPool& k, std::size_t p, std::size_t b) noexcept {
  char* at = k.base[b] + p * k.page;
  try {
    d_.pages.unmap_strays_in(at, k.page);
    if (!d_.pages.map_pieces(at, {MapPiece{zero_, k.page}})) return false;
  } catch (...) {
    return false;
  }
  try {
    if (d_.pages.protect_read_only(at, k.page)) return true;
  } catch (...) {
  }
  d_.pages.unmap_or_stray(at, k.page);
  return false;
}

bool KvPools::map_zero_everywhere(KvPool& k) {
  const std::size_t nb = static_cast<std::size_t>(k.buffers);
  if (zero_ != 0 && zero_bytes_ < k.page) return false;  // (a larger kv_page_mb than the first pool's)
  const bool made = zero_ == 0;
  if (made) {
    // One page of zeros, made once per device: mapped writable at the pool's first slot, zeroed,
    // then made read-only there; where the back end cannot, no zero page at all.
    zero_ = d_.pages.create(k.page);
    if (zero_ == 0) return false;
    zero_bytes_ = k.page;
    char* at = k.base[0];
    bool ok = false;
    try {
      if (d_.pages.map_pieces(at, {MapPiece{zero_, k.page}})) {
        const std::vector<char> zeros(k.page, 0);
        d_.backend.copy_from_host(d_.device, at, zeros.data(), k.page);
        ok = d_.pages.protect_read_only(at, k.page);
        d_.pages.unmap(at, k.page);
      }
    } catch (...) {
      d_.pages.unmap_or_stray(at, k.page);
      d_.pages.release_or_orphan(zero_);
      zero_ = 0;
      throw;
    }
    if (!ok) {
      d_.pages.release_or_orphan(zero_);
      zero_ = 0;
      return false;
    }
    d_.ledger.kv_mapped(at, k.page);  // counted once, as long as a pool maps it
  }
  ++zero_users_;
  k.zero = true;
  for (std::size_t p = 0; p < k.pages; ++p)
    for (std::size_t b = 0; b < nb; ++b) {
      if (map_zero(k, p, b)) {
        k.zeroed[p * nb + b] = 1;
        continue;
      }
      drop_zero(k);
      throw backend_error(fmt::format("stitch_kv_create: device {}: mapping the shared zero page under slot {} of "
                                      "buffer {} failed (kv_zero_page:True); nothing was created", d_.device, p, b));
    }
  return true;
}

void KvPools::drop_zero(KvPool& k) noexcept {
  if (!k.zero) return;
  const std::size_t nb = static_cast<std::size_t>(k.buffers);
  for (std::size_t i = 0; i < k.zeroed.size(); ++i) {
    if (k.zeroed[i] == 0) continue;
    d_.pages.unmap_or_stray(k.base[i % nb] + (i / nb) * k.page, k.page);
    k.zeroed[i] = 0;
  }
  k.zero = false;
  if (--zero_users_ == 0 && zero_ != 0) {
    d_.pages.release_or_orphan(zero_);
    zero_ = 0;
    d_.ledger.kv_unmapped(nullptr, zero_bytes_);
    zero_bytes_ = 0;
  }
}

std::vector<int> KvPools::ids() {
  std::lock_guard lock(d_.lock);
  std::vector<int> out;
  for (const auto& [id, k] : pools_) out.push_back(id);
  return out;
}

void KvPools::validate() const {
  const std::vector<phys_handle_t>& orphans = d_.pages.orphans();
  for (const auto& entry : pools_) {
    const int id = entry.first;
    const std::unique_ptr<KvPool>& k = entry.second;
    auto broken = [&](const char* what) { invariant_broken(d_.device, fmt::format("KV pool {}: {}", id, what)); };
    std::vector<std::uint32_t> refs(k->pages, 0);
    std::size_t live = 0;
    for (std::size_t i = 0; i < k->max_blocks; ++i) {
      if (!k->is_live(i)) continue;
      ++live;
      for (std::size_t p = k->first_page(i); p <= k->last_page(i); ++p) ++refs[p];
    }
    if (live != k->live_blocks) broken("live blocks miscounted");
    if (refs != k->refs) broken("page references disagree with the live blocks");
    std::size_t mapped = 0, used = 0, hosted_pages = 0, hosted_slots = 0;
    for (std::size_t p = 0; p < k->pages; ++p) {
      const bool m = k->handle[p * static_cast<std::size_t>(k->buffers)] != 0;
      for (int b = 1; b < k->buffers; ++b)
        if ((k->handle[p * static_cast<std::size_t>(k->buffers) + static_cast<std::size_t>(b)] != 0) != m)
          broken("a page is mapped in some buffers only");
      const std::size_t hosts = k->hosted(p);
      mapped += m && hosts == 0 ? 1 : 0;
      hosted_pages += hosts != 0 ? 1 : 0;
      hosted_slots += hosts;
      used += k->refs[p] != 0 ? 1 : 0;
      if (hosts != 0 && !m) broken("a spilled page is unmapped");
      for (int b = 0; b < k->buffers; ++b) {
        const std::size_t i = p * static_cast<std::size_t>(k->buffers) + static_cast<std::size_t>(b);
        if (k->zeroed[i] != 0 && (k->handle[i] != 0 || zero_ == 0)) broken("the zero page lies under a page");
        if (k->handle[i] != 0 && std::find(orphans.begin(), orphans.end(), k->handle[i]) != orphans.end())
          broken("a page's handle is an orphan waiting for its release");
      }
      if (!k->asleep && k->refs[p] != 0 && !m) broken("a page under a live block is unmapped");
    }
    if (k->asleep && mapped != 0) broken("a sleeping pool maps pages");
    if (k->host != nullptr && k->file.is_open()) broken("a backup lies both in host memory and in a file");
    if (!k->asleep && (k->host != nullptr || k->file.is_open())) broken("an awake pool keeps a backup");
    std::size_t in_file = 0;  // (a page freed while asleep leaves the file)
    if (k->asleep && k->file.is_open())
      for (std::size_t p : k->saved) in_file += k->refs[p] != 0 ? k->page_set_bytes() : 0;
    if (k->file_data != in_file) broken("a backup's bytes in its file do not add up");
    if (mapped != k->mapped_pages || used != k->used_pages) broken("pages miscounted");
    if (hosted_pages != k->host_pages || hosted_slots != k->host_slots) broken("spilled pages miscounted");
  }
  int files = 0;
  for (const auto& entry : pools_) files += entry.second->file.is_open() ? 1 : 0;
  if (files != residency_.sleeper().kv_files())
    invariant_broken(d_.device, fmt::format("{} KV backup files open, the staging buffers' count says {}",
                                            files, residency_.sleeper().kv_files()));
}

}  // namespace stitch::detail
