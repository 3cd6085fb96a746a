// tests/support/allocator_fixture.hpp — what the behaviour tests of stitch::Allocator share: an
// allocator over a fresh simulated device (AllocatorTest), live blocks carrying the data pattern
// of support/data_pattern.hpp (which catches a block handed out twice or overwritten), and the
// helpers around them.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "stitch/allocator.hpp"
#include "stitch/config.hpp"
#include "stitch/errors.hpp"
#include "stitch/sim_backend.hpp"
#include "stitch/stats.hpp"
#include "support/data_pattern.hpp"

namespace stitch::test {

inline constexpr std::size_t KiB = std::size_t{1} << 10;
inline constexpr std::size_t MiB = std::size_t{1} << 20;
inline constexpr std::size_t GiB = std::size_t{1} << 30;

inline constexpr std::int64_t I(std::size_t v) { return static_cast<std::int64_t>(v); }

/// An opaque simulated stream handle (non-null, distinct per n).
inline stream_t S(int n) { return reinterpret_cast<stream_t>(static_cast<std::uintptr_t>(n) * 0x10); }

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

/// A live allocation with a pattern in it.
struct Live {
  void* ptr;
  std::size_t size;
  std::uint64_t seed;
};

// ---- fixture -------------------------------------------------------------------------------------

class AllocatorTest : public ::testing::Test {
 protected:
  void make(const std::string& conf = "", std::size_t capacity = GiB, int devices = 1) {
    SimBackend::Options options;
    options.capacity = capacity;
    options.devices = devices;
    a_.reset();
    sim_ = std::make_shared<SimBackend>(options);
    a_ = std::make_unique<Allocator>(Config::parse(conf.empty() ? "backend:sim" : "backend:sim," + conf),
                                     sim_);
  }

  void SetUp() override { make(); }

  Allocator& a() { return *a_; }
  SimBackend& sim() { return *sim_; }

  std::int64_t st(const std::string& key, int device = 0) {
    const auto v = a_->stat(device, key);
    EXPECT_TRUE(v.has_value()) << key;
    return v.value_or(INT64_MIN);
  }

  Live live(std::size_t size, stream_t stream = nullptr, int device = 0) {
    void* p = a_->allocate(size, stream, device);
    const std::uint64_t seed = ++seed_;
    write_pattern(p, size, seed);
    return Live{p, size, seed};
  }

  void expect_intact(const std::vector<Live>& blocks) {
    for (const Live& b : blocks) {
      EXPECT_TRUE(pattern_intact(b.ptr, b.size, b.seed)) << "block " << b.ptr << " of " << b.size;
      const auto info = a_->find(b.ptr);
      ASSERT_TRUE(info.has_value()) << b.ptr << " is no longer live";
      EXPECT_EQ(info->requested, b.size);
    }
  }

  std::shared_ptr<SimBackend> sim_;
  std::unique_ptr<Allocator> a_;
  std::uint64_t seed_ = 0;
};

}  // namespace stitch::test
