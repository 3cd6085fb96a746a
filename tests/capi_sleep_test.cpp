// Sleep and wake through the C API (stitch.h) on the simulated device, as a program drives it:
// regions of the calling thread, several sleep/wake cycles with defaults, expandable segments and
// stitching; the memory really comes back (an untagged allocation of nearly the whole device
// succeeds while asleep); addresses and backed-up contents are kept; every error case returns an
// error code and says why in stitch_last_error(); a wake without memory fails whole and succeeds
// later. The disk tier: stitch_configure refuses an unusable backup_dir by its path, before and
// after the allocator exists; stitch_backup_progress is readable while a sleep and a wake run
// (a KV pool's backup file reports into it too).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "capi/c_api_testing.hpp"
#include "stitch/config.hpp"
#include "stitch/sim_backend.hpp"
#include "stitch/stitch.h"
#include "support/backup_dir.hpp"
#include "support/data_pattern.hpp"
#include "support/sleep_configs.hpp"

namespace stitch {
namespace {

using test::pattern_intact;
using test::write_pattern;

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t kCapacity = 1024 * MiB;

class CapiSleep : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    SimBackend::Options o;
    o.capacity = kCapacity;
    sim = std::make_shared<SimBackend>(o);
    (void)detail::capi_exchange_allocator(std::make_unique<Allocator>(Config::parse(GetParam()), sim));
  }
  void TearDown() override { (void)detail::capi_exchange_allocator(nullptr); }
  static std::string error() { return stitch_last_error(); }
  static std::int64_t stat(const char* key) { return stitch_stat(0, key); }

  std::shared_ptr<SimBackend> sim;
};

struct Block {
  void* ptr;
  std::size_t size;
  std::uint64_t seed;
};

TEST_P(CapiSleep, CyclesKeepAddressesAndBackupsAndGiveTheMemoryBack) {
  std::vector<Block> weights, kv, untagged;
  std::uint64_t seed = 0;
  auto add = [&](std::vector<Block>& to, std::size_t size) {
    void* p = stitch_malloc(size, 0, nullptr);
    ASSERT_NE(p, nullptr) << error();
    write_pattern(p, size, ++seed);
    to.push_back(Block{p, size, seed});
  };
  add(untagged, 40 * MiB);
  ASSERT_EQ(stitch_region_begin("weights", 1), 0) << error();
  for (std::size_t s : {100 * MiB, 7 * MiB, MiB / 2}) add(weights, s);
  ASSERT_EQ(stitch_region_begin("kv_cache", 0), 0) << error();  // nested: the innermost wins
  for (int i = 0; i < 8; ++i) add(kv, 20 * MiB);
  ASSERT_EQ(stitch_region_end(), 0);
  ASSERT_EQ(stitch_region_end(), 0);
  EXPECT_NE(stitch_region_end(), 0);  // none open
  EXPECT_NE(error().find("no region"), std::string::npos) << error();
  const std::int64_t untagged_reserved = 40 * static_cast<std::int64_t>(MiB);

  for (int cycle = 0; cycle < 3; ++cycle) {
    const std::int64_t allocated = stat("allocated_bytes.all.current");
    const std::int64_t reserved = stat("reserved_bytes.all.current");
    ASSERT_EQ(stitch_sleep(-1, nullptr, nullptr), 0) << error();
    EXPECT_EQ(stat("reserved_bytes.all.current"), untagged_reserved);
    EXPECT_EQ(stat("allocated_bytes.all.current"), allocated);
    // Nearly the whole device, untagged, while asleep.
    const std::size_t big = kCapacity - static_cast<std::size_t>(untagged_reserved) - 24 * MiB;
    void* p = stitch_malloc(big, 0, nullptr);
    ASSERT_NE(p, nullptr) << error();
    std::memset(p, 0x5a, big);
    // The wake cannot get its memory now: it fails whole, everything stays asleep.
    EXPECT_NE(stitch_wake(-1, nullptr), 0);
    EXPECT_NE(error().find("out of memory"), std::string::npos) << error();
    ASSERT_EQ(stitch_region_begin("weights", 1), 0);
    EXPECT_EQ(stitch_malloc(MiB, 0, nullptr), nullptr);  // asleep
    EXPECT_NE(error().find("'weights'"), std::string::npos) << error();
    ASSERT_EQ(stitch_region_end(), 0);
    stitch_free(p, big, 0, nullptr);
    ASSERT_EQ(stitch_empty_cache(0), 0);
    // Weights first, then the KV cache.
    ASSERT_EQ(stitch_wake(0, "weights"), 0) << error();
    ASSERT_EQ(stitch_wake(0, "kv_cache"), 0) << error();
    EXPECT_EQ(stat("reserved_bytes.all.current"), reserved);
    for (const Block& b : weights) EXPECT_TRUE(pattern_intact(b.ptr, b.size, b.seed));
    for (const Block& b : untagged) EXPECT_TRUE(pattern_intact(b.ptr, b.size, b.seed));
    for (const Block& b : kv) write_pattern(b.ptr, b.size, b.seed);  // lost: written again
  }
  EXPECT_EQ(stat("num_sleeps"), 3);
  EXPECT_EQ(stat("num_wakes"), 6);
  for (auto* set : {&weights, &kv, &untagged})
    for (const Block& b : *set) stitch_free(b.ptr, b.size, 0, nullptr);
  EXPECT_STREQ(stitch_last_error(), stitch_last_error());
}

