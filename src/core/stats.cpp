// core/stats.cpp — flat-key access to DeviceStats ("allocated_bytes.all.peak", "num_ooms").
#include "stitch/stats.hpp"

#include <array>
#include <string>
#include <utility>
#include <vector>

namespace stitch {

namespace {

using ArrayField = StatArray DeviceStats::*;
using ScalarField = std::int64_t DeviceStats::*;

/// A counter of its own: PyTorch's, stitch's reported by memory_stats() too, or stitch's alone.
enum class Origin { torch, memory_stats, stitch };
struct ScalarKey {
  const char* name;
  ScalarField field;
  Origin origin;
};

constexpr std::array<std::pair<const char*, ArrayField>, 9> kArrays{{
    {"allocation", &DeviceStats::allocation},
    {"segment", &DeviceStats::segment},
    {"active", &DeviceStats::active},
    {"inactive_split", &DeviceStats::inactive_split},
    {"allocated_bytes", &DeviceStats::allocated_bytes},
    {"reserved_bytes", &DeviceStats::reserved_bytes},
    {"active_bytes", &DeviceStats::active_bytes},
    {"inactive_split_bytes", &DeviceStats::inactive_split_bytes},
    {"requested_bytes", &DeviceStats::requested_bytes},
}};
struct SingleKey {
  const char* name;
  Stat DeviceStats::*field;
  Origin origin;
};
constexpr std::array<SingleKey, 6> kSingles{{
    {"oversize_allocations", &DeviceStats::oversize_allocations, Origin::torch},
    {"oversize_segments", &DeviceStats::oversize_segments, Origin::torch},
    {"sleeping_bytes", &DeviceStats::sleeping_bytes, Origin::stitch},
    {"spilled_bytes", &DeviceStats::spilled_bytes, Origin::stitch},
    {"kv_bytes", &DeviceStats::kv_bytes, Origin::stitch},
    {"backup_file_bytes", &DeviceStats::backup_file_bytes, Origin::stitch},
}};
constexpr std::array<ScalarKey, 22> kScalars{{
    {"num_alloc_retries", &DeviceStats::num_alloc_retries, Origin::torch},
    {"num_ooms", &DeviceStats::num_ooms, Origin::torch},
    {"num_sync_all_streams", &DeviceStats::num_sync_all_streams, Origin::torch},
    {"num_device_alloc", &DeviceStats::num_device_alloc, Origin::torch},
    {"num_device_free", &DeviceStats::num_device_free, Origin::torch},
    {"num_invalid_frees", &DeviceStats::num_invalid_frees, Origin::memory_stats},
    {"num_failed_frees", &DeviceStats::num_failed_frees, Origin::stitch},
    {"num_stitches", &DeviceStats::num_stitches, Origin::stitch},
    {"stitched_bytes", &DeviceStats::stitched_bytes, Origin::stitch},
    {"num_page_reuses", &DeviceStats::num_page_reuses, Origin::stitch},
    {"num_page_borrows", &DeviceStats::num_page_borrows, Origin::stitch},
    {"num_cache_hits", &DeviceStats::num_cache_hits, Origin::stitch},
    {"num_compactions", &DeviceStats::num_compactions, Origin::stitch},
    {"num_staged_compactions", &DeviceStats::num_staged_compactions, Origin::stitch},
    {"num_compactions_refused", &DeviceStats::num_compactions_refused, Origin::stitch},
    {"compacted_bytes", &DeviceStats::compacted_bytes, Origin::stitch},
    {"num_device_syncs", &DeviceStats::num_device_syncs, Origin::stitch},
    {"num_sleeps", &DeviceStats::num_sleeps, Origin::stitch},
    {"num_wakes", &DeviceStats::num_wakes, Origin::stitch},
    {"num_spills", &DeviceStats::num_spills, Origin::stitch},
    {"num_unspills", &DeviceStats::num_unspills, Origin::stitch},
    {"max_split_size", &DeviceStats::max_split_size, Origin::torch},
}};
constexpr std::array<const char*, 3> kPools{"all", "small_pool", "large_pool"};
constexpr std::array<const char*, 4> kParts{"current", "peak", "allocated", "freed"};

std::int64_t part(const Stat& s, std::size_t i) {
  switch (i) {
    case 0: return s.current;
    case 1: return s.peak;
    case 2: return s.allocated;
    default: return s.freed;
  }
}

// Splits "a.b.c" at the first dot.
std::pair<std::string_view, std::string_view> head(std::string_view key) {
  const auto dot = key.find('.');
  if (dot == std::string_view::npos) return {key, {}};
  return {key.substr(0, dot), key.substr(dot + 1)};
}

std::optional<std::int64_t> stat_part(const Stat& s, std::string_view name) {
  for (std::size_t i = 0; i < kParts.size(); ++i)
    if (name == kParts[i]) return part(s, i);
  return std::nullopt;
}

}  // namespace

std::optional<std::int64_t> DeviceStats::get(std::string_view key) const {
  auto [name, rest] = head(key);
  for (const ScalarKey& k : kScalars)
    if (name == k.name && rest.empty()) return this->*k.field;
  for (const SingleKey& k : kSingles)
    if (name == k.name) return stat_part(this->*k.field, rest);
  for (const auto& [n, field] : kArrays) {
    if (name != n) continue;
    auto [pool, which] = head(rest);
    for (std::size_t p = 0; p < kPools.size(); ++p)
      if (pool == kPools[p]) return stat_part((this->*field)[p], which);
    return std::nullopt;
  }
  return std::nullopt;
}

void DeviceStats::for_each(const std::function<void(const std::string&, std::int64_t)>& fn) const {
  for (const auto& [n, field] : kArrays)
    for (std::size_t p = 0; p < kPools.size(); ++p)
      for (std::size_t i = 0; i < kParts.size(); ++i)
        fn(std::string(n) + "." + kPools[p] + "." + kParts[i], part((this->*field)[p], i));
  for (const SingleKey& k : kSingles)
    for (std::size_t i = 0; i < kParts.size(); ++i)
      fn(std::string(k.name) + "." + kParts[i], part(this->*k.field, i));
  for (const ScalarKey& k : kScalars) fn(k.name, this->*k.field);
}

const std::vector<DeviceStats::Key>& DeviceStats::keys() {
  // Built once, from for_each: the names stay in `names` for the life of the process.
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    DeviceStats{}.for_each([&](const std::string& name, std::int64_t) { out.push_back(name); });
    return out;
  }();
  static const std::vector<Key> table = [] {
    std::vector<Key> out;
    for (const std::string& name : names) {
      Origin origin = Origin::torch;
      for (const ScalarKey& k : kScalars)
        if (name == k.name) origin = k.origin;
      for (const SingleKey& k : kSingles)
        if (name.rfind(std::string(k.name) + ".", 0) == 0) origin = k.origin;
      out.push_back(Key{name.c_str(), origin == Origin::torch, origin != Origin::stitch});
    }
    return out;
  }();
  return table;
}

void DeviceStats::values(std::int64_t* out) const {
  // for_each's order, without building the names.
  std::size_t i = 0;
  for (const auto& [n, field] : kArrays)
    for (std::size_t p = 0; p < kPools.size(); ++p)
      for (std::size_t k = 0; k < kParts.size(); ++k) out[i++] = part((this->*field)[p], k);
  for (const SingleKey& s : kSingles)
    for (std::size_t k = 0; k < kParts.size(); ++k) out[i++] = part(this->*s.field, k);
  for (const ScalarKey& k : kScalars) out[i++] = this->*k.field;
}

void DeviceStats::reset_peak() noexcept {
  for (const auto& [n, field] : kArrays)
    for (Stat& s : this->*field) s.reset_peak();
  for (const SingleKey& k : kSingles) (this->*k.field).reset_peak();
}

void DeviceStats::reset_accumulated() noexcept {
  for (const auto& [n, field] : kArrays)
    for (Stat& s : this->*field) s.reset_accumulated();
  for (const SingleKey& k : kSingles) (this->*k.field).reset_accumulated();
  for (const ScalarKey& k : kScalars)
    if (k.field != &DeviceStats::max_split_size) this->*k.field = 0;
}

}  // namespace stitch
