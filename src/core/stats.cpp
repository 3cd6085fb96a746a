// core/stats.cpp — flat-key access to DeviceStats ("allocated_bytes.all.peak", "num_ooms").
#include "stitch/stats.hpp"

#include <array>
#include <utility>

namespace stitch {

namespace {

using ArrayField = StatArray DeviceStats::*;
using ScalarField = std::int64_t DeviceStats::*;

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
constexpr std::array<std::pair<const char*, Stat DeviceStats::*>, 2> kSingles{{
    {"oversize_allocations", &DeviceStats::oversize_allocations},
    {"oversize_segments", &DeviceStats::oversize_segments},
}};
constexpr std::array<std::pair<const char*, ScalarField>, 12> kScalars{{
    {"num_alloc_retries", &DeviceStats::num_alloc_retries},
    {"num_ooms", &DeviceStats::num_ooms},
    {"num_sync_all_streams", &DeviceStats::num_sync_all_streams},
    {"num_device_alloc", &DeviceStats::num_device_alloc},
    {"num_device_free", &DeviceStats::num_device_free},
    {"num_invalid_frees", &DeviceStats::num_invalid_frees},
    {"num_stitches", &DeviceStats::num_stitches},
    {"stitched_bytes", &DeviceStats::stitched_bytes},
    {"num_page_reuses", &DeviceStats::num_page_reuses},
    {"num_page_borrows", &DeviceStats::num_page_borrows},
    {"num_immediate_reuses", &DeviceStats::num_immediate_reuses},
    {"max_split_size", &DeviceStats::max_split_size},
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
  for (const auto& [n, field] : kScalars)
    if (name == n && rest.empty()) return this->*field;
  for (const auto& [n, field] : kSingles)
    if (name == n) return stat_part(this->*field, rest);
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
  for (const auto& [n, field] : kSingles)
    for (std::size_t i = 0; i < kParts.size(); ++i)
      fn(std::string(n) + "." + kParts[i], part(this->*field, i));
  for (const auto& [n, field] : kScalars) fn(n, this->*field);
}

void DeviceStats::reset_peak() noexcept {
  for (const auto& [n, field] : kArrays)
    for (Stat& s : this->*field) s.reset_peak();
  for (const auto& [n, field] : kSingles) (this->*field).reset_peak();
}

void DeviceStats::reset_accumulated() noexcept {
  for (const auto& [n, field] : kArrays)
    for (Stat& s : this->*field) s.reset_accumulated();
  for (const auto& [n, field] : kSingles) (this->*field).reset_accumulated();
  for (const auto& [n, field] : kScalars)
    if (field != &DeviceStats::max_split_size) this->*field = 0;
}

}  // namespace stitch