TEST_P(CapiSleep, ErrorCasesReturnAnErrorAndSayWhy) {
  ASSERT_EQ(stitch_region_begin("kv", 0), 0);
  void* p = stitch_malloc(8 * MiB, 0, nullptr);
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(stitch_region_end(), 0);
  EXPECT_NE(stitch_sleep(-1, "kv,nope", nullptr), 0);
  EXPECT_NE(error().find("'nope'"), std::string::npos) << error();
  EXPECT_NE(stitch_sleep(-1, "kv", "nope"), 0);
  EXPECT_NE(stitch_sleep(7, "kv", nullptr), 0);
  EXPECT_NE(stitch_region_begin(nullptr, 0), 0);
  EXPECT_NE(stitch_region_begin("", 0), 0);
  EXPECT_NE(stitch_region_begin("a,b", 0), 0);
  EXPECT_EQ(stitch_sleep(-1, "kv", nullptr), 0) << error();
  EXPECT_EQ(stitch_sleep(-1, "kv", nullptr), 0) << error();  // asleep already: nothing changes
  EXPECT_EQ(stat("num_sleeps"), 1);
  char buf[4096];
  const std::size_t n = stitch_residency(0, buf, sizeof buf);
  ASSERT_GT(n, 0u) << error();
  ASSERT_LT(n, sizeof buf);
  EXPECT_NE(std::string(buf).find(R"("tag": "kv", "state": "asleep")"), std::string::npos) << buf;
  stitch_clear_error();
  stitch_free(p, 8 * MiB, 0, nullptr);  // freeing a sleeping block works
  EXPECT_STREQ(stitch_last_error(), "");
  EXPECT_EQ(stitch_wake(-1, nullptr), 0) << error();
  EXPECT_EQ(stitch_wake(-1, nullptr), 0) << error();  // nothing asleep: nothing to do
  EXPECT_EQ(stitch_trim(0, 0), 0);
  EXPECT_EQ(stat("reserved_bytes.all.current"), 0);
}

