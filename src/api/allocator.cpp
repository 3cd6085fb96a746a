// api/allocator.cpp — stitch::Allocator: one DeviceAllocator per device over one backend, plus
// the checks on caller input (bad device, unknown pointer, double free, wrong size) and the
// out-of-memory report.
#include "stitch/allocator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "core/region_stack.hpp"
#include "core/size_policy.hpp"
#include "config/keys.hpp"
#include "api/entry.hpp"
#include "core/device_allocator.hpp"
#include "diagnostics/snapshot_writer.hpp"
#include "replay/what_if.hpp"
#include "stitch/errors.hpp"

namespace stitch {

namespace {
/// spill:all's rule, named on stderr once per process when an allocator takes the setting (at
/// its construction or a configure()): the automatic spill moves live memory of any stream.
void name_spill_rule(const Config& config) {
  static std::atomic<bool> named{false};
  if (config.spill != Config::Spill::all || named.exchange(true)) return;
  std::fprintf(stderr,
               "stitch: spill:all moves live memory of any stream to host pages when a request would "
               "fail, once the device is synchronized and its streams show no new work; it relies on no "
               "other host thread launching work on stitch memory while an allocation runs "
               "(docs/spill.md, \"When spill:all is safe\")\n");
}
}  // namespace

Allocator::Allocator(const Config& config) : Allocator(config, make_backend(config)) {}

Allocator::Allocator(const Config& config, std::shared_ptr<Backend> backend)
    : config_(config), backend_(std::move(backend)) {
  if (!backend_) throw invalid_argument("stitch::Allocator needs a backend");
  if (!config_.backup_dir.empty()) check_backup_dir(config_.backup_dir);
  device_count_ = backend_->device_count();
  if (device_count_ <= 0)
    throw backend_error(fmt::format("backend:{} reports no device", backend_->name()));
  devices_ = std::make_unique<std::unique_ptr<DeviceAllocator>[]>(static_cast<std::size_t>(device_count_));
  for (int d = 0; d < device_count_; ++d) {
    devices_[static_cast<std::size_t>(d)] = std::make_unique<DeviceAllocator>(d, *backend_, config_);
    devices_[static_cast<std::size_t>(d)]->set_owner(this);
  }
  name_spill_rule(config_);
}

Allocator::~Allocator() = default;

int Allocator::device_count() const noexcept { return device_count_; }

void Allocator::throw_bad_device(int device) const {
  throw invalid_argument(fmt::format("invalid device {} (backend:{} has {} device{})", device,
                                     backend_->name(), device_count_, device_count_ == 1 ? "" : "s"));
}

DeviceAllocator& Allocator::device(int device) const { return checked_device(device); }

void* Allocator::allocate(std::size_t bytes, stream_t stream, int device) {
  return allocate_on(*this, checked_device(device), bytes, stream);
}

void* Allocator::allocate_unhit(DeviceAllocator& d, bool plain, std::size_t bytes, stream_t stream) {
  // The device lock: at once where the plain path ran, else after the cache hit, waiting for
  // the shard's lock this time (DeviceAllocator::malloc).
  const DeviceAllocator::Allocation a = plain ? d.malloc_locked(bytes, stream) : d.malloc(bytes, stream);
  if (a.failure != nullptr) [[unlikely]] fail_allocation(a.failure);
  return a.ptr;
}

void Allocator::fail_allocation(detail::OomCapture* failure) {
  const std::unique_ptr<detail::OomCapture> oom(failure);
  detail::on_out_of_memory(*this);  // oom_snapshot: best effort, never masks the OOM
  // The what-if check, now that the device lock is released.
  std::string report = replay::oom_message(*oom);
  if (report.empty()) throw out_of_memory("CUDA out of memory (the report could not be written).");
  throw out_of_memory(std::move(report));
}

void Allocator::reject_free(DeviceAllocator& counter, std::string message) const {
  counter.reports().count_invalid_free();
  InvalidFreePolicy policy;
  {
    std::lock_guard lock(config_mutex_);
    policy = config_.on_invalid_free;
  }
  if (policy == InvalidFreePolicy::abort) {
    std::fprintf(stderr, "stitch: %s (on_invalid_free:abort)\n", message.c_str());
    std::abort();
  }
  throw invalid_argument(std::move(message));
}

void Allocator::deallocate(void* ptr) { free_any_device(ptr, nullptr); }

bool Allocator::count_failed_free(void* ptr) noexcept {
  try {
    const std::optional<BlockInfo> info = find(ptr);
    if (!info) return false;
    checked_device(info->device).reports().count_failed_free();
    return true;
  } catch (...) {  // (a forked child's allocator refuses: nothing to count in)
    return false;
  }
}

void Allocator::deallocate(void* ptr, stream_t stream) { free_any_device(ptr, &stream); }

void Allocator::free_any_device(void* ptr, const stream_t* stream) {
  if (ptr == nullptr) return;
  // Each device's pair (device 0's on its own: most programs have one device), waiting for no
  // lock another thread holds. The frame calls nothing but what the pairs leave, so that a pair
  // keeps its values in registers.
  const detail::CacheHit::Given g = devices_[0]->hits().give<false>(ptr, nullptr, stream);
  if (g.done) [[likely]] return;
  if (g.found != nullptr) return free_any_device_unhit(ptr, stream, 0, g.found);
  for (int d = 1; d < device_count_; ++d) {
    const detail::CacheHit::Given h = devices_[static_cast<std::size_t>(d)]->hits().give<false>(ptr, nullptr, stream);
    if (h.done) return;
    if (h.found != nullptr) return free_any_device_unhit(ptr, stream, d, h.found);
  }
  free_any_device_locked(ptr, stream, true);
}

void Allocator::free_any_device_unhit(void* ptr, const stream_t* stream, int device, detail::Block* found) {
  // The plain path of `device`, where its pair kept the block's shard lock.
  if (devices_[static_cast<std::size_t>(device)]->hits().free_plain_inline(*found, ptr, nullptr, stream, nullptr) ==
      detail::CacheHit::Freed::yes) [[likely]]
    return;
  free_any_device_locked(ptr, stream, false);
}

void Allocator::free_any_device_locked(void* ptr, const stream_t* stream, bool hits_again) {
  // Not found, or a shard lock was busy: the cache hit again, waiting for the lock this time.
  for (int d = 0; hits_again && d < device_count_; ++d) {
    detail::CacheHit& hits = devices_[static_cast<std::size_t>(d)]->hits();
    const detail::CacheHit::Given g = hits.give(ptr, nullptr, stream);
    if (g.done || (g.found != nullptr && hits.free_plain(*g.found, ptr, nullptr, stream, nullptr) ==
                                             detail::CacheHit::Freed::yes))
      return;
  }
  // The device lock of each device, which also answers for a pointer that is not live anywhere.
  for (int d = 0; d < device_count_; ++d) {
    if (devices_[static_cast<std::size_t>(d)]->free(ptr, nullptr, stream) ==
        FreeStatus::freed)
      return;
  }
  reject_free(*devices_[0],
              fmt::format("free of {}: not a live allocation of stitch (unknown pointer, interior "
                          "pointer or double free)", ptr));
}

void Allocator::deallocate(void* ptr, std::size_t bytes, int device, stream_t stream) {
  if (ptr == nullptr) return;
  deallocate_on(*this, checked_device(device), ptr, bytes, stream);
}

void Allocator::reject_sized_free(DeviceAllocator& home, bool wrong_size, void* ptr,
                                  std::size_t bytes, int device, std::size_t actual) const {
  if (wrong_size)
    reject_free(home, fmt::format("free of {} with size {}, but it was allocated with size {}; "
                                  "nothing was freed", ptr, bytes, actual));
  for (int d = 0; d < device_count_; ++d) {
    if (d != device && devices_[static_cast<std::size_t>(d)]->find(ptr))
      reject_free(*devices_[static_cast<std::size_t>(d)],  // counted by the owner
                  fmt::format("free of {} on device {}, but it was allocated on device {}; "
                              "nothing was freed", ptr, device, d));
  }
  reject_free(home,
              fmt::format("free of {} on device {}: not a live allocation of stitch (unknown "
                          "pointer, interior pointer or double free)", ptr, device));
}

void Allocator::record_stream(void* ptr, stream_t stream) {
  for (int d = 0; d < device_count_; ++d)
    if (devices_[static_cast<std::size_t>(d)]->record_stream(ptr, stream)) return;
  throw invalid_argument(fmt::format("record_stream of {}: not a live allocation of stitch", ptr));
}

void* Allocator::allocate_at(void* addr, std::size_t bytes, stream_t stream, int device,
                             std::size_t block_bytes) {
  DeviceAllocator& d = checked_device(device);
  if (reinterpret_cast<std::uintptr_t>(addr) % 512 != 0)
    throw invalid_argument(fmt::format("allocate_at {}: the address must be aligned to 512 bytes", addr));
  if (bytes == 0) return nullptr;
  if (block_bytes == 0) block_bytes = detail::round_size(bytes, config().roundup_power2_divisions);
  if (block_bytes < bytes || block_bytes % 512 != 0)
    throw invalid_argument(fmt::format("allocate_at {}: a block of {} bytes cannot serve {}", addr, block_bytes, bytes));
  return d.placement().allocate_at(addr, block_bytes, bytes, stream);
}

void Allocator::pin(void* ptr) {
  for (int d = 0; d < device_count_; ++d)
    if (devices_[static_cast<std::size_t>(d)]->pin(ptr, true)) return;
  throw invalid_argument(fmt::format("pin of {}: not a live allocation of stitch", ptr));
}

void Allocator::unpin(void* ptr) {
  for (int d = 0; d < device_count_; ++d)
    if (devices_[static_cast<std::size_t>(d)]->pin(ptr, false)) return;
  throw invalid_argument(fmt::format("unpin of {}: not a live allocation of stitch", ptr));
}

std::optional<BlockInfo> Allocator::find(const void* ptr) const {
  for (int d = 0; d < device_count_; ++d)
    if (auto info = devices_[static_cast<std::size_t>(d)]->find(ptr)) return info;
  return std::nullopt;
}

void Allocator::empty_cache(int device) {
  if (device == -1) {
    for (int d = 0; d < device_count_; ++d) devices_[static_cast<std::size_t>(d)]->empty_cache();
  } else {
    checked_device(device).empty_cache();
  }
}

void Allocator::set_memory_fraction(double fraction, int device) {
  checked_device(device).set_memory_fraction(fraction);
}

Config Allocator::config() const {
  std::lock_guard lock(config_mutex_);
  return config_;
}

void Allocator::configure(std::string_view conf) {
  std::lock_guard lock(config_mutex_);
  configure_locked(conf);
}

void Allocator::configure_locked(std::string_view conf) {
  std::vector<std::string> given;
  Config next = Config::parse(conf, config_, &given);
  for (const detail::KeySpec& key : detail::config_keys()) {
    if (key.fixed && key.print(next) != key.print(config_))
      throw config_error(fmt::format(
          "stitch config: {} is fixed once the allocator exists (it is {}); only tunables can "
          "change", key.name, key.print(config_).empty() ? std::string("the default") : key.print(config_)));
  }
  const bool fraction_given =
      std::find(given.begin(), given.end(), "per_process_memory_fraction") != given.end();
  if (std::find(given.begin(), given.end(), "backup_dir") != given.end() && !next.backup_dir.empty())
    check_backup_dir(next.backup_dir);
  for (int d = 0; d < device_count_; ++d)
    devices_[static_cast<std::size_t>(d)]->set_config(next, fraction_given);
  config_ = std::move(next);
  name_spill_rule(config_);
}

DeviceStats Allocator::stats(int device) const { return checked_device(device).reports().stats(); }

std::optional<std::int64_t> Allocator::stat(int device, std::string_view key) const {
  return checked_device(device).reports().stats().get(key);
}

void Allocator::reset_peak_stats(int device) { checked_device(device).reports().reset_peak_stats(); }

double Allocator::memory_fraction(int device) const {
  return checked_device(device).memory_fraction();
}

void Allocator::begin_allocate_to_pool(int device, PoolId id, StreamFilter filter) {
  // Begun inside a region: the pool (a graph's) carries the region's tag and sleeps with it.
  std::uint16_t tag = 0;
  bool backup = false;
  if (const detail::RegionFrame* region = detail::innermost_region(this)) {
    tag = region->tag;
    backup = region->backup;
  }
  DeviceAllocator& d = checked_device(device);
  if (tag != 0) d.residency().name_tag(tag, tag_name(tag));
  d.pool_routes().begin_allocate_to_pool(id, std::move(filter), tag, backup);
}

void Allocator::end_allocate_to_pool(int device, PoolId id) {
  checked_device(device).pool_routes().end_allocate_to_pool(id);
}

void Allocator::release_pool(int device, PoolId id) { checked_device(device).pool_routes().release_pool(id); }

void Allocator::set_pool_no_split(int device, PoolId id) { checked_device(device).pool_routes().set_no_split(id); }

void Allocator::reset_accumulated_stats(int device) {
  checked_device(device).reports().reset_accumulated_stats();
}

Snapshot Allocator::snapshot() const {
  Snapshot snap;
  for (int d = 0; d < device_count_; ++d) {
    DeviceAllocator& dev = *devices_[static_cast<std::size_t>(d)];
    snap.device_traces.push_back(dev.reports().snapshot(snap.segments));
    for (const int id : dev.kv().ids()) {
      const detail::KvPoolInfo k = dev.kv().info(id);
      snap.kv_pools.push_back(KvPoolSnapshot{d, k.id, k.tag, k.buffers, k.block_bytes, k.max_blocks, k.page,
                                             k.live_blocks, k.mapped_bytes, k.used_bytes, k.asleep});
    }
  }
  const Config c = config();
  snap.settings = c.source;
  snap.max_split_size = c.max_split_size;
  snap.garbage_collection_threshold = c.garbage_collection_threshold;
  snap.expandable_segments = c.expandable_segments;
  snap.roundup_power2_divisions.assign(c.roundup_power2_divisions.begin(), c.roundup_power2_divisions.end());
  return snap;
}

void Allocator::validate() const {
  for (int d = 0; d < device_count_; ++d) devices_[static_cast<std::size_t>(d)]->validate();
}

}  // namespace stitch
