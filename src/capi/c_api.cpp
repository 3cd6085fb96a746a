// capi/c_api.cpp — the C shim (stitch.h) over one process-wide stitch::Allocator.
//
// Every entry point catches everything: no exception crosses the C boundary. The allocator is
// built at first use from STITCH_ALLOC_CONF plus the stitch_configure() calls made before it,
// and deliberately never destroyed (callers may free memory from static destructors).
//
// There is no shutdown: the C API keeps working while the process exits (atexit handlers, static
// destructors, other threads' thread_local destructors), so nothing it touches may be destroyed
// before the process is gone. The allocator and the early configuration are never destroyed;
// the error text lives in a thread_local whose destructor marks it gone, after which errors go
// to a buffer without a destructor (see ErrorText).
#include "stitch/stitch.h"
#include "stitch/kv_pool.hpp"

#include <fmt/format.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "api/entry.hpp"
#include "capi/c_api_testing.hpp"
#include "stitch/allocator.hpp"
#include "stitch/backend.hpp"
#include "stitch/errors.hpp"

namespace {

std::mutex g_init_mutex;  // trivially destructible (libstdc++): usable while the process exits
std::atomic<stitch::Allocator*> g_allocator{nullptr};

// stitch_configure() strings applied before the allocator exists (under g_init_mutex). Never
// destroyed: a static destructor may still configure.
std::string& early_conf() {
  static auto* conf = new std::string;
  return *conf;
}

// This thread's last error. A thread's thread_local objects are destroyed before the process's
// static destructors run, and those may still call the C API; once `t_error` is destroyed its
// destructor sets `t_error_gone` (no destructor of its own, so it stays readable) and errors go
// to `t_error_tail` (no destructor either; long messages are cut there).
thread_local bool t_error_gone = false;
thread_local bool t_error_set = false;  // an error is stored (kept until the next failure)
thread_local char t_error_tail[512];
struct ErrorText {
  std::string text;
  ~ErrorText() { t_error_gone = true; }
};
thread_local ErrorText t_error;

void set_error(const char* message) noexcept {
  t_error_set = true;
  if (!t_error_gone) {
    try {
      t_error.text = message;
      return;
    } catch (...) {  // no memory for the text: keep a cut copy
    }
  }
  std::strncpy(t_error_tail, message, sizeof t_error_tail - 1);
  t_error_tail[sizeof t_error_tail - 1] = '\0';
  if (!t_error_gone) t_error.text.clear();
}

// Only stitch_clear_error() clears: like errno, the text of the last failure stays until a later
// failure replaces it, so a program that reads statistics right after an OOM still has the report.
void clear_error() noexcept {
  if (!t_error_set) return;
  t_error_set = false;
  t_error_tail[0] = '\0';
  if (!t_error_gone) t_error.text.clear();
}

const char* last_error() noexcept {
  if (!t_error_set) return "";
  return t_error_gone || t_error.text.empty() ? t_error_tail : t_error.text.c_str();
}

stitch::Config base_config() {
  const char* env = std::getenv("STITCH_ALLOC_CONF");
  try {
    return stitch::Config::parse(env != nullptr ? env : "");
  } catch (const stitch::config_error& e) {
    throw stitch::config_error(fmt::format("STITCH_ALLOC_CONF: {}", e.what()));
  }
}

// The configuration the allocator has, or will be built from when it does not exist yet.
stitch::Config effective_config() {
  if (stitch::Allocator* a = g_allocator.load(std::memory_order_acquire)) return a->config();
  std::lock_guard lock(g_init_mutex);
  if (stitch::Allocator* a = g_allocator.load(std::memory_order_relaxed)) return a->config();
  return stitch::Config::parse(early_conf(), base_config());
}

// snprintf-style copy of `text` into buf (at most cap-1 characters and a NUL); its length.
size_t copy_out(const std::string& text, char* buf, size_t cap) noexcept {
  if (buf != nullptr && cap > 0) {
    const size_t n = text.size() < cap - 1 ? text.size() : cap - 1;
    std::memcpy(buf, text.data(), n);
    buf[n] = '\0';
  }
  return text.size();
}

// fork(): a child never finds g_init_mutex held by a thread that the fork left behind (the
// allocator itself refuses in a child, core/fork_guard.hpp; a child with none creates its own).
void guard_init_mutex_over_fork() {
  static const int registered = pthread_atfork([] { g_init_mutex.lock(); },
                                               [] { g_init_mutex.unlock(); },
                                               [] { g_init_mutex.unlock(); });
  (void)registered;
}

[[gnu::noinline]] stitch::Allocator& create_allocator() {
  guard_init_mutex_over_fork();
  std::lock_guard lock(g_init_mutex);
  stitch::Allocator* a = g_allocator.load(std::memory_order_relaxed);
  if (a == nullptr) {
    const stitch::Config config = stitch::Config::parse(early_conf(), base_config());
    a = new stitch::Allocator(config);  // throws: stays uninitialised, the next call retries
    g_allocator.store(a, std::memory_order_release);
  }
  return *a;
}

stitch::Allocator& allocator() {
  stitch::Allocator* a = g_allocator.load(std::memory_order_acquire);
  if (a != nullptr) [[likely]] return *a;
  return create_allocator();
}

// Calls the allocator's `reset` on `device`, or on every device for -1; 0.
int on_devices(int device, void (stitch::Allocator::*reset)(int)) {
  stitch::Allocator& a = allocator();
  if (device != -1) {
    (a.*reset)(device);
    return 0;
  }
  for (int d = 0; d < a.device_count(); ++d) (a.*reset)(d);
  return 0;
}

// Runs `fn`, turning any exception into t_error and `fail`. Success leaves t_error as it was.
template <typename Fn, typename R>
R guarded(Fn&& fn, R fail) noexcept {
  try {
    return fn();
  } catch (const std::exception& e) {
    set_error(e.what());
  } catch (...) {
    set_error("stitch: unknown error");
  }
  return fail;
}


// The allocator at its first use (made now), or nullptr with the error set.
[[gnu::noinline]] stitch::Allocator* first_use() noexcept {
  return guarded([]() -> stitch::Allocator* { return &create_allocator(); },
                 static_cast<stitch::Allocator*>(nullptr));
}

// stitch_malloc before the allocator exists, or for a device it does not have.
[[gnu::noinline]] void* malloc_first(size_t size, int device, void* stream) noexcept {
  stitch::Allocator* a = first_use();
  if (a == nullptr) return nullptr;
  return guarded([&]() -> void* { return a->allocate(size, stream, device); },
                 static_cast<void*>(nullptr));
}

// stitch_free before the allocator exists, or for a device it does not have.
[[gnu::noinline]] void free_first(void* ptr, size_t size, int device, void* stream) noexcept {
  stitch::Allocator* a = first_use();
  if (a == nullptr) return;
  guarded([&] {
    a->deallocate(ptr, size, device, stream);
    return 0;
  }, 0);
}

}  // namespace