TEST_P(CapiSleep, RegionsAreScopedToTheirThread) {
  ASSERT_EQ(stitch_region_begin("weights", 1), 0);
  void* mine = stitch_malloc(4 * MiB, 0, nullptr);
  void* theirs = nullptr;
  std::thread other([&] {
    EXPECT_NE(stitch_region_end(), 0);  // this thread opened none
    theirs = stitch_malloc(4 * MiB, 0, nullptr);
    write_pattern(theirs, 4 * MiB, 77);
  });
  other.join();
  ASSERT_EQ(stitch_region_end(), 0);
  write_pattern(mine, 4 * MiB, 78);
  ASSERT_EQ(stitch_sleep(-1, "weights", nullptr), 0) << error();
  EXPECT_TRUE(pattern_intact(theirs, 4 * MiB, 77));  // untagged: still mapped, still there
  EXPECT_EQ(stat("sleeping_bytes.current"), static_cast<std::int64_t>(4 * MiB));
  ASSERT_EQ(stitch_wake(-1, "weights"), 0) << error();
  EXPECT_TRUE(pattern_intact(mine, 4 * MiB, 78));
  stitch_free(mine, 4 * MiB, 0, nullptr);
  stitch_free(theirs, 4 * MiB, 0, nullptr);
}

INSTANTIATE_TEST_SUITE_P(Configs, CapiSleep, test::sleep_configs(), test::sleep_config_name);

// ---- the disk tier through the C API (backup_dir, docs/sleep.md) --------------------------------

TEST(CapiDiskTier, StitchConfigureRefusesAnUnusableDirectoryByItsPathBeforeAndAfterTheAllocatorExists) {
  test::BackupDir dir;
  const std::string file = dir.path() + "/not-a-dir";
  ::close(::creat(file.c_str(), 0600));
  (void)detail::capi_exchange_allocator(nullptr);  // none yet: stitch_configure only validates
  for (const std::string& bad : {file, file + "/below", std::string("/proc/self/fdinfo")}) {
    EXPECT_NE(stitch_configure(("backup_dir:" + bad).c_str()), 0) << bad;
    EXPECT_NE(std::string(stitch_last_error()).find("'" + bad + "'"), std::string::npos) << stitch_last_error();
  }
  EXPECT_NE(stitch_configure("backup_dir:relative"), 0);
  EXPECT_NE(std::string(stitch_last_error()).find("relative"), std::string::npos) << stitch_last_error();
  (void)detail::capi_exchange_allocator(std::make_unique<Allocator>(Config::parse("backend:sim,sim_capacity_mb:64")));
  EXPECT_NE(stitch_configure(("backup_dir:" + file).c_str()), 0);
  EXPECT_NE(std::string(stitch_last_error()).find("not a directory"), std::string::npos) << stitch_last_error();
  EXPECT_EQ(stitch_configure(("backup_dir:" + dir.path() + ",backup_dir_mb:8,backup_host_mb:4").c_str()), 0)
      << stitch_last_error();
  char conf[4096];
  ASSERT_GT(stitch_config(conf, sizeof conf), 0u);
  EXPECT_NE(std::string(conf).find("backup_dir:" + dir.path()), std::string::npos) << conf;
  EXPECT_EQ(stitch_backup_progress(7, nullptr, nullptr), -1);
  (void)detail::capi_exchange_allocator(nullptr);
  ::unlink(file.c_str());
}

/// Holds the `nth` file write (or read) until the test has seen the progress it made.
class HeldFileSim : public SimBackend {
 public:
  using SimBackend::SimBackend;
  std::int64_t write_file(int device, int fd, const void* src, std::size_t bytes, std::uint64_t offset) noexcept override {
    hold(++writes == 4);
    return SimBackend::write_file(device, fd, src, bytes, offset);
  }
  std::int64_t read_file(int device, int fd, void* dst, std::size_t bytes, std::uint64_t offset) noexcept override {
    hold(++reads == 4);
    return SimBackend::read_file(device, fd, dst, bytes, offset);
  }
  std::atomic<int> writes{0}, reads{0};
  std::atomic<bool> held{false}, seen{false};

 private:
  void hold(bool now) {
    if (!now) return;
    seen = false;
    held = true;
    // Bounded: a test that never looks does not hang the call (10 s).
    for (int i = 0; i < 10000 && !seen; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    held = false;
  }
};

/// The C API's allocator on a HeldFileSim whose backups beyond 1 MiB go to a fresh directory.
struct HeldDiskTier {
  HeldDiskTier() {
    SimBackend::Options o;
    o.capacity = 256 * MiB;
    sim = std::make_shared<HeldFileSim>(o);
    (void)detail::capi_exchange_allocator(std::make_unique<Allocator>(
        Config::parse("backend:sim,backup_host_mb:1,backup_dir:" + dir.path()), sim));
  }
  ~HeldDiskTier() { (void)detail::capi_exchange_allocator(nullptr); }
  /// A sleep and then a wake of `tag` on another thread, each held at its fourth file call:
  /// meanwhile stitch_backup_progress says which runs (1, 2) and how far of `bytes`; before and
  /// after, none.
  void expect_progress_while_held(const char* tag, std::uint64_t bytes);

  test::BackupDir dir;
  std::shared_ptr<HeldFileSim> sim;
};

void HeldDiskTier::expect_progress_while_held(const char* tag, std::uint64_t bytes) {
  HeldFileSim& sim = *this->sim;
  std::uint64_t done = 1, total = 1;
  EXPECT_EQ(stitch_backup_progress(0, &done, &total), 0) << "nothing runs";
  for (const int op : {1, 2}) {
    std::thread call([&] {
      EXPECT_EQ(op == 1 ? stitch_sleep(0, tag, nullptr) : stitch_wake(0, tag), 0) << stitch_last_error();
    });
    for (int i = 0; i < 10000 && !sim.held; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_TRUE(sim.held) << "the fourth file call never came";
    if (sim.held) {
      EXPECT_EQ(stitch_backup_progress(0, &done, &total), op);
      EXPECT_EQ(total, bytes);
      EXPECT_GT(done, 0u);
      EXPECT_LT(done, total);
    }
    sim.seen = true;
    call.join();
    EXPECT_EQ(stitch_backup_progress(0, &done, &total), 0);
  }
}

TEST(CapiDiskTier, ProgressIsReadableFromAnotherThreadWhileASleepAndAWakeRun) {
  HeldDiskTier t;
  ASSERT_EQ(stitch_region_begin("weights", STITCH_REGION_BACKUP), 0);
  void* p = stitch_malloc(16 * MiB, 0, nullptr);
  ASSERT_EQ(stitch_region_end(), 0);
  ASSERT_NE(p, nullptr);
  write_pattern(p, 16 * MiB, 5);
  t.expect_progress_while_held("weights", 16 * MiB);
  EXPECT_TRUE(pattern_intact(p, 16 * MiB, 5));
  EXPECT_EQ(stitch_stat(0, "backup_file_bytes.current"), 0);
  EXPECT_GT(stitch_stat(0, "backup_file_bytes.peak"), static_cast<std::int64_t>(14 * MiB));
  stitch_free(p, 16 * MiB, 0, nullptr);
}

TEST(CapiDiskTier, AKvPoolsFileReportsItsProgressToo) {
  HeldDiskTier t;
  stitch_kv_pool* pool = stitch_kv_create(0, 2, 1 * MiB, 16, "kv-progress", STITCH_REGION_BACKUP);
  ASSERT_NE(pool, nullptr) << stitch_last_error();
  std::int64_t ids[8];
  ASSERT_EQ(stitch_kv_alloc(pool, 8, ids), 0) << stitch_last_error();  // 8 MiB in each buffer
  for (int b = 0; b < 2; ++b) write_pattern(stitch_kv_buffer(pool, b), 8 * MiB, 11 + b);
  t.expect_progress_while_held("kv-progress", 16 * MiB);
  for (int b = 0; b < 2; ++b) EXPECT_TRUE(pattern_intact(stitch_kv_buffer(pool, b), 8 * MiB, 11 + b));
  EXPECT_EQ(stitch_stat(0, "backup_file_bytes.current"), 0);
  EXPECT_EQ(stitch_stat(0, "backup_file_bytes.peak"), static_cast<std::int64_t>(16 * MiB));
  EXPECT_EQ(stitch_kv_free(pool, ids, 8), 0);
  EXPECT_EQ(stitch_kv_destroy(pool), 0);
}

}  // namespace
}  // namespace stitch