namespace stitch::detail {

std::unique_ptr<Allocator> capi_exchange_allocator(std::unique_ptr<Allocator> next) {
  std::lock_guard lock(g_init_mutex);
  early_conf().clear();
  return std::unique_ptr<Allocator>(g_allocator.exchange(next.release(), std::memory_order_acq_rel));
}

}  // namespace stitch::detail

namespace stitch {
Allocator& process_allocator() { return allocator(); }
}  // namespace stitch

extern "C" {

// stitch_malloc and stitch_free: with the allocator made, the cache hit is inlined here
// (api/entry.hpp), and only what it leaves makes one more call.
void* stitch_malloc(size_t size, int device, void* stream) {
  if (stitch::Allocator* a = g_allocator.load(std::memory_order_acquire)) [[likely]] {
    if (stitch::DeviceAllocator* d = a->device_or_null(device)) [[likely]] {
      return guarded([&]() -> void* { return stitch::allocate_on(*a, *d, size, stream); },
                     static_cast<void*>(nullptr));
    }
  }
  return malloc_first(size, device, stream);
}

void stitch_free(void* ptr, size_t size, int device, void* stream) {
  if (ptr == nullptr) return;
  if (stitch::Allocator* a = g_allocator.load(std::memory_order_acquire)) [[likely]] {
    if (stitch::DeviceAllocator* d = a->device_or_null(device)) [[likely]] {
      guarded([&] {
        stitch::deallocate_on(*a, *d, ptr, size, stream);
        return 0;
      }, 0);
      return;
    }
  }
  free_first(ptr, size, device, stream);
}

int stitch_configure(const char* conf) {
  return guarded([&] {
    if (conf == nullptr) throw stitch::invalid_argument("stitch_configure: conf is NULL");
    if (stitch::Allocator* a = g_allocator.load(std::memory_order_acquire)) {
      a->configure(conf);
      return 0;
    }
    std::lock_guard lock(g_init_mutex);
    if (stitch::Allocator* a = g_allocator.load(std::memory_order_relaxed)) {
      a->configure(conf);
      return 0;
    }
    std::string& early = early_conf();
    std::string combined = early.empty() ? conf : early + "," + conf;
    // Validated now (the backup directory too), applied at first use.
    const stitch::Config next = stitch::Config::parse(combined, base_config());
    if (!next.backup_dir.empty()) stitch::check_backup_dir(next.backup_dir);
    early = std::move(combined);
    return 0;
  }, 1);
}

int stitch_record_stream(void* ptr, void* stream) {
  return guarded([&] {
    allocator().record_stream(ptr, stream);
    return 0;
  }, 1);
}

int stitch_pin(void* ptr) {
  return guarded([&] {
    allocator().pin(ptr);
    return 0;
  }, 1);
}

int stitch_unpin(void* ptr) {
  return guarded([&] {
    allocator().unpin(ptr);
    return 0;
  }, 1);
}

int stitch_empty_cache(int device) {
  return guarded([&] {
    allocator().empty_cache(device);
    return 0;
  }, 1);
}

int stitch_trim(int device, size_t keep_bytes) {
  return guarded([&] {
    allocator().trim(device, keep_bytes);
    return 0;
  }, 1);
}

int stitch_region_begin(const char* tag, int flags) {
  return guarded([&] {
    if (tag == nullptr) throw stitch::invalid_argument("stitch_region_begin: tag is NULL");
    if (flags < 0)
      throw stitch::invalid_argument(fmt::format("stitch_region_begin: flags {} are negative", flags));
    allocator().begin_region(tag, static_cast<unsigned>(flags));
    return 0;
  }, 1);
}

int stitch_spill(int device, const char* tags, size_t bytes) {
  return guarded([&] {
    (void)allocator().spill(device, tags == nullptr ? std::nullopt : std::optional<std::string_view>(tags),
                            bytes);
    return 0;
  }, 1);
}

int stitch_unspill(int device, const char* tags) {
  return guarded([&] {
    allocator().unspill(device, tags == nullptr ? std::nullopt : std::optional<std::string_view>(tags));
    return 0;
  }, 1);
}

int stitch_region_end(void) {
  return guarded([&] {
    allocator().end_region();
    return 0;
  }, 1);
}

int stitch_sleep(int device, const char* tags, const char* backup_tags) {
  return guarded([&] {
    allocator().sleep(device, tags == nullptr ? std::nullopt : std::optional<std::string_view>(tags),
                      backup_tags == nullptr ? std::string_view() : std::string_view(backup_tags));
    return 0;
  }, 1);
}

int stitch_wake(int device, const char* tags) {
  return guarded([&] {
    allocator().wake(device, tags == nullptr ? std::nullopt : std::optional<std::string_view>(tags));
    return 0;
  }, 1);
}

int stitch_backup_progress(int device, uint64_t* done, uint64_t* total) {
  return guarded([&] {
    const stitch::Allocator::BackupProgress p = allocator().backup_progress(device);
    if (done != nullptr) *done = p.done;
    if (total != nullptr) *total = p.total;
    return p.op;
  }, -1);
}

size_t stitch_residency(int device, char* buf, size_t cap) {
  if (buf != nullptr && cap > 0) buf[0] = '\0';
  return guarded([&]() -> size_t { return copy_out(allocator().residency(device), buf, cap); },
                 size_t{0});
}

int stitch_set_memory_fraction(double fraction, int device) {
  return guarded([&] {
    allocator().set_memory_fraction(fraction, device);
    return 0;
  }, 1);
}

int64_t stitch_stat(int device, const char* key) {
  return guarded([&]() -> int64_t {
    if (key == nullptr) throw stitch::invalid_argument("stitch_stat: key is NULL");
    auto v = allocator().stat(device, key);
    if (!v) throw stitch::invalid_argument(fmt::format("stitch_stat: unknown key '{}'", key));
    return *v;
  }, int64_t{-1});
}

size_t stitch_stat_count(void) { return stitch::DeviceStats::keys().size(); }

const char* stitch_stat_key(size_t index, int* flags) {
  const auto& keys = stitch::DeviceStats::keys();
  if (index >= keys.size()) return nullptr;
  if (flags != nullptr)
    *flags = (keys[index].torch ? STITCH_STAT_TORCH : 0) |
             (keys[index].memory_stats ? STITCH_STAT_MEMORY_STATS : 0);
  return keys[index].name;
}

int64_t stitch_stats(int device, int64_t* values, size_t cap) {
  return guarded([&]() -> int64_t {
    const std::size_t n = stitch::DeviceStats::keys().size();
    if (values == nullptr && cap != 0) throw stitch::invalid_argument("stitch_stats: values is NULL");
    const stitch::DeviceStats stats = allocator().stats(device);
    if (cap >= n) {
      stats.values(values);
    } else if (cap > 0) {
      std::vector<std::int64_t> all(n);
      stats.values(all.data());
      std::copy(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(cap), values);
    }
    return static_cast<int64_t>(n);
  }, int64_t{-1});
}

int stitch_reset_peak_stats(int device) {
  return guarded([&] { return on_devices(device, &stitch::Allocator::reset_peak_stats); }, 1);
}

int stitch_reset_accumulated_stats(int device) {
  return guarded([&] { return on_devices(device, &stitch::Allocator::reset_accumulated_stats); },
                 1);
}

double stitch_memory_fraction(int device) {
  return guarded([&] { return allocator().memory_fraction(device); }, -1.0);
}

int stitch_record_history(int enabled, size_t max_entries) {
  return guarded([&] {
    if (stitch::Allocator* a = g_allocator.load(std::memory_order_acquire)) {
      a->record_history(enabled != 0, max_entries);
      return 0;
    }
    // Before the allocator exists: a configuration like any other (the backend stays open).
    std::string conf = enabled != 0 ? "record_history:True" : "record_history:False";
    if (max_entries != 0) conf += ",max_entries:" + std::to_string(max_entries);
    return stitch_configure(conf.c_str());  // sets the error itself
  }, 1);
}

int stitch_dump_snapshot(const char* path) {
  return guarded([&] {
    if (path == nullptr) throw stitch::invalid_argument("stitch_dump_snapshot: path is NULL");
    allocator().dump_snapshot(path);
    return 0;
  }, 1);
}

size_t stitch_memory_summary(int device, char* buf, size_t cap) {
  if (buf != nullptr && cap > 0) buf[0] = '\0';
  return guarded([&]() -> size_t { return copy_out(allocator().memory_summary(device), buf, cap); },
                 size_t{0});
}

size_t stitch_config(char* buf, size_t cap) {
  if (buf != nullptr && cap > 0) buf[0] = '\0';
  return guarded([&]() -> size_t { return copy_out(effective_config().to_string(), buf, cap); },
                 size_t{0});
}

size_t stitch_ipc_export(void* ptr, char* buf, size_t cap) {
  if (buf != nullptr && cap > 0) buf[0] = '\0';
  return guarded([&]() -> size_t {
    // The buffer is checked before anything is pinned or exported: the size query (no buffer)
    // answers from the block's layout alone.
    const size_t need = allocator().export_size(ptr) + 1;
    if (buf == nullptr || cap == 0) return need;
    if (cap < need)
      throw stitch::invalid_argument("stitch_ipc_export: the handle needs up to " + std::to_string(need) +
                                     " bytes (with its NUL), the buffer has " + std::to_string(cap) +
                                     " (stitch_ipc_export(ptr, NULL, 0) says how many); nothing was exported");
    return copy_out(allocator().export_block(ptr, cap), buf, cap);
  }, size_t{0});
}

void* stitch_ipc_import(const char* handle, int device) {
  return guarded([&]() -> void* {
    if (handle == nullptr) throw stitch::invalid_argument("stitch_ipc_import: handle is NULL");
    return allocator().import_block(handle, device);
  }, static_cast<void*>(nullptr));
}

int stitch_ipc_close(void* ptr) {
  return guarded([&] {
    allocator().close_block(ptr);
    return 0;
  }, 1);
}

int stitch_device_count(void) {
  return guarded([&] {
    if (stitch::Allocator* a = g_allocator.load(std::memory_order_acquire)) return a->device_count();
    return stitch::probe_device_count(effective_config());
  }, -1);
}

const char* stitch_last_error(void) { return last_error(); }

void stitch_clear_error(void) { clear_error(); }

}  // extern "C"

// ---- KV pools (docs/kv.md) ---------------------------------------------------------------------

struct stitch_kv_pool {
  stitch::KvPool pool;
};

namespace {
stitch::KvPool& kv_of(stitch_kv_pool* pool) {
  if (pool == nullptr) throw stitch::invalid_argument("KV pool is NULL");
  return pool->pool;
}
}  // namespace

stitch_kv_pool* stitch_kv_create(int device, int buffers, size_t block_bytes, size_t max_blocks,
                                 const char* tag, unsigned flags) {
  return guarded([&]() -> stitch_kv_pool* {
    return new stitch_kv_pool{stitch::KvPool(allocator(), device, buffers, block_bytes, max_blocks,
                                             tag == nullptr ? "kv" : tag, flags)};
  }, static_cast<stitch_kv_pool*>(nullptr));
}

void* stitch_kv_buffer(stitch_kv_pool* pool, int buffer) {
  return guarded([&]() -> void* { return kv_of(pool).buffer(buffer); }, static_cast<void*>(nullptr));
}

int stitch_kv_alloc(stitch_kv_pool* pool, size_t n, int64_t* ids) {
  return guarded([&] {
    kv_of(pool).alloc(n, ids);
    return 0;
  }, 1);
}

int stitch_kv_free(stitch_kv_pool* pool, const int64_t* ids, size_t n) {
  return guarded([&] {
    kv_of(pool).free(ids, n);
    return 0;
  }, 1);
}

int stitch_kv_set_limit(stitch_kv_pool* pool, size_t bytes) {
  return guarded([&] {
    kv_of(pool).set_limit(bytes);
    return 0;
  }, 1);
}

size_t stitch_kv_available(stitch_kv_pool* pool) {
  return guarded([&]() -> size_t { return kv_of(pool).available(); }, size_t{0});
}

int stitch_kv_trim(stitch_kv_pool* pool) {
  return guarded([&] {
    kv_of(pool).trim();
    return 0;
  }, 1);
}

int stitch_kv_destroy(stitch_kv_pool* pool) {
  return guarded([&] {
    kv_of(pool).destroy();
    delete pool;
    return 0;
  }, 1);
}
